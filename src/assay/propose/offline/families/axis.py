"""The axis family: reductions and scans along dims that are not (all) the trailing ones.

The tensor is viewed as (outer, mid, inner) with the reduced or scanned dims as mid, so that
one output position (or one scanned line) is an (outer, inner) pair whose elements lie
``inner`` apart: sum, mean, max, min, prod, argmax/argmin (int64, the first of ties) over a
block of dims that does not end at the last (prod, argmax and argmin also over the last: the
row family lacks them), normalizations that broadcast such a reduction back (RMSNorm over
channels), and cumsum/cumprod along any dim, reversed (flip, cumsum, flip) or of a masked
input (``x * mask``, a bool leaf). An elementwise chain before the reduction or scan and one
after it (per output element) are fused.

C++: OpenMP threads over (outer, tile of ``tile`` inner positions), each walking mid with an
``omp simd`` loop over its tile (consecutive in memory). CUDA, reductions: a thread per output
position (consecutive threads, consecutive positions: coalesced over inner), or ``split``
threads sharing one through shared memory when positions are few; scans: a thread per line
(coalesced when inner is wide) or a block per line (a block-wide scan of chunks of
``block * items`` elements with a running carry, for lines along the last dim).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from assay.propose.offline.families.family import Family, Space
from assay.propose.offline.families.shared import (CPP_FORWARD_CLOSE, CPP_FORWARD_OPEN, CUDA_COMMON,
                                                   Names, Schedule, elem_closure, fused_calls,
                                                   fused_kernel, render)
from assay.propose.offline.ir import ARG_REDUCTIONS, Analysis, Plan

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP's default team, 1 = serial, k = at most k; tile: inner positions
    # walked together (the simd loop's length); unroll: simd length in units of 4 lanes.
    ("cpu", "axis"): {"threads": (0, 1, 2, 4, 8), "tile": (1, 8, 32, 128), "unroll": (1, 2, 4)},
    ("cpu", "scan"): {"threads": (0, 1, 2, 4, 8), "tile": (1, 8, 32, 128), "unroll": (1, 2, 4)},
    # split: threads sharing one output position (each a strided slice of mid, combined in
    # shared memory); unroll: iterations of the walk along mid unrolled (loads in flight).
    ("cuda", "axis"): {"block": (128, 256, 512, 1024), "split": (1, 2, 4, 8),
                       "unroll": (1, 2, 4, 8)},
    # form: 0 = a thread per line where inner >= 32 (coalesced), else a block per line;
    # 1 = always a thread per line; 2 = always a block per line. items: consecutive elements
    # per thread in a block's chunk.
    ("cuda", "scan"): {"block": (128, 256, 512, 1024), "items": (1, 2, 4, 8),
                       "form": (0, 1, 2)},
}

# SMs of the product's device (H100 SXM / H200), for the default split.
_SMS = 132

# Per reduction: (accumulator type, identity, C++/CUDA update of acc with value x).
_ACC = {
    "sum": ("double", "0.0", "{acc} += (double){x};"),
    "prod": ("double", "1.0", "{acc} *= (double){x};"),
    "max": ("float", "-INFINITY", "{acc} = assay_max2({acc}, {x});"),
    "min": ("float", "INFINITY", "{acc} = assay_min2({acc}, {x});"),
    # torch's argmax: NaN is the largest value, ties and repeated NaNs keep the first index
    "argmax": ("float", "-INFINITY",
               "if ({x} > {acc} || ({x} != {x} && {acc} == {acc})) {{ {acc} = {x}; "
               "{idx} = m; }}"),
    "argmin": ("float", "INFINITY",
               "if ({x} < {acc} || ({x} != {x} && {acc} == {acc})) {{ {acc} = {x}; "
               "{idx} = m; }}"),
}
# How a scan combines (identity, operator).
_SCAN = {"sum": ("0.0", "+"), "prod": ("1.0", "*")}

CPP_AXIS = CPP_FORWARD_OPEN + r"""
  const int64_t tiles = (inner + {{ tile }} - 1) / {{ tile }};
{% if parallel %}
  #pragma omp parallel for schedule(static){{ omp_clause }} if(outer * mid * inner > 32768)
{% endif %}
  for (int64_t w = 0; w < outer * tiles; ++w) {
    // {{ tile }} consecutive inner positions of one outer index: each step along mid reads
    // (and a scan writes) them as one contiguous run.
    const int64_t o = w / tiles;
    const int64_t n0 = (w - o * tiles) * {{ tile }};
    const int64_t tn = std::min<int64_t>({{ tile }}, inner - n0);
    const int64_t base = o * mid * inner + n0;
{% for j in stored %}
    float rv{{ j }}[{{ tile }}];
{% endfor %}
{% for p in passes %}
    // pass {{ loop.index0 }}: {{ p.comment }}
{% for line in p.init %}
    {{ line }}
{% endfor %}
    for (int64_t q = 0; q < mid; ++q) {
      const int64_t m = {{ p.m }};
      const int64_t row = base + m * inner;
      #pragma omp simd simdlen({{ simdlen }})
      for (int64_t t = 0; t < tn; ++t) {
        const int64_t i = row + t;
        (void)i;
{% for line in p.body %}
        {{ line }}
{% endfor %}
      }
    }
{% if p.after %}
    for (int64_t t = 0; t < tn; ++t) {
{% for line in p.after %}
      {{ line }}
{% endfor %}
    }
{% endif %}
{% endfor %}
  }""" + CPP_FORWARD_CLOSE

CUDA_AXIS = r"""
// A thread per output position walks mid with stride inner (consecutive threads: consecutive
// positions, so each step's loads coalesce); SPLIT threads share a position when positions are
// few, each walking every SPLIT-th element of mid, their partial results combined in order
// through shared memory by every one of them.
constexpr int SPLIT = {{ split }};
constexpr int LANES = {{ block }} / SPLIT;

