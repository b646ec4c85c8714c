"""The pool family: 2-D max or average pooling of a forward input (NCHW or CHW; 1-D pooling
of NCL as CHW with windows of height 1) or 3-D pooling (NCDHW or CDHW: the same kernels with a
depth loop around the window and output rows over (plane, output depth, output row)), with the
elementwise chain after it fused into the store. C++: OpenMP threads over (plane, output row);
CUDA: a thread per run of consecutive outputs of a row, windows read straight from global
memory; Triton: one program per BLOCK outputs (flat over planes and output rows), each window
tap a masked load of BLOCK elements. Every case the C++ and CUDA forms write has a Triton form
(1-, 2- and 3-D, stride, padding, dilation, ceil_mode, count_include_pad, divisor_override, the
epilogue); the Triton form declines only epilogues with an op it cannot write exactly
(triton_form.why_not)."""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families import triton_form as tri
from assay.propose.offline.families.family import Entry, Family, Head, Space
from assay.propose.offline.families.shared import (CPP_PREAMBLE, CUDA_COMMON, Param, forward_call,
                                                   fused_epilogue, head_values, leaf_params,
                                                   knob_line, leaf_tensor, out_param, pointer,
                                                   render, size_params)
from assay.propose.offline.ir import Analysis, Plan, Pool

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # cpu: threads over (plane, output row). cuda: block threads; cols: consecutive outputs of
    # a row per thread (their index math shared, one vector store); vec: 1 = input rows as
    # float4 loads of the thread's stride chunk plus its halo (when whole vectors).
    ("cpu", "pool"): {"threads": (0, 1, 2, 4, 8)},
    ("cuda", "pool"): {"block": (128, 256, 512), "cols": (1, 2, 4), "vec": (0, 1)},
    # triton: block = outputs per program (Triton's BLOCK, a power of two); num_warps: warps
    # per program; unroll: 1 = the window's loops unrolled (tl.static_range: every tap's load
    # issued at once), 0 = run-time loops (a large window compiles in bounded time). No
    # num_stages: there is no loop over the data to pipeline.
    ("triton", "pool"): {"block": (64, 128, 256, 512, 1024), "num_warps": (1, 2, 4, 8),
                         "unroll": (0, 1)},
}

# Triton's defaults (not yet measured here); windows of at most UNROLL_TAPS taps are unrolled
# by default (knob unroll): 27 for a 3x3x3 window, where an 11x11x11 one would be 1331 loads in
# one straight line.
TRITON_DEFAULTS = {"block": 256, "num_warps": 4}
UNROLL_TAPS = 64

# 2-D pooling (max or average) with an elementwise epilogue: `acc_v` is the window's value,
# `i` the output's flat index. The window's arithmetic is torch's (the same bounds, the same
# divisor, the same summation order, NaN propagating through max), so results match exactly.
# The pooling parameters are compile-time constants: loops over a 3x3 window unroll.

POOL_CONSTANTS = r"""
constexpr int KH = {{ kh }}, KW = {{ kw }};  // window
constexpr int SH = {{ sh }}, SW = {{ sw }};  // stride
constexpr int PH = {{ ph }}, PW = {{ pw }};  // padding
constexpr int DH = {{ dh }}, DW = {{ dw }};  // dilation
{% if depth %}
constexpr int KD = {{ kd }}, SD = {{ sd }}, PD = {{ pd }}, DD = {{ dd }};  // along D (3-D)
{% endif %}
"""

# 3-D pooling: the depth slices of the window, outermost (torch's order), each an input plane
# ``xd`` that ROW(ih) reads; ``ds`` is the window's first slice, DI the input's depth.
DEPTH_OPEN = r"""
      #pragma unroll
      for (int kd = 0; kd < KD; ++kd) {
        const IDX id = ds + (IDX)kd * DD;  // DD is 1 for avg pooling
        if (id < 0 || id >= DI) continue;
        const float* xd = xp + id * HI * WI;
"""

