"""What the families' Triton forms share (target ``triton``): the scalar formulas in Triton's
language, how a plan's leaves are loaded, and the candidate file around a @triton.jit kernel.

A Triton candidate is one Python file: the task's constructor, the kernel (compiled by Triton
on a GPU; run by Triton's interpreter on cpu tensors, TRITON_INTERPRET=1, which is how the
tests and CI run it) and ModelNew, whose forward allocates the output and launches the kernel.

Only ``triton.language`` itself is used, none of ``tl.extra.libdevice``: the interpreter runs
``tl``'s functions only, and libdevice's module moved between Triton releases (the GPU machine's
torch brings its own Triton). So tanh is Cephes' tanhf (a polynomial near 0, where the
``exp`` form would cancel), and the ops whose exact form needs libdevice (expm1, log1p, general
powers, and mish, elu, selu, softplus built on them) have no Triton formula yet: a plan using
one is declined, not approximated (the verifier's precision check would reject a cancelling
form). Divisions and square roots are IEEE-rounded (``tl.math.div_rn``, ``tl.sqrt_rn``) as
C's are; ``/`` and ``tl.sqrt`` would be approximate on NVIDIA GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from assay.propose.offline.families.shared import (PY_ARG_HELPERS, geometry_names, knob_line,
                                                   render)
from assay.propose.offline.ir import PREFIX, Plan, needed_nodes


def t_float(v: float) -> str:
    """A Python float literal (Triton rounds it to float32 against a float32 tensor, as C's
    ``f`` suffix does)."""
    return repr(float(v))


def _div(a: str, b: str) -> str:
    return f"tl.math.div_rn({a}, {b})"


def _clamp_expr(x: str, lo: float | None, hi: float | None) -> str:
    # C's assay_clamp: lo first, then hi (lo > hi gives hi, as torch.clamp does); NaN kept.
    t = x if lo is None else f"tl.where({x} < {t_float(lo)}, {t_float(lo)}, {x})"
    return t if hi is None else f"tl.where({t} > {t_float(hi)}, {t_float(hi)}, {t})"


def _clamp(a: list[str], at: dict[str, Any]) -> str:
    return _clamp_expr(a[0], at.get("lo"), at.get("hi"))


def _tanh(x: str) -> str:
    """tanh without libdevice: Cephes' tanhf, an odd polynomial below |x| = 0.625 (where
    1 - 2 / (e^2|x| + 1) would cancel) and that expression above it, with x's sign; NaN
    propagates (through exp), large |x| gives +-1 (exp overflows to inf)."""
    z = f"({x} * {x})"
    small = (f"(((((-5.70498872745e-3 * {z} + 2.06390887954e-2) * {z} - 5.37397155531e-2)"
             f" * {z} + 1.33314422036e-1) * {z} - 3.33332819422e-1) * {z} * {x} + {x})")
    big = f"(1.0 - tl.math.div_rn(2.0, tl.exp(2.0 * tl.abs({x})) + 1.0))"
    return (f"tl.where(tl.abs({x}) < 0.625, {small}, "
            f"tl.where({x} < 0.0, -{big}, {big}))")


def _gelu_tanh(x: str) -> str:
    inner = f"(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x}))"
    return f"(0.5 * {x} * (1.0 + {_tanh(inner)}))"


_POW = {2.0: "({x} * {x})", 3.0: "({x} * {x} * {x})", 1.0: "{x}", 0.0: "1.0",
        0.5: "tl.sqrt_rn({x})", -0.5: "tl.math.div_rn(1.0, tl.sqrt_rn({x}))",
        -1.0: "tl.math.div_rn(1.0, {x})", -2.0: "tl.math.div_rn(1.0, {x} * {x})"}


def _pow_const(a: list[str], at: dict[str, Any]) -> str:
    return _POW[float(at["exponent"])].format(x=a[0])


TritonFormula = Callable[[list[str], dict[str, Any]], str]

# The same formulas as shared.FORMULAS (C), written in Triton's language.
FORMULAS: dict[str, TritonFormula] = {
    "add": lambda a, at: f"({a[0]} + {a[1]})",
    "sub": lambda a, at: f"({a[0]} - {a[1]})",
    "mul": lambda a, at: f"({a[0]} * {a[1]})",
    "div": lambda a, at: _div(a[0], a[1]),
    "neg": lambda a, at: f"(-{a[0]})",
    "keep": lambda a, at: a[0],
    "relu": lambda a, at: f"tl.where({a[0]} < 0.0, 0.0, {a[0]})",
    "relu6": lambda a, at: _clamp_expr(a[0], 0.0, 6.0),
    "sigmoid": lambda a, at: _div("1.0", f"(1.0 + tl.exp(-{a[0]}))"),
    "exp": lambda a, at: f"tl.exp({a[0]})",
    "tanh": lambda a, at: _tanh(a[0]),
    "gelu_tanh": lambda a, at: _gelu_tanh(a[0]),
    "log": lambda a, at: f"tl.log({a[0]})",
    "abs": lambda a, at: f"tl.abs({a[0]})",
    "sqrt": lambda a, at: f"tl.sqrt_rn({a[0]})",
    "rsqrt": lambda a, at: _div("1.0", f"tl.sqrt_rn({a[0]})"),
    "erf": lambda a, at: f"tl.erf({a[0]})",
    "sin": lambda a, at: f"tl.sin({a[0]})",
    "cos": lambda a, at: f"tl.cos({a[0]})",
    "reciprocal": lambda a, at: _div("1.0", a[0]),
    "square": lambda a, at: f"({a[0]} * {a[0]})",
    "gelu_erf": lambda a, at: f"(0.5 * {a[0]} * (1.0 + tl.erf({a[0]} * 0.7071067811865476)))",
    "silu": lambda a, at: _div(a[0], f"(1.0 + tl.exp(-{a[0]}))"),
    "softsign": lambda a, at: _div(a[0], f"(1.0 + tl.abs({a[0]}))"),
    "hardsigmoid": lambda a, at: _div(_clamp_expr(f"({a[0]} + 3.0)", 0.0, 6.0), "6.0"),
    "hardswish": lambda a, at: _div(f"({a[0]} * {_clamp_expr(f'({a[0]} + 3.0)', 0.0, 6.0)})",
                                    "6.0"),
    "leaky_relu": lambda a, at: f"tl.where({a[0]} > 0.0, {a[0]}, {a[0]} * {t_float(at['slope'])})",
    "clamp": _clamp,
    # C's assay_max2/min2: NaN in the first operand propagates, as torch's kernels do.
    "max2": lambda a, at: f"tl.where(({a[0]} != {a[0]}) | ({a[0]} > {a[1]}), {a[0]}, {a[1]})",
    "min2": lambda a, at: f"tl.where(({a[0]} != {a[0]}) | ({a[0]} < {a[1]}), {a[0]}, {a[1]})",
    "pow_const": _pow_const,
}


def why_not(plan: Plan) -> str | None:
    """Why the Triton form cannot write ``plan`` (an op without an exact Triton formula, a
    constant Triton cannot spell), or None."""
    for n in plan.nodes:
        if n.op in ("load", "const", "cols") or n.op.startswith("reduce_"):
            if n.op == "const" and not math.isfinite(float(n.attr("value"))):
                return f"{PREFIX} a non-finite constant in a Triton kernel"
            continue
        if n.op == "tri":  # the mask needs S's last two dims, which the Triton form lacks
            return f"{PREFIX} torch.triu/tril in Triton yet"
        if n.op not in FORMULAS:
            return f"{PREFIX} {n.op} exactly in Triton yet (it needs libdevice)"
        if n.op == "pow_const" and float(n.attr("exponent")) not in _POW:
            return f"{PREFIX} x ** {n.attr('exponent')} exactly in Triton yet"
    return None


def load_expr(plan: Plan, k: int, index: str = "offs", mask: str = "mask") -> str:
    """Leaf ``k`` at the flat indices ``index`` (ir.Leaf's broadcast convention)."""
    lf = plan.leaves[k]
    if lf.bcast == "scalar":
        return f"tl.load(t{k})"
    if lf.bcast == "full":
        at = index
    elif lf.bcast == "block2":  # two blocks: the first's index times the second's size
        at = f"(({index} // inner{k}) % mid{k}) * mid2_{k} + ({index} // inner2_{k}) % mid2_{k}"
    elif lf.b == plan.ndim - 1:  # a block of the trailing dims: i % mid
        at = f"{index} % mid{k}"
    else:
        at = f"({index} // inner{k}) % mid{k}"
    return f"tl.load(t{k} + {at}, mask={mask})"


def row_load_expr(kind: str, k: int) -> str:
    """Leaf ``k`` in a row kernel, by its shared.leaf_kind: ``offs`` is the flat index of the
    columns ``c`` of row ``row`` (``base = row * cols``)."""
    return {
        "full": f"tl.load(t{k} + offs, mask=mask)",
        "scalar": f"tl.load(t{k})",
        "general": f"tl.load(t{k} + (offs // inner{k}) % mid{k}, mask=mask)",
        "col": f"tl.load(t{k} + c, mask=mask)",
        "colmod": f"tl.load(t{k} + c % mid{k}, mask=mask)",
        # inner is a multiple of cols here, so (base + c) // inner == base // inner
        "rowconst": f"tl.load(t{k} + (base // inner{k}) % mid{k})",
    }[kind]


def node_name(plan: Plan, j: int) -> str:
    n = plan.nodes[j]
    if n.op == "const":
        return t_float(n.attr("value"))
    if n.op == "cols":
        return "fcols"
    return f"v{j}"


def define(plan: Plan, j: int, kinds: list[str] | None = None) -> str:
    """The line computing node ``j``; ``kinds``: a row kernel's leaf kinds (loads by
    row_load_expr), else an elementwise kernel's (load_expr)."""
    n = plan.nodes[j]
    if n.op == "load":
        k = n.attr("leaf")
        return f"v{j} = {row_load_expr(kinds[k], k) if kinds else load_expr(plan, k)}"
    return f"v{j} = {FORMULAS[n.op]([node_name(plan, a) for a in n.args], dict(n.attrs))}"


def value_lines(plan: Plan, nodes: list[int]) -> list[str]:
    """``v<j> = ...`` for each of ``nodes`` (topological order); constants are inlined."""
    return [define(plan, j) for j in nodes if plan.nodes[j].op not in ("const", "cols")]


def output_expr(plan: Plan) -> str:
    return node_name(plan, plan.output)


def leaf_args(plan: Plan) -> tuple[list[str], list[str]]:
    """The kernel's parameters for the leaves (``t<k>``, then ``inner<k>``/``mid<k>`` of the
    block-broadcast ones) and ModelNew's arguments for them."""
    params = [f"t{k}" for k in range(len(plan.leaves))]
    geometry = [name for k, lf in enumerate(plan.leaves) for name in geometry_names(lf, k)]
    return params, geometry


def epilogue_args(plan: Plan) -> tuple[list[str], list[str]]:
    """leaf_args without the head op's result (leaf ``plan.head_leaf``: the product's tile or
    the pooled values, which the kernel computes rather than loads)."""
    hk = plan.head_leaf
    ptrs, geometry = leaf_args(plan)
    return ([p for p in ptrs if p != f"t{hk}"],
            [g for g in geometry if g not in (f"inner{hk}", f"mid{hk}")])


def epilogue_lines(plan: Plan, value: str) -> list[str]:
    """The elementwise epilogue of a head op (a product, a pooling) at the flat output indices
    ``offs``: the head's result is ``value``, the other leaves are loaded (as float32)."""
    body: list[str] = []
    for j in sorted(needed_nodes(plan.nodes, plan.output)):
        n = plan.nodes[j]
        if n.op in ("const", "cols"):
            continue
        if n.op == "load" and n.attr("leaf") == plan.head_leaf:
            body.append(f"v{j} = {value}")
        elif n.op == "load":
            body.append(f"v{j} = {load_expr(plan, n.attr('leaf'))}.to(tl.float32)")
        else:
            body.append(define(plan, j))
    return body


CANDIDATE = r'''"""Candidate written by Assay's offline synthesizer (v1).

Computes: {{ summary }}
Template: {{ template }} (triton); knobs: {{ knob_line }}.

ModelNew inherits the task's Model constructor (copied below without its forward), so its
parameters have the reference's names, shapes and seeded values; its forward allocates the
output and launches the @triton.jit kernel below (compiled by Triton on a GPU; on cpu tensors
it runs in Triton's interpreter, TRITON_INTERPRET=1).
"""
{% if future %}
from __future__ import annotations
{% endif %}

import functools
import math

import torch
import triton
import triton.language as tl
from torch import nn

# ---- the task's module, without Model.forward -----------------------------------------------
{{ task_code }}

# ---- the kernel -------------------------------------------------------------------------------
TEMPLATE = {{ template|tojson }}
TARGET = "triton"
KNOBS = {{ knobs_repr }}
POLICY = "strict"  # the verifier policy this candidate can pass
DTYPE = torch.{{ dtype }}


{{ kernel }}

def _tensor(t, what):
    """A contiguous DTYPE tensor (a copy only if it was strided)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.dtype != DTYPE:
        raise TypeError(f"{what}: expected a {DTYPE} tensor, got {t.dtype}")
    return t if t.is_contiguous() else t.contiguous()


{{ py_arg_helpers }}

class ModelNew(Model):
    def forward(self, {{ inputs|join(", ") }}):
{% for line in forward %}
        {{ line }}
{% endfor %}
'''


def candidate(*, summary: str, template: str, knobs: dict[str, Any], kernel: str,
              task_code: str, future: bool, inputs: list[str], forward: list[str],
              dtype: str) -> str:
    """The whole Triton candidate file."""
    return render(CANDIDATE, py_arg_helpers=PY_ARG_HELPERS, summary=summary,
                  template=template, knob_line=knob_line(knobs),
                  knobs_repr=repr(dict(sorted(knobs.items()))), kernel=kernel.strip("\n") + "\n",
                  task_code=task_code, future=future, inputs=inputs, forward=forward,
                  dtype=dtype)


# ----------------------------------------------------------------------------------------------
# The matrix product (the gemm family's Triton form): a tile of the output per program, tl.dot
# over K slabs (IEEE float32 for float32 tasks, tensor cores with float32 accumulation for
# float16/bfloat16), the elementwise epilogue applied to the tile before its one store.

GEMM_KNOB_SPACE = {"block_m": (32, 64, 128), "block_n": (32, 64, 128), "block_k": (16, 32, 64),
                   "num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4)}
# A Linear's product only (gemm.space adds it there; other products have no transposed operand,
# so the knob would only make copies): W[N, K] read as 0, its transpose's [BK, BN] tile in place,
# or 1, a [BN, BK] tile in W's own row order, then tl.trans (the usual Triton form of A @ B^T;
# the in-place form ran at 0.15-0.42x eager on the Linear tasks of an H200, the CUDA own GEMM at
# 0.71-0.89x)
LINEAR_KNOB_SPACE = {"b_rows": (0, 1)}

TRITON_GEMM = r"""
# Assay offline synthesizer v1: {{ template }} kernel (triton)
# computes: {{ summary }}
# knobs: {{ knob_line }}
@triton.jit
def assay_gemm({{ params }}, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    pb = tl.program_id(2).to(tl.int64)  # the batch (bmm), 0 otherwise
    rk0 = tl.arange(0, BK)
    a_rows = A + pb * sA + rm[:, None].to(tl.int64) * K
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + rk0
        a = tl.load(a_rows + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
{% if trans_b and b_rows %}
        # B is W[N, K] (a Linear's weight, or a batched B^T): a [BN, BK] tile in W's row
        # order, transposed
        bt = tl.load(B + pb * sB + rn[:, None].to(tl.int64) * K + rk[None, :],
                     mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        b = tl.trans(bt)
{% elif trans_b %}
        # B is W[N, K] (a Linear's weight, or a batched B^T): the tile of its transpose,
        # read in place
        b = tl.load(B + pb * sB + rn[None, :].to(tl.int64) * K + rk[:, None],
                    mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
{% else %}
        b = tl.load(B + pb * sB + rk[:, None].to(tl.int64) * N + rn[None, :],
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
{% endif %}
        acc += tl.dot(a, b{{ ', input_precision="ieee"' if ieee else '' }})
    offs = pb * sC + rm[:, None].to(tl.int64) * N + rn[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
{% for line in body %}
    {{ line }}
{% endfor %}
    tl.store(out + offs, {{ result }}, mask=mask)
"""


def gemm_kernel(plan: Plan, knobs: dict[str, Any], summary: str, template: str,
                fused: bool) -> str:
    """The @triton.jit GEMM of ``plan``: with its elementwise epilogue fused (``fused``), or
    storing the product for the row kernel that follows."""
    assert plan.gemm is not None
    body: list[str] = []
    params = ["A", "B"]
    geometry: list[str] = []
    if fused:
        ptrs, geometry = epilogue_args(plan)
        params += ptrs
        body = epilogue_lines(plan, "acc")
        result = output_expr(plan)
    else:
        result = "acc"
    params += ["out", "M", "N", "K", "sA", "sB", "sC"] + geometry
    return render(TRITON_GEMM, template=template, summary=summary.replace("\n", " "),
                  knob_line=knob_line(knobs), params=", ".join(params), body=body,
                  result=result, trans_b=plan.gemm.b_rows,
                  b_rows=int(knobs.get("b_rows", 0)), ieee=plan.dtype == "float32")


def gemm_launch(plan: Plan, knobs: dict[str, Any], fused: bool) -> str:
    """ModelNew.forward's launch of assay_gemm (the head's lines set lA, lB, M, N, K, batch,
    sA, sB, sC; a fused epilogue's leaves are l<k>, the output ``out``; else ``g``)."""
    args = ["lA", "lB"]
    if fused:
        ptrs, geometry = epilogue_args(plan)
        args += [f"l{p[1:]}" for p in ptrs]
    else:
        geometry = []
    args += ["out" if fused else "g", "M", "N", "K", "sA", "sB", "sC"] + geometry
    bm, bn = int(knobs["block_m"]), int(knobs["block_n"])
    return (f"assay_gemm[(triton.cdiv(M, {bm}), triton.cdiv(N, {bn}), batch)]"
            f"({', '.join(args)}, BM={bm}, BN={bn}, BK={int(knobs['block_k'])}, "
            f"num_warps={int(knobs['num_warps'])}, num_stages={int(knobs['num_stages'])})")

