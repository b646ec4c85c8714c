"""What ran, and whether the policy allows it.

strict: the result must come from the candidate's own kernels. ATen compute ops (at the Python
level or called from C++) and library kernels (cuBLAS, cuDNN, ATen's own) are refused; only
allocation, views and copies are allowed around the custom kernels.
permissive: library calls are allowed and reported as a share of the device time, up to a
configured ceiling.
Under both policies a candidate that re-runs the reference's own compute ops (a Python-level
call of the reference, a try/except fallback to it, or ATen called from C++) is refused by
``reference_fallback``: it computed nothing of its own.
"""

from __future__ import annotations

import ast
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

# ATen ops that move or allocate memory but compute nothing a task asks for.
ALLOWED_OPS = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::zeros", "aten::zeros_like",
    "aten::zero_", "aten::fill_", "aten::full", "aten::ones", "aten::ones_like",
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::contiguous",
    "aten::clone", "aten::copy_", "aten::to", "aten::_to_copy", "aten::detach", "aten::alias",
    "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::unsqueeze",
    "aten::squeeze", "aten::flatten", "aten::select", "aten::slice", "aten::resize_",
    "aten::lift_fresh", "aten::numpy_T", "aten::unflatten", "aten::split", "aten::chunk",
    "aten::narrow", "aten::unbind", "aten::_unsafe_view", "aten::view_as", "aten::item",
    "aten::_local_scalar_dense", "aten::is_nonzero", "aten::set_", "aten::record_stream",
    "aten::resolve_conj", "aten::resolve_neg", "aten::empty_permuted", "aten::new_empty",
    "aten::new_empty_strided", "aten::new_zeros", "aten::expand_as", "aten::as_strided_",
    "aten::unfold",  # Tensor.unfold: sliding windows as a view (sizes and strides only)
}
# The audit's row for torch.compile's code (assay.verify.worker.COMPILED_MARKS): a compute op
# like ATen's, since inductor wrote what it runs (its cpu kernels are C++ no ATen op shows).
COMPILED_GRAPH = "torch.compile::graph"
# Marks of a vendor library's or ATen's device kernels.
_VENDOR = (r"\bat::|\bc10::|cublas|cudnn|cutlass|xmma|sm\d+_xmma|ampere_|volta_|turing_|"
           r"hopper_|nvjet|cusparse|cufft|curand|Memcpy|Memset|splitKreduce")
VENDOR_KERNEL = re.compile(_VENDOR, re.IGNORECASE)
# Device kernels that belong to a library rather than to the candidate: the vendors' and
# ATen's, any GEMM/GEMV, and torch.compile's (inductor's Triton kernels are all `triton_...`).
LIBRARY_KERNEL = re.compile(_VENDOR + r"|gemm|gemv|triton_", re.IGNORECASE)
# Inductor's generated kernels: `triton_<first 3 letters of the category>_<fused ops>_<n>`
# (torch/_inductor/codegen/triton.py; categories foreach, persistent_reduction, pointwise,
# reduction, split_scan, template, unknown). Never the candidate's, whatever its source says.
INDUCTOR_KERNEL = re.compile(r"^triton_(?:for|per|poi|red|spl|tem|unk)_")
# The movement kernels ATen launches for allocation/copies; allowed like their ops.
MOVEMENT_KERNEL = re.compile(r"Memcpy|Memset|copy_kernel|fill_kernel|FillFunctor", re.I)


def is_library(name: str, own: frozenset[str] = frozenset()) -> bool:
    """Whether device kernel ``name`` is a library's. ``own``: the names of the @triton.jit
    functions the candidate's file defines (:func:`triton_kernels`, read by the harness from
    the file itself). Triton names a kernel after its function, so an LLM's `triton_gelu` or
    `fused_gemm_relu` would look like inductor's or cuBLAS's; such a name is the candidate's
    when its file defines it, unless it carries a vendor's mark or inductor's form, which a
    decoy of the same name could otherwise claim (a library kernel with a plain identifier for
    a name always has one: `nvjet_...`, `sm90_xmma_gemm_...`, `ampere_sgemm_...`)."""
    if name in own and name.isidentifier() and not VENDOR_KERNEL.search(name) \
            and not INDUCTOR_KERNEL.match(name):
        return False
    return bool(LIBRARY_KERNEL.search(name))


def _jit_decorator(node: ast.expr) -> bool:
    """``@triton.jit``, ``@jit``, ``@triton.jit(...)`` (any dotted name ending in ``jit``)."""
    if isinstance(node, ast.Call):
        node = node.func
    while isinstance(node, ast.Attribute):
        if node.attr == "jit":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id == "jit"


