"""The total family: full reductions to one value (sum, mean, max, min, norms over every dim;
the losses MSE, L1, smooth L1/Huber, KL divergence) after an elementwise chain, and what
broadcasts such a value back over the tensor (x / norm(x)). Its plans are row plans with one
row (``k == ndim``), written grid-wide instead of a row per block or thread.

C++: blocks of ``chunk`` elements reduced in double by OpenMP threads, the blocks' partials
combined in order. CUDA: per pass, a grid of blocks writes one partial per block to a
workspace, then one block combines them in a fixed order (no float atomics: the same result
run to run) and computes what follows the reduction; an output over every element is a last
grid-stride pass that reads those values from the workspace.
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import Entry, Family, Space
from assay.propose.offline.families.shared import (CPP_FORWARD_CLOSE, CPP_FORWARD_OPEN, CUDA_COMMON,
                                                   CUDA_REDUCE_OPS, Names, Param, Schedule,
                                                   after_pass, elem_closure, forward_call,
                                                   fused_kernel, fused_params, leaf_kind,
                                                   leaves_of, pointer, render, vector_flags,
                                                   vector_index)
from assay.propose.offline.ir import PREFIX, Analysis, Plan

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP default, 1 = serial, k = at most k; chunk: elements per block of the
    # sum (one thread's share at a time); unroll: simd length in units of 4 lanes.
    ("cpu", "total"): {"threads": (0, 1, 2, 4, 8), "chunk": (4096, 16384, 65536),
                       "unroll": (1, 2, 4, 8)},
    # block: threads per block; vec: floats per load; blocks_per_sm: the reduction's grid, in
    # blocks per SM (each thread then strides over the tensor; more blocks, more partials).
    ("cuda", "total"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                        "blocks_per_sm": (1, 2, 4, 8)},
}

# Partials per reduction the workspace holds: the grid of a pass never exceeds it (8 blocks
# per SM on a device of up to 512 SMs).
_MAX_BLOCKS = 4096
# Threads of the block that combines the partials.
_FINISH_BLOCK = 256

_IDENT = {"sum": "0.0", "max": "-INFINITY", "min": "INFINITY"}
_OP_CUDA = {"sum": "AssaySum", "max": "AssayMax", "min": "AssayMin"}

CPP_TOTAL = CPP_FORWARD_OPEN + r"""
  // One row of every element: blocks of {{ chunk }} elements, each reduced by one thread (sums
  // in double), their partials then combined in block order, so the result is the same
  // whatever the threads, and within float rounding of torch's at any size.
  const int64_t n = cols;
  const int64_t chunk = {{ chunk }};
  const int64_t nchunks = (n + chunk - 1) / chunk;
  double* part = new double[(size_t)nchunks * {{ width }}];
{% for p in passes %}
  // pass {{ loop.index0 }}: {{ p.comment }}
{% if parallel %}
  #pragma omp parallel for schedule(static){{ omp_clause }} if(nchunks > 1)
{% endif %}
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t lo = ch * chunk;
    const int64_t hi = std::min(lo + chunk, n);
{% for line in p.init %}
    {{ line }}
{% endfor %}
    #pragma omp simd simdlen({{ simdlen }}){{ p.clause }}
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t c = i;  // the one row's column is the flat index
      (void)c;
{% for line in p.body %}
      {{ line }}
{% endfor %}
    }
{% for line in p.store %}
    {{ line }}
{% endfor %}
  }
{% for line in p.after %}
  {{ line }}
{% endfor %}
{% endfor %}
  delete[] part;""" + CPP_FORWARD_CLOSE

CUDA_TOTAL = CUDA_REDUCE_OPS + r"""
// A block's reduction: warp shuffles, then one value per warp through shared memory; every
// thread returns the block's result.
template <class Op>
__device__ __forceinline__ typename Op::T assay_block_reduce(typename Op::T v, double* smem) {
  using T = typename Op::T;
  v = assay_warp_reduce<Op>(v);
  __syncthreads();  // the previous reduction's readers are done with smem
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = static_cast<double>(v);
  __syncthreads();
  v = (threadIdx.x & 31) < (blockDim.x >> 5) ? static_cast<T>(smem[threadIdx.x & 31]) : Op::id();
  return assay_warp_reduce<Op>(v);
}

