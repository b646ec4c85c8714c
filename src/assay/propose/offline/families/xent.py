"""The xent family: the cross-entropy loss (ir.CrossEntropy) of float32 logits ``[N, C]`` and
int64 class indices ``[N]``, a kernel of its own. Per row one pass over the logits keeps a
running maximum and the sum of exponentials below it (the online softmax), so the loss
``logsumexp(row) - row[target]`` costs one read of the row (ATen's eager form writes the whole
log-softmax, then gathers from it); a row whose target is ``ignore_index`` is 0. Then the rows'
losses are returned as they are, summed, or averaged over the rows not ignored, by a second
launch in a fixed order (deterministic). C++: OpenMP over rows, each row's maximum and sum of
exponentials by `omp simd` reductions (two passes over a row in cache), then the same sum.

A target outside ``[0, C)`` that is not ignored gives NaN where torch raises.
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Entry, Space, standalone_family
from assay.propose.offline.families.shared import (CPP_PREAMBLE, Param, forward_call,
                                                   own_kernel_source, pointer, size_params,
                                                   stream_args)
from assay.propose.offline.ir import CrossEntropy

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP's default over rows, 1 = serial
    ("cpu", "xent"): {"threads": (0, 1)},
    # block: threads per row; vec: floats per load (where the row length and the pointer allow)
    ("cuda", "xent"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4)},
}

# mode: 0 = the rows' losses (reduction "none"), 1 = their sum, 2 = their mean over the rows
# not ignored (0 / 0 = NaN when every row is, as torch).
CPP_XENT = CPP_PREAMBLE + r"""
#include <math.h>

extern "C" int assay_xent({{ params }}) {
{% if parallel %}
  #pragma omp parallel for schedule(static) if(N > 1 && N * C > (1 << 16))
{% endif %}
  for (int64_t r = 0; r < N; ++r) {
    const int64_t tr = t[r];
    if (tr == ignore) {
      losses[r] = 0.0f;
      continue;
    }
    // Two passes over the row (it stays in cache): the maximum, then the sum of exponentials
    // below it, each an `omp simd` reduction (vector exp where libmvec is linked).
    const float* row = x + r * C;
    float m = -INFINITY, s = 0.0f;
    #pragma omp simd reduction(max:m)
    for (int64_t c = 0; c < C; ++c) m = std::max(m, row[c]);
    #pragma omp simd reduction(+:s)
    for (int64_t c = 0; c < C; ++c) s += expf(row[c] - m);
    losses[r] = tr >= 0 && tr < C ? logf(s) + m - row[tr] : NAN;
  }
  if (mode == 0) return 0;
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t r = 0; r < N; ++r) {
    if (t[r] != ignore) {
      sum += losses[r];
      ++n;
    }
  }
  out[0] = mode == 2 ? (float)(sum / (double)n) : (float)sum;
  return 0;
}
"""

CUDA_XENT = r"""
// (m, s): a running maximum and the sum of exp(v - m) of the values seen; merged exactly.
__device__ __forceinline__ void assay_lse_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) { m = m2; s = s2; return; }
  if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
  else { s += s2 * expf(m2 - m); }
}

