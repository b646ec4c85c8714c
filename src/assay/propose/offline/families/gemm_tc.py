"""The tensor-core GEMM of the gemm family (template ``gemm_tc``, cuda, float16/bfloat16): WMMA
16x16x16 fragments with fp32 accumulation, K slabs copied by cp.async into double-buffered
shared memory, the elementwise epilogue applied as the accumulators leave through shared
memory."""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Space
from assay.propose.offline.families.gemm_tiled import CUDA_GEMM_LAUNCH
from assay.propose.offline.families.shared import render
from assay.propose.offline.ir import Plan

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # warp_m x warp_n: each warp's share of the tile, in 16 x 16 WMMA fragments; load_vec: 8 =
    # 16-byte cp.async copies (stages 2 pipelines them), 1 = element loads.
    ("cuda", "gemm_tc"): {"tile_m": (64, 128), "tile_n": (64, 128), "k_step": (32, 64),
                          "warp_m": (32, 64), "warp_n": (32, 64), "load_vec": (1, 8),
                          "stages": (1, 2)},
}

CUDA_GEMM_TC = r"""
#include <mma.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// Tensor-core GEMM (WMMA 16x16x16 on {{ dtype }} with fp32 accumulation): a block of
// {{ nt // 32 }} warp(s) computes a {{ bm }} x {{ bn }} tile, each warp {{ wm }} x {{ wn }}; K advances
// {{ bk }} at a time{% if stages == 2 %}, the next slab copied with cp.async into the other half
// of double-buffered shared memory while the current one is multiplied{% endif %}. The
// accumulators go through shared memory once, where the fused epilogue reads them in fp32
// and stores {{ dtype }}.
typedef {{ ctype }} assay_elt;
__device__ __forceinline__ float assay_f(float x) { return x; }
__device__ __forceinline__ float assay_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float assay_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ assay_elt assay_to_elt(float x) { return {{ to_elt }}(x); }

__device__ __forceinline__ void assay_cp_async16(void* smem, const void* gmem, bool full) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = full ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void assay_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void assay_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

template <int VEC>
__global__ void __launch_bounds__({{ nt }})
assay_matmul_tiles({{ kparams }}) {
  using namespace nvcuda;
  constexpr int BM = {{ bm }}, BN = {{ bn }}, BK = {{ bk }}, WM = {{ wm }}, WN = {{ wn }};
  constexpr int STAGES = {{ stages }};
  constexpr int WARPS_N = BN / WN;
  constexpr int FM = WM / 16, FN = WN / 16;
  constexpr int NT = {{ nt }};
  constexpr int ALD = BK + 8;  // 16-byte rows, 32-byte fragment pointers
{% if trans_b %}
  constexpr int BROWS = BN, BCOLS = BK, BLD = BK + 8;  // Bs[n][k]: B^T rows, a col_major B
{% else %}
  constexpr int BROWS = BK, BCOLS = BN, BLD = BN + 8;  // Bs[k][n]: a row_major B
{% endif %}
  constexpr int A_TILE = BM * ALD, B_TILE = BROWS * BLD;
  constexpr int CLD = BN + 4;
  extern __shared__ __align__(128) unsigned char assay_gemm_smem[];
  assay_elt* As = reinterpret_cast<assay_elt*>(assay_gemm_smem);
  assay_elt* Bs = As + STAGES * A_TILE;
  float* Cs = reinterpret_cast<float*>(assay_gemm_smem);  // the accumulators, after the K loop
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t bz = blockIdx.z;
  const assay_elt* __restrict__ Ab = A + bz * sA;
  const assay_elt* __restrict__ Bb = B + bz * sB;
  const int64_t m0 = (int64_t)blockIdx.y * BM;
  const int64_t n0 = (int64_t)blockIdx.x * BN;
  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
  #pragma unroll
  for (int i = 0; i < FM; ++i) {
    #pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }

  // One slab into stage s: VEC == 8 copies 16 bytes with cp.async (zero-filled past the
  // edges), VEC == 1 element by element through registers.
  auto load = [&](int s, int64_t k0) {
    assay_elt* as = As + s * A_TILE;
    assay_elt* bs = Bs + s * B_TILE;
    for (int e = tid; e < BM * BK / VEC; e += NT) {
      const int r = e / (BK / VEC), c = (e % (BK / VEC)) * VEC;
      const int64_t gr = m0 + r, gc = k0 + c;
      const bool ok = gr < M && gc < K;
      if constexpr (VEC == 8) {
        assay_cp_async16(as + r * ALD + c, ok ? (const void*)(Ab + gr * K + gc) : (const void*)Ab, ok);
      } else {
        as[r * ALD + c] = ok ? Ab[gr * K + gc] : assay_to_elt(0.0f);
      }
    }
    for (int e = tid; e < BROWS * BCOLS / VEC; e += NT) {
      const int r = e / (BCOLS / VEC), c = (e % (BCOLS / VEC)) * VEC;
{% if trans_b %}
      const int64_t gr = n0 + r, gc = k0 + c;
      const bool ok = gr < N && gc < K;
      const int64_t at = gr * K + gc;
{% else %}
      const int64_t gr = k0 + r, gc = n0 + c;
      const bool ok = gr < K && gc < N;
      const int64_t at = gr * N + gc;
{% endif %}
      if constexpr (VEC == 8) {
        assay_cp_async16(bs + r * BLD + c, ok ? (const void*)(Bb + at) : (const void*)Bb, ok);
      } else {
        bs[r * BLD + c] = ok ? Bb[at] : assay_to_elt(0.0f);
      }
    }
  };
  auto compute = [&](int s) {
    const assay_elt* as = As + s * A_TILE;
    const assay_elt* bs = Bs + s * B_TILE;
    #pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, assay_elt, wmma::row_major> fa[FM];
{% if trans_b %}
      wmma::fragment<wmma::matrix_b, 16, 16, 16, assay_elt, wmma::col_major> fb[FN];
{% else %}
      wmma::fragment<wmma::matrix_b, 16, 16, 16, assay_elt, wmma::row_major> fb[FN];
{% endif %}
      #pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], as + (wm * WM + i * 16) * ALD + kk, ALD);
      #pragma unroll
      for (int j = 0; j < FN; ++j) {
{% if trans_b %}
        wmma::load_matrix_sync(fb[j], bs + (wn * WN + j * 16) * BLD + kk, BLD);
{% else %}
        wmma::load_matrix_sync(fb[j], bs + kk * BLD + wn * WN + j * 16, BLD);
{% endif %}
      }
      #pragma unroll
      for (int i = 0; i < FM; ++i) {
        #pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
  };

  const int64_t ntiles = (K + BK - 1) / BK;
  if constexpr (VEC == 8 && STAGES == 2) {
    if (ntiles > 0) load(0, 0);
    assay_cp_commit();
    for (int64_t t = 0; t < ntiles; ++t) {
      if (t + 1 < ntiles) load((int)((t + 1) & 1), (t + 1) * BK);
      assay_cp_commit();
      assay_cp_wait<1>();  // slab t has landed; slab t + 1 may still be in flight
      __syncthreads();
      compute((int)(t & 1));
      __syncthreads();
    }
  } else {
    for (int64_t t = 0; t < ntiles; ++t) {
      load(0, t * BK);
      if constexpr (VEC == 8) {
        assay_cp_commit();
        assay_cp_wait<0>();
      }
      __syncthreads();
      compute(0);
      __syncthreads();
    }
  }

  #pragma unroll
  for (int i = 0; i < FM; ++i) {
    #pragma unroll
    for (int j = 0; j < FN; ++j)
      wmma::store_matrix_sync(Cs + (wm * WM + i * 16) * CLD + wn * WN + j * 16, acc[i][j], CLD,
                              wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = tid; e < BM * BN; e += NT) {
    const int r = e / BN, c = e % BN;
    const int64_t row = m0 + r, col = n0 + c;
    if (row < M && col < N) {
      const int64_t i = bz * sC + row * N + col;
      (void)i;
      const float acc_v = Cs[r * CLD + c];
{% for line in epi_body %}
      {{ line }}
{% endfor %}
      out[i] = assay_to_elt({{ epi_out }});
    }
  }
}
{{ launcher }}"""

_CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
_TO_ELT = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}


def defaults(target: str) -> dict[str, int]:
    return {"tile_m": 128, "tile_n": 128, "k_step": 32, "warp_m": 64, "warp_n": 32,
            "load_vec": 8, "stages": 2}


def safe(target: str) -> dict[str, int]:
    """Small tiles, element loads, no pipelining."""
    return {"tile_m": 64, "tile_n": 64, "k_step": 32, "warp_m": 32, "warp_n": 32,
            "load_vec": 1, "stages": 1}


def kernel(values: dict[str, Any], target: str, knobs: dict[str, Any], plan: Plan) -> str:
    """``assay_gemm`` and its launcher for ``values``: the head's, the fused epilogue's, the
    parameters' and the tile's (bm, bn, bk, trans_b)."""
    bm, bn, bk, trans_b = values["bm"], values["bn"], values["bk"], values["trans_b"]
    wm, wn, stages = int(knobs["warp_m"]), int(knobs["warp_n"]), int(knobs["stages"])
    nt = (bm // wm) * (bn // wn) * 32
    a_tile = bm * (bk + 8)
    b_tile = bn * (bk + 8) if trans_b else bk * (bn + 8)
    smem = max(stages * (a_tile + b_tile) * 2, bm * (bn + 4) * 4)
    values = dict(values, nt=nt, wm=wm, wn=wn, stages=stages, vec=int(knobs["load_vec"]),
                  store_vec=False, smem_bytes=f"(size_t){smem}", dtype=plan.dtype,
                  ctype=_CTYPE[plan.dtype], to_elt=_TO_ELT[plan.dtype], split=False)
    values["launcher"] = render(CUDA_GEMM_LAUNCH, **values)
    return render(CUDA_GEMM_TC, **values)
