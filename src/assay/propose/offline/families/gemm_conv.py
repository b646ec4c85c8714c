"""The convolution of the gemm family (template ``conv``, knob ``lib`` = 2): any convolution of
ir.CONV_OPS (1-, 2-, 3-D, transposed or not; stride, padding, dilation, groups,
output_padding) of float32 NC(D)(H)W tensors, computed by this package's own kernel with the
elementwise epilogue fused into its stores (or the row kernel following it), so that a lone or
CNN convolution passes the strict policy.

Every rank is computed as 3-D: the candidate pads the missing leading spatial dims with size 1
(kernel 1, stride 1, padding 0, dilation 1) and passes the geometry at run time (see
gemm.py's ``_conv_geometry``); nothing is specialised to a shape. A transposed convolution is
computed in its gather form: each output pixel sums the input pixels that map onto it (a tap
whose offset the stride does not divide contributes nothing), so no atomics and a
deterministic sum. On cuda, knob ``phases`` 1 (either form of the implicit GEMM, not with
split K; the default for a transposed convolution, gemm.py's ``defaults``) splits the outputs
by stride phase, the residue of o + P mod S along each dim: a phase's outputs reach
input pixels through the same taps (k * L = o + P mod S), so each block computes one phase's
pixels over K = input channels x that phase's taps, and the taps that read nothing (3 of 4 at
stride 2 in 2-D, 7 of 8 in 3-D) are never walked. On the H200, the gather form's transposed
convolutions at stride 2 ran at 0.19-0.24x of eager on KernelBench level 2
(docs/evidence/2026-12-06-l2-speed-by-family.md); by stride phase, on an H100, five of them ran
2.1-4.2x faster than without (docs/evidence/2026-12-07-h100-phases-ab.md).

cpu: a direct convolution, one OpenMP task per block of output rows of one (sample, channel)
plane, accumulated in place in the output, taps outermost and a unit-stride `omp simd` loop
along the output row (along the input row for a transposed one). cuda: an implicit GEMM
(M = samples x output pixels, N = output channels of a group, K = input channels of a group x
kernel volume, one group per blockIdx.z), tiled like gemm_tiled's SIMT GEMM (shared-memory
slabs, a register tile per thread) with the im2col gather computed on the fly from per-slab
tables; a depthwise convolution (one input and one output channel per group) has a direct
kernel of its own, one thread per output (knob ``depthwise``). fp32 FMAs in K order, no TF32.

The implicit GEMM has two forms. The first (knobs stages 1, warp_tile 0, split_k 0: the
defaults, as it was measured on an H200) loads each slab straight into static shared memory
between two barriers. The second (CUDA_CONV_PIPE: any of stages 2, warp_tile 1, split_k 1; not
yet measured) stages each thread's share of a slab through registers into dynamic shared
memory (opted in past 48 KB): ``stages`` 2 double-buffers the slabs (slab t + 1's global loads
in flight while slab t is multiplied, one barrier a slab), the K table of (channel, tap)
double-buffered beside them, a thread's pixels decomposed once; ``warp_tile`` 1 gives each
warp's lanes a grid of sub-tiles of up to 4 x 4 (vector reads of the slabs, conflict-free);
``split_k`` 1 cuts K into parts at run time where the output's tiles are fewer than the
device's SMs (``assay_conv_parts``, from the sizes and the SM count), each part's sums stored
to a workspace that a second kernel adds in part order before the fused epilogue. Both forms
are generic in every size; the second takes 32-bit pixel and K indices (the host refuses sizes
past them).
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Space
from assay.propose.offline.families.shared import Param, render
from assay.propose.offline.ir import Plan

# The geometry the candidate passes, 3-D whatever the rank: batch, input channels and dims,
# output channels and dims, kernel dims, stride, padding, dilation, groups.
SIZES = ("N", "Ci", "Di", "Hi", "Wi", "Co", "Do", "Ho", "Wo", "Kd", "Kh", "Kw",
         "Sd", "Sh", "Sw", "Pd", "Ph", "Pw", "Ld", "Lh", "Lw", "G")

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # rows: output rows (of one output plane) per OpenMP task, their accumulators kept in
    # cache while every tap passes over them.
    ("cpu", "conv"): {"threads": (0, 1, 2, 4, 8), "rows": (1, 4, 16, 64)},
    # tile_m x tile_n: a block's tile of output pixels x output channels; k_step: the K slab
    # (input channels x taps) in shared memory; thread_m x thread_n: each thread's register
    # tile. depthwise 1: a depthwise convolution runs the direct kernel (block threads, one
    # output each), 0: the implicit GEMM like any other.
    # stages, warp_tile, split_k (all three at 1, 0, 0: the implicit GEMM's first form, as it
    # ran on an H200 at 0.37-0.39x of cuDNN on KernelBench's L1 convolutions; 2, 1, 0 the
    # default, 1.42-1.68x faster on four of level 2's): any other
    # value selects its second form (CUDA_CONV_PIPE), slabs staged through registers into
    # dynamic shared memory. stages: 2 = double-buffered slabs (the next one's global loads in
    # flight while the current one is multiplied), 1 = load, sync, multiply. warp_tile: 1 = a
    # warp's lanes own a grid of sub-tiles of up to 4 x 4 repeated over the warp's tile (vector
    # reads of the slabs, conflict-free; ignored where the block has fewer than 32 threads),
    # 0 = a thread's rows NT_M apart. split_k: 1 = where the output's tiles (groups x pixel
    # tiles x channel tiles) are fewer than the device's SMs and K (input channels of a group
    # x kernel volume) holds at least 8 slabs a part, K cut into parts at run time, one block
    # per (tile, part), each part's sums stored to a workspace and added in a fixed order by a
    # second kernel that applies the epilogue; 0 = never.
    # phases (transposed convolutions, either form but not with split K; 1 their default,
    # 2.1-4.2x faster in the first form on KernelBench's stride-2 ones): 1 = one stride phase
    # per block, K over its taps only; 0 = every tap for every output pixel.
    ("cuda", "conv"): {"tile_m": (32, 64, 128), "tile_n": (16, 32, 64), "k_step": (8, 16, 32),
                       "thread_m": (2, 4, 8), "thread_n": (1, 2, 4), "block": (128, 256, 512),
                       "depthwise": (0, 1), "stages": (1, 2), "warp_tile": (0, 1),
                       "split_k": (0, 1), "phases": (0, 1)},
}

# Both targets: the geometry, and where an output coordinate reads its input along one dim.
CONV_COMMON = r"""
struct AssayConv {
  int64_t N, Ci, Di, Hi, Wi, Co, Do, Ho, Wo, Kd, Kh, Kw, Sd, Sh, Sw, Pd, Ph, Pw, Ld, Lh, Lw, G;
};

// The input coordinate that output coordinate o reads at tap k of one dim (stride S, padding
// P, dilation L, input size I), or -1 where it reads none (padding{% if transposed %}; a transposed
// convolution: o = i * S - P + k * L, so no input pixel where S does not divide o + P - k * L{% endif %}).
ASSAY_FN int assay_conv_src(int o, int k, int S, int P, int L, int I) {
{% if transposed %}
  const int t = o + P - k * L;
  if (t < 0 || t % S != 0) return -1;
  const int i = t / S;
{% else %}
  const int i = o * S - P + k * L;
{% endif %}
  return i >= 0 && i < I ? i : -1;
}
"""

CPP_CONV = r"""
// Floor and ceiling of a / b for b > 0 and any sign of a.
static inline int64_t assay_floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
static inline int64_t assay_ceil_div(int64_t a, int64_t b) { return -assay_floor_div(-a, b); }