// A block per row (grid-strided): one read of the row, the (m, s) pairs merged by shuffles and
// through shared memory; thread 0 writes the row's loss. Sizes in units of VEC floats.
template <int VEC>
__global__ void __launch_bounds__({{ block }})
assay_xent_rows(const float* __restrict__ x, const int64_t* __restrict__ t,
                float* __restrict__ losses, int64_t N, int64_t C, int64_t ignore) {
  __shared__ float sm[{{ block // 32 }}], ss[{{ block // 32 }}];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t cv = C / VEC;
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const int64_t tr = t[r];
    if (tr == ignore) {  // the same for every thread of the block
      if (threadIdx.x == 0) losses[r] = 0.0f;
      continue;
    }
    const float* row = x + r * C;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = threadIdx.x; j < cv; j += {{ block }}) {
      float v[VEC];
      assay_load<VEC>(row, j * VEC, v);
      #pragma unroll
      for (int q = 0; q < VEC; ++q) assay_lse_merge(m, s, v[q], 1.0f);
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
      assay_lse_merge(m, s, m2, s2);
    }
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < {{ block // 32 }}; ++w) assay_lse_merge(m, s, sm[w], ss[w]);
      losses[r] = tr >= 0 && tr < C ? logf(s) + m - row[tr] : NAN;
    }
    __syncthreads();  // sm/ss are read before the next row writes them
  }
}

// One block: the losses of the rows not ignored, summed in a fixed order; their mean (mean).
__global__ void __launch_bounds__(1024)
assay_xent_reduce(const float* __restrict__ losses, const int64_t* __restrict__ t,
                  float* __restrict__ out, int64_t N, int64_t ignore, int mean) {
  __shared__ float sums[32];
  __shared__ long long counts[32];
  float sum = 0.0f;
  long long n = 0;
  for (int64_t r = threadIdx.x; r < N; r += 1024) {
    if (t[r] != ignore) {
      sum += losses[r];
      ++n;
    }
  }
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    n += __shfl_xor_sync(0xffffffffu, n, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sums[warp] = sum; counts[warp] = n; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 32; ++w) { sum += sums[w]; n += counts[w]; }
    out[0] = mean ? sum / (float)n : sum;
  }
}

extern "C" int assay_xent({{ params }}, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (N > 0) {
    int64_t blocks = (int64_t)assay_sm_count() * {{ 2048 // block * 2 }};
    if (blocks > N) blocks = N;
    const int64_t v = {{ vec }};
    if (v > 1 && C % v == 0 && assay_aligned(x, 4 * v)) {
      assay_xent_rows<{{ vec }}><<<(unsigned)blocks, {{ block }}, 0, stream>>>(x, t, losses, N,
                                                                              C, ignore);
    } else {
      assay_xent_rows<1><<<(unsigned)blocks, {{ block }}, 0, stream>>>(x, t, losses, N, C,
                                                                        ignore);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
  }
  if (mode != 0) {
    assay_xent_reduce<<<1, 1024, 0, stream>>>(losses, t, out, N, ignore, mode == 2);
  }
  return (int)cudaGetLastError();
}
"""


def _params(target: str) -> list[Param]:
    return ([pointer(target, "x", "x.data_ptr()"),
             pointer(target, "t", "t.data_ptr()", elt="int64_t"),
             pointer(target, "losses", "losses.data_ptr()", const=False),
             pointer(target, "out", "out.data_ptr()", const=False)]
            + size_params("N", "C", "ignore", "mode"))


def source(plan: CrossEntropy, target: str, knobs: dict[str, Any], summary: str,
           label: str = "xent") -> str:
    # (for reduction "none" out is losses, and only losses is written: mode 0 never reads out)
    return own_kernel_source(CPP_XENT, CUDA_XENT, target, knobs, summary, label,
                             _params(target))


def forward(plan: CrossEntropy, target: str, knobs: dict[str, Any]
            ) -> tuple[list[str], list[Entry]]:
    """ModelNew.forward's body: the logits and targets checked, the settings (a module's read
    now), the rows' losses and the output allocated, one ``assay_xent`` call."""
    calls, entries = forward_call(_params(target), stream_args(target, "x"), "assay_xent")
    lines = [f"x = _tensor({plan.x}, {plan.x!r})",
             f"t = _tensor({plan.target}, {plan.target!r}, torch.int64)",
             f"_expect(x.dim() == 2 and t.dim() == 1 and t.shape[0] == x.shape[0], "
             f"'{plan.x} is not [N, C] with [N] class indices {plan.target}')"]
    if plan.module:
        lines += [f"m = _attr(self, {plan.module!r})",
                  f"_expect(m.weight is None and not m.label_smoothing, '{plan.module}: class "
                  f"weights or label smoothing (this kernel computes neither)')",
                  "reduction, ignore = m.reduction, int(m.ignore_index)"]
    else:
        lines.append(f"reduction, ignore = {plan.reduction!r}, {plan.ignore_index}")
    lines += [
        "_expect(reduction in ('none', 'sum', 'mean'), f'reduction {reduction!r}')",
        "mode = ('none', 'sum', 'mean').index(reduction)",
        "N, C = x.shape",
        "losses = torch.empty((N,), dtype=DTYPE, device=x.device)",
        "out = losses if mode == 0 else torch.empty((), dtype=DTYPE, device=x.device)",
        *calls,
        "return out",
    ]
    return lines, entries


FAMILY = standalone_family(
    "xent", CrossEntropy, KNOB_SPACES,
    # Not yet measured on a GPU: 256 threads a row, float4 loads (KernelBench's 4096 classes:
    # four vectors a thread).
    defaults={"cpu": {"threads": 0}, "cuda": {"block": 256, "vec": 4}},
    safe={"cpu": {"threads": 1}, "cuda": {"block": 256, "vec": 1}},
    strategy="fusion", source=source, forward=forward)  # softmax, gather and mean in one pass
