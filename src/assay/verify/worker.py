"""The candidate's own process: load it, run it on what the harness sends, return its outputs.

This process never sees the reference model, the expected outputs or the baseline timings. The
job file (``job.pt``, written by the harness) holds the candidate's path, the constructor
arguments, the protocol's parameters and *descriptors* of tensors that live in arenas:

- ``in``: the inputs of every input set and the (randomized) state dict. On the host path a
  shared-memory file mapped copy-on-write (the candidate cannot change what the next candidate
  gets); on the ``cuda_ipc`` path device memory from a private pool, shared by CUDA IPC. With
  ``transfer: draw`` it holds the state dict alone: the job carries the task's source and each
  set's seed, and this process draws a set whenever a call needs it (:func:`drawn_sets`),
  checked against the harness's digest of it, so no set is copied or held whole.
- ``out``: landing buffers, one per verified call and output, shaped like the reference's
  outputs. The worker copies each verified output there (a snapshot taken the moment forward
  returns); the harness compares them on the device after this process has exited.

What comes back besides the landing buffers is ``result.json``: plain JSON (shapes, flags,
timings, the profile), which the harness parses without unpickling anything the candidate
could have written.

The protocol (slot names from :func:`assay.verify.memory.plan_slots`):

- correctness: every correctness set on fresh buffers, allocator memory poisoned with NaN;
- staleness: new data at the same pointers, the same call repeated, earlier data at new
  pointers (results cached by pointer, id or a counter show here);
- timing: buffers rotate; every unverified timed call first gets its floating inputs rescaled
  by a fresh random factor, so no timed call sees data any call has seen; some timed calls get
  an independent verified set at the same pointers instead; after timing every buffer is
  checked once more with its exact data;
- every verified output is snapshotted the moment forward returns and must stay unchanged
  while the worker waits (``settle_s``, after a device-wide sync): work left running on a
  thread or a side stream shows;
- outputs must be plain ``torch.Tensor`` objects with real storage (no subclass computed on
  access); inputs are compared bit for bit with pristine copies after each verified call, and
  every input sits between canary pads (:class:`Canaries`) checked after every verified call.
- audit: the profiler runs from before the candidate's module loads to the end, over every
  call alike (:class:`CallAudit`), so no call can tell whether it is audited; the kernel audit
  reads the timed calls, and each timed call's ops and kernels go to the consistency check.

Usage: ``python -m assay.verify.worker JOB_DIR``
"""

from __future__ import annotations

# Clocks and settings are captured before torch or the candidate can be touched by anything.
import time as _time

_T0 = _time.perf_counter()
_CLOCK = _time.perf_counter
_SLEEP = _time.sleep
# The timed calls' windows on the clock of the harness's observer (its samples' times)
_MONOTONIC_NS = _time.clock_gettime_ns
_CLOCK_MONOTONIC = _time.CLOCK_MONOTONIC

import builtins  # noqa: E402
import bisect  # noqa: E402
import ctypes  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
import weakref  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from assay.bench import inline as inline_builds  # noqa: E402
from assay.bench import timing  # noqa: E402  (captures the original clocks at import)
from assay.bench.build import cache_dir  # noqa: E402
from assay.tasks import instantiate  # noqa: E402
from assay.tasks.instantiate import as_outputs, seeded, set_fp32_numerics, task_mode  # noqa: E402
from assay.verify.memory import CANARY_PAD_B, plan_slots, sets_stay_on_host  # noqa: E402
from assay.verify.policy import COMPILED_GRAPH  # noqa: E402
from assay.verify.quiet import no_kineto_markers  # noqa: E402

_T_TORCH = _CLOCK()
# The worker's own checks use these, captured before any candidate code: patching torch.equal
# or Tensor.clone later cannot blind them (and the Guard reports the patch).
_EQUAL = torch.equal
_CLONE = torch.Tensor.clone
try:  # The audit's call ranges (a C++ record function: ~0.4 us), captured like the above.
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # older torch: the same range through the dispatcher (~10 us)
    _Range = torch.autograd.profiler.record_function
# The profiler's own methods, for the same reason (the Guard also watches its module and class).
_PROFILE_ENTER = torch.autograd.profiler.profile.__enter__
_PROFILE_EXIT = torch.autograd.profiler.profile.__exit__
_CPU = torch.autograd.DeviceType.CPU
# The landing handshake's file operations, for the same reason.
_EXISTS = os.path.exists
_REPLACE = os.replace
_RESULT_FORMAT = ["pt"]  # the harness asks for "json" only; older readers load result.pt
PERTURB_RANGE = (0.8, 1.0)  # rescaling toward zero keeps every domain that contains 0


# --------------------------------------------------------------------------------------------
# Process-wide state the candidate must leave alone.

def _probe_flush_denormal() -> bool:
    return float((torch.tensor([1e-39], dtype=torch.float32) * 1.0).item()) == 0.0


def global_settings() -> dict[str, Any]:
    """Process-wide settings a candidate could flip to change numerics or slow a baseline."""
    probes = {
        "num_threads": torch.get_num_threads,
        "num_interop_threads": torch.get_num_interop_threads,
        "deterministic": torch.are_deterministic_algorithms_enabled,
        "float32_matmul_precision": torch.get_float32_matmul_precision,
        "default_dtype": lambda: str(torch.get_default_dtype()),
        "default_device": lambda: str(torch.get_default_device()),
        "grad_enabled": torch.is_grad_enabled,
        "anomaly_mode": torch.is_anomaly_enabled,
        "flush_denormal": _probe_flush_denormal,
        "mkldnn.enabled": lambda: torch.backends.mkldnn.enabled,
        "cudnn.enabled": lambda: torch.backends.cudnn.enabled,
        "cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
        "cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
        "cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda.matmul.allow_bf16_reduced_precision_reduction":
            lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "cuda.matmul.fp32_precision":
            lambda: getattr(torch.backends.cuda.matmul, "fp32_precision", None),
        "cudnn.fp32_precision": lambda: getattr(torch.backends.cudnn, "fp32_precision", None),
        "mkldnn.fp32_precision": lambda: getattr(torch.backends.mkldnn, "fp32_precision", None),
        "fp32_precision": lambda: getattr(torch.backends, "fp32_precision", None),
        "cpu_affinity": lambda: len(os.sched_getaffinity(0)),
        "env": lambda: {k: os.environ.get(k) for k in (
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_LAUNCH_BLOCKING",
            "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
            "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF")},
    }
    out: dict[str, Any] = {}
    for name, probe in probes.items():
        try:
            value = probe()
        except Exception as e:  # noqa: BLE001 - a probe that breaks is itself a change
            value = f"error: {type(e).__name__}"
        out[name] = value if isinstance(value, (bool, int, float, str, type(None), dict)) \
            else str(value)
    return out


_MISSING = object()