// Direct convolution: a task is up to {{ rows }} output rows (of Wo pixels) of one (sample, output
// channel) plane, accumulated in place in `out`; for each input channel of the group and each
// tap, every row of the task adds weight x input along its valid span ({% if transposed %}along the input
// row: output pixel iw * Sw + off{% else %}input pixel ow * Sw + off{% endif %}), then the epilogue is applied to the task's rows.
extern "C" int assay_conv({{ params }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const AssayConv cv = { {{ sizes }} };
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, KV = cv.Kd * cv.Kh * cv.Kw;
  const int64_t rows = cv.Do * cv.Ho, P = rows * cv.Wo, DHWi = cv.Di * cv.Hi * cv.Wi;
  const int64_t RB = {{ rows }}, row_tiles = (rows + RB - 1) / RB;
  const int64_t tasks = cv.N * cv.Co * row_tiles;
{% if parallel %}
  #pragma omp parallel for{{ omp_clause }} schedule(static) if(tasks > 1 && tasks * RB * cv.Wo * CiG * KV > 32768)
{% endif %}
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t plane = t / row_tiles, r0 = (t % row_tiles) * RB;
    const int64_t r1 = std::min(rows, r0 + RB);
    const int64_t n = plane / cv.Co, co = plane % cv.Co, g = co / CoG;
    float* acc = out + plane * P;
    std::fill(acc + r0 * cv.Wo, acc + r1 * cv.Wo, 0.0f);
    for (int64_t cl = 0; cl < CiG; ++cl) {
      const int64_t ci = g * CiG + cl;
      const float* xc = x + (n * cv.Ci + ci) * DHWi;
{% if transposed %}
      const float* wc = w + (ci * CoG + co % CoG) * KV;  // [Ci][Co / G][taps]
{% else %}
      const float* wc = w + (co * CiG + cl) * KV;  // [Co][Ci / G][taps]
{% endif %}
      for (int64_t kd = 0; kd < cv.Kd; ++kd) {
        for (int64_t kh = 0; kh < cv.Kh; ++kh) {
          for (int64_t kw = 0; kw < cv.Kw; ++kw) {
            const float wv = wc[(kd * cv.Kh + kh) * cv.Kw + kw];
            const int64_t off = kw * cv.Lw - cv.Pw;
{% if transposed %}
            // input pixels j with 0 <= j * Sw + off < Wo
            const int64_t lo = std::max<int64_t>(0, assay_ceil_div(-off, cv.Sw));
            const int64_t hi = std::min(cv.Wi, assay_floor_div(cv.Wo - 1 - off, cv.Sw) + 1);
{% else %}
            // output pixels j with 0 <= j * Sw + off < Wi
            const int64_t lo = std::max<int64_t>(0, assay_ceil_div(-off, cv.Sw));
            const int64_t hi = std::min(cv.Wo, assay_floor_div(cv.Wi - 1 - off, cv.Sw) + 1);
{% endif %}
            if (lo >= hi) continue;
            for (int64_t r = r0; r < r1; ++r) {
              const int id = assay_conv_src((int)(r / cv.Ho), (int)kd, (int)cv.Sd, (int)cv.Pd, (int)cv.Ld, (int)cv.Di);
              const int ih = assay_conv_src((int)(r % cv.Ho), (int)kh, (int)cv.Sh, (int)cv.Ph, (int)cv.Lh, (int)cv.Hi);
              if (id < 0 || ih < 0) continue;
              float* o = acc + r * cv.Wo;
              const float* xr = xc + ((int64_t)id * cv.Hi + ih) * cv.Wi;
{% if transposed %}
              for (int64_t j = lo; j < hi; ++j) o[j * cv.Sw + off] += wv * xr[j];
{% else %}
              #pragma omp simd
              for (int64_t j = lo; j < hi; ++j) o[j] += wv * xr[j * cv.Sw + off];
{% endif %}
            }
          }
        }
      }
    }
    for (int64_t i = plane * P + r0 * cv.Wo; i < plane * P + r1 * cv.Wo; ++i) {
      const float acc_v = out[i];
{% for line in epi_body %}
      {{ line }}
{% endfor %}
      out[i] = {{ epi_out }};
    }
  }
  return 0;
}
"""

CUDA_CONV = r"""
{% if phased %}
// Stride phases of a transposed convolution, along one dim: output coordinate o reads input
// pixel (o + P - k * L) / S at tap k only where S divides o + P - k * L, so the outputs whose
// o + P leaves residue r mod S (phase r) share their taps: the k with k * L = r (mod S). Phase
// r's first output coordinate, how many of the O it holds (every S-th), its taps and its j-th.
ASSAY_FN int assay_phase_first(int r, int S, int P) { return ((r - P) % S + S) % S; }
ASSAY_FN int64_t assay_phase_count(int f, int64_t O, int64_t S) {
  return f < O ? (O - f + S - 1) / S : 0;
}
ASSAY_FN int assay_phase_taps(int r, int K, int S, int L) {
  int c = 0;
  for (int k = 0; k < K; ++k) c += (k * L) % S == r;
  return c;
}
ASSAY_FN int assay_phase_tap(int j, int r, int K, int S, int L) {
  for (int k = 0; k < K; ++k)
    if ((k * L) % S == r && j-- == 0) return k;
  return 0;
}

// Phase ph (of Sd x Sh x Sw, w fastest): per dim its residue r and first output coordinate f,
// the pixels it holds (Hq, Wq; Pq in all) and its taps (Khq, Kwq; KVq in all).
struct AssayPhase { int rd, rh, rw, fd, fh, fw, Khq, Kwq, KVq; int64_t Hq, Wq, Pq; };
ASSAY_FN AssayPhase assay_phase_of(const AssayConv& cv, int64_t ph) {
  AssayPhase q;
  q.rw = (int)(ph % cv.Sw);
  q.rh = (int)((ph / cv.Sw) % cv.Sh);
  q.rd = (int)(ph / (cv.Sw * cv.Sh));
  q.fd = assay_phase_first(q.rd, (int)cv.Sd, (int)cv.Pd);
  q.fh = assay_phase_first(q.rh, (int)cv.Sh, (int)cv.Ph);
  q.fw = assay_phase_first(q.rw, (int)cv.Sw, (int)cv.Pw);
  q.Hq = assay_phase_count(q.fh, cv.Ho, cv.Sh);
  q.Wq = assay_phase_count(q.fw, cv.Wo, cv.Sw);
  q.Pq = assay_phase_count(q.fd, cv.Do, cv.Sd) * q.Hq * q.Wq;
  q.Khq = assay_phase_taps(q.rh, (int)cv.Kh, (int)cv.Sh, (int)cv.Lh);
  q.Kwq = assay_phase_taps(q.rw, (int)cv.Kw, (int)cv.Sw, (int)cv.Lw);
  q.KVq = assay_phase_taps(q.rd, (int)cv.Kd, (int)cv.Sd, (int)cv.Ld) * q.Khq * q.Kwq;
  return q;
}

