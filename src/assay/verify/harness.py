"""The harness: secret inputs, the reference, the candidate's worker, and the named checks.

The harness process holds the reference model and the expected outputs (in the task's dtype and
in float64); the candidate runs in a worker process it spawns (``assay.verify.worker``) and only
ever returns outputs, through landing buffers the harness reads after the worker has exited.
Every decision is a named check recorded in the verdict; a failed check's name is its reason.

Transfer: tensors never go through pickles. Inputs live in an arena the harness fills once per
prepared task (a shared-memory file the worker maps copy-on-write; or, with
``transfer: cuda_ipc``, device memory from a private CUDA memory pool shared by IPC) and
outputs come back through a landing arena. Comparison runs on the task's device. What else
the worker reports is plain JSON, never unpickled. While a worker runs, the harness is not
dumpable and the worker has dropped every capability, so it cannot read this process's memory.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import json
import math
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from assay.records import Verdict
from assay.tasks.instantiate import as_outputs, init_inputs, make_inputs, reference_model
from assay.tasks.model import Task
from assay.verify import policy as policy_mod
from assay.verify.memory import Plan, TooLarge, plan_task
from assay.verify.preflight import preflight
from assay.verify.sandbox import run_sandboxed
from assay.verify.settings import VerifyConfig
from assay.verify.worker import cuda_ipc_export, plan_slots

ALIGN = 256
PRECISION_SCOPE = 1e-2  # precision judges errors under 1% relative L2; larger ones are wrong


def resolve_device(device: str) -> str:
    if device in ("auto", "", None):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def set_reference_numerics(allow_tf32: bool) -> None:
    """The reference is computed in true fp32 unless the config says tf32."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")


def _dtype_key(dtype: torch.dtype, cfg: VerifyConfig) -> str:
    key = str(dtype).removeprefix("torch.")
    if key == "float32" and cfg.allow_tf32:
        key = "tf32"
    return key


def tolerance(dtype: torch.dtype, cfg: VerifyConfig) -> tuple[float, float]:
    rtol, atol = cfg.tolerances.get(_dtype_key(dtype, cfg), cfg.tolerances["float32"])
    return float(rtol), float(atol)


def precision_bounds(dtype: torch.dtype, cfg: VerifyConfig) -> tuple[float, float]:
    factor, ulps = cfg.precision.get(_dtype_key(dtype, cfg), cfg.precision["float32"])
    return float(factor), float(ulps)


UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "tf32": 2.0 ** -11,
                 "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def unit_roundoff(dtype: torch.dtype, cfg: VerifyConfig) -> float:
    key = _dtype_key(dtype, cfg)
    if key in UNIT_ROUNDOFF:
        return UNIT_ROUNDOFF[key]
    if dtype.is_complex:
        return UNIT_ROUNDOFF["float64" if dtype == torch.complex128 else "float32"]
    return UNIT_ROUNDOFF["float32"]


def reduction_length(model, inputs: list) -> tuple[list[torch.Tensor], int]:
    """Run the reference once and estimate the longest reduction behind one output element:
    the inner dimension of matmuls, the fan-in of convolutions, the normalized size of norms
    and softmaxes, in/out element ratios of reductions. A TorchFunctionMode (cheap: no dynamo)."""
    from torch.overrides import TorchFunctionMode

    longest = [1]

    def numel(x) -> int:
        return x.numel() if isinstance(x, torch.Tensor) else 1

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            try:
                name = getattr(func, "__name__", "")
                ts = [a for a in args if isinstance(a, torch.Tensor)]
                k = 1
                if name in ("matmul", "mm", "bmm", "mv", "dot", "vdot", "inner", "__matmul__",
                            "__rmatmul__", "einsum", "tensordot", "chain_matmul") and ts:
                    k = ts[0].shape[-1] if ts[0].dim() else 1
                elif name in ("addmm", "baddbmm", "addbmm", "addmv", "addr") and len(ts) > 1:
                    k = ts[1].shape[-1] if ts[1].dim() else 1
                elif name in ("linear", "bilinear") and len(ts) > 1:
                    k = ts[1].shape[-1]
                elif name.startswith("conv") and len(ts) > 1 and ts[1].dim() > 2:
                    w = ts[1]
                    fan = w.shape[0] if "transpose" in name else w.shape[1]
                    k = fan * math.prod(w.shape[2:])
                elif name in ("softmax", "log_softmax", "_softmax", "logsumexp", "cumsum",
                              "cumprod", "_log_softmax") and ts:
                    d = args[1] if len(args) > 1 else kwargs.get("dim", -1)
                    k = ts[0].shape[d] if ts[0].dim() else 1
                elif name in ("layer_norm", "rms_norm") and ts:
                    shp = args[1] if len(args) > 1 else kwargs.get("normalized_shape", ())
                    k = math.prod(shp if isinstance(shp, (list, tuple)) else [shp])
                elif name in ("batch_norm", "group_norm", "instance_norm") and ts:
                    k = max(ts[0].numel() // max(ts[0].shape[1] if ts[0].dim() > 1 else 1, 1), 1)
                elif ts and isinstance(out, torch.Tensor) and 0 < numel(out) < numel(ts[0]):
                    k = numel(ts[0]) // numel(out)
                longest[0] = max(longest[0], int(k))
            except Exception:  # noqa: BLE001 - an estimate; never fails the reference
                pass
            return out

    with torch.no_grad(), Count():
        outs = [o.detach().clone() for o in as_outputs(model(*inputs))]
    n_in = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))
    n_out = sum(o.numel() for o in outs)
    ratio = n_in // n_out if n_out and n_in > n_out else 1
    return outs, max(longest[0], ratio, 1)


