"""Output comparison, on the task's device: a candidate's output against the task-dtype reference
and the float64 one (:func:`compare_tensor`), with the tolerances and precision bounds of the
verify config, and the per-output statistics of the reference that it needs (computed once per
prepared task, :func:`reference_stats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assay.verify.settings import VerifyConfig

PRECISION_SCOPE = 1e-2  # precision judges errors under 1% relative L2; larger ones are wrong


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


def wide_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype.is_complex else torch.float64


def is_inexact(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t)) if t.numel() else 0.0


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
    if not is_inexact(ref):
        return {}
    hi = wide_dtype(ref.dtype)
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
    if not is_inexact(ref):
        if torch.equal(val, ref):
            return Comparison(True)
        n = int((val != ref).sum())
        return Comparison(False, f"{n}/{ref.numel()} elements differ (exact dtype "
                                 f"{str(ref.dtype).removeprefix('torch.')})", math.inf, math.inf)
    hi = wide_dtype(ref.dtype)
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
