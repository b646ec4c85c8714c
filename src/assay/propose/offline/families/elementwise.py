"""The elementwise family: a fused chain of per-element ops over same-shape float32 tensors, with
scalars, constants and broadcast operands (a bias along the last dim). C++: OpenMP threads over
chunks, `omp simd` inner loops; CUDA: a grid-stride loop over vectors of VEC floats; Triton: one
program per BLOCK elements (Triton vectorizes the loads and stores itself)."""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families import triton_form as tri
from assay.propose.offline.families.family import Family, Space
from assay.propose.offline.families.shared import (CPP_FORWARD_CLOSE, CPP_FORWARD_OPEN, CUDA_COMMON,
                                                   Names, elem_closure, fused_calls, fused_kernel,
                                                   knob_line, leaves_of, render, vector_flags,
                                                   vector_index, vector_uniform)
from assay.propose.offline.ir import Analysis, Plan, needed_nodes

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP default, 1 = serial, k = at most k; chunk: elements per OpenMP task;
    # unroll: simd length in units of 4 lanes.
    ("cpu", "elementwise"): {"threads": (0, 1, 2, 4, 8), "chunk": (2048, 8192, 16384, 65536),
                             "unroll": (1, 2, 4, 8)},
    # block: threads per block; vec: floats per load (float4 = 16 bytes); unroll: vectors per
    # thread per grid-stride step; persistent: 1 = a grid capped at a few waves per SM that
    # strides over the data, 0 = one pass with as many blocks as the data needs.
    ("cuda", "elementwise"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                              "unroll": (1, 2, 4), "persistent": (0, 1)},
    # block: elements per program (Triton's BLOCK, a power of two); num_warps: warps per
    # program. No num_stages: a kernel without a loop has nothing to pipeline.
    ("triton", "elementwise"): {"block": (256, 512, 1024, 2048, 4096, 8192),
                                "num_warps": (1, 2, 4, 8, 16)},
}

TRITON_ELEMENTWISE = r"""
# Assay offline synthesizer v1: {{ template }} kernel (triton)
# computes: {{ summary }}
# knobs: {{ knob_line }}
@triton.jit
def assay_elementwise({{ params }}, BLOCK: tl.constexpr):
    # One program per BLOCK elements; 64-bit offsets, so every size is indexed right.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
{% for line in body %}
    {{ line }}
{% endfor %}
    tl.store(out + offs, {{ result }}, mask=mask)
"""

CPP_ELEMENTWISE = CPP_FORWARD_OPEN + r"""
  // {{ chunk }} elements per OpenMP task: large enough to amortize scheduling, small enough
  // to balance the threads.
  const int64_t chunk = {{ chunk }};
  const int64_t nchunks = (n + chunk - 1) / chunk;
{% if parallel %}
  #pragma omp parallel for schedule(static){{ omp_clause }} if(nchunks > 1)
{% endif %}
  for (int64_t ch = 0; ch < nchunks; ++ch) {
    const int64_t lo = ch * chunk;
    const int64_t hi = std::min(lo + chunk, n);
    #pragma omp simd simdlen({{ simdlen }})
    for (int64_t i = lo; i < hi; ++i) {
{% for line in body %}
      {{ line }}
{% endfor %}
    }
  }""" + CPP_FORWARD_CLOSE