// The phase's q-th output pixel (w fastest), q < Pq: its output coordinates. I: the type the
// index is divided in (the second form's are 32-bit).
template <class I>
ASSAY_FN void assay_phase_pixel(const AssayConv& cv, const AssayPhase& f, I q, int& od, int& oh,
                                int& ow) {
  const I Wq = (I)f.Wq, Hq = (I)f.Hq;
  ow = f.fw + (int)(q % Wq) * (int)cv.Sw;
  oh = f.fh + (int)((q / Wq) % Hq) * (int)cv.Sh;
  od = f.fd + (int)(q / (Wq * Hq)) * (int)cv.Sd;
}

// The phase's j-th tap (w fastest), j < KVq: its kernel coordinates.
ASSAY_FN void assay_phase_kernel_tap(const AssayConv& cv, const AssayPhase& f, int j, int& kd,
                                     int& kh, int& kw) {
  kw = assay_phase_tap(j % f.Kwq, f.rw, (int)cv.Kw, (int)cv.Sw, (int)cv.Lw);
  kh = assay_phase_tap((j / f.Kwq) % f.Khq, f.rh, (int)cv.Kh, (int)cv.Sh, (int)cv.Lh);
  kd = assay_phase_tap(j / (f.Kwq * f.Khq), f.rd, (int)cv.Kd, (int)cv.Sd, (int)cv.Ld);
}

// The grid of a launch by phase: x the blocks of bm pixels of the largest phase (at most
// ceil(O / S) of each dim), z groups x phases; false where the grid cannot hold them.
static bool assay_phase_grid(const AssayConv& cv, int64_t bm, int64_t* gx, int64_t* gz) {
  const int64_t Pq = ((cv.Do + cv.Sd - 1) / cv.Sd) * ((cv.Ho + cv.Sh - 1) / cv.Sh) * ((cv.Wo + cv.Sw - 1) / cv.Sw);
  *gx = (cv.N * Pq + bm - 1) / bm;
  *gz = cv.G * cv.Sd * cv.Sh * cv.Sw;
  return *gx <= 2147483647 && *gz <= 65535;
}

{% endif %}
{% if pipe %}
{{ pipe_kernels }}
{% else %}
// Implicit GEMM: a block of {{ nt }} threads computes a {{ bm }} x {{ bn }} tile of (output pixels of every
// sample) x (output channels of group blockIdx.z), each thread {{ tm }} x {{ tn }} of them in registers (rows
// {{ nt_m }} apart, so a warp stores consecutive pixels of a channel: coalesced). K (input channels of
// the group x taps) advances {{ bk }} at a time: the slab's im2col column of the input (zeros where a
// tap reads padding{% if transposed %} or no input pixel{% endif %}) and the weights' slab go to shared memory, their
// coordinates read from per-block (pixels) and per-slab (channel, tap) tables rather than
// divided out per element. Plain fp32 FMAs in K order.
{% if phased %}
// One stride phase per block (blockIdx.z: group x phase): its pixels' taps are the phase's
// only, so K skips the taps that read no input pixel (3 of 4 at stride 2 in 2-D, 7 of 8 in 3-D).
{% endif %}
__global__ void __launch_bounds__({{ nt }})
assay_conv_tiles({{ kparams }}) {
  constexpr int BM = {{ bm }}, BN = {{ bn }}, BK = {{ bk }}, TM = {{ tm }}, TN = {{ tn }};
  constexpr int NT_M = BM / TM, NT = NT_M * (BN / TN);
  __shared__ float As[BK][BM];
  __shared__ float Bs[BK][BN + 1];  // +1: the weight slab is written along K
  __shared__ int64_t m_base[BM];    // the pixel's sample's input offset; -1 past M
  __shared__ int m_d[BM], m_h[BM], m_w[BM];  // its output coordinates
  __shared__ int64_t k_chan[BK];    // the K index's input channel offset; -1 past K
  __shared__ int k_d[BK], k_h[BK], k_w[BK];
{% if transposed %}
  __shared__ int k_tap[BK];         // its tap, for the weights' index
{% endif %}
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int tid = threadIdx.x;
{% if phased %}
  const int64_t phases = cv.Sd * cv.Sh * cv.Sw, g = blockIdx.z / phases;
  const AssayPhase phase = assay_phase_of(cv, blockIdx.z % phases);
  const int64_t Pq = phase.Pq, KVq = phase.KVq;
  const int64_t m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * BN;
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, KV = cv.Kd * cv.Kh * cv.Kw, K = CiG * KVq;
  const int64_t P = cv.Do * cv.Ho * cv.Wo, M = cv.N * Pq, DHWi = cv.Di * cv.Hi * cv.Wi;
{% else %}
  const int64_t g = blockIdx.z, m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * BN;
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, KV = cv.Kd * cv.Kh * cv.Kw, K = CiG * KV;
  const int64_t P = cv.Do * cv.Ho * cv.Wo, M = cv.N * P, DHWi = cv.Di * cv.Hi * cv.Wi;
{% endif %}
  const float* __restrict__ xg = x + g * CiG * DHWi;
  for (int e = tid; e < BM; e += NT) {
    const int64_t m = m0 + e;
    if (m < M) {
{% if phased %}
      m_base[e] = m / Pq * cv.Ci * DHWi;
      assay_phase_pixel(cv, phase, m % Pq, m_d[e], m_h[e], m_w[e]);
{% else %}
      const int64_t n = m / P, p = m % P;
      m_base[e] = n * cv.Ci * DHWi;
      m_w[e] = (int)(p % cv.Wo);
      m_h[e] = (int)((p / cv.Wo) % cv.Ho);
      m_d[e] = (int)(p / (cv.Wo * cv.Ho));
{% endif %}
    } else {
      m_base[e] = -1;
    }
  }
  float acc[TM][TN];
  #pragma unroll
  for (int ii = 0; ii < TM; ++ii) {
    #pragma unroll
    for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = 0.0f;
  }
  const int tr = tid % NT_M, tc = tid / NT_M;
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    __syncthreads();  // the previous slab is consumed (and m_* written, the first time)
    for (int e = tid; e < BK; e += NT) {
      const int64_t k = k0 + e;
      if (k < K) {
{% if phased %}
        k_chan[e] = k / KVq * DHWi;
        assay_phase_kernel_tap(cv, phase, (int)(k % KVq), k_d[e], k_h[e], k_w[e]);
        k_tap[e] = (k_d[e] * (int)cv.Kh + k_h[e]) * (int)cv.Kw + k_w[e];
{% else %}
        const int64_t cl = k / KV, tap = k % KV;
        k_chan[e] = cl * DHWi;
{% if transposed %}
        k_tap[e] = (int)tap;
{% endif %}
        k_w[e] = (int)(tap % cv.Kw);
        k_h[e] = (int)((tap / cv.Kw) % cv.Kh);
        k_d[e] = (int)(tap / (cv.Kw * cv.Kh));
{% endif %}
      } else {
        k_chan[e] = -1;
      }
    }
    __syncthreads();
    for (int e = tid; e < BK * BM; e += NT) {  // consecutive threads: consecutive pixels
      const int kk = e / BM, mm = e % BM;
      float v = 0.0f;
      if (m_base[mm] >= 0 && k_chan[kk] >= 0) {
        const int id = assay_conv_src(m_d[mm], k_d[kk], (int)cv.Sd, (int)cv.Pd, (int)cv.Ld, (int)cv.Di);
        const int ih = assay_conv_src(m_h[mm], k_h[kk], (int)cv.Sh, (int)cv.Ph, (int)cv.Lh, (int)cv.Hi);
        const int iw = assay_conv_src(m_w[mm], k_w[kk], (int)cv.Sw, (int)cv.Pw, (int)cv.Lw, (int)cv.Wi);
        if (id >= 0 && ih >= 0 && iw >= 0)
          v = __ldg(xg + m_base[mm] + k_chan[kk] + ((int64_t)id * cv.Hi + ih) * cv.Wi + iw);
      }
      As[kk][mm] = v;
    }
    for (int e = tid; e < BK * BN; e += NT) {
{% if transposed %}
      // [Ci][Co / G][taps]: consecutive threads along the output channels
      const int kk = e / BN, nn = e % BN;
      const int64_t k = k0 + kk, co = n0 + nn;
      Bs[kk][nn] = (k < K && co < CoG)
          ? __ldg(w + ((g * CiG + k / {{ "KVq" if phased else "KV" }}) * CoG + co) * KV + k_tap[kk]) : 0.0f;
{% else %}
      // [Co][Ci / G][taps]: consecutive threads along K
      const int kk = e % BK, nn = e / BK;
      const int64_t k = k0 + kk, co = n0 + nn;
      Bs[kk][nn] = (k < K && co < CoG) ? __ldg(w + (g * CoG + co) * K + k) : 0.0f;
{% endif %}
    }
    __syncthreads();
    #pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
      #pragma unroll
      for (int ii = 0; ii < TM; ++ii) a[ii] = As[kk][tr + ii * NT_M];
      #pragma unroll
      for (int jj = 0; jj < TN; ++jj) b[jj] = Bs[kk][tc * TN + jj];
      #pragma unroll
      for (int ii = 0; ii < TM; ++ii) {
        #pragma unroll
        for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = fmaf(a[ii], b[jj], acc[ii][jj]);
      }
    }
  }
  // Epilogue: the fused formula per element, `i` the output's flat NC(D)(H)W index.
  #pragma unroll
  for (int ii = 0; ii < TM; ++ii) {
    const int64_t m = m0 + tr + ii * NT_M;
    if (m >= M) continue;
{% if phased %}
    // the pixel's output coordinates again (not from the block's table: a phase with no tap
    // has no K loop, whose barrier orders the table's writes before these reads)
    int od, oh, ow;
    assay_phase_pixel(cv, phase, m % Pq, od, oh, ow);
    const int64_t n = m / Pq, p = ((int64_t)od * cv.Ho + oh) * cv.Wo + ow;
{% else %}
    const int64_t n = m / P, p = m % P;
{% endif %}
    #pragma unroll
    for (int jj = 0; jj < TN; ++jj) {
      const int64_t co = n0 + tc * TN + jj;
      if (co >= CoG) continue;
      const int64_t i = (n * cv.Co + g * CoG + co) * P + p;
      const float acc_v = acc[ii][jj];
{% for line in epi_body %}
      {{ line }}
{% endfor %}
      out[i] = {{ epi_out }};
    }
  }
}
{% endif %}