// rv[j]: the value of node j once the pass that makes it is done (its reductions combined).
// part[r * nblocks + b]: block b's partial of the pass's r-th reduction.
{% macro element_loop(p) %}
  const int64_t n = cols;
  const int64_t nv = n / VEC;
  const int64_t stride = (int64_t)gridDim.x * {{ block }};
  for (int64_t jv = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; jv < nv; jv += stride) {
    const int64_t i0 = jv * VEC, c0 = i0;
    (void)c0;
{% for line in p.vec_loads %}
    {{ line }}
{% endfor %}
{% for line in p.vec_init %}
    {{ line }}
{% endfor %}
    #pragma unroll
    for (int u = 0; u < VEC; ++u) {
      const int64_t i = i0 + u, c = i;
      (void)i; (void)c;
{% for line in p.vec_body %}
      {{ line }}
{% endfor %}
    }
{% for line in p.vec_after %}
    {{ line }}
{% endfor %}
  }
  // the n % VEC tail, element by element
  for (int64_t i = nv * VEC + (int64_t)blockIdx.x * {{ block }} + threadIdx.x; i < n; i += stride) {
    const int64_t c = i;
    (void)c;
{% for line in p.scalar_body %}
    {{ line }}
{% endfor %}
  }
{% endmacro %}
{% for p in passes %}
// pass {{ loop.index0 }}: {{ p.comment }}
template <int VEC>
__global__ void __launch_bounds__({{ block }})
assay_total_pass{{ loop.index0 }}({{ kparams }}, float* __restrict__ rv, double* __restrict__ part) {
{% for line in prologue + vflags %}
  {{ line }}
{% endfor %}
{% for line in p.known %}
  {{ line }}
{% endfor %}
{% for line in p.init %}
  {{ line }}
{% endfor %}
{{ element_loop(p) }}
{% if p.reduces %}
  __shared__ double smem[32];
{% for line in p.store %}
  {{ line }}
{% endfor %}
{% endif %}
}
{% if p.reduces %}

__global__ void __launch_bounds__({{ finish_block }})
assay_total_finish{{ loop.index0 }}({{ kparams }}, float* __restrict__ rv, const double* __restrict__ part, int nblocks) {
  __shared__ double smem[32];
{% for line in prologue %}
  {{ line }}
{% endfor %}
{% for line in p.known %}
  {{ line }}
{% endfor %}
{% for line in p.finish %}
  {{ line }}
{% endfor %}
}
{% endif %}

