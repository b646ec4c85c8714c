"""The row family: reductions over the trailing dims of a contiguous tensor, after an optional
elementwise chain (sum, mean, max, min, norms, logsumexp, softmax, log_softmax, layer_norm,
RMSNorm, F.normalize, GroupNorm's rows of channel groups, matrix-vector products): one or more
passes over each row, the reductions of each level, then the output. C++: OpenMP threads over
rows, `omp simd` reductions; CUDA: a warp, a block or a thread-block cluster per row."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from assay.propose.offline.families import triton_form as tri
from assay.propose.offline.families.family import Family, Space
from assay.propose.offline.families.shared import (CPP_FORWARD_CLOSE, CPP_FORWARD_OPEN, CUDA_COMMON,
                                                   CUDA_REDUCE_OPS, Names, Schedule, after_pass,
                                                   elem_closure, fused_calls,
                                                   fused_kernel, knob_line, leaf_kind, leaves_of,
                                                   render, vector_conditions, vector_flags,
                                                   vector_index)
from assay.propose.offline.ir import PREFIX, Analysis, Plan

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads, unroll: as for the elementwise family; chunk: rows per OpenMP task (0 = an even
    # static split).
    ("cpu", "row"): {"threads": (0, 1, 2, 4, 8), "chunk": (0, 1, 4, 16),
                     "unroll": (1, 2, 4, 8)},
    # warp_per_row: 1 = a warp per row (short rows), 0 = a block per row; cache_row: 1 = keep
    # the values that several passes use (x, or x + bias) in shared memory (when the row
    # fits); split: blocks per row (a cluster, sm_90+; with a block per row), each with its
    # slice of the columns; regs: when a thread's share of the slice is at most this many
    # vectors, each pass is an unrolled loop (its loads all in flight) and those values stay
    # in registers (0 = a strided loop over the row).
    ("cuda", "row"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                      "warp_per_row": (0, 1), "cache_row": (0, 1), "split": (1, 2, 4, 8),
                      "regs": (0, 4, 8, 16)},
    # block: columns per loop iteration (Triton's BLOCK); num_warps: warps per program (one
    # program per row); num_stages: software-pipelining depth of the column loops.
    ("triton", "row"): {"block": (128, 256, 512, 1024, 2048, 4096),
                        "num_warps": (1, 2, 4, 8, 16), "num_stages": (1, 2, 3)},
}

# SMs of the product's device (H100 SXM / H200), for defaults that depend on filling it.
_SMS = 132
# The shared memory one block may take on those (227 KB opt-in) less room for the reductions.
_ONE_BLOCK_SMEM = 200 * 1024

CPP_ROW = CPP_FORWARD_OPEN + r"""
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
  }""" + CPP_FORWARD_CLOSE

CUDA_ROW = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

""" + CUDA_REDUCE_OPS + r"""{% if warp_per_row %}
// One warp per row: for short rows a whole block would idle; the warp reduces with shuffles
// only, no shared memory and no __syncthreads.
template <class Op, int SPLIT>
__device__ __forceinline__ typename Op::T assay_row_reduce(typename Op::T v, double* /*smem*/) {
  return assay_warp_reduce<Op>(v);
}
{% else %}
// One block per row (SPLIT == 1) or a cluster of SPLIT blocks per row, each with its slice of
// the columns: warp shuffles, then one value per warp through shared memory, then (SPLIT > 1)
// one value per block through distributed shared memory, combined in rank order by every
// block, so that all threads of the cluster hold the same row result.
template <class Op, int SPLIT>
__device__ __forceinline__ typename Op::T assay_row_reduce(typename Op::T v, double* smem) {
  using T = typename Op::T;
  v = assay_warp_reduce<Op>(v);
  __syncthreads();  // the previous reduction's readers are done with smem
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = static_cast<double>(v);
  __syncthreads();
  v = (threadIdx.x & 31) < {{ block // 32 }} ? static_cast<T>(smem[threadIdx.x & 31]) : Op::id();
  v = assay_warp_reduce<Op>(v);
  if constexpr (SPLIT > 1) {
#if __CUDA_ARCH__ >= 900
    __shared__ double part, total;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) part = static_cast<double>(v);
    cluster.sync();  // every block's part is written
    if (threadIdx.x == 0) {
      T t = Op::id();
      for (int b = 0; b < SPLIT; ++b) t = Op::op(t, static_cast<T>(*cluster.map_shared_rank(&part, b)));
      total = static_cast<double>(t);
    }
    cluster.sync();  // the parts are read (the next reduction may overwrite them), total is set
    v = static_cast<T>(total);
#else
    __trap();  // the host launches SPLIT > 1 only on devices with clusters (sm_90+)
#endif
  }
  return v;
}
{% endif %}

// CACHE: per-element values that several passes use (the row's input, or what depends on it
// alone: {{ cached|length }} here) are kept in dynamic shared memory by the first pass, so later
// passes neither re-read global memory nor recompute them. REGS > 0: every thread's share of
// the row slice is at most REGS vectors, so each pass is an unrolled loop of REGS guarded steps
// (all of a pass's loads in flight at once) and those values stay in registers instead.
// SPLIT: blocks per row (a thread block cluster), each with only its slice, so that a few long
// rows (GroupNorm's) spread over every SM.
// Clusters: at least 1024 resident threads per SM (64 registers), as ptxas left to itself
// spilled those variants at 40 registers, or 512 with the row in registers (64 spilled them);
// 0 = no minimum (an explicit 1 let ptxas take 80 registers for the block-per-row LayerNorm,
// against 50 without).
{% macro vector_step(p) %}
{% for line in p.vec_loads %}
{{ line }}
{% endfor %}
{% for line in p.vec_init %}
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
{% for line in p.vec_after %}
{{ line }}
{% endfor %}
{% if p.stores %}
assay_store_out<VEC>(out, base + c0, o);
{% endif %}
{% endmacro %}
template <int VEC, bool CACHE, int SPLIT, int REGS>
__global__ void __launch_bounds__({{ block }}, SPLIT > 1 ? REGS > 0 ? {{ [1, 512 // block]|max }} : {{ [1, 1024 // block]|max }} : 0)
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
  const int64_t c_lo = 0, c_hi = cols;
{% else %}
  const int lane = threadIdx.x;
  const int rank = SPLIT > 1 ? (int)(blockIdx.x % SPLIT) : 0;  // 1-D clusters: rank in order
  const int64_t first = blockIdx.x / SPLIT;
  const int64_t step = gridDim.x / SPLIT;
  const int group = {{ block }};
  const bool leader = threadIdx.x == 0 && rank == 0;
  (void)leader;
  const int64_t slot = 0;
  // This block's columns [c_lo, c_hi): whole vectors, the last slice possibly shorter.
  const int64_t span = SPLIT > 1 ? (cols + SPLIT * VEC - 1) / (SPLIT * VEC) * VEC : cols;
  const int64_t c_lo = SPLIT > 1 ? (rank * span < cols ? rank * span : cols) : 0;
  const int64_t c_hi = SPLIT > 1 ? (c_lo + span < cols ? c_lo + span : cols) : cols;
{% endif %}
{% for k in cached %}
  float* cache{{ k }} = reinterpret_cast<float*>(assay_dyn_smem) + (slot * {{ cached|length }} + {{ loop.index0 }}) * (c_hi - c_lo);
  float r{{ k }}[REGS > 0 ? REGS : 1][VEC];  // REGS > 0: this thread's vectors of the row
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
    if constexpr (REGS > 0) {
      #pragma unroll
      for (int k = 0; k < (REGS > 0 ? REGS : 1); ++k) {
        const int64_t c0 = c_lo + ((int64_t)lane + (int64_t)k * group) * VEC;
        if (c0 < c_hi) {
          {{ vector_step(p.cached)|indent(10) }}
        }
      }
    } else {
      for (int64_t c0 = c_lo + (int64_t)lane * VEC; c0 < c_hi; c0 += (int64_t)group * VEC) {
        if constexpr (CACHE) {
          constexpr int k = 0;
          (void)k;
          {{ vector_step(p.cached)|indent(10) }}
        } else {
          {{ vector_step(p)|indent(10) }}
        }
      }
    }
{% for line in p.after %}
    {{ line }}
{% endfor %}
{% endfor %}
  }
}

template <int VEC, bool CACHE, int SPLIT, int REGS>
static int assay_launch(int64_t blocks, size_t smem, cudaStream_t stream, {{ kparams }}) {
  if (CACHE && smem > 48 * 1024) {  // above the default limit: opt in
    const cudaError_t e = cudaFuncSetAttribute(assay_rows<VEC, CACHE, SPLIT, REGS>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((unsigned)blocks);
  config.blockDim = dim3({{ block }});
  config.dynamicSmemBytes = CACHE ? smem : 0;
  config.stream = stream;
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = SPLIT;
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  config.attrs = cluster;
  config.numAttrs = SPLIT > 1 ? 1 : 0;
  return (int)cudaLaunchKernelEx(&config, assay_rows<VEC, CACHE, SPLIT, REGS>, {{ kargs }});
}

template <int VEC, int SPLIT>
static int assay_launch_split(bool cache_row, cudaStream_t stream, {{ kparams }}) {
  // The row cache needs {{ cached|length }} slice(s) per row in flight; slices too long for
  // shared memory run uncached.
  const int64_t span = (cols + SPLIT * VEC - 1) / (SPLIT * VEC) * VEC;
  const size_t cache_bytes = (size_t){{ cached|length * rows_per_block }} * (size_t)span * sizeof(float);
  const bool cache = cache_row && cache_bytes <= (size_t)assay_smem_optin();
{% if warp_per_row %}
  int64_t blocks = (rows + {{ block // 32 - 1 }}) / {{ block // 32 }};
{% else %}
  int64_t blocks = rows * SPLIT;
{% endif %}
  // The row loop is grid-strided, so a capped grid (whole clusters) still covers every row.
  const int64_t cap = (int64_t)assay_sm_count() * {{ 2048 // block * 8 }} / SPLIT * SPLIT;
  if (blocks > cap) blocks = cap;
{% if regs %}
  // A thread's share of the slice in at most {{ regs }} vectors: registers, no shared memory.
  // Only where every broadcast operand is constant over a vector (or steps by one): the
  // unrolled kernel has no per-element index paths (their code, {{ regs }} times over, made it
  // several times larger).
  if ((span + {{ group }} * VEC - 1) / ({{ group }} * VEC) <= {{ regs }} && ({{ vectors_whole }})) {
    return assay_launch<VEC, false, SPLIT, {{ regs }}>(blocks, 0, stream, {{ kargs }});
  }
{% endif %}
  return cache ? assay_launch<VEC, true, SPLIT, 0>(blocks, cache_bytes, stream, {{ kargs }})
               : assay_launch<VEC, false, SPLIT, 0>(blocks, cache_bytes, stream, {{ kargs }});
}


extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (rows <= 0 || cols <= 0) return 0;
  const bool vec = {{ vec }} > 1 && cols % {{ vec }} == 0{% for p in vec_ptrs %} && assay_aligned({{ p }}, {{ 4 * vec }}){% endfor %};
  const bool cache_row = {{ "true" if cache_row and cached else "false" }};
{% if split > 1 %}
  if (assay_has_clusters()) {  // clusters of blocks: sm_90 and later
    return vec ? assay_launch_split<{{ vec }}, {{ split }}>(cache_row, stream, {{ kargs }})
               : assay_launch_split<1, {{ split }}>(cache_row, stream, {{ kargs }});
  }
{% endif %}
  return vec ? assay_launch_split<{{ vec }}, 1>(cache_row, stream, {{ kargs }})
             : assay_launch_split<1, 1>(cache_row, stream, {{ kargs }});
}
"""


