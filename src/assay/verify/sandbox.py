"""Run an untrusted command (the candidate's worker) in a sandbox, and say what the sandbox was.

Each layer is applied where this machine allows it; the returned :class:`Outcome` records, per
layer, what was applied or why not, so a verdict can say so.

- ``session``: its own session and process group; killed as a group at the end.
- ``pid_namespace``: the worker is process 1 of a new pid namespace, so when it ends the kernel
  ends everything it started (even what left the process group), and it sees no other process.
- ``network``: a new network namespace; its only interface, loopback, is down (no 127.0.0.1,
  no DNS, no outward connection).
- ``filesystem``: a mount namespace in which every mount is read-only except bind mounts of
  the scratch folder and the kernel cache; /tmp, /dev/shm, the results tree and the repository
  refuse writes (EROFS).
- ``user``: as root, the worker runs as a dedicated unprivileged uid (one per concurrent
  sandbox, ``ASSAY_SANDBOX_UID`` + slot), so it cannot signal the harness, cannot undo the
  read-only mounts, and RLIMIT_NPROC binds. Directories it must read that only root may enter
  (a Python under /root) are shown to it through a read-only tmpfs that holds only those paths.
  Where that cannot be arranged it runs as root with every capability dropped.
- ``processes``: RLIMIT_NPROC (binds a non-root uid only) and a pids cgroup where cgroups are
  writable.
- ``memory``: RLIMIT_AS per process on the cpu target (CUDA maps far more address space than it
  uses), and a memory cgroup for the whole tree on every target where cgroups are writable.
- ``limits``: CPU seconds, open files, file size; no core dumps; no new privileges (setuid
  binaries do not elevate).

The setup runs in a launcher process (``python -m assay.verify.sandbox --launch``) that then
execs the worker; the harness itself (threaded, with torch) never forks into setup code. The
launcher reports what it applied through a pipe it closes before the exec, so the candidate
cannot forge the report.

Kernel cache: the worker builds into the shared cache (``ASSAY_KERNEL_CACHE``, default
``~/.cache/assay/kernels``) so identical kernels compile once. The folder is made group-writable
for the sandbox group with the sticky bit (a sandbox uid cannot replace or delete a file it does
not own), and after each run everything the sandbox uid created there is handed to root and made
read-only, so a later candidate cannot alter a library another one built. A candidate can still
plant a library under a key that a future source would hash to; ``ASSAY_SANDBOX_PRIVATE_CACHE=1``
gives each run a private cache in its scratch folder instead (every kernel is then rebuilt).
``ASSAY_SANDBOX_DISABLE=uid,mount,pidns,net,cgroup`` turns layers off (tests of the fallbacks).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from assay.verify.settings import SandboxLimits

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
_MOUNT_OPTS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
               "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
               "strictatime": MS_STRICTATIME}
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscalls are unified)
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4

UID_BASE_DEFAULT = 0x6A550000  # far from login, system and subuid ranges
SLOTS = 128
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


def candidate_env() -> dict[str, str]:
    """The environment the worker sees: no API keys, nothing the candidate needs to reach."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
            "ASSAY_KERNEL_CACHE", "ASSAY_CUDA_ARCH", "CXX", "NVCC", "TMPDIR", "OMP_NUM_THREADS",
            "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TORCH_EXTENSIONS_DIR", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ---------------------------------------------------------------------------------------------
# The parent side: plan, launch, wait, clean up.


def run_sandboxed(cmd: list[str], cwd: Path, timeout_s: float, limits: SandboxLimits,
                  device: str = "cpu") -> Outcome:
    """Run ``cmd`` in ``cwd`` (the scratch folder, which the caller removes afterwards).

    Returns an :class:`Outcome`: the str "ok", "timeout after N s ...", "exit N: <log tail>" or
    "killed by signal S: <log tail>", with ``.isolation`` saying what the sandbox applied.
    Every process the worker started is dead when this returns.
    """
    from assay.layout import stop_cleanly_on_signals

    stop_cleanly_on_signals()  # a SIGTERM to the step still kills the worker and cleans up
    cwd = Path(cwd).resolve()
    disabled = _disabled()
    slot = _Slot.take() if _is_root() and "uid" not in disabled else None
    cgroups = _Cgroups()
    try:
        cgroups = _Cgroups.create(slot.index if slot else None, limits, disabled)
        return _run(cmd, cwd, timeout_s, limits, device, disabled, slot, cgroups)
    finally:
        cgroups.kill_all()
        cgroups.remove()
        if slot is not None:
            slot.release()


