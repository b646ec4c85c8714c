"""Baselines cached per (task, device, torch version), so verifying a second candidate of a task
does not time eager and torch.compile again; and task records (``cost`` and ``degeneracy``,
seconds on a GB-sized task) cached per (task, device, torch version) beside them.

A baseline's key covers everything it depends on: the task file's content hash and size, the
device's name, the torch version, the timing protocol and the compile switches; a record's, the
task's content hash and size, the device's name, the torch version and ``RECORD_METHOD``. A
cached baseline is a JSON file ``<root>/<task id>-<key>.json``, a cached record
``<root>/<task id>-record-<key>.json``, under ``ASSAY_BASELINE_CACHE`` (default
``~/.cache/assay/baselines``, beside the kernel cache but not inside it: the sandbox never
mounts it writable, so no candidate can plant a baseline or a record). A file that does not
parse is computed again. Delete the folder to re-time and re-analyze everything;
``refresh=True`` redoes one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from assay.bench.timing import TimingConfig
from assay.tasks.model import Task


def cache_root() -> Path:
    root = os.environ.get("ASSAY_BASELINE_CACHE") or Path.home() / ".cache" / "assay" / "baselines"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


# The timing method's version: baselines timed by an older method are not reused (2: the cpu
# baseline's process fixes glibc's malloc thresholds, as the worker does; 3: cpu timings in
# rounds, the fastest confirmed by another).
METHOD = 3


def baseline_key(task: Task, device_name: str, torch_version: str, cfg: TimingConfig,
                 compile_: bool, compile_mode: str = "default", threads: str = "") -> str:
    """A pure function of what the baseline depends on (on cpu, the thread count too: a
    baseline timed on the libraries' default threads is not one timed on the step's)."""
    parts = {"task": task.source_hash, "size": task.size, "device": device_name,
             "torch": torch_version, "timing": dataclasses.asdict(cfg), "compile": compile_,
             "compile_mode": compile_mode, "method": METHOD, "threads": threads}
    return _key(parts, task)


def _key(parts: dict[str, Any], task: Task) -> str:
    """The hash of ``parts``, with the task mode's version where the task has a norm whose
    mode matters (``instantiate.task_mode``: its batch statistics since 2026-12-08; what was
    timed or recorded in eval mode is not reused). Other tasks keep their keys."""
    from assay.tasks.instantiate import MODE_DEPENDENT, TASK_MODE

    if MODE_DEPENDENT.search(task.source):
        parts = {**parts, "task_mode": TASK_MODE}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _is_object(data: Any) -> bool:
    return isinstance(data, dict)


def _read_json(path: Path, valid: Callable[[Any], bool] = _is_object) -> dict[str, Any] | None:
    """The JSON object in ``path``; None where there is none, it does not parse (a damaged
    file) or ``valid`` refuses it."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if valid(data) else None


def cached_json(path: Path, compute: Callable[[], dict[str, Any]], refresh: bool,
                 valid: Callable[[Any], bool] = _is_object) -> tuple[dict[str, Any], bool]:
    """The JSON object in ``path``, else ``compute()`` written there (atomically, under a lock
    beside it: two processes asking for one key compute it once); and whether it came from the
    file. A file that does not parse, or holds what ``valid`` refuses, is computed again."""

    def read() -> dict[str, Any] | None:
        return None if refresh else _read_json(path, valid)

    data = read()
    if data is not None:
        return data, True
    with FileLock(str(path.with_suffix(".lock"))):
        data = read()
        if data is not None:
            return data, True
        data = compute()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    return data, False


def _baseline_path(task: Task, device: str, cfg: TimingConfig, compile_: bool,
                   compile_mode: str) -> tuple[Path, str]:
    import torch

    from assay.bench.device import device_name

    threads = os.environ.get("OMP_NUM_THREADS", "default") if device == "cpu" else ""
    key = baseline_key(task, device_name(device), torch.__version__, cfg, compile_, compile_mode,
                       threads)
    return cache_root() / f"{task.id}-{key}.json", key


def cached_baseline(task: Task, device: str, cfg: TimingConfig, compile_: bool,
                    time_it: Callable[[], dict[str, Any]], compile_mode: str = "default",
                    refresh: bool = False) -> tuple[dict[str, Any], bool]:
    """The baseline from the cache, else ``time_it()`` (stored for next time); and whether it
    came from the cache. A lock per key: two verifications of one task time it once."""
    path, key = _baseline_path(task, device, cfg, compile_, compile_mode)
    return cached_json(path, lambda: {**time_it(), "cache_key": key}, refresh)


