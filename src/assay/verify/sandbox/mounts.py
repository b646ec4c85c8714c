"""The launcher's mount namespace: every mount read-only, then read-only tmpfs covers (for
folders an unprivileged uid may not enter) and writable binds of the scratch folder and the
kernel cache."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from assay.verify.sandbox.libc import check, get_libc

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
_MOUNT_OPTS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
               "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
               "strictatime": MS_STRICTATIME}
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscalls are unified)
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1


def unescape(s: str) -> str:
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


def mount(src: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    check(get_libc().mount(enc(src), enc(target), enc(fstype), flags, enc(data)),
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
            out.append((unescape(fields[4]), flags))
    return sorted(out, key=lambda m: m[0].count("/") if m[0] != "/" else 0)


def _all_read_only() -> str:
    """Make every mount in this (new, private) mount namespace read-only."""
    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    ret = get_libc().syscall(SYS_MOUNT_SETATTR, ctypes.c_int(AT_FDCWD), b"/",
                       ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr),
                       ctypes.c_size_t(ctypes.sizeof(attr)))
    if ret == 0:
        return "mount_setattr"
    failed = []
    for mp, flags in _mountinfo():  # older kernels: one remount per mount
        try:
            mount(None, mp, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            failed.append(mp)
    if "/" in failed:
        raise OSError(errno.EPERM, "cannot remount / read-only")
    return "remount" + (f" (still writable: {', '.join(failed[:5])})" if failed else "")


def _bind(src: str, target: str, rw: bool) -> None:
    mount(src, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV
           | (0 if rw else MS_RDONLY))


class HalfMounted(OSError):
    """The mounts went read-only but the writable binds failed: the worker cannot run."""


def setup_mounts(plan: dict) -> str:
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host
    how = _all_read_only()
    try:
        _cover_and_bind(plan)
    except OSError as e:
        raise HalfMounted(e.errno, f"read-only mounts made, but {e.strerror}") from None
    return how


def _cover_and_bind(plan: dict) -> None:
    for anc, items in plan["covers"].items():
        fd = os.open(anc, os.O_PATH | os.O_DIRECTORY)  # the original, reachable once covered
        mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
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
        mount(None, anc, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for p in plan["rw"]:
        if not any(Path(p).is_relative_to(a) for a in plan["covers"]):
            os.makedirs(p, exist_ok=True)
            _bind(p, p, True)
