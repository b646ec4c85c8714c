"""The tiled GEMM of the gemm family (template ``gemm``): on the cpu target C++ tiles of the
output per OpenMP task, B's K slab packed for a unit-stride `omp simd` inner loop; on cuda an
fp32 register-blocked, warp-tiled SIMT GEMM, K slabs staged through registers or copied by a
cp.async ring. The elementwise epilogue is fused into its stores (or the row kernel follows).
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Space
from assay.propose.offline.families.shared import render
from assay.propose.offline.ir import Plan

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # tile_m x tile_n: the output tile of one OpenMP task; k_step: the K slab packed at a time.
    ("cpu", "gemm"): {"threads": (0, 1, 2, 4, 8), "tile_m": (16, 32, 64),
                      "tile_n": (64, 128, 256), "k_step": (64, 128, 256),
                      "unroll": (1, 2, 4, 8)},
    # tile_m x tile_n: the block's output tile (256 x 128 of 4 x 4 threads would be 2048
    # threads: 8 x 4 per thread instead); k_step: the K slab in shared memory;
    # thread_m x thread_n: each thread's register tile, in 4 x 4 sub-tiles; load_vec: 4 =
    # float4 global loads and stores, 16-byte cp.async copies (when K and N allow); stages:
    # 2 = double-buffered slabs (the next one loads while the current one is multiplied),
    # 1 = load, sync, multiply; 3, 4 = a ring of that many slabs filled by cp.async (sm_80+).
    # cp_async: 1 = global -> shared copies by cp.async (A, and B^T, stored K-contiguous) into a
    # ring of max(stages, 2) slabs; 0 = through registers (stages 3, 4 use cp.async anyway).
    # On an H200 at 4096^3 (2026-11-24) the cp.async forms ran at 0.76-0.81x of cuBLAS and 256
    # x 128 tiles at 0.87x, against 0.89x for the register-staged default: kept for the search.
    # min_blocks: blocks per SM the register budget must allow (__launch_bounds__; 1 where 2
    # would leave too few registers for the thread's tile, e.g. 256 threads of 8 x 16).
    # warp_tile: 1 = a warp's lanes own a 4 x 8 (or 8 x 4) grid of sub-tiles repeated over the
    # warp's tile (conflict-free float4 reads of shared memory), 0 = each thread's sub-tiles
    # adjacent (bank conflicts for 8- and 16-wide thread tiles).
    # split_k: 1 = where the output has fewer tiles than the device has SMs and K is long
    # (L1_6's 256 x 256 output of K = 524288: 4 tiles on 132 SMs, 0.04x of cuBLAS without it),
    # K is cut into parts, one block per (tile, part), each part's sums stored to a workspace
    # and added in a fixed order by a second kernel that applies the epilogue; 0 = never.
    ("cuda", "gemm"): {"tile_m": (64, 128, 256), "tile_n": (64, 128), "k_step": (8, 16, 32),
                       "thread_m": (4, 8), "thread_n": (4, 8, 16), "load_vec": (1, 4),
                       "stages": (1, 2, 3, 4), "cp_async": (0, 1), "min_blocks": (1, 2),
                       "warp_tile": (0, 1), "split_k": (0, 1)},
}

# GEMMs. `assay_gemm` computes C = A @ B (or A @ B^T: a linear layer's weight is [N, K]) for a
# batch of products (blockIdx.z / the outer task loop) and applies the fused elementwise
# epilogue to every element as it is stored: `acc_v` is the product's value, `i` its flat index
# in the output, the leaves are read as the elementwise template reads them. With a row
# epilogue (softmax, norms, sums) the GEMM stores the product itself and the row kernel follows.

CPP_GEMM = r"""
#include <stdlib.h>
// Tiled GEMM: each task is a {{ bm }} x {{ bn }} tile of the output; K advances {{ bk }} at a
// time, the slab of B packed into a contiguous [{{ bk }}][{{ bn }}] buffer (rows of B^T for a
// linear layer), so the inner loop is a unit-stride `omp simd` AXPY into the tile's
// accumulators. Plain fp32 multiply-adds in K order.
extern "C" int assay_gemm({{ params }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t MB = {{ bm }}, NB = {{ bn }}, KB = {{ bk }};
  if (M <= 0 || N <= 0 || batch <= 0) return 0;
  const int64_t mt = (M + MB - 1) / MB, nt = (N + NB - 1) / NB;
  const int64_t tasks = batch * mt * nt;
  int failed = 0;
{% if parallel %}
  #pragma omp parallel{{ omp_clause }} if(tasks > 1 && M * N * K > 32768) reduction(|:failed)
{% endif %}
  {
    float* acc = static_cast<float*>(aligned_alloc(64, sizeof(float) * {{ bm * bn }}));
    float* bp = static_cast<float*>(aligned_alloc(64, sizeof(float) * {{ bk * bn }}));
    if (acc == nullptr || bp == nullptr) {
      failed = 1;
    } else {
{% if parallel %}
      #pragma omp for schedule(static)
{% endif %}
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t bz = t / (mt * nt), rest = t % (mt * nt);
        const int64_t m0 = (rest / nt) * MB, n0 = (rest % nt) * NB;
        const int64_t mb = std::min(MB, M - m0), nb = std::min(NB, N - n0);
        const float* Ab = A + bz * sA;
        const float* Bb = B + bz * sB;
        // A's element (m, k) at m * am + k * ak: [M][K] rows, or (A given as A.T) [K][M]
        const int64_t am = {{ "1" if trans_a else "K" }}, ak = {{ "M" if trans_a else "1" }};
        std::fill(acc, acc + MB * NB, 0.0f);
        for (int64_t k0 = 0; k0 < K; k0 += KB) {
          const int64_t kb = std::min(KB, K - k0);
{% if trans_b %}
          // B^T, transposed 16 K-rows at a time: the 16 rows of the slab being written stay in
          // L1 while the columns pass, and each row of B is read along K (unit stride). One
          // element at a time down the whole slab, each store or load touches a line at a
          // power-of-two stride that maps to the same few cache sets (measured on a 256 x 512
          // x 256 linear layer: 26 ms, against 1 ms for torch).
          for (int64_t kq = 0; kq < kb; kq += 16) {
            const int64_t ke = std::min<int64_t>(kq + 16, kb);
            for (int64_t j = 0; j < nb; ++j) {
              const float* src = Bb + (n0 + j) * K + k0;
              for (int64_t kk = kq; kk < ke; ++kk) bp[kk * NB + j] = src[kk];
            }
          }
          for (int64_t kk = 0; kk < kb; ++kk) {
            for (int64_t j = nb; j < NB; ++j) bp[kk * NB + j] = 0.0f;
          }
{% else %}
          for (int64_t kk = 0; kk < kb; ++kk) {
            float* dst = bp + kk * NB;
            for (int64_t j = 0; j < nb; ++j) dst[j] = Bb[(k0 + kk) * N + n0 + j];
            for (int64_t j = nb; j < NB; ++j) dst[j] = 0.0f;
          }
{% endif %}
          // Register-blocked: 4 rows x 16 columns of the tile stay in registers for the whole
          // slab (8 AVX vectors), each B vector loaded once for 4 rows and each A value
          // broadcast once for 16 columns; the accumulation order per element (K ascending)
          // is the same as one row at a time, which covers the rows left over.
          int64_t r = 0;
          for (; r + 4 <= mb; r += 4) {
            const float* a = Ab + (m0 + r) * am + k0 * ak;
            for (int64_t j0 = 0; j0 < NB; j0 += 16) {
              float c[4][16];
              for (int q = 0; q < 4; ++q)
                for (int j = 0; j < 16; ++j) c[q][j] = acc[(r + q) * NB + j0 + j];
              for (int64_t kk = 0; kk < kb; ++kk) {
                const float* b = bp + kk * NB + j0;
                for (int q = 0; q < 4; ++q) {
                  const float av = a[q * am + kk * ak];
                  #pragma omp simd
                  for (int j = 0; j < 16; ++j) c[q][j] += av * b[j];
                }
              }
              for (int q = 0; q < 4; ++q)
                for (int j = 0; j < 16; ++j) acc[(r + q) * NB + j0 + j] = c[q][j];
            }
          }
          for (; r < mb; ++r) {
            const float* a = Ab + (m0 + r) * am + k0 * ak;
            float* c = acc + r * NB;
            for (int64_t kk = 0; kk < kb; ++kk) {
              const float av = a[kk * ak];
              const float* b = bp + kk * NB;
              #pragma omp simd simdlen({{ simdlen }})
              for (int64_t j = 0; j < NB; ++j) c[j] += av * b[j];
            }
          }
        }
        for (int64_t r = 0; r < mb; ++r) {
          const int64_t row = m0 + r;
          for (int64_t j = 0; j < nb; ++j) {
            const int64_t i = bz * sC + row * N + n0 + j;
            const float acc_v = acc[r * NB + j];
{% for line in epi_body %}
            {{ line }}
{% endfor %}
            out[i] = {{ epi_out }};
          }
        }
      }
    }
    free(acc);
    free(bp);
  }
  return failed ? 12 : 0;  // 12: ENOMEM
}
"""

CUDA_GEMM = r"""
{% if cp_async %}
// Copies of VEC floats global -> shared memory that bypass registers (sm_80+), zero-filled
// (src-size 0: nothing is read) past the matrix's edges: 16 bytes with .cg (L2 only: a block
// reads each slab once), 4 bytes with .ca (.cg takes only 16). The "memory" clobbers keep the
// compiler from moving shared-memory accesses across them. dst: a shared-space address
// (converted once per kernel, not per copy).
template <int VEC>
__device__ __forceinline__ void assay_cp_async(unsigned dst, const float* gmem, bool full) {
  static_assert(VEC == 1 || VEC == 4, "4- or 16-byte copies");
  const int bytes = full ? 4 * VEC : 0;
  if constexpr (VEC == 4) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(gmem), "r"(bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(gmem), "r"(bytes) : "memory");
  }
}
__device__ __forceinline__ void assay_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void assay_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

