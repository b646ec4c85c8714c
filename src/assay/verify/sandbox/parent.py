"""The parent side of the sandbox: plan the launcher's spec, launch it, wait, clean up, and say
what the sandbox applied (:class:`Outcome`). Runs in the harness's process."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from assay.verify.sandbox import zygote
from assay.verify.sandbox.cgroups import Cgroups
from assay.verify.sandbox.host import (PlanError, Slot, device_groups, freeze_cache, is_root,
                                       kernel_cache, kill_uid, needed_paths,
                                       open_cache_to_group, plan_covers, sanitize_scratch)
from assay.verify.settings import SandboxLimits

FILE_SIZE_LIMIT = 64 << 30  # one runaway file (a log, a result) cannot fill the disk alone
LAYERS = ("session", "pid_namespace", "network", "filesystem", "user", "processes", "memory",
          "limits")


class Outcome(str):
    """How the worker ended, as the one line callers always used (this *is* that str), plus
    ``status`` (ok | timeout | exit | signal | error), ``returncode`` and ``isolation``
    ({layer: "on: ..." | "off: why"})."""

    status: str
    returncode: int | None
    isolation: dict[str, str]

    def __new__(cls, line: str = "", status: str = "error", isolation: dict | None = None,
                returncode: int | None = None) -> "Outcome":
        self = super().__new__(cls, line)
        self.status = status
        self.returncode = returncode
        self.isolation = dict(isolation or {})
        return self

    @property
    def line(self) -> str:
        return str(self)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def missing(self) -> dict[str, str]:
        """The layers that were not applied, with the reason."""
        return {k: v for k, v in self.isolation.items() if not v.startswith("on")}

    def isolation_line(self) -> str:
        """One line for the verdict: every layer not applied and why, or that all were."""
        miss = self.missing()
        if not miss:
            return "sandbox complete: " + ", ".join(self.isolation)
        return "sandbox incomplete: " + "; ".join(f"{k} {v}" for k, v in miss.items())


SANDBOX_USER = "assay-sandbox"


def candidate_env() -> dict[str, str]:
    """The environment the worker sees: no API keys, nothing the candidate needs to reach."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
            "ASSAY_KERNEL_CACHE", "ASSAY_CUDA_ARCH", "CXX", "NVCC", "TMPDIR", "OMP_NUM_THREADS",
            "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TORCH_EXTENSIONS_DIR", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prestart_worker() -> None:
    """Start the zygote (a worker's torch import) now where it is wanted and not running: a
    verification that calls this before it prepares its references finds its worker's
    interpreter ready."""
    zygote.Zygote.get(candidate_env())


def run_sandboxed(cmd: list[str], cwd: Path, timeout_s: float, limits: SandboxLimits,
                  device: str = "cpu", on_start: Callable[[int], None] | None = None) -> Outcome:
    """Run ``cmd`` in ``cwd`` (the scratch folder, which the caller removes afterwards);
    ``on_start`` gets the started process's pid (the worker runs under it: an observer
    attaches there, verify/observer.py).

    Returns an :class:`Outcome`: the str "ok", "timeout after N s ...", "exit N: <log tail>" or
    "killed by signal S: <log tail>", with ``.isolation`` saying what the sandbox applied.
    Every process the worker started is dead when this returns.
    """
    from assay.layout import stop_cleanly_on_signals

    stop_cleanly_on_signals()  # a SIGTERM to the step still kills the worker and cleans up
    cwd = Path(cwd).resolve()
    disabled = _disabled()
    slot = Slot.take() if is_root() and "uid" not in disabled else None
    cgroups = Cgroups()
    try:
        cgroups = Cgroups.create(slot.index if slot else None, limits, disabled)
        return _run(cmd, cwd, timeout_s, limits, device, disabled, slot, cgroups, on_start)
    finally:
        cgroups.kill_all()
        cgroups.remove()
        if slot is not None:
            slot.release()