# One output element: ``hs``/``ws`` are its window's corner (padding included), `ROW(ih)` a
# pointer to input row ih of the plane, `LOAD(p)` a read, IDX the index type, HI x WI the plane. Both windows are
# unrolled over KH x KW with bounds checks, visiting the in-bounds elements in torch's order.
# 3-D: the same inside DEPTH_OPEN's loop.
POOL_WINDOW = r"""
{% if op == "max" %}
      float acc = -INFINITY;
{% if depth %}
{{ depth_open }}
{% endif %}
      #pragma unroll
      for (int kh = 0; kh < KH; ++kh) {
        const IDX ih = hs + (IDX)kh * DH;
        if (ih < 0 || ih >= HI) continue;
        const float* r = ROW(ih);
        #pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          const IDX iw = ws + (IDX)kw * DW;
          if (iw < 0 || iw >= WI) continue;
          const float v = LOAD(r + iw);
          if (v > acc || v != v) acc = v;  // NaN propagates, as in torch
        }
      }
{% if depth %}
{{ depth_close }}
{% endif %}
{% else %}
      float acc = 0.0f;
{% if depth %}
{{ depth_open }}
{% endif %}
      #pragma unroll
      for (int kh = 0; kh < KH; ++kh) {
        const IDX ih = hs + kh;  // avg pooling has no dilation
        if (ih < 0 || ih >= HI) continue;
        const float* r = ROW(ih);
        #pragma unroll
        for (int kw = 0; kw < KW; ++kw) {
          const IDX iw = ws + kw;
          if (iw < 0 || iw >= WI) continue;
          acc += LOAD(r + iw);
        }
      }
{% if depth %}
{{ depth_close }}
{% endif %}
{{ avg_divide }}
{% endif %}
"""

# The average's divisor, torch's: the window clipped to the padded input (ceil_mode can
# overhang it), or to the input itself (count_include_pad=False), or divisor_override; `acc`
# (the window's sum) becomes the average. 3-D: the product of the three extents, each clipped.
POOL_AVG_DIVIDE = r"""
      {
{% if depth %}
        const IDX de = ds + KD < DI + PD ? ds + KD : DI + PD;
        const IDX d0 = ds > 0 ? ds : 0, d1 = de < DI ? de : DI;
{% endif %}
        const IDX he = hs + KH < HI + PH ? hs + KH : HI + PH;
        const IDX we = ws + KW < WI + PW ? ws + KW : WI + PW;
        const IDX h0 = hs > 0 ? hs : 0, w0 = ws > 0 ? ws : 0;
        const IDX h1 = he < HI ? he : HI, w1 = we < WI ? we : WI;
{% if divisor %}
        const IDX divide = {{ divisor }};
{% elif count_include_pad %}
        const IDX divide = {% if depth %}(de - ds) * {% endif %}(he - hs) * (we - ws);
{% else %}
        const IDX divide = {% if depth %}(d1 - d0) * {% endif %}(h1 - h0) * (w1 - w0);
{% endif %}
{% if depth %}
        acc = (d0 >= d1 || h0 >= h1 || w0 >= w1) ? 0.0f : acc / (float)divide;
{% else %}
        acc = (h0 >= h1 || w0 >= w1) ? 0.0f : acc / (float)divide;
{% endif %}
      }
"""