def _hi(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype.is_complex else torch.float64


def _inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t)) if t.numel() else 0.0


# --------------------------------------------------------------------------------------------
# Comparison (on the task's device).

@dataclass
class Comparison:
    ok: bool
    detail: str = ""
    max_abs: float = 0.0
    rel: float = 0.0
    precision_ok: bool = True
    precision_detail: str = ""
    precision_ratio: float = 0.0  # candidate's error / allowed error


def _all_finite(t: torch.Tensor) -> bool:
    """Cheap: a finite sum means finite elements (a reduction, no temporary the tensor's size);
    only an overflowing sum falls back to the elementwise test."""
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def reference_stats(ref: torch.Tensor, ref64: torch.Tensor | None) -> dict[str, float]:
    """What the comparison needs of one reference output: its RMS and, against float64, the
    task-dtype reference's own error (RMS and L2) and the float64 output's L2 norm (finite
    elements only)."""
    if not _inexact(ref):
        return {}
    hi = _hi(ref.dtype)
    r = ref.detach().to(hi, copy=True).reshape(-1)
    n = r.numel()
    if not _all_finite(r):
        fin = torch.isfinite(r)
        r = torch.where(fin, r, 0)
        n = int(fin.sum())
    else:
        fin = None
    n = max(n, 1)
    st = {"rms": _norm(r) / math.sqrt(n)}
    if ref64 is not None:
        r64 = ref64.detach().to(hi).reshape(-1)
        if fin is not None or not _all_finite(r64):
            both = torch.isfinite(r64) if fin is None else fin & torch.isfinite(r64)
            r64 = torch.where(both, r64, 0)
            r = torch.where(both, r, 0)
            n = max(int(both.sum()), 1)
        norm64 = _norm(r64)
        err = _norm(r.sub_(r64))
        st.update(rms64=norm64 / math.sqrt(n), err_rms=err / math.sqrt(n), err_norm=err,
                  norm64=norm64)
    return st


def compare_tensor(val: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor | None,
                   stats: dict[str, float], cfg: VerifyConfig, reduction: int = 1) -> Comparison:
    """NaN where and only where the reference has NaN, the same infinities; then per element

        |v - ref| <= atol * rms(ref) + rtol * |ref|                              (task dtype), or
        |v - r64| <= atol * rms(r64) + rtol * |r64| + k * rms(ref - r64) + s * u * sqrt(N) * rms(r64)

    against the float64 reference r64 (k = ``reference_error_factor``, s = ``rounding_slack``,
    u the dtype's unit roundoff, N = ``reduction``, the task's longest reduction): an honest
    kernel that sums in another order than torch passes, an element that is wrong does not.
    Precision: the L2 error against r64 may not exceed
    max(factor x |ref - r64|, ulps x u x sqrt(N) x |r64|) (``precision[dtype]``).
    Few temporaries, in place where possible: on cpu each fresh one is page faults.
    """
    if not _inexact(ref):
        if torch.equal(val, ref):
            return Comparison(True)
        n = int((val != ref).sum())
        return Comparison(False, f"{n}/{ref.numel()} elements differ (exact dtype "
                                 f"{str(ref.dtype).removeprefix('torch.')})", math.inf, math.inf)
    hi = _hi(ref.dtype)
    v = val.to(hi, copy=True).reshape(-1)
    r = ref.to(hi, copy=True).reshape(-1)
    r64 = ref64.to(hi).reshape(-1) if ref64 is not None and "err_rms" in stats else None
    if not (_all_finite(r) and _all_finite(v)):
        nan_r, nan_v = torch.isnan(r), torch.isnan(v)
        if not torch.equal(nan_r, nan_v):
            return Comparison(False, f"{int((nan_r != nan_v).sum())} NaN mismatches (unwritten "
                                     f"or wrong output elements)", math.inf, math.inf)
        inf_r, inf_v = torch.isinf(r), torch.isinf(v)
        if not torch.equal(inf_r, inf_v) or not torch.equal(r[inf_r], v[inf_v]):
            return Comparison(False, "infinities differ from the reference", math.inf, math.inf)
        fin = torch.isfinite(r)
        r, v = r[fin], v[fin]
        r64 = r64[fin] if r64 is not None else None
        if r.numel() == 0:
            return Comparison(True)
    d = (v - r).abs_()
    max_abs = float(d.max())
    rtol, atol = tolerance(ref.dtype, cfg)
    rel = _norm(d) / (_norm(r) + 1e-30)
    bound = r.abs_().mul_(rtol).add_(atol * max(stats.get("rms", 0.0), 1e-30))  # r is ours
    ok = d <= bound
    prec_ok, prec_detail, ratio = True, "no float64 reference", 0.0
    if r64 is not None:
        u = unit_roundoff(ref.dtype, cfg)
        root_n = math.sqrt(max(reduction, 1))
        v.sub_(r64).abs_()  # v is ours: now |v - r64|
        finite64 = _all_finite(r64)
        slack = (cfg.reference_error_factor * stats["err_rms"]
                 + cfg.rounding_slack * u * root_n * stats["rms64"])
        torch.abs(r64, out=bound).mul_(rtol).add_(atol * max(stats["rms64"], 1e-30) + slack)
        if finite64:
            ok |= v <= bound
            err = _norm(v)
        else:
            fin64 = torch.isfinite(r64)
            ok |= (v <= bound) & fin64
            err = _norm(torch.where(fin64, v, 0))
        factor, ulps = precision_bounds(ref.dtype, cfg)
        allowed = max(factor * stats["err_norm"], ulps * u * root_n * stats["norm64"])
        ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf)
        # A rounding-level error (under 1% relative) is a precision question; a larger one is
        # a wrong result, correctness's business, not reported twice.
        prec_ok = err <= allowed or err > PRECISION_SCOPE * stats["norm64"]
        norm64 = max(stats["norm64"], 1e-300)
        prec_detail = (f"error vs float64 {err / norm64:.3g} (relative L2) where the "
                       f"{str(ref.dtype).removeprefix('torch.')} reference's own is "
                       f"{stats['err_norm'] / norm64:.3g}; allowed {allowed / norm64:.3g} = "
                       f"max({factor:g} x own, {ulps:g} x u x sqrt({reduction}))")
    if not bool(ok.all()):
        bad = ~ok
        i = int(bad.nonzero()[0])
        got = val.to(hi).reshape(-1)[i] if r.numel() == ref.numel() else float("nan")
        want = ref.to(hi).reshape(-1)[i] if r.numel() == ref.numel() else float("nan")
        fmt = (lambda x: f"{complex(x):.6g}") if ref.is_complex() else (lambda x: f"{float(x):.6g}")  # noqa: E731
        return Comparison(False, (
            f"{int(bad.sum())}/{r.numel()} elements off (max |diff| {max_abs:.3g}, first at "
            f"index {i}: got {fmt(got)}, want {fmt(want)}; rtol {rtol:g}, atol {atol:g}*rms)"),
            max_abs, rel, prec_ok, prec_detail, ratio)
    return Comparison(True, "", max_abs, rel, prec_ok, prec_detail, ratio)


