"""Jinja2 templates of the candidate file and its kernels.

They live in a Python module rather than ``*.j2`` files so that a wheel of ``assay`` carries
them without package-data configuration. Statement bodies (the fused formulas, the
accumulators) are built in :mod:`codegen` and passed in as lists of lines; the templates own
the loop and launch structure, which is what the knobs change.
"""

from __future__ import annotations

import jinja2

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
"""

# ---------------------------------------------------------------------------------------------
# C++ (cpu target): OpenMP threads over chunks or rows, `omp simd` inner loops.

CPP_SOURCE = r"""// Assay offline synthesizer v1: {{ template }} kernel (cpu, C++/OpenMP)
// computes: {{ summary }}
// knobs: {{ knob_line }}
#include <math.h>
#include <stdint.h>
#include <algorithm>
#ifdef _OPENMP
#include <omp.h>
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

extern "C" int assay_forward({{ params }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
{% if template == "elementwise" %}
  // {{ chunk }} elements per OpenMP task: large enough to amortize scheduling, small enough
  // to balance the threads.
  const int64_t chunk = {{ chunk }};
  const int64_t nchunks = (n + chunk - 1) / chunk;
{% if parallel %}
  #pragma omp parallel for schedule(static){{ omp_clause }} if(nchunks > 1)
{% endif %}
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t lo = ch * chunk;
    const int64_t hi = std::min(lo + chunk, n);
    #pragma omp simd simdlen({{ simdlen }})
    for (int64_t i = lo; i < hi; ++i) {
{% for line in body %}
      {{ line }}
{% endfor %}
    }
  }
{% else %}
{% if parallel %}
  #pragma omp parallel for schedule({{ schedule }}){{ omp_clause }} if(rows * cols > 32768)
{% endif %}
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
{% for line in row_prologue %}
    {{ line }}
{% endfor %}
{% for p in passes %}
    // pass {{ loop.index0 }}: {{ p.comment }}
{% for line in p.init %}
    {{ line }}
{% endfor %}
    #pragma omp simd simdlen({{ simdlen }}){{ p.clause }}
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = base + c;
      (void)i;
{% for line in p.body %}
      {{ line }}
{% endfor %}
    }
{% for line in p.after %}
    {{ line }}
{% endfor %}
{% endfor %}
  }
{% endif %}
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

static inline bool assay_aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes)) == 0;
}

static int assay_sm_count() {
  // Cached per device: cudaDeviceGetAttribute is cheap but not free on every launch.
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (cache[dev] == 0) {
    int v = 0;
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    cache[dev] = v > 0 ? v : 132;
  }
  return cache[dev];
}