CUDA_ELEMENTWISE = r"""
// Grid-stride loop; each thread handles UNROLL vectors of VEC floats per step (more bytes in
// flight per thread), then the n % VEC tail scalar by scalar.
template <int VEC>
__global__ void __launch_bounds__({{ block }})
assay_elementwise({{ kparams }}) {
{% for line in prologue %}
  {{ line }}
{% endfor %}
  const int64_t nv = n / VEC;
  const int64_t stride = (int64_t)gridDim.x * {{ block }};
  for (int64_t j0 = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; j0 < nv; j0 += stride * {{ unroll }}) {
    #pragma unroll
    for (int uu = 0; uu < {{ unroll }}; ++uu) {
      const int64_t j = j0 + uu * stride;
      if (j < nv) {
        const int64_t i0 = j * VEC;
{% for line in vec_loads %}
        {{ line }}
{% endfor %}
        float o[VEC];
{% macro lanes(body) %}
        #pragma unroll
        for (int u = 0; u < VEC; ++u) {
          const int64_t i = i0 + u;
          (void)i;
{% for line in body %}
          {{ line }}
{% endfor %}
        }
{% endmacro %}
{% if uniform_body %}
        // What the broadcast leaves alone compute is one value for the vector where none of
        // them crosses a block in it: computed once, not per element (vector_uniform).
        if ({{ uniform_flag }}) {
{% for line in uniform_lines %}
          {{ line }}
{% endfor %}
{{ lanes(uniform_body) }}
        } else {
{{ lanes(vec_body) }}
        }
{% else %}
{{ lanes(vec_body) }}
{% endif %}
        assay_store_out<VEC>(out, i0, o);
      }
    }
  }
  if (VEC > 1) {
    for (int64_t i = nv * VEC + (int64_t)blockIdx.x * {{ block }} + threadIdx.x; i < n; i += stride) {
{% for line in scalar_body %}
      {{ line }}
{% endfor %}
    }
  }
}

extern "C" int assay_forward({{ params }}) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (n <= 0) return 0;
  const bool vec = {{ vec }} > 1{% for p in vec_ptrs %} && assay_aligned({{ p }}, {{ 4 * vec }}){% endfor %};
  const int64_t work = vec ? n / {{ vec }} : n;
  int64_t blocks = (work + {{ block * unroll }} - 1) / {{ block * unroll }};
{% if persistent %}
  // Persistent grid: a few waves of blocks per SM, the grid-stride loop covers the rest.
  const int64_t cap = (int64_t)assay_sm_count() * {{ 2048 // block * 4 }};
{% else %}
  // One pass: every thread handles UNROLL vectors and exits (measured ~4% faster than a
  // persistent grid for streaming ops on H200); the grid-stride loop only guards the limit.
  const int64_t cap = 2147483647;
{% endif %}
  if (blocks > cap) blocks = cap;
  if (blocks < 1) blocks = 1;
  if (vec) {
    assay_elementwise<{{ vec }}><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  } else {
    assay_elementwise<1><<<(unsigned)blocks, {{ block }}, 0, stream>>>({{ kargs }});
  }
  return (int)cudaGetLastError();
}
"""


def matches(plan: Plan) -> bool:
    return plan.kind == "elementwise" and plan.gemm is None and plan.pool is None


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    return dict(KNOB_SPACES[(target, "elementwise")])


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    if target == "triton":
        # Triton's tutorial setting for streaming ops (vector add); not yet measured here.
        return {"block": 1024, "num_warps": 4}
    if target == "cpu":
        # unroll 4: `omp simd simdlen(16)`, one AVX-512 vector or two AVX2 ones, and libmvec's
        # 16-lane exp. Sigmoid over 1024 x 4096 on one core of the 2-core EPYC (cache flushed
        # before each call): 1.67 ms with simdlen(8), 1.18 ms with 16; eager 1.05 ms.
        return {"threads": 0, "chunk": 16384, "unroll": 4}
    # Measured on H200 (ReLU and GELU over 4096 x 16384): within 1% of eager torch, the best of
    # the 56 variants tried; a persistent grid was ~4% slower.
    return {"block": 256, "vec": 4, "unroll": 2, "persistent": 0}


def safe(target: str, plan: Plan | None = None, knobs: Any = None) -> dict[str, int]:
    """No vector accesses, no unrolling, serial on the host; small Triton programs."""
    if target == "triton":
        return {"block": 512, "num_warps": 4}
    if target == "cpu":
        return {"threads": 1, "chunk": 16384, "unroll": 1}
    return {"block": 256, "vec": 1, "unroll": 1, "persistent": 1}


def template(plan: Plan, knobs: dict[str, Any]) -> str:
    return "elementwise"


