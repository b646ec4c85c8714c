"""The results tree: files are the truth, and every step finds its inputs through here.

results/<campaign>/
  config.yaml                          optional, written by no step: verifier settings that
                                       `assay export` states in the dataset card
  device.json                          measured peaks of the device (device; roofline)
  tasks/<task>.json                    task record (extract)
  baselines/<task>.json                eager and torch.compile timings (baseline)
  <llm>/<task>/gen_<g>/candidates/<cid>.py    candidate source
  <llm>/<task>/gen_<g>/candidates/<cid>.json  proposal metadata (parents, operator, tokens...)
  <llm>/<task>/gen_<g>/proposals.json  the generation's candidate ids (translate / evolve)
  <llm>/<task>/gen_<g>/stones.json     the stepping stones its prompts used (translate / evolve)
  <llm>/<task>/gen_<g>/verdicts/<cid>.json    one verdict per candidate (verify), with the
                                       seconds per phase under "times"; stale, and judged
                                       again, when older than proposals.json or the task's
                                       baseline
  <llm>/<task>/gen_<g>/verdicts.json   the generation's verdicts, summarized (verify)
  <llm>/<task>/profile.json            profile of the best accepted kernel (profile)
  <llm>/<task>/tracked.json            MLflow run ids of the task's child run (track)
  <llm>/tracked.json                   the backend's runs, all tasks (track's output)
  logs/<step>/...                      each job's log
  archive/level_<n>.parquet            the dataset (export)
  report.html                          the campaign report (report)
"""

from __future__ import annotations

import errno
import json
import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A write that found no space left; the message names the path and says "disk full"."""

    def __str__(self) -> str:
        return (f"disk full: cannot write {self.filename} ({self.strerror}); free some space "
                f"and run again: finished results are kept")


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def stop_cleanly_on_signals() -> bool:
    """Make SIGTERM (and SIGHUP) raise SystemExit, as SIGINT raises KeyboardInterrupt, so
    ``finally`` blocks run: a write in progress removes its temporary file, a sandboxed worker
    is killed and its scratch folder removed. Only in the main thread and only where the
    signal still has its default action; returns whether anything was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    done = False
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop)
            done = True
    return done


def write_atomic(path: Path, text: str) -> None:
    """Write then rename, so a partial file never looks finished.

    A SIGTERM or SIGINT during the write leaves neither the file nor its temporary; a full disk
    raises :class:`DiskFullError` (an OSError) naming the path, with nothing left behind.
    """
    stop_cleanly_on_signals()
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be read by others
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        if e.errno in _FULL:
            raise DiskFullError(e.errno, os.strerror(e.errno), str(path)) from None
        raise
    except BaseException:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


_held_locks: list[int] = []


def try_flock(path: Path, mode: int = 0o644) -> int | None:
    """An exclusive ``flock`` on ``path``, its descriptor kept open (the file says which process
    holds it), or None when another process holds it. The kernel drops it when the process
    dies, SIGKILL included, so unlike Snakemake's own lock files it never needs an unlock after
    a killed run."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    except OSError:
        os.close(fd)  # (the lock with it)
        raise
    return fd


def hold_lock(path: Path) -> bool:
    """Take an exclusive ``flock`` on ``path`` for the rest of this process (:func:`try_flock`);
    False if taken."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = try_flock(path)
    if fd is None:
        return False
    _held_locks.append(fd)
    return True


def is_fresh(path: Path, *sources: Path) -> bool:
    """``path`` exists and was written after every existing ``sources`` file: a result made from
    them, not from an earlier version of them (a forced rerun rewrites its inputs)."""
    try:
        made = Path(path).stat().st_mtime_ns
    except FileNotFoundError:
        return False
    return all(made >= Path(s).stat().st_mtime_ns for s in sources if Path(s).exists())


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


@dataclass(frozen=True)
class Campaign:
    root: Path  # results/<campaign>

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def at(cls, results_dir: str | Path, name: str) -> "Campaign":
        return cls(Path(results_dir) / name)

    @property
    def name(self) -> str:
        return self.root.name

    def task_record(self, task: str) -> Path:
        return self.root / "tasks" / f"{task}.json"

    def baseline(self, task: str) -> Path:
        return self.root / "baselines" / f"{task}.json"

    def device(self) -> Path:
        return self.root / "device.json"

    def task_dir(self, llm: str, task: str) -> Path:
        return self.root / llm / task

    def gen_dir(self, llm: str, task: str, gen: int) -> Path:
        return self.task_dir(llm, task) / f"gen_{gen}"

    def candidates_dir(self, llm: str, task: str, gen: int) -> Path:
        return self.gen_dir(llm, task, gen) / "candidates"

    def candidate(self, llm: str, task: str, gen: int, cid: str) -> Path:
        return self.candidates_dir(llm, task, gen) / f"{cid}.py"

    def proposal_meta(self, llm: str, task: str, gen: int, cid: str) -> Path:
        return self.candidates_dir(llm, task, gen) / f"{cid}.json"

    def stones(self, llm: str, task: str, gen: int) -> Path:
        return self.gen_dir(llm, task, gen) / "stones.json"

    def proposals(self, llm: str, task: str, gen: int) -> Path:
        return self.gen_dir(llm, task, gen) / "proposals.json"

    def verdicts_dir(self, llm: str, task: str, gen: int) -> Path:
        return self.gen_dir(llm, task, gen) / "verdicts"

    def verdict(self, llm: str, task: str, gen: int, cid: str) -> Path:
        return self.verdicts_dir(llm, task, gen) / f"{cid}.json"

    def verdicts(self, llm: str, task: str, gen: int) -> Path:
        return self.gen_dir(llm, task, gen) / "verdicts.json"

    def profile(self, llm: str, task: str) -> Path:
        return self.task_dir(llm, task) / "profile.json"

    def tracked(self, llm: str, task: str) -> Path:
        return self.task_dir(llm, task) / "tracked.json"

    def backend_tracked(self, llm: str) -> Path:
        return self.root / llm / "tracked.json"

    def archive_dir(self) -> Path:
        return self.root / "archive"

    def report(self) -> Path:
        return self.root / "report.html"

    def llms(self) -> list[str]:
        skip = {"tasks", "baselines", "archive", "logs", "mlartifacts"}
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and p.name not in skip and not p.name.startswith("."))

    def generations(self, llm: str, task: str) -> list[int]:
        d = self.task_dir(llm, task)
        if not d.exists():
            return []
        return sorted(int(p.name[4:]) for p in d.glob("gen_*") if p.name[4:].isdigit())
