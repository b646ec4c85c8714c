"""libc through ctypes, for the launcher's system calls (mount, unshare, prctl, capset)."""

from __future__ import annotations

import ctypes
import errno
import os


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


def get_libc() -> ctypes.CDLL:
    global _LIBC
    if _LIBC is None:
        _LIBC = _libc()
    return _LIBC


def check(ret: int, what: str) -> None:
    if ret != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)} ({errno.errorcode.get(e, e)})")