{% endif %}
// A ROWS x COLS tile of a row-major matrix (rows `ld` floats apart) moved global -> registers
// -> shared memory by NT threads, VEC consecutive floats per vector along a row, zeros past the
// matrix's edges. Vector e = tid + p * NT of the tile is thread tid's p-th: every tile puts a
// thread's vectors at the same places, (r, c) + (drow(p), dcol(p)) with compile-time offsets,
// and only the tile's origin moves along K, so the 64-bit address math is done once and each
// tile costs a pointer advance and 32-bit compares.
// K_IN_ROW: the tile's columns run along K (A, and B^T of a linear layer): shared memory gets
// it transposed, [COLS][SLD], so that the compute loop reads float4s along M (N); otherwise
// (B) its rows run along K and it is stored as it is, [ROWS][SLD].
template <int ROWS, int COLS, int VEC, int NT, bool K_IN_ROW>
struct assay_gemm_operand {
  static constexpr int ROW_VECS = COLS / VEC;
  static constexpr int PER = (ROWS * ROW_VECS + NT - 1) / NT;  // vectors per thread
  static constexpr int SLD = (K_IN_ROW ? ROWS : COLS) + 4;    // +4: see SMEM below
  // Both are powers of two: the block's threads span whole rows, or a row spans whole blocks.
  static_assert(NT % ROW_VECS == 0 || ROW_VECS % NT == 0, "threads and rows must nest");
  __host__ __device__ static constexpr int drow(int p) {
    return NT >= ROW_VECS ? p * (NT / ROW_VECS) : p / (ROW_VECS / NT);
  }
  __host__ __device__ static constexpr int dcol(int p) {
    return NT >= ROW_VECS ? 0 : (p % (ROW_VECS / NT)) * NT * VEC;
  }
  const int r, c;      // the thread's first vector in the tile
  const int64_t ld;
  const float* src;    // its address in the current tile
  float v[PER][VEC];