# ----------------------------------------------------------------------------------------------
# The passes over each row


TRITON_ROW = r"""
# Assay offline synthesizer v1: {{ template }} kernel (triton)
# computes: {{ summary }}
# knobs: {{ knob_line }}
@triton.jit
def assay_row({{ params }}, BLOCK: tl.constexpr):
    # One program per row, each pass a loop over the row's columns BLOCK at a time (values a
    # later pass needs are computed again from memory: a row of a few thousand floats stays in
    # L2); sums accumulate in float64 lanes, then one tree reduction per row.
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    fcols = cols * 1.0
{% for line in prologue %}
    {{ line }}
{% endfor %}
{% for p in passes %}
    # pass {{ loop.index0 }}: {{ p.comment }}
{% for line in p.init %}
    {{ line }}
{% endfor %}
    for c0 in range(0, cols, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        mask = c < cols
        offs = base + c
{% for line in p.body %}
        {{ line }}
{% endfor %}
{% for line in p.after %}
    {{ line }}
{% endfor %}
{% endfor %}
"""

_TRITON_IDENT = {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}


def _triton_passes(plan: Plan, sched: Schedule) -> list[dict[str, Any]]:
    """The passes of the Triton row kernel: per pass its accumulators, loop body (the values
    its reductions need, recomputed; the output's store in the output pass) and what follows
    (the row values it makes, the row output's store)."""
    kinds = sched.kinds
    out = plan.output
    npasses = sched.passes + (0 if plan.out_is_row else 1)
    passes = []
    for p in range(npasses):
        reds = [j for j, n in enumerate(plan.nodes)
                if n.op.startswith("reduce_") and sched.reduce_pass(j) == p]
        targets = [plan.nodes[j].args[0] for j in reds] + ([out] if p == sched.passes else [])
        body = [tri.define(plan, j, kinds) for j in elem_closure(plan, sched, targets)]
        init, after = [], []
        for j in reds:
            kind = plan.nodes[j].op.removeprefix("reduce_")
            arg = tri.node_name(plan, plan.nodes[j].args[0])
            lanes = f"tl.where(mask, {arg}, {_TRITON_IDENT[kind]})"
            if kind == "sum":
                # float64 lanes: torch sums pairwise, a float32 running sum over a long row
                # drifts past the verifier's tolerance (the C++ and CUDA rows use double too)
                init.append(f"acc{j} = tl.zeros([BLOCK], dtype=tl.float64)")
                body.append(f"acc{j} += {lanes}.to(tl.float64)")
                after.append(f"v{j} = tl.sum(acc{j}, axis=0).to(tl.float32)")
            else:
                # NaN propagates as in torch.max/min: kept in a flag, as the C++ row does
                init.append(f"acc{j} = tl.full([BLOCK], {_TRITON_IDENT[kind]}, tl.float32)")
                init.append(f"nan{j} = tl.zeros([BLOCK], dtype=tl.int32)")
                body.append(f"acc{j} = tl.{'maximum' if kind == 'max' else 'minimum'}"
                            f"(acc{j}, {lanes})")
                body.append(f"nan{j} = nan{j} | tl.where(mask & ({arg} != {arg}), 1, 0)")
                after.append(f"v{j} = tl.where(tl.max(nan{j}, axis=0) > 0, float(\"nan\"), "
                             f"tl.{kind}(acc{j}, axis=0))")
        if p == sched.passes:  # the output pass of an elementwise-output row plan
            body.append(f"tl.store(out + offs, {tri.node_name(plan, out)}, mask=mask)")
        after += [tri.define(plan, j, kinds) for j, n in enumerate(plan.nodes)
                  if sched.where(j) == "after" and not n.op.startswith("reduce_")
                  and sched.avail[j] == p + 1]
        if plan.out_is_row and p == sched.passes - 1:
            after.append(f"tl.store(out + row, {tri.node_name(plan, out)})")
        passes.append({"comment": ", ".join(plan.nodes[j].op for j in reds) or
                       "write the output", "init": init, "body": body, "after": after})
    return passes