def compare(out: dict[str, Any], ref: torch.Tensor, cfg: VerifyConfig) -> tuple[bool, str, float, float]:
    """Exact shape, dtype and strides, then the tolerance check against the task-dtype reference
    alone (kept for callers of the first version; the harness uses :func:`compare_tensor`)."""
    val = out["value"]
    if tuple(val.shape) != tuple(ref.shape):
        return False, f"shape {tuple(val.shape)} != reference {tuple(ref.shape)}", math.inf, math.inf
    if val.dtype != ref.dtype:
        return False, f"dtype {val.dtype} != reference {ref.dtype}", math.inf, math.inf
    if tuple(out["stride"]) != tuple(ref.stride()):
        return False, f"strides {tuple(out['stride'])} != reference {tuple(ref.stride())}", \
            math.inf, math.inf
    c = compare_tensor(val.to(ref.device), ref, None, reference_stats(ref, None), cfg)
    return c.ok, c.detail, c.max_abs, c.rel


def roofline_ms(record: dict[str, Any] | None, peaks: dict[str, Any] | None) -> float | None:
    """The fastest any implementation could be: max(bytes / bandwidth, FLOPs / peak)."""
    if not record or not peaks:
        return None
    t_bytes = record.get("min_bytes", 0.0) / (peaks["bandwidth_gbs"] * 1e9)
    t_flops = record.get("flops", 0.0) / (peaks["flops_tflops"] * 1e12)
    return max(t_bytes, t_flops) * 1e3


# --------------------------------------------------------------------------------------------
# Arenas: where tensors cross the process boundary.

def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