def strategy(plan: Plan, knobs: dict[str, Any]) -> str:
    """A single op streams (vectorize), several fuse (fusion)."""
    compute = [n for n in plan.nodes if n.op not in ("load", "const", "cols")]
    return "fusion" if len(compute) > 1 or len(plan.leaves) > 1 else "vectorize"


def source(plan: Plan, target: str, knobs: dict[str, Any], summary: str,
           label: str = "elementwise") -> str:
    """The kernel file of ``plan`` (a product's result may be one of its leaves: ``label``
    names the product's template then)."""
    if target == "triton":
        return triton_source(plan, knobs, summary, label)
    values, sched = fused_kernel(plan, target, knobs, summary, label)
    elems = elem_closure(plan, sched, [plan.output])
    if target == "cpu":
        names = Names(plan, sched)
        body = [names.define(j) for j in elems] + [f"out[i] = {names(plan.output)};"]
        return render(CPP_ELEMENTWISE, **values, body=body, chunk=int(knobs["chunk"]))
    kinds = sched.kinds
    head = render(CUDA_COMMON, **values)
    vector = {k for k in leaves_of(plan, elems) if kinds[k] == "full"}
    vnames = Names(plan, sched, vector, hoisted=True)
    snames = Names(plan, sched)
    uniform, uniform_leaves = vector_uniform(plan, sched, elems)  # (empty: no such path)
    values.update(
        uniform_flag=" && ".join(f"bv{k}" for k in uniform_leaves),
        uniform_lines=[vnames.define(j, uniform=True) for j in uniform],
        uniform_body=[vnames.define(j) for j in elems if j not in uniform]
        + [f"o[u] = {vnames(plan.output)};"] if uniform else [],
    )
    values.update(
        unroll=int(knobs["unroll"]), persistent=bool(knobs["persistent"]),
        prologue=values["prologue"] + vector_flags(plan, kinds),
        vec_loads=vector_index(kinds, leaves_of(plan, elems), "i0")
        + [f"float a{k}[VEC]; assay_load<VEC>(t{k}, i0, a{k});" for k in sorted(vector)],
        vec_body=[vnames.define(j) for j in elems] + [f"o[u] = {vnames(plan.output)};"],
        scalar_body=[snames.define(j) for j in elems] + [f"out[i] = {snames(plan.output)};"],
        vec_ptrs=[f"t{k}" for k in sorted(vector)] + ["out"],
    )
    return head + render(CUDA_ELEMENTWISE, **values)


def triton_source(plan: Plan, knobs: dict[str, Any], summary: str,
                  label: str = "elementwise") -> str:
    """The @triton.jit kernel of ``plan``: every node the output needs, in order."""
    ptrs, geometry = tri.leaf_args(plan)
    needed = sorted(needed_nodes(plan.nodes, plan.output))
    return render(TRITON_ELEMENTWISE, template=label, summary=summary.replace("\n", " "),
                  knob_line=knob_line(knobs), params=", ".join(ptrs + ["out", "n"] + geometry),
                  body=tri.value_lines(plan, needed), result=tri.output_expr(plan))



def calls(plan: Plan, target: str, knobs: dict[str, Any], stream: list[str]
          ) -> tuple[list[str], list[Any]]:
    """ModelNew.forward's launch of the kernel (Triton: the @triton.jit function, no entry
    points to bind), or the C/CUDA entry point's call."""
    if target != "triton":
        return fused_calls(plan, target, knobs, stream)
    ptrs, geometry = tri.leaf_args(plan)
    args = [f"l{k}" for k in range(len(ptrs))] + ["out", "n"] + geometry
    block = int(knobs["block"])
    return ([f"assay_elementwise[(triton.cdiv(n, {block}),)]({', '.join(args)}, "
             f"BLOCK={block}, num_warps={int(knobs['num_warps'])})"], [])


def declines(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    return tri.why_not(analysis.plan) if target == "triton" else None


FAMILY = Family(name="elementwise", matches=matches, knob_spaces=KNOB_SPACES, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=source, calls=calls, declines=declines)