// Depthwise (one input and one output channel per group): memory-bound, so one thread per
// output (grid-stride), consecutive threads on consecutive pixels of a plane, the channel's
// taps read through the read-only cache (shared by the block's threads).
__global__ void __launch_bounds__({{ block }})
assay_conv_direct({{ dparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t KV = cv.Kd * cv.Kh * cv.Kw, P = cv.Do * cv.Ho * cv.Wo;
  const int64_t DHWi = cv.Di * cv.Hi * cv.Wi, total = cv.N * cv.Co * P;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t plane = i / P, p = i % P, c = plane % cv.Co;
    const int od = (int)(p / (cv.Wo * cv.Ho)), oh = (int)((p / cv.Wo) % cv.Ho), ow = (int)(p % cv.Wo);
    const float* __restrict__ xc = x + plane * DHWi;  // groups == channels: the same index
    const float* __restrict__ wc = w + c * KV;
    float s = 0.0f;
    for (int kd = 0; kd < (int)cv.Kd; ++kd) {
      const int id = assay_conv_src(od, kd, (int)cv.Sd, (int)cv.Pd, (int)cv.Ld, (int)cv.Di);
      if (id < 0) continue;
      for (int kh = 0; kh < (int)cv.Kh; ++kh) {
        const int ih = assay_conv_src(oh, kh, (int)cv.Sh, (int)cv.Ph, (int)cv.Lh, (int)cv.Hi);
        if (ih < 0) continue;
        const float* __restrict__ xr = xc + ((int64_t)id * cv.Hi + ih) * cv.Wi;
        const float* __restrict__ wr = wc + (kd * cv.Kh + kh) * cv.Kw;
        for (int kw = 0; kw < (int)cv.Kw; ++kw) {
          const int iw = assay_conv_src(ow, kw, (int)cv.Sw, (int)cv.Pw, (int)cv.Lw, (int)cv.Wi);
          if (iw >= 0) s = fmaf(__ldg(xr + iw), __ldg(wr + kw), s);
        }
      }
    }
    const float acc_v = s;
{% for line in epi_body %}
    {{ line }}
{% endfor %}
    out[i] = {{ epi_out }};
  }
}

extern "C" int assay_conv({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const AssayConv cv = { {{ sizes }} };
  const int64_t P = cv.Do * cv.Ho * cv.Wo;
  if (cv.N <= 0 || cv.Co <= 0 || P <= 0) return 0;
  if (cv.G <= 0 || cv.Ci % cv.G != 0 || cv.Co % cv.G != 0) return (int)cudaErrorInvalidValue;
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G;
  if ({{ depthwise }} && CiG == 1 && CoG == 1) {
    const int64_t total = cv.N * cv.Co * P;
    const int64_t want = (total + {{ block - 1 }}) / {{ block }}, most = (int64_t)assay_sm_count() * 32;
    const int64_t blocks = want < most ? want : most;  // grid-stride past that
    assay_conv_direct<<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ dargs }});
    return (int)cudaGetLastError();
  }
  const int64_t gx = (cv.N * P + {{ bm - 1 }}) / {{ bm }}, gy = (CoG + {{ bn - 1 }}) / {{ bn }};
  if (gx > 2147483647 || gy > 65535 || cv.G > 65535) return (int)cudaErrorInvalidConfiguration;
{% if pipe %}
{{ pipe_launch }}
{% elif phased %}
  int64_t gq = 0, gz = 0;  // one block column per stride phase and group
  if (!assay_phase_grid(cv, {{ bm }}, &gq, &gz)) return (int)cudaErrorInvalidConfiguration;
  assay_conv_tiles<<<dim3((unsigned)gq, (unsigned)gy, (unsigned)gz), {{ nt }}, 0, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
{% else %}
  assay_conv_tiles<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)cv.G), {{ nt }}, 0, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
{% endif %}
}
"""

# The implicit GEMM's second form (any of knobs stages 2, warp_tile 1, split_k 1; the first,
# CUDA_CONV's own, is kept as it was measured): register-staged slabs in dynamic shared memory
# (double-buffered for stages 2), the per-slab K table double-buffered so that one barrier a
# slab suffices, vector reads of the slabs (warp-tiled for warp_tile 1), K in parts where the
# output has few tiles (split_k 1). Rendered into CUDA_CONV as ``pipe_kernels``, its launch as
# ``pipe_launch``.
CUDA_CONV_PIPE = r"""
// A slab's vector read from shared memory: V consecutive floats (V-aligned).
template <int V>
__device__ __forceinline__ void assay_lds(const float* p, float* v) {
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
  } else if constexpr (V == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    v[0] = t.x; v[1] = t.y;
  } else {
    #pragma unroll
    for (int u = 0; u < V; ++u) v[u] = p[u];
  }
}