CPP_POOL = CPP_PREAMBLE + POOL_CONSTANTS + r"""
#define LOAD(p) (*(p))
extern "C" int assay_forward({{ params }}) {
  using IDX = int64_t;
  const IDX HI = H, WI = W;
{% for line in prologue %}
  {{ line }}
{% endfor %}
{% if depth %}
  const IDX DI = D;
{% if parallel %}
  #pragma omp parallel for collapse(2) schedule(static){{ omp_clause }} if(planes * OD * OH * OW > 32768)
{% endif %}
  for (int64_t pd = 0; pd < planes * OD; ++pd) {  // (plane, output depth)
    for (int64_t oh = 0; oh < OH; ++oh) {
      const int64_t plane = pd / OD, od = pd - plane * OD;
      const float* xp = x + plane * D * H * W;
#define ROW(ih) (xd + (ih) * W)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t ds = od * SD - PD, hs = oh * SH - PH, ws = ow * SW - PW;
{{ window }}
        const float acc_v = acc;
        const int64_t i = (pd * OH + oh) * OW + ow;
{% else %}
{% if parallel %}
  #pragma omp parallel for collapse(2) schedule(static){{ omp_clause }} if(planes * OH * OW > 32768)
{% endif %}
  for (int64_t plane = 0; plane < planes; ++plane) {
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* xp = x + plane * H * W;
#define ROW(ih) (xp + (ih) * W)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t hs = oh * SH - PH, ws = ow * SW - PW;
{{ window }}
        const float acc_v = acc;
        const int64_t i = (plane * OH + oh) * OW + ow;
{% endif %}
        (void)i;
{% for line in epi_body %}
        {{ line }}
{% endfor %}
        out[i] = {{ epi_out }};
      }
#undef ROW
    }
  }
  return 0;
}
"""

