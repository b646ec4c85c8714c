"""What every kernel family shares: the Jinja environment, the head of every C++ and CUDA file
(includes, scalar helpers), the scalar formulas, how a plan's nodes are scheduled and named in
C, and the kernel parameters that drive the C signature, the ctypes argtypes and the call.

Templates live in Python modules rather than ``*.j2`` files so that a wheel of ``assay``
carries them without package-data configuration. Statement bodies (the fused formulas, the
accumulators) are built in Python and passed in as lists of lines; each family's templates own
the loop and launch structure, which is what the knobs change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jinja2

from assay.propose.offline.ir import Leaf, Plan

_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True,
                          lstrip_blocks=True, keep_trailing_newline=True,
                          autoescape=False)  # noqa: S701 - C and Python source, not HTML


def render(text: str, /, **values: object) -> str:
    return _ENV.from_string(text).render(**values)


# ---------------------------------------------------------------------------------------------
# Scalar helpers shared by both languages. ASSAY_FN is `static inline` on the host and
# `__device__ __forceinline__` under CUDA. Comparisons are written so that NaN propagates the
# way torch's kernels propagate it (relu(NaN) = NaN, max(NaN, x) = NaN, clamp(NaN) = NaN).

HELPERS = r"""
ASSAY_FN float assay_max2(float a, float b) { return (a != a || a > b) ? a : b; }
ASSAY_FN float assay_min2(float a, float b) { return (a != a || a < b) ? a : b; }
ASSAY_FN float assay_clamp(float x, float lo, float hi) {
  const float t = x < lo ? lo : x;
  return t > hi ? hi : t;  // lo > hi gives hi, as torch.clamp does
}
ASSAY_FN float assay_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
ASSAY_FN float assay_silu(float x) { return x / (1.0f + expf(-x)); }
ASSAY_FN float assay_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
ASSAY_FN float assay_gelu_tanh(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}
ASSAY_FN float assay_leaky_relu(float x, float slope) { return x > 0.0f ? x : x * slope; }
ASSAY_FN float assay_elu(float x, float alpha) { return x > 0.0f ? x : alpha * expm1f(x); }
ASSAY_FN float assay_selu(float x) {
  return 1.05070098735548049f * (x > 0.0f ? x : 1.67326324235437729f * expm1f(x));
}
ASSAY_FN float assay_softplus(float x, float beta, float threshold) {
  return x * beta > threshold ? x : log1pf(expf(x * beta)) / beta;
}
ASSAY_FN float assay_mish(float x) { return x * tanhf(log1pf(expf(x))); }
ASSAY_FN float assay_hardsigmoid(float x) { return assay_clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f; }
ASSAY_FN float assay_hardswish(float x) { return x * assay_clamp(x + 3.0f, 0.0f, 6.0f) / 6.0f; }
// The losses' per-element terms as ATen writes them (z = |input - target|).
ASSAY_FN float assay_smooth_l1(float z, float beta) {
  return z < beta ? 0.5f * z * z / beta : z - 0.5f * beta;
}
ASSAY_FN float assay_huber(float z, float delta) {
  return z < delta ? 0.5f * z * z : delta * (z - 0.5f * delta);
}
ASSAY_FN float assay_xlogy(float x, float y) {
  return y != y ? y : (x == 0.0f ? 0.0f : x * logf(y));
}

