"""The attention family: multi-head self-attention of a packed projection (ir.Attention,
minGPT's form), a kernel of its own between the projections. q, k and v are read where the
projection wrote them ([B, T, 3C], head h of each at columns h * D of its third) and the
output is written as the heads side by side ([B, T, C]), so the task's splits, views and
transposes cost nothing; the [T, T] scores never reach memory.

C++: OpenMP over (batch, head, query row); per row the scores (float dot products over D),
the mask and the activation (the softmax in double), then the weighted sum of v in double.

CUDA: a block per (batch x head, BQ query rows), its query rows in shared memory; the keys and
values in tiles of 32 rows through shared memory (a tile the mask zeroes for all the block's
rows skipped: a causal mask's upper half) (k's rows padded by one float, so the 32
lanes each reading a key's element d hit 32 banks); a lane per key of a tile for the scores,
the softmax kept online per row (running maximum and sum, earlier terms rescaled), and a lane
per output element d (D / 32 of them each) for the sum of p * v. Head sizes up to 128.
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Entry, Space, standalone_family
from assay.propose.offline.families.shared import (CPP_PREAMBLE, Param, forward_call,
                                                   own_kernel_source, pointer, size_params,
                                                   stream_args)
from assay.propose.offline.ir import Attention

# The largest head size the CUDA kernel holds (its accumulators: D / 32 per row and lane).
MAX_HEAD = 128

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP's default over (batch, head), 1 = serial
    ("cpu", "attention"): {"threads": (0, 1)},
    # rows: query rows a warp owns (a block has 8 warps: 8 x rows query rows)
    ("cuda", "attention"): {"rows": (1, 2, 4)},
}

CPP_ATTENTION = CPP_PREAMBLE + r"""
#include <math.h>
#include <vector>

extern "C" int assay_attention({{ params }}) {
  const int64_t C = H * D, row = 3 * C;
{% if parallel %}
  #pragma omp parallel for collapse(2) schedule(static) if(B * H > 1)
{% endif %}
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(T);
      for (int64_t i = 0; i < T; ++i) {
        const float* q = qkv + (b * T + i) * row + h * D;
        double top = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          const float* k = qkv + (b * T + j) * row + C + h * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          float v = dot * scale;
          if (has_mask && mask[i * mask_ld + j * mask_lc] == 0.0f) v = -INFINITY;
          s[j] = v;
          if (v > top || v != v) top = v;
        }
{% if softmax %}
        double sum = 0.0;
        for (int64_t j = 0; j < T; ++j) {
          s[j] = exp(s[j] - top);  // all -inf: NaN, as torch's softmax of a row of -inf
          sum += s[j];
        }
        for (int64_t j = 0; j < T; ++j) s[j] /= sum;
{% else %}
        for (int64_t j = 0; j < T; ++j) s[j] = s[j] > 0.0 || s[j] != s[j] ? s[j] : 0.0;
{% endif %}
        float* y = out + (b * T + i) * C + h * D;
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < T; ++j) acc += s[j] * qkv[(b * T + j) * row + 2 * C + h * D + d];
          y[d] = (float)acc;
        }
      }
    }
  }
  return 0;
}
"""

CUDA_ATTENTION = r"""
constexpr int ROWS = {{ rows }};        // query rows per warp
constexpr int WARPS = 8;
constexpr int BQ = WARPS * ROWS;       // query rows per block
constexpr int BK = 32;                 // keys per tile: one per lane
constexpr int DV = {{ max_head }} / 32;  // output elements per lane, at most

// smem: q [BQ][D], k [BK][D + 1], v [BK][D]
__global__ void __launch_bounds__(WARPS * 32)
assay_attention_rows(const float* __restrict__ qkv, const float* __restrict__ mask,
                     float* __restrict__ out, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t mask_ld, int64_t mask_lc, float scale, int has_mask) {
  extern __shared__ float smem[];
  float* sq = smem;
  float* sk = sq + BQ * D;
  float* sv = sk + BK * (D + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
  const int64_t C = H * D, row = 3 * C;
  const int64_t q0 = (int64_t)blockIdx.x * BQ;
  const float* base = qkv + b * T * row + h * D;
  for (int64_t e = threadIdx.x; e < (int64_t)BQ * D; e += WARPS * 32) {
    const int64_t r = e / D, d = e - r * D;
    sq[e] = q0 + r < T ? base[(q0 + r) * row + d] : 0.0f;
  }
  float m[ROWS], l[ROWS], acc[ROWS][DV];
  #pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    #pragma unroll
    for (int t = 0; t < DV; ++t) acc[r][t] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < T; k0 += BK) {
    __syncthreads();  // the tiles before are read
    if (has_mask) {  // a tile the mask zeroes for every row of the block adds nothing: skipped
      int open = 0;  // (a causal mask: half the tiles)
      for (int e = threadIdx.x; e < BQ * BK; e += WARPS * 32) {
        const int64_t i = q0 + e / BK, j = k0 + e % BK;
        if (i < T && j < T && mask[i * mask_ld + j * mask_lc] != 0.0f) open = 1;
      }
      if (!__syncthreads_or(open)) continue;
    }
    for (int64_t e = threadIdx.x; e < (int64_t)BK * D; e += WARPS * 32) {
      const int64_t j = e / D, d = e - j * D;
      const bool in = k0 + j < T;
      sk[j * (D + 1) + d] = in ? base[(k0 + j) * row + C + d] : 0.0f;
      sv[j * D + d] = in ? base[(k0 + j) * row + 2 * C + d] : 0.0f;
    }
    __syncthreads();
    const int64_t j = k0 + lane;
    #pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int qr = warp * ROWS + r;
      const int64_t i = q0 + qr;
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) dot += sq[qr * D + d] * sk[lane * (D + 1) + d];
      float s = dot * scale;
      if (j >= T) s = -INFINITY;  // past the last key: no weight
      else if (has_mask && i < T && mask[i * mask_ld + j * mask_lc] == 0.0f) s = -INFINITY;
{% if softmax %}
      float top = s;
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
      const float m_new = fmaxf(m[r], top);
      // a row with no finite score yet keeps weights 0 (not exp(-inf + inf) = NaN)
      const float p = m_new == -INFINITY ? 0.0f : expf(s - m_new);
      const float keep = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      float psum = p;
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l[r] = l[r] * keep + psum;
      m[r] = m_new;
      #pragma unroll
      for (int t = 0; t < DV; ++t) acc[r][t] *= keep;
{% else %}
      const float p = s > 0.0f || s != s ? s : 0.0f;
{% endif %}
      #pragma unroll 8
      for (int jj = 0; jj < BK; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
        #pragma unroll
        for (int t = 0; t < DV; ++t) {
          const int64_t d = lane + 32 * t;
          if (d < D) acc[r][t] += pj * sv[jj * D + d];
        }
      }
    }
  }
  #pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int64_t i = q0 + warp * ROWS + r;
    if (i >= T) continue;
    float* y = out + (b * T + i) * C + h * D;
    #pragma unroll
    for (int t = 0; t < DV; ++t) {
      const int64_t d = lane + 32 * t;
{% if softmax %}
      if (d < D) y[d] = acc[r][t] / l[r];  // no key at all: 0 / 0, NaN as torch
{% else %}
      if (d < D) y[d] = acc[r][t];
{% endif %}
    }
  }
}