def triton_source(plan: Plan, knobs: dict[str, Any], summary: str, label: str = "row") -> str:
    """The @triton.jit row kernel of ``plan``."""
    kinds = [leaf_kind(plan, k) for k in range(len(plan.leaves))]
    sched = Schedule(plan, kinds)
    ptrs, geometry = tri.leaf_args(plan)
    prologue = [tri.define(plan, j, kinds) for j, n in enumerate(plan.nodes)
                if sched.where(j) in ("prologue", "row") and n.op != "cols"]
    return render(TRITON_ROW, template=label, summary=summary.replace("\n", " "),
                  knob_line=knob_line(knobs),
                  params=", ".join(ptrs + ["out", "rows", "cols"] + geometry),
                  prologue=prologue, passes=_triton_passes(plan, sched))


def _row_prologue(plan: Plan, sched: Schedule) -> list[str]:
    names = Names(plan, sched)
    return [names.define(j) for j in range(len(plan.nodes)) if sched.where(j) == "row"]


_IDENT_CPP = {"sum": "0.0", "max": "-INFINITY", "min": "INFINITY"}
_OP_CUDA = {"sum": "AssaySum", "max": "AssayMax", "min": "AssayMin"}


@dataclass
class _RowPasses:
    passes: list[dict[str, Any]]  # per pass: init, loads, body, after, ... (see the templates)
    vec_ptrs: list[str]  # pointers that a vectorized kernel accesses by vector
    cached: list[int]  # CUDA: per-element values that several passes use, kept for later passes