def triton_kernels(source: str) -> frozenset[str]:
    """Names of the functions ``source`` decorates with Triton's ``jit`` (with or without
    ``autotune``/``heuristics`` above it), anywhere in the file: the kernels the candidate
    wrote. Empty for a file that does not parse (preflight rejects it before this matters)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    return frozenset(n.name for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and any(_jit_decorator(d) for d in n.decorator_list))


@dataclass
class Audit:
    ok: bool
    detail: str
    kernels: list[str] = field(default_factory=list)
    library_time_frac: float | None = None


def audit(rows: list[dict[str, Any]], device: str, policy: str,
          max_library_frac: float = 1.0, own: frozenset[str] = frozenset(),
          calls: list[list[dict[str, Any]]] | None = None) -> Audit:
    """``rows``: the timed calls' rows merged; ``calls``: each timed call's own rows, where the
    report has them (the cpu share is their median); ``own``: the candidate's @triton.jit
    kernel names (see :func:`is_library`)."""
    ops = _ops(rows)
    compute_ops = sorted({r["name"] for r in ops if r["name"] not in ALLOWED_OPS})
    if device.startswith("cuda"):
        kernels = [r for r in rows if r["kind"] == "kernel" and r["device_us"] > 0]
        names = [r["name"] for r in kernels]
        total = sum(r["device_us"] for r in kernels)
        lib = sum(r["device_us"] for r in kernels if is_library(r["name"], own)
                  and not MOVEMENT_KERNEL.search(r["name"]))
        lib_frac = lib / total if total > 0 else 0.0
        custom = [r for r in kernels if not is_library(r["name"], own)]
        if not custom and not compute_ops:
            return Audit(False, "no custom kernel ran on the device", names, lib_frac)
    else:
        # ATen ops, and the Triton kernels Triton's interpreter ran (rows of kind
        # "interpreted", named triton::<kernel>: see assay.verify.worker.mark_interpreted_triton)
        interpreted = [r for r in rows if r.get("kind") == "interpreted"]
        names = sorted({r["name"] for r in ops + interpreted})
        # Host time, which a preemption inflates: summed over ~100 calls, one preempted 1 us
        # aten::to turned a library share of 0.96 into 0.17 beside another process. The median
        # of the calls' shares is not swayed by one call (calls that compute differently are
        # audit_consistency's to reject).
        shares = [f for f in map(_cpu_library_share, calls or []) if f is not None]
        lib_frac = statistics.median(shares) if shares else (_cpu_library_share(rows) or 0.0)
    if policy == "strict":
        if compute_ops:
            return Audit(False, f"library compute under the strict policy: "
                                f"{', '.join(compute_ops[:8])}", names, lib_frac)
        if device.startswith("cuda") and lib_frac > 0:
            lib_names = sorted({n for n in names if is_library(n, own)
                                and not MOVEMENT_KERNEL.search(n)})
            return Audit(False, f"library kernels under the strict policy: "
                                f"{', '.join(lib_names[:5])}", names, lib_frac)
        return Audit(True, "", names, lib_frac)
    if policy == "permissive":
        if lib_frac > max_library_frac:
            return Audit(False, f"library share {lib_frac:.0%} over the allowed "
                                f"{max_library_frac:.0%}", names, lib_frac)
        return Audit(True, f"library share {lib_frac:.0%}", names, lib_frac)
    return Audit(False, f"unknown policy {policy!r} (strict or permissive)", names, lib_frac)


def _ops(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ATen ops and of calls of torch.compile's code (the audit's "ops")."""
    return [r for r in rows if r["name"].startswith("aten::") or r["name"] == COMPILED_GRAPH]


def _cpu_library_share(rows: list[dict[str, Any]]) -> float | None:
    """The share of host time in ATen compute ops among the ATen ops and interpreted Triton
    kernels of ``rows`` (None where they took no time)."""
    ops = _ops(rows)
    total = sum(r["cpu_us"] for r in ops + [r for r in rows if r.get("kind") == "interpreted"])
    lib = sum(r["cpu_us"] for r in ops if r["name"] not in ALLOWED_OPS)
    return lib / total if total > 0 else None


def profile_rows(rows: list[dict[str, Any]], device: str,
                 limit: int = 200) -> list[dict[str, Any]]:
    """The audit's rows as a profile for people (the verdict's ``kernel_profile``, the profile
    step's torch-profiler table, whose shares are of these rows' total): the ``limit`` busiest
    on the device's clock (device time on cuda, host time on cpu), names cut at 200
    characters. Read from the worker's report like the audit itself: a table to read, never
    part of a decision."""
    key = "device_us" if device.startswith("cuda") else "cpu_us"
    out = [{"name": str(r["name"])[:200], "kind": str(r.get("kind", "")),
            "count": int(r["count"]), "device_us": float(r["device_us"]),
            "cpu_us": float(r["cpu_us"])} for r in rows]
    return sorted(out, key=lambda r: -r[key])[:limit]


def compute_ops(rows: list[dict[str, Any]]) -> set[str]:
    """ATen ops in a profile that compute something (not allocation, views or copies)."""
    return {r["name"] for r in rows
            if isinstance(r.get("name"), str) and r["name"].startswith("aten::")
            and r["name"] not in ALLOWED_OPS}


