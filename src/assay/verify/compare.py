"""Output comparison, on the task's device: a candidate's output against the task-dtype reference
and the float64 one (:func:`compare_tensor`), with the tolerances and precision bounds of the
verify config, and the per-output statistics of the reference that it needs (computed once per
prepared task, :func:`reference_stats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from assay.tasks.instantiate import DISTRIBUTIONS
from assay.verify.memory import COMPARE_CHUNK
from assay.verify.settings import VerifyConfig
from assay.verify.worker import moved

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
    # against float64, relative L2 (-1: no float64 reference): the candidate's error and the
    # task-dtype reference's own (:func:`rounded_inputs` compares them across input sets)
    err_rel: float = -1.0
    own_rel: float = -1.0


def _all_finite(t: torch.Tensor) -> bool:
    """Cheap: a finite sum means finite elements (a reduction, no temporary the tensor's size);
    only an overflowing sum falls back to the elementwise test."""
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


# Elements per chunk (the memory plan counts the same): references of KernelBench's largest
# tasks (1.6 G elements) are compared a chunk at a time, so the float64 temporaries stay ~2.7 GB
# whatever the output's size, and references kept on the host are compared on the device.
CHUNK = COMPARE_CHUNK


def _chunks(n: int, chunk: int):
    for lo in range(0, n, chunk):
        yield lo, min(lo + chunk, n)


def _wide(t: torch.Tensor, lo: int, hi: int, device) -> torch.Tensor:
    """Elements [lo, hi) of the flattened ``t`` in the wide dtype, a fresh tensor on ``device``."""
    part = t.reshape(-1)[lo:hi]
    there = moved(part, device)  # host references and landing buffers: through the stage
    return there.to(dtype=wide_dtype(t.dtype), copy=there is part)


def reference_stats(ref: torch.Tensor, ref64: torch.Tensor | None, device=None,
                    chunk: int = CHUNK) -> dict[str, float]:
    """What the comparison needs of one reference output: its RMS and largest magnitude and,
    against float64, the task-dtype reference's own error (RMS, L2 and largest) and the float64
    output's L2 norm and largest magnitude (finite elements only). A chunk at a time, on
    ``device`` (default: the reference's)."""
    if not is_inexact(ref):
        return {}
    device = device or ref.device
    n_r = n_both = lost = 0
    sq_r = sq64 = sq_err = max64 = top = err_max = 0.0
    for lo, hi in _chunks(ref.numel(), chunk):
        r = _wide(ref, lo, hi, device)
        fin = None if _all_finite(r) else torch.isfinite(r)
        if fin is not None:
            r = torch.where(fin, r, 0)
        n_r += r.numel() if fin is None else int(fin.sum())
        sq_r += _norm(r) ** 2
        if r.numel():
            top = max(top, float(r.abs().max()))
        if ref64 is None:
            continue
        r64 = _wide(ref64, lo, hi, device)
        both = fin
        if fin is not None or not _all_finite(r64):
            fin64 = torch.isfinite(r64)
            if fin is not None:
                lost += int((fin64 & ~fin).sum())
            both = fin64 if fin is None else fin & fin64
            r64 = torch.where(both, r64, 0)
            r = torch.where(both, r, 0)
        n_both += r.numel() if both is None else int(both.sum())
        sq64 += _norm(r64) ** 2
        if r64.numel():
            max64 = max(max64, float(r64.abs().max()))
        r.sub_(r64)
        sq_err += _norm(r) ** 2
        if r.numel():
            err_max = max(err_max, float(r.abs_().max()))
    st = {"rms": math.sqrt(sq_r) / math.sqrt(max(n_r, 1)), "max": top}
    if ref64 is not None:
        n = max(n_both, 1)
        norm64, err = math.sqrt(sq64), math.sqrt(sq_err)
        st.update(rms64=norm64 / math.sqrt(n), err_rms=err / math.sqrt(n), err_norm=err,
                  norm64=norm64, max64=max64, lost=lost, err_max=err_max)
    return st


def compare_tensor(val: torch.Tensor, ref: torch.Tensor, ref64: torch.Tensor | None,
                   stats: dict[str, float], cfg: VerifyConfig, reduction: int = 1,
                   device=None, chunk: int = CHUNK) -> Comparison:
    """NaN where and only where the reference has NaN, the same infinities; then per element

        |v - ref| <= atol * rms(ref) + rtol * |ref|                              (task dtype), or
        |v - r64| <= atol * rms(r64) + rtol * |r64| + k * rms(ref - r64) + s * u * sqrt(N) * rms(r64)

    against the float64 reference r64 (k = ``reference_error_factor``, s = ``rounding_slack``,
    u the dtype's unit roundoff, N = ``reduction``, the task's longest reduction): an honest
    kernel that sums in another order than torch passes, an element that is wrong does not.
    Precision: the L2 error against r64 may not exceed
    max(factor x |ref - r64|, ulps x u x sqrt(N) x |r64|) (``precision[dtype]``).
    A set without r64 (a lighter memory protocol) whose ``stats`` carry ``err_rms_est`` (the
    reference error the correctness sets measured) gets the float64 bound's slack on the task
    dtype's comparison: |v - ref| <= atol * rms + rtol * |ref| + 2k * est + s * u * sqrt(N) * rms.
    Rounding outliers: an element off both bounds still passes when |v - r64| is under
    s * max(u * sqrt(N) * max|r64|, max|ref - r64|) (rounding at the scale of the output's
    largest values, which cancellation leaves on small ones: x + bias near zero, then a
    nonlinearity; or at the scale of the task-dtype reference's own worst element, where the
    output is ill-conditioned: KernelBench's SDPA on inputs up to 8, scores near 512, where an
    honest fp32 kernel summing in another order than torch's was 2.8e-3 off on 92 of 537 M
    elements) and such elements are at most ``outlier_fraction`` of the output (1e-6: none in
    an output under a million elements); a set without r64 takes the same bound on |v - ref|
    from the estimate (``err_max_est``), plus that estimate. KernelBench's
    ConvTranspose2d_Add_Min_GELU_Multiply run as its own candidate on an H200 had 4 of 277 M
    elements one float32 ulp at 1.0 off (cuDNN's algorithm in another process), the value
    itself 2e-4.
    A chunk at a time on ``device`` (default: the reference's), so the float64 temporaries
    stay bounded and the tensors may live anywhere (a host landing arena, host references).
    """
    device = device or ref.device
    n = ref.numel()
    if not is_inexact(ref):
        diff = sum(int((val.reshape(-1)[lo:hi].to(device) != ref.reshape(-1)[lo:hi].to(device))
                       .sum()) for lo, hi in _chunks(n, chunk))
        if diff == 0:
            return Comparison(True)
        return Comparison(False, f"{diff}/{n} elements differ (exact dtype "
                                 f"{str(ref.dtype).removeprefix('torch.')})", math.inf, math.inf)
    rtol, atol = tolerance(ref.dtype, cfg)
    use64 = ref64 is not None and "err_rms" in stats
    u = unit_roundoff(ref.dtype, cfg)
    root_n = math.sqrt(max(reduction, 1))
    if use64:
        slack = (cfg.reference_error_factor * stats["err_rms"]
                 + cfg.rounding_slack * u * root_n * stats["rms64"])
        add64 = atol * max(stats["rms64"], 1e-30) + slack
    # Rounding outliers: at the scale of the output's largest values, or of the task-dtype
    # reference's own worst element where that is larger (an ill-conditioned output: softmax
    # over large scores, where summing in another order moves a near-tie's weights)
    outlier_bound = (cfg.rounding_slack * max(u * root_n * stats.get("max64", 0.0),
                                              stats.get("err_max", 0.0))) if use64 else 0.0
    outliers, first_outlier = 0, None
    add = atol * max(stats.get("rms", 0.0), 1e-30)
    if not use64 and "err_rms_est" in stats:
        # No float64 reference for this set (a lighter memory protocol), its reference error
        # estimated from the correctness sets': the float64 bound's slack, plus as much again
        # for |ref - r64| itself (|v - ref| <= |v - r64| + |ref - r64|).
        add += (2 * cfg.reference_error_factor * stats["err_rms_est"]
                + cfg.rounding_slack * u * root_n * stats["rms"])
        if "err_max_est" in stats:  # the outliers' bound on |v - ref|, as on |v - r64| above
            outlier_bound = (cfg.rounding_slack * max(u * root_n * stats.get("max", 0.0),
                                                      stats["err_max_est"])
                             + stats["err_max_est"])
    nan_bad = inf_bad = bad = 0
    n_fin = 0
    first = None
    max_abs, sq_d, sq_r, sq_err = 0.0, 0.0, 0.0, 0.0
    for lo, hi in _chunks(n, chunk):
        v = _wide(val, lo, hi, device)
        r = _wide(ref, lo, hi, device)
        r64 = _wide(ref64, lo, hi, device) if use64 else None
        fin = None
        if not (_all_finite(r) and _all_finite(v)):
            if r64 is not None:
                r, v = _expected_where_the_reference_overflowed(
                    r, r64, v, ref.dtype, rtol, overflowed=stats.get("lost", 0) > 0)
            nan_r, nan_v = torch.isnan(r), torch.isnan(v)
            nan_bad += int((nan_r != nan_v).sum())
            inf_r, inf_v = torch.isinf(r), torch.isinf(v)
            if not torch.equal(inf_r, inf_v) or not torch.equal(r[inf_r], v[inf_v]):
                inf_bad += 1
            if nan_bad or inf_bad:
                continue  # counted; the values of this chunk are not judged
            # Matching NaN and infinities pass; zeroed, they count in no norm and no bound.
            fin = torch.isfinite(r)
            v = torch.where(fin, v, 0)
            r = torch.where(fin, r, 0)
            if r64 is not None:
                r64 = torch.where(fin, r64, 0)
        n_fin += r.numel() if fin is None else int(fin.sum())
        d = (v - r).abs_()
        if d.numel():
            max_abs = max(max_abs, float(d.max()))
        sq_d += _norm(d) ** 2
        sq_r += _norm(r) ** 2
        bound = r.abs_().mul_(rtol).add_(add)  # r is ours
        ok = d <= bound
        if r64 is not None:
            v.sub_(r64).abs_()  # v is ours: now |v - r64|
            torch.abs(r64, out=bound).mul_(rtol).add_(add64)
            if _all_finite(r64):
                ok |= v <= bound
                sq_err += _norm(v) ** 2
            else:
                fin64 = torch.isfinite(r64)
                ok |= (v <= bound) & fin64
                sq_err += _norm(torch.where(fin64, v, 0)) ** 2
        if not bool(ok.all()):
            nbad = ~ok
            if outlier_bound > 0:  # v is |v - r64| here; without r64, d is |v - ref|
                near = nbad & ((v if r64 is not None else d) <= outlier_bound)
                n_near = int(near.sum())
                if n_near:
                    outliers += n_near
                    nbad &= ~near
                    if first_outlier is None:
                        first_outlier = lo + int(near.nonzero()[0])
            k = int(nbad.sum())
            if k:
                bad += k
                if first is None:
                    first = lo + int(nbad.nonzero()[0])
    if nan_bad:
        return Comparison(False, f"{nan_bad} NaN mismatches (unwritten or wrong output elements)",
                          math.inf, math.inf)
    if inf_bad:
        return Comparison(False, "infinities differ from the reference", math.inf, math.inf)
    if n_fin == 0:
        return Comparison(True)
    if outliers > int(n_fin * cfg.outlier_fraction):  # too many to be rounding: all count
        bad += outliers
        first = first if first is not None else first_outlier
    rel = math.sqrt(sq_d) / (math.sqrt(sq_r) + 1e-30)
    prec_ok, prec_detail, ratio = True, "no float64 reference", 0.0
    err_rel = own_rel = -1.0
    if use64:
        err = math.sqrt(sq_err)
        factor, ulps = precision_bounds(ref.dtype, cfg)
        allowed = max(factor * stats["err_norm"], ulps * u * root_n * stats["norm64"])
        ratio = err / allowed if allowed > 0 else (0.0 if err == 0 else math.inf)
        # A rounding-level error (under 1% relative) is a precision question; a larger one is
        # a wrong result, correctness's business, not reported twice.
        prec_ok = err <= allowed or err > PRECISION_SCOPE * stats["norm64"]
        norm64 = max(stats["norm64"], 1e-300)
        err_rel, own_rel = err / norm64, stats["err_norm"] / norm64
        prec_detail = (f"error vs float64 {err / norm64:.3g} (relative L2) where the "
                       f"{str(ref.dtype).removeprefix('torch.')} reference's own is "
                       f"{stats['err_norm'] / norm64:.3g}; allowed {allowed / norm64:.3g} = "
                       f"max({factor:g} x own, {ulps:g} x u x sqrt({reduction}))")
    if bad:
        got = val.reshape(-1)[first].to(wide_dtype(ref.dtype))
        want = ref.reshape(-1)[first].to(wide_dtype(ref.dtype))
        fmt = (lambda x: f"{complex(x):.6g}") if ref.is_complex() else (lambda x: f"{float(x):.6g}")  # noqa: E731
        return Comparison(False, (
            f"{bad}/{n_fin} elements off (max |diff| {max_abs:.3g}, first at "
            f"index {first}: got {fmt(got)}, want {fmt(want)}; rtol {rtol:g}, atol {atol:g}*rms)"),
            max_abs, rel, prec_ok, prec_detail, ratio, err_rel, own_rel)
    return Comparison(True, "", max_abs, rel, prec_ok, prec_detail, ratio, err_rel, own_rel)


def _expected_where_the_reference_overflowed(r: torch.Tensor, r64: torch.Tensor,
                                             v: torch.Tensor, dtype: torch.dtype, rtol: float,
                                             overflowed: bool = False
                                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``r`` (the task-dtype reference, wide) where it is NaN or infinite and its float64 twin
    is not replaced by the float64 value in the task's dtype: the reference's own overflow (or
    a 0 x inf after it) is not what a kernel must reproduce. KernelBench's L1_90 cumprod on the
    ``large`` data (values up to 8, a running product of 32768) overflows float32 after ~80
    elements; a kernel that multiplied in float64 and stored float32 had 0 where torch's
    float32 scan had 0 x inf = NaN and was rejected for "NaN mismatches" though float64 agreed
    with it. A kernel that reproduces the reference's NaN or infinity there (the reference
    itself, in the self-check) still matches it. The replacement is ±inf where the float64 value
    is beyond the dtype's range, so a kernel must still overflow there; one within ``rtol`` of
    that float64 value (rounded to the dtype's largest finite value) is taken as it is.

    Where both references are non-finite nothing changes (a masked -inf, a NaN the task
    defines), with one exception: ``overflowed`` (the task-dtype reference lost elements to
    its range somewhere in this output, ``reference_stats``' ``lost``) and both references NaN.
    There float64 ran out of range as well (L1_90 past ~650 elements, then a zero: inf x 0),
    so no reference holds the exact value and the candidate's is not judged: it comes back NaN
    in ``v`` as in ``r``. On an H200 the synthesizer's block scan, whose partial products were
    still finite at the zero, wrote the exact 0 there and was rejected for "896 NaN
    mismatches". Returns the expected ``r`` and the ``v`` to judge against it."""
    if overflowed:
        unjudged = torch.isnan(r) & torch.isnan(r64) & ~torch.isnan(v)
        if bool(unjudged.any()):
            v = torch.where(unjudged, torch.nan, v)
    lost = ~torch.isfinite(r) & torch.isfinite(r64)
    if not bool(lost.any()):
        return r, v
    agrees = (torch.isnan(r) & torch.isnan(v)) | (torch.isinf(r) & (v == r))
    lost &= ~agrees
    expected = r64.to(dtype).to(r.dtype)
    at_the_edge = lost & ~torch.isfinite(expected) & torch.isfinite(v) \
        & ((v - r64).abs() <= rtol * r64.abs())
    return torch.where(lost, torch.where(at_the_edge, v, expected), r), v


# How much larger an output's error against float64 may be on data off bf16's grid than on the
# task's own data before it says the inputs were rounded (:func:`rounded_inputs`). The H200's
# bf16-input MSE over 8 M elements was 70-136x (docs/evidence/2026-11-29-h200-audit-precision.md);
# an fp32 kernel errs alike on both, fast-math functions a few times more on the larger data.
OFF_GRID_RATIO = 32.0


@dataclass(frozen=True)
class SetError:
    """One compared call's output against float64 (calls compared without a float64 reference
    have none): which output, the distribution its input set was drawn from, the candidate's
    and the reference's own relative L2 error, the dtype's unit roundoff, and where in the
    protocol the call was (for the verdict)."""

    output: int
    distribution: str
    err: float
    own: float
    u: float
    where: str


def rounded_inputs(errors: list[SetError]) -> tuple[list[str], str]:
    """Outputs whose error against float64 on data off bf16's grid (``off_grid`` distributions)
    is over :data:`OFF_GRID_RATIO` times the most seen on the task's own data (plain scaled
    distributions), the reference's own errors and the unit roundoff: the signature of inputs
    rounded to bf16, fp16 or TF32 before an exact computation. On the task's data such
    rounding errors are random and a long mean averages them away (a bf16-input MSE over 8 M
    elements was 5e-6 off); off the grid every element shrinks the same way and nothing
    averages (6e-4 off, under the float64 bound 4 x u x sqrt(N) = 6.9e-4 of a reduction that
    long: an H200's red team accepted it). An fp32 kernel errs alike on both: its rounding does
    not depend on where the inputs lie against bf16's grid. Errors over PRECISION_SCOPE are
    correctness's business, as in :func:`compare_tensor`.

    Returns (one line per such output, the largest ratio seen as a phrase for a passed check's
    detail, "" when no output had both kinds of data)."""

    def kind(name: str) -> str:
        d = DISTRIBUTIONS.get(name)
        if d is None:
            return ""
        return "off" if d.off_grid else "task" if not d.offset else ""

    found, most = [], (-1.0, "")
    for j in sorted({e.output for e in errors}):
        mine = [e for e in errors if e.output == j]
        off = [e for e in mine if kind(e.distribution) == "off" and e.err <= PRECISION_SCOPE]
        task = [e for e in mine if kind(e.distribution) == "task"]
        if not off or not task:
            continue
        worst = max(off, key=lambda e: e.err)
        on_task = max(e.err for e in task)
        base = max([on_task, worst.u] + [e.own for e in mine])
        ratio = worst.err / base
        if ratio > OFF_GRID_RATIO:
            found.append(
                f"{worst.where}: error vs float64 {worst.err:.3g} (relative L2) on data off "
                f"bf16's grid, {ratio:.0f}x the most on the task's own data ({on_task:.3g}) and "
                f"the reference's own ({max(e.own for e in mine):.3g}): inputs rounded to a "
                f"narrower type (an fp32 kernel errs alike on both; allowed "
                f"{OFF_GRID_RATIO:g}x)")
        if ratio > most[0]:
            most = (ratio, f"off bf16's grid at most {ratio:.2g}x the error on the task's own "
                           f"data (output {j}; allowed {OFF_GRID_RATIO:g}x)")
    return found, most[1]