CUDA_POOL = POOL_CONSTANTS + r"""
constexpr int COLS = {{ cols }};  // consecutive outputs of one output row per thread
// The input columns a thread's COLS windows span (seg[j] = column ow0 * SW - PW + j), and the
// float4 loads that cover its own stride chunk, columns [ow0 * SW, (ow0 + COLS) * SW), when
// that chunk is whole vectors (0: the scalar path only).
constexpr int SEG = (COLS - 1) * SW + (KW - 1) * DW + 1;
constexpr int SEG_ALL = SEG > PW + COLS * SW ? SEG : PW + COLS * SW;
constexpr int VLOADS = {{ vloads }};
#define LOAD(p) __ldg(p)

// A thread computes COLS consecutive outputs of one row, its windows read straight from global
// memory: neighbouring windows overlap, so most of those reads hit L1/L2 and DRAM sees each
// input element about once, with many loads in flight per thread. (A strip staged in shared
// memory first ran at 34-46% of the bandwidth on an H200: copy, sync, compute left the memory
// system idle between steps.) The index math, 32-bit when the sizes allow (IDX), is paid once
// per COLS outputs; VOUT: the COLS outputs leave as one vector store. VIN: each input row of
// the windows arrives as float4 loads of the thread's own chunk plus scalar loads of the
// halo (which neighbours load as vectors: L1 hits), one load instruction where the scalar
// path issues a strided load per window column (each touching 4 cache lines per warp).
template <typename IDX, bool VOUT, bool VIN>
__global__ void __launch_bounds__({{ block }})
assay_pool({{ kparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const IDX HI = (IDX)H, WI = (IDX)W;
  const IDX groups = ((IDX)OW + COLS - 1) / COLS;  // threads' items per output row
{% if depth %}
  const IDX DI = (IDX)D;
  const IDX items = (IDX)planes * (IDX)OD * (IDX)OH * groups;
{% else %}
  const IDX items = (IDX)planes * (IDX)OH * groups;
{% endif %}
  const IDX step = (IDX)gridDim.x * {{ block }};
  for (IDX t = (IDX)blockIdx.x * {{ block }} + (IDX)threadIdx.x; t < items; t += step) {
    const IDX r = t / groups;  // the output row, counted over all planes
    const IDX ow0 = (t - r * groups) * COLS;
{% if depth %}
    const IDX pd = r / OH, oh = r - pd * OH;  // (plane, output depth), output row
    const IDX plane = pd / OD, od = pd - plane * OD;
    const IDX ds = od * SD - PD;
    const float* __restrict__ xp = x + plane * DI * HI * WI;
#define ROW(ih) (xd + (ih) * WI)
{% else %}
    const IDX plane = r / OH, oh = r - plane * OH;
    const float* __restrict__ xp = x + plane * HI * WI;
#define ROW(ih) (xp + (ih) * WI)
{% endif %}
    float pooled[COLS];
    const IDX c0 = ow0 * SW;  // the thread's own chunk of input columns
    if (VIN && VLOADS > 0 && ow0 + COLS <= OW && c0 + COLS * SW <= WI) {
      const IDX hs = oh * SH - PH;
{% if op == "max" %}
      const float pad = -INFINITY;  // never wins: the same maximum as skipping the column
{% else %}
      const float pad = 0.0f;  // x + 0.0f == x: the same sum as skipping the column
{% endif %}
      #pragma unroll
      for (int c = 0; c < COLS; ++c) pooled[c] = pad;
{% if depth %}
{{ depth_open }}
{% endif %}
      #pragma unroll
      for (int kh = 0; kh < KH; ++kh) {
        const IDX ih = hs + (IDX)kh * DH;
        if (ih < 0 || ih >= HI) continue;
        const float* rp = ROW(ih);
        float seg[SEG_ALL];
        #pragma unroll
        for (int v = 0; v < VLOADS; ++v) {
          const float4 q = __ldg(reinterpret_cast<const float4*>(rp + c0) + v);
          seg[PW + 4 * v] = q.x; seg[PW + 4 * v + 1] = q.y;
          seg[PW + 4 * v + 2] = q.z; seg[PW + 4 * v + 3] = q.w;
        }
        #pragma unroll
        for (int j = 0; j < SEG_ALL; ++j) {
          if (j >= PW && j < PW + 4 * VLOADS) continue;  // loaded as vectors
          const IDX iw = c0 - PW + j;
          seg[j] = iw >= 0 && iw < WI ? LOAD(rp + iw) : pad;
        }
        #pragma unroll
        for (int c = 0; c < COLS; ++c) {
          #pragma unroll
          for (int kw = 0; kw < KW; ++kw) {
            const float v = seg[c * SW + kw * DW];
{% if op == "max" %}
            if (v > pooled[c] || v != v) pooled[c] = v;  // NaN propagates, as in torch
{% else %}
            pooled[c] += v;
{% endif %}
          }
        }
      }
{% if depth %}
{{ depth_close }}
{% endif %}
{% if op != "max" %}
      #pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const IDX ws = (ow0 + c) * SW - PW;
        float acc = pooled[c];
{{ avg_divide }}
        pooled[c] = acc;
      }
{% endif %}
    } else {
      #pragma unroll
      for (int c = 0; c < COLS; ++c) {
        const IDX ow = ow0 + c;
        pooled[c] = 0.0f;
        if (ow >= OW) continue;  // the row's last item may be partial
        const IDX hs = oh * SH - PH, ws = ow * SW - PW;
{{ window }}
        pooled[c] = acc;
      }
    }
#undef ROW
    float vals[COLS];
    #pragma unroll
    for (int c = 0; c < COLS; ++c) {
      vals[c] = 0.0f;
      if (ow0 + c >= OW) continue;
      const float acc_v = pooled[c];
      const IDX i = r * OW + ow0 + c;
      (void)i;
{% for line in epi_body %}
      {{ line }}
{% endfor %}
      vals[c] = {{ epi_out }};
    }
    const IDX base = r * OW + ow0;
    if constexpr (VOUT) {
      assay_store_out<COLS>(out, base, vals);
    } else {
      #pragma unroll
      for (int c = 0; c < COLS; ++c) {
        if (ow0 + c < OW) out[base + c] = vals[c];
      }
    }
  }
}

template <typename IDX, bool VOUT>
static int assay_launch(int64_t blocks, bool vin, cudaStream_t stream, {{ kparams }}) {
  if (vin) assay_pool<IDX, VOUT, true><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  else assay_pool<IDX, VOUT, false><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
}

extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (planes <= 0 || {% if depth %}OD <= 0 || {% endif %}OH <= 0 || OW <= 0) return 0;
  const int64_t items = planes * {% if depth %}OD * {% endif %}OH * ((OW + COLS - 1) / COLS);
  int64_t blocks = (items + {{ block - 1 }}) / {{ block }};
  const int64_t cap = (int64_t)assay_sm_count() * {{ 2048 // block * 16 }};  // 16 waves, then stride
  if (blocks > cap) blocks = cap;
  // 32-bit indices when every index, and the grid-stride loop's last step, stays below 2^31.
  const int64_t limit = 2147483647;
{% if depth %}
  const bool narrow = planes * D * H * W < limit && planes * OD * OH * OW < limit
                      && items + blocks * {{ block }} < limit;
{% else %}
  const bool narrow = planes * H * W < limit && planes * OH * OW < limit
                      && items + blocks * {{ block }} < limit;
{% endif %}
  const bool vout = COLS > 1 && OW % COLS == 0 && assay_aligned(out, 4 * COLS);
  const bool vin = VLOADS > 0 && W % 4 == 0 && assay_aligned(x, 16);  // every row 16-byte aligned
  if (narrow) {
    return vout ? assay_launch<int, true>(blocks, vin, stream, {{ kargs }})
                : assay_launch<int, false>(blocks, vin, stream, {{ kargs }});
  }
  return vout ? assay_launch<int64_t, true>(blocks, vin, stream, {{ kargs }})
              : assay_launch<int64_t, false>(blocks, vin, stream, {{ kargs }});
}
"""