def _run(cmd: list[str], cwd: Path, timeout_s: float, limits: SandboxLimits, device: str,
         disabled: set[str], slot: "Slot | None", cgroups: "Cgroups",
         on_start: Callable[[int], None] | None = None) -> Outcome:
    iso: dict[str, str] = {"session": "on: own session and process group"}
    uid = gid = None
    cache, private_cache = kernel_cache(cwd)
    covers: dict[str, list] = {}
    uid_plan_error = ""
    if slot is not None:
        try:
            if not private_cache:
                open_cache_to_group(cache, slot.gid)
        except OSError:
            cache, private_cache = cwd / "kernels", True  # cannot share it: a private one
        try:
            rw = [cwd] + ([] if private_cache else [cache])
            covers = plan_covers(needed_paths(), rw, slot.uid, slot.gid)
            uid, gid = slot.uid, slot.gid
        except (PlanError, OSError) as e:
            uid_plan_error = str(e)
    elif not is_root():
        uid_plan_error = "not root: runs as the calling user"
    elif "uid" in disabled:
        uid_plan_error = "disabled by ASSAY_SANDBOX_DISABLE"
    else:
        uid_plan_error = "no free sandbox uid slot (/run/assay-sandbox)"
    rw = [cwd] + ([] if private_cache else [cache])

    env = candidate_env()
    env.update(HOME=str(cwd), TMPDIR=str(cwd), XDG_CACHE_HOME=str(cwd / ".cache"),
               TORCH_EXTENSIONS_DIR=str(cwd / "torch_extensions"), CUDA_CACHE_PATH=str(cwd / ".nv"),
               ASSAY_KERNEL_CACHE=str(cache), PYTHONDONTWRITEBYTECODE="1",
               # Triton's cache (compiled kernels, autotuning results) in the scratch folder,
               # where audit_provenance reads the cubins and nothing outlives the worker
               TRITON_CACHE_DIR=str(cwd / ".triton" / "cache"),
               TORCHINDUCTOR_CACHE_DIR=str(cwd / ".inductor"),
               # The sandbox's uid has no passwd entry: getpass.getuser() (inductor's cache
               # name, at torch.compile) raised KeyError on an H100 without these
               USER=SANDBOX_USER, LOGNAME=SANDBOX_USER)
    if device == "cpu":
        # No GPU: @triton.jit kernels run on cpu tensors in Triton's interpreter (numpy under
        # the hood, no device kernels); a candidate without Triton is unaffected.
        env["TRITON_INTERPRET"] = "1"
    rlimits = [("RLIMIT_CPU", int(limits.cpu_s)), ("RLIMIT_NOFILE", int(limits.open_files)),
               ("RLIMIT_NPROC", int(limits.processes)), ("RLIMIT_CORE", 0),
               ("RLIMIT_FSIZE", FILE_SIZE_LIMIT)]
    if device == "cpu" and limits.memory_gb:
        rlimits.append(("RLIMIT_AS", int(limits.memory_gb * (1 << 30))))
    spec = {
        "cwd": str(cwd), "env": env, "report_fd": -1, "rlimits": rlimits,
        "net": "allowed by verify.limits.network" if limits.network else
               "disabled by ASSAY_SANDBOX_DISABLE" if "net" in disabled else "",
        "mount": None if "mount" in disabled else {"rw": [str(p) for p in rw], "covers": covers},
        "pidns": "pidns" not in disabled,
        "uid": uid, "gid": gid, "uid_needs_covers": bool(covers),
        "uid_plan_error": uid_plan_error, "cgroup_procs": cgroups.procs_files(),
        "drop_caps": is_root(), "parent": os.getpid(),
        "groups": device_groups() if device != "cpu" and uid is not None else [],
    }
    log = cwd / "worker.log"
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    read_fd, write_fd = os.pipe()
    code: int | None = None
    timed_out = False
    report: dict = {}
    try:
        spec["report_fd"] = write_fd
        with open(log, "wb") as out:
            proc = _start(spec, cmd, out, write_fd)
            if on_start is not None:
                on_start(proc.pid)
            os.close(write_fd)
            write_fd = -1
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)  # the launcher, the worker and whatever stayed in the group
                if uid is not None:
                    kill_uid(uid)
                cgroups.kill_all()
        report = _read_report(read_fd)
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        if uid is not None and not private_cache:
            freeze_cache(cache, uid)
        sanitize_scratch(cwd, chown=is_root())
    oom = cgroups.oom_killed()

    iso.update(_layers(report, limits, device, cgroups, private_cache))
    if report.get("launcher_error"):
        return Outcome(f"sandbox failed: {report['launcher_error']}", "error", iso, code)
    if timed_out:
        return Outcome(f"timeout after {timeout_s:.0f} s (the candidate did not finish)",
                       "timeout", iso, None)
    if code == 0:
        return Outcome("ok", "ok", iso, 0)
    tail = _tail(log)
    if code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"{-code}"
        why = ""
        if oom:
            why = f" (out of memory: the sandbox's {limits.memory_gb:g} GB limit)"
        elif sig in ("SIGXCPU", "SIGKILL") and _cpu_s(ru0, proc) >= 0.95 * limits.cpu_s:
            why = f" (CPU time limit {limits.cpu_s} s)"
        elif sig == "SIGXFSZ":
            why = f" (file size limit {FILE_SIZE_LIMIT >> 30} GB)"
        return Outcome(f"killed by signal {sig}{why}: {tail}", "signal", iso, code)
    return Outcome(f"exit {code}: {tail}", "exit", iso, code)


