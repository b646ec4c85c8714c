"""The attention family: multi-head self-attention of a packed projection (ir.Attention,
minGPT's form), a kernel of its own between the projections. q, k and v are read where the
projection wrote them ([B, T, 3C], head h of each at columns h * D of its third) and the
output is written as the heads side by side ([B, T, C]), so the task's splits, views and
transposes cost nothing; the [T, T] scores never reach memory.

C++: OpenMP over (batch, head, query row); per row the scores (float dot products over D),
the mask and the activation (the softmax in double), then the weighted sum of v in double.

CUDA, two forms (knob ``tile``), each a block per (batch x head, a block of query rows) with
the keys and values in tiles through shared memory (a tile the mask zeroes for all the block's
rows skipped: a causal mask's upper half) and the softmax kept online per row (running maximum
and sum, earlier terms rescaled). Head sizes up to 128.

- ``tile`` 0 (rows): 8 warps of ``rows`` query rows, key tiles of 32 (k's rows padded by one
  float, so the 32 lanes each reading a key's element d hit 32 banks); a lane per key for the
  scores, then a lane per output element d (D / 32 of them each) for the sum of p * v. Each
  score's FMA reads two shared-memory values: on an H100 it ran at about 5 TFLOP/s (KernelBench
  L3_43, 0.67x eager; docs/evidence/2026-12-07-h100-kb-dag-twelfth.md).
- ``tile`` 1 (register tiles): 64 query rows x 64 keys a tile, 256 threads as 16 x 16, each
  with a 4 x 4 tile of the scores in registers (q and k stored transposed, one float4 of each
  per d: 16 FMAs for two shared-memory reads); the scores' row statistics by shuffles among the
  16 threads of a row (a half-warp); the probabilities through shared memory, transposed, to
  the same half-warp, which sums p * v for its 4 rows x D / 16 columns (one float4 of p and one
  value of v per 4 FMAs).
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
    # tile: the kernel's form (0: rows, 1: register tiles; see the module doc); rows: query
    # rows a warp owns in the first (a block has 8 warps: 8 x rows query rows)
    ("cuda", "attention"): {"tile": (0, 1), "rows": (1, 2, 4)},
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
// Whether the mask leaves any of the tile's scores (query rows q0.., keys k0..) standing, for
// the whole block (every thread calls it): a tile it zeroes adds nothing and is skipped (a
// causal mask: half the tiles).
__device__ __forceinline__ bool assay_tile_open(const float* mask, int64_t q0, int64_t k0,
                                                int rows, int keys, int64_t T, int64_t mask_ld,
                                                int64_t mask_lc) {
  int open = 0;
  for (int e = threadIdx.x; e < rows * keys; e += blockDim.x) {
    const int64_t i = q0 + e / keys, j = k0 + e % keys;
    if (i < T && j < T && mask[i * mask_ld + j * mask_lc] != 0.0f) open = 1;
  }
  return __syncthreads_or(open);
}

// The score of query row i and key j: -inf past the last key or where the mask is 0.
__device__ __forceinline__ float assay_masked(float s, int64_t i, int64_t j, int64_t T,
                                             const float* mask, int64_t mask_ld,
                                             int64_t mask_lc, int has_mask) {
  if (j >= T) return -INFINITY;  // past the last key: no weight
  if (has_mask && i < T && mask[i * mask_ld + j * mask_lc] == 0.0f) return -INFINITY;
  return s;
}

// One query row's outputs: acc[t] at column first + step * t of the head's D (a lane's or a
// thread's share of the row), over the softmax's sum l.
template <int N>
__device__ __forceinline__ void assay_attention_store(float* y, const float (&acc)[N], float l,
                                                      int first, int step, int D) {
  #pragma unroll
  for (int t = 0; t < N; ++t) {
    const int c = first + step * t;
{% if softmax %}
    if (c < D) y[c] = acc[t] / l;  // no key at all: 0 / 0, NaN as torch
{% else %}
    if (c < D) y[c] = acc[t];
{% endif %}
  }
}

{% if not tile %}
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
    if (has_mask && !assay_tile_open(mask, q0, k0, BQ, BK, T, mask_ld, mask_lc)) continue;
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
      const float s = assay_masked(dot * scale, i, j, T, mask, mask_ld, mask_lc, has_mask);
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
    if (i < T) assay_attention_store(out + (b * T + i) * C + h * D, acc[r], l[r], lane, 32, (int)D);
  }
}
{% else %}
// The register-tiled form: TQ query rows x TK keys a tile; thread (ty, tx) of 16 x 16 holds the
// scores of rows ty * 4 .. + 3 and keys tx * 4 .. + 3, then the outputs of the same rows at
// columns tx + 16 t. A row's 16 threads are one half-warp (tid = ty * 16 + tx).
constexpr int TQ = 64, TK = 64, TPAD = 4;    // rows padded to keep float4 reads aligned
constexpr int LQ = TQ + TPAD, LK = TK + TPAD;
constexpr int TDV = {{ max_head }} / 16;       // output columns per thread, at most

// smem: qt [D][LQ], kt [D][LK] (q and k transposed), vs [TK][D], pt [TK][LQ] (p transposed)
__global__ void __launch_bounds__(256)
assay_attention_tiles(const float* __restrict__ qkv, const float* __restrict__ mask,
                      float* __restrict__ out, int64_t B, int64_t T, int64_t H, int64_t D,
                      int64_t mask_ld, int64_t mask_lc, float scale, int has_mask) {
  extern __shared__ __align__(16) float smem[];
  const int Dn = (int)D;
  float* qt = smem;
  float* kt = qt + Dn * LQ;
  float* vs = kt + Dn * LK;
  float* pt = vs + TK * Dn;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int r0 = ty * 4, c0 = tx * 4;
  const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
  const int64_t C = H * D, row = 3 * C;
  const int64_t q0 = (int64_t)blockIdx.x * TQ;
  const float* base = qkv + b * T * row + h * D;
  for (int e = tid; e < TQ * Dn; e += 256) {  // along d in memory, transposed in smem
    const int r = e / Dn, d = e - r * Dn;
    qt[d * LQ + r] = q0 + r < T ? base[(q0 + r) * row + d] : 0.0f;
  }
  float m[4], l[4], acc[4][TDV];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    #pragma unroll
    for (int t = 0; t < TDV; ++t) acc[i][t] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < T; k0 += TK) {
    __syncthreads();  // q is written; the tiles before are read
    if (has_mask && !assay_tile_open(mask, q0, k0, TQ, TK, T, mask_ld, mask_lc)) continue;
    for (int e = tid; e < TK * Dn; e += 256) {
      const int j = e / Dn, d = e - j * Dn;
      const bool in = k0 + j < T;
      const float* src = base + (k0 + j) * row + d;
      kt[d * LK + j] = in ? src[C] : 0.0f;
      vs[j * Dn + d] = in ? src[2 * C] : 0.0f;
    }
    __syncthreads();
    float s[4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      #pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
    }
    #pragma unroll 4
    for (int d = 0; d < Dn; ++d) {
      const float4 a = *reinterpret_cast<const float4*>(qt + d * LQ + r0);
      const float4 k = *reinterpret_cast<const float4*>(kt + d * LK + c0);
      const float av[4] = {a.x, a.y, a.z, a.w}, kv[4] = {k.x, k.y, k.z, k.w};
      #pragma unroll
      for (int i = 0; i < 4; ++i) {
        #pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] += av[i] * kv[j];
      }
    }
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t qi = q0 + r0 + i;
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float v = assay_masked(s[i][j] * scale, qi, k0 + c0 + j, T, mask, mask_ld,
                                     mask_lc, has_mask);
{% if softmax %}
        s[i][j] = v;
{% else %}
        s[i][j] = v > 0.0f || v != v ? v : 0.0f;
{% endif %}
      }
{% if softmax %}
      float top = fmaxf(fmaxf(s[i][0], s[i][1]), fmaxf(s[i][2], s[i][3]));
      #pragma unroll
      for (int o = 8; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
      const float m_new = fmaxf(m[i], top);
      // a row with no finite score yet keeps weights 0 (not exp(-inf + inf) = NaN)
      const float keep = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
      float psum = 0.0f;
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = m_new == -INFINITY ? 0.0f : expf(s[i][j] - m_new);
        psum += s[i][j];
      }
      #pragma unroll
      for (int o = 8; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
      l[i] = l[i] * keep + psum;
      m[i] = m_new;
      #pragma unroll
      for (int t = 0; t < TDV; ++t) acc[i][t] *= keep;
{% endif %}
    }
    #pragma unroll
    for (int j = 0; j < 4; ++j)  // p transposed: a row's 64 keys are its half-warp's
      *reinterpret_cast<float4*>(pt + (c0 + j) * LQ + r0) =
          make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
    __syncwarp();  // (each half-warp reads only the rows it wrote)
    #pragma unroll 4
    for (int k = 0; k < TK; ++k) {
      const float4 p = *reinterpret_cast<const float4*>(pt + k * LQ + r0);
      #pragma unroll
      for (int t = 0; t < TDV; ++t) {
        const int c = tx + 16 * t;
        if (c < Dn) {
          const float v = vs[k * Dn + c];
          acc[0][t] += p.x * v;
          acc[1][t] += p.y * v;
          acc[2][t] += p.z * v;
          acc[3][t] += p.w * v;
        }
      }
    }
  }
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t qi = q0 + r0 + i;
    if (qi < T) assay_attention_store(out + (b * T + qi) * C + h * D, acc[i], l[i], tx, 16, Dn);
  }
}
{% endif %}

{% if tile %}
{% set kernel, block_rows, threads = "assay_attention_tiles", "TQ", "256" %}
{% set smem = "D * LQ + D * LK + TK * D + TK * LQ" %}
{% else %}
{% set kernel, block_rows, threads = "assay_attention_rows", "BQ", "WARPS * 32" %}
{% set smem = "BQ * D + BK * (D + 1) + BK * D" %}
{% endif %}
extern "C" int assay_attention({{ params }}, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (B <= 0 || T <= 0 || H <= 0) return 0;
  if (D <= 0 || D > {{ max_head }} || B * H > 65535) return (int)cudaErrorInvalidValue;
  const size_t bytes = sizeof(float) * (size_t)({{ smem }});
  if (bytes > 48 * 1024) {
    if ((int)bytes > assay_smem_optin()) return (int)cudaErrorInvalidValue;
    const cudaError_t e = cudaFuncSetAttribute({{ kernel }},
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)bytes);
    if (e != cudaSuccess) return (int)e;
  }
  const dim3 grid((unsigned)((T + {{ block_rows }} - 1) / {{ block_rows }}), (unsigned)(B * H));
  {{ kernel }}<<<grid, {{ threads }}, bytes, stream>>>(qkv, mask, out, B, T, H, D, mask_ld,
                                                      mask_lc, scale, has_mask);
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
    # The rows form stays the default until the register tiles are measured on a GPU.
    defaults={"cpu": {"threads": 0}, "cuda": {"tile": 0, "rows": 2}},
    safe={"cpu": {"threads": 1}, "cuda": {"tile": 0, "rows": 1}},
    strategy="fusion",  # scores, mask, softmax and the weighted sum in one kernel
    source=source, forward=forward)