# Triton: one program per BLOCK outputs, flat over (plane, [output depth,] output row, output
# column). Each tap of the window is one masked load of BLOCK elements, a tap outside the input
# loading the value that changes nothing (-inf for max, 0.0 for a sum), so the arithmetic is
# torch's as in POOL_WINDOW: the same taps in the same order, NaN propagating through max, the
# same divisor (POOL_AVG_DIVIDE's rules), an IEEE-rounded division. The pooling parameters are
# constexpr arguments (knob unroll: tl.static_range unrolls the window's loops).
TRITON_POOL = r"""
# Assay offline synthesizer v1: {{ template }} kernel (triton)
# computes: {{ summary }}
# knobs: {{ knob_line }}
@triton.jit
def assay_pool({{ params }},
               KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
               PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
{% if depth %}
               KD: tl.constexpr, SD: tl.constexpr, PD: tl.constexpr, DD: tl.constexpr,
{% endif %}
               BLOCK: tl.constexpr):
    # 64-bit indices: offs is int64 and every index below is computed from it first.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ow = offs % OW
    r = offs // OW
    oh = r % OH
    r = r // OH
{% if depth %}
    od = r % OD
    xp = x + (r // OD) * D * H * W  # the plane's first element
    ds = od * SD - PD  # the window's first slice, padding included
{% else %}
    xp = x + r * H * W  # the plane's first element
{% endif %}
    hs = oh * SH - PH  # the window's corner, padding included
    ws = ow * SW - PW
{% if op == "max" %}
    acc = tl.full([BLOCK], float("-inf"), tl.float32)
{% else %}
    acc = tl.zeros([BLOCK], dtype=tl.float32)
{% endif %}
{% for line in window %}
    {{ line }}
{% endfor %}
{% if op != "max" %}
    # torch's divisor: the window clipped to the padded input (ceil_mode can overhang it), or
    # to the input itself (count_include_pad=False), or divisor_override; an empty window is 0.
{% if depth %}
    de = tl.minimum(ds + KD, D + PD)
    d0 = tl.maximum(ds, 0)
    d1 = tl.minimum(de, D)
{% endif %}
    he = tl.minimum(hs + KH, H + PH)
    we = tl.minimum(ws + KW, W + PW)
    h0 = tl.maximum(hs, 0)
    w0 = tl.maximum(ws, 0)
    h1 = tl.minimum(he, H)
    w1 = tl.minimum(we, W)
{% if divisor %}
    divide = {{ divisor }}.0  # divisor_override
{% elif count_include_pad %}
    divide = ({% if depth %}(de - ds) * {% endif %}(he - hs) * (we - ws)).to(tl.float32)
{% else %}
    divide = ({% if depth %}(d1 - d0) * {% endif %}(h1 - h0) * (w1 - w0)).to(tl.float32)
{% endif %}
    empty = {% if depth %}(d0 >= d1) | {% endif %}(h0 >= h1) | (w0 >= w1)
    acc = tl.where(empty, 0.0, tl.math.div_rn(acc, divide))
{% endif %}
{% for line in body %}
    {{ line }}
{% endfor %}
    tl.store(out + offs, {{ result }}, mask=mask)
"""