def _kept_values(plan: Plan, sched: Schedule, elems_of: list[list[int]],
                 targets_of: list[list[int]]) -> dict[int, int]:
    """Per-element values that a later pass needs again, and the pass that first computes
    them: those that depend on no reduction and on the row's own data (a full leaf), at the
    edge of what a later pass needs from before its reductions. LayerNorm keeps x itself;
    GroupNorm after a convolution keeps x + bias, so later passes skip the bias's index and
    load."""
    early = {j for j in range(len(plan.nodes))
             if sched.where(j) == "elem" and sched.avail[j] == 0}
    row_data: set[int] = set()
    for j, n in enumerate(plan.nodes):  # topological order
        if j in early and ((n.op == "load" and leaf_kind(plan, n.attr("leaf")) == "full")
                           or any(a in row_data for a in n.args)):
            row_data.add(j)
    first: dict[int, int] = {}
    for p, elems in enumerate(elems_of):
        for j in elems:
            first.setdefault(j, p)
    kept: dict[int, int] = {}
    for p in range(1, len(elems_of)):
        late = [j for j in elems_of[p] if j not in early]
        edge = {a for j in late for a in plan.nodes[j].args} | set(targets_of[p])
        for j in edge & row_data:
            if first[j] < p:
                kept[j] = first[j]
    return kept