  __device__ __forceinline__ assay_gemm_operand(int tid, const float* origin, int64_t ld_)
      : r(tid / ROW_VECS), c((tid % ROW_VECS) * VEC), ld(ld_), src(origin + r * ld_ + c) {}

  // Loads the current tile (valid: rows < rows_left, columns < cols_left; VEC > 1 only when
  // cols_left is a multiple of VEC) and moves on to the next one along K.
  __device__ __forceinline__ void load(int rows_left, int cols_left) {
    #pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int rr = r + drow(p), cc = c + dcol(p);
      if (rr < ROWS && rr < rows_left && cc < cols_left) {
        assay_load<VEC>(src, drow(p) * ld + dcol(p), v[p]);
      } else {
        #pragma unroll
        for (int u = 0; u < VEC; ++u) v[p][u] = 0.0f;
      }
    }
    src += K_IN_ROW ? (int64_t)COLS : ROWS * ld;
  }

  __device__ __forceinline__ void store(float* dst) const {
    #pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int rr = r + drow(p), cc = c + dcol(p);
      if (rr >= ROWS) continue;
      #pragma unroll
      for (int u = 0; u < VEC; ++u) {
        if (K_IN_ROW) dst[(cc + u) * SLD + rr] = v[p][u];
        else dst[rr * SLD + cc + u] = v[p][u];
      }
    }
  }
{% if cp_async %}

  // The cp.async form: the tile goes straight to shared memory, K_IN_ROW tiles untransposed
  // (the compute loop reads float4s along K), row rr at rr * COLS + 4 * (rr / 4): a float4 of
  // padding after every 4 rows (why: the kernel's SMEM comment); B as store() puts it.
  __host__ __device__ static constexpr int at(int rr, int cc) {
    return K_IN_ROW ? rr * COLS + 4 * (rr / 4) + cc : rr * SLD + cc;
  }

  // Copies the current tile to shared-space address dst (valid as for load) and moves on to
  // the next one along K. (rr < ROWS holds by construction where the threads' vectors cover
  // the tile exactly: no test then.)
  __device__ __forceinline__ void copy(unsigned dst, int rows_left, int cols_left) {
    #pragma unroll
    for (int p = 0; p < PER; ++p) {
      const int rr = r + drow(p), cc = c + dcol(p);
      if (ROWS * ROW_VECS % NT != 0 && rr >= ROWS) continue;
      const bool ok = rr < rows_left && cc < cols_left;
      assay_cp_async<VEC>(dst + 4 * at(rr, cc), ok ? src + drow(p) * ld + dcol(p) : src, ok);
    }
    src += K_IN_ROW ? (int64_t)COLS : ROWS * ld;
  }
{% endif %}
};

