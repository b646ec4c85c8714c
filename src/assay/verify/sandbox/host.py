"""Host preparation around one sandboxed run, done by the parent as root: a uid slot, the plan
that shows an unprivileged uid the paths it must read, the kernel cache's permissions, and the
clean-up afterwards (the scratch folder, the cache, every process of the uid)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path

UID_BASE_DEFAULT = 0x6A550000  # far from login, system and subuid ranges
SLOTS = 128


def device_groups() -> list[int]:
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


def is_root() -> bool:
    return os.geteuid() == 0


def kernel_cache(scratch: Path) -> tuple[Path, bool]:
    """The cache the worker builds into, and whether it is private to this run."""
    if os.environ.get("ASSAY_SANDBOX_PRIVATE_CACHE", "") not in ("", "0"):
        return scratch / "kernels", True
    from assay.bench.build import cache_dir

    try:
        return cache_dir().resolve(), False
    except OSError:
        return scratch / "kernels", True


class Slot:
    """One of SLOTS uids, held with an flock for the life of one sandboxed run."""

    def __init__(self, index: int, fd: int):
        base = int(os.environ.get("ASSAY_SANDBOX_UID", UID_BASE_DEFAULT))
        self.index, self.fd = index, fd
        self.uid, self.gid = base + 1 + index, base

    @classmethod
    def take(cls) -> "Slot | None":
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


class PlanError(Exception):
    pass


def needed_paths() -> list[tuple[Path, bool]]:
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


def plan_covers(needed: list[tuple[Path, bool]], rw: list[Path], uid: int,
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
                    raise PlanError(f"{path} is not readable by an unprivileged uid")
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


def open_cache_to_group(cache: Path, gid: int) -> None:
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


def freeze_cache(cache: Path, uid: int) -> None:
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


def sanitize_scratch(scratch: Path, chown: bool) -> None:
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


def kill_uid(uid: int, rounds: int = 200) -> bool:
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