def _watched() -> dict[str, Any]:
    """Namespaces whose functions the worker (or a naive harness) relies on: clocks, sync,
    comparison, statistics, tensor methods, and the worker's and timing module's own functions."""
    return {"builtins": builtins, "time": _time, "torch": torch, "torch.Tensor": torch.Tensor,
            "torch._C.TensorBase": torch._C.TensorBase, "torch.cuda": torch.cuda,
            "torch.cuda.Event": torch.cuda.Event, "torch.cuda.Stream": torch.cuda.Stream,
            "torch.testing": torch.testing, "assay.bench.timing": timing,
            # what the timing module summarizes samples with (a patched median halves a time)
            "statistics": statistics, "math": math,
            "torch.autograd.profiler": torch.autograd.profiler,
            "torch.autograd.profiler.profile": torch.autograd.profiler.profile,
            "assay.tasks.instantiate": instantiate, "assay.verify.worker": sys.modules[__name__]}


class Guard:
    """Identity snapshot of every function in the watched namespaces, taken before the candidate
    loads; ``changed()`` names what was replaced (or whose code was swapped) since."""

    def __init__(self) -> None:
        self.snap: dict[str, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
        for label, ns in _watched().items():
            d = vars(ns)
            fns = {k: v for k, v in d.items()
                   if callable(v) or isinstance(v, (staticmethod, classmethod, property,
                                                    types.ModuleType))}
            codes = {k: v.__code__ for k, v in fns.items() if isinstance(v, types.FunctionType)}
            self.snap[label] = (ns, fns, codes)
        self.originals = dict(timing.ORIGINALS)

    def changed(self) -> list[str]:
        out = []
        for label, (ns, fns, codes) in self.snap.items():
            d = vars(ns)
            for k, v in fns.items():
                cur = d.get(k, _MISSING)
                if cur is not v:
                    if label == "torch" and k == "manual_seed" and \
                            getattr(cur, "__wrapped__", None) is v:
                        continue  # importing dynamo wraps it (torch's own doing)
                    out.append(f"{label}.{k}")
                elif k in codes and getattr(cur, "__code__", None) is not codes[k]:
                    out.append(f"{label}.{k}.__code__")
        out += [k for k in timing.tampered_clocks() if k not in out]
        return sorted(set(out))


# --------------------------------------------------------------------------------------------
# Privileges: a candidate may not read the harness's memory (the expected outputs live there).

def drop_privileges() -> str:
    """Drop every capability (bounding set included) and forbid regaining any by exec. With the
    harness non-dumpable meanwhile, /proc/<harness>/mem, maps and environ are closed to us."""
    if not sys.platform.startswith("linux"):
        return "not linux"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in range(64):
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (fails harmlessly when unprivileged)

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (Data * 2)()
        ok = libc.capset(ctypes.byref(header), data) == 0
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        return "dropped" if ok else f"capset failed (errno {ctypes.get_errno()})"
    except Exception as e:  # noqa: BLE001
        return f"failed: {type(e).__name__}: {e}"


# --------------------------------------------------------------------------------------------
# Arenas and tensors.

class CUipcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]  # CU_IPC_HANDLE_SIZE


def _libcuda() -> ctypes.CDLL:
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
    cu.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(CUipcMemHandle), ctypes.c_uint64]
    cu.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), CUipcMemHandle,
                                         ctypes.c_uint]
    return cu


def cuda_ipc_export(ptr: int) -> tuple[bytes, int]:
    """(IPC handle of the device allocation holding ``ptr``, ``ptr``'s offset in it), with the
    driver API (torch's own IPC path needs a shared-memory ref counter the sandboxed worker
    cannot open)."""
    cu = _libcuda()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc:
        raise RuntimeError(f"cuMemGetAddressRange failed ({rc})")
    handle = CUipcMemHandle()
    rc = cu.cuIpcGetMemHandle(ctypes.byref(handle), ctypes.c_uint64(base.value))
    if rc:
        raise RuntimeError(f"cuIpcGetMemHandle failed ({rc})")
    # All 64 bytes: ``handle.reserved`` (a c_char array) would stop at the first NUL byte.
    return ctypes.string_at(ctypes.addressof(handle), 64), ptr - base.value


class _CudaArray:
    """Just enough of __cuda_array_interface__ for torch.as_tensor to wrap a device pointer."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


def open_arena(spec: dict[str, Any]) -> torch.Tensor:
    """A flat uint8 tensor over an arena the harness made."""
    if spec["kind"] == "file":
        return torch.from_file(spec["path"], shared=bool(spec["writable"]),
                               size=int(spec["nbytes"]), dtype=torch.uint8)
    if spec["kind"] == "cuda_ipc":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.empty(1, device=device)  # the primary context, current on this thread
        handle = CUipcMemHandle.from_buffer_copy(spec["handle"])
        ptr = ctypes.c_uint64()
        rc = _libcuda().cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, 1)
        if rc:
            raise RuntimeError(f"cuIpcOpenMemHandle failed ({rc})")
        return torch.as_tensor(_CudaArray(ptr.value + int(spec["offset"]), int(spec["nbytes"])),
                               device=device)
    raise ValueError(f"unknown arena kind {spec['kind']!r}")


def arena_view(arenas: dict[str, torch.Tensor], desc: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, desc["dtype"])
    shape = list(desc["shape"])
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    flat = arenas[desc["arena"]][desc["offset"]:desc["offset"] + nbytes]
    return flat.view(dtype).view(shape)


# A copy between a cuda tensor and a host one of at least STAGE_MIN_B goes through a pinned
# buffer of STAGE_B, in chunks: straight between the device and a shared file's (or fresh
# malloc'd) pageable pages it ran at ~1.3 GB/s on an H200 host, one thread faulting the pages
# in; staged, torch's multi-threaded host copy touches them (KernelBench's 6 GiB elementwise
# inputs: the harness's input arena 28-43 s before, 3-9 s after).
STAGE_B = 256 << 20
STAGE_MIN_B = 16 << 20
_STAGE: list[torch.Tensor] = []  # the pinned buffer, made once per process
# torch's intra-op threads in a cuda worker (run): its host side is these copies
CUDA_HOST_THREADS = 8


def copy_staged(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``; through a pinned buffer, in chunks, where one side is a large cuda
    tensor and the other a contiguous host tensor of the same shape and dtype."""
    host, dev = (dst, src) if src.is_cuda else (src, dst)
    if not (dev.is_cuda and host.device.type == "cpu" and src.nbytes >= STAGE_MIN_B
            and dst.shape == src.shape and dst.dtype == src.dtype
            and dst.is_contiguous() and src.is_contiguous()):
        dst.copy_(src)
        return
    if not _STAGE:
        try:
            _STAGE.append(torch.empty(STAGE_B, dtype=torch.uint8, pin_memory=True))
        except RuntimeError:  # no pinned memory to be had: the plain copy
            dst.copy_(src)
            return
    stage = _STAGE[0]
    a, b = src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8)
    for i in range(0, a.numel(), STAGE_B):
        n = min(STAGE_B, a.numel() - i)
        stage[:n].copy_(a[i:i + n])  # synchronous both ways: the stage is reused right after
        b[i:i + n].copy_(stage[:n])