// Tiled fp32 GEMM: a block of {{ nt }} threads computes a {{ bm }} x {{ bn }} tile of the output,
// each thread {{ tm }} x {{ tn }} outputs in registers as {{ tm // 4 }} x {{ tn // 4 }} sub-tiles of 4 x 4 (outer
// products of float4 column slices of A and row slices of B read from shared memory, {% if cp_async %}A
// stored as it is, K-contiguous rows read as float4s along K: 4 k-steps a read{% else %}A stored
// transposed{% endif %}). {% if warp_tile %}Warp tiling: a warp's lanes form a 4 x 8 or 8 x 4 grid of sub-tiles
// (LANES_M x LANES_N), repeated over the warp's tile, so each float4 read of the warp touches
// at most 8 consecutive float4s (128 bytes): broadcasts, no bank conflict.{% else %}A thread's
// sub-tiles are adjacent (rows tr * TM.., columns tc * TN..): 8-wide tiles read float4s 32
// bytes apart, bank conflicts.{% endif %} K advances {{ bk }} at a time{% if cp_async %}; slabs are copied
// global -> shared memory with cp.async into a ring of {{ stages }}, {{ stages - 1 }} in flight while one is
// multiplied (no registers, no shared stores in the instruction stream: cuBLAS's form, 3
// stages at 256 x 128){% elif stages == 2 %}; the next
// slab is loaded into registers while the current one is multiplied, into the other half of
// double-buffered shared memory{% endif %}. Plain fp32 FMAs in K order, no TF32{% if split %}; where the
// output has too few tiles for the device, K in parts (SPLIT, see below){% endif %}.
{% if cp_async %}
// SMEM: A{{ " and B^T" if trans_b else "" }} in rows of BK floats along K with a float4 of padding after every 4 rows.
// A warp's fragment read touches one row in each of 8 (or 4) consecutive groups of 4 rows (its
// lanes' 4 x 4 sub-tiles), and group g starts g * (BK + 1) float4s in: BK + 1 is odd, so the
// groups fall on distinct float4 bank groups, conflict-free; padded rows could not do it, as
// rows 4 apart would be a multiple of 4 float4s apart (4-way conflicts).
{% if not trans_b %}
// B as it is, [BK][BN + 4].
{% endif %}
{% else %}
// SMEM: A^T rows of BM + 4 floats make the transposed stores of 8-deep slabs conflict-free
// (the two halves of a warp land 16 banks apart); 16- and 32-deep slabs conflict 2- and 4-way
// there, a few stores per slab against BK x {{ tm // 4 + tn // 4 }} float4 reads.
{% endif %}
template <int VEC{% if split %}, bool SPLIT{% endif %}>
__global__ void __launch_bounds__({{ nt }}, {{ min_blocks }})
assay_matmul_tiles({{ kparams }}) {
  constexpr int BM = {{ bm }}, BN = {{ bn }}, BK = {{ bk }}, TM = {{ tm }}, TN = {{ tn }};
  constexpr int NT = (BM / TM) * (BN / TN);
  constexpr int STAGES = {{ stages }};
  constexpr int ALD = BM + 4, BLD = BN + 4;
  constexpr bool WARP_TILE = {{ "true" if warp_tile else "false" }};
  // Where a thread's outputs are: rows row0 + q * ROW_STEP + (0..3) for q < TM / 4, columns
  // col0 + q * COL_STEP + (0..3) for q < TN / 4.
  // A warp's grid of sub-tiles, LANES_M x LANES_N: 4 x 8, or 8 x 4 where that makes the warp's
  // tile squarer (fewer distinct floats read per FMA; 64 x 64 for 8 x 16 threads: 0.885x
  // against 0.868x cuBLAS for 32 x 128 on an H200) or a row of 8 would not fit in BN.
  constexpr int LANES_N = (TN >= 2 * TM || BN / TN < 8) ? 4 : 8, LANES_M = 32 / LANES_N;
  constexpr int WM = TM * LANES_M, WN = TN * LANES_N;  // a warp's tile (WARP_TILE)
  static_assert(!WARP_TILE || (BM % WM == 0 && BN % WN == 0 && (BM / WM) * (BN / WN) * 32 == NT),
                "the warps must tile the block");
  constexpr int ROW_STEP = WARP_TILE ? 4 * LANES_M : 4, COL_STEP = WARP_TILE ? 4 * LANES_N : 4;
  extern __shared__ float4 assay_gemm_smem[];
{% if cp_async %}
  // A slab of BM rows (B^T: BN rows) along K, as assay_gemm_operand::at places them.
  constexpr int A_TILE = BM * (BK + 1), B_TILE = {{ "BN * (BK + 1)" if trans_b else "BK * BLD" }};
  float* As = reinterpret_cast<float*>(assay_gemm_smem);  // [STAGES][A_TILE]
  float* Bs = As + STAGES * A_TILE;                        // [STAGES][B_TILE]
{% else %}
  float* As = reinterpret_cast<float*>(assay_gemm_smem);  // [STAGES][BK][ALD]: A^T slabs
  float* Bs = As + STAGES * BK * ALD;                      // [STAGES][BK][BLD]
{% endif %}
{% for line in prologue %}
  {{ line }}
{% endfor %}
{% if split %}
  // Split K (SPLIT): blockIdx.z = product * parts + part; part p sums K's slabs
  // [kb, kb + klen), a whole number of BK-slabs, and stores them to the workspace.
  const int64_t part = SPLIT ? blockIdx.z % parts : 0;
  const int64_t bz = SPLIT ? blockIdx.z / parts : blockIdx.z;
  const int64_t kchunk = SPLIT ? ((K + parts - 1) / parts + BK - 1) / BK * BK : K;
  const int64_t kb = min(K, part * kchunk), klen = min(K - kb, kchunk);
{% else %}
  const int64_t bz = blockIdx.z;
  const int64_t kb = 0, klen = K;
{% endif %}
  const int64_t m0 = (int64_t)blockIdx.y * BM;
  const int64_t n0 = (int64_t)blockIdx.x * BN;
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int row0 = WARP_TILE ? (warp / (BN / WN)) * WM + (lane / LANES_N) * 4
                             : (tid / (BN / TN)) * TM;
  const int col0 = WARP_TILE ? (warp % (BN / WN)) * WN + (lane % LANES_N) * 4
                             : (tid % (BN / TN)) * TN;
  (void)warp; (void)lane;

  // The operands' slabs: A [BM][BK] at row m0, B^T [BN][BK] at row n0 or B [BK][BN] at column
  // n0; valid rows and columns of this block's tile (at most BM, BN: 32-bit compares).
  const int m_left = (int)min(M - m0, (int64_t)BM), n_left = (int)min(N - n0, (int64_t)BN);
{% if trans_a %}
  // A given as A.T, [K][M]: its slab [BK][BM] is stored as loaded, the A^T layout below.
  assay_gemm_operand<BK, BM, VEC, NT, false> a_op(tid, A + bz * sA + kb * M + m0, M);
{% else %}
  assay_gemm_operand<BM, BK, VEC, NT, true> a_op(tid, A + bz * sA + m0 * K + kb, K);
{% endif %}
{% if trans_b %}
  assay_gemm_operand<BN, BK, VEC, NT, true> b_op(tid, B + bz * sB + n0 * K + kb, K);
{% else %}
  assay_gemm_operand<BK, BN, VEC, NT, false> b_op(tid, B + bz * sB + kb * N + n0, N);
{% endif %}
{% if cp_async %}
  // Global -> shared memory stage s: the slab at k0, zeros past the edges.
  const unsigned as_addr = static_cast<unsigned>(__cvta_generic_to_shared(As));
  const unsigned bs_addr = static_cast<unsigned>(__cvta_generic_to_shared(Bs));
  auto copy = [&](int s, int64_t k0) {
    const int k_left = (int)min(klen - k0, (int64_t)BK);
    a_op.copy(as_addr + 4 * s * A_TILE, m_left, k_left);
{% if trans_b %}
    b_op.copy(bs_addr + 4 * s * B_TILE, n_left, k_left);
{% else %}
    b_op.copy(bs_addr + 4 * s * B_TILE, k_left, n_left);
{% endif %}
  };
{% else %}
  // Global -> registers: the slab at k0, zeros past the edges.
  auto load = [&](int64_t k0) {
    const int k_left = (int)min(klen - k0, (int64_t)BK);
    a_op.load({{ "k_left, m_left" if trans_a else "m_left, k_left" }});
{% if trans_b %}
    b_op.load(n_left, k_left);
{% else %}
    b_op.load(k_left, n_left);
{% endif %}
  };
  // Registers -> shared memory stage s.
  auto store = [&](int s) {
    a_op.store(As + s * BK * ALD);
    b_op.store(Bs + s * BK * BLD);
  };
{% endif %}

  float acc[TM][TN];
  #pragma unroll
  for (int ii = 0; ii < TM; ++ii) {
    #pragma unroll
    for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = 0.0f;
  }
{% if cp_async %}
  // One slab, 4 k-steps at a time: a float4 along K of each of the thread's rows of A, then
  // {% if trans_b %}per column of B^T a float4 along K, 4 FMAs into each of the column's
  // accumulators{% else %}per k-step B's float4 row fragments and their outer product{% endif %}. Each accumulator still
  // takes its FMAs in K order. (A row's base: rows are 4-aligned, so row0 + 4-steps keep the
  // padding of at() a compile-time offset.)
  auto compute = [&](int s) {
    const float* as = As + s * A_TILE + row0 * (BK + 1);
{% if trans_b %}
    const float* bs = Bs + s * B_TILE + col0 * (BK + 1);
{% else %}
    const float* bs = Bs + s * B_TILE + col0;
{% endif %}
    #pragma unroll
    for (int kq = 0; kq < BK; kq += 4) {
      float a[TM][4];
      #pragma unroll
      for (int ii = 0; ii < TM; ++ii) {
        const float4 t = *reinterpret_cast<const float4*>(as + (ii / 4) * ROW_STEP * (BK + 1) + (ii % 4) * BK + kq);
        a[ii][0] = t.x; a[ii][1] = t.y; a[ii][2] = t.z; a[ii][3] = t.w;
      }
{% if trans_b %}
      #pragma unroll
      for (int jj = 0; jj < TN; ++jj) {
        const float4 t = *reinterpret_cast<const float4*>(bs + (jj / 4) * COL_STEP * (BK + 1) + (jj % 4) * BK + kq);
        const float b[4] = {t.x, t.y, t.z, t.w};
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
          #pragma unroll
          for (int ii = 0; ii < TM; ++ii) acc[ii][jj] = fmaf(a[ii][u], b[u], acc[ii][jj]);
        }
      }
{% else %}
      #pragma unroll
      for (int u = 0; u < 4; ++u) {
        float b[TN];
        #pragma unroll
        for (int q = 0; q < TN / 4; ++q) {
          const float4 t = *reinterpret_cast<const float4*>(bs + (kq + u) * BLD + q * COL_STEP);
          b[4 * q] = t.x; b[4 * q + 1] = t.y; b[4 * q + 2] = t.z; b[4 * q + 3] = t.w;
        }
        #pragma unroll
        for (int ii = 0; ii < TM; ++ii) {
          #pragma unroll
          for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = fmaf(a[ii][u], b[jj], acc[ii][jj]);
        }
      }
{% endif %}
    }
  };
{% else %}
  // One slab: outer products of A's and B's float4 fragments. (Reading the next row's
  // fragments before this row's FMAs in the source left ptxas's schedule unchanged.)
  auto compute = [&](int s) {
    const float* as = As + s * BK * ALD + row0;
    const float* bs = Bs + s * BK * BLD + col0;
    #pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
      #pragma unroll
      for (int q = 0; q < TM / 4; ++q) {
        const float4 t = *reinterpret_cast<const float4*>(as + kk * ALD + q * ROW_STEP);
        a[4 * q] = t.x; a[4 * q + 1] = t.y; a[4 * q + 2] = t.z; a[4 * q + 3] = t.w;
      }
      #pragma unroll
      for (int q = 0; q < TN / 4; ++q) {
        const float4 t = *reinterpret_cast<const float4*>(bs + kk * BLD + q * COL_STEP);
        b[4 * q] = t.x; b[4 * q + 1] = t.y; b[4 * q + 2] = t.z; b[4 * q + 3] = t.w;
      }
      #pragma unroll
      for (int ii = 0; ii < TM; ++ii) {
        #pragma unroll
        for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = fmaf(a[ii], b[jj], acc[ii][jj]);
      }
    }
  };
{% endif %}

  const int64_t ntiles = (klen + BK - 1) / BK;
{% if cp_async %}
  // Slab t's copies are commit group t (an empty group once none are left, so the count stays
  // exact). Waiting until at most STAGES - 2 groups are pending lands this thread's copies of
  // slab t; the barrier makes every thread's visible, and tells that every thread is done
  // with slab t - 1, whose stage the copy of slab t + STAGES - 1 then reuses: one barrier a slab.
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ntiles) copy(s, (int64_t)s * BK);
    assay_cp_commit();
  }
  int s_read = 0, s_write = STAGES - 1;
  for (int64_t t = 0; t < ntiles; ++t) {
    assay_cp_wait<STAGES - 2>();
    __syncthreads();
    if (t + STAGES - 1 < ntiles) copy(s_write, (t + STAGES - 1) * BK);  // in flight meanwhile
    assay_cp_commit();
    compute(s_read);
    s_read = s_read + 1 == STAGES ? 0 : s_read + 1;
    s_write = s_write + 1 == STAGES ? 0 : s_write + 1;
  }
{% else %}
  if (ntiles > 0) {
    load(0);
    store(0);
  }
  __syncthreads();
  for (int64_t t = 0; t < ntiles; ++t) {
    if (STAGES == 2) {
      if (t + 1 < ntiles) load((t + 1) * BK);  // in flight while this slab is multiplied
      compute((int)(t & 1));
      if (t + 1 < ntiles) store((int)((t + 1) & 1));
      __syncthreads();
    } else {
      compute(0);
      __syncthreads();
      if (t + 1 < ntiles) {
        load((t + 1) * BK);
        store(0);
      }
      __syncthreads();
    }
  }
{% endif %}

  // Epilogue: the fused formula per element, stored a 4-wide sub-tile row at a time: float4
  // stores when N % 4 == 0 (VEC == 4: a sub-tile row is then wholly in or out).
  #pragma unroll
  for (int ii = 0; ii < TM; ++ii) {
    const int tile_r = row0 + (ii / 4) * ROW_STEP + ii % 4;
    if (tile_r >= m_left) continue;
    const int64_t row = m0 + tile_r;
    #pragma unroll
    for (int q = 0; q < TN / 4; ++q) {
      const int tile_c = col0 + q * COL_STEP;
{% if split %}
      if (SPLIT) {  // this part's sums, as they are: assay_matmul_parts_sum adds the parts
        float* wp = ws + ((part * batch + bz) * M + row) * N + n0 + tile_c;
        if (VEC == 4) {
          if (tile_c < n_left) *reinterpret_cast<float4*>(wp) = make_float4(acc[ii][4 * q], acc[ii][4 * q + 1], acc[ii][4 * q + 2], acc[ii][4 * q + 3]);
        } else {
          #pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (tile_c + u < n_left) wp[u] = acc[ii][4 * q + u];
          }
        }
        continue;
      }
{% endif %}
      float o[4];
      #pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t col = n0 + tile_c + u;
        float res = 0.0f;
        if (tile_c + u < n_left) {
          const int64_t i = bz * sC + row * N + col;
          (void)i;
          const float acc_v = acc[ii][4 * q + u];
{% for line in epi_body %}
          {{ line }}
{% endfor %}
          res = {{ epi_out }};
        }
        o[u] = res;
      }
      const int64_t base = bz * sC + row * N + n0 + tile_c;
      if (VEC == 4) {
        if (tile_c < n_left) __stwb(reinterpret_cast<float4*>(out + base), make_float4(o[0], o[1], o[2], o[3]));
      } else {
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (tile_c + u < n_left) out[base + u] = o[u];
        }
      }
    }
  }
}
{% if split %}