class _Layout:
    """Offsets of tensors in one arena."""

    def __init__(self, arena: str):
        self.arena = arena
        self.size = 0

    def add(self, shape, dtype: torch.dtype, stride=None) -> dict[str, Any]:
        off = -(-self.size // ALIGN) * ALIGN
        self.size = off + _nbytes(shape, dtype)
        return {"arena": self.arena, "offset": off, "shape": list(shape),
                "dtype": str(dtype).removeprefix("torch."),
                "stride": list(stride) if stride is not None else None}


def _view(buf: torch.Tensor, desc: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, desc["dtype"])
    n = _nbytes(desc["shape"], dtype)
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


def _shm_dir(nbytes: int) -> str:
    """/dev/shm when it has room (memory speed, no disk writeback), else the temp folder."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize > 2 * nbytes + (256 << 20):
            return shm
    except OSError:
        pass
    return tempfile.gettempdir()


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
            where = _shm_dir(self.nbytes)
            _sweep_stale(where)
            self.dir = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=where))
            os.chmod(self.dir, 0o755)
        else:
            self.dir = Path(directory)
        self.path = self.dir / f"{prefix}arena"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL,
                          0o644 if own else 0o600)
        os.ftruncate(self.fd, self.nbytes)
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


# --------------------------------------------------------------------------------------------
# Prepare: secret inputs, references, everything reused across candidates of one task.

@dataclass
class Prepared:
    """Everything the harness computed for one (task, device): reused across candidates."""

    task: Task
    device: str
    init_inputs: list
    init_seed: int
    state_dict: dict
    sets: list[list]                 # every input set, on the device
    distributions: list[str]         # the distribution each set was drawn from
    check_sets: list[int]            # correctness sets (cfg.input_distributions)
    timing_sets: list[int]
    swap_sets: list[int]
    refs: list[list[torch.Tensor]]   # task-dtype reference outputs per set, on the device
    refs64: list[list[torch.Tensor | None]]  # float64 references (None where not computable)
    stats: list[list[dict[str, float]]]
    reference_ops: list[str]         # ATen compute ops of the reference's forward
    reference_aliases: bool          # the reference's output shares memory with an input
    reduction: int                   # the longest reduction behind one output element
    degenerate: str                  # why the outputs barely depend on the inputs ("" if not)
    poison_bytes: int
    prepare_s: float = 0.0
    _inputs: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def references(self) -> list[list[torch.Tensor]]:
        return [self.refs[i] for i in self.check_sets]

    def host_inputs(self) -> dict[str, Any]:
        """The input arena (a shared-memory file, written once, mapped copy-on-write by every
        worker) and the descriptors of what is in it. Rebuilt if a worker tampered with it."""
        if self._inputs is not None and self._inputs["identity"] != self._inputs["arena"].identity():
            self._inputs["arena"].close()
            self._inputs = None
        if self._inputs is None:
            layout = _Layout("in")
            descs = _describe(self, layout)
            arena = FileArena(layout.size, "assay-inputs-")
            _fill(arena.buf, self, descs)
            self._inputs = {"arena": arena, "descs": descs, "identity": arena.identity()}
        return self._inputs

    def inputs_tampered(self) -> bool:
        return self._inputs is not None and \
            self._inputs["identity"] != self._inputs["arena"].identity()


def _tensor_desc(t: torch.Tensor, layout: _Layout) -> dict[str, Any]:
    stride = None if t.is_contiguous() else list(t.stride())
    return {"tensor": layout.add(t.shape, t.dtype, stride)}


def _describe(prep: Prepared, layout: _Layout) -> dict[str, Any]:
    item = (lambda x: _tensor_desc(x, layout) if isinstance(x, torch.Tensor)  # noqa: E731
            else {"value": x})
    return {"sets": [[item(x) for x in s] for s in prep.sets],
            "state_dict": {k: _tensor_desc(v, layout) for k, v in prep.state_dict.items()},
            "init_inputs": [item(x) for x in prep.init_inputs]}


def _fill(buf: torch.Tensor, prep: Prepared, descs: dict[str, Any]) -> None:
    pairs = []
    for s, ds in zip(prep.sets, descs["sets"]):
        pairs += [(x, d) for x, d in zip(s, ds) if isinstance(x, torch.Tensor)]
    pairs += [(prep.state_dict[k], d) for k, d in descs["state_dict"].items()]
    pairs += [(x, d) for x, d in zip(prep.init_inputs, descs["init_inputs"])
              if isinstance(x, torch.Tensor)]
    for x, d in pairs:
        _view(buf, d["tensor"]).copy_(x.detach().contiguous())
    if buf.device.type == "cuda":
        torch.cuda.synchronize(buf.device)


def _profile_ops(model, inputs: list) -> list[str]:
    try:  # the autograd profiler's front end: torch.profiler.profile imports dynamo (seconds)
        with torch.no_grad(), torch.autograd.profiler.profile(use_kineto=True) as prof:
            model(*inputs)
        rows = [{"name": e.key} for e in prof.key_averages()]
        return sorted(policy_mod.compute_ops(rows))
    except Exception:  # noqa: BLE001 - no op list: the reference_fallback check passes
        return []


def _overlaps(outs: list[torch.Tensor], inputs: list) -> bool:
    def rng(t):
        s = t.untyped_storage()
        return s.data_ptr(), s.data_ptr() + s.nbytes()
    for o in outs:
        if o.numel() == 0:
            continue
        lo, hi = rng(o)
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.numel() and x.device == o.device:
                a, b = rng(x)
                if lo < b and a < hi:
                    return True
    return False


def _degenerate(refs: list[list[torch.Tensor]], refs64: list, stats: list, dists: list[str],
                check: list[int], cfg: VerifyConfig) -> str:
    """The harness's own degeneracy test, on what it computed anyway: if the expected outputs
    of every correctness set (different inputs, different distributions) pass the comparison
    against one another, a candidate that ignores its inputs would pass too."""
    a = check[0]
    others = [b for b in check if b != a]
    if not others or not all(_inexact(r) for r in refs[a]):
        return ""
    for b in others:
        for j, (ra, rb) in enumerate(zip(refs[a], refs[b])):
            if ra.shape != rb.shape:
                return ""
            if not compare_tensor(rb, ra, refs64[a][j], stats[a][j], cfg).ok:
                return ""
    return (f"the expected outputs of {len(check)} input sets ({', '.join(dists[i] for i in check)}) "
            f"match one another within the tolerances: the output barely depends on the inputs, "
            f"so an input-ignoring constant would pass")


def prepare(task: Task, device: str, cfg: VerifyConfig, plan: Plan | None = None) -> Prepared:
    """Draw secret seeds, build the reference and compute the expected outputs (task dtype and
    float64), all on ``device``. Raises :class:`TooLarge` (before allocating anything of the
    task's size) when the memory plan says this machine cannot hold the verification."""
    t0 = time.perf_counter()
    set_reference_numerics(cfg.allow_tf32)
    device = resolve_device(device)
    plan = plan or plan_task(task, device, cfg)
    if plan is not None and not plan.fits:
        raise TooLarge(plan)
    module = task.module()
    init_seed = secrets.randbits(31)
    model = reference_model(module, init_seed, device)
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def draw(distribution: str) -> list:
        with torch.device(device):  # factories in get_inputs() allocate on the device
            return make_inputs(module, secrets.randbits(31), device, distribution)

    dists = list(cfg.input_distributions) + ["native"] * (cfg.timing_sets + cfg.swap_sets)
    sets = [draw(d) for d in dists]
    n = len(cfg.input_distributions)
    check = list(range(n))
    timing_ids = list(range(n, n + cfg.timing_sets))
    swap_ids = list(range(n + cfg.timing_sets, len(dists)))

    def run_ref(inputs: list) -> list[torch.Tensor]:
        with torch.no_grad():
            return [o.detach().clone() for o in as_outputs(model(*inputs))]

    first, reduction = reduction_length(model, sets[0])
    refs = [first] + [run_ref(xs) for xs in sets[1:]]
    with torch.no_grad():
        ref_alias = _overlaps(as_outputs(model(*sets[0])), sets[0])
    try:
        model64 = copy.deepcopy(model).to(torch.float64)
    except Exception:  # noqa: BLE001
        model64 = None

    def run_ref64(inputs: list, want: list[torch.Tensor]) -> list[torch.Tensor | None]:
        if model64 is None:
            return [None] * len(want)
        xs = [x.to(_hi(x.dtype)) if isinstance(x, torch.Tensor) and _inexact(x) else x
              for x in inputs]
        try:
            with torch.no_grad():
                outs = as_outputs(model64(*xs))
        except Exception:  # noqa: BLE001 - some ops have no float64 kernel: no fp64 reference
            return [None] * len(want)
        if len(outs) != len(want):
            return [None] * len(want)
        return [o.detach().to(_hi(w.dtype)) if _inexact(w) and o.shape == w.shape else None
                for o, w in zip(outs, want)]

    refs64 = [run_ref64(xs, r) for xs, r in zip(sets, refs)]
    del model64
    stats = [[reference_stats(r, r64) for r, r64 in zip(rs, r64s)]
             for rs, r64s in zip(refs, refs64)]
    ops = _profile_ops(model, sets[0])
    out_bytes = sum(o.numel() * o.element_size() for o in refs[0])
    prep = Prepared(task, device, init_inputs(module), init_seed, sd, sets, dists, check,
                    timing_ids, swap_ids, refs, refs64, stats, ops, ref_alias, reduction,
                    _degenerate(refs, refs64, stats, dists, check, cfg), max(out_bytes, 1 << 20))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    prep.prepare_s = time.perf_counter() - t0
    return prep


# --------------------------------------------------------------------------------------------
# The worker run.

_DUMP_LOCK = threading.Lock()
_DUMP_DEPTH = [0, 1]  # active runs, the dumpable value to restore


@contextlib.contextmanager
def _private_memory():
    """While a worker runs this process is not dumpable: /proc/<pid>/mem, maps and environ are
    closed to processes without CAP_SYS_PTRACE (the worker drops it)."""
    libc = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL(None, use_errno=True)
    with _DUMP_LOCK:
        if libc is not None and _DUMP_DEPTH[0] == 0:
            prev = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            _DUMP_DEPTH[1] = prev if prev in (0, 1) else 1
            libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        _DUMP_DEPTH[0] += 1
    try:
        yield
    finally:
        with _DUMP_LOCK:
            _DUMP_DEPTH[0] -= 1
            if libc is not None and _DUMP_DEPTH[0] == 0:
                libc.prctl(4, _DUMP_DEPTH[1], 0, 0, 0)


def _job_base(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> dict[str, Any]:
    return {
        "candidate": str(candidate), "device": prep.device, "init_seed": prep.init_seed,
        "check_sets": prep.check_sets, "timing_sets": prep.timing_sets,
        "swap_sets": prep.swap_sets, "swap_seed": secrets.randbits(31),
        "poison_bytes": prep.poison_bytes, "audit": cfg.audit,
        "perturb": cfg.perturb_timed_inputs, "settle_s": cfg.settle_s,
        "timing": {"warmup_s": cfg.warmup_s, "min_runs": cfg.min_runs, "max_runs": cfg.max_runs,
                   "budget_s": cfg.budget_s, "flush_cache": True},
    }


def _worker_job(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> dict[str, Any]:
    """A job without landing buffers (the worker runs the protocol, reports and profiles, and
    writes ``result.pt`` as well as ``result.json``): for tools that only want the profile."""
    inputs = prep.host_inputs()
    job = _job_base(prep, candidate, cfg)
    job.update(arenas={"in": inputs["arena"].spec(writable=False)}, **inputs["descs"])
    return job


class WorkerRun:
    """One candidate in one worker: job, arenas, sandboxed process, parsed report, landing."""

    def __init__(self, prep: Prepared, candidate: Path, cfg: VerifyConfig,
                 times: dict[str, Any], transfer: str = "host"):
        self.prep, self.cfg, self.times = prep, cfg, times
        self.transfer = transfer
        self.result: dict[str, Any] | None = None
        self.outcome = ""
        self.landing: dict[str, list[torch.Tensor]] = {}
        self.tampered_inputs = False
        self._arenas: list[Any] = []
        # The landing arena lives in the scratch folder (the one place the worker may write):
        # on /dev/shm when it has room for it, so nothing goes through a disk.
        landing = sum(_nbytes(r.shape, r.dtype) + ALIGN for rs in prep.refs for r in rs)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"assay-verify-{os.getpid()}-",
                                             dir=_shm_dir(2 * landing)))
        self.candidate = candidate

    def __enter__(self) -> "WorkerRun":
        return self

    def __exit__(self, *exc) -> None:
        self.landing = {}
        for a in self._arenas:
            with contextlib.suppress(Exception):
                a.close()
        self._arenas = []
        shutil.rmtree(self.scratch, ignore_errors=True)

    def run(self) -> None:
        prep, cfg, times = self.prep, self.cfg, self.times
        t = time.perf_counter()
        # The user's file name, so the worker's tracebacks and messages name their file.
        name = self.candidate.name
        cand_copy = self.scratch / (name if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py", name)
                                    else "candidate.py")
        shutil.copyfile(self.candidate, cand_copy)
        job = _job_base(prep, cand_copy, cfg)
        slots = plan_slots(prep.check_sets, prep.timing_sets, prep.swap_sets, cfg.min_runs)
        out_layout = _Layout("out")
        landing_descs = {name: [out_layout.add(r.shape, r.dtype) for r in prep.refs[s]]
                         for name, _, s in slots}
        if self.transfer == "cuda_ipc":
            in_layout = _Layout("in")
            descs = _describe(prep, in_layout)
            a_in = DeviceArena(in_layout.size, prep.device)
            self._arenas.append(a_in)
            _fill(a_in.buf, prep, descs)
            a_out = DeviceArena(out_layout.size, prep.device)
            self._arenas.append(a_out)
            a_out.buf.fill_(0xFF)  # NaN-looking until written
            torch.cuda.synchronize()
            arenas = {"in": a_in.spec(), "out": a_out.spec()}
        else:
            t_in = time.perf_counter()
            inputs = prep.host_inputs()
            times["inputs_arena_s"] = times.get("inputs_arena_s", 0.0) + time.perf_counter() - t_in
            descs = inputs["descs"]
            a_out = FileArena(out_layout.size, "landing-", self.scratch)
            self._arenas.append(a_out)
            arenas = {"in": inputs["arena"].spec(writable=False), "out": a_out.spec(True)}
        job.update(arenas=arenas, landing=landing_descs, result_format="json", **descs)
        torch.save(job, self.scratch / "job.pt")
        times["job_s"] = time.perf_counter() - t

        t = time.perf_counter()
        with _private_memory():
            self.outcome = run_sandboxed([sys.executable, "-m", "assay.verify.worker",
                                          str(self.scratch)], self.scratch, cfg.timeout_s,
                                         cfg.limits, device=prep.device)
        t_done = time.perf_counter()
        times["worker_s"] = t_done - t
        self.tampered_inputs = self.transfer != "cuda_ipc" and prep.inputs_tampered()

        result_file = self.scratch / "result.json"
        if result_file.exists():
            try:
                self.result = json.loads(result_file.read_text())
                if not isinstance(self.result, dict):
                    raise ValueError("not an object")
            except (ValueError, OSError) as e:
                self.result = {"stage": "report", "error": f"unreadable worker report: {e}"}
            r = self.result
            with contextlib.suppress(TypeError, ValueError, KeyError):
                times["spawn_s"] = float(r["t_start"]) - t
                times["import_s"] = float(r["t_torch"]) - float(r["t_start"])
                times["exit_s"] = t_done - float(r["t_end"])
            if isinstance(r.get("times"), dict):
                times.update({f"worker.{k}": v for k, v in r["times"].items()})
        if isinstance(a_out, FileArena) and not a_out.intact_size():
            self.result = {"stage": "report", "error": "the landing arena was truncated"}
            return
        t = time.perf_counter()
        self.landing = {name: [_view(a_out.buf, d) for d in ds]
                        for name, ds in landing_descs.items()}
        times["landing_map_s"] = time.perf_counter() - t


def run_worker(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> tuple[dict | None, str]:
    """Run the candidate's worker in a sandbox; return its report (or None) and a failure line."""
    with WorkerRun(prep, Path(candidate), cfg, {}) as w:
        w.run()
        return w.result, w.outcome


# --------------------------------------------------------------------------------------------
# Verify and judge.

def verify(task: Task, candidate: Path, device: str = "auto", cfg: VerifyConfig | None = None,
           baseline: dict[str, Any] | None = None, record: dict[str, Any] | None = None,
           peaks: dict[str, Any] | None = None, prepared: Prepared | None = None,
           times: dict[str, Any] | None = None, plan: Plan | None = None) -> Verdict:
    """Judge one candidate file against one task. Never raises for anything the candidate does.
    ``times`` (optional) receives where the time went (prepare, transfer, worker, compare);
    ``plan``: the memory plan when the caller made one (else :func:`prepare` makes it)."""
    cfg = cfg or VerifyConfig()
    times = times if times is not None else {}
    device = resolve_device(device)
    t0 = time.perf_counter()
    v = Verdict(candidate=Path(candidate).stem, task=task.id, device=device, policy=cfg.policy)
    if baseline:
        v.baseline_eager_ms = baseline.get("eager_ms")
        v.baseline_compile_ms = baseline.get("compile_ms")
    v.roofline_ms = roofline_ms(record, peaks)
    why = preflight(Path(candidate))
    if why:  # no worker, no preparation: the file cannot be what a worker would load
        v.check("compiles", False, why)
        v.error = why
        v.verify_s = time.perf_counter() - t0
        return v.finish()

    degenerate = bool(record and record.get("degeneracy", {}).get("degenerate"))
    if degenerate:
        detail = record["degeneracy"].get("why", "output barely depends on the inputs")
        if not v.check("task_not_degenerate", cfg.on_degenerate != "reject", detail):
            v.error = f"task {task.id} is degenerate: {detail}"
            v.verify_s = time.perf_counter() - t0
            return v.finish()

    t = time.perf_counter()
    try:
        prep = prepared or prepare(task, device, cfg, plan)
    except TooLarge as e:
        v.check("too_large", False, str(e))
        v.error = f"task {task.id} is too large for this machine: {e}"
        v.verify_s = time.perf_counter() - t0
        return v.finish()
    times["prepare_s"] = time.perf_counter() - t if prepared is None else 0.0
    if prep.degenerate and not degenerate:
        if not v.check("task_not_degenerate", cfg.on_degenerate != "reject", prep.degenerate):
            v.error = f"task {task.id} is degenerate: {prep.degenerate}"
            v.verify_s = time.perf_counter() - t0
            return v.finish()

    transfer = cfg.transfer if prep.device.startswith("cuda") else "host"
    for attempt in (transfer, "host"):
        with WorkerRun(prep, Path(candidate), cfg, times, attempt) as w:
            try:
                w.run()
            except Exception as e:  # noqa: BLE001 - arena setup failed: fall back to host
                if attempt == "host":
                    raise
                times["transfer_fallback"] = f"{type(e).__name__}: {e}"[:300]
                continue
            r = w.result
            if attempt != "host" and r is not None and r.get("stage") == "start" \
                    and "error" in r:
                times["transfer_fallback"] = str(r.get("error"))[:300]
                continue  # the worker could not open the device arena: not the candidate's fault
            times["transfer"] = attempt
            t = time.perf_counter()
            _judge(v, prep, w, cfg)
            times["compare_s"] = time.perf_counter() - t
        break
    v.verify_s = times["verify_s"] = time.perf_counter() - t0
    return v.finish()


class _Malformed(Exception):
    pass


def _judge(v: Verdict, prep: Prepared, w: WorkerRun, cfg: VerifyConfig) -> None:
    result, outcome = w.result, w.outcome
    if getattr(outcome, "isolation", None):
        # Informational (always passes): which isolation layers this machine allowed, and why
        # any was refused, so a verdict says how contained the candidate was.
        v.check("sandbox", True, outcome.isolation_line())
    if result is None:
        name = "timeout" if outcome.startswith("timeout") else "crash"
        v.check(name, False, outcome)
        v.error = outcome
        return
    if "error" in result:
        stage = result.get("stage")
        name = {"load": "compiles", "construct": "constructs", "report": "crash"}.get(stage, "runs")
        log = result.get("build_log") or ""
        if log:
            name = "compiles"
        v.check(name, False, str(result["error"]) + ("\n" + str(log) if log else ""))
        v.error = str(result["error"])
        return
    try:
        _judge_report(v, prep, w, cfg)
    except (_Malformed, KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        v.check("crash", False, f"malformed worker report: {type(e).__name__}: {e}")
        v.error = "malformed worker report"


def _judge_report(v: Verdict, prep: Prepared, w: WorkerRun, cfg: VerifyConfig) -> None:
    result = w.result
    v.check("compiles", True)
    v.check("constructs", True)
    v.check("runs", True)
    params = result["parameters"]
    v.check("parameters", bool(result["parameters_loaded"]),
            "" if result["parameters_loaded"] else
            f"ModelNew's parameters {params['candidate']} do not match the reference's "
            f"{params['reference']}: the harness cannot load the reference's weights")

    calls = result["calls"]
    if not isinstance(calls, dict):
        raise _Malformed("calls is not an object")
    slots = plan_slots(prep.check_sets, prep.timing_sets, prep.swap_sets, cfg.min_runs)
    problems: dict[str, list[str]] = {"check": [], "stale": [], "timed": [], "after": []}
    layout, lazy, unsettled, aliased, changed, precision = [], [], [], [], [], []
    max_abs, rel = 0.0, 0.0
    dev_type = prep.device.split(":")[0]
    label = {"stale_new_data": "new data at the same pointers",
             "stale_repeat": "the same call repeated",
             "stale_new_ptr": "earlier data at new pointers"}
    for slot, phase, s in slots:
        where = (f"input set {s} ({prep.distributions[s]})" if phase == "check"
                 else f"{label.get(slot, slot)} (set {s})" if phase == "stale"
                 else f"timed call with a fresh set (set {s})" if phase == "timed"
                 else f"timing buffer after timing (set {s})")
        call = calls.get(slot)
        if not isinstance(call, dict):
            problems[phase].append(f"{where}: no result reported")
            continue
        refs = prep.refs[s]
        outs = call["outputs"]
        if len(outs) != len(refs):
            problems[phase].append(f"{where}: {len(outs)} outputs, reference has {len(refs)}")
        if phase in ("check", "stale") and any(call.get("inputs_changed") or []):
            changed.append(where)
        for j, (m, r) in enumerate(zip(outs, refs)):
            tag = f"{where} output {j}"
            if not m.get("plain"):
                lazy.append(f"{tag} is a {m.get('type')}, not a plain torch.Tensor with storage")
                problems[phase].append(f"{tag}: not a plain tensor, not compared")
                continue
            bad = []
            if str(m["device"]).split(":")[0] != dev_type:
                bad.append(f"on {m['device']}, expected {prep.device}")
            if tuple(m["shape"]) != tuple(r.shape):
                bad.append(f"shape {tuple(m['shape'])} != reference {tuple(r.shape)}")
            elif m["dtype"] != str(r.dtype).removeprefix("torch."):
                bad.append(f"dtype {m['dtype']} != reference {str(r.dtype).removeprefix('torch.')}")
            elif tuple(m["stride"]) != tuple(r.stride()):
                bad.append(f"strides {tuple(m['stride'])} != reference {tuple(r.stride())}")
            if not m["settled"]:
                unsettled.append(tag)
            if m["aliases"] and not prep.reference_aliases:
                aliased.append(tag)
            if bad:
                layout += [f"{tag}: {b}" for b in bad]
                problems[phase] += [f"{tag}: {b}" for b in bad]
                continue
            if not m["written"] or slot not in w.landing or j >= len(w.landing[slot]):
                problems[phase].append(f"{tag}: not returned")
                continue
            val = w.landing[slot][j].to(r.device)
            c = compare_tensor(val, r, prep.refs64[s][j], prep.stats[s][j], cfg, prep.reduction)
            if phase == "check":
                max_abs, rel = max(max_abs, c.max_abs), max(rel, c.rel)
                if not c.precision_ok:
                    precision.append(f"{tag}: {c.precision_detail}")
            if not c.ok:
                problems[phase].append(f"{tag}: {c.detail}")
    v.max_abs_err, v.rel_err = max_abs, rel
    v.check("output_layout", not layout, "; ".join(layout[:4]))
    v.check("lazy_output", not lazy, "; ".join(lazy[:3]))
    v.check("correctness", not problems["check"], "; ".join(problems["check"][:4]))
    v.check("precision", not precision, "; ".join(precision[:3]) or
            "candidate within the allowed error against float64")
    v.check("stale_results", not problems["stale"], "; ".join(problems["stale"][:3]))
    v.check("inputs_unchanged", not changed,
            f"inputs modified in place: {', '.join(changed[:4])}" if changed else "")
    v.check("no_output_aliasing", not aliased,
            f"output shares memory with an input: {', '.join(aliased[:3])}" if aliased else "")
    timed = problems["timed"] + problems["after"]
    v.check("timed_outputs", not timed, "; ".join(timed[:3]))

    t = result["timing"]
    v.runtime_ms, v.runtime_iqr_ms = float(t["median_ms"]), float(t["iqr_ms"])
    escaped = float(t.get("escaped_ms", 0.0))
    late = escaped > max(0.25 * v.runtime_ms, 0.01)
    detail = []
    if unsettled:
        detail.append(f"outputs changed after forward returned (work left running on a thread "
                      f"or side stream): {', '.join(unsettled[:3])}")
    if late:
        detail.append(f"{escaped:.4g} ms of device work finished only after a device-wide sync, "
                      f"outside the {v.runtime_ms:.4g} ms timed on the caller's stream")
    v.check("stream_ordered", not detail, "; ".join(detail))

    tampered = list(result.get("tampered") or [])
    if w.tampered_inputs:
        tampered.append("the shared input arena file")
    v.check("harness_integrity", not tampered,
            f"replaced: {', '.join(tampered[:12])}" if tampered else "")
    changes = list(result.get("settings_changes") or [])
    v.check("global_state", not changes, "; ".join(changes[:6]))

    if v.baseline_eager_ms:
        v.speedup_eager = v.baseline_eager_ms / v.runtime_ms if v.runtime_ms > 0 else None
    if v.baseline_compile_ms:
        v.speedup_compile = v.baseline_compile_ms / v.runtime_ms if v.runtime_ms > 0 else None
    if v.roofline_ms:
        floor = cfg.roofline_margin * v.roofline_ms
        v.check("roofline", v.runtime_ms >= floor,
                f"runtime {v.runtime_ms:.4g} ms is under the roofline floor "
                f"{v.roofline_ms:.4g} ms: impossible, so something was skipped or faked"
                if v.runtime_ms < floor else "")

    if "kernels" in result:
        rows = result["kernels"]
        audit = policy_mod.audit(rows, prep.device, cfg.policy, cfg.max_library_time_frac)
        v.kernels_launched = audit.kernels
        v.library_time_frac = audit.library_time_frac
        v.check("kernel_audit", audit.ok, audit.detail)
        if cfg.reject_reference_ops:
            ok, detail = policy_mod.reference_fallback(rows, prep.reference_ops)
            v.check("reference_fallback", ok, detail)
