"""Arenas: where tensors cross the process boundary, never through a pickle.

Inputs live in an arena the harness fills once per prepared task (a shared-memory file the
worker maps copy-on-write, :class:`FileArena`; or, with ``transfer: cuda_ipc``, device memory
from a private CUDA memory pool shared by IPC, :class:`DeviceArena`; with ``transfer: draw``
the arena holds the parameters alone, device memory on cuda, and the worker draws the input
sets from their seeds); outputs come back through a landing arena. A :class:`Layout` places
tensors in an arena; the descriptors it returns are what the worker reads (plain JSON-able
dicts)."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from assay.verify.worker import copy_staged, cuda_ipc_export

if TYPE_CHECKING:
    from assay.verify.reference import Prepared

ALIGN = 256


def tensor_nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class Layout:
    """Offsets of tensors in one arena."""

    def __init__(self, arena: str):
        self.arena = arena
        self.size = 0

    def add(self, shape, dtype: torch.dtype, stride=None) -> dict[str, Any]:
        off = -(-self.size // ALIGN) * ALIGN
        self.size = off + tensor_nbytes(shape, dtype)
        return {"arena": self.arena, "offset": off, "shape": list(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "stride": list(stride) if stride is not None else None}


def arena_view(buf: torch.Tensor, desc: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, desc["dtype"])
    n = tensor_nbytes(desc["shape"], dtype)
    return buf[desc["offset"]:desc["offset"] + n].view(dtype).view(list(desc["shape"]))


def _sweep_stale(directory: str) -> None:
    """Remove arena and scratch folders left by harness processes that were killed (their pid,
    in the folder's name, is gone): at H100 sizes each holds gigabytes of shared memory."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != "assay" or parts[1] not in ("inputs", "verify") \
                or not parts[2].isdigit() or int(parts[2]) == os.getpid():
            continue
        try:
            os.kill(int(parts[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
        except OSError:
            pass


def _room(where: str) -> int | None:
    """Bytes free in a folder this process may write, else None."""
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if os.access(where, os.W_OK) else None


def arena_folders() -> tuple[str, str]:
    """Where file arenas go: shared memory (memory speed, no disk writeback), else the temp
    folder (``TMPDIR``)."""
    return "/dev/shm", tempfile.gettempdir()


def _shm_takes(room: int | None) -> int | None:
    """The largest arena shared memory with ``room`` free bytes is given: half of them (less a
    margin), so arenas never fill the memory they live in."""
    return None if room is None else (room - (256 << 20)) // 2


def folder_room() -> int | None:
    """The largest file arena :func:`shm_dir` finds a place for (None where neither folder can
    be read): what the memory plan holds file arenas to. Shared memory counts as
    :func:`_shm_takes` says (the plan counted all of it, and an H200 self-check's 80 GiB
    landing arena, planned into /dev/shm, went to a temp folder with 64 GiB free: KernelBench's
    L1_87 called too large)."""
    shm, tmp = (_room(f) for f in arena_folders())
    room = [r for r in (_shm_takes(shm), tmp) if r is not None]
    return max(room) if room else None


def shm_dir(nbytes: int) -> str:
    """Shared memory where it takes ``nbytes`` (:func:`_shm_takes`), else the temp folder; what
    killed harnesses left in either is removed first (an H200 self-check whose task was killed
    at its time limit left a 60 GB landing arena that filled the disk)."""
    shm, tmp = arena_folders()
    for where in (shm, tmp):
        _sweep_stale(where)
    takes = _shm_takes(_room(shm))
    return shm if takes is not None and nbytes <= takes else tmp


class NoRoom(OSError):
    """A file arena that its file system has no room for (the verdict: ``too_large``)."""


class FileArena:
    """A shared-memory file mapped into this process; the worker maps it too.

    ``directory`` None: a folder of its own (removed with the arena), readable by everyone, as
    the sandbox's unprivileged uid must map it (read-only mount, copy-on-write mapping). Given
    a folder (the worker's scratch, which the sandbox hands to the worker's uid), the file is
    created there and the caller removes it with the folder.
    """

    def __init__(self, nbytes: int, prefix: str, directory: Path | None = None):
        self.nbytes = max(int(nbytes), ALIGN)
        own = directory is None
        if own:
            where = shm_dir(self.nbytes)
            self.dir = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=where))
            os.chmod(self.dir, 0o755)
        else:
            self.dir = Path(directory)
        self.path = self.dir / f"{prefix}arena"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL,
                          0o644 if own else 0o600)
        os.ftruncate(self.fd, self.nbytes)
        try:  # every page now: a file system without room says so here, not with a SIGBUS
            os.posix_fallocate(self.fd, 0, self.nbytes)  # in whichever process touches it
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                FileArena._cleanup(self.fd, str(self.dir) if own else "")
                with contextlib.suppress(OSError):
                    self.path.unlink()
                free = _room(str(self.dir))
                raise NoRoom(f"no room for a {self.nbytes / (1 << 30):.1f} GiB {prefix}arena in "
                             f"{self.dir} ({(free or 0) / (1 << 30):.1f} GiB free there; file "
                             f"arenas go to {' or '.join(arena_folders())}: free space there "
                             f"or set TMPDIR to a larger folder)") from None
        self.buf = torch.from_file(str(self.path), shared=True, size=self.nbytes,
                                   dtype=torch.uint8)
        self._finalizer = weakref.finalize(self, FileArena._cleanup, self.fd,
                                           str(self.dir) if own else "")

    def spec(self, writable: bool) -> dict[str, Any]:
        return {"kind": "file", "path": str(self.path), "nbytes": self.nbytes,
                "writable": writable}

    def identity(self) -> tuple:
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def intact_size(self) -> bool:
        """The mapping is safe to read: nobody truncated the file under it (that would SIGBUS)."""
        return os.fstat(self.fd).st_size >= self.nbytes

    @staticmethod
    def _cleanup(fd: int, directory: str) -> None:
        with contextlib.suppress(OSError):
            os.close(fd)
        if directory:
            shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        self.buf = None
        self._finalizer()


class DeviceArena:
    """Device memory from a private CUDA memory pool, shared with the worker by CUDA IPC. An IPC
    handle opens the whole device allocation it points into; the private pool makes that
    allocation hold this arena and nothing else (no reference output shares it)."""

    def __init__(self, nbytes: int, device: str):
        self.pool = torch.cuda.MemPool()
        dev = torch.device(device)
        if dev.index is None:  # torch 2.11 wants an index here, "cuda" alone is refused
            dev = torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.use_mem_pool(self.pool, device=dev):
            self.buf = torch.empty(max(int(nbytes), ALIGN), dtype=torch.uint8, device=device)
        self.nbytes = self.buf.numel()
        torch.cuda.synchronize()
        self.handle, self.offset = cuda_ipc_export(self.buf.data_ptr())

    def spec(self, writable: bool = True) -> dict[str, Any]:
        return {"kind": "cuda_ipc", "handle": self.handle, "offset": self.offset,
                "nbytes": self.nbytes}

    def close(self) -> None:
        torch.cuda.synchronize()
        self.buf = None
        self.pool = None
        torch.cuda.empty_cache()


def _tensor_desc(t: torch.Tensor, layout: Layout) -> dict[str, Any]:
    stride = None if t.is_contiguous() else list(t.stride())
    return {"tensor": layout.add(t.shape, t.dtype, stride)}


def describe_inputs(prep: Prepared, layout: Layout, sets: bool = True) -> dict[str, Any]:
    """Place every input set (unless ``sets`` is False: the worker draws them), the reference's
    state dict and its init inputs in ``layout``; the descriptors (non-tensor values inline) go
    in the worker's job."""
    item = (lambda x: _tensor_desc(x, layout) if isinstance(x, torch.Tensor)  # noqa: E731
            else {"value": x})
    return {"sets": [[item(x) for x in s] for s in prep.sets] if sets else [],
            "state_dict": {k: _tensor_desc(v, layout) for k, v in prep.state_dict.items()},
            "init_inputs": [item(x) for x in prep.init_inputs]}


def fill_inputs(buf: torch.Tensor, prep: Prepared, descs: dict[str, Any]) -> None:
    """Copy the prepared tensors into an arena's buffer where ``descs`` placed them."""
    pairs = []
    for s, ds in zip(prep.sets, descs["sets"]):
        pairs += [(x, d) for x, d in zip(s, ds) if isinstance(x, torch.Tensor)]
    pairs += [(prep.state_dict[k], d) for k, d in descs["state_dict"].items()]
    pairs += [(x, d) for x, d in zip(prep.init_inputs, descs["init_inputs"])
              if isinstance(x, torch.Tensor)]
    for x, d in pairs:
        copy_staged(arena_view(buf, d["tensor"]), x.detach().contiguous())
    if buf.device.type == "cuda":
        torch.cuda.synchronize(buf.device)