{% if transposed %}
// A transposed convolution's input coordinate: t = o + P - k * L is input pixel t / S where S
// divides it, none (-1) elsewhere or past I.
ASSAY_FN int assay_convt_at(int t, int S, int I) {
  if (t < 0) return -1;
  if (S != 1) {
    if (t % S != 0) return -1;
    t /= S;
  }
  return t < I ? t : -1;
}

{% endif %}
// Implicit GEMM: a block of {{ nt }} threads computes a {{ bm }} x {{ bn }} tile of (output pixels of every
// sample) x (output channels of one group), each thread {{ tm }} x {{ tn }} of them in registers{% if warp_tile %}, as {{ tm // vm }} x {{ tn // vn }}
// sub-tiles of {{ vm }} x {{ vn }}: a warp's lanes form a {{ lanes_m }} x {{ lanes_n }} grid of sub-tiles repeated over the warp's
// {{ tm * lanes_m }} x {{ tn * lanes_n }} tile, so that a warp's vector read of a slab row touches at most 32 consecutive
// floats (broadcasts, no bank conflict){% else %} (rows {{ nt_m }}
// apart: a warp reads consecutive pixels of a slab row, and stores consecutive pixels of a
// channel; its {{ tn }} channels read as one vector){% endif %}. K (input channels of the group x taps)
// advances {{ bk }} at a time: each thread gathers its share of the slab's im2col column of the input
// (zeros where a tap reads padding{% if transposed %} or no input pixel{% endif %}) and of the weights' slab into registers,
// then stores it to shared memory; {% if stages == 2 %}double-buffered: slab t + 1's loads are in flight while
// slab t is multiplied, stored to the other half after it, one barrier a slab{% else %}single-buffered: multiply, barrier, load and store
// the next slab, barrier{% endif %}. A thread's
// pixels' coordinates are computed once; the K indices' (channel, tap) once per slab into a
// table (double-buffered: the next slab's is written while this one's is read). Plain fp32
// FMAs in K order, no TF32{% if split %}; where the output has too few tiles for the device, K in
// parts (SPLIT, see below){% endif %}.
{% if split %}
template <bool SPLIT>
{% endif %}
__global__ void __launch_bounds__({{ nt }})
assay_conv_tiles({{ kparams }}) {
  constexpr int BM = {{ bm }}, BN = {{ bn }}, BK = {{ bk }}, TM = {{ tm }}, TN = {{ tn }};
  constexpr int NT = {{ nt }}, STAGES = {{ stages }};
  // A thread's outputs: rows row0 + q * ROW_STEP + u (q < TM / VM, u < VM) of the tile,
  // columns col0 + q * COL_STEP + v (q < TN / VN, v < VN).
  constexpr int VM = {{ vm }}, VN = {{ vn }}, ROW_STEP = {{ row_step }}, COL_STEP = {{ col_step }};
  static_assert(TM % VM == 0 && TN % VN == 0 && BM % 32 == 0 && BN % 4 == 0, "the thread tiles");
  // Slabs: A [BK][BM] (the im2col column: a row per K index, pixels contiguous) and B
  // [BK][BN + 4] (the weights, stored down the columns: +4 spreads consecutive K indices over
  // the banks and keeps rows float4-aligned).
  constexpr int ALD = BM, BLD = BN + 4;
  // A thread's share of a slab: elements e = tid + p * NT, PA of A (pixel e % BM: one of MPT
  // pixels, p % MPT; K index e / BM), PB of B (K index e % BK: along the weights' rows).
  constexpr int PA = (BK * BM + NT - 1) / NT, PB = (BK * BN + NT - 1) / NT;
  constexpr int MPT = BM > NT ? BM / NT : 1;
  extern __shared__ float4 assay_conv_smem[];
  float* As = reinterpret_cast<float*>(assay_conv_smem);  // [STAGES][BK][ALD]
  float* Bs = As + STAGES * BK * ALD;                      // [STAGES][BK][BLD]
  // The K table, two slabs: a K index's offset in the input{% if not transposed %} (its channel's and tap's){% else %} (its channel's){% endif %} and
  // in the weights (but for the output channel's), -1 past K; its tap's dilated offsets.
  __shared__ int64_t k_chan[2][BK], k_wt[2][BK];
  __shared__ int4 k_tap[2][BK];
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int tid = threadIdx.x;
{% if split %}
  // Split K (SPLIT): blockIdx.z = group * parts + part; part p sums K's slabs [kb, kend), a
  // whole number of BK-slabs, and stores them to the workspace.
  const int part = SPLIT ? (int)(blockIdx.z % parts) : 0;
  const int64_t g = SPLIT ? blockIdx.z / parts : blockIdx.z;
{% elif phased %}
  // One stride phase per block (blockIdx.z: group x phase): its pixels' taps are the phase's
  // only, so K skips the taps that read no input pixel (3 of 4 at stride 2 in 2-D).
  const int64_t phases = cv.Sd * cv.Sh * cv.Sw, g = blockIdx.z / phases;
  const AssayPhase phase = assay_phase_of(cv, blockIdx.z % phases);
  const int KVq = phase.KVq;
  const int64_t Pq = phase.Pq;
{% else %}
  const int64_t g = blockIdx.z;
{% endif %}
  const int64_t m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * BN;
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, KV = cv.Kd * cv.Kh * cv.Kw;
  const int64_t K = CiG * {{ "KVq" if phased else "KV" }}, P = cv.Do * cv.Ho * cv.Wo;
  const int64_t M = cv.N * {{ "Pq" if phased else "P" }}, DHWi = cv.Di * cv.Hi * cv.Wi;
{% if phased %}
  if (m0 >= M) return;  // (the block's own condition: past a smaller phase's pixels)
  const int Pq32 = (int)Pq;
{% endif %}
  const float* __restrict__ xg = x + g * CiG * DHWi;
  // 32-bit pixel and K indices (the host checks M and K below 2^31): divided cheaply.
  const int P32 = (int)P, Ho32 = (int)cv.Ho, Wo32 = (int)cv.Wo, KV32 = (int)KV, Kh32 = (int)cv.Kh, Kw32 = (int)cv.Kw;
{% if split %}
  const int kchunk = SPLIT ? (int)(((K + parts - 1) / parts + BK - 1) / BK * BK) : (int)K;
  const int kb = (int)min(K, (int64_t)part * kchunk), kend = (int)min(K, (int64_t)kb + kchunk);
{% else %}
  const int kb = 0, kend = (int)K;
{% endif %}
{% if warp_tile %}
  const int warp = tid / 32, lane = tid % 32;
  const int row0 = (warp / {{ bn // (tn * lanes_n) }}) * {{ tm * lanes_m }} + (lane / {{ lanes_n }}) * VM;
  const int col0 = (warp % {{ bn // (tn * lanes_n) }}) * {{ tn * lanes_n }} + (lane % {{ lanes_n }}) * VN;
{% else %}
  const int row0 = tid % {{ nt_m }}, col0 = (tid / {{ nt_m }}) * TN;
{% endif %}

  // This thread's pixels (e % BM for its elements e: tid % BM + j * NT): the sample's input
  // offset and the output coordinates{% if transposed %} plus padding (t = o + P - k * L){% else %} times stride less padding (the input coordinate
  // o * S - P + k * L less the tap's part, and the offset of that corner){% endif %}.
  int64_t px_base[MPT];
  int px_d[MPT], px_h[MPT], px_w[MPT];
  bool px_ok[MPT];
  #pragma unroll
  for (int j = 0; j < MPT; ++j) {
    const int64_t m = m0 + tid % BM + j * NT;
    px_ok[j] = m < M;
{% if phased %}
    const int mi = px_ok[j] ? (int)m : 0, n = mi / Pq32;
    int od, oh, ow;
    assay_phase_pixel(cv, phase, mi % Pq32, od, oh, ow);
{% else %}
    const int mi = px_ok[j] ? (int)m : 0, n = mi / P32, p = mi % P32;
    const int od = p / (Wo32 * Ho32), oh = (p / Wo32) % Ho32, ow = p % Wo32;
{% endif %}
{% if transposed %}
    px_d[j] = od + (int)cv.Pd;
    px_h[j] = oh + (int)cv.Ph;
    px_w[j] = ow + (int)cv.Pw;
    px_base[j] = (int64_t)n * cv.Ci * DHWi;
{% else %}
    px_d[j] = od * (int)cv.Sd - (int)cv.Pd;
    px_h[j] = oh * (int)cv.Sh - (int)cv.Ph;
    px_w[j] = ow * (int)cv.Sw - (int)cv.Pw;
    px_base[j] = (int64_t)n * cv.Ci * DHWi + ((int64_t)px_d[j] * cv.Hi + px_h[j]) * cv.Wi + px_w[j];
{% endif %}
  }

  // K indices k0 .. k0 + BK - 1 into table b: channel and tap divided out once per slab.
  auto fill = [&](int b, int k0) {
    for (int e = tid; e < BK; e += NT) {
      if (k0 + e < kend) {
{% if phased %}
        // the phase's (k % KVq)-th tap
        const int k = k0 + e, cl = k / KVq;
        int kd, kh, kw;
        assay_phase_kernel_tap(cv, phase, k % KVq, kd, kh, kw);
        const int tap = (kd * Kh32 + kh) * Kw32 + kw;
        const int td = kd * (int)cv.Ld, th = kh * (int)cv.Lh, tw = kw * (int)cv.Lw;
{% else %}
        const int k = k0 + e, cl = k / KV32, tap = k % KV32;
        const int td = tap / (Kw32 * Kh32) * (int)cv.Ld;
        const int th = (tap / Kw32) % Kh32 * (int)cv.Lh;
        const int tw = tap % Kw32 * (int)cv.Lw;
{% endif %}
        k_tap[b][e] = make_int4(td, th, tw, 0);
{% if transposed %}
        k_chan[b][e] = (int64_t)cl * DHWi;
        k_wt[b][e] = (g * CiG + cl) * CoG * KV + tap;  // [Ci][Co / G][taps]: + co * KV
{% else %}
        k_chan[b][e] = (int64_t)cl * DHWi + ((int64_t)td * cv.Hi + th) * cv.Wi + tw;
        k_wt[b][e] = g * CoG * K + k;  // [Co][Ci / G][taps]: + co * K
{% endif %}
      } else {
        k_chan[b][e] = -1;
        k_wt[b][e] = -1;
      }
    }
  };

  // Global -> registers: the slab of table b, zeros past the edges (and where a tap reads
  // padding{% if transposed %} or no input pixel{% endif %}). Consecutive threads: consecutive pixels of A, consecutive K
  // indices of B (the weights' contiguous dim{% if transposed %}, within a channel's taps{% endif %}).
  float ra[PA], rb[PB];
  auto load = [&](int b) {
    #pragma unroll
    for (int p = 0; p < PA; ++p) {
      const int e = tid + p * NT, j = p % MPT;
      float v = 0.0f;
      if ((BK * BM) % NT == 0 || e < BK * BM) {
        const int64_t kc = k_chan[b][e / BM];
        if (px_ok[j] && kc >= 0) {
          const int4 t = k_tap[b][e / BM];
{% if transposed %}
          const int id = assay_convt_at(px_d[j] - t.x, (int)cv.Sd, (int)cv.Di);
          const int ih = assay_convt_at(px_h[j] - t.y, (int)cv.Sh, (int)cv.Hi);
          const int iw = assay_convt_at(px_w[j] - t.z, (int)cv.Sw, (int)cv.Wi);
          if (id >= 0 && ih >= 0 && iw >= 0)
            v = __ldg(xg + px_base[j] + kc + ((int64_t)id * cv.Hi + ih) * cv.Wi + iw);
{% else %}
          if ((unsigned)(px_d[j] + t.x) < (unsigned)cv.Di && (unsigned)(px_h[j] + t.y) < (unsigned)cv.Hi &&
              (unsigned)(px_w[j] + t.z) < (unsigned)cv.Wi)
            v = __ldg(xg + px_base[j] + kc);
{% endif %}
        }
      }
      ra[p] = v;
    }
    #pragma unroll
    for (int p = 0; p < PB; ++p) {
      const int e = tid + p * NT;
      float v = 0.0f;
      if ((BK * BN) % NT == 0 || e < BK * BN) {
        const int64_t wo = k_wt[b][e % BK], co = n0 + e / BK;
        if (wo >= 0 && co < CoG) v = __ldg(w + wo + co * {{ "KV" if transposed else "K" }});
      }
      rb[p] = v;
    }
  };
  // Registers -> shared memory stage s.
  auto store = [&](int s) {
    float* as = As + s * BK * ALD;
    float* bs = Bs + s * BK * BLD;
    #pragma unroll
    for (int p = 0; p < PA; ++p) {
      const int e = tid + p * NT;
      if ((BK * BM) % NT == 0 || e < BK * BM) as[(e / BM) * ALD + e % BM] = ra[p];
    }
    #pragma unroll
    for (int p = 0; p < PB; ++p) {
      const int e = tid + p * NT;
      if ((BK * BN) % NT == 0 || e < BK * BN) bs[(e % BK) * BLD + e / BK] = rb[p];
    }
  };

  float acc[TM][TN];
  #pragma unroll
  for (int ii = 0; ii < TM; ++ii) {
    #pragma unroll
    for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = 0.0f;
  }
  // One slab from stage s: per K index the thread's VM- and VN-wide fragments (vector reads),
  // their outer product.
  auto compute = [&](int s) {
    const float* as = As + s * BK * ALD + row0;
    const float* bs = Bs + s * BK * BLD + col0;
    #pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[TM], b[TN];
      #pragma unroll
      for (int q = 0; q < TM / VM; ++q) assay_lds<VM>(as + kk * ALD + q * ROW_STEP, a + q * VM);
      #pragma unroll
      for (int q = 0; q < TN / VN; ++q) assay_lds<VN>(bs + kk * BLD + q * COL_STEP, b + q * VN);
      #pragma unroll
      for (int ii = 0; ii < TM; ++ii) {
        #pragma unroll
        for (int jj = 0; jj < TN; ++jj) acc[ii][jj] = fmaf(a[ii], b[jj], acc[ii][jj]);
      }
    }
  };

  // Slab t's K table is table t % 2, written before the barrier that precedes its loads; the
  // table of slab t + 2 is written in iteration t, whose barrier ends it: its last reader, the
  // loads of slab t, came before the previous barrier. Every barrier is reached by every
  // thread (the conditions are the block's).
  const int ntiles = (kend - kb + BK - 1) / BK;
  fill(0, kb);
  fill(1, kb + BK);
  __syncthreads();
  if (ntiles > 0) {
    load(0);
    store(0);
  }
  __syncthreads();
  for (int t = 0; t < ntiles; ++t) {
    const int next = (t + 1) & 1;
{% if stages == 2 %}
    if (t + 1 < ntiles) load(next);  // in flight while this slab is multiplied
    compute(t & 1);
    if (t + 1 < ntiles) store(next);
{% else %}
    compute(0);
    __syncthreads();
    if (t + 1 < ntiles) {
      load(next);
      store(0);
    }
{% endif %}
    if (t + 2 < ntiles) fill(t & 1, kb + (t + 2) * BK);
    __syncthreads();
  }

  // Epilogue: {% if split %}this part's sums to the workspace (SPLIT), or {% endif %}the fused formula per element, `i` the output's
  // flat NC(D)(H)W index.
  #pragma unroll
  for (int ii = 0; ii < TM; ++ii) {
    const int64_t m = m0 + row0 + (ii / VM) * ROW_STEP + ii % VM;
    if (m >= M) continue;
{% if phased %}
    int od, oh, ow;
    assay_phase_pixel(cv, phase, (int)m % Pq32, od, oh, ow);
    const int n = (int)m / Pq32, p = (od * Ho32 + oh) * Wo32 + ow;
{% else %}
    const int n = (int)m / P32, p = (int)m % P32;
{% endif %}
    #pragma unroll
    for (int jj = 0; jj < TN; ++jj) {
      const int64_t co = n0 + col0 + (jj / VN) * COL_STEP + jj % VN;
      if (co >= CoG) continue;
      const int64_t i = ((int64_t)n * cv.Co + g * CoG + co) * P + p;
{% if split %}
      if (SPLIT) {  // assay_conv_parts_sum adds the parts
        ws[(int64_t)part * M * cv.Co + i] = acc[ii][jj];
        continue;
      }
{% endif %}
      const float acc_v = acc[ii][jj];
{% for line in epi_body %}
      {{ line }}
{% endfor %}
      out[i] = {{ epi_out }};
    }
  }
}
{% if split %}

// The parts' sums added in part order (the same result on every run), then the epilogue.
__global__ void __launch_bounds__(256) assay_conv_parts_sum({{ kparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t total = cv.N * cv.Co * cv.Do * cv.Ho * cv.Wo;
  for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < total; i += (int64_t)gridDim.x * 256) {
    float acc_v = 0.0f;
    for (int64_t q = 0; q < parts; ++q) acc_v += ws[q * total + i];
{% for line in epi_body %}
    {{ line }}
{% endfor %}
    out[i] = {{ epi_out }};
  }
}

// How many parts K (input channels of a group x taps) is cut into: 1 unless the output's tiles
// (groups x pixel tiles x channel tiles) leave SMs idle and K holds at least 8 slabs per part;
// then enough parts for a block per SM, at most 64 (and groups x parts within the grid's z),
// none of them empty. The caller sizes the workspace from it (parts x the output's elements
// when parts > 1). (stream_ptr: every entry point of the file takes the stream last; the
// device's SMs.)
extern "C" int assay_conv_parts({{ sparams }}, void* stream_ptr) {
  (void)stream_ptr;
  const AssayConv cv = { {{ sizes }} };
  const int64_t P = cv.Do * cv.Ho * cv.Wo;
  if (cv.N <= 0 || cv.Co <= 0 || P <= 0 || cv.G <= 0 || cv.Ci % cv.G != 0 || cv.Co % cv.G != 0) return 1;
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, K = CiG * cv.Kd * cv.Kh * cv.Kw;
  if (({{ depthwise }} && CiG == 1 && CoG == 1) || K <= 0) return 1;  // the direct kernel: no K
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 1;
  }
  const int64_t tiles = ((cv.N * P + {{ bm - 1 }}) / {{ bm }}) * ((CoG + {{ bn - 1 }}) / {{ bn }}) * cv.G;
  if (tiles >= sms) return 1;
  int64_t parts = (sms + tiles - 1) / tiles;
  if (parts > K / {{ 8 * bk }}) parts = K / {{ 8 * bk }};
  if (parts > 64) parts = 64;
  if (parts > 65535 / cv.G) parts = 65535 / cv.G;
  if (parts <= 1) return 1;
  const int64_t chunk = ((K + parts - 1) / parts + {{ bk - 1 }}) / {{ bk }} * {{ bk }};
  return (int)((K + chunk - 1) / chunk);
}
{% endif %}

{% set kernel_t = "assay_conv_tiles<SPLIT>" if split else "assay_conv_tiles" %}
// The implicit GEMM's launch: dynamic shared memory, opted in above the default 48 KB (with the
// kernel's {{ static_smem }} static bytes).
{% if split %}
template <bool SPLIT>
{% endif %}
static int assay_conv_launch(dim3 grid, size_t smem, cudaStream_t stream, {{ kparams }}) {
  if (smem + {{ static_smem }} > (size_t)assay_smem_optin()) return (int)cudaErrorInvalidConfiguration;
  if (smem + {{ static_smem }} > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute({{ kernel_t }},
        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  {{ kernel_t }}<<<grid, {{ nt }}, smem, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
}"""

# The second form's launch, in assay_conv after the depthwise branch (gx, gy: the grid).
CUDA_CONV_PIPE_LAUNCH = r"""  // 32-bit indices in the kernel: pixels (M), K, and along each dim the reach of
  // o * S - P + k * L (of o + P - k * L, transposed) and the input's size below 2^31.
  if (cv.N * P > 2147483647 - {{ bm }} || CiG * cv.Kd * cv.Kh * cv.Kw > 2147483647 - {{ bk }} ||
      (cv.Do - 1) * cv.Sd + cv.Pd + (cv.Kd - 1) * cv.Ld + cv.Di > 2147483647 ||
      (cv.Ho - 1) * cv.Sh + cv.Ph + (cv.Kh - 1) * cv.Lh + cv.Hi > 2147483647 ||
      (cv.Wo - 1) * cv.Sw + cv.Pw + (cv.Kw - 1) * cv.Lw + cv.Wi > 2147483647)
    return (int)cudaErrorInvalidValue;
  const size_t smem = {{ smem }};
{% if split %}
  if (parts > 1) {
    if (parts * cv.G > 65535 || ws == nullptr) return (int)cudaErrorInvalidConfiguration;
    const int err = assay_conv_launch<true>(dim3((unsigned)gx, (unsigned)gy, (unsigned)(cv.G * parts)), smem, stream, {{ kargs }});
    if (err) return err;
    const int64_t total = cv.N * cv.Co * P;
    const unsigned blocks = (unsigned)(total < 65535 * 256 ? (total + 255) / 256 : 65535);
    assay_conv_parts_sum<<<blocks, 256, 0, stream>>>({{ kargs }});
    return (int)cudaGetLastError();
  }
  return assay_conv_launch<false>(dim3((unsigned)gx, (unsigned)gy, (unsigned)cv.G), smem, stream, {{ kargs }});
{% elif phased %}
  int64_t gq = 0, gz = 0;  // one block column per stride phase and group
  if (!assay_phase_grid(cv, {{ bm }}, &gq, &gz)) return (int)cudaErrorInvalidConfiguration;
  return assay_conv_launch(dim3((unsigned)gq, (unsigned)gy, (unsigned)gz), smem, stream, {{ kargs }});
{% else %}
  return assay_conv_launch(dim3((unsigned)gx, (unsigned)gy, (unsigned)cv.G), smem, stream, {{ kargs }});
{% endif %}"""


def defaults(target: str) -> dict[str, int]:
    """64 x 64 tiles of 4 x 4 per thread (256 threads), K slabs of 16, the implicit GEMM's
    second form: double-buffered slabs and warp tiles (1.42-1.68x faster than the first form,
    the same tiles, on KernelBench's L2_2, 34, 71 and 93 on an H200:
    docs/evidence/2026-12-07-h200-kb-dag-tenth.md), no split K, no stride phases (gemm.py's
    ``defaults`` sets them for a transposed convolution); 4 rows per task on the host."""
    if target == "cpu":
        return {"threads": 0, "rows": 4}
    return {"tile_m": 64, "tile_n": 64, "k_step": 16, "thread_m": 4, "thread_n": 4,
            "block": 256, "depthwise": 1, "stages": 2, "warp_tile": 1, "split_k": 0,
            "phases": 0}


def safe(target: str) -> dict[str, int]:
    """Small tiles, the first form, one row per task, serial on the host."""
    if target == "cpu":
        return {"threads": 1, "rows": 1}
    return {"tile_m": 32, "tile_n": 16, "k_step": 8, "thread_m": 2, "thread_n": 1,
            "block": 128, "depthwise": 1, "stages": 1, "warp_tile": 0, "split_k": 0,
            "phases": 0}


def kernel(values: dict[str, Any], params: list[Param], target: str, knobs: dict[str, Any],
           plan: Plan) -> str:
    """``assay_conv`` (and on cuda its kernels) for ``values`` (the head's and the fused
    epilogue's) and the entry point's ``params`` (operands ``x`` and ``w``, the epilogue's
    leaves, ``out``, the geometry of SIZES, the leaves' broadcast geometry)."""
    assert plan.gemm is not None
    transposed = plan.gemm.op.startswith("conv_transpose")
    signature = ", ".join(f"{p.ctype} {p.name}" for p in params)
    sizes = ", ".join(SIZES)
    common = render(CONV_COMMON, transposed=transposed)
    if target == "cpu":
        threads = int(knobs["threads"])
        return common + render(CPP_CONV, **values, params=signature, sizes=sizes,
                               transposed=transposed, rows=int(knobs["rows"]),
                               parallel=threads != 1,
                               omp_clause=(f" num_threads(assay_threads({threads}))"
                                           if threads > 1 else ""))
    # The kernels take the geometry as one struct, the other parameters as they are (the
    # depthwise kernel not the split-K workspace).
    kernel_params = [p for p in params if p.name not in SIZES]
    kparams = ", ".join([f"{p.ctype} {p.name}" for p in kernel_params] + ["const AssayConv cv"])
    kargs = ", ".join([p.name for p in kernel_params] + ["cv"])
    direct = [p for p in kernel_params if p.name not in ("ws", "parts")]
    dparams = ", ".join([f"{p.ctype} {p.name}" for p in direct] + ["const AssayConv cv"])
    dargs = ", ".join([p.name for p in direct] + ["cv"])
    bm, bn, bk = int(knobs["tile_m"]), int(knobs["tile_n"]), int(knobs["k_step"])
    tm, tn = int(knobs["thread_m"]), int(knobs["thread_n"])
    while (bm // tm) * (bn // tn) > 1024:  # a block's limit: larger register tiles instead
        tm *= 2
    nt = (bm // tm) * (bn // tn)
    tiles = dict(bm=bm, bn=bn, bk=bk, tm=tm, tn=tn, nt=nt, nt_m=bm // tm,
                 block=int(knobs["block"]), depthwise=int(knobs["depthwise"]))
    stages, split = int(knobs.get("stages", 1)), uses_split(target, knobs)
    pipe = stages == 2 or bool(knobs.get("warp_tile", 0)) or split
    # by stride phase (a transposed convolution, either form; not with split K, whose blocks'
    # third grid dim holds the parts)
    phased = transposed and not split and bool(knobs.get("phases", 0))
    pipe_kernels = pipe_launch = ""
    if pipe:
        # A thread's share of a slab is staged in registers: at most 32 of them (32 x 16 tiles
        # of 8 x 4 would be 16 threads of 96), smaller thread tiles (more threads) instead.
        while bk * (bm + bn) > 32 * nt and tm * tn > 1:
            if tm >= tn:
                tm //= 2
            else:
                tn //= 2
            nt = (bm // tm) * (bn // tn)
        tiles.update(tm=tm, tn=tn, nt=nt, nt_m=bm // tm)
        lanes = _warp_lanes(bm // tm, bn // tn) if knobs.get("warp_tile", 0) else None
        if lanes:  # sub-tiles of up to 4 x 4, a warp's lanes a grid of them
            vm, vn = min(tm, 4), tn
            layout = dict(warp_tile=True, vm=vm, vn=vn, lanes_m=lanes[0], lanes_n=lanes[1],
                          row_step=lanes[0] * vm, col_step=lanes[1] * vn)
        else:  # rows NT_M apart, a thread's channels adjacent (one vector)
            layout = dict(warp_tile=False, vm=1, vn=tn, row_step=bm // tm, col_step=tn)
        pipe_values = dict(values, **tiles, **layout, transposed=transposed, stages=stages,
                           split=split, phased=phased, kparams=kparams, kargs=kargs, sizes=sizes,
                           sparams=", ".join(f"int64_t {v}" for v in SIZES),
                           smem=f"(size_t){stages * bk * (bm + bn + 4) * 4}",
                           static_smem=2 * bk * (8 + 8 + 16))
        pipe_kernels = render(CUDA_CONV_PIPE, **pipe_values)
        pipe_launch = render(CUDA_CONV_PIPE_LAUNCH, **pipe_values).rstrip("\n")
    return common + render(CUDA_CONV, **values, params=signature + ", void* stream_ptr",
                           kparams=kparams, kargs=kargs, dparams=dparams, dargs=dargs,
                           sizes=sizes, transposed=transposed, **tiles, pipe=pipe,
                           phased=phased, pipe_kernels=pipe_kernels, pipe_launch=pipe_launch)


def uses_split(target: str, knobs: dict[str, Any]) -> bool:
    """Whether the CUDA convolution may split K (knob split_k): its entry point then takes the
    workspace ``ws`` and ``parts`` (from ``assay_conv_parts``)."""
    return target == "cuda" and bool(knobs.get("split_k", 0))


def _warp_lanes(rows: int, cols: int) -> tuple[int, int] | None:
    """A warp's lanes as a grid of sub-tiles (lanes along M, along N) that tiles a block of
    ``rows`` x ``cols`` threads' tiles: 8 x 4 first (a warp's stores span 8 sub-tiles of
    pixels), then 4 x 8 and the narrower ones; None where the block has fewer than 32
    threads."""
    for lm, ln in ((8, 4), (4, 8), (16, 2), (2, 16), (32, 1), (1, 32)):
        if rows % lm == 0 and cols % ln == 0:
            return lm, ln
    return None