def _triton_window(pool: Pool, unroll: bool) -> list[str]:
    """The loops over the window's taps (depth, height, width; torch's order) of TRITON_POOL,
    each tap's load masked to the input (and to the program's outputs)."""
    loop = "tl.static_range" if unroll else "range"
    pad, update = (('float("-inf")', "acc = tl.where((v > acc) | (v != v), v, acc)"
                    "  # NaN propagates, as in torch") if pool.op == "max"
                   else ("0.0", "acc += v"))
    lines, ind, ok, base = [], "", "mask", "xp"
    if pool.spatial == 3:
        lines += [f"for kd in {loop}(KD):", "    di = ds + kd * DD",
                  "    okd = mask & (di >= 0) & (di < D)", "    xd = xp + di * H * W"]
        ind, ok, base = "    ", "okd", "xd"
    return lines + [f"{ind}for kh in {loop}(KH):", f"{ind}    ih = hs + kh * DH",
                    f"{ind}    okh = {ok} & (ih >= 0) & (ih < H)", f"{ind}    xh = {base} + ih * W",
                    f"{ind}    for kw in {loop}(KW):", f"{ind}        iw = ws + kw * DW",
                    f"{ind}        v = tl.load(xh + iw, mask=okh & (iw >= 0) & (iw < W), "
                    f"other={pad})",
                    f"{ind}        {update}"]


def _triton_sizes(pool: Pool) -> list[str]:
    return (["n", "D", "H", "W", "OD", "OH", "OW"] if pool.spatial == 3
            else ["n", "H", "W", "OH", "OW"])


def triton_source(plan: Plan, knobs: dict[str, Any], summary: str) -> str:
    """The @triton.jit pooling kernel of ``plan``, its epilogue fused into the store."""
    pool = plan.pool
    assert pool is not None
    ptrs, geometry = tri.epilogue_args(plan)
    params = ["x"] + ptrs + ["out"] + _triton_sizes(pool) + geometry
    return render(TRITON_POOL, template="pool", summary=summary.replace("\n", " "),
                  knob_line=knob_line(knobs), params=", ".join(params),
                  depth=pool.spatial == 3, op=pool.op,
                  window=_triton_window(pool, bool(knobs["unroll"])), divisor=pool.divisor,
                  count_include_pad=pool.count_include_pad,
                  body=tri.epilogue_lines(plan, "acc"), result=tri.output_expr(plan))


def triton_launch(plan: Plan, knobs: dict[str, Any]) -> str:
    """ModelNew.forward's launch of assay_pool (the head's lines set lx and the sizes; the
    epilogue's leaves are l<k>), one program per ``block`` outputs."""
    pool = plan.pool
    assert pool is not None
    ptrs, geometry = tri.epilogue_args(plan)
    args = ["lx"] + [f"l{p[1:]}" for p in ptrs] + ["out"] + _triton_sizes(pool) + geometry
    names = ["KH", "KW", "SH", "SW", "PH", "PW", "DH", "DW"]
    values = [*pool.kernel, *pool.stride, *pool.padding, *pool.dilation]
    if pool.spatial == 3:
        names += ["KD", "SD", "PD", "DD"]
        values += list(pool.depth)
    block = int(knobs["block"])
    return (f"assay_pool[(triton.cdiv(n, {block}),)]({', '.join(args)}, "
            + "".join(f"{k}={int(v)}, " for k, v in zip(names, values))
            + f"BLOCK={block}, num_warps={int(knobs['num_warps'])})")


