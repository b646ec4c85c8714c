"""Glue shared by the pipeline's steps: the Hydra entry point, the campaign, tasks and target.

Every step is ``python -m assay.steps.<rule> [hydra overrides]`` and reads the same composed config
(``config/config.yaml`` and its groups, checked against ``assay.schemas.AssayConfig``); the
Snakefile composes it too, to lay out the DAG. The config folder is found in one place,
``assay.resources.config_dir``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import random
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from assay import schemas
from assay.layout import Campaign, DiskFullError
from assay.resources import config_dir, resolve_data
from assay.tasks.model import Task, TaskError
from assay.tasks.suite import TaskRef, discover

log = logging.getLogger("assay")
schemas.register()


# True while a step's function runs: Hydra is initialized on the project's config folder.
_in_step = False


def step(fn: Callable[[DictConfig], Any], gpu: bool | str = False,
         timing: bool = False) -> Callable[[], Any]:
    """Make ``fn(cfg)`` a Hydra app on the project's config; bad input exits 2 with one line.

    ``gpu``: the step runs on the device, so on the cuda target it first takes a place on a GPU
    (:func:`assay.gpu.acquire`) and the device itself (:func:`assay.gpu.hold_device`);
    ``gpu="late"``: it takes the device only where it calls :func:`on_device`, before its first
    use of it, so its start-up and CPU work run while another job uses the GPU.
    ``timing``: the step times code. On the cpu target it computes on ``target.cpu_threads``
    threads from its start and holds the CPU lease around its timed part, which it marks with
    :func:`cpu_timing`: its start-up, preparation and teardown run beside another step's
    timing (see :func:`assay.gpu.acquire_cpu`).
    """
    import hydra

    @functools.wraps(fn)
    def run(cfg: DictConfig) -> Any:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                            force=True)
        global _in_step
        if gpu or timing:
            claim_at_start(cfg, gpu, timing)
        _in_step = True
        try:
            return fn(cfg)
        except (TaskError, UserError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except DiskFullError as e:  # one line naming the file; what was written stays
            print(f"error: {e}", file=sys.stderr)
            sys.exit(4)
        except Exception as e:
            # An LLM backend that stays down after its retries fails this step with one line;
            # everything already written stays, and a rerun continues.
            if type(e).__name__ != "LLMError":
                raise
            print(f"error: {e}", file=sys.stderr)
            sys.exit(3)
        finally:
            _in_step = False

    hydra_main = hydra.main(version_base="1.3", config_path=str(config_dir()),
                            config_name="config")(run)

    @functools.wraps(fn)
    def main() -> Any:
        # A bad config fails here, before any work, in one line (Hydra's own report is five
        # lines and exits 1, like a crash): compose the command line's overrides once first.
        args = sys.argv[1:]
        overrides = [a for a in args if "=" in a and not a.startswith("-")]
        try:
            cfg = compose(overrides)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        if overrides == args:
            # Overrides alone (every rule's command line): this is the config Hydra's app
            # would compose, twice (the first only to learn the run mode), 0.7 s each; under
            # config.yaml's hydra settings (run dir '.', no output subdir, no chdir, no
            # logging set up) nothing else of the app applies. Hydra's own flags (--help,
            # --cfg, --multirun, ...) go through it. Initialized on the config folder as the
            # app is, so that a step's own compose() (export's) takes the in-step path.
            from hydra import initialize_config_dir

            with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
                return run(cfg)
        return hydra_main()

    return main


def run_script(main: Callable[[], Any]) -> None:
    """A step run as ``python -m assay.steps.<rule>``: its :func:`step` ``main``, then the
    process ends without the interpreter's teardown (:func:`assay.process.exit_now`: about a
    second of CPU once torch is imported, for each of a campaign's jobs). An error exits as
    ``main`` makes it."""
    from assay.process import exit_now

    main()
    exit_now(0)


def claim_at_start(cfg: DictConfig, gpu: bool | str, timing: bool) -> None:
    """At a step's start: the GPU lease for a device step on the cuda target (the device too,
    unless ``gpu="late"``); the thread count for a timing step on the cpu target (its CPU lease
    comes with :func:`cpu_timing`)."""
    from assay import gpu as lease

    try:
        tgt = target(cfg)
    except UserError:
        return  # the step itself reports the bad target.name
    if tgt == "cpu":
        if timing:
            threads = lease.hold_cpu_threads(int(cfg.target.cpu_threads))
            log.info("timing on %d thread(s)", threads)
    elif gpu:
        dev = lease.acquire()
        if dev is not None:
            log.info("GPU lease: device %s (CUDA_VISIBLE_DEVICES=%s)", dev, dev)
            if gpu != "late":
                on_device(cfg)


def on_device(cfg: DictConfig) -> float | None:
    """Before a GPU step's first use of the device (targets cuda and triton): take the leased
    GPU alone until the step ends, waiting for the job using it; returns the seconds waited.
    Nothing (None) on the cpu target, without a lease, or when taken already."""
    from assay import gpu as lease

    try:
        if target(cfg) == "cpu":
            return None
    except UserError:
        return None
    waited = lease.hold_device()
    if waited is not None:
        log.info("GPU %s taken%s", os.environ.get("ASSAY_GPU"),
                 f" after {waited:.1f} s" if waited >= 0.1 else "")
    return waited


@contextlib.contextmanager
def cpu_timing(cfg: DictConfig) -> Iterator[None]:
    """The CPU lease around a timing step's timed part on the cpu target; nothing on cuda (the
    step's GPU lease covers all of it). Given back on leaving, before the step's teardown."""
    from assay import gpu as lease

    if target(cfg) != "cpu" or lease.cpu_held():
        yield
        return
    waited = lease.acquire_cpu()
    log.info("CPU lease taken%s", f" after {waited:.1f} s" if waited >= 0.1 else "")
    try:
        yield
    finally:
        lease.release_cpu()


def off_device() -> None:
    """After a GPU step's last use of the device: its cached device memory freed and the GPU
    given to the next job, which need not wait for this process's teardown (the baseline step's
    took 6 s on an H200: inductor's compile workers and the CUDA context)."""
    from assay import gpu as lease

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            import gc

            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except RuntimeError as e:  # the step's work is written: it keeps the GPU to its end instead
        log.warning("the GPU stays taken until this step ends: %s", e)
        return
    lease.release_device()