// A broadcast operand's index, (i / inner) % mid, per element: a 64-bit division is a long
// software sequence on a GPU, so below 2^31 it is a multiply-high and a shift by a divider
// set up once per thread (Granlund-Montgomery, the method of PyTorch's IntDivider).
struct AssayDivider {
  uint32_t d, m, s;  // n / d == (mulhi(n, m) + n) >> s for 0 <= n < 2^31, 1 <= d < 2^31
};
ASSAY_FN AssayDivider assay_divider(int64_t d) {
  AssayDivider r;
  r.d = (uint32_t)d;
  r.s = 0;
  while (r.s < 31 && ((int64_t)1 << r.s) < d) ++r.s;
  r.m = (uint32_t)(((((uint64_t)1 << r.s) - (uint64_t)d) << 32) / (uint64_t)d + 1);
  return r;
}
ASSAY_FN uint32_t assay_div(uint32_t n, AssayDivider v) {
  return ((uint32_t)(((uint64_t)n * v.m) >> 32) + n) >> v.s;
}
struct AssayBcast {
  AssayDivider inner, mid;
  bool fast;  // inner and mid in [1, 2^31)
};
ASSAY_FN AssayBcast assay_bcast(int64_t inner, int64_t mid) {
  AssayBcast b;
  b.fast = inner >= 1 && mid >= 1 && inner < ((int64_t)1 << 31) && mid < ((int64_t)1 << 31);
  b.inner = assay_divider(b.fast ? inner : 1);
  b.mid = assay_divider(b.fast ? mid : 1);
  return b;
}
ASSAY_FN int64_t assay_bidx(int64_t i, int64_t inner, int64_t mid, const AssayBcast b) {
  if (b.fast && i >= 0 && i < ((int64_t)1 << 31)) {
    const uint32_t q = assay_div((uint32_t)i, b.inner);
    return (int64_t)(q - assay_div(q, b.mid) * b.mid.d);
  }
  return (i / inner) % mid;
}
ASSAY_FN int64_t assay_bmod(int64_t i, int64_t mid, const AssayBcast b) {
  if (b.fast && i >= 0 && i < ((int64_t)1 << 31)) {
    return (int64_t)((uint32_t)i - assay_div((uint32_t)i, b.mid) * b.mid.d);
  }
  return i % mid;
}
"""

# ---------------------------------------------------------------------------------------------
# C++ (cpu target): OpenMP threads over chunks or rows, `omp simd` inner loops.

# The head of every C++ source: includes, the helpers, a thread count within OpenMP's.
CPP_PREAMBLE = r"""// Assay offline synthesizer v1: {{ template }} kernel (cpu, C++/OpenMP)
// computes: {{ summary }}
// knobs: {{ knob_line }}
#include <math.h>
#include <stdint.h>
#include <algorithm>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(ASSAY_LIBMVEC) && defined(_OPENMP)
// glibc's vector math (libmvec, linked by assay.bench.build where present): `omp simd` loops
// call 4/8/16-lane exp, log, erf, tanh, ... (within 4 ulp) instead of one scalar libm call per
// element, which made GELU 7x and tanh 8x slower than ATen's vectorized math. glibc declares
// these itself only under -ffast-math, which the kernels must not use (NaN and rounding).
#pragma omp declare simd notinbranch
extern "C" float expf(float);
#pragma omp declare simd notinbranch
extern "C" float logf(float);
#if __GLIBC_PREREQ(2, 35)
#pragma omp declare simd notinbranch
extern "C" float erff(float);
#pragma omp declare simd notinbranch
extern "C" float tanhf(float);
#pragma omp declare simd notinbranch
extern "C" float expm1f(float);
#pragma omp declare simd notinbranch
extern "C" float log1pf(float);
#endif
#endif

#define ASSAY_FN static inline
{{ helpers }}
static inline int assay_threads(int wanted) {
#ifdef _OPENMP
  return std::max(1, std::min(wanted, omp_get_max_threads()));
#else
  return 1;
#endif
}
"""

# The C++ entry point of an elementwise or row kernel: the family's loops go between the two.
CPP_FORWARD_OPEN = CPP_PREAMBLE + r"""
extern "C" int assay_forward({{ params }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}"""

CPP_FORWARD_CLOSE = r"""
  return 0;
}
"""

# ---------------------------------------------------------------------------------------------
# CUDA (cuda target). Exact-math functions (expf, erff, tanhf; no --use_fast_math) so fp32
# results match torch within about 1e-6 relative.

CUDA_COMMON = r"""// Assay offline synthesizer v1: {{ template }} kernel (cuda)
// computes: {{ summary }}
// knobs: {{ knob_line }}
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define ASSAY_FN __device__ __forceinline__
{{ helpers }}
// Vector loads/stores of VEC consecutive floats (16-byte float4 for VEC == 4); the host only
// picks VEC > 1 when every vector-accessed pointer is aligned to 4 * VEC bytes.
template <int VEC>
__device__ __forceinline__ void assay_load(const float* __restrict__ p, int64_t i, float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p + i);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
  } else if constexpr (VEC == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p + i);
    v[0] = t.x; v[1] = t.y;
  } else {
    v[0] = p[i];
  }
}

template <int VEC>
__device__ __forceinline__ void assay_store(float* __restrict__ p, int64_t i, const float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (VEC == 2) {
    *reinterpret_cast<float2*>(p + i) = make_float2(v[0], v[1]);
  } else {
    p[i] = v[0];
  }
}

template <int VEC>
__device__ __forceinline__ void assay_copy(float (&d)[VEC], const float (&s)[VEC]) {
  #pragma unroll
  for (int u = 0; u < VEC; ++u) d[u] = s[u];
}