extern "C" const char* assay_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
"""

CUDA_ELEMENTWISE = r"""
// Grid-stride loop; each thread handles UNROLL vectors of VEC floats per step (more bytes in
// flight per thread), then the n % VEC tail scalar by scalar.
template <int VEC>
__global__ void __launch_bounds__({{ block }})
assay_elementwise({{ kparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t nv = n / VEC;
  const int64_t stride = (int64_t)gridDim.x * {{ block }};
  for (int64_t j0 = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; j0 < nv; j0 += stride * {{ unroll }}) {
    #pragma unroll
    for (int uu = 0; uu < {{ unroll }}; ++uu) {
      const int64_t j = j0 + uu * stride;
      if (j < nv) {
        const int64_t i0 = j * VEC;
{% for line in vec_loads %}
        {{ line }}
{% endfor %}
        float o[VEC];
        #pragma unroll
        for (int u = 0; u < VEC; ++u) {
          const int64_t i = i0 + u;
          (void)i;
{% for line in vec_body %}
          {{ line }}
{% endfor %}
        }
        assay_store<VEC>(out, i0, o);
      }
    }
  }
  if (VEC > 1) {
    for (int64_t i = nv * VEC + (int64_t)blockIdx.x * {{ block }} + threadIdx.x; i < n; i += stride) {
{% for line in scalar_body %}
      {{ line }}
{% endfor %}
    }
  }
}

extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (n <= 0) return 0;
  const bool vec = {{ vec }} > 1{% for p in vec_ptrs %} && assay_aligned({{ p }}, {{ 4 * vec }}){% endfor %};
  const int64_t work = vec ? n / {{ vec }} : n;
  int64_t blocks = (work + {{ block * unroll }} - 1) / {{ block * unroll }};
{% if persistent %}
  // Persistent grid: a few waves of blocks per SM, the grid-stride loop covers the rest.
  const int64_t cap = (int64_t)assay_sm_count() * {{ 2048 // block * 4 }};
{% else %}
  // One pass: every thread handles UNROLL vectors and exits (measured ~4% faster than a
  // persistent grid for streaming ops on H200); the grid-stride loop only guards the limit.
  const int64_t cap = 2147483647;
{% endif %}
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  if (vec) {
    assay_elementwise<{{ vec }}><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  } else {
    assay_elementwise<1><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  }
  return (int)cudaGetLastError();
}
"""

CUDA_ROW = r"""
// Sums accumulate in double: each thread adds cols / threads values in sequence, and a float
// running sum over a long row drifts past 1e-5 of torch's (pairwise) result when values cancel.
// The reduction stays memory-bound, so the doubles cost nothing measurable.
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

{% if warp_per_row %}
// One warp per row: for short rows a whole block would idle; the warp reduces with shuffles
// only, no shared memory and no __syncthreads.
template <class Op>
__device__ __forceinline__ typename Op::T assay_row_reduce(typename Op::T v, double* /*smem*/) {
  return assay_warp_reduce<Op>(v);
}
{% else %}
// One block per row: warp shuffles, then one value per warp through shared memory; every
// warp then reduces the per-warp values so that all threads hold the row's result.
template <class Op>
__device__ __forceinline__ typename Op::T assay_row_reduce(typename Op::T v, double* smem) {
  v = assay_warp_reduce<Op>(v);
  __syncthreads();  // the previous reduction's readers are done with smem
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = static_cast<double>(v);
  __syncthreads();
  v = (threadIdx.x & 31) < {{ block // 32 }} ? static_cast<typename Op::T>(smem[threadIdx.x & 31])
                                       : Op::id();
  return assay_warp_reduce<Op>(v);
}
{% endif %}

// CACHE: full inputs read by several passes are kept in dynamic shared memory after the first
// pass reads them ({{ cached|length }} such input(s) here), so later passes do not re-read global
// memory.
template <int VEC, bool CACHE>
__global__ void __launch_bounds__({{ block }})
assay_rows({{ kparams }}) {
  __shared__ double smem[32];
  extern __shared__ float4 assay_dyn_smem[];
{% for line in prologue %}
  {{ line }}
{% endfor %}
{% if warp_per_row %}
  const int lane = threadIdx.x & 31;
  const int64_t first = (int64_t)blockIdx.x * {{ block // 32 }} + (threadIdx.x >> 5);
  const int64_t step = (int64_t)gridDim.x * {{ block // 32 }};
  const int group = 32;
  const bool leader = lane == 0;
  (void)leader;
  const int64_t slot = threadIdx.x >> 5;  // this warp's rows in the row cache
{% else %}
  const int lane = threadIdx.x;
  const int64_t first = blockIdx.x;
  const int64_t step = gridDim.x;
  const int group = {{ block }};
  const bool leader = threadIdx.x == 0;
  (void)leader;
  const int64_t slot = 0;
{% endif %}
{% for k in cached %}
  float* cache{{ k }} = reinterpret_cast<float*>(assay_dyn_smem) + (slot * {{ cached|length }} + {{ loop.index0 }}) * cols;
{% endfor %}
  (void)slot;
  for (int64_t r = first; r < rows; r += step) {
    const int64_t base = r * cols;
{% for line in row_prologue %}
    {{ line }}
{% endfor %}
{% for p in passes %}
    // pass {{ loop.index0 }}: {{ p.comment }}
{% for line in p.init %}
    {{ line }}
{% endfor %}
    for (int64_t c0 = (int64_t)lane * VEC; c0 < cols; c0 += (int64_t)group * VEC) {
{% for line in p.vec_loads %}
      {{ line }}
{% endfor %}
{% if p.stores %}
      float o[VEC];
{% endif %}
      #pragma unroll
      for (int u = 0; u < VEC; ++u) {
        const int64_t c = c0 + u;
        const int64_t i = base + c;
        (void)c; (void)i;
{% for line in p.body %}
        {{ line }}
{% endfor %}
      }
{% if p.stores %}
      assay_store<VEC>(out, base + c0, o);
{% endif %}
    }
{% for line in p.after %}
    {{ line }}
{% endfor %}
{% endfor %}
  }
}

static int assay_smem_optin() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 48 * 1024;
  if (cache[dev] == 0) {
    int v = 0;
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cache[dev] = v > 0 ? v : 48 * 1024;
  }
  return cache[dev];
}

template <int VEC, bool CACHE>
static int assay_launch(int64_t blocks, size_t cache_bytes, cudaStream_t stream, {{ kparams }}) {
  if (CACHE && cache_bytes > 48 * 1024) {  // above the default limit: opt in
    const cudaError_t e = cudaFuncSetAttribute(assay_rows<VEC, CACHE>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(cache_bytes));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  assay_rows<VEC, CACHE><<<(unsigned)blocks, {{ block }}, CACHE ? cache_bytes : 0, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
}

extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (rows <= 0 || cols <= 0) return 0;
  const bool vec = {{ vec }} > 1 && cols % {{ vec }} == 0{% for p in vec_ptrs %} && assay_aligned({{ p }}, {{ 4 * vec }}){% endfor %};
  // The row cache needs {{ cached|length }} row(s) per row in flight; rows too long for shared
  // memory run uncached.
  const size_t cache_bytes = (size_t){{ cached|length * rows_per_block }} * (size_t)cols * sizeof(float);
  const bool cache = {{ "true" if cache_row and cached else "false" }} && cache_bytes <= (size_t)assay_smem_optin();
{% if warp_per_row %}
  int64_t blocks = (rows + {{ block // 32 - 1 }}) / {{ block // 32 }};
{% else %}
  int64_t blocks = rows;
{% endif %}
  // The row loop is grid-strided, so a capped grid still covers every row.
  const int64_t cap = (int64_t)assay_sm_count() * {{ 2048 // block * 8 }};
  if (blocks > cap) blocks = cap;
  if (vec) {
    return cache ? assay_launch<{{ vec }}, true>(blocks, cache_bytes, stream, {{ kargs }})
                 : assay_launch<{{ vec }}, false>(blocks, cache_bytes, stream, {{ kargs }});
  }
  return cache ? assay_launch<1, true>(blocks, cache_bytes, stream, {{ kargs }})
               : assay_launch<1, false>(blocks, cache_bytes, stream, {{ kargs }});
}
"""

# ---------------------------------------------------------------------------------------------
# The candidate file.

CANDIDATE = r'''"""Candidate written by Assay's offline synthesizer (v1).

Computes: {{ summary }}
Template: {{ template }} ({{ target }}); knobs: {{ knob_line }}.

ModelNew inherits the task's Model constructor (copied below without its forward), so its
parameters have the reference's names, shapes and seeded values; its forward runs one
compiled kernel (the SOURCE below, loaded with ctypes) and allocates the output only.
"""
{% if future %}
from __future__ import annotations
{% endif %}

import ctypes
import functools
import math

import torch
from torch import nn

from assay.bench.build import load_library

# ---- the task's module, without Model.forward -----------------------------------------------
{{ task_code }}

# ---- the kernel -------------------------------------------------------------------------------
TEMPLATE = {{ template|tojson }}
TARGET = {{ target|tojson }}
KNOBS = {{ knobs_repr }}
LANG = {{ lang|tojson }}
SOURCE = r"""
{{ source }}"""

_LIB = None
_ARGTYPES = [{{ argtypes }}]


def _lib():
    global _LIB
    if _LIB is None:
        lib = load_library(SOURCE, lang=LANG)
        lib.assay_forward.argtypes = _ARGTYPES
        lib.assay_forward.restype = ctypes.c_int
{% if target == "cuda" %}
        lib.assay_error_string.argtypes = [ctypes.c_int]
        lib.assay_error_string.restype = ctypes.c_char_p
{% endif %}
        _LIB = lib
    return _LIB


def _tensor(t, what):
    """A contiguous float32 tensor on this candidate's device (a copy only if it was strided)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or t.device.type != {{ device_type|tojson }}:
        raise TypeError(f"{what}: expected a float32 {{ device_type }} tensor, got {t.dtype} on "
                        f"{t.device}")
    return t.contiguous()


def _attr(module, path):
    return functools.reduce(getattr, path.split("."), module)


def _expect(cond, what):
    if not cond:
        raise ValueError(f"shape mismatch: {what} (this kernel was generated for other shapes)")


class ModelNew(Model):
    def forward(self, {{ inputs|join(", ") }}):
{% for line in forward %}
        {{ line }}
{% endfor %}
'''