def _row_passes(plan: Plan, sched: Schedule, target: str, vec_ok: Callable[[int], bool]
                ) -> _RowPasses:
    """The passes over each row: the reductions of each level, then the output. On cuda each
    pass comes in two forms: ``plain`` (every value from global memory) and ``cached`` (values
    that several passes use kept by the first, in shared memory or registers, see the row
    template's CACHE and REGS)."""
    passes = []
    vec_ptrs: list[str] = []
    out = plan.output
    npasses = sched.passes + (0 if plan.out_is_row else 1)
    reds_of = [[j for j, n in enumerate(plan.nodes)
                if n.op.startswith("reduce_") and sched.reduce_pass(j) == p]
               for p in range(npasses)]
    targets_of = [[plan.nodes[j].args[0] for j in reds_of[p]] + ([out] if p == sched.passes
                                                                  else [])
                  for p in range(npasses)]
    elems_of = [elem_closure(plan, sched, targets_of[p]) for p in range(npasses)]
    # Each thread reads back only the values it kept itself (the same lane -> column mapping in
    # every pass), so no barrier.
    kept = _kept_values(plan, sched, elems_of, targets_of) if target == "cuda" else {}

    def vector_step(elems: list[int], from_cache: set[int], keep: list[int]
                    ) -> dict[str, list[str]]:
        """One vector's loads and per-element lines of a pass, its reductions left out:
        ``elems`` computed or (``from_cache``) read back, ``keep`` stored for later passes."""
        computed = [j for j in elems if j not in from_cache]
        vector = {k for k in leaves_of(plan, computed) if vec_ok(k)} if target == "cuda" \
            else set()
        names = Names(plan, sched, vector, hoisted=target == "cuda")
        loads = (vector_index(sched.kinds, leaves_of(plan, computed), "base + c0")
                 if target == "cuda" else [])
        for k in sorted(vector):
            at = "c0" if leaf_kind(plan, k) == "col" else "base + c0"
            loads.append(f"float a{k}[VEC]; assay_load<VEC>(t{k}, {at}, a{k});")
            vec_ptrs.append(f"t{k}")
        for j in sorted(from_cache):
            loads.append(f"float kv{j}[VEC]; if constexpr (REGS > 0) "
                         f"assay_copy<VEC>(kv{j}, r{j}[k]); "
                         f"else assay_load<VEC>(cache{j}, c0 - c_lo, kv{j});")
        body = [f"const float v{j} = kv{j}[u];" if j in from_cache else names.define(j)
                for j in elems] + [f"w{j}[u] = v{j};" for j in keep]
        return {"vec_loads": loads, "vec_init": [f"float w{j}[VEC];" for j in keep],
                "body": body,
                "vec_after": [f"if constexpr (REGS > 0) assay_copy<VEC>(r{j}[k], w{j});"
                              f" else assay_store<VEC>(cache{j}, c0 - c_lo, w{j});"
                              for j in keep]}

    for p in range(npasses):
        reds = reds_of[p]
        writes = p == sched.passes  # the output pass of an elementwise-output row plan
        names = Names(plan, sched)
        init, after, clauses, red_init, red_body, red_after = [], [], [], [], [], []
        for j in reds:
            kind = plan.nodes[j].op.removeprefix("reduce_")
            arg = names(plan.nodes[j].args[0])
            if target == "cpu":
                if kind == "sum":
                    # double accumulators: torch sums pairwise; a float running sum over a long
                    # row would drift past 1e-5.
                    init.append(f"double acc{j} = 0.0;")
                    red_body.append(f"acc{j} += (double){arg};")
                    clauses.append(f"reduction(+:acc{j})")
                    after.append(f"const float v{j} = (float)acc{j};")
                else:
                    cmp = ">" if kind == "max" else "<"
                    init.append(f"float acc{j} = {_IDENT_CPP[kind]}; int nan{j} = 0;")
                    red_body.append(f"acc{j} = {arg} {cmp} acc{j} ? {arg} : acc{j}; "
                                    f"nan{j} |= ({arg} != {arg});")
                    clauses.append(f"reduction({kind}:acc{j}) reduction(|:nan{j})")
                    after.append(f"const float v{j} = nan{j} ? NAN : acc{j};")
            else:
                op = _OP_CUDA[kind]
                init.append(f"{op}::T acc{j} = {op}::id();")
                if kind == "sum":  # a vector's terms in float, then one double addition
                    red_init.append(f"float part{j} = 0.0f;")
                    red_body.append(f"part{j} += {arg};")
                    red_after.append(f"acc{j} += static_cast<AssaySum::T>(part{j});")
                else:
                    red_body.append(f"acc{j} = {op}::op(acc{j}, static_cast<{op}::T>({arg}));")
                after.append(f"const float v{j} = static_cast<float>("
                             f"assay_row_reduce<{op}, SPLIT>(acc{j}, smem));")
        if writes:
            red_body.append(f"o[u] = {names(out)};" if target == "cuda"
                            else f"out[i] = {names(out)};")
            if target == "cuda":
                vec_ptrs.append("out")
        after += after_pass(plan, sched, p)
        if plan.out_is_row and p == sched.passes - 1:
            after.append(f"if (leader) out[r] = {names(out)};" if target == "cuda"
                         else f"out[r] = {names(out)};")
        keep = sorted(j for j, q in kept.items() if q == p)
        stops = frozenset(j for j, q in kept.items() if q < p)
        cached_elems = elem_closure(plan, sched, targets_of[p] + keep, stops)
        forms = {"plain": vector_step(elems_of[p], set(), []),
                 "cached": vector_step(cached_elems, set(cached_elems) & stops, keep)}
        for form in forms.values():
            form.update(vec_init=form["vec_init"] + red_init, body=form["body"] + red_body,
                        vec_after=red_after + form["vec_after"], stores=writes)
        comment = ", ".join(plan.nodes[j].op for j in reds) or "write the output"
        passes.append({"comment": comment, "init": init, "after": after,
                       "clause": "".join(f" {c}" for c in clauses), "stores": writes,
                       **forms["plain"], "cached": forms["cached"]})
    return _RowPasses(passes, list(dict.fromkeys(vec_ptrs)), sorted(kept))