def _run(cmd: list[str], cwd: Path, timeout_s: float, limits: SandboxLimits, device: str,
         disabled: set[str], slot: "_Slot | None", cgroups: "_Cgroups") -> Outcome:
    iso: dict[str, str] = {"session": "on: own session and process group"}
    uid = gid = None
    cache, private_cache = _kernel_cache(cwd)
    covers: dict[str, list] = {}
    uid_plan_error = ""
    if slot is not None:
        try:
            if not private_cache:
                _open_cache_to_group(cache, slot.gid)
        except OSError:
            cache, private_cache = cwd / "kernels", True  # cannot share it: a private one
        try:
            rw = [cwd] + ([] if private_cache else [cache])
            covers = _plan_covers(_needed_paths(), rw, slot.uid, slot.gid)
            uid, gid = slot.uid, slot.gid
        except (_PlanError, OSError) as e:
            uid_plan_error = str(e)
    elif not _is_root():
        uid_plan_error = "not root: runs as the calling user"
    elif "uid" in disabled:
        uid_plan_error = "disabled by ASSAY_SANDBOX_DISABLE"
    else:
        uid_plan_error = "no free sandbox uid slot (/run/assay-sandbox)"
    rw = [cwd] + ([] if private_cache else [cache])

    env = candidate_env()
    env.update(HOME=str(cwd), TMPDIR=str(cwd), XDG_CACHE_HOME=str(cwd / ".cache"),
               TORCH_EXTENSIONS_DIR=str(cwd / "torch_extensions"), CUDA_CACHE_PATH=str(cwd / ".nv"),
               ASSAY_KERNEL_CACHE=str(cache), PYTHONDONTWRITEBYTECODE="1")
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
        "drop_caps": _is_root(), "parent": os.getpid(),
        "groups": _device_groups() if device != "cpu" and uid is not None else [],
    }
    log = cwd / "worker.log"
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    read_fd, write_fd = os.pipe()
    code: int | None = None
    timed_out = False
    report: dict = {}
    try:
        spec["report_fd"] = write_fd
        launcher = [sys.executable, "-m", "assay.verify.sandbox", "--launch", json.dumps(spec),
                    "--", *cmd]
        with open(log, "wb") as out:
            proc = subprocess.Popen(launcher, cwd="/", stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                                    start_new_session=True)
            os.close(write_fd)
            write_fd = -1
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)  # the launcher, the worker and whatever stayed in the group
                if uid is not None:
                    _kill_uid(uid)
                cgroups.kill_all()
        report = _read_report(read_fd)
    finally:
        if write_fd >= 0:
            os.close(write_fd)
        os.close(read_fd)
        if uid is not None and not private_cache:
            _freeze_cache(cache, uid)
        _sanitize_scratch(cwd, chown=_is_root())
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
        elif sig in ("SIGXCPU", "SIGKILL") and _cpu_s(ru0) >= 0.95 * limits.cpu_s:
            why = f" (CPU time limit {limits.cpu_s} s)"
        elif sig == "SIGXFSZ":
            why = f" (file size limit {FILE_SIZE_LIMIT >> 30} GB)"
        return Outcome(f"killed by signal {sig}{why}: {tail}", "signal", iso, code)
    return Outcome(f"exit {code}: {tail}", "exit", iso, code)


def _cpu_s(before: resource.struct_rusage) -> float:
    """CPU seconds of the children reaped since ``before`` (the worker's, through the relay)."""
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


def _kill_group(proc: subprocess.Popen) -> None:
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