extern "C" int assay_attention({{ params }}, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (B <= 0 || T <= 0 || H <= 0) return 0;
  if (D <= 0 || D > {{ max_head }} || B * H > 65535) return (int)cudaErrorInvalidValue;
  const size_t bytes = sizeof(float) * (size_t)(BQ * D + BK * (D + 1) + BK * D);
  if (bytes > 48 * 1024) {
    if ((int)bytes > assay_smem_optin()) return (int)cudaErrorInvalidValue;
    const cudaError_t e = cudaFuncSetAttribute(assay_attention_rows,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)bytes);
    if (e != cudaSuccess) return (int)e;
  }
  const dim3 grid((unsigned)((T + BQ - 1) / BQ), (unsigned)(B * H));
  assay_attention_rows<<<grid, WARPS * 32, bytes, stream>>>(qkv, mask, out, B, T, H, D,
                                                            mask_ld, mask_lc, scale, has_mask);
  return (int)cudaGetLastError();
}
"""


def _params(target: str) -> list[Param]:
    return ([pointer(target, "qkv", "x.data_ptr()"),
             pointer(target, "mask", "mask.data_ptr()"),
             pointer(target, "out", "out.data_ptr()", const=False)]
            + size_params("B", "T", "H", "D", "mask_ld", "mask_lc")
            + [Param("float", "scale", "scale", "ctypes.c_float"),
               Param("int", "has_mask", "has_mask", "ctypes.c_int")])


def source(plan: Attention, target: str, knobs: dict[str, Any], summary: str,
           label: str = "attention") -> str:
    return own_kernel_source(CPP_ATTENTION, CUDA_ATTENTION, target, knobs, summary, label,
                             _params(target), softmax=plan.act == "softmax",
                             max_head=MAX_HEAD)


def forward(plan: Attention, target: str, knobs: dict[str, Any]
            ) -> tuple[list[str], list[Entry]]:
    """ModelNew.forward's body: the projection and the mask checked (the mask's top-left
    T x T block read through its strides), the output allocated, one ``assay_attention``."""
    calls, entries = forward_call(_params(target), stream_args(target, "x"), "assay_attention")
    lines = [f"x = _tensor({plan.qkv}, {plan.qkv!r})",
             "B, T, C3 = x.shape",
             f"H, C = {plan.heads}, {plan.split}",
             "D = C // H",
             f"_expect(x.dim() == 3 and C3 == 3 * C, '{plan.qkv} is not [B, T, 3 * {plan.split}]')"]
    if target == "cuda":
        lines.append(f"_expect(D <= {MAX_HEAD} and B * H <= 65535, 'heads of over {MAX_HEAD} "
                     f"or over 65535 (batch, head) pairs')")
    if plan.mask:
        lines += [f"mask = _tensor(_attr(self, {plan.mask!r}), {plan.mask!r}, strided=True)",
                  f"_expect(mask.dim() == 4 and mask.shape[0] == 1 and mask.shape[1] == 1 and "
                  f"mask.shape[2] >= T and mask.shape[3] >= T, '{plan.mask} is not "
                  f"[1, 1, >= T, >= T]')",
                  "mask_ld, mask_lc, has_mask = mask.stride(2), mask.stride(3), 1"]
    else:
        lines += ["mask, mask_ld, mask_lc, has_mask = x, 0, 0, 0  # (never read)"]
    lines += [f"scale = {plan.scale!r}",
              "out = torch.empty((B, T, C), dtype=DTYPE, device=x.device)",
              *calls,
              "return out"]
    return lines, entries


FAMILY = standalone_family(
    "attention", Attention, KNOB_SPACES,
    # Not yet measured on a GPU: 8 warps of 2 query rows (16 rows share each key tile).
    defaults={"cpu": {"threads": 0}, "cuda": {"rows": 2}},
    safe={"cpu": {"threads": 1}, "cuda": {"rows": 1}},
    strategy="fusion",  # scores, mask, softmax and the weighted sum in one kernel
    source=source, forward=forward)