# ----------------------------------------------------------------------------------------------
# The family


def matches(plan: Plan) -> bool:
    """Row plans of several rows (one row, a full reduction, is the total family's)."""
    return (plan.kind == "row" and plan.gemm is None and plan.pool is None
            and (plan.k < plan.ndim or bool(plan.groups)))


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    return dict(KNOB_SPACES[(target, "row")])


def declines(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    if target != "triton":
        return None
    if analysis.plan.groups:
        return f"{PREFIX} rows of channel groups (GroupNorm) in Triton yet"
    return tri.why_not(analysis.plan)


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    plan = analysis.plan
    if target == "triton":
        # A block that holds the analysed row (each pass one iteration), 128 to 4096 columns,
        # with warps in proportion; not yet measured on a GPU.
        cols = 1
        for d in analysis.shape[len(analysis.shape) - plan.k:]:
            cols *= d
        block = min(4096, max(128, 1 << max(0, (cols - 1).bit_length())))
        return {"block": block, "num_warps": 4 if block <= 1024 else 8, "num_stages": 2}
    if target == "cpu":
        # unroll 4: see the elementwise family's defaults.
        return {"threads": 0, "chunk": 0, "unroll": 4}
    cols = rows = 1
    for d in analysis.shape[len(analysis.shape) - plan.k:]:
        cols *= d
    for d in analysis.shape[:len(analysis.shape) - plan.k]:
        rows *= d
    rows, cols = rows * analysis.row_groups, cols // analysis.row_groups
    if cols <= 1024:  # a block per row would leave most of its threads without work
        return {"block": 256, "vec": 4, "warp_per_row": 1, "cache_row": 1, "split": 1, "regs": 0}
    # Few long rows (GroupNorm's 256 rows of 65536): a cluster of blocks per row, so that
    # every SM has work and each block's slice fits in shared memory (64 KB: three blocks of
    # the slice per SM), as long as a slice still gives every thread a vector; enough rows keep
    # a block per row. H200, L2_5 (its row kernel keeping x + bias): 4 blocks of 256 a row
    # 0.084 ms, 8 blocks 0.091, 8 of 512 threads 0.121.
    block = 256 if cols < 8192 else 512
    split = 1
    if rows < 2 * _SMS:
        while (split < 8 and cols // (2 * split) >= block * 4
               and (rows * split < 2 * _SMS or cols * 4 // split > 64 * 1024)):
            split *= 2
    elif not plan.out_is_row and cols * 4 > _ONE_BLOCK_SMEM and cols * 4 <= 8 * _ONE_BLOCK_SMEM:
        # Rows too long for one block's shared memory, whose later passes read them again
        # (KernelBench's softmax and log-softmax: 4096 rows of 393216, 1.5 MB): a cluster of
        # at most 8 blocks keeps the row in their shared memory, so that x is read once, not
        # once per pass (uncached: two or three reads of 6 GiB plus the write; 53% of the copy
        # bandwidth on an H200 for log-softmax, 2026-11-28).
        while split < 8 and cols * 4 // split > _ONE_BLOCK_SMEM:
            split *= 2
    if split > 1:
        block = 256 if rows < 2 * _SMS else 512
    # Rows in registers where every reduction is a sum and the row fills 5 to 8 vectors a
    # thread: each pass an unrolled loop with all its loads in flight. H200, 4096 x 16384
    # (probe_gpu.py --only sweep, 2026-11-24), ms: LayerNorm 0.147 -> 0.134, RMSNorm 0.133 ->
    # 0.130, matrix-vector 0.136 -> 0.123, mean 0.069 -> 0.062 (ptxas scheduled its strided
    # loop with fewer loads ahead than the sum's), sum 0.0627 -> 0.0624. Not elsewhere: with a
    # max reduction softmax 0.137 -> 0.183 and max 0.063 -> 0.068; the GroupNorm clusters 0.107
    # -> 0.154 (98 registers); rows of 4 vectors a thread after a GEMM (L2_7's LayerNorm 0.054
    # -> 0.070 ms).
    sums_only = all(n.op == "reduce_sum" for n in plan.nodes if n.op.startswith("reduce_"))
    vectors = -(-cols // (block * 4))  # per thread
    regs = 8 if split == 1 and sums_only and 4 < vectors <= 8 else 0
    return {"block": block, "vec": 4, "warp_per_row": 0, "cache_row": 1, "split": split,
            "regs": regs}


def safe(target: str, plan: Plan | None = None, knobs: Any = None) -> dict[str, int]:
    """No vector accesses, no unrolling, no cached rows, serial on the host; small Triton
    blocks without pipelining."""
    if target == "triton":
        return {"block": 256, "num_warps": 4, "num_stages": 1}
    if target == "cpu":
        return {"threads": 1, "chunk": 0, "unroll": 1}
    return {"block": 256, "vec": 1, "warp_per_row": 0, "cache_row": 0, "split": 1, "regs": 0}


def template(plan: Plan, knobs: dict[str, Any]) -> str:
    return "row"


def strategy(plan: Plan, knobs: dict[str, Any]) -> str:
    return "rowreduce"


def source(plan: Plan, target: str, knobs: dict[str, Any], summary: str,
           label: str = "row") -> str:
    """The kernel file of ``plan`` (a product's result may be one of its leaves: ``label``
    names the product's template then)."""
    if target == "triton":
        return triton_source(plan, knobs, summary, label)
    values, sched = fused_kernel(plan, target, knobs, summary, label)
    if target == "cpu":
        passes = _row_passes(plan, sched, "cpu", lambda k: False).passes
        chunk = int(knobs["chunk"])
        return render(CPP_ROW, **values, passes=passes, row_prologue=_row_prologue(plan, sched),
                      schedule="static" if chunk == 0 else f"static, {chunk}")
    kinds = sched.kinds
    head = render(CUDA_COMMON, **values)
    rp = _row_passes(plan, sched, "cuda", lambda k: kinds[k] in ("full", "col"))
    block = values["block"]
    warp = bool(knobs["warp_per_row"])
    values.update(passes=rp.passes, row_prologue=_row_prologue(plan, sched),
                  prologue=values["prologue"] + vector_flags(plan, kinds, "REGS > 0"),
                  vectors_whole=" && ".join(vector_conditions(plan, kinds).values()) or "true",
                  vec_ptrs=rp.vec_ptrs, warp_per_row=warp, cached=rp.cached,
                  cache_row=bool(knobs["cache_row"]), rows_per_block=block // 32 if warp else 1,
                  split=1 if warp else int(knobs["split"]), regs=int(knobs["regs"]),
                  group=32 if warp else block)
    return head + render(CUDA_ROW, **values)


def calls(plan: Plan, target: str, knobs: dict[str, Any], stream: list[str]
          ) -> tuple[list[str], list[Any]]:
    """ModelNew.forward's launch of the row kernel (Triton: one program per row), or the
    C/CUDA entry point's call."""
    if target != "triton":
        return fused_calls(plan, target, knobs, stream)
    ptrs, geometry = tri.leaf_args(plan)
    args = [f"l{k}" for k in range(len(ptrs))] + ["out", "rows", "cols"] + geometry
    return ([f"assay_row[(rows,)]({', '.join(args)}, BLOCK={int(knobs['block'])}, "
             f"num_warps={int(knobs['num_warps'])}, num_stages={int(knobs['num_stages'])})"], [])


FAMILY = Family(name="row", matches=matches, knob_spaces=KNOB_SPACES, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=source, calls=calls, declines=declines)