def _pool_params(plan: Plan, target: str) -> list[Param]:
    """assay_forward's parameters for a pooling plan: the pooled input, the epilogue's other
    leaves, the output, the geometry (planes = N*C, input H x W, output OH x OW; 3-D: input
    D x H x W, output OD x OH x OW), leaf geometry."""
    assert plan.pool is not None
    x = pointer(target, "x", "lx.data_ptr()")
    ptrs, geometry = leaf_params(plan, target, plan.pool_leaf)
    sizes = (("planes", "D", "H", "W", "OD", "OH", "OW") if plan.pool.spatial == 3
             else ("planes", "H", "W", "OH", "OW"))
    return [x] + ptrs + [out_param(target)] + size_params(*sizes) + geometry


def pool_source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The pooling kernel with its elementwise epilogue fused into the store."""
    if target == "triton":
        return triton_source(plan, knobs, summary)
    pool = plan.pool
    assert pool is not None
    prologue, body, out_expr = fused_epilogue(plan, False)
    params = _pool_params(plan, target)
    kparams = ", ".join(f"{p.ctype} {p.name}" for p in params)
    depth = pool.spatial == 3
    geometry = {"kh": pool.kernel[0], "kw": pool.kernel[1], "sh": pool.stride[0],
                "sw": pool.stride[1], "ph": pool.padding[0], "pw": pool.padding[1],
                "dh": pool.dilation[0], "dw": pool.dilation[1], "depth": depth,
                **dict(zip(("kd", "sd", "pd", "dd"), pool.depth)),
                "depth_open": render(DEPTH_OPEN) if depth else "",
                "depth_close": "      }" if depth else ""}
    avg_divide = render(POOL_AVG_DIVIDE, divisor=pool.divisor,
                        count_include_pad=pool.count_include_pad, depth=depth)
    window = render(POOL_WINDOW, op=pool.op, avg_divide=avg_divide, **geometry)
    kargs = ", ".join(p.name for p in params)
    values = dict(head_values("pool", knobs, summary), prologue=prologue, epi_body=body,
                  epi_out=out_expr, window=window, kparams=kparams, kargs=kargs, **geometry)
    if target == "cpu":
        threads = int(knobs["threads"])
        return render(CPP_POOL, params=kparams, parallel=threads != 1,
                      omp_clause=(f" num_threads(assay_threads({threads}))"
                                  if threads > 1 else ""), **values)
    head = render(CUDA_COMMON, **values)
    # Vector input loads (knob vec) need the thread's stride chunk to be whole float4s, and
    # its span of columns few enough to stay in registers.
    cols, sw, dw = int(knobs["cols"]), pool.stride[1], pool.dilation[1]
    span = max((cols - 1) * sw + (pool.kernel[1] - 1) * dw + 1, pool.padding[1] + cols * sw)
    vloads = cols * sw // 4 if knobs["vec"] and cols * sw % 4 == 0 and span <= 32 else 0
    return head + render(CUDA_POOL, params=kparams + ", void* stream_ptr",
                         block=int(knobs["block"]), cols=cols, vloads=vloads, op=pool.op,
                         avg_divide=avg_divide, **values)


def _pool_lines(plan: Plan) -> list[str]:
    """The pooled input ``lx``, its planes and the output's size per dim (torch's formula,
    ceil_mode included); ``gshape`` is the output's shape."""
    pool = plan.pool
    assert pool is not None
    dims = [("OH", "H", pool.kernel[0], pool.stride[0], pool.padding[0], pool.dilation[0]),
            ("OW", "W", pool.kernel[1], pool.stride[1], pool.padding[1], pool.dilation[1])]
    if pool.spatial == 3:
        dims.insert(0, ("OD", "D", *pool.depth))
        lines = [f"lx = {leaf_tensor(pool.x)}",
                 "_expect(lx.dim() in (4, 5), 'the pooled input is not CDHW or NCDHW')",
                 "D, H, W = lx.shape[-3], lx.shape[-2], lx.shape[-1]"]
    else:
        lines = [f"lx = {leaf_tensor(pool.x)}",
                 "_expect(lx.dim() in (3, 4), 'the pooled input is not CHW or NCHW')",
                 "H, W = lx.shape[-2], lx.shape[-1]"]
    for out, size, k, s_, p, d in dims:
        extra = s_ - 1 if pool.ceil_mode else 0
        lines.append(f"{out} = ({size} + {2 * p} - {d * (k - 1)} - 1 + {extra}) // {s_} + 1")
        if pool.ceil_mode:  # the last window must start inside the input or its left padding
            lines.append(f"{out} -= 1 if ({out} - 1) * {s_} >= {size} + {p} else 0")
    outs = tuple(d[0] for d in dims)
    lines += [f"_expect({' and '.join(f'{o} > 0' for o in outs)}, "
              f"'the pooled output would be empty')",
              f"planes = math.prod(lx.shape[:-{len(outs)}])",
              f"gshape = tuple(lx.shape[:-{len(outs)}]) + ({', '.join(outs)})"]
    return lines