__global__ void __launch_bounds__({{ block }}) assay_axis({{ kparams }}) {
  __shared__ double assay_part[SPLIT > 1 ? {{ block }} : 1];
  __shared__ int64_t assay_pidx[SPLIT > 1 ? {{ block }} : 1];
  (void)assay_part; (void)assay_pidx;
  const int lane = threadIdx.x % LANES;
  const int slice = threadIdx.x / LANES;
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t positions = outer * inner;
  // Every thread of a block runs the same iterations (the combine's barriers).
  for (int64_t p0 = (int64_t)blockIdx.x * LANES; p0 < positions; p0 += (int64_t)gridDim.x * LANES) {
    const int64_t pos = p0 + lane;
    const bool active = pos < positions;
    const int64_t o = active ? pos / inner : 0;
    const int64_t base = o * mid * inner + (active ? pos - o * inner : 0);
{% for p in passes %}
    // pass {{ loop.index0 }}: {{ p.comment }}
{% for line in p.init %}
    {{ line }}
{% endfor %}
    if (active) {
      #pragma unroll {{ unroll }}
      for (int64_t m = slice; m < mid; m += SPLIT) {
        const int64_t i = base + m * inner;
        (void)i;
{% for line in p.body %}
        {{ line }}
{% endfor %}
      }
    }
{% if p.combine %}
    if constexpr (SPLIT > 1) {
{% for line in p.combine %}
      {{ line }}
{% endfor %}
    }
{% endif %}
{% for line in p.after %}
    {{ line }}
{% endfor %}
{% endfor %}
  }
}

extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (outer * inner <= 0 || mid <= 0) return 0;
  int64_t blocks = (outer * inner + LANES - 1) / LANES;
  // The position loop is grid-strided: a capped grid still covers every position.
  const int64_t cap = (int64_t)assay_sm_count() * {{ [2048 // block, 1]|max * 4 }};
  if (blocks > cap) blocks = cap;
  assay_axis<<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  return (int)cudaGetLastError();
}
"""

CUDA_SCAN = r"""
// Scans accumulate in double (a float running sum over a long line drifts from torch's).
// A thread per line: consecutive threads, consecutive lines (coalesced over inner).
__global__ void __launch_bounds__({{ block }}) assay_scan_lines({{ kparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t lines = outer * inner;
  for (int64_t line = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; line < lines;
       line += (int64_t)gridDim.x * {{ block }}) {
    const int64_t o = line / inner;
    const int64_t base = o * mid * inner + (line - o * inner);
    double acc = {{ ident }};
    for (int64_t q = 0; q < mid; ++q) {
      const int64_t m = {{ m }};
      const int64_t i = base + m * inner;
{% for line in pre %}
      {{ line }}
{% endfor %}
{% if exclusive %}
      const double run = acc;  // exclusive: what the elements before this one make
      acc = acc {{ op }} (double){{ arg }};
{% else %}
      acc = acc {{ op }} (double){{ arg }};
      const double run = acc;
{% endif %}
{% for line in post %}
      {{ line }}
{% endfor %}
    }
  }
}

// A block per line: chunks of {{ block }} * ITEMS elements, each thread scanning ITEMS
// consecutive ones in registers, then the threads' totals scanned with warp shuffles (within a
// warp, then over the warps' totals), plus the carry of the chunks before.
template <int ITEMS>
__global__ void __launch_bounds__({{ block }}) assay_scan_block({{ kparams }}) {
  __shared__ double assay_warp_total[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t lines = outer * inner;
  for (int64_t line = blockIdx.x; line < lines; line += gridDim.x) {
    const int64_t o = line / inner;
    const int64_t base = o * mid * inner + (line - o * inner);
    double carry = {{ ident }};
    for (int64_t q0 = 0; q0 < mid; q0 += (int64_t){{ block }} * ITEMS) {
      double runs[ITEMS];
      double total = {{ ident }};
      #pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t q = q0 + (int64_t)threadIdx.x * ITEMS + k;
{% if exclusive %}
        runs[k] = total;  // exclusive: the thread's items before this one
{% endif %}
        if (q < mid) {
          const int64_t m = {{ m }};
          const int64_t i = base + m * inner;
{% for line in pre %}
          {{ line }}
{% endfor %}
          total = total {{ op }} (double){{ arg }};
        }
{% if not exclusive %}
        runs[k] = total;
{% endif %}
      }
      double incl = total;
      #pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl = y {{ op }} incl;
      }
      if (lane == 31) assay_warp_total[warp] = incl;
      __syncthreads();
      if (warp == 0) {
        double w = lane < {{ block // 32 }} ? assay_warp_total[lane] : {{ ident }};
        #pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const double y = __shfl_up_sync(0xffffffffu, w, d);
          if (lane >= d) w = y {{ op }} w;
        }
        if (lane < {{ block // 32 }}) assay_warp_total[lane] = w;
      }
      __syncthreads();
      double excl = __shfl_up_sync(0xffffffffu, incl, 1);
      if (lane == 0) excl = {{ ident }};
      const double prefix = carry {{ op }} (warp > 0 ? assay_warp_total[warp - 1] : {{ ident }}) {{ op }} excl;
      #pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t q = q0 + (int64_t)threadIdx.x * ITEMS + k;
        if (q < mid) {
          const int64_t m = {{ m }};
          const int64_t i = base + m * inner;
          const double run = prefix {{ op }} runs[k];
{% for line in post_block %}
          {{ line }}
{% endfor %}
        }
      }
      carry = carry {{ op }} assay_warp_total[{{ block // 32 - 1 }}];
      __syncthreads();  // the warp totals are read before the next chunk writes them
    }
  }
}

extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t lines = outer * inner;
  if (lines <= 0 || mid <= 0) return 0;
  // Grids are capped; the line loops are grid-strided.
  const int64_t cap = (int64_t)assay_sm_count() * {{ [2048 // block, 1]|max * 4 }};
  if ({{ form }} == 1 || ({{ form }} == 0 && inner >= 32)) {
    int64_t blocks = (lines + {{ block - 1 }}) / {{ block }};
    if (blocks > cap) blocks = cap;
    assay_scan_lines<<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  } else {
    const int64_t blocks = lines < cap ? lines : cap;
    assay_scan_block<{{ items }}><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  }
  return (int)cudaGetLastError();
}
"""


# ----------------------------------------------------------------------------------------------
# The passes along mid


def _scan_node(plan: Plan) -> int:
    """The plan's scan node, or -1 (a reduction plan)."""
    return next((j for j, n in enumerate(plan.nodes) if n.op.startswith("scan_")), -1)


@dataclass
class _Pass:
    comment: str
    reds: list[int]  # the reductions of this pass
    elems: list[int]  # per-element values computed in its walk along mid
    after: list[int]  # per-position values that exist once it is done (its reductions first)
    writes: bool  # its walk writes the (per-element) output


def _passes(plan: Plan, sched: Schedule) -> list[_Pass]:
    """The walks along mid: one per level of reductions, then (an elementwise output) the one
    that writes the output."""
    out = plan.output
    passes = []
    for p in range(sched.passes + (0 if plan.out_is_row else 1)):
        reds = [j for j, n in enumerate(plan.nodes)
                if n.op.startswith("reduce_") and sched.reduce_pass(j) == p]
        writes = p == sched.passes
        targets = [plan.nodes[j].args[0] for j in reds] + ([out] if writes else [])
        after = [j for j in range(len(plan.nodes))
                 if sched.where(j) == "after" and sched.avail[j] == p + 1]
        comment = ", ".join(plan.nodes[j].op for j in reds) or "write the output"
        passes.append(_Pass(comment, reds, elem_closure(plan, sched, targets), after, writes))
    return passes


def _row_args(plan: Plan, sched: Schedule, nodes: list[int]) -> list[int]:
    """The per-position values that ``nodes`` read and do not define themselves."""
    return sorted({a for j in nodes for a in plan.nodes[j].args
                   if sched.where(a) == "after" and a not in nodes})


def _accumulators(plan: Plan, j: int) -> list[tuple[str, str, str]]:
    """(C type, name, initial value) of reduction ``j``'s accumulators."""
    kind = plan.nodes[j].op.removeprefix("reduce_")
    ctype, ident, _ = _ACC[kind]
    return [(ctype, f"acc{j}", ident)] + (
        [("int64_t", f"idx{j}", "0")] if kind.startswith("arg") else [])


def _update(plan: Plan, j: int, names: Names, at: str) -> str:
    """Reduction ``j``'s step at mid index ``m``; ``at`` indexes a tile's accumulator arrays
    ("" on CUDA: one position per thread)."""
    update = _ACC[plan.nodes[j].op.removeprefix("reduce_")][2]
    return update.format(acc=f"acc{j}{at}", idx=f"idx{j}{at}", x=names(plan.nodes[j].args[0]))


def _out_value(plan: Plan, names: Names, at: str) -> str:
    """The output's value at a position: an index for argmax/argmin."""
    n = plan.nodes[plan.output]
    return f"idx{plan.output}{at}" if n.op in ARG_REDUCTIONS else names(plan.output)


def _after_value(plan: Plan, j: int, names: Names, at: str) -> list[str]:
    """The definition of per-position value ``j`` once its pass is done."""
    n = plan.nodes[j]
    if n.op in ARG_REDUCTIONS:
        return []  # only the output, written from idx
    if n.op.startswith("reduce_"):
        return [f"const float v{j} = (float)acc{j}{at};"]
    return [names.define(j)]


def _scan_lines(plan: Plan, sched: Schedule, names: Names) -> tuple[list[int], list[int]]:
    """The per-element values before the scan (its argument's closure) and after it (the
    output's, reading the scan's running value ``run``)."""
    s = _scan_node(plan)
    pre = elem_closure(plan, sched, [plan.nodes[s].args[0]])
    post = elem_closure(plan, sched, [plan.output], frozenset({s}))
    return pre, post


def _m(plan: Plan) -> str:
    """The mid index of step ``q`` of a walk (a reversed scan walks from the end)."""
    s = _scan_node(plan)
    return "mid - 1 - q" if s >= 0 and plan.nodes[s].attr("reverse") else "q"


def _cpp_passes(plan: Plan, sched: Schedule, tile: int
                ) -> tuple[list[dict[str, Any]], list[int]]:
    """The C++ passes (init, m, body, after) and the per-position values kept in tile arrays
    (``rv``) for later passes."""
    names = Names(plan, sched)

    def arrays(accs: list[tuple[str, str, str]]) -> list[str]:
        return [line for ctype, name, ident in accs
                for line in (f"{ctype} {name}[{tile}];",
                             f"for (int64_t t = 0; t < {tile}; ++t) {name}[t] = {ident};")]

    s = _scan_node(plan)
    if s >= 0:
        ident, op = _SCAN[plan.nodes[s].op.removeprefix("scan_")]
        pre, post = _scan_lines(plan, sched, names)
        step = [f"acc[t] = acc[t] {op} (double){names(plan.nodes[s].args[0])};",
                f"const float v{s} = (float)acc[t];"]
        if plan.nodes[s].attr("exclusive"):  # each element's value: the ones before it
            step.reverse()
        body = ([names.define(j) for j in pre] + step
                + [names.define(j) for j in post if j != s and j not in pre]
                + [f"out[i] = {names(plan.output)};"])
        return [{"comment": plan.nodes[s].op, "m": _m(plan),
                 "init": arrays([("double", "acc", ident)]), "body": body, "after": []}], []
    passes = _passes(plan, sched)
    stored = sorted({a for p in passes
                     for a in _row_args(plan, sched, p.elems) + _row_args(plan, sched, p.after)})
    out = []
    for p in passes:
        init, body = [], []
        for j in p.reds:
            init += arrays(_accumulators(plan, j))
            body.append(_update(plan, j, names, "[t]"))
        loads = [f"const float v{a} = rv{a}[t];" for a in _row_args(plan, sched, p.elems)]
        body = loads + [names.define(j) for j in p.elems] + body
        if p.writes:
            body.append(f"out[i] = {names(plan.output)};")
        after = [f"const float v{a} = rv{a}[t];" for a in _row_args(plan, sched, p.after)]
        for j in p.after:
            after += _after_value(plan, j, names, "[t]")
            if j in stored:
                after.append(f"rv{j}[t] = v{j};")
        if plan.out_is_row and plan.output in p.after:
            after.append(f"out[o * inner + n0 + t] = {_out_value(plan, names, '[t]')};")
        out.append({"comment": p.comment, "m": "q", "init": init, "body": body,
                    "after": after})
    return out, stored


_COMBINE = {"sum": "acc{j} += {part};", "prod": "acc{j} *= {part};",
            "max": "acc{j} = assay_max2(acc{j}, (float){part});",
            "min": "acc{j} = assay_min2(acc{j}, (float){part});"}


def _combine(plan: Plan, j: int) -> list[str]:
    """CUDA: reduction ``j``'s partial results of the SPLIT threads of a position, combined in
    slice order by each of them."""
    kind = plan.nodes[j].op.removeprefix("reduce_")
    part = "assay_part[s * LANES + lane]"
    lines = [f"assay_part[threadIdx.x] = (double)acc{j};"]
    if kind.startswith("arg"):
        cmp = ">" if kind == "argmax" else "<"
        acc, idx = f"acc{j}", f"idx{j}"
        lines += [f"assay_pidx[threadIdx.x] = {idx};", "__syncthreads();",
                  "for (int s = 0; s < SPLIT; ++s) {",
                  f"  const float pv = (float){part};",
                  "  const int64_t pi = assay_pidx[s * LANES + lane];",
                  # the better value, or of equal ones (NaNs alike) the first index
                  f"  if (s == 0 || pv {cmp} {acc} || (pv != pv && {acc} == {acc}) ||"
                  f" ((pv == {acc} || (pv != pv && {acc} != {acc})) && pi < {idx})) "
                  f"{{ {acc} = pv; {idx} = pi; }}",
                  "}"]
    else:
        lines += ["__syncthreads();", f"acc{j} = {_ACC[kind][1]};",
                  "for (int s = 0; s < SPLIT; ++s) "
                  + _COMBINE[kind].replace("{j}", str(j)).replace("{part}", part)]
    lines.append("__syncthreads();  // read before the next reduction writes")
    return lines


def _cuda_passes(plan: Plan, sched: Schedule) -> list[dict[str, Any]]:
    names = Names(plan, sched)
    out = []
    for p in _passes(plan, sched):
        init, updates, combine = [], [], []
        for j in p.reds:
            init += [f"{ctype} {name} = {ident};" for ctype, name, ident in _accumulators(plan, j)]
            updates.append(_update(plan, j, names, ""))
            combine += _combine(plan, j)
        body = [names.define(j) for j in p.elems] + updates
        if p.writes:
            body.append(f"out[i] = {names(plan.output)};")
        after = [line for j in p.after for line in _after_value(plan, j, names, "")]
        if plan.out_is_row and plan.output in p.after:
            after.append(f"if (active && slice == 0) out[pos] = {_out_value(plan, names, '')};")
        out.append({"comment": p.comment, "init": init, "body": body, "combine": combine,
                    "after": after})
    return out


# ----------------------------------------------------------------------------------------------
# The family


def matches(plan: Plan) -> bool:
    return plan.kind == "axis" and plan.gemm is None and plan.pool is None


def template(plan: Plan, knobs: dict[str, Any] | None = None) -> str:
    return "scan" if _scan_node(plan) >= 0 else "axis"


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    return dict(KNOB_SPACES[(target, template(analysis.plan))])


def _sizes(analysis: Analysis) -> tuple[int, int, int]:
    """(outer, mid, inner) at the analysed size."""
    plan, shape = analysis.plan, analysis.shape
    outer = mid = inner = 1
    for d, size in enumerate(shape):
        if d < plan.axis:
            outer *= size
        elif d < plan.axis + plan.k:
            mid *= size
        else:
            inner *= size
    return outer, mid, inner


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    """Not yet measured on a GPU: a tile of 32 positions (8 float lanes, four steps) on the
    host; on CUDA a thread per position unless positions are too few to fill the device, a
    block per line for scans along the last dim."""
    if target == "cpu":
        return {"threads": 0, "tile": 32, "unroll": 2}
    outer, mid, inner = _sizes(analysis)
    if template(analysis.plan) == "scan":
        return {"block": 256, "items": 4, "form": 0}
    split = 1
    while split < 8 and outer * inner * split < _SMS * 1024 and mid >= 64 * split:
        split *= 2
    return {"block": 256, "split": split, "unroll": 4}


def safe(target: str, plan: Plan | None = None, knobs: Any = None) -> dict[str, int]:
    """Serial on the host, one position a step; on CUDA a thread per position (per line where
    inner is wide) without unrolling."""
    if target == "cpu":
        return {"threads": 1, "tile": 1, "unroll": 1}
    if plan is not None and template(plan) == "scan":
        return {"block": 256, "items": 1, "form": 0}
    return {"block": 256, "split": 1, "unroll": 1}


def strategy(plan: Plan, knobs: dict[str, Any]) -> str:
    return "scan" if template(plan) == "scan" else "axisreduce"


def source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    values, sched = fused_kernel(plan, target, knobs, summary, template(plan))
    # mean's divisor (the "cols" node) is the reduced length
    values["prologue"] = ["const int64_t cols = mid;", "(void)cols;"] + values["prologue"]
    if target == "cpu":
        tile = int(knobs["tile"])
        passes, stored = _cpp_passes(plan, sched, tile)
        return render(CPP_AXIS, **values, passes=passes, stored=stored, tile=tile)
    head = render(CUDA_COMMON, **values)
    s = _scan_node(plan)
    if s < 0:
        return head + render(CUDA_AXIS, **values, passes=_cuda_passes(plan, sched),
                             split=int(knobs["split"]), unroll=int(knobs["unroll"]))
    names = Names(plan, sched)
    ident, op = _SCAN[plan.nodes[s].op.removeprefix("scan_")]
    pre, post = _scan_lines(plan, sched, names)
    # After the scan: the output's values, from the running value ``run`` (a block's write
    # loop defines again what it shares with the values before the scan).
    post_lines = ([f"const float v{s} = (float)run;"]
                  + [names.define(j) for j in post if j != s and j not in pre]
                  + [f"out[i] = {names(plan.output)};"])
    again = [names.define(j) for j in pre if j in post]
    return head + render(CUDA_SCAN, **values, ident=ident, op=op, m=_m(plan),
                         pre=[names.define(j) for j in pre], arg=names(plan.nodes[s].args[0]),
                         post=post_lines, post_block=again + post_lines,
                         items=int(knobs["items"]), form=int(knobs["form"]),
                         exclusive=bool(plan.nodes[s].attr("exclusive")))


FAMILY = Family(name="axis", matches=matches, knob_spaces=KNOB_SPACES, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=source, calls=fused_calls)