def baseline_is_cached(task: Task, device: str, cfg: TimingConfig, compile_: bool,
                       compile_mode: str = "default") -> bool:
    """Whether :func:`cached_baseline` would find this baseline (a file that parses)."""
    path, _key = _baseline_path(task, device, cfg, compile_, compile_mode)
    return _read_json(path) is not None


# The task record's method version: records computed by an older ``cost``/``degeneracy`` (or an
# older way of building the reference and its inputs) are not reused. Raise it when they change
# what they return.
RECORD_METHOD = 1


def record_key(task: Task, device_name: str, torch_version: str) -> str:
    """A pure function of what a task's record depends on (on cpu the device's name carries the
    thread count)."""
    parts = {"task": task.source_hash, "size": task.size, "device": device_name,
             "torch": torch_version, "method": RECORD_METHOD}
    return _key(parts, task)


def cached_record(task: Task, device: str,
                  compute: Callable[[], dict[str, Any]] | None = None,
                  refresh: bool = False) -> tuple[dict[str, Any], bool]:
    """The task's record (``compute()``, by default ``analyze.task_record(task, device)``) from
    the cache, else computed and stored; and whether it came from the cache. Returned as JSON
    holds it either way (a tuple as a list, what JSON has no type for as its ``str``), so a
    fresh record equals a cached one."""
    import torch

    from assay.bench.device import device_name
    from assay.tasks.analyze import task_record

    compute = compute or (lambda: task_record(task, device))

    key = record_key(task, device_name(device), torch.__version__)
    data, hit = cached_json(
        cache_root() / f"{task.id}-record-{key}.json",
        lambda: {"cache_key": key, "record": json.loads(json.dumps(compute(), default=str))},
        refresh, valid=lambda d: isinstance(d, dict) and isinstance(d.get("record"), dict))
    return data["record"], hit


def _serve(conn, lease) -> None:
    import torch  # noqa: F401 - imported while the parent loads and plans, not after

    import importlib

    for name in ("torch._dynamo", "torch._inductor.compile_fx"):  # torch.compile's (1.2 s on cpu)
        with contextlib.suppress(Exception):
            importlib.import_module(name)

    fn, args, held = conn.recv()  # (a process never sent a job is terminated: close)
    try:
        kwargs = {"hold": lambda: lease} if held else {}
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", f"{type(e).__name__}: {e}"))


class TrustedChild:
    """A spawned process that imports torch at once and runs one trusted function (the
    reference's timing) when asked: baselines are timed in a process that never loads a
    candidate, and its imports overlap the parent's loading and planning. Started early, used
    once, closed when not needed.

    ``lease``: a lock the parent holds while it works beside the child; a function submitted
    with ``held=True`` gets ``hold=`` the lease and enters it around its timings alone
    (``baseline.time_reference``): its compile runs beside the parent's work, its timing never
    does."""

    def __init__(self):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.lease = ctx.Lock()
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.lease), daemon=True)
        self.proc.start()
        self.submitted = False

    def submit(self, fn, *args, held: bool = False) -> None:
        """Start ``fn(*args)`` there (``held``: with ``hold=`` the lease); :meth:`result`
        waits for it."""
        self.conn.send((fn, args, held))
        self.submitted = True

    def result(self):
        try:
            status, value = self.conn.recv()
        except EOFError:
            status, value = "error", f"the process died (exit status {self.proc.exitcode})"
        self.proc.join()
        if status != "ok":
            raise RuntimeError(f"baseline timing failed: {value}")
        return value

    def run(self, fn, *args):
        self.submit(fn, *args)
        return self.result()

    def close(self) -> None:
        """Stop the process where it still runs: a job whose result is not wanted (the parent
        stopped early), or imports for a job never sent (a cached baseline). A trusted process
        keeps nothing, so it is cut short: told to exit, it first finished importing torch and
        torch.compile's modules, and the parent waited 5.6 s of a 17 s cpu `assay verify` with
        the baseline cached (2026-12-02, a 2-core EPYC)."""
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join()


class WarmChildren:
    """Trusted processes started one task ahead (batch verification on a GPU): :meth:`take`
    hands over the one started earlier, whose imports (torch, torch.compile's: seconds) ran
    while the task before's candidates were verified, and :meth:`refill` starts the next once
    the taken one's timings are done. Without ``ahead`` (the cpu target, where an importing
    process would share the cores being timed) each is started when it is taken."""

    def __init__(self, ahead: bool):
        self.ahead = ahead
        self._spare: TrustedChild | None = None

    def take(self) -> TrustedChild:
        child, self._spare = self._spare or TrustedChild(), None
        return child

    def refill(self) -> None:
        if self.ahead and self._spare is None:
            self._spare = TrustedChild()

    def close(self) -> None:
        if self._spare is not None:
            self._spare.close()
            self._spare = None