// Stores to global memory (the output) go through the intrinsic: a plain float4 assignment was
// split by nvcc 13 into four scalar stores in unrolled loops, and scattered 4-byte writes cost
// an H200 a read-modify-write per sector (ncu: L2 throughput 95%, DRAM 44% for a LogSoftmax row
// kernel, 239 us against 145 us). Not for shared memory: st.global faults there.
template <int VEC>
__device__ __forceinline__ void assay_store_out(float* __restrict__ p, int64_t i, const float (&v)[VEC]) {
  if constexpr (VEC == 4) {
    __stwb(reinterpret_cast<float4*>(p + i), make_float4(v[0], v[1], v[2], v[3]));
  } else if constexpr (VEC == 2) {
    __stwb(reinterpret_cast<float2*>(p + i), make_float2(v[0], v[1]));
  } else {
    p[i] = v[0];
  }
}

static inline bool assay_aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

// A device attribute, cached per device: cudaDeviceGetAttribute is cheap but not free on
// every launch. ``fallback`` when the device or the attribute cannot be read.
template <cudaDeviceAttr ATTR>
static inline int assay_device_attr(int fallback) {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return fallback;
  if (cache[dev] == 0) {
    int v = 0;
    cudaDeviceGetAttribute(&v, ATTR, dev);
    cache[dev] = v > 0 ? v : fallback;
  }
  return cache[dev];
}
static inline int assay_sm_count() {
  return assay_device_attr<cudaDevAttrMultiProcessorCount>(132);
}
// Dynamic shared memory a block may opt in to (above the default 48 KB).
static inline int assay_smem_optin() {
  return assay_device_attr<cudaDevAttrMaxSharedMemoryPerBlockOptin>(48 * 1024);
}
// Thread-block clusters: sm_90 and later.
static inline bool assay_has_clusters() {
  return assay_device_attr<cudaDevAttrComputeCapabilityMajor>(1) >= 9;
}

extern "C" const char* assay_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
"""


# The reductions of the CUDA row and total kernels: their types, identities and warp step.
CUDA_REDUCE_OPS = r"""// Sums accumulate in double: each thread adds cols / threads values in sequence, and a float
// running sum over a long row drifts past 1e-5 of torch's (pairwise) result when values cancel.
// A vector's VEC terms are added in float first, so that a double conversion and addition is
// paid once per vector rather than per element (the GroupNorm row kernel is not memory-bound).
struct AssaySum {
  using T = double;
  __device__ static T id() { return 0.0; }
  __device__ static T op(T a, T b) { return a + b; }
};
struct AssayMax {
  using T = float;
  __device__ static T id() { return -INFINITY; }
  __device__ static T op(T a, T b) { return assay_max2(a, b); }
};
struct AssayMin {
  using T = float;
  __device__ static T id() { return INFINITY; }
  __device__ static T op(T a, T b) { return assay_min2(a, b); }
};