def split_overrides(text: str) -> list[str]:
    """``"[a=1,llms=[x,y],b='p,q']"`` -> ``["a=1", "llms=[x,y]", "b='p,q'"]``: commas split only
    outside brackets and quotes (the outer brackets are optional)."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    out, cur, depth, quote = [], [], 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return [o for o in out if o]


def workflow_overrides() -> list[str]:
    """The overrides a campaign runs with when the command line gives none: Snakemake's config
    ``config/workflow.yaml`` (``overrides: [campaign=default]``)."""
    import yaml

    path = config_dir() / "workflow.yaml"
    if not path.is_file():
        return []
    return [str(o) for o in (yaml.safe_load(path.read_text()) or {}).get("overrides") or []]


class UserError(ValueError):
    """A mistake in what the user asked for; printed as one line, exit status 2."""


class ConfigError(UserError):
    """The config does not compose or does not match its schema (assay.schemas)."""


def config_error_line(e: Exception) -> str:
    """Hydra's and OmegaConf's multi-line report as one line naming the key and the problem,
    e.g. ``verify.policy: Invalid value 'lenient', expected one of [strict, permissive]``."""
    cause = e.__cause__ if e.__cause__ is not None else e
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    details = ("full_key:", "reference_type=", "object_type=")
    said = [ln for ln in lines if not ln.startswith(details) and not ln.endswith(":")]
    msg = said[0] if said else (lines[0] if lines else type(cause).__name__)
    where = re.match(r"In '([^']+)': \w+ raised while composing", lines[0]) if lines else None
    if where:  # a value in one of the config's files
        msg += f" (in {where.group(1)}.yaml)"
    for i, ln in enumerate(lines):  # "Available options in 'llm':" and one option a line
        if ln.startswith("Available options"):
            opts = [o for o in lines[i + 1:i + 100] if ":" not in o and o != "schema"]
            msg += f" ({ln.rstrip(':')}: {', '.join(opts)})"
            break
    if not key and cause is not e and str(e) and str(e).splitlines()[0] not in msg:
        msg = f"{str(e).splitlines()[0]}: {msg}"
    return f"config {config_dir()}: " + (f"{key}: {msg}" if key else msg)


def compose(overrides: list[str] | None = None) -> DictConfig:
    """The config a step would see with these overrides (used by the Snakefile and tests);
    ConfigError (one line) when it does not compose or breaks its schema."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    def run() -> DictConfig:
        try:
            return hydra_compose(config_name="config", overrides=list(overrides or []))
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(config_error_line(e)) from e

    if GlobalHydra.instance().is_initialized():
        if _in_step:  # inside a step: Hydra knows the config folder
            return run()
        # Left over by a Hydra app that has returned (an in-process step, a test), perhaps on
        # another config folder: composing on it gave an archive card without the settings.
        GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
        return run()


