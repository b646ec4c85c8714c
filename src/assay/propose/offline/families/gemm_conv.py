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
deterministic sum.

cpu: a direct convolution, one OpenMP task per block of output rows of one (sample, channel)
plane, accumulated in place in the output, taps outermost and a unit-stride `omp simd` loop
along the output row (along the input row for a transposed one). cuda: an implicit GEMM
(M = samples x output pixels, N = output channels of a group, K = input channels of a group x
kernel volume, one group per blockIdx.z), tiled like gemm_tiled's SIMT GEMM (shared-memory
slabs, a register tile per thread) with the im2col gather computed on the fly from per-slab
tables; a depthwise convolution (one input and one output channel per group) has a direct
kernel of its own, one thread per output (knob ``depthwise``). fp32 FMAs, no TF32.
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
    ("cuda", "conv"): {"tile_m": (32, 64, 128), "tile_n": (16, 32, 64), "k_step": (8, 16, 32),
                       "thread_m": (2, 4, 8), "thread_n": (1, 2, 4), "block": (128, 256, 512),
                       "depthwise": (0, 1)},
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
// Implicit GEMM: a block of {{ nt }} threads computes a {{ bm }} x {{ bn }} tile of (output pixels of every
// sample) x (output channels of group blockIdx.z), each thread {{ tm }} x {{ tn }} of them in registers (rows
// {{ nt_m }} apart, so a warp stores consecutive pixels of a channel: coalesced). K (input channels of
// the group x taps) advances {{ bk }} at a time: the slab's im2col column of the input (zeros where a
// tap reads padding{% if transposed %} or no input pixel{% endif %}) and the weights' slab go to shared memory, their
// coordinates read from per-block (pixels) and per-slab (channel, tap) tables rather than
// divided out per element. Plain fp32 FMAs in K order.
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
  const int64_t g = blockIdx.z, m0 = (int64_t)blockIdx.x * BM, n0 = (int64_t)blockIdx.y * BN;
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, KV = cv.Kd * cv.Kh * cv.Kw, K = CiG * KV;
  const int64_t P = cv.Do * cv.Ho * cv.Wo, M = cv.N * P, DHWi = cv.Di * cv.Hi * cv.Wi;
  const float* __restrict__ xg = x + g * CiG * DHWi;
  for (int e = tid; e < BM; e += NT) {
    const int64_t m = m0 + e;
    if (m < M) {
      const int64_t n = m / P, p = m % P;
      m_base[e] = n * cv.Ci * DHWi;
      m_w[e] = (int)(p % cv.Wo);
      m_h[e] = (int)((p / cv.Wo) % cv.Ho);
      m_d[e] = (int)(p / (cv.Wo * cv.Ho));
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
        const int64_t cl = k / KV, tap = k % KV;
        k_chan[e] = cl * DHWi;
{% if transposed %}
        k_tap[e] = (int)tap;
{% endif %}
        k_w[e] = (int)(tap % cv.Kw);
        k_h[e] = (int)((tap / cv.Kw) % cv.Kh);
        k_d[e] = (int)(tap / (cv.Kw * cv.Kh));
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
          ? __ldg(w + ((g * CiG + k / KV) * CoG + co) * KV + k_tap[kk]) : 0.0f;
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
    const int64_t n = m / P, p = m % P;
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

// Depthwise (one input and one output channel per group): memory-bound, so one thread per
// output (grid-stride), consecutive threads on consecutive pixels of a plane, the channel's
// taps read through the read-only cache (shared by the block's threads).
__global__ void __launch_bounds__({{ block }})
assay_conv_direct({{ kparams }}) {
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
    assay_conv_direct<<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
    return (int)cudaGetLastError();
  }
  const int64_t gx = (cv.N * P + {{ bm - 1 }}) / {{ bm }}, gy = (CoG + {{ bn - 1 }}) / {{ bn }};
  if (gx > 2147483647 || gy > 65535 || cv.G > 65535) return (int)cudaErrorInvalidConfiguration;
  assay_conv_tiles<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)cv.G), {{ nt }}, 0, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
}
"""


def defaults(target: str) -> dict[str, int]:
    """Not yet measured (no GPU here): 64 x 64 tiles of 4 x 4 per thread (256 threads), K slabs
    of 16; 4 rows per task on the host."""
    if target == "cpu":
        return {"threads": 0, "rows": 4}
    return {"tile_m": 64, "tile_n": 64, "k_step": 16, "thread_m": 4, "thread_n": 4,
            "block": 256, "depthwise": 1}


def safe(target: str) -> dict[str, int]:
    """Small tiles, one row per task, serial on the host."""
    if target == "cpu":
        return {"threads": 1, "rows": 1}
    return {"tile_m": 32, "tile_n": 16, "k_step": 8, "thread_m": 2, "thread_n": 1,
            "block": 128, "depthwise": 1}


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
    # The kernels take the geometry as one struct, the other parameters as they are.
    kernel_params = [p for p in params if p.name not in SIZES]
    kparams = ", ".join([f"{p.ctype} {p.name}" for p in kernel_params] + ["const AssayConv cv"])
    kargs = ", ".join([p.name for p in kernel_params] + ["cv"])
    bm, bn = int(knobs["tile_m"]), int(knobs["tile_n"])
    tm, tn = int(knobs["thread_m"]), int(knobs["thread_n"])
    while (bm // tm) * (bn // tn) > 1024:  # a block's limit: larger register tiles instead
        tm *= 2
    return common + render(CUDA_CONV, **values, params=signature + ", void* stream_ptr",
                           kparams=kparams, kargs=kargs, sizes=sizes, transposed=transposed,
                           bm=bm, bn=bn, bk=int(knobs["k_step"]), tm=tm, tn=tn,
                           nt=(bm // tm) * (bn // tn), nt_m=bm // tm,
                           block=int(knobs["block"]), depthwise=int(knobs["depthwise"]))