template <class Op>
__device__ __forceinline__ typename Op::T assay_warp_reduce(typename Op::T v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = Op::op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

"""

# ----------------------------------------------------------------------------------------------
# Scalar formulas (C syntax shared by C++ and CUDA)


def c_float(v: float) -> str:
    """A float literal that round-trips float32 (9 significant digits)."""
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    s = f"{v:.9g}"
    if not any(ch in s for ch in ".en"):
        s += ".0"
    return f"{s}f" if not s.startswith("-") else f"({s}f)"


def _pow_const(x: str, e: float) -> str:
    # The same special cases as torch's pow(tensor, scalar) kernel, so rounding matches.
    table = {2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})", 1.0: x, 0.0: "1.0f",
             0.5: f"sqrtf({x})", -0.5: f"(1.0f / sqrtf({x}))", -1.0: f"(1.0f / {x})",
             -2.0: f"(1.0f / ({x} * {x}))"}
    return table.get(e, f"powf({x}, {c_float(e)})")


def _clamp(a: list[str], at: dict[str, Any]) -> str:
    x = a[0]
    lo, hi = at.get("lo"), at.get("hi")
    if lo is not None and hi is not None:
        return f"assay_clamp({x}, {c_float(lo)}, {c_float(hi)})"
    if lo is not None:
        return f"({x} < {c_float(lo)} ? {c_float(lo)} : {x})"
    return f"({x} > {c_float(hi)} ? {c_float(hi)} : {x})"


Formula = Callable[[list[str], dict[str, Any]], str]

FORMULAS: dict[str, Formula] = {
    "add": lambda a, at: f"({a[0]} + {a[1]})",
    "sub": lambda a, at: f"({a[0]} - {a[1]})",
    "mul": lambda a, at: f"({a[0]} * {a[1]})",
    "div": lambda a, at: f"({a[0]} / {a[1]})",
    "neg": lambda a, at: f"(-{a[0]})",
    "keep": lambda a, at: a[0],
    "relu": lambda a, at: f"({a[0]} < 0.0f ? 0.0f : {a[0]})",
    "relu6": lambda a, at: f"assay_clamp({a[0]}, 0.0f, 6.0f)",
    "sigmoid": lambda a, at: f"assay_sigmoid({a[0]})",
    "tanh": lambda a, at: f"tanhf({a[0]})",
    "exp": lambda a, at: f"expf({a[0]})",
    "log": lambda a, at: f"logf({a[0]})",
    "abs": lambda a, at: f"fabsf({a[0]})",
    "sqrt": lambda a, at: f"sqrtf({a[0]})",
    "rsqrt": lambda a, at: f"(1.0f / sqrtf({a[0]}))",
    "erf": lambda a, at: f"erff({a[0]})",
    "sin": lambda a, at: f"sinf({a[0]})",
    "cos": lambda a, at: f"cosf({a[0]})",
    "log1p": lambda a, at: f"log1pf({a[0]})",
    "expm1": lambda a, at: f"expm1f({a[0]})",
    "reciprocal": lambda a, at: f"(1.0f / {a[0]})",
    "square": lambda a, at: f"({a[0]} * {a[0]})",
    "gelu_erf": lambda a, at: f"assay_gelu_erf({a[0]})",
    "gelu_tanh": lambda a, at: f"assay_gelu_tanh({a[0]})",
    "silu": lambda a, at: f"assay_silu({a[0]})",
    "mish": lambda a, at: f"assay_mish({a[0]})",
    "elu": lambda a, at: f"assay_elu({a[0]}, {c_float(at['alpha'])})",
    "selu": lambda a, at: f"assay_selu({a[0]})",
    "softplus": lambda a, at: (f"assay_softplus({a[0]}, {c_float(at['beta'])}, "
                               f"{c_float(at['threshold'])})"),
    "softsign": lambda a, at: f"({a[0]} / (1.0f + fabsf({a[0]})))",
    "hardsigmoid": lambda a, at: f"assay_hardsigmoid({a[0]})",
    "hardswish": lambda a, at: f"assay_hardswish({a[0]})",
    "leaky_relu": lambda a, at: f"assay_leaky_relu({a[0]}, {c_float(at['slope'])})",
    "clamp": _clamp,
    "max2": lambda a, at: f"assay_max2({a[0]}, {a[1]})",
    "min2": lambda a, at: f"assay_min2({a[0]}, {a[1]})",
    "pow": lambda a, at: f"powf({a[0]}, {a[1]})",
    "pow_const": lambda a, at: _pow_const(a[0], at["exponent"]),
    "rpow_const": lambda a, at: f"powf({c_float(at['base'])}, {a[0]})",
    "smooth_l1": lambda a, at: f"assay_smooth_l1({a[0]}, {c_float(at['beta'])})",
    "huber": lambda a, at: f"assay_huber({a[0]}, {c_float(at['delta'])})",
    "xlogy": lambda a, at: f"assay_xlogy({a[0]}, {a[1]})",
    # The size of dim ``dim`` of S: a kernel parameter (only the total family passes it).
    "size": lambda a, at: f"(float)size{at['dim']}",
    # triu/tril: column minus row of the element's flat index ``i`` in S (S's last two dims,
    # tri_m x tri_n: kernel parameters, see leaf_params) against the diagonal; the elements
    # outside the triangle are ``fill`` (0, or a masked_fill's value: graph.triangle_fill)
    "tri": lambda a, at: (f"((i % tri_n) - ((i / tri_n) % tri_m) "
                          f"{'>=' if at['upper'] else '<='} (int64_t){at['diagonal']} "
                          f"? {a[0]} : {c_float(at.get('fill', 0.0))})"),
}


# ----------------------------------------------------------------------------------------------
# How each leaf is indexed, per template


def leaf_kind(plan: Plan, k: int) -> str:
    """How the kernel indexes leaf ``k`` (see ir.Leaf for the block convention).

    elementwise: full ``[i]``, scalar ``[0]``, mod ``[i % mid]``, general
    ``[(i / inner) % mid]``, general2 (a leaf of two blocks: each block's index so, the first
    times the second's size); row plans add col ``[c]`` (a weight over the whole row), colmod
    ``[c % mid]`` and rowconst (one value per row, loaded once per row); rows of channel groups
    use mod and general for what varies within the row.
    """
    lf = plan.leaves[k]
    if lf.bcast in ("full", "scalar"):
        return lf.bcast
    if lf.bcast == "block2":  # elementwise plans only (graph._finish)
        return "general2"
    nd = plan.ndim
    if plan.kind == "row":
        first_col = nd - plan.k
        if plan.groups and lf.b >= first_col:
            # A row is one group of the trailing dims (GroupNorm of (N, C): C / G columns), so
            # a column is not a position along them: index by the element, i = base + c.
            return "mod" if lf.b == nd - 1 else "general"
        if lf.b == nd - 1 and lf.a == first_col:
            return "col"
        if lf.b == nd - 1 and lf.a > first_col:
            return "colmod"
        if lf.b < first_col:
            return "rowconst"
        return "general"
    return "mod" if lf.b == nd - 1 else "general"


def _access(kind: str, k: int) -> str:
    return {
        "full": f"t{k}[i]",
        "scalar": f"t{k}[0]",
        "mod": f"t{k}[assay_bmod(i, mid{k}, bc{k})]",
        "general": f"t{k}[assay_bidx(i, inner{k}, mid{k}, bc{k})]",
        "general2": f"t{k}[assay_bidx(i, inner{k}, mid{k}, bc{k}) * mid2_{k}"
                    f" + assay_bidx(i, inner2_{k}, mid2_{k}, bc2_{k})]",
        "col": f"t{k}[c]",
        "colmod": f"t{k}[assay_bmod(c, mid{k}, bc{k})]",
        # inner is a multiple of cols here, so (base + c) / inner == base / inner.
        "rowconst": f"t{k}[(base / inner{k}) % mid{k}]",
    }[kind]


# ----------------------------------------------------------------------------------------------
# Scheduling and emission of the formula DAG


@dataclass
class Schedule:
    """Where each node is computed: prologue (uniform), row prologue, a pass, or after one."""

    plan: Plan
    kinds: list[str]
    avail: list[int] = field(default_factory=list)  # passes completed before a value exists
    passes: int = 0  # reduction passes

    def __post_init__(self) -> None:
        for n in self.plan.nodes:
            if n.op.startswith("reduce_"):
                p = self.avail[n.args[0]]
                self.avail.append(p + 1)
                self.passes = max(self.passes, p + 1)
            elif n.args:
                self.avail.append(max(self.avail[a] for a in n.args))
            else:
                self.avail.append(0)

    def where(self, j: int) -> str:
        n = self.plan.nodes[j]
        if n.op == "const":
            return "inline"
        if n.op == "load" and self.kinds[n.attr("leaf")] == "rowconst":
            return "row"
        if n.cls == "uniform":
            return "prologue"
        if n.cls == "row":
            return "after"
        return "elem"

    def reduce_pass(self, j: int) -> int:
        return self.avail[j] - 1


# Broadcast leaves whose index a vectorized CUDA kernel computes once per vector (``q{k}``,
# set up by vector_index), and how one lane's value follows from it: a general leaf has one
# value for the whole vector (``h{k}``, loaded once), a mod leaf consecutive ones.
_HOISTED = {"general": "h{k}", "mod": "t{k}[q{k} + u]", "colmod": "t{k}[q{k} + u]"}


def vector_index(kinds: list[str], leaves: list[int], first: str) -> list[str]:
    """Per-vector index lines for the broadcast ``leaves`` of a pass: when the vector's VEC
    elements (``first`` is the flat index, ``c0`` the column, of the first, a multiple of VEC)
    cannot cross a block of the broadcast (bv{k}, set in the prologue), one division serves
    them all."""
    lines = []
    for k in leaves:
        if kinds[k] == "general":
            at = f"assay_bidx({first}, inner{k}, mid{k}, bc{k})"
        elif kinds[k] in ("mod", "colmod"):
            at = f"assay_bmod({'c0' if kinds[k] == 'colmod' else first}, mid{k}, bc{k})"
        else:
            continue
        lines.append(f"const int64_t q{k} = bv{k} ? {at} : 0;")
        if kinds[k] == "general":
            lines.append(f"const float h{k} = bv{k} ? t{k}[q{k}] : 0.0f;")
    return lines


def vector_conditions(plan: Plan, kinds: list[str]) -> dict[int, str]:
    """Per broadcast leaf: whether a vector of VEC elements stays within one of its blocks (its
    index then changes by 0 (general) or 1 (mod) per element)."""
    return {k: f"{'inner' if kinds[k] == 'general' else 'mid'}{k} % VEC == 0"
            for k in range(len(plan.leaves)) if kinds[k] in _HOISTED}


def vector_flags(plan: Plan, kinds: list[str], known: str = "") -> list[str]:
    """Kernel-prologue flags ``bv{k}`` (see vector_conditions); ``known``: a compile-time
    condition under which the host has checked them all (the per-element paths then vanish)."""
    return [f"const bool bv{k} = {known + ' || ' if known else ''}{cond};"
            for k, cond in vector_conditions(plan, kinds).items()]


def vector_uniform(plan: Plan, sched: "Schedule", elems: list[int]) -> tuple[list[int], list[int]]:
    """The per-element nodes among ``elems`` whose value is one for a whole vector wherever
    their broadcast leaves' ``bv`` flags hold: loads of general leaves (``h{k}``), and what
    those and constants alone compute (BatchNorm's ``rsqrt(running_var + eps)``); and those
    leaves. A vectorized kernel computes them once per vector there, not once per element:
    on an H200 KernelBench's L1_33 BatchNorm ran at 39% of the bandwidth roofline, its square
    root and division done for every element of a channel. Empty where no op of such leaves
    is among them."""
    uniform: set[int] = set()
    for j in elems:
        n = plan.nodes[j]
        if n.op == "load":
            if sched.kinds[n.attr("leaf")] == "general":
                uniform.add(j)
        elif n.op not in ("const", "cols") and n.args and all(
                a in uniform or plan.nodes[a].op == "const" for a in n.args):
            uniform.add(j)
    nodes = sorted(uniform)
    leaves = leaves_of(plan, [j for j in nodes if plan.nodes[j].op == "load"])
    if not leaves or all(plan.nodes[j].op == "load" for j in nodes):
        return [], []
    return nodes, leaves


class Names:
    """C names of node values in a given emission context; ``hoisted``: a vectorized CUDA
    kernel's per-vector broadcast indices are available (see vector_index)."""

    def __init__(self, plan: Plan, sched: Schedule, vector: set[int] | None = None,
                 hoisted: bool = False):
        self.plan, self.sched, self.vector = plan, sched, vector or set()
        self.hoisted = hoisted

    def __call__(self, j: int) -> str:
        n = self.plan.nodes[j]
        if n.op == "const":
            return c_float(n.attr("value"))
        if n.op == "cols":
            return "fcols"
        return f"v{j}"

    def define(self, j: int, uniform: bool = False) -> str:
        """The statement computing node ``j`` (loads pick their indexing here); ``uniform``: a
        load of a general leaf as its one value for the vector (:func:`vector_uniform`)."""
        n = self.plan.nodes[j]
        if n.op == "load":
            k = n.attr("leaf")
            if uniform:
                return f"const float v{j} = h{k};"
            if k in self.vector:
                return f"const float v{j} = a{k}[u];"
            kind = self.sched.kinds[k]
            if self.hoisted and kind in _HOISTED:
                lane = _HOISTED[kind].format(k=k)
                return f"const float v{j} = bv{k} ? {lane} : {_access(kind, k)};"
            return f"const float v{j} = {_access(kind, k)};"
        formula = FORMULAS[n.op]([self(a) for a in n.args], dict(n.attrs))
        return f"const float v{j} = {formula};"


def after_pass(plan: Plan, sched: Schedule, p: int) -> list[str]:
    """Row values that become available once pass ``p`` is done (not the reductions)."""
    names = Names(plan, sched)
    return [names.define(j) for j, n in enumerate(plan.nodes)
            if sched.where(j) == "after" and not n.op.startswith("reduce_")
            and sched.avail[j] == p + 1]


def elem_closure(plan: Plan, sched: Schedule, targets: list[int],
                  stops: frozenset[int] = frozenset()) -> list[int]:
    """The per-element nodes needed for ``targets``, in topological (index) order; the
    arguments of ``stops`` (values that are at hand otherwise) are not followed."""
    need: set[int] = set()
    stack = list(targets)
    while stack:
        j = stack.pop()
        if j in need or sched.where(j) != "elem":
            continue
        need.add(j)
        if j not in stops:
            stack.extend(plan.nodes[j].args)
    return sorted(need)


def leaves_of(plan: Plan, nodes: list[int]) -> list[int]:
    return sorted({plan.nodes[j].attr("leaf") for j in nodes if plan.nodes[j].op == "load"})


# ----------------------------------------------------------------------------------------------
# Kernel parameters: one list drives the C signature, the ctypes argtypes and the call.


@dataclass(frozen=True)
class Param:
    ctype: str
    name: str
    py: str  # the Python expression passed for it
    ctypes_type: str


def pointer(target: str, name: str, py: str, elt: str = "float", const: bool = True
             ) -> Param:
    """A non-aliasing pointer parameter of the kernel entry point, ``py`` its Python value."""
    restrict = "__restrict__" if target == "cuda" else "__restrict"
    return Param(f"{'const ' if const else ''}{elt}* {restrict}", name, py, "ctypes.c_void_p")


def leaf_params(plan: Plan, target: str, skip: int = -1, elt: str = "float"
                 ) -> tuple[list[Param], list[Param]]:
    """The leaves' pointers (``t<k>``; a bool mask's are ``bool*``) and the block-broadcast
    leaves' geometry (``inner<k>``, ``mid<k>``; a second block's ``inner2_<k>``, ``mid2_<k>``),
    leaf ``skip`` left out (a head op's result
    that the kernel gets otherwise)."""
    ptrs = [pointer(target, f"t{k}", f"l{k}.data_ptr()", lf.dtype or elt)
            for k, lf in enumerate(plan.leaves) if k != skip]
    geometry = []
    for k, lf in enumerate(plan.leaves):
        if k == skip:
            continue
        for name in geometry_names(lf, k):
            geometry.append(Param("int64_t", name, name, "ctypes.c_int64"))
    if any(n.op == "tri" for n in plan.nodes):  # S's last two dims, for the triangle masks
        geometry += [Param("int64_t", "tri_m", "shape[-2]", "ctypes.c_int64"),
                     Param("int64_t", "tri_n", "shape[-1]", "ctypes.c_int64")]
    return ptrs, geometry


def geometry_names(lf: Leaf, k: int) -> list[str]:
    """The names of leaf ``k``'s broadcast geometry (see ir.Leaf), as the candidate computes
    them (candidate._forward_lines) and the kernel takes them."""
    one = [f"inner{k}", f"mid{k}"]
    return {"block": one, "block2": one + [f"inner2_{k}", f"mid2_{k}"]}.get(lf.bcast, [])


def size_params(*names: str) -> list[Param]:
    return [Param("int64_t", v, v, "ctypes.c_int64") for v in names]


def out_param(target: str, py: str = "out.data_ptr()", elt: str = "float") -> Param:
    return pointer(target, "out", py, elt, const=False)


def fused_params(plan: Plan, target: str) -> list[Param]:
    """assay_forward's parameters for an elementwise, row or axis plan (an axis plan's tensor
    is (outer, mid, inner) with the reduced or scanned dims as mid; argmax writes int64)."""
    ptrs, geometry = leaf_params(plan, target)
    sizes = {"row": size_params("rows", "cols"),
             "axis": size_params("outer", "mid", "inner")}.get(plan.kind, size_params("n"))
    out = out_param(target, elt="int64_t" if plan.out_dtype == "int64" else "float")
    return ptrs + [out] + sizes + geometry


def forward_call(params: list[Param], stream: list[str], name: str = "assay_forward"
                 ) -> tuple[list[str], list[tuple[str, list[Param]]]]:
    """ModelNew.forward's call of the file's entry point ``name`` (its arguments the
    parameters' Python expressions, then ``stream``), and that entry point."""
    return ([f"_check(_lib().{name}({', '.join([p.py for p in params] + stream)}))"],
            [(name, params)])


def stream_args(target: str, tensor: str) -> list[str]:
    """The CUDA entry points' last argument: the current stream of ``tensor``'s device."""
    return [f"torch.cuda.current_stream({tensor}.device).cuda_stream"] if target == "cuda" \
        else []


def fused_calls(plan: Plan, target: str, knobs: dict[str, Any], stream: list[str]
                ) -> tuple[list[str], list[tuple[str, list[Param]]]]:
    """The call of an elementwise or row kernel (see family.Family.calls)."""
    return forward_call(fused_params(plan, target), stream)


# The candidate files' Python helpers for the forward's arguments, shared by the native
# (candidate.py) and the Triton (triton_form.py) file templates.
PY_ARG_HELPERS = '''def _scalar(v, what, device):
    """A number argument of the forward as a 0-d tensor of the task's dtype on ``device`` (an
    ATen fill: none of the task's compute)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{what}: expected a number, got {type(v).__name__}")
    return torch.full((), float(v), dtype=DTYPE, device=device)


def _attr(module, path):
    return functools.reduce(getattr, path.split("."), module)


def _expect(cond, what):
    if not cond:
        raise ValueError(f"shape mismatch: {what} (this kernel was generated for other shapes)")
'''


def leaf_tensor(lf: Leaf) -> str:
    """The candidate's Python expression for a leaf's tensor (a forward input or an attribute
    of the model), checked and made contiguous by the candidate's ``_tensor``."""
    dtype = f", torch.{lf.dtype}" if lf.dtype else ""
    if lf.source == "input":
        return f"_tensor({lf.name}, {lf.name!r}{dtype})"
    return f"_tensor(_attr(self, {lf.name!r}), {'self.' + lf.name!r}{dtype})"


# ----------------------------------------------------------------------------------------------
# Kernel heads, prologues and fused epilogues


def _dividers(plan: Plan) -> list[str]:
    """Per-thread set-up of the broadcast operands' index dividers (see assay_bidx)."""
    lines = []
    for k, lf in enumerate(plan.leaves):
        if k == plan.head_leaf or lf.bcast not in ("block", "block2"):
            continue
        lines.append(f"const AssayBcast bc{k} = assay_bcast(inner{k}, mid{k});")
        if lf.bcast == "block2":
            lines.append(f"const AssayBcast bc2_{k} = assay_bcast(inner2_{k}, mid2_{k});")
    return lines


def _prologue(plan: Plan, sched: Schedule) -> list[str]:
    names = Names(plan, sched)
    lines = _dividers(plan)
    if any(n.op == "cols" for n in plan.nodes):
        lines.append("const float fcols = (float)cols;")
    for j, n in enumerate(plan.nodes):
        if sched.where(j) == "prologue" and n.op != "cols":
            lines.append(names.define(j))
    return lines


def head_values(template: str, knobs: dict[str, Any], summary: str) -> dict[str, Any]:
    """The values every kernel file's head takes (CUDA_COMMON, CPP_PREAMBLE)."""
    return {"template": template, "summary": summary.replace("\n", " "),
            "knob_line": knob_line(knobs), "helpers": HELPERS.strip("\n")}


def own_kernel_source(cpp: str, cuda: str, target: str, knobs: dict[str, Any], summary: str,
                      label: str, params: list[Param], **values: Any) -> str:
    """The kernel file of a family with one template per target (concat, permute, recurrent,
    xent): the C++ template (which opens with CPP_PREAMBLE; ``parallel``: knob ``threads`` is
    not 1) or CUDA_COMMON and the CUDA template, every knob an int value of the template,
    ``params`` its entry point's parameter list, ``values`` the rest."""
    head = head_values(label, knobs, summary)
    ints = {k: int(v) for k, v in knobs.items()}
    values["params"] = ", ".join(f"{p.ctype} {p.name}" for p in params)
    if target == "cpu":
        return render(cpp, **head, **values, **ints, parallel=ints["threads"] != 1)
    return render(CUDA_COMMON, **head) + render(cuda, **values, **ints)


def knob_line(knobs: dict[str, Any]) -> str:
    return " ".join(f"{k}={knobs[k]}" for k in sorted(knobs))


class _EpiNames(Names):
    """Names in a fused epilogue: the head op's leaf (product, pooled window) is ``acc_v``;
    ``wrap`` converts float16/bfloat16 loads to float."""

    def __init__(self, plan: Plan, sched: Schedule, wrap: bool):
        super().__init__(plan, sched)
        self.wrap = wrap

    def define(self, j: int) -> str:
        n = self.plan.nodes[j]
        if n.op == "load":
            k = n.attr("leaf")
            if k == self.plan.head_leaf:
                return f"const float v{j} = acc_v;"
            if self.wrap:
                return f"const float v{j} = assay_f({_access(self.sched.kinds[k], k)});"
        return super().define(j)


def fused_epilogue(plan: Plan, wrap: bool) -> tuple[list[str], list[str], str]:
    """(kernel prologue, per-element statements, output expression) of a fused epilogue."""
    kinds = [leaf_kind(plan, k) for k in range(len(plan.leaves))]
    sched = Schedule(plan, kinds)
    names = _EpiNames(plan, sched, wrap)
    elems = elem_closure(plan, sched, [plan.output])
    prologue = _dividers(plan) + [names.define(j) for j, n in enumerate(plan.nodes)
                                  if sched.where(j) == "prologue" and n.op != "cols"]
    return prologue, [names.define(j) for j in elems], names(plan.output)


def fused_kernel(plan: Plan, target: str, knobs: dict[str, Any], summary: str,
                 label: str) -> tuple[dict[str, Any], Schedule]:
    """The values an elementwise or row kernel file takes whatever its family (head, entry
    point, prologue, threads or block), and the schedule of the plan's nodes; ``label`` is the
    template named in the file's head (a product's epilogue kernel bears the product's)."""
    kinds = [leaf_kind(plan, k) for k in range(len(plan.leaves))]
    sched = Schedule(plan, kinds)
    params = fused_params(plan, target)
    common = dict(head_values(label, knobs, summary), prologue=_prologue(plan, sched))
    if target == "cpu":
        # threads: 0 = OpenMP's default team, 1 = serial (no parallel region), k = at most k.
        # unroll: the simd length in units of 4 lanes (the SSE width of a plain -O3 build).
        threads = int(knobs["threads"])
        return dict(common, params=", ".join(f"{p.ctype} {p.name}" for p in params),
                    parallel=threads != 1,
                    omp_clause=f" num_threads(assay_threads({threads}))" if threads > 1 else "",
                    simdlen=4 * int(knobs["unroll"])), sched
    kparams = ", ".join(f"{p.ctype} {p.name}" for p in params)
    # vec: the vector width of families that have the knob (1: scalar accesses).
    return dict(common, block=int(knobs["block"]), vec=int(knobs.get("vec", 1)), kparams=kparams,
                params=kparams + ", void* stream_ptr",
                kargs=", ".join(p.name for p in params)), sched
