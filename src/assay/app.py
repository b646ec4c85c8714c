"""Glue shared by the pipeline's steps: the Hydra entry point, the campaign, tasks and target.

Every step is ``python -m assay.<step> [hydra overrides]`` and reads the same composed config
(``config/config.yaml`` and its groups); the Snakefile composes it too, to lay out the DAG.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from assay import schemas
from assay.layout import Campaign, DiskFullError
from assay.tasks.model import Task, TaskError
from assay.tasks.suite import TaskRef, discover

log = logging.getLogger("assay")
schemas.register()


def repo_root() -> Path:
    return Path(os.environ.get("ASSAY_ROOT") or Path(__file__).resolve().parents[2])


def config_dir() -> Path:
    return Path(os.environ.get("ASSAY_CONFIG_DIR") or repo_root() / "config")


def step(fn: Callable[[DictConfig], Any], gpu: bool = False,
         timing: bool = False) -> Callable[[], Any]:
    """Make ``fn(cfg)`` a Hydra app on the project's config; bad input exits 2 with one line.

    ``gpu``: the step runs on the device, so on the cuda target it first takes a GPU lease.
    ``timing``: the step times code, so on the cpu target it first takes the CPU lease (it
    holds the cores alone among timing steps; see :func:`assay.gpu.acquire_cpu`).
    """
    import hydra

    @functools.wraps(fn)
    def run(cfg: DictConfig) -> Any:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                            force=True)
        if gpu or timing:
            take_lease(cfg, gpu, timing)
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

    return hydra.main(version_base="1.3", config_path=str(config_dir()),
                      config_name="config")(run)


def take_lease(cfg: DictConfig, gpu: bool, timing: bool) -> None:
    """The GPU lease for a device step on the cuda target, the CPU lease for a timing step on
    the cpu target."""
    from assay import gpu as lease

    try:
        tgt = target(cfg)
    except UserError:
        return  # the step itself reports the bad target.name
    if tgt == "cpu":
        if timing:
            waited = lease.acquire_cpu()
            log.info("CPU lease taken%s", f" after {waited:.0f} s" if waited >= 1 else "")
    elif gpu:
        dev = lease.acquire()
        if dev is not None:
            log.info("GPU lease: device %s (CUDA_VISIBLE_DEVICES=%s)", dev, dev)


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


def compose(overrides: list[str] | None = None) -> DictConfig:
    """The config a step would see with these overrides (used by the Snakefile and tests)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(config_dir())):
        return hydra_compose(config_name="config", overrides=list(overrides or []))


def campaign(cfg: DictConfig) -> Campaign:
    return Campaign.at(cfg.results_dir, cfg.campaign)


def target(cfg: DictConfig) -> str:
    """``target=auto`` picks cuda when a GPU is present, else cpu."""
    name = cfg.target.name
    if name == "auto":
        # Asked of the driver, not of torch: importing torch costs seconds in steps that do
        # not otherwise need it (an empty generation, a declined task).
        from assay.gpu import visible_gpus

        return "cuda" if visible_gpus() else "cpu"
    if name not in ("cpu", "cuda"):
        raise UserError(f"target.name={name!r}: choose auto, cpu or cuda")
    return name


def task_size(cfg: DictConfig, tgt: str | None = None) -> str:
    size = cfg.tasks.size
    if size == "auto":
        return "large" if (tgt or target(cfg)) == "cuda" else "small"
    return size


def task_refs(cfg: DictConfig) -> tuple[list[TaskRef], list[str]]:
    t = cfg.tasks
    return discover(t.source, levels=t.levels, include=t.include or (), exclude=t.exclude or (),
                    limit=t.limit, root=repo_root())


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


def make_proposer(cfg: DictConfig, tgt: str):
    """The proposer named by the ``llm`` config group."""
    llm = cfg.llm
    if llm.kind == "offline":
        from assay.propose.offline import OfflineSynthesizer

        # Under the strict policy the library forms (cuBLAS/cuDNN + a fused epilogue) would
        # always be rejected by the kernel audit: the synthesizer leaves them out.
        return OfflineSynthesizer(target=tgt, policy=cfg.verify.policy)
    if llm.kind == "litellm":
        from assay.propose.llm import LiteLLMProposer

        cache = llm.cache_dir or str(Path(cfg.results_dir) / ".llm-cache")
        return LiteLLMProposer(
            name=llm.name, model=llm.model, api_base=llm.api_base, api_key_env=llm.api_key_env,
            temperature=llm.temperature, max_tokens=llm.max_tokens, timeout_s=llm.timeout_s,
            max_retries=llm.max_retries, cache_dir=cache, target=tgt,
            input_cost_per_1k=llm.get("input_cost_per_1k"),
            output_cost_per_1k=llm.get("output_cost_per_1k"),
            models=[dict(m) for m in (llm.get("models") or [])],
            concurrency=int(llm.get("concurrency") or 4),
            send_seed=bool(llm.get("send_seed", True)))
    raise UserError(f"llm.kind={llm.kind!r}: choose offline or litellm")