def campaign(cfg: DictConfig) -> Campaign:
    return Campaign.at(cfg.results_dir, cfg.campaign)


def target(cfg: DictConfig) -> str:
    """The device the campaign's kernels run on, ``cuda`` or ``cpu``: ``target=auto`` and
    ``target=triton`` pick cuda when a GPU is present, else cpu (Triton kernels then run in
    Triton's interpreter). What language the kernels are written in: :func:`kernel_target`."""
    name = cfg.target.name
    if name in ("auto", "triton"):
        # Asked of the driver, not of torch: importing torch costs seconds in steps that do
        # not otherwise need it (an empty generation, a declined task).
        from assay.gpu import visible_gpus

        return "cuda" if visible_gpus() else "cpu"
    return str(name)  # the schema's Enum admits no other value


def kernel_target(cfg: DictConfig, device: str | None = None) -> str:
    """What the proposers write: ``triton`` (Python with @triton.jit kernels, on either
    device) for ``target=triton``, else the device's own language, ``cuda`` (CUDA) or ``cpu``
    (C++). ``device``: :func:`target`'s answer when the caller has it."""
    if cfg.target.name == "triton":
        return "triton"
    return device or target(cfg)


def task_size(cfg: DictConfig, tgt: str | None = None) -> str:
    from assay.tasks.model import resolve_size

    size = cfg.tasks.size
    return resolve_size(str(size), tgt or target(cfg))


def task_refs(cfg: DictConfig) -> tuple[list[TaskRef], list[str]]:
    t = cfg.tasks
    return discover(resolve_data(t.source), levels=t.levels, include=t.include or (),
                    exclude=t.exclude or (), limit=t.limit)


def find_task(cfg: DictConfig, task_id: str) -> TaskRef:
    refs, _ = task_refs(cfg)
    for ref in refs:
        if ref.id == task_id:
            return ref
    raise UserError(f"task {task_id!r} is not in tasks.source={cfg.tasks.source} "
                    f"(with its level/include/exclude filters)")


def load_task(cfg: DictConfig, task_id: str, tgt: str | None = None) -> Task:
    ref = find_task(cfg, task_id)
    return Task.from_file(ref.path, size=task_size(cfg, tgt), level=ref.level)


def rng_for(cfg: DictConfig, *parts: Any) -> random.Random:
    """A deterministic RNG per (seed, parts): the same campaign makes the same choices."""
    h = hashlib.sha256(repr((cfg.seed, *parts)).encode()).hexdigest()
    return random.Random(int(h[:16], 16))


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as dotted keys (MLflow params)."""
    def walk(prefix: str, node: Any, out: dict[str, Any]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, out)
        elif node is not None:
            out[prefix] = node
    out: dict[str, Any] = {}
    walk("", OmegaConf.to_container(cfg, resolve=True), out)
    return out