def reference_fallback(rows: list[dict[str, Any]], reference_ops: list[str]) -> tuple[bool, str]:
    """Refuse a call whose ATen compute ops include every compute op of the reference's own
    forward: the candidate ran the reference (directly, as a fallback, or from C++)."""
    ref = set(reference_ops)
    if not ref:
        return True, "the reference runs no ATen compute op"
    ran = compute_ops(rows)
    if ref <= ran:
        return False, (f"the candidate ran the reference's own ops ({', '.join(sorted(ref)[:6])}): "
                       f"a call or fallback to the reference, not a kernel of its own")
    return True, ""


def call_signature(rows: list[dict[str, Any]], device: str) -> tuple[str, ...]:
    """What one call computed with: its ATen compute ops, the Triton kernels Triton's
    interpreter ran (cpu), and on cuda the device kernels that are not memory movement. Two
    calls of one implementation have the same signature."""
    names = {r["name"] for r in rows if (r["name"].startswith("aten::")
                                         and r["name"] not in ALLOWED_OPS)
             or r.get("kind") == "interpreted"}
    if device.startswith("cuda"):
        names |= {r["name"] for r in rows if r["kind"] == "kernel"
                  and not MOVEMENT_KERNEL.search(r["name"])}
    return tuple(sorted(names))


# Timed calls that got an independent verified set and those that did not: their median device
# time may differ by this factor at most (same shapes, same kernels: only noise separates them).
TIMED_DEVICE_TIME_RATIO = 2.0
# At most one call in this many may lack one kernel record the other calls have (cuda): a record
# the device trace dropped, not a different implementation (see audit_consistency).
LOST_RECORD_SHARE = 100


def audit_consistency(audit_info: dict[str, Any], device: str) -> tuple[bool, str]:
    """The kernel audit covers every timed call, and the timed calls agree with each other.

    Refused: a trace that lost calls (the candidate stopped or restarted the profiler), timed
    calls that computed with different ops or kernels (an implementation chosen per call: by
    whether it is observed, a call counter, the caller's stack, time between calls), and on
    cuda verified timed calls whose device time is not that of the other timed calls. On cuda,
    up to 1% of the calls (``LOST_RECORD_SHARE``) may each lack one device kernel the others ran
    and differ in nothing else: a record the device trace dropped.
    """
    if "error" in audit_info:
        return False, str(audit_info["error"])
    expected, found = audit_info.get("expected", 0), audit_info.get("found", 0)
    if expected != found or "calls" not in audit_info:
        return False, (f"{expected} calls made, {found} found in the audit's trace: the "
                       f"profiler was stopped, restarted or fed ranges while the candidate ran")
    calls = audit_info["calls"]
    if not calls:
        return False, "no timed call was audited"
    groups: dict[tuple[str, ...], int] = {}
    for c in calls:
        sig = call_signature(c["rows"], device)
        groups[sig] = groups.get(sig, 0) + 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1])
    common = set(ranked[0][0])
    short = sum(n for sig, n in ranked[1:])
    # CUPTI drops an activity record now and then under load (on an H100, one kernel of the
    # ~10,000 that 200 calls of a 35-kernel ViT block launched: that call's signature lacked
    # it). A call that lacks one device kernel the others ran, and differs in nothing else, in
    # at most 1% of the calls, cannot move the median that is reported. A call that ran
    # anything the others did not, or lacks an ATen op (the host's records) or more than one
    # kernel, never passes.
    lost = device.startswith("cuda") and len(ranked) > 1 \
        and short <= len(calls) // LOST_RECORD_SHARE \
        and all(set(sig) <= common and len(gone := common - set(sig)) == 1
                and not next(iter(gone)).startswith("aten::") for sig, _ in ranked[1:])
    if len(groups) > 1 and not lost:
        parts = [f"{ranked[0][1]} ran {', '.join(ranked[0][0][:4]) or 'nothing that computes'}"]
        for sig, n in ranked[1:4]:
            extra, missing = sorted(set(sig) - common), sorted(common - set(sig))
            parts.append(f"{n} ran " + ", ".join(
                [f"also {', '.join(extra[:3])}"] * bool(extra)
                + [f"without {', '.join(missing[:3])}"] * bool(missing)))
        return False, f"the {len(calls)} timed calls did not all run the same code: " + \
            "; ".join(parts)
    if device.startswith("cuda"):
        def median(xs: list[float]) -> float:
            xs = sorted(xs)
            return xs[len(xs) // 2] if xs else 0.0

        dev = {p: [sum(r["device_us"] for r in c["rows"] if r["kind"] == "kernel")
                   for c in calls if c["phase"] == p] for p in ("timed", "timed_verified")}
        a, b = median(dev["timed"]), median(dev["timed_verified"])
        if a > 0 and b > 0 and max(a, b) / min(a, b) > TIMED_DEVICE_TIME_RATIO:
            return False, (f"verified timed calls took {b:.1f} us of device time, the others "
                           f"{a:.1f} us: not the same work")
    if lost:
        return True, (f"{len(calls)} timed calls audited, all running the same code ({short} "
                      f"lacking one kernel record of the others': records the trace dropped)")
    return True, f"{len(calls)} timed calls audited, all running the same code"