def _layers(report: dict, limits: SandboxLimits, device: str, cgroups: "_Cgroups",
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


def _device_groups() -> list[int]:
    """Groups that open the GPU's device nodes where "others" may not (video, render): the
    unprivileged uid joins them so CUDA still finds its devices."""
    import glob

    gids = set()
    for node in glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*") + \
            glob.glob("/dev/dri/*"):
        try:
            st = os.stat(node)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and st.st_mode & 0o006 != 0o006 and st.st_gid != 0:
            gids.add(st.st_gid)
    return sorted(gids)


def _disabled() -> set[str]:
    return {w.strip() for w in os.environ.get("ASSAY_SANDBOX_DISABLE", "").split(",") if w.strip()}


def _is_root() -> bool:
    return os.geteuid() == 0


def _kernel_cache(scratch: Path) -> tuple[Path, bool]:
    """The cache the worker builds into, and whether it is private to this run."""
    if os.environ.get("ASSAY_SANDBOX_PRIVATE_CACHE", "") not in ("", "0"):
        return scratch / "kernels", True
    from assay.bench.build import cache_dir

    try:
        return cache_dir().resolve(), False
    except OSError:
        return scratch / "kernels", True


class _Slot:
    """One of SLOTS uids, held with an flock for the life of one sandboxed run."""

    def __init__(self, index: int, fd: int):
        base = int(os.environ.get("ASSAY_SANDBOX_UID", UID_BASE_DEFAULT))
        self.index, self.fd = index, fd
        self.uid, self.gid = base + 1 + index, base

    @classmethod
    def take(cls) -> "_Slot | None":
        import fcntl

        # A fixed place, whatever TMPDIR says: every harness on this machine must see the same
        # slots, or two could share a uid and a cgroup.
        d = Path("/run/assay-sandbox") if os.access("/run", os.W_OK) else \
            Path(f"/tmp/assay-sandbox-slots-{os.geteuid()}")
        try:
            d.mkdir(mode=0o700, exist_ok=True)
            st = d.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return None  # someone else made it: do not trust its locks
        except OSError:
            return None
        start = os.getpid() % SLOTS
        for k in range(SLOTS):
            i = (start + k) % SLOTS
            fd = os.open(d / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(i, fd)
        return None

    def release(self) -> None:
        os.close(self.fd)


# --- which paths the worker must read, and how an unprivileged uid gets to them --------------


class _PlanError(Exception):
    pass


def _needed_paths() -> list[tuple[Path, bool]]:
    """What the worker must read, each with whether it is essential: the interpreter and its
    prefixes are; sys.path entries, libraries and tools are if they are readable at all."""
    essential = [sys.executable, os.path.dirname(sys.executable),
                 os.path.dirname(os.path.realpath(sys.executable)), sys.prefix,
                 sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    optional = [p for p in sys.path if p]
    for var in ("LD_LIBRARY_PATH", "PYTHONPATH"):
        optional += [p for p in os.environ.get(var, "").split(os.pathsep) if p]
    for var in ("CUDA_HOME", "CXX", "NVCC"):
        if os.path.isabs(os.environ.get(var, "")):
            optional.append(os.environ[var])
    out, seen = [], set()
    for paths, need in ((essential, True), (optional, False)):
        for p in paths:
            for q in (os.path.abspath(p), os.path.realpath(p)):
                if q not in seen and os.path.exists(q):
                    seen.add(q)
                    out.append((Path(q), need))
    return out


def _can(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    """Whether (uid, gid) has ``bits`` (a mask of r=4, w=2, x=1) on a file with ``st``."""
    if st.st_uid == uid:
        have = (st.st_mode >> 6) & 7
    elif st.st_gid == gid:
        have = (st.st_mode >> 3) & 7
    else:
        have = st.st_mode & 7
    return have & bits == bits


def _blocked_ancestor(path: Path, uid: int, gid: int) -> Path | None:
    """The topmost directory above ``path`` that (uid, gid) cannot enter, or None."""
    real = Path(os.path.realpath(path))
    for anc in reversed(real.parents):
        try:
            if not _can(os.stat(anc), uid, gid, 1):
                return anc
        except OSError:
            return None
    return None


def _plan_covers(needed: list[tuple[Path, bool]], rw: list[Path], uid: int,
                 gid: int) -> dict[str, list]:
    """{blocked dir: [[path relative to it, "ro"|"rw"], ...]}: each blocked directory is covered
    with a read-only tmpfs that holds bind mounts of just the needed paths under it."""
    covers: dict[str, list] = {}
    wants = [(Path(os.path.realpath(p)), "ro", need) for p, need in needed]
    wants += [(Path(os.path.realpath(p)), "rw", True) for p in rw]
    for path, mode, need in wants:
        if mode == "ro":
            st = os.stat(path)
            if not _can(st, uid, gid, 5 if stat.S_ISDIR(st.st_mode) else 4):
                if need:
                    raise _PlanError(f"{path} is not readable by an unprivileged uid")
                continue  # an unreadable sys.path entry: Python skips it
        anc = _blocked_ancestor(path, uid, gid)
        if anc is None:
            continue
        covers.setdefault(str(anc), []).append([str(path.relative_to(anc)), mode])
    # A blocked directory inside another one is covered by the outer one.
    for a in sorted(covers, key=len, reverse=True):
        outer = next((b for b in covers if b != a and Path(a).is_relative_to(b)), None)
        if outer:
            covers[outer] += [[str(Path(a, r).relative_to(outer)), m] for r, m in covers.pop(a)]
    # Bind the outermost of nested paths only (rw ones always: they re-open write access).
    for a, items in covers.items():
        ro = sorted({r for r, m in items if m == "ro"}, key=len)
        keep: list[str] = []
        for r in ro:
            if not any(Path(r).is_relative_to(k) for k in keep):
                keep.append(r)
        covers[a] = [[r, "ro"] for r in keep] + [[r, "rw"] for r, m in items if m == "rw"]
    return covers


# --- the kernel cache shared between sandboxed runs -----------------------------------------


def _open_cache_to_group(cache: Path, gid: int) -> None:
    """Let the sandbox group add files to the cache, but not replace or remove others' files."""
    cache.mkdir(parents=True, exist_ok=True)
    st = cache.stat()
    want = 0o3775  # setgid (files join the group), sticky (only owners may rename/unlink)
    if st.st_gid != gid:
        os.chown(cache, st.st_uid, gid)
    if stat.S_IMODE(st.st_mode) != want:
        os.chmod(cache, want)
    # Lock files another user made 0644 would refuse the sandbox uid (filelock opens O_RDWR);
    # their content never matters, only the flock.
    with os.scandir(cache) as it:
        for e in it:
            if e.name.endswith(".lock") and e.is_file(follow_symlinks=False):
                try:
                    if stat.S_IMODE(e.stat(follow_symlinks=False).st_mode) != 0o666:
                        os.chmod(e.path, 0o666)
                except OSError:
                    pass


def _freeze_cache(cache: Path, uid: int) -> None:
    """Hand what the sandbox uid made in the cache to root, read-only; drop its leftovers."""
    try:
        entries = list(os.scandir(cache))
    except OSError:
        return
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if st.st_uid != uid:
                continue
            if stat.S_ISREG(st.st_mode):
                os.chown(e.path, 0, st.st_gid)
                os.chmod(e.path, 0o666 if e.name.endswith(".lock") else 0o444)
            elif stat.S_ISDIR(st.st_mode):
                shutil.rmtree(e.path, ignore_errors=True)  # an interrupted build's folder
            else:
                os.unlink(e.path)  # symlinks, fifos: never a build product
        except OSError:
            pass


def _sanitize_scratch(scratch: Path, chown: bool) -> None:
    """After the worker: only plain files and folders stay (no symlink to a root-only file, no
    fifo that would block the harness's read), all owned by root again."""
    for root, dirs, files in os.walk(scratch):
        for name in dirs + files:
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode)
                                                    or stat.S_ISDIR(st.st_mode)):
                    os.unlink(p)
                    continue
                if chown:
                    os.chown(p, 0, 0)
            except OSError:
                pass
    if chown:
        try:
            os.chown(scratch, 0, 0)
        except OSError:
            pass


# --- processes: kill by uid -------------------------------------------------------------------


def _live_pids_of_uid(uid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uids = {int(x) for x in fields.get("Uid", "").split()}
        if uid in uids and not fields.get("State", "").strip().startswith(("Z", "X")):
            pids.append(int(d))
    return pids


def _kill_uid(uid: int, rounds: int = 200) -> bool:
    """SIGKILL every live process of ``uid`` until none is left (a fork bomb races this)."""
    for _ in range(rounds):
        pids = _live_pids_of_uid(uid)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)
    return not _live_pids_of_uid(uid)


# --- cgroups ----------------------------------------------------------------------------------


class _Cgroups:
    """pids and memory cgroups (v1 or v2) for one run, where this machine lets us make them."""

    def __init__(self):
        self.dirs: list[Path] = []
        self.pids = False
        self.memory = False
        self.why = ""
        self._oom_before = 0

    @classmethod
    def create(cls, index: int | None, limits: SandboxLimits,
               disabled: set[str]) -> "_Cgroups":
        self = cls()
        if "cgroup" in disabled:
            self.why = "cgroups disabled by ASSAY_SANDBOX_DISABLE"
            return self
        if not _is_root():
            self.why = "not root"
            return self
        name = f"assay-sandbox-{index if index is not None else os.getpid()}"
        try:
            places = _cgroup_places()
        except OSError as e:
            self.why = f"cannot read /proc/self/cgroup: {e}"
            return self
        errors = []
        for ctrl, (base, version) in places.items():
            d = base / name
            try:
                if d.exists():
                    _cgroup_kill(d)
                    d.rmdir()
                d.mkdir()
            except OSError as e:
                errors.append(f"{ctrl}: {e.strerror or e}")
                continue
            try:
                if ctrl == "pids":
                    (d / "pids.max").write_text(str(int(limits.processes)))
                    self.pids = True
                elif ctrl == "memory" and limits.memory_gb:
                    n = str(int(limits.memory_gb * (1 << 30)))
                    (d / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(n)
                    if version == 2 and (d / "memory.swap.max").exists():
                        (d / "memory.swap.max").write_text("0")
                    self.memory = True
                if d not in self.dirs:
                    self.dirs.append(d)
            except OSError as e:
                errors.append(f"{ctrl}: {e.strerror or e}")
                try:
                    d.rmdir()
                except OSError:
                    pass
        if not places:
            self.why = "no writable pids or memory cgroup here"
        elif errors:
            self.why = "; ".join(errors)
        self._oom_before = self._oom_count()
        return self

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def _oom_count(self) -> int:
        n = 0
        for d in self.dirs:
            for fname in ("memory.events", "memory.oom_control"):
                try:
                    for line in (d / fname).read_text().splitlines():
                        k, _, v = line.partition(" ")
                        if k == "oom_kill":
                            n += int(v)
                except (OSError, ValueError):
                    pass
        return n

    def oom_killed(self) -> bool:
        return self._oom_count() > self._oom_before

    def kill_all(self) -> None:
        for d in self.dirs:
            _cgroup_kill(d)

    def remove(self) -> None:
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    _cgroup_kill(d)
                    time.sleep(0.02)
        self.dirs = []


def _cgroup_kill(d: Path) -> None:
    kill = d / "cgroup.kill"
    if kill.exists():
        try:
            kill.write_text("1")
        except OSError:
            pass
    for _ in range(200):
        try:
            pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _cgroup_places() -> dict[str, tuple[Path, int]]:
    """{"pids"|"memory": (this process's cgroup folder in that hierarchy, version)} for the
    hierarchies that are mounted and writable here."""
    mounts: list[tuple[Path, str, set[str]]] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
                mounts.append((Path(_unescape(fields[4])), rfields[0],
                               set(rfields[2].split(","))))
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else ["" if hid == "0" else ctrls]:
                own[c] = path
    out: dict[str, tuple[Path, int]] = {}
    for ctrl in ("pids", "memory"):
        for mnt, fstype, opts in mounts:
            if fstype == "cgroup" and ctrl in opts and ctrl in own:
                base = mnt / own[ctrl].lstrip("/")
                if os.access(base, os.W_OK):
                    out[ctrl] = (base, 1)
                break
        else:
            for mnt, fstype, _ in mounts:
                if fstype == "cgroup2" and "" in own:
                    base = mnt / own[""].lstrip("/")
                    try:
                        avail = (base / "cgroup.subtree_control").read_text().split()
                    except OSError:
                        continue
                    if ctrl in avail and os.access(base, os.W_OK):
                        out[ctrl] = (base, 2)
                        break
    return out


def _unescape(s: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# The launcher: runs as the parent's user (root, usually), sets the sandbox up, execs the worker.


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.unshare.argtypes = [ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong]
    libc.syscall.restype = ctypes.c_long
    return libc


_LIBC: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    return _LIBC


def _check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)} ({errno.errorcode.get(e, e)})")


def _mount(src: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_c().mount(enc(src), enc(target), enc(fstype), flags, enc(data)),
           f"mount {target}")


def _mountinfo() -> list[tuple[str, int]]:
    """(mount point, per-mount flags to keep) of every mount, parents first."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" - ")[0].split()
            flags = 0
            for o in fields[5].split(","):
                flags |= _MOUNT_OPTS.get(o, 0)
            out.append((_unescape(fields[4]), flags))
    return sorted(out, key=lambda m: m[0].count("/") if m[0] != "/" else 0)


def _all_read_only() -> str:
    """Make every mount in this (new, private) mount namespace read-only."""
    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = _c().syscall(SYS_MOUNT_SETATTR, ctypes.c_int(AT_FDCWD), b"/",
                       ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr),
                       ctypes.c_size_t(ctypes.sizeof(attr)))
    if ret == 0:
        return "mount_setattr"
    failed = []
    for mp, flags in _mountinfo():  # older kernels: one remount per mount
        try:
            _mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            failed.append(mp)
    if "/" in failed:
        raise OSError(errno.EPERM, "cannot remount / read-only")
    return "remount" + (f" (still writable: {', '.join(failed[:5])})" if failed else "")


def _bind(src: str, target: str, rw: bool) -> None:
    _mount(src, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
           | (0 if rw else MS_RDONLY))


class _HalfMounted(OSError):
    """The mounts went read-only but the writable binds failed: the worker cannot run."""


def _setup_mounts(plan: dict) -> str:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    how = _all_read_only()
    try:
        _cover_and_bind(plan)
    except OSError as e:
        raise _HalfMounted(e.errno, f"read-only mounts made, but {e.strerror}") from None
    return how


def _cover_and_bind(plan: dict) -> None:
    for anc, items in plan["covers"].items():
        fd = os.open(anc, os.O_PATH | os.O_DIRECTORY)  # the original, reachable once covered
        _mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for rel, _mode in items:
            target = os.path.join(anc, rel)
            src = f"/proc/self/fd/{fd}/{rel}"
            if os.path.isdir(src):
                os.makedirs(target, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                open(target, "a").close()
        # Parents first, so a nested rw bind lands on top of an outer ro one.
        for rel, mode in sorted(items, key=lambda it: it[0].count("/")):
            _bind(f"/proc/self/fd/{fd}/{rel}", os.path.join(anc, rel), mode == "rw")
        os.close(fd)
        _mount(None, anc, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for p in plan["rw"]:
        if not any(Path(p).is_relative_to(a) for a in plan["covers"]):
            os.makedirs(p, exist_ok=True)
            _bind(p, p, True)


def _drop_capabilities() -> None:
    """Root without capabilities: it cannot remount, mount, setns, load modules or trace."""
    libc = _c()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    _check(libc.capset(ctypes.byref(Header(0x20080522, 0)), data), "capset")


def _launch(spec: dict, cmd: list[str]) -> None:
    libc = _c()
    report_fd = spec["report_fd"]
    os.set_inheritable(report_fd, False)
    rep: dict[str, str] = {}

    def send(**items: str) -> None:
        os.write(report_fd, (json.dumps(items) + "\n").encode())

    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # dies with the harness
    if os.getppid() != spec.get("parent", os.getppid()):
        os._exit(111)  # the harness is gone already
    root = os.geteuid() == 0
    for procs in spec["cgroup_procs"]:  # before anything forks: the whole tree is counted
        try:
            Path(procs).write_text(str(os.getpid()))
        except OSError:
            pass

    if not spec["net"]:
        try:
            _check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            rep["network"] = "on: own network namespace, loopback down"
        except OSError as e:
            rep["network"] = f"off: {e.strerror}"
    else:
        rep["network"] = f"off: {spec['net']}"

    mounted = False
    if spec["mount"] is None:
        rep["filesystem"] = "off: disabled by ASSAY_SANDBOX_DISABLE"
    else:
        try:
            _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            try:
                how = _setup_mounts(spec["mount"])
                mounted = True
                also = " and the kernel cache" if len(spec["mount"]["rw"]) > 1 else ""
                rep["filesystem"] = f"on: read-only except the scratch folder{also} ({how})"
            except _HalfMounted as e:
                send(launcher_error=f"mount namespace: {e.strerror}", **rep)
                os._exit(126)
            except OSError as e:
                rep["filesystem"] = f"off: {e.strerror}"
        except OSError as e:
            rep["filesystem"] = f"off: {e.strerror}"

    uid, gid = spec["uid"], spec["gid"]
    if uid is not None and spec["uid_needs_covers"] and not mounted:
        uid = gid = None
        spec["uid_plan_error"] = ("its interpreter is under a folder only root may enter and "
                                  "there is no mount namespace to show it")

    pidns = False
    if spec["pidns"]:
        try:
            _check(libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
            pidns = True
        except OSError as e:
            rep["pid_namespace"] = f"off: {e.strerror}"
    else:
        rep["pid_namespace"] = "off: disabled by ASSAY_SANDBOX_DISABLE"
    if pidns:
        pid = os.fork()
        if pid:  # the relay: waits, then ends the way the worker ended
            os.close(report_fd)
            try:  # the cgroup's OOM killer is for the worker, not for this relay
                Path("/proc/self/oom_score_adj").write_text("-1000")
            except OSError:
                pass
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_IGN)
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    os._exit(112)
                except InterruptedError:
                    continue
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if sig not in (signal.SIGKILL, signal.SIGSTOP):
                    signal.signal(sig, signal.SIG_DFL)
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                os.kill(os.getpid(), sig)
                os._exit(128 + sig)
            os._exit(os.WEXITSTATUS(status))
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        rep["pid_namespace"] = "on: the worker is process 1 of its own pid namespace"
        if mounted:
            try:
                _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                rep["pid_namespace"] += " (sees only its own processes)"
            except OSError:
                pass

    try:
        if uid is not None:
            _chown_tree(spec["cwd"], uid, gid)
        for name, value in spec["rlimits"]:
            lim = getattr(resource, name)
            soft, hard = resource.getrlimit(lim)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(lim, (value, value))
        if uid is not None:
            os.setgroups(spec.get("groups", []))
            os.setgid(gid)
            os.setuid(uid)
            rep["user"] = f"on: unprivileged uid {uid}"
        elif root and spec["drop_caps"]:
            _drop_capabilities()
            rep["user"] = f"off: root with every capability dropped ({spec['uid_plan_error']})"
        else:
            rep["user"] = f"off: {spec['uid_plan_error'] or 'runs as the calling user'}"
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a uid change cleared it
        if uid is not None and not pidns:
            try:
                os.kill(-1, signal.SIGKILL)  # what an earlier run of this uid left behind
            except ProcessLookupError:
                pass
        os.chdir(spec["cwd"])
    except OSError as e:
        send(launcher_error=f"{e}", **rep)
        os._exit(126)
    send(**rep)
    os.close(report_fd)
    try:
        os.execvpe(cmd[0], cmd, spec["env"])
    except OSError as e:
        os.write(2, f"sandbox: cannot run {cmd[0]}: {e}\n".encode())
        os._exit(127)


def _chown_tree(top: str, uid: int, gid: int) -> None:
    os.chown(top, uid, gid)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 3 and argv[0] == "--launch" and argv[2] == "--":
        _launch(json.loads(argv[1]), argv[3:])
        return 0  # not reached: _launch execs or exits
    print("usage: python -m assay.verify.sandbox --launch SPEC -- CMD...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