{% endfor %}
extern "C" int assay_forward({{ kparams }}, double* __restrict__ ws, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (cols <= 0) return 0;
  const bool vec = {{ vec }} > 1{% for p in vec_ptrs %} && assay_aligned({{ p }}, {{ 4 * vec }}){% endfor %};
  const int64_t work = vec ? cols / {{ vec }} : cols;
  // The reductions' grid: enough blocks to fill the device, each thread striding over the
  // tensor; the grid depends on the device and the size only, so the partials (and the
  // result) do too.
  int64_t cap = (int64_t)assay_sm_count() * {{ blocks_per_sm }};
  if (cap > {{ max_blocks }}) cap = {{ max_blocks }};
  int64_t blocks = (work + {{ block }} - 1) / {{ block }};
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  float* rv = reinterpret_cast<float*>(ws + {{ max_blocks * width }});
{% for p in passes %}
{% if p.reduces %}
  if (vec) {
    assay_total_pass{{ loop.index0 }}<{{ vec }}><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }}, rv, ws);
  } else {
    assay_total_pass{{ loop.index0 }}<1><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }}, rv, ws);
  }
  assay_total_finish{{ loop.index0 }}<<<1, {{ finish_block }}, 0, stream>>>({{ kargs }}, rv, ws, (int)blocks);
{% else %}
  {
    // the output over every element: one pass, each thread a vector (the grid-stride loop
    // only guards the grid's limit)
    int64_t out_blocks = (work + {{ block }} - 1) / {{ block }};
    if (out_blocks > 2147483647) out_blocks = 2147483647;
    if (vec) {
      assay_total_pass{{ loop.index0 }}<{{ vec }}><<<(unsigned)out_blocks, {{ block }}, 0, stream>>>({{ kargs }}, rv, ws);
    } else {
      assay_total_pass{{ loop.index0 }}<1><<<(unsigned)out_blocks, {{ block }}, 0, stream>>>({{ kargs }}, rv, ws);
    }
  }
{% endif %}
{% endfor %}
  return (int)cudaGetLastError();
}
"""


def _width(plan: Plan, sched: Schedule) -> int:
    """The most reductions of one pass: partials per block (per chunk on the host)."""
    per_pass = [0] * max(sched.passes, 1)
    for j in plan.reductions():
        per_pass[sched.reduce_pass(j)] += 1
    return max(per_pass)


def _size_params(plan: Plan) -> list[Param]:
    """The sizes of S that ``size`` nodes read (kl_div's batchmean: the first dim's)."""
    dims = sorted({n.attr("dim") for n in plan.nodes if n.op == "size"})
    return [Param("int64_t", f"size{d}", f"shape[{d}]", "ctypes.c_int64") for d in dims]


def _params(plan: Plan, target: str) -> list[Param]:
    """assay_forward's parameters: the row plan's (rows is 1, cols every element), the sizes,
    and on cuda the workspace (the partials, then the values of nodes)."""
    extra = [pointer(target, "ws", "ws.data_ptr()", "double", const=False)] \
        if target == "cuda" else []
    return fused_params(plan, target) + _size_params(plan) + extra


def _workspace(plan: Plan) -> int:
    """float64 elements of the CUDA workspace: the partials, then one float per node."""
    sched = Schedule(plan, [leaf_kind(plan, k) for k in range(len(plan.leaves))])
    return _MAX_BLOCKS * _width(plan, sched) + (len(plan.nodes) + 1) // 2


def _cpp_passes(plan: Plan, sched: Schedule, width: int) -> list[dict[str, Any]]:
    """Per pass of the C++ kernel: accumulators, loop body, the chunk's partials, and after the
    loop the combined reductions and the values that follow from them."""
    names = Names(plan, sched)
    out = plan.output
    passes = []
    for p in range(sched.passes + (0 if plan.out_is_row else 1)):
        reds = [j for j in plan.reductions() if sched.reduce_pass(j) == p]
        targets = [plan.nodes[j].args[0] for j in reds] or [out]
        body = [names.define(j) for j in elem_closure(plan, sched, targets)]
        init, clauses, store, after = [], [], [], []
        for r, j in enumerate(reds):
            kind = plan.nodes[j].op.removeprefix("reduce_")
            arg = names(plan.nodes[j].args[0])
            at = f"part[ch * {width} + {r}]"
            if kind == "sum":
                init.append(f"double acc{j} = 0.0;")
                body.append(f"acc{j} += (double){arg};")
                clauses.append(f"reduction(+:acc{j})")
                store.append(f"{at} = acc{j};")
                after += [f"double tot{j} = 0.0;",
                          f"for (int64_t ch = 0; ch < nchunks; ++ch) tot{j} += {at};"]
            else:
                cmp = ">" if kind == "max" else "<"
                init.append(f"float acc{j} = {_IDENT[kind]}; int nan{j} = 0;")
                body.append(f"acc{j} = {arg} {cmp} acc{j} ? {arg} : acc{j}; "
                            f"nan{j} |= ({arg} != {arg});")
                clauses.append(f"reduction({kind}:acc{j}) reduction(|:nan{j})")
                store.append(f"{at} = nan{j} ? NAN : (double)acc{j};")
                # NaN sticks: once tot is NaN, neither test takes another value
                after += [f"double tot{j} = {_IDENT[kind]};",
                          f"for (int64_t ch = 0; ch < nchunks; ++ch) {{ const double q = {at}; "
                          f"tot{j} = (q != q || q {cmp} tot{j}) ? q : tot{j}; }}"]
            after.append(f"const float v{j} = (float)tot{j};")
        if not reds:
            body.append(f"out[i] = {names(out)};")
        after += after_pass(plan, sched, p)
        if plan.out_is_row and p == sched.passes - 1:
            after.append(f"out[0] = {names(out)};")
        passes.append({"comment": ", ".join(plan.nodes[j].op for j in reds)
                       or "write the output", "init": init, "body": body, "store": store,
                       "after": after, "clause": "".join(f" {c}" for c in clauses)})
    return passes


def _cuda_passes(plan: Plan, sched: Schedule) -> tuple[list[dict[str, Any]], list[str]]:
    """Per pass of the CUDA kernels: the element loop's lines (vector and scalar forms), the
    block's partials, the finishing block's lines; and the vector-accessed pointers."""
    kinds = sched.kinds
    out = plan.output
    vec_ptrs: list[str] = []
    passes = []
    for p in range(sched.passes + (0 if plan.out_is_row else 1)):
        reds = [j for j in plan.reductions() if sched.reduce_pass(j) == p]
        targets = [plan.nodes[j].args[0] for j in reds] or [out]
        elems = elem_closure(plan, sched, targets)
        vector = {k for k in leaves_of(plan, elems) if kinds[k] in ("full", "col")}
        vnames, snames = Names(plan, sched, vector, hoisted=True), Names(plan, sched)
        vec_loads = vector_index(kinds, leaves_of(plan, elems), "i0") + [
            f"float a{k}[VEC]; assay_load<VEC>(t{k}, i0, a{k});" for k in sorted(vector)]
        vec_ptrs += [f"t{k}" for k in sorted(vector)]
        # Values of earlier passes, as the finishing blocks left them.
        known = [f"const float v{j} = rv[{j}]; (void)v{j};"
                 for j, n in enumerate(plan.nodes)
                 if n.cls == "row" and sched.avail[j] <= p]
        vec_body = [vnames.define(j) for j in elems]
        scalar_body = [snames.define(j) for j in elems]
        init, vec_init, vec_after, store, finish = [], [], [], [], []
        made = []  # the values this pass makes, kept in rv for later passes
        for r, j in enumerate(reds):
            kind = plan.nodes[j].op.removeprefix("reduce_")
            op = _OP_CUDA[kind]
            varg, sarg = vnames(plan.nodes[j].args[0]), snames(plan.nodes[j].args[0])
            init.append(f"{op}::T acc{j} = {op}::id();")
            if kind == "sum":  # a vector's terms in float, then one double addition
                vec_init.append(f"float part{j} = 0.0f;")
                vec_body.append(f"part{j} += {varg};")
                vec_after.append(f"acc{j} += static_cast<AssaySum::T>(part{j});")
                scalar_body.append(f"acc{j} += static_cast<AssaySum::T>({sarg});")
            else:
                vec_body.append(f"acc{j} = {op}::op(acc{j}, {varg});")
                scalar_body.append(f"acc{j} = {op}::op(acc{j}, {sarg});")
            store += [f"acc{j} = assay_block_reduce<{op}>(acc{j}, smem);",
                      f"if (threadIdx.x == 0) part[{r} * gridDim.x + blockIdx.x] = "
                      f"static_cast<double>(acc{j});"]
            finish += [f"{op}::T acc{j} = {op}::id();",
                       f"for (int b = threadIdx.x; b < nblocks; b += {_FINISH_BLOCK}) "
                       f"acc{j} = {op}::op(acc{j}, static_cast<{op}::T>(part[{r} * nblocks + b]));",
                       f"const float v{j} = static_cast<float>("
                       f"assay_block_reduce<{op}>(acc{j}, smem));"]
            made.append(j)
        if reds:
            finish += after_pass(plan, sched, p)
            made += [j for j, n in enumerate(plan.nodes) if n.cls == "row"
                     and sched.avail[j] == p + 1 and not n.op.startswith("reduce_")]
            writes = [f"rv[{j}] = v{j};" for j in made]
            if plan.out_is_row and p == sched.passes - 1:
                writes.append(f"out[0] = {snames(out)};")
            finish.append(f"if (threadIdx.x == 0) {{ {' '.join(writes)} }}")
        else:
            vec_init.append("float o[VEC];")
            vec_body.append(f"o[u] = {vnames(out)};")
            vec_after.append("assay_store_out<VEC>(out, i0, o);")
            scalar_body.append(f"out[i] = {snames(out)};")
            vec_ptrs.append("out")
        passes.append({"comment": ", ".join(plan.nodes[j].op for j in reds)
                       or "write the output", "reduces": bool(reds), "known": known,
                       "init": init, "vec_loads": vec_loads, "vec_init": vec_init,
                       "vec_body": vec_body, "vec_after": vec_after,
                       "scalar_body": scalar_body, "store": store, "finish": finish})
    return passes, list(dict.fromkeys(vec_ptrs))


# ----------------------------------------------------------------------------------------------
# The family


def matches(plan: Plan) -> bool:
    return (plan.kind == "row" and plan.k == plan.ndim and plan.gemm is None
            and plan.pool is None and not plan.groups)


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    return dict(KNOB_SPACES[(target, "total")])


def declines(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    if target == "triton":
        return f"{PREFIX} a full reduction to one value in Triton yet (no Triton template)"
    return None


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    if target == "cpu":
        # 16384 elements (64 KB of each input) per block: many blocks for the threads to
        # share, few partials; unroll 4 as in the elementwise family.
        return {"threads": 0, "chunk": 16384, "unroll": 4}
    # Four blocks of 256 threads per SM, float4 loads: enough loads in flight to stream the
    # tensor at memory speed with a few hundred partials. Not yet measured on a GPU.
    return {"block": 256, "vec": 4, "blocks_per_sm": 4}


def safe(target: str, plan: Plan | None = None, knobs: Any = None) -> dict[str, int]:
    """No vector accesses, no unrolling, serial on the host; one block per SM."""
    if target == "cpu":
        return {"threads": 1, "chunk": 16384, "unroll": 1}
    return {"block": 256, "vec": 1, "blocks_per_sm": 1}


def template(plan: Plan, knobs: dict[str, Any]) -> str:
    return "total"


def strategy(plan: Plan, knobs: dict[str, Any]) -> str:
    return "totalreduce"


def source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The kernel file of ``plan`` (C++ or CUDA)."""
    values, sched = fused_kernel(plan, target, knobs, summary, "total")
    params = _params(plan, target)
    signature = ", ".join(f"{p.ctype} {p.name}" for p in params)
    width = _width(plan, sched)
    if target == "cpu":
        return render(CPP_TOTAL, **dict(values, params=signature), chunk=int(knobs["chunk"]),
                      width=width, passes=_cpp_passes(plan, sched, width))
    kparams = ", ".join(f"{p.ctype} {p.name}" for p in params if p.name != "ws")
    kargs = ", ".join(p.name for p in params if p.name != "ws")
    passes, vec_ptrs = _cuda_passes(plan, sched)
    # the vector flags read VEC: the pass kernels' (the finish kernels have no VEC)
    values.update(kparams=kparams, kargs=kargs, vflags=vector_flags(plan, sched.kinds))
    return render(CUDA_COMMON, **values) + render(
        CUDA_TOTAL, **values, passes=passes, vec_ptrs=vec_ptrs, width=width,
        blocks_per_sm=int(knobs["blocks_per_sm"]), max_blocks=_MAX_BLOCKS,
        finish_block=_FINISH_BLOCK)


def calls(plan: Plan, target: str, knobs: dict[str, Any], stream: list[str]
          ) -> tuple[list[str], list[Entry]]:
    """The entry point's call; on cuda after allocating its workspace."""
    lines, entries = forward_call(_params(plan, target), stream)
    if target == "cuda":
        lines = [f"ws = torch.empty({_workspace(plan)}, dtype=torch.float64, "
                 f"device=out.device)"] + lines
    return lines, entries


FAMILY = Family(name="total", matches=matches, knob_spaces=KNOB_SPACES, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=source, calls=calls, declines=declines)