def _start(spec: dict, cmd: list[str], out,
           report_fd: int) -> "subprocess.Popen | zygote.Child":
    """The launcher, writing to ``out``: forked by the zygote (torch imported already) where
    ``cmd`` is the worker's and the zygote is wanted, else a fresh Python that sets the
    sandbox up and execs ``cmd``."""
    if zygote.runs(cmd):
        z = zygote.Zygote.get(candidate_env())
        if z is not None:
            try:
                return z.spawn({**spec, "parent": z.pid}, cmd, out.fileno(), report_fd)
            except OSError:
                zygote.Zygote.discard(z)
    launcher = [sys.executable, "-m", "assay.verify.sandbox", "--launch", json.dumps(spec),
                "--", *cmd]
    return subprocess.Popen(launcher, cwd="/", stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT, pass_fds=(report_fd,),
                            start_new_session=True)


def _cpu_s(before: resource.struct_rusage, proc: "subprocess.Popen | zygote.Child") -> float:
    """CPU seconds of the launcher's tree (the worker's, through the relay): from the zygote
    that reaped it, or those of this process's children reaped since ``before``."""
    if isinstance(proc, zygote.Child):
        return proc.cpu_s
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (now.ru_utime + now.ru_stime) - (before.ru_utime + before.ru_stime)


def _tail(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 1500))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _kill_group(proc: "subprocess.Popen | zygote.Child") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _read_report(fd: int) -> dict:
    """The launcher's JSON lines, merged; read after every writer is gone (no blocking)."""
    chunks = []
    while select.select([fd], [], [], 0.05)[0]:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data)
    report: dict = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        try:
            report.update(json.loads(line))
        except ValueError:
            pass
    return report


def _layers(report: dict, limits: SandboxLimits, device: str, cgroups: "Cgroups",
            private_cache: bool) -> dict[str, str]:
    """{layer: "on: ..." | "off: why"} from what the launcher says it applied."""
    if not report:
        return {k: "off: the launcher reported nothing (it died before the worker started)"
                for k in LAYERS if k != "session"}
    out = {k: report.get(k, "off: not reported") for k in ("pid_namespace", "network",
                                                             "filesystem", "user")}
    dropped_uid = report.get("user", "").startswith("on")
    procs = []
    if dropped_uid:
        procs.append(f"RLIMIT_NPROC {limits.processes} for its own uid")
    if cgroups.pids:
        procs.append(f"pids cgroup {limits.processes}")
    out["processes"] = ("on: " + ", ".join(procs)) if procs else (
        "off: RLIMIT_NPROC does not bind root and no pids cgroup could be made"
        + (f" ({cgroups.why})" if cgroups.why else ""))
    mem = []
    if device == "cpu" and limits.memory_gb:
        mem.append(f"address space {limits.memory_gb:g} GB per process")
    if cgroups.memory:
        mem.append(f"memory cgroup {limits.memory_gb:g} GB for all its processes")
    out["memory"] = ("on: " + ", ".join(mem)) if mem else (
        "off: no address-space limit on cuda and no memory cgroup"
        + (f" ({cgroups.why})" if cgroups.why else ""))
    out["limits"] = (f"on: CPU {limits.cpu_s} s, {limits.open_files} open files, files "
                     f"<= {FILE_SIZE_LIMIT >> 30} GB, no core dumps, no new privileges"
                     + (", private kernel cache" if private_cache else ""))
    return out


def _disabled() -> set[str]:
    return {w.strip() for w in os.environ.get("ASSAY_SANDBOX_DISABLE", "").split(",") if w.strip()}