// The parts' sums added in part order (the same result on every run), then the epilogue.
__global__ void __launch_bounds__(256) assay_matmul_parts_sum({{ kparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t mn = M * N, total = batch * mn;
  for (int64_t t = (int64_t)blockIdx.x * 256 + threadIdx.x; t < total; t += (int64_t)gridDim.x * 256) {
    float acc_v = 0.0f;
    for (int64_t p = 0; p < parts; ++p) acc_v += ws[p * total + t];
    const int64_t bz = t / mn, i = bz * sC + (t - bz * mn);
    (void)i;
{% for line in epi_body %}
    {{ line }}
{% endfor %}
    out[i] = {{ epi_out }};
  }
}
{% endif %}
{{ launcher }}"""

# The host side shared by both CUDA GEMMs: grid, dynamic shared memory (opted in above 48 KB),
# the vector instantiation when sizes and pointers allow it.
CUDA_GEMM_LAUNCH = r"""
{% set kernel_t = "assay_matmul_tiles<VEC, SPLIT>" if split else "assay_matmul_tiles<VEC>" %}
template <int VEC{% if split %}, bool SPLIT{% endif %}>
static int assay_gemm_launch(dim3 grid, size_t smem, cudaStream_t stream, {{ kparams }}) {
  if (smem > (size_t)assay_smem_optin()) return (int)cudaErrorInvalidConfiguration;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute({{ kernel_t }},
        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  {{ kernel_t }}<<<grid, {{ nt }}, smem, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
}
{% if split %}

// How many parts K is cut into (see the kernel): 1 unless the output's tiles leave SMs idle
// and K holds at least 16 slabs per part; then enough parts for a block per SM, at most 64.
// The caller sizes the workspace from it (parts * batch * M * N floats when parts > 1).
// (stream_ptr: every entry point of the file takes the stream last; the device's SMs.)
extern "C" int assay_gemm_parts(int64_t M, int64_t N, int64_t K, int64_t batch, void* stream_ptr) {
  (void)stream_ptr;
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0) return 1;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  const int64_t tiles = ((N + {{ bn - 1 }}) / {{ bn }}) * ((M + {{ bm - 1 }}) / {{ bm }}) * batch;
  if (tiles >= sms) return 1;
  int64_t parts = std::min<int64_t>((sms + tiles - 1) / tiles, K / (16 * {{ bk }}));
  parts = std::min<int64_t>(parts, std::min<int64_t>(64, 65535 / batch));
  return (int)std::max<int64_t>(parts, 1);
}
{% endif %}

extern "C" int assay_gemm({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (M <= 0 || N <= 0 || batch <= 0) return 0;
  const int64_t gx = (N + {{ bn - 1 }}) / {{ bn }}, gy = (M + {{ bm - 1 }}) / {{ bm }};
  if (gx > 2147483647 || gy > 65535 || batch > 65535) return (int)cudaErrorInvalidConfiguration;
  const size_t smem = {{ smem_bytes }};
  const bool vec = {{ vec }} > 1 && K % {{ vec }} == 0 && ({{ "true" if trans_b and not store_vec else "false" }} || N % {{ vec }} == 0){% if trans_a %} && M % {{ vec }} == 0{% endif %}
                   && assay_aligned(A, 16) && assay_aligned(B, 16){% if store_vec %} && assay_aligned(out, 16){% endif %};
{% if split %}
  if (parts > 1) {
    if (parts * batch > 65535 || !assay_aligned(ws, 16)) return (int)cudaErrorInvalidConfiguration;
    const dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)(batch * parts));
    const int err = vec ? assay_gemm_launch<{{ vec }}, true>(grid, smem, stream, {{ kargs }})
                        : assay_gemm_launch<1, true>(grid, smem, stream, {{ kargs }});
    if (err) return err;
    const int64_t total = batch * M * N;
    const unsigned blocks = (unsigned)std::min<int64_t>((total + 255) / 256, 65535);
    assay_matmul_parts_sum<<<blocks, 256, 0, stream>>>({{ kargs }});
    return (int)cudaGetLastError();
  }
{% endif %}
  const dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)batch);
  if (vec) return assay_gemm_launch<{{ vec }}{{ ", false" if split else "" }}>(grid, smem, stream, {{ kargs }});
  return assay_gemm_launch<1{{ ", false" if split else "" }}>(grid, smem, stream, {{ kargs }});
}
"""


def defaults(target: str) -> dict[str, int]:
    if target == "cpu":
        return {"threads": 0, "tile_m": 32, "tile_n": 128, "k_step": 128, "unroll": 4}
    # Register-blocked SGEMM: 128 x 128 tiles, 8 x 16 per thread (128 threads, 215 registers,
    # 2 blocks per SM), warp tiles of 64 x 64, K slabs of 8, float4 loads, double buffering.
    # Measured on an H200 against cuBLAS without TF32 (evidence of 2026-11-23; now
    # `probe_gpu.py --sweep gemm`): 0.89x at 4096^3 and 0.89x batched (L1_15), where 8 x 8 per
    # thread reached 0.80-0.82x with warp tiling, 0.76-0.79x without.
    return {"tile_m": 128, "tile_n": 128, "k_step": 8, "thread_m": 8, "thread_n": 16,
            "load_vec": 4, "stages": 2, "cp_async": 0, "min_blocks": 2, "warp_tile": 1,
            "split_k": 1}


def safe(target: str) -> dict[str, int]:
    """Small tiles, no vector accesses, no pipelining, serial on the host."""
    if target == "cpu":
        return {"threads": 1, "tile_m": 16, "tile_n": 64, "k_step": 64, "unroll": 1}
    return {"tile_m": 64, "tile_n": 64, "k_step": 8, "thread_m": 4, "thread_n": 4,
            "load_vec": 1, "stages": 1, "cp_async": 0, "min_blocks": 1, "warp_tile": 0,
            "split_k": 0}


def uses_split(target: str, knobs: dict[str, Any]) -> bool:
    """Whether this template's CUDA GEMM may split K (knob split_k): its entry point then
    takes the workspace ``ws`` and ``parts`` (from ``assay_gemm_parts``)."""
    return target == "cuda" and bool(knobs.get("split_k", 0))


def kernel(values: dict[str, Any], target: str, knobs: dict[str, Any], plan: Plan) -> str:
    """``assay_gemm`` (and on cuda its launcher) for ``values``: the head's, the fused
    epilogue's, the parameters' and the tile's (bm, bn, bk, trans_b)."""
    if target == "cpu":
        threads = int(knobs["threads"])
        return render(CPP_GEMM, **values, parallel=threads != 1,
                      simdlen=4 * int(knobs["unroll"]),
                      omp_clause=f" num_threads(assay_threads({threads}))" if threads > 1 else "")
    bm, bn, bk, trans_b = values["bm"], values["bn"], values["bk"], values["trans_b"]
    tm, tn, stages = int(knobs["thread_m"]), int(knobs["thread_n"]), int(knobs["stages"])
    nt = (bm // tm) * (bn // tn)
    while nt > 1024:  # 256 x 128 tiles of 4 x 4 threads: 8 x 4 instead (a block's limit)
        tm *= 2
        nt //= 2
    # cp.async (knob cp_async, or stages >= 3: register staging holds one slab ahead at most):
    # a ring of at least 2 slabs, A (and B^T) K-contiguous in rows padded every 4 rows.
    use_async = bool(knobs.get("cp_async", 0)) or stages >= 3
    if values.get("trans_a"):  # cp.async cannot transpose A^T's slabs: register staging
        use_async, stages = False, min(stages, 2)
    if use_async:
        stages = max(stages, 2)
        b_tile = bn * (bk + 1) if trans_b else bk * (bn + 4)
        smem = stages * (bm * (bk + 1) + b_tile) * 4
    else:
        smem = stages * bk * (bm + 4 + bn + 4) * 4
    # min_blocks 2 where two blocks' threads would leave too few of the SM's 64K registers for
    # the accumulators plus ~64 others (256 threads of 8 x 16: 128 registers, 2300 bytes of
    # spills): 1, the knob's only other value, instead. The measured forms keep theirs.
    min_blocks = int(knobs["min_blocks"])
    if min_blocks > 1 and 65536 // (nt * min_blocks) < tm * tn + 64:
        min_blocks = 1
    values = dict(values, nt=nt, tm=tm, tn=tn, stages=stages, vec=int(knobs["load_vec"]),
                  store_vec=True, smem_bytes=f"(size_t){smem}", cp_async=use_async,
                  min_blocks=min_blocks, warp_tile=bool(knobs["warp_tile"]),
                  split=uses_split(target, knobs))
    values["launcher"] = render(CUDA_GEMM_LAUNCH, **values)
    return render(CUDA_GEMM, **values)