def matches(plan: Plan) -> bool:
    return plan.pool is not None


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    return dict(KNOB_SPACES[(target, "pool")])


def declines(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    """The Triton form writes every pooling the others do; its epilogue needs exact Triton
    formulas (no libdevice ops)."""
    return tri.why_not(analysis.plan) if target == "triton" else None


def _taps(pool: Pool) -> int:
    return pool.kernel[0] * pool.kernel[1] * pool.depth[0]


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    if target == "triton":
        # TRITON_DEFAULTS, the window unrolled unless it has more than UNROLL_TAPS taps.
        pool = analysis.plan.pool
        assert pool is not None
        return dict(TRITON_DEFAULTS, unroll=int(_taps(pool) <= UNROLL_TAPS))
    # Four outputs per thread, each input row of their windows as two float4 loads and a halo
    # element. H200, L1_18/L1_19 (3x3/2 windows): 0.041 ms, 1.1x torch.compile; with scalar
    # loads 0.065-0.09 ms (benchmarks/probe_gpu.py --only sweep).
    return {"threads": 0} if target == "cpu" else {"block": 256, "cols": 4, "vec": 1}


def safe(target: str, plan: Plan | None = None, knobs: Any = None) -> dict[str, int]:
    """Scalar loads, one output per thread, serial on the host; small Triton programs whose
    window loops run at run time (the least to compile)."""
    if target == "triton":
        return {"block": 128, "num_warps": 4, "unroll": 0}
    return {"threads": 1} if target == "cpu" else {"block": 128, "cols": 1, "vec": 0}


def template(plan: Plan, knobs: dict[str, Any]) -> str:
    return "pool"


def strategy(plan: Plan, knobs: dict[str, Any]) -> str:
    return "pooling"


def head(plan: Plan, target: str, knobs: dict[str, Any]) -> Head:
    return Head(_pool_lines(plan), device="lx", what="the pooled tensor")


def calls(plan: Plan, target: str, knobs: dict[str, Any], stream: list[str]
          ) -> tuple[list[str], list[Entry]]:
    """The C/CUDA entry point's call, or (Triton) the launch of the file's @triton.jit kernel
    (no entry points to bind)."""
    if target == "triton":
        return [triton_launch(plan, knobs)], []
    return forward_call(_pool_params(plan, target), stream)


FAMILY = Family(name="pool", matches=matches, knob_spaces=KNOB_SPACES, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=pool_source, calls=calls, declines=declines, head=head)