def moved(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``t.to(device)`` (``t`` itself when already there), through the pinned stage between
    a host and a cuda device; the copy keeps a dense tensor's strides."""
    device = torch.device(device)
    if t.device.type == device.type and (device.index is None or t.device == device):
        return t
    out = torch.empty_like(t, device=device)
    copy_staged(out, t)
    return out


def fresh(t: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A copy of ``t`` of this process's own on ``device`` (:func:`moved`, or a clone)."""
    out = moved(t, device)
    return out.clone() if out is t else out


class Canaries:
    """Every input tensor the candidate gets sits between two pads of a canary word, checked
    after every verified call: a write outside the input's own elements (scratch past its end,
    an index off by a row) changes them, where ``inputs_unchanged``, which compares the
    elements alone, sees nothing. The word is a quiet float32 NaN with a payload drawn per
    worker, so a float32 kernel that reads past an input gets NaN (and fails ``correctness``)
    and none can write the word back blindly. Pads are never refilled: a timed call's stray write shows at the next
    verified call of its buffer (every timing buffer has one after timing).

    The pads are the input's own allocation, so no layout or allocator decides where they are;
    an output the candidate allocates itself has no pads (what lies past it is the allocator's
    choice), so only writes near the inputs are seen (README, the exploit table)."""

    def __init__(self, device: torch.device):
        payload = int.from_bytes(os.urandom(4), "little") & 0x003FFFFF
        self.word = 0x7FC00000 | payload  # a quiet NaN as float32; an int32 below 2**31
        self.device = device
        self._pattern: torch.Tensor | None = None  # the word's bytes, a pad and 8 more
        self._guarded: dict[int, tuple[Any, int, int]] = {}  # id -> (weakref, span, total)

    def pattern(self) -> torch.Tensor:
        if self._pattern is None:
            words = torch.full((CANARY_PAD_B // 4 + 2,), self.word, dtype=torch.int32,
                               device=self.device)
            self._pattern = words.view(torch.uint8)
        return self._pattern

    def place(self, src: Any) -> Any:
        """A copy of ``src`` of this process's own on the device, with its strides, between
        two pads (a non-tensor as it is; a tensor whose elements overlap, an expanded one, as
        :func:`fresh` copies it)."""
        if not isinstance(src, torch.Tensor):
            return src
        if src.layout != torch.strided or any(st <= 0 < n - 1 for n, st
                                              in zip(src.shape, src.stride())):
            return fresh(src, self.device)
        item = src.element_size()
        span = item * (1 + sum((n - 1) * st for n, st in zip(src.shape, src.stride()))
                       if src.numel() else 0)
        total = 2 * CANARY_PAD_B + -(-span // 4) * 4
        buf = torch.empty((total // 4,), dtype=torch.int32, device=self.device)
        buf[:CANARY_PAD_B // 4].fill_(self.word)  # the pads only: the body is copied over
        buf[(CANARY_PAD_B + span) // 4:].fill_(self.word)  # (from the word the body ends in)
        body = buf.view(torch.uint8)[CANARY_PAD_B:CANARY_PAD_B + span].view(src.dtype)
        out = body.as_strided(src.shape, src.stride())
        copy_staged(out, src)
        key = id(out)
        self._guarded[key] = (weakref.ref(out, lambda _, k=key: self._guarded.pop(k, None)),
                              span, total)
        return out

    def broken(self, x: Any) -> str:
        """Why ``x``'s pads are not as :meth:`place` left them ('' where they are, or where
        ``x`` is not a tensor placed here)."""
        entry = self._guarded.get(id(x)) if isinstance(x, torch.Tensor) else None
        if entry is None or entry[0]() is not x:
            return ""
        _, span, total = entry
        st = x.untyped_storage()
        if st.nbytes() != total or x.storage_offset() * x.element_size() != CANARY_PAD_B:
            return "its storage was replaced"
        whole = torch.empty(0, dtype=torch.uint8, device=x.device).set_(st)
        ref = self.pattern()
        tail = whole[CANARY_PAD_B + span:]
        phase = span % 4  # the word's bytes repeat from the buffer's start
        if not _EQUAL(whole[:CANARY_PAD_B], ref[:CANARY_PAD_B]):
            return "written before its first element"
        if not _EQUAL(tail, ref[phase:phase + tail.numel()]):
            return "written past its last element"
        return ""


def materialize(arenas: dict[str, torch.Tensor], item: Any, device: torch.device) -> Any:
    """An input (or constructor argument) as this process's own tensor on ``device``."""
    if isinstance(item, dict) and "tensor" in item:
        desc = item["tensor"]
        view = arena_view(arenas, desc)
        if desc.get("stride") is not None:
            try:
                out = torch.empty_strided(view.shape, desc["stride"], dtype=view.dtype,
                                          device=device)
                copy_staged(out, view)
                return out
            except RuntimeError:
                pass
        return fresh(view, device)
    if isinstance(item, dict) and "value" in item:
        return item["value"]
    return item


_EQUAL_CHUNK = 1 << 28  # bytes a step: torch.equal on cuda makes a bool per element compared


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads included), on the tensors' device, a chunk at a time:
    whole, the comparison's temporary was a byte per byte compared (an H200 worker checking a
    16 GB input asked for 16 GB more and ran out of memory)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    if a.device != b.device:
        b = b.to(a.device)
    a8 = a.reshape(-1).contiguous().view(torch.uint8)
    b8 = b.reshape(-1).contiguous().view(torch.uint8)
    return all(bool(_EQUAL(a8[i:i + _EQUAL_CHUNK], b8[i:i + _EQUAL_CHUNK]))
               for i in range(0, a8.numel(), _EQUAL_CHUNK))


def is_plain(o: Any) -> bool:
    """A real tensor: exactly torch.Tensor (no subclass that computes on access), strided, with
    storage, and no lazy conjugate/negative bit. Only type checks run before we know."""
    if type(o) is not torch.Tensor:
        return False
    if o.layout != torch.strided or o.is_meta or o.is_conj() or o.is_neg():
        return False
    try:
        return o.numel() == 0 or o.untyped_storage().data_ptr() != 0
    except Exception:  # noqa: BLE001 - a storage-less tensor (functional, fake) raises here
        return False


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def aliases(o: torch.Tensor, inputs: list) -> bool:
    if o.numel() == 0:
        return False
    lo, hi = _storage_range(o)
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.numel() > 0 and x.device == o.device:
            a, b = _storage_range(x)
            if lo < b and a < hi:
                return True
    return False


def memory_peak(device: torch.device, times: dict[str, Any], phase: str) -> None:
    """On cuda, ``times[<phase>_peak_gib]``: the most device memory this process's tensors held
    since the last phase ended, what the memory plan's worker term is compared with
    (docs/evidence/2026-11-29-h200-selfcheck-250.md). A report's diagnostics only: no verdict
    reads them (the candidate, in this process, could reset them)."""
    if device.type == "cuda":
        times[f"{phase}_peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
        torch.cuda.reset_peak_memory_stats(device)


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill memory the allocator will hand out next with NaN, then free it.

    An output the candidate never writes then holds NaN, not a stale copy of a previous result
    (the 2025 incident's kernels read the reference's freed output this way).
    """
    n = max(nbytes // 4, 1)
    for _ in range(2):
        junk = torch.full((n,), float("nan"), dtype=torch.float32, device=device)
        del junk
    timing.sync(device)


def refill(bufs: list, values: list) -> None:
    """``values`` copied into the tensors of ``bufs``: new data at the same pointers. A function
    of its own because a loop's variables outlive the loop: two of them kept a 16 GiB input set
    each through the whole timing phase (an H200 worker of KernelBench's L1_45 ran out of
    memory holding two sets more than its memory plan counts)."""
    for dst, src in zip(bufs, values):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)


def clone_inputs(inputs: list, device: torch.device) -> list:
    """Fresh copies on ``device`` (from the host arena through the pinned stage)."""
    return [fresh(v, device) if isinstance(v, torch.Tensor) else v for v in inputs]


def host_view(arenas: dict[str, torch.Tensor], item: Any) -> Any:
    """An input kept on the host: a dense one is a view of the (private, copy-on-write) arena
    mapping, no copy; a strided one a host copy with its strides."""
    if isinstance(item, dict) and "tensor" in item and item["tensor"].get("stride") is None:
        return arena_view(arenas, item["tensor"])
    return materialize(arenas, item, torch.device("cpu"))


def drawn_sets(draw: dict[str, Any], device: torch.device) -> instantiate.DrawnSets:
    """The transfer ``draw``: the task (its source, from the job) and every set's seed and
    distribution; each set is drawn here once and checked against the harness's digests
    before the candidate loads (a mismatch: the harness falls back to copying the sets), and
    again, checked, whenever a call needs it."""
    sets = instantiate.DrawnSets(draw["task"].module(), draw["seeds"], draw["distributions"],
                                 device, draw["digests"])
    for s in range(len(sets)):
        sets[s]  # noqa: B018 - drawn and checked, then freed
    return sets


def load_candidate(path: Path):
    spec = importlib.util.spec_from_file_location("assay_candidate", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["assay_candidate"] = mod
    spec.loader.exec_module(mod)
    if not hasattr(mod, "ModelNew"):
        raise AttributeError("candidate does not define class ModelNew")
    return mod


CALL_RANGE = "assay::call"
# ATen's own ops, named before any candidate loads (this module is imported first): a candidate
# can register ops of its own in the aten namespace (torch.library), and those are not ATen's.
_ATEN_OPS = frozenset(n.split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                      if n.startswith("aten::"))
# What torch.compile's code marks each call with (dynamo's wrapper, inductor's compiled graph),
# one audit row: its kernels are inductor's, and on the cpu target they show no ATen op
# (generated C++), so without this mark a torch.compile'd forward looked like custom work.
COMPILED_MARKS = ("Torch-Compiled Region", "## Call CompiledFxGraph")
# A Triton kernel run by Triton's interpreter (cpu): a range named after its function around
# each launch (mark_interpreted_triton), the cpu audit's counterpart of a device kernel.
TRITON_RANGE = "triton::"


def mark_interpreted_triton() -> bool:
    """Put a profiler range ``triton::<kernel>`` around every launch that Triton's interpreter
    runs, so the cpu audit lists the candidate's Triton kernels per call (the interpreter
    computes with numpy, which the profiler does not see, as it does not see C++). Called after
    the candidate's module is loaded, only if it imported triton; like every record this
    process writes, the candidate can undo it (docs/ARCHITECTURE.md, "What the worker's report
    can prove"). False where Triton's interpreter is not importable."""
    try:
        from triton.runtime import interpreter
    except Exception:  # noqa: BLE001 - no triton, or one whose interpreter does not load
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    launch = getattr(executor, "__call__", None)
    if launch is None:
        return False
    if getattr(launch, "_assay_marked", False):
        return True

    def marked(self, *args, **kwargs):
        with _Range(TRITON_RANGE + str(getattr(self.fn, "__name__", "kernel"))):
            return launch(self, *args, **kwargs)

    marked._assay_marked = True  # type: ignore[attr-defined]
    executor.__call__ = marked
    return True


def _all_threads() -> dict[str, Any]:
    """Profile every thread (torch >= 2.7): ATen ops a candidate runs on a thread of its own
    count as its own."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError, RuntimeError):
        return {}


class CallAudit:
    """The kernel audit of every call: the profiler (kineto: ATen ops on every thread, and
    device kernels on cuda) runs from before the candidate's module is loaded to the end, so
    every call the worker makes (correctness, staleness, warm-up, timed, after) is profiled
    alike and the profiler's state says nothing about which call is which. Each call runs in
    a record-function range (invisible from Python) that attributes the events to it.

    The autograd profiler's front end is used because ``torch.profiler.profile`` imports
    dynamo (seconds per process, and it rebinds torch.manual_seed).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.phases: list[str] = []
        self.windows: list[tuple[int, int]] = []  # each call's (start, end), CLOCK_MONOTONIC ns
        kw = {"use_device": "cuda"} if device.type == "cuda" else {}
        self.prof = torch.autograd.profiler.profile(use_kineto=True, **kw, **_all_threads())

    def start(self) -> None:
        with no_kineto_markers():  # kineto's USDT start line: quiet.py
            _PROFILE_ENTER(self.prof)

    def call(self, phase: str, fn, *args):
        self.phases.append(phase)
        t0 = _MONOTONIC_NS(_CLOCK_MONOTONIC)
        try:
            with _Range(CALL_RANGE):
                return fn(*args)
        finally:
            self.windows.append((t0, _MONOTONIC_NS(_CLOCK_MONOTONIC)))

    def finish(self, keep: tuple[str, ...] = ("timed", "timed_verified")) -> dict[str, Any]:
        """{"expected": calls made, "found": call ranges in the trace, "phases": {phase: n},
        "calls": [{"phase", "rows", "span_us", "side", "joins"}] for the phases in ``keep``,
        "outside_us"} or
        {"error": ...} (:func:`attribute_trace` says what the numbers are)."""
        try:
            timing.sync(self.device)
            with no_kineto_markers():  # and its stop line
                _PROFILE_EXIT(self.prof, None, None, None)
            events = [d for e in self.prof.kineto_results.events()
                      if (d := _event(e, _CPU)) is not None]
        except Exception as e:  # noqa: BLE001 - a profiler the candidate stopped or broke
            return {"error": f"the profiler could not be read back: {type(e).__name__}: {e}"}
        trace = attribute_trace(events, self.device.type == "cuda")
        calls = trace["rows"]
        phases = {p: self.phases.count(p) for p in dict.fromkeys(self.phases)}
        out: dict[str, Any] = {"expected": len(self.phases), "found": len(calls),
                               "phases": phases, "outside_us": trace["outside_us"]}
        if len(calls) == len(self.phases):
            out["calls"] = [{"phase": p, "rows": rows, "span_us": span, "side": side,
                             "joins": joins, "window_ns": list(window)}
                            for p, rows, span, side, joins, window in zip(
                                self.phases, calls, trace["spans_us"], trace["side"],
                                trace["joins"], self.windows) if p in keep]
        return out


# A stream wait as kineto names the runtime or driver call, _ptsz forms included
# (attribute_trace's "joins")
STREAM_WAITS = ("cudaStreamWaitEvent", "cuStreamWaitEvent")


def _event(e: Any, cpu_type: Any) -> dict[str, Any] | None:
    """A kineto event as plain data (the fields the attribution reads), or None for one it
    does not read (about 5 us an event: a trace holds every call's).

    Torch before 2.12 (the GPU machine's 2.11) has no ``activity_type`` on its events: there
    the stream waits are told by name, and no other runtime call is kept (kernels are then
    attributed through the CPU op they are linked to). Without this every joined side stream
    read as unjoined: 13 honest red-team variants were refused for ``stream_ordered`` on an
    H200 (docs/evidence/2026-11-28-h200x4-lanes.md). A range the candidate names like a wait
    could pass for one there, as any record of this process can be forged (docs/ARCHITECTURE.md,
    "What the worker's report can prove")."""
    act = getattr(e, "activity_type", None)
    name = e.name()
    act = act() if callable(act) else "cuda_runtime" if name.startswith(STREAM_WAITS) else ""
    cpu = e.device_type() == cpu_type
    if cpu and not (name.startswith(("aten::", TRITON_RANGE, *COMPILED_MARKS))
                    or name == CALL_RANGE or act in ("cuda_runtime", "cuda_driver")):
        return None
    stream = getattr(e, "device_resource_id", None)  # a kernel's stream (kineto resource id)
    return {"name": name, "cpu": cpu, "start": e.start_ns(), "end": e.end_ns(),
            "thread": e.start_thread_id(), "corr": e.correlation_id(),
            "linked": e.linked_correlation_id(), "act": act,
            "stream": stream() if callable(stream) and not cpu else None}


def attribute_calls(events: list[dict[str, Any]], cuda: bool) -> list[list[dict[str, Any]]]:
    """Rows ({name, kind, count, device_us, cpu_us}) of each call range, in call order
    (:func:`attribute_trace`'s rows)."""
    return attribute_trace(events, cuda)["rows"]


def attribute_trace(events: list[dict[str, Any]], cuda: bool) -> dict[str, Any]:
    """The trace cut into calls: {"rows": rows of each call range, "spans_us": each call's
    device span (first kernel's start to last kernel's end, every stream; 0 without kernels),
    "side": each call's kernels on a stream other than the caller's (the stream the harness
    enqueues its own work on between calls), a library's own forks aside (see ``side``),
    "joins": each call's stream waits (cudaStreamWaitEvent), "outside_us": device time of
    kernels launched outside every call range from a thread other than the one that made the
    calls}.

    ATen ops belong to the call whose range holds their start (any thread); their CPU time is
    self time (nested ops' time taken out). A device kernel belongs to the call during which
    it was launched: the start of its runtime launch event (same correlation id), else of the
    CPU op it is linked to. Work the harness enqueues between calls lies outside every range;
    work a candidate's own thread enqueues there is ``outside_us`` (it runs untimed).
    """
    cpu = sorted((e for e in events if e["cpu"]), key=lambda e: (e["start"], -e["end"]))
    ranges = []
    for e in cpu:
        if e["name"] == CALL_RANGE and not (ranges and e["start"] < ranges[-1]["end"]):
            ranges.append(e)  # top-level ranges only (a nested one would be the candidate's)
    starts = [r["start"] for r in ranges]
    caller = ranges[0]["thread"] if ranges else None

    def call_of(t: int) -> int:
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 and t <= ranges[i]["end"] else -1

    self_ns = _self_times([e for e in cpu if e["act"] not in ("cuda_runtime", "cuda_driver")])
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in cpu:
        if e["name"].startswith("aten::"):
            by_thread.setdefault(e["thread"], []).append(e)
    aten = {t: Nesting(ops) for t, ops in by_thread.items()}  # thread -> its ATen ops

    def aten_op_of(by: dict[str, Any]) -> int | None:
        """The innermost ATen op of the launching thread whose span holds a launch (``by``
        itself where it is one), as an id; None outside every ATen op, or where that op is not
        one of ATen's own (:data:`_ATEN_OPS`)."""
        if by["name"].startswith("aten::"):
            op: dict[str, Any] | None = by
        else:
            ops = aten.get(by["thread"])
            op = ops.innermost(by["start"]) if ops is not None else None
        return id(op) if op is not None and op["name"] in _ATEN_OPS else None
    rows: list[dict[str, dict[str, Any]]] = [{} for _ in ranges]
    spans: list[list[int]] = [[] for _ in ranges]  # [first start, last end] of device work
    streams: list[list[tuple[Any, int]]] = [[] for _ in ranges]  # (stream, launching ATen op)
    joins = [0] * len(ranges)
    harness_streams: dict[Any, int] = {}
    outside_ns = 0

    def add(i: int, name: str, kind: str, device_us: float, cpu_us: float) -> None:
        r = rows[i].setdefault(name, {"name": name, "kind": kind, "count": 0,
                                      "device_us": 0.0, "cpu_us": 0.0})
        r["count"] += 1
        r["device_us"] += device_us
        r["cpu_us"] += cpu_us

    for e in cpu:
        if e["name"].startswith("aten::"):
            i = call_of(e["start"])
            if i >= 0:
                add(i, e["name"], "op", 0.0, self_ns.get(id(e), 0) / 1e3)
        elif e["name"].startswith(COMPILED_MARKS):  # torch.compile's code ran in this call
            i = call_of(e["start"])
            if i >= 0:
                add(i, COMPILED_GRAPH, "op", 0.0, self_ns.get(id(e), 0) / 1e3)
        elif e["name"].startswith(TRITON_RANGE):  # an interpreted Triton launch (cpu)
            i = call_of(e["start"])
            if i >= 0:
                add(i, e["name"], "interpreted", 0.0, self_ns.get(id(e), 0) / 1e3)
        elif e["name"].startswith(STREAM_WAITS) and (i := call_of(e["start"])) >= 0:
            joins[i] += 1
    if cuda:
        launcher = launcher_of(cpu)
        for e in events:
            if e["cpu"]:
                continue
            by = launcher(e)
            i = call_of(by["start"]) if by is not None else -1
            if i >= 0:
                add(i, e["name"], "kernel", (e["end"] - e["start"]) / 1e3, 0.0)
                sp = spans[i]
                spans[i] = [min(sp[0], e["start"]), max(sp[1], e["end"])] if sp else \
                    [e["start"], e["end"]]
                streams[i].append((e.get("stream"), aten_op_of(by)))
            elif by is not None and by["thread"] != caller:
                outside_ns += e["end"] - e["start"]
            elif by is not None:
                harness_streams[e.get("stream")] = harness_streams.get(e.get("stream"), 0) + 1
    own = max(harness_streams, key=harness_streams.get) if harness_streams else None

    def side(kernels: list[tuple[Any, int]]) -> int:
        """Kernels on a stream other than the caller's, less a library's own forks: those an
        ATen op launched that also launched work on the caller's stream in this call (cuDNN's
        FFT convolutions run on streams of their own, joined by waits the trace does not show;
        ATen orders an op's work with the stream it was called on). A kernel launched outside
        any ATen op (or one a candidate registered in the aten namespace), or by an op that
        ran wholly on another stream (one called under another current stream), counts."""
        forked = {op for st, op in kernels if st == own and op is not None}
        return sum(1 for st, op in kernels if own is not None and st is not None and st != own
                   and (op is None or op not in forked))

    return {"rows": [list(r.values()) for r in rows],
            "spans_us": [(sp[1] - sp[0]) / 1e3 if sp else 0.0 for sp in spans],
            "side": [side(ks) for ks in streams],
            "joins": joins, "outside_us": outside_ns / 1e3}


def launcher_of(cpu: list[dict[str, Any]]
                ) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """For the CPU events ``cpu`` (as :func:`_event` keeps them): the function giving the event
    that launched a device kernel, the runtime or driver call of its correlation id, else the
    CPU op it is linked to (None: neither)."""
    launch = {e["corr"]: e for e in cpu if e["act"] in ("cuda_runtime", "cuda_driver")}
    linked = {e["corr"]: e for e in cpu if e["act"] != "cuda_runtime"}

    def of(kernel: dict[str, Any]) -> dict[str, Any] | None:
        by = launch.get(kernel["corr"])
        if by is None and kernel["linked"]:
            by = linked.get(kernel["linked"])
        return by

    return of


class Nesting:
    """One thread's ops (sorted by start, as :func:`attribute_trace` sorts them) and, for each,
    the innermost earlier op whose span holds its start (``parent``, -1: none), so that the
    innermost op holding a time is found up that chain from the last op started by then: any op
    that holds the time holds that one's start. Walking back over every earlier op instead, a
    recurrent candidate's thousands of launches a call outside any ATen op took 30 of its 34 s
    of verification (KernelBench L3_41 on an H100, the audit's read-back)."""

    def __init__(self, ops: list[dict[str, Any]]):
        self.ops, self.starts = ops, [o["start"] for o in ops]
        self.parent: list[int] = []
        stack: list[int] = []
        for i, e in enumerate(ops):
            while stack and ops[stack[-1]]["end"] < e["start"]:
                stack.pop()
            self.parent.append(stack[-1] if stack else -1)
            stack.append(i)

    def innermost(self, t: int) -> dict[str, Any] | None:
        """The innermost op whose span holds ``t``, None for none."""
        k = bisect.bisect_right(self.starts, t) - 1
        while k >= 0 and self.ops[k]["end"] < t:
            k = self.parent[k]
        return self.ops[k] if k >= 0 else None


def _self_times(events: list[dict[str, Any]]) -> dict[int, int]:
    """{id(event): its duration less that of the events directly nested in it (same thread)}."""
    out: dict[int, int] = {}
    by_thread: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        by_thread.setdefault(e["thread"], []).append(e)
    for evs in by_thread.values():
        stack: list[dict[str, Any]] = []
        for e in evs:  # sorted by (start, -end): a parent comes before what it holds
            while stack and stack[-1]["end"] <= e["start"]:
                stack.pop()
            dur = e["end"] - e["start"]
            out[id(e)] = out.get(id(e), 0) + dur
            if stack:
                out[id(stack[-1])] = out.get(id(stack[-1]), 0) - dur
            stack.append(e)
    return out


def merge_rows(calls: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per name over several calls (counts and times summed)."""
    out: dict[str, dict[str, Any]] = {}
    for rows in calls:
        for r in rows:
            m = out.setdefault(r["name"], {**r, "count": 0, "device_us": 0.0, "cpu_us": 0.0})
            m["count"] += r["count"]
            m["device_us"] += r["device_us"]
            m["cpu_us"] += r["cpu_us"]
    return list(out.values())


# --------------------------------------------------------------------------------------------
# The run.

def hand_over(job_dir: Path, seq: int, slot: str, timeout_s: float = 3600.0) -> None:
    """The landing handshake (one landing buffer reused by every verified call): say that
    ``slot``'s outputs are in the landing buffer (``landed-<seq>``, naming the slot) and wait
    until the harness has compared them (``ack-<seq>``) before anything overwrites them."""
    tmp = job_dir / f".landed-{seq}"
    tmp.write_text(slot)
    _REPLACE(tmp, job_dir / f"landed-{seq}")
    ack = str(job_dir / f"ack-{seq}")
    start = _CLOCK()
    while not _EXISTS(ack):
        if _CLOCK() - start > timeout_s:
            raise TimeoutError(f"the harness did not take the landing of {slot}")
        _SLEEP(0.0005)


class Recorder:
    """Takes each verified call's outputs: type check, snapshot, settle, landing copy (and,
    with one landing buffer for every call, the handshake: :func:`hand_over`). ``spent``: the
    seconds each step took over every call (the call's own device work ends in ``settle``'s
    first sync), reported as ``record.<step>_s`` where a verification's seconds go."""

    STEPS = ("snapshot", "settle", "landing", "inputs_check", "handover")

    def __init__(self, device: torch.device, landing: dict[str, list[torch.Tensor]],
                 settle_s: float, canaries: Canaries, handshake_dir: Path | None = None):
        self.device = device
        self.canaries = canaries
        self.landing = landing
        self.settle_s = settle_s
        self.calls: dict[str, dict[str, Any]] = {}
        self.handshake_dir = handshake_dir
        self.seq = 0
        self.spent = dict.fromkeys(self.STEPS, 0.0)
        self._t = 0.0

    def _step(self, name: str) -> None:
        """Close the step ``name`` (it ran since the last one closed)."""
        now = _CLOCK()
        self.spent[name] += now - self._t
        self._t = now

    def record(self, slot: str, set_id: int, out: Any, inputs: list,
               pristine: list | None) -> None:
        self._t = _CLOCK()
        outs = as_outputs(out)
        metas, snaps = [], []
        for o in outs:  # snapshot first, the moment forward has returned
            if not is_plain(o):
                metas.append({"plain": False, "type": f"{type(o).__module__}.{type(o).__name__}"})
                snaps.append(None)
                continue
            snaps.append(_CLONE(o))
            metas.append({"plain": True})
        self._step("snapshot")
        # Work that is still running (a thread, a side stream) would change the outputs now.
        timing.sync(self.device)
        if self.settle_s > 0:
            _SLEEP(self.settle_s)
        timing.sync(self.device)
        self._step("settle")
        dest = self.landing.get(slot, [])
        for j, (o, snap, meta) in enumerate(zip(outs, snaps, metas)):
            if snap is None:
                continue
            meta.update(shape=list(o.shape), dtype=str(o.dtype).removeprefix("torch."),
                        stride=list(o.stride()), device=str(o.device),
                        settled=bits_equal(o, snap), aliases=aliases(o, inputs), written=False)
            if j < len(dest) and tuple(dest[j].shape) == tuple(o.shape) \
                    and dest[j].dtype == o.dtype:
                copy_staged(dest[j], snap)
                meta["written"] = True
        self._step("landing")
        changed = []
        if pristine is not None:
            changed = [bool(isinstance(x, torch.Tensor) and not bits_equal(x, p))
                       for x, p in zip(inputs, pristine)]
        outside = [f"input {i} {why}" for i, x in enumerate(inputs)
                   if (why := self.canaries.broken(x))]
        timing.sync(self.device)
        self._step("inputs_check")
        self.calls[slot] = {"set": set_id, "outputs": metas, "inputs_changed": changed,
                            "outside_writes": outside}
        if self.handshake_dir is not None:
            hand_over(self.handshake_dir, self.seq, slot)
            self.seq += 1
        self._step("handover")


def run(job_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Fill ``result`` stage by stage, so a failure still says how far the candidate got."""
    clock = _CLOCK
    t = clock()
    job = torch.load(job_dir / "job.pt", weights_only=False)  # written by the harness
    _RESULT_FORMAT[0] = job.get("result_format", "pt")
    device = torch.device(job["device"])
    if device.type == "cuda":
        # An explicit index: "cuda" alone is refused by set_device and synchronize.
        device = torch.device("cuda", device.index if device.index is not None else 0)
        torch.cuda.set_device(device)
        # The host side of a cuda worker is copies (the staged transfers, the arenas): a few
        # threads saturate them, while torch's pool of a thread per core on a 64-core host
        # spent the sandbox's CPU-time limit (900 s) in 54 s of KernelBench's L1_37 (H200).
        torch.set_num_threads(min(torch.get_num_threads(), CUDA_HOST_THREADS))
    torch.set_grad_enabled(False)
    # The arithmetic the reference and the baselines used (true fp32 unless the config allows
    # tf32), set before the candidate loads: changing it is then a global_state rejection.
    set_fp32_numerics(bool(job.get("allow_tf32", False)))
    if device.type == "cpu":
        timing.steady_host_allocator()  # as the baseline's process: see its docstring
    guard = Guard()
    before = global_settings()
    result.update(stage="start", settings_before=before, t_start=_T0, t_torch=_T_TORCH)
    times = result.setdefault("times", {})
    times["job_s"] = clock() - t

    t = clock()
    arenas = {name: open_arena(spec) for name, spec in job["arenas"].items()}
    drawn = "draw" in job
    on_host = not drawn and sets_stay_on_host(
        device.type, "host" if job["arenas"]["in"]["kind"] == "file" else "cuda_ipc")
    if drawn:
        sets = drawn_sets(job["draw"], device)
    else:
        sets = [[host_view(arenas, x) if on_host else materialize(arenas, x, device)
                 for x in s] for s in job["sets"]]
    state_dict = {k: materialize(arenas, v, torch.device("cpu"))
                  for k, v in job["state_dict"].items()}
    init_args = [materialize(arenas, x, torch.device("cpu")) for x in job["init_inputs"]]
    landing = {slot: [arena_view(arenas, d) for d in descs]
               for slot, descs in job.get("landing", {}).items()}
    arenas.pop("in", None)  # inputs are this process's own copies (or private views) now
    timing.sync(device)
    times["materialize_s"] = clock() - t
    memory_peak(device, times, "materialize")
    result["privileges"] = drop_privileges()
    result["network"] = os.environ.get("ASSAY_SANDBOX_NETWORK", "isolated")

    settings_changes: list[str] = []
    tampered: list[str] = []

    def checkpoint(phase: str) -> None:
        memory_peak(device, times, phase)
        now = global_settings()
        for k in before:
            if now.get(k) != before[k] and not any(c.startswith(f"{k}:") for c in settings_changes):
                settings_changes.append(f"{k}: {before[k]} -> {now.get(k)} (by the end of {phase})")
        for name in guard.changed():
            if name not in tampered:
                tampered.append(name)
        result["settings_changes"], result["tampered"] = settings_changes, tampered

    # The audit starts before the candidate exists: every call it ever gets is profiled alike.
    audit = CallAudit(device) if job.get("audit", True) else None
    if audit is not None:
        audit.start()

    def call(phase: str, xs: list) -> Any:
        return audit.call(phase, model, *xs) if audit is not None else model(*xs)

    result["stage"] = "load"
    t = clock()
    inline_builds.install()  # load_inline through the content-hash cache (assay.bench.inline)
    mod = load_candidate(Path(job["candidate"]))
    result["load_s"] = times["load_s"] = clock() - t
    if device.type == "cpu" and "triton" in sys.modules:
        mark_interpreted_triton()

    result["stage"] = "construct"
    with seeded(job["init_seed"]):
        model = mod.ModelNew(*init_args)
    model = task_mode(model.to(device))  # (the reference's: its norms on batch statistics)
    own = model.state_dict()
    ref_shapes = {k: list(v.shape) for k, v in state_dict.items()}
    own_shapes = {k: list(v.shape) for k, v in own.items()}
    result["parameters"] = {"reference": ref_shapes, "candidate": own_shapes}
    if ref_shapes and ref_shapes == own_shapes:
        model.load_state_dict(state_dict)
        model = model.to(device)
        result["parameters_loaded"] = True
    else:
        result["parameters_loaded"] = not ref_shapes and not own_shapes
    checkpoint("load")

    check, timing_ids, swaps = job["check_sets"], job["timing_sets"], job["swap_sets"]
    tcfg = timing.TimingConfig(**job["timing"])
    slots = plan_slots(check, timing_ids, swaps, tcfg.min_runs)
    canaries = Canaries(device)
    rec = Recorder(device, landing, float(job.get("settle_s", 0.0)), canaries,
                   job_dir if job.get("landing_handshake") else None)
    poison = int(job["poison_bytes"])

    def verified(slot: str, phase: str, set_id: int, xs: list, pristine: list | None,
                 poisoned: bool = True) -> None:
        if poisoned:
            poison_allocator(device, poison)
        t_call = clock()
        out = call(phase, xs)
        if "first_call_s" not in times:
            # Host time of the first call, its build time for kernels compiled on first use
            # (Triton's JIT and autotuner; load_library and load_inline build at load, load_s)
            times["first_call_s"] = clock() - t_call
        rec.record(slot, set_id, out, xs, pristine)
        del out

    def own_copy(s: int) -> list:
        """Set ``s`` in fresh buffers of this process's, each between canary pads. A draw is
        placed a tensor at a time, each dropped once copied: the set and one of its tensors
        are live at once, less than the call that follows holds (its pristine set)."""
        xs = list(sets[s])
        placed = []
        for i, x in enumerate(xs):
            placed.append(canaries.place(x))
            xs[i] = None
        return placed

    result["stage"] = "correctness"
    t = clock()
    held: dict[int, list] = {}
    inputs_s = 0.0  # the correctness sets' private copies (from a host arena on the host path)
    for slot, phase, s in slots:
        if phase == "check":
            t_in = clock()
            held[s] = own_copy(s)
            timing.sync(device)  # the copy's own time, not left to the call's first sync
            inputs_s += clock() - t_in
            verified(slot, phase, s, held[s], sets[s])
    a, b = check[-1], check[0]  # as plan_slots: set b's data at the last checked call's pointers
    bufs_a = held.pop(a)
    held.clear()  # the other sets' buffers: not needed again (the staleness calls use set a's)
    set_b = sets[b]  # (one draw of set b: its data and the pristine copy)
    refill(bufs_a, set_b)  # new data, same pointers
    verified("stale_new_data", "stale", b, bufs_a, set_b)
    verified("stale_repeat", "stale", b, bufs_a, set_b)  # the same call again
    fresh = own_copy(a)  # earlier data at new pointers (old buffers alive)
    verified("stale_new_ptr", "stale", a, fresh, sets[a])
    del held, bufs_a, set_b, fresh
    times["correctness_s"] = clock() - t
    times["correctness_inputs_s"] = inputs_s
    checkpoint("correctness")

    result["stage"] = "timing"
    t = clock()
    bufs = [own_copy(s) for s in timing_ids]
    timed_slots = [(slot, s) for slot, phase, s in slots if phase == "timed"]
    rng = random.Random(job["swap_seed"])
    swap_at = sorted(rng.sample(range(tcfg.min_runs), k=min(len(timed_slots), tcfg.min_runs)))
    swap_slot = dict(zip(swap_at, timed_slots))
    fresh_rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    perturb = bool(job.get("perturb", True))
    # the perturbed calls' data is made on the device from each timing buffer's own set
    perturb_src = [clone_inputs(sets[s], device) if on_host else sets[s]
                   for s in timing_ids] if perturb else []  # (drawn: a fresh set each)
    pending: dict[int, tuple[str, int]] = {}
    next_phase = ["warmup"]  # time_calls calls before_call before each timed call only

    def before_call(call: int) -> None:
        bi = call % len(bufs)
        next_phase[0] = "timed_verified" if call in swap_slot else "timed"
        if call in swap_slot:
            slot, s = swap_slot[call]
            refill(bufs[bi], sets[s])  # same pointers, an independent set
            pending[call] = (slot, s)
        elif perturb:
            factor = fresh_rng.uniform(*PERTURB_RANGE)
            for dst, src in zip(bufs[bi], perturb_src[bi]):
                if isinstance(dst, torch.Tensor) and (dst.is_floating_point() or dst.is_complex()):
                    torch.mul(src, factor, out=dst)

    def after_call(call: int, out: Any) -> None:
        if call in pending:
            slot, s = pending.pop(call)
            rec.record(slot, s, out, bufs[call % len(bufs)], None)

    last_buf = [0]

    def timed(i: int) -> Any:
        phase, next_phase[0] = next_phase[0], "warmup"
        last_buf[0] = i % len(bufs)
        return call(phase, bufs[last_buf[0]])

    result["timing"] = timing.time_calls(timed, device, tcfg, before_call, after_call).to_dict()
    times["timing_s"] = clock() - t
    perturb_src.clear()  # (the after-timing calls get each buffer's exact data: drawn or copied)
    checkpoint("timing")
    # After timing, every buffer gets its exact data back and is checked once more; the last
    # timed call's buffer first, so a cache keyed on the last input pointer replays that
    # (perturbed) call's output and is caught.
    t = clock()
    after = sorted((x for x in slots if x[1] == "after"),
                   key=lambda x: timing_ids.index(x[2]) != last_buf[0])
    for slot, phase, s in after:
        bi = timing_ids.index(s)
        refill(bufs[bi], sets[s])
        verified(slot, phase, s, bufs[bi], None, poisoned=False)
    times["after_s"] = clock() - t
    times.update({f"record.{k}_s": v for k, v in rec.spent.items()})
    result["calls"] = rec.calls

    result["stage"] = "audit"
    t = clock()
    if audit is not None:
        # What is audited is what was timed: the kernel audit's rows are those of the timed
        # calls; every timed call's own rows go to the consistency check.
        result["audit"] = audit.finish()
        timed_calls = [c["rows"] for c in result["audit"].get("calls", [])]
        if timed_calls:
            result["kernels"] = merge_rows(timed_calls)
        # Where the kernels credited to the candidate must be defined (the harness reads these
        # files itself: assay.verify.provenance).
        result["libraries"] = mapped_libraries(cache_dir())
    times["audit_s"] = clock() - t
    checkpoint("audit")
    result["settings_after"] = global_settings()
    timing.sync(device)
    result["stage"] = "done"
    result["t_end"] = clock()
    return result


def mapped_libraries(cache: Path) -> list[str]:
    """The files of the kernel cache this process has mapped (the libraries it loaded)."""
    try:
        root = str(cache.resolve())
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith(root + "/"))


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (bool, int, float, str, type(None))):
        return x
    return str(x)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_dir = Path(argv[0])
    result: dict[str, Any] = {"stage": "start"}
    code = 0
    try:
        run(job_dir, result)
    except BaseException as e:  # noqa: BLE001 - report every failure of candidate code
        from assay.bench.build import BuildError

        result = {"stage": result.get("stage", "unknown"), "times": result.get("times", {}),
                  "error_type": type(e).__name__,
                  "error": f"{type(e).__name__}: {e}"[:2000],
                  "traceback": traceback.format_exc()[-4000:],
                  "build_log": getattr(e, "log", "")[-8000:] if isinstance(e, BuildError) else ""}
        code = 3
    tmp = job_dir / "result.json.tmp"
    tmp.write_text(json.dumps(_jsonable(result)))
    tmp.replace(job_dir / "result.json")
    if _RESULT_FORMAT[0] == "pt":  # older readers (profile tools) load result.pt
        torch.save(result, job_dir / "result.pt.tmp")
        (job_dir / "result.pt.tmp").replace(job_dir / "result.pt")
    return code


if __name__ == "__main__":
    rc = main()
    # Everything is written and the device synchronized: skip torch's slow interpreter teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
