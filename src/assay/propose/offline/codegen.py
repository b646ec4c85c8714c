"""Code generation: a Plan plus knobs -> the text of a candidate file.

Pure functions of their arguments: the same plan, knobs, target and task source give the same
text (and so the same candidate id); different knobs give different kernel source (the knobs
line at the top of SOURCE alone guarantees a distinct build-cache key).

The kernel reads every tensor through one pointer per leaf and computes the fused formula per
element; reductions accumulate per thread, then across threads (OpenMP ``simd reduction`` on
the host, warp shuffles and shared memory on the GPU).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from assay.propose.offline import templates
from assay.propose.offline.graph import Plan

# ----------------------------------------------------------------------------------------------
# Scalar formulas (C syntax shared by C++ and CUDA)


def c_float(v: float) -> str:
    """A float literal that round-trips float32 (9 significant digits)."""
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    s = f"{v:.9g}"
    if not any(ch in s for ch in ".en"):
        s += ".0"
    return f"{s}f" if not s.startswith("-") else f"({s}f)"


def _pow_const(x: str, e: float) -> str:
    # The same special cases as torch's pow(tensor, scalar) kernel, so rounding matches.
    table = {2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})", 1.0: x, 0.0: "1.0f",
             0.5: f"sqrtf({x})", -0.5: f"(1.0f / sqrtf({x}))", -1.0: f"(1.0f / {x})",
             -2.0: f"(1.0f / ({x} * {x}))"}
    return table.get(e, f"powf({x}, {c_float(e)})")


def _clamp(a: list[str], at: dict[str, Any]) -> str:
    x = a[0]
    lo, hi = at.get("lo"), at.get("hi")
    if lo is not None and hi is not None:
        return f"assay_clamp({x}, {c_float(lo)}, {c_float(hi)})"
    if lo is not None:
        return f"({x} < {c_float(lo)} ? {c_float(lo)} : {x})"
    return f"({x} > {c_float(hi)} ? {c_float(hi)} : {x})"


Formula = Callable[[list[str], dict[str, Any]], str]

FORMULAS: dict[str, Formula] = {
    "add": lambda a, at: f"({a[0]} + {a[1]})",
    "sub": lambda a, at: f"({a[0]} - {a[1]})",
    "mul": lambda a, at: f"({a[0]} * {a[1]})",
    "div": lambda a, at: f"({a[0]} / {a[1]})",
    "neg": lambda a, at: f"(-{a[0]})",
    "keep": lambda a, at: a[0],
    "relu": lambda a, at: f"({a[0]} < 0.0f ? 0.0f : {a[0]})",
    "relu6": lambda a, at: f"assay_clamp({a[0]}, 0.0f, 6.0f)",
    "sigmoid": lambda a, at: f"assay_sigmoid({a[0]})",
    "tanh": lambda a, at: f"tanhf({a[0]})",
    "exp": lambda a, at: f"expf({a[0]})",
    "log": lambda a, at: f"logf({a[0]})",
    "abs": lambda a, at: f"fabsf({a[0]})",
    "sqrt": lambda a, at: f"sqrtf({a[0]})",
    "rsqrt": lambda a, at: f"(1.0f / sqrtf({a[0]}))",
    "erf": lambda a, at: f"erff({a[0]})",
    "sin": lambda a, at: f"sinf({a[0]})",
    "cos": lambda a, at: f"cosf({a[0]})",
    "log1p": lambda a, at: f"log1pf({a[0]})",
    "expm1": lambda a, at: f"expm1f({a[0]})",
    "reciprocal": lambda a, at: f"(1.0f / {a[0]})",
    "square": lambda a, at: f"({a[0]} * {a[0]})",
    "gelu_erf": lambda a, at: f"assay_gelu_erf({a[0]})",
    "gelu_tanh": lambda a, at: f"assay_gelu_tanh({a[0]})",
    "silu": lambda a, at: f"assay_silu({a[0]})",
    "mish": lambda a, at: f"assay_mish({a[0]})",
    "elu": lambda a, at: f"assay_elu({a[0]}, {c_float(at['alpha'])})",
    "selu": lambda a, at: f"assay_selu({a[0]})",
    "softplus": lambda a, at: (f"assay_softplus({a[0]}, {c_float(at['beta'])}, "
                               f"{c_float(at['threshold'])})"),
    "softsign": lambda a, at: f"({a[0]} / (1.0f + fabsf({a[0]})))",
    "hardsigmoid": lambda a, at: f"assay_hardsigmoid({a[0]})",
    "hardswish": lambda a, at: f"assay_hardswish({a[0]})",
    "leaky_relu": lambda a, at: f"assay_leaky_relu({a[0]}, {c_float(at['slope'])})",
    "clamp": _clamp,
    "max2": lambda a, at: f"assay_max2({a[0]}, {a[1]})",
    "min2": lambda a, at: f"assay_min2({a[0]}, {a[1]})",
    "pow": lambda a, at: f"powf({a[0]}, {a[1]})",
    "pow_const": lambda a, at: _pow_const(a[0], at["exponent"]),
    "rpow_const": lambda a, at: f"powf({c_float(at['base'])}, {a[0]})",
}


# ----------------------------------------------------------------------------------------------
# How each leaf is indexed, per template


def leaf_kind(plan: Plan, k: int) -> str:
    """How the kernel indexes leaf ``k`` (see graph.Leaf for the block convention).

    elementwise: full ``[i]``, scalar ``[0]``, mod ``[i % mid]``, general
    ``[(i / inner) % mid]``; row plans add col ``[c]`` (a weight over the whole row), colmod
    ``[c % mid]`` and rowconst (one value per row, loaded once per row).
    """
    lf = plan.leaves[k]
    if lf.bcast in ("full", "scalar"):
        return lf.bcast
    nd = plan.ndim
    if plan.kind == "row":
        first_col = nd - plan.k
        if lf.b == nd - 1 and lf.a == first_col:
            return "col"
        if lf.b == nd - 1 and lf.a > first_col:
            return "colmod"
        if lf.b < first_col:
            return "rowconst"
        return "general"
    return "mod" if lf.b == nd - 1 else "general"


def _access(kind: str, k: int) -> str:
    return {
        "full": f"t{k}[i]",
        "scalar": f"t{k}[0]",
        "mod": f"t{k}[assay_bmod(i, mid{k}, bc{k})]",
        "general": f"t{k}[assay_bidx(i, inner{k}, mid{k}, bc{k})]",
        "col": f"t{k}[c]",
        "colmod": f"t{k}[assay_bmod(c, mid{k}, bc{k})]",
        # inner is a multiple of cols here, so (base + c) / inner == base / inner.
        "rowconst": f"t{k}[(base / inner{k}) % mid{k}]",
    }[kind]


# ----------------------------------------------------------------------------------------------
# Scheduling and emission of the formula DAG


@dataclass
class _Schedule:
    """Where each node is computed: prologue (uniform), row prologue, a pass, or after one."""

    plan: Plan
    kinds: list[str]
    avail: list[int] = field(default_factory=list)  # passes completed before a value exists
    passes: int = 0  # reduction passes

    def __post_init__(self) -> None:
        for n in self.plan.nodes:
            if n.op.startswith("reduce_"):
                p = self.avail[n.args[0]]
                self.avail.append(p + 1)
                self.passes = max(self.passes, p + 1)
            elif n.args:
                self.avail.append(max(self.avail[a] for a in n.args))
            else:
                self.avail.append(0)

    def where(self, j: int) -> str:
        n = self.plan.nodes[j]
        if n.op == "const":
            return "inline"
        if n.op == "load" and self.kinds[n.attr("leaf")] == "rowconst":
            return "row"
        if n.cls == "uniform":
            return "prologue"
        if n.cls == "row":
            return "after"
        return "elem"

    def reduce_pass(self, j: int) -> int:
        return self.avail[j] - 1


# Broadcast leaves whose index a vectorized CUDA kernel computes once per vector (``q{k}``,
# set up by _vector_index), and how one lane's value follows from it: a general leaf has one
# value for the whole vector (``h{k}``, loaded once), a mod leaf consecutive ones.
_HOISTED = {"general": "h{k}", "mod": "t{k}[q{k} + u]", "colmod": "t{k}[q{k} + u]"}


def _vector_index(kinds: list[str], leaves: list[int], first: str) -> list[str]:
    """Per-vector index lines for the broadcast ``leaves`` of a pass: when the vector's VEC
    elements (``first`` is the flat index, ``c0`` the column, of the first, a multiple of VEC)
    cannot cross a block of the broadcast (bv{k}, set in the prologue), one division serves
    them all."""
    lines = []
    for k in leaves:
        if kinds[k] == "general":
            at = f"assay_bidx({first}, inner{k}, mid{k}, bc{k})"
        elif kinds[k] in ("mod", "colmod"):
            at = f"assay_bmod({'c0' if kinds[k] == 'colmod' else first}, mid{k}, bc{k})"
        else:
            continue
        lines.append(f"const int64_t q{k} = bv{k} ? {at} : 0;")
        if kinds[k] == "general":
            lines.append(f"const float h{k} = bv{k} ? t{k}[q{k}] : 0.0f;")
    return lines


def _vector_conditions(plan: Plan, kinds: list[str]) -> dict[int, str]:
    """Per broadcast leaf: whether a vector of VEC elements stays within one of its blocks (its
    index then changes by 0 (general) or 1 (mod) per element)."""
    return {k: f"{'inner' if kinds[k] == 'general' else 'mid'}{k} % VEC == 0"
            for k in range(len(plan.leaves)) if kinds[k] in _HOISTED}


def _vector_flags(plan: Plan, kinds: list[str], known: str = "") -> list[str]:
    """Kernel-prologue flags ``bv{k}`` (see _vector_conditions); ``known``: a compile-time
    condition under which the host has checked them all (the per-element paths then vanish)."""
    return [f"const bool bv{k} = {known + ' || ' if known else ''}{cond};"
            for k, cond in _vector_conditions(plan, kinds).items()]


class _Names:
    """C names of node values in a given emission context; ``hoisted``: a vectorized CUDA
    kernel's per-vector broadcast indices are available (see _vector_index)."""

    def __init__(self, plan: Plan, sched: _Schedule, vector: set[int] | None = None,
                 hoisted: bool = False):
        self.plan, self.sched, self.vector = plan, sched, vector or set()
        self.hoisted = hoisted

    def __call__(self, j: int) -> str:
        n = self.plan.nodes[j]
        if n.op == "const":
            return c_float(n.attr("value"))
        if n.op == "cols":
            return "fcols"
        return f"v{j}"

    def define(self, j: int) -> str:
        """The statement computing node ``j`` (loads pick their indexing here)."""
        n = self.plan.nodes[j]
        if n.op == "load":
            k = n.attr("leaf")
            if k in self.vector:
                return f"const float v{j} = a{k}[u];"
            kind = self.sched.kinds[k]
            if self.hoisted and kind in _HOISTED:
                lane = _HOISTED[kind].format(k=k)
                return f"const float v{j} = bv{k} ? {lane} : {_access(kind, k)};"
            return f"const float v{j} = {_access(kind, k)};"
        formula = FORMULAS[n.op]([self(a) for a in n.args], dict(n.attrs))
        return f"const float v{j} = {formula};"


def _elem_closure(plan: Plan, sched: _Schedule, targets: list[int],
                  stops: frozenset[int] = frozenset()) -> list[int]:
    """The per-element nodes needed for ``targets``, in topological (index) order; the
    arguments of ``stops`` (values that are at hand otherwise) are not followed."""
    need: set[int] = set()
    stack = list(targets)
    while stack:
        j = stack.pop()
        if j in need or sched.where(j) != "elem":
            continue
        need.add(j)
        if j not in stops:
            stack.extend(plan.nodes[j].args)
    return sorted(need)


def _leaves_of(plan: Plan, nodes: list[int]) -> list[int]:
    return sorted({plan.nodes[j].attr("leaf") for j in nodes if plan.nodes[j].op == "load"})


# ----------------------------------------------------------------------------------------------
# Kernel parameters: one list drives the C signature, the ctypes argtypes and the call.


@dataclass(frozen=True)
class _Param:
    ctype: str
    name: str
    py: str  # the Python expression passed for it
    ctypes_type: str


def _pointer(target: str, name: str, py: str, elt: str = "float", const: bool = True
             ) -> _Param:
    """A non-aliasing pointer parameter of the kernel entry point, ``py`` its Python value."""
    restrict = "__restrict__" if target == "cuda" else "__restrict"
    return _Param(f"{'const ' if const else ''}{elt}* {restrict}", name, py, "ctypes.c_void_p")


def _leaf_params(plan: Plan, target: str, skip: int = -1, elt: str = "float"
                 ) -> tuple[list[_Param], list[_Param]]:
    """The leaves' pointers (``t<k>``) and the block-broadcast leaves' geometry (``inner<k>``,
    ``mid<k>``), leaf ``skip`` left out (a head op's result that the kernel gets otherwise)."""
    ptrs = [_pointer(target, f"t{k}", f"l{k}.data_ptr()", elt)
            for k in range(len(plan.leaves)) if k != skip]
    geometry = []
    for k, lf in enumerate(plan.leaves):
        if lf.bcast == "block" and k != skip:
            geometry += [_Param("int64_t", f"inner{k}", f"inner{k}", "ctypes.c_int64"),
                         _Param("int64_t", f"mid{k}", f"mid{k}", "ctypes.c_int64")]
    return ptrs, geometry


def _sizes(*names: str) -> list[_Param]:
    return [_Param("int64_t", v, v, "ctypes.c_int64") for v in names]


def _out_param(target: str, py: str = "out.data_ptr()", elt: str = "float") -> _Param:
    return _pointer(target, "out", py, elt, const=False)


def _params(plan: Plan, target: str) -> list[_Param]:
    """assay_forward's parameters for an elementwise or row plan."""
    ptrs, geometry = _leaf_params(plan, target)
    sizes = _sizes("rows", "cols") if plan.kind == "row" else _sizes("n")
    return ptrs + [_out_param(target)] + sizes + geometry


# ----------------------------------------------------------------------------------------------
# Kernel source


def _dividers(plan: Plan) -> list[str]:
    """Per-thread set-up of the broadcast operands' index dividers (see assay_bidx)."""
    return [f"const AssayBcast bc{k} = assay_bcast(inner{k}, mid{k});"
            for k, lf in enumerate(plan.leaves) if lf.bcast == "block" and k != plan.head_leaf]


def _prologue(plan: Plan, sched: _Schedule) -> list[str]:
    names = _Names(plan, sched)
    lines = _dividers(plan)
    if any(n.op == "cols" for n in plan.nodes):
        lines.append("const float fcols = (float)cols;")
    for j, n in enumerate(plan.nodes):
        if sched.where(j) == "prologue" and n.op != "cols":
            lines.append(names.define(j))
    return lines


def _row_prologue(plan: Plan, sched: _Schedule) -> list[str]:
    names = _Names(plan, sched)
    return [names.define(j) for j in range(len(plan.nodes)) if sched.where(j) == "row"]


def _after(plan: Plan, sched: _Schedule, p: int) -> list[str]:
    """Row values that become available once pass ``p`` is done (not the reductions)."""
    names = _Names(plan, sched)
    return [names.define(j) for j, n in enumerate(plan.nodes)
            if sched.where(j) == "after" and not n.op.startswith("reduce_")
            and sched.avail[j] == p + 1]


_IDENT_CPP = {"sum": "0.0", "max": "-INFINITY", "min": "INFINITY"}
_OP_CUDA = {"sum": "AssaySum", "max": "AssayMax", "min": "AssayMin"}


@dataclass
class _RowPasses:
    passes: list[dict[str, Any]]  # per pass: init, loads, body, after, ... (see the templates)
    vec_ptrs: list[str]  # pointers that a vectorized kernel accesses by vector
    cached: list[int]  # CUDA: per-element values that several passes use, kept for later passes


def _kept_values(plan: Plan, sched: _Schedule, elems_of: list[list[int]],
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


def _row_passes(plan: Plan, sched: _Schedule, target: str, vec_ok: Callable[[int], bool]
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
    elems_of = [_elem_closure(plan, sched, targets_of[p]) for p in range(npasses)]
    # Each thread reads back only the values it kept itself (the same lane -> column mapping in
    # every pass), so no barrier.
    kept = _kept_values(plan, sched, elems_of, targets_of) if target == "cuda" else {}

    def vector_step(elems: list[int], from_cache: set[int], keep: list[int]
                    ) -> dict[str, list[str]]:
        """One vector's loads and per-element lines of a pass, its reductions left out:
        ``elems`` computed or (``from_cache``) read back, ``keep`` stored for later passes."""
        computed = [j for j in elems if j not in from_cache]
        vector = {k for k in _leaves_of(plan, computed) if vec_ok(k)} if target == "cuda" \
            else set()
        names = _Names(plan, sched, vector, hoisted=target == "cuda")
        loads = (_vector_index(sched.kinds, _leaves_of(plan, computed), "base + c0")
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
        names = _Names(plan, sched)
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
        after += _after(plan, sched, p)
        if plan.out_is_row and p == sched.passes - 1:
            after.append(f"if (leader) out[r] = {names(out)};" if target == "cuda"
                         else f"out[r] = {names(out)};")
        keep = sorted(j for j, q in kept.items() if q == p)
        stops = frozenset(j for j, q in kept.items() if q < p)
        cached_elems = _elem_closure(plan, sched, targets_of[p] + keep, stops)
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


def _common(template: str, knobs: dict[str, Any], summary: str) -> dict[str, Any]:
    """The values every kernel file's head takes (CUDA_COMMON, CPP_PREAMBLE)."""
    return {"template": template, "summary": summary.replace("\n", " "),
            "knob_line": _knob_line(knobs), "helpers": templates.HELPERS.strip("\n")}


def _knob_line(knobs: dict[str, Any]) -> str:
    return " ".join(f"{k}={knobs[k]}" for k in sorted(knobs))


def template_of(plan: Plan, knobs: dict[str, Any]) -> str:
    """The template a (plan, knobs) pair is written with: ``elementwise`` or ``row`` (no
    product), ``pool`` (2-D pooling + elementwise epilogue), ``gemm`` (the tiled fp32 GEMM; a
    row epilogue follows as a second kernel),
    ``gemm_tc`` (tensor cores, float16/bfloat16) or ``epilogue`` (the library computes the
    product, one fused kernel the rest; knob ``lib`` = 1)."""
    if plan.pool is not None:
        return "pool"
    if plan.gemm is None:
        return plan.kind
    if int(knobs.get("lib", 0)):
        return "epilogue"
    return "gemm" if plan.dtype == "float32" else "gemm_tc"


def kernel_source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The whole kernel file (C++ or CUDA) for ``plan`` with ``knobs``."""
    template = template_of(plan, knobs)
    if template in ("gemm", "gemm_tc"):
        return gemm_source(plan, target, knobs, summary)
    if template == "pool":
        return pool_source(plan, target, knobs, summary)
    return _fused_source(plan, target, knobs, summary, template)


def _fused_source(plan: Plan, target: str, knobs: dict[str, Any], summary: str,
                  label: str) -> str:
    """The elementwise or row kernel of ``plan`` (a product's result is one of its leaves)."""
    kinds = [leaf_kind(plan, k) for k in range(len(plan.leaves))]
    sched = _Schedule(plan, kinds)
    params = _params(plan, target)
    common = dict(_common(label, knobs, summary), kind=plan.kind,
                  prologue=_prologue(plan, sched))
    if target == "cpu":
        # threads: 0 = OpenMP's default team, 1 = serial (no parallel region), k = at most k.
        # unroll: the simd length in units of 4 lanes (the SSE width of a plain -O3 build).
        threads = int(knobs["threads"])
        values = dict(common, params=", ".join(f"{p.ctype} {p.name}" for p in params),
                      parallel=threads != 1,
                      omp_clause=f" num_threads(assay_threads({threads}))" if threads > 1 else "",
                      simdlen=4 * int(knobs["unroll"]))
        if plan.kind == "elementwise":
            names = _Names(plan, sched)
            elems = _elem_closure(plan, sched, [plan.output])
            body = [names.define(j) for j in elems] + [f"out[i] = {names(plan.output)};"]
            values.update(body=body, chunk=int(knobs["chunk"]))
        else:
            passes = _row_passes(plan, sched, "cpu", lambda k: False).passes
            chunk = int(knobs["chunk"])
            values.update(passes=passes, row_prologue=_row_prologue(plan, sched),
                          schedule="static" if chunk == 0 else f"static, {chunk}")
        return templates.render(templates.CPP_SOURCE, **values)

    block, vec = int(knobs["block"]), int(knobs["vec"])
    kparams = ", ".join(f"{p.ctype} {p.name}" for p in params)
    values = dict(common, block=block, vec=vec, kparams=kparams,
                  params=kparams + ", void* stream_ptr",
                  kargs=", ".join(p.name for p in params))
    head = templates.render(templates.CUDA_COMMON, **values)
    if plan.kind == "elementwise":
        elems = _elem_closure(plan, sched, [plan.output])
        vector = {k for k in _leaves_of(plan, elems) if kinds[k] == "full"}
        vnames = _Names(plan, sched, vector, hoisted=True)
        snames = _Names(plan, sched)
        values.update(
            unroll=int(knobs["unroll"]), persistent=bool(knobs["persistent"]),
            prologue=values["prologue"] + _vector_flags(plan, kinds),
            vec_loads=_vector_index(kinds, _leaves_of(plan, elems), "i0")
            + [f"float a{k}[VEC]; assay_load<VEC>(t{k}, i0, a{k});" for k in sorted(vector)],
            vec_body=[vnames.define(j) for j in elems] + [f"o[u] = {vnames(plan.output)};"],
            scalar_body=[snames.define(j) for j in elems]
            + [f"out[i] = {snames(plan.output)};"],
            vec_ptrs=[f"t{k}" for k in sorted(vector)] + ["out"],
        )
        return head + templates.render(templates.CUDA_ELEMENTWISE, **values)
    rp = _row_passes(plan, sched, "cuda", lambda k: kinds[k] in ("full", "col"))
    warp = bool(knobs["warp_per_row"])
    values.update(passes=rp.passes, row_prologue=_row_prologue(plan, sched),
                  prologue=values["prologue"] + _vector_flags(plan, kinds, "REGS > 0"),
                  vectors_whole=" && ".join(_vector_conditions(plan, kinds).values()) or "true",
                  vec_ptrs=rp.vec_ptrs, warp_per_row=warp, cached=rp.cached,
                  cache_row=bool(knobs["cache_row"]), rows_per_block=block // 32 if warp else 1,
                  split=1 if warp else int(knobs["split"]), regs=int(knobs["regs"]),
                  group=32 if warp else block)
    return head + templates.render(templates.CUDA_ROW, **values)


# ----------------------------------------------------------------------------------------------
# GEMM kernels (templates gemm and gemm_tc)

_CTYPE = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
_TO_ELT = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}


class _EpiNames(_Names):
    """Names in a fused epilogue: the head op's leaf (product, pooled window) is ``acc_v``;
    ``wrap`` converts float16/bfloat16 loads to float."""

    def __init__(self, plan: Plan, sched: _Schedule, wrap: bool):
        super().__init__(plan, sched)
        self.wrap = wrap

    def define(self, j: int) -> str:
        n = self.plan.nodes[j]
        if n.op == "load":
            k = n.attr("leaf")
            if k == self.plan.head_leaf:
                return f"const float v{j} = acc_v;"
            if self.wrap:
                return f"const float v{j} = assay_f({_access(self.sched.kinds[k], k)});"
        return super().define(j)


def _epilogue(plan: Plan, wrap: bool) -> tuple[list[str], list[str], str]:
    """(kernel prologue, per-element statements, output expression) of a fused epilogue."""
    kinds = [leaf_kind(plan, k) for k in range(len(plan.leaves))]
    sched = _Schedule(plan, kinds)
    names = _EpiNames(plan, sched, wrap)
    elems = _elem_closure(plan, sched, [plan.output])
    prologue = _dividers(plan) + [names.define(j) for j, n in enumerate(plan.nodes)
                                  if sched.where(j) == "prologue" and n.op != "cols"]
    return prologue, [names.define(j) for j in elems], names(plan.output)


def _gemm_params(plan: Plan, target: str, fused: bool) -> list[_Param]:
    """assay_gemm's parameters: operands, the epilogue's leaves (when fused), the output (the
    product itself, ``g``, when a row kernel follows), sizes, batch strides, leaf geometry."""
    elt = "float" if plan.dtype == "float32" else "assay_elt"
    ps = [_pointer(target, name, f"l{name}.data_ptr()", elt) for name in ("A", "B")]
    ptrs, geometry = _leaf_params(plan, target, plan.gemm_leaf, elt) if fused else ([], [])
    out = _out_param(target, "out.data_ptr()" if fused else "g.data_ptr()", elt)
    return ps + ptrs + [out] + _sizes("M", "N", "K", "batch", "sA", "sB", "sC") + geometry


def gemm_source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The tiled GEMM (cpu, cuda fp32) or tensor-core GEMM (cuda float16/bfloat16) with the
    elementwise epilogue fused into its stores, or storing the product for the row kernel that
    follows (whose source comes first in the file)."""
    assert plan.gemm is not None and plan.gemm.matmul
    template = template_of(plan, knobs)
    fused = plan.kind == "elementwise"
    tc = template == "gemm_tc"
    trans_b = plan.gemm.op == "linear"
    prologue, body, out_expr = _epilogue(plan, tc) if fused else ([], [], "acc_v")
    params = _gemm_params(plan, target, fused)
    kparams = ", ".join(f"{p.ctype} {p.name}" for p in params)
    kargs = ", ".join(p.name for p in params)
    common = _common(template, knobs, summary)
    bm, bn, bk = int(knobs["tile_m"]), int(knobs["tile_n"]), int(knobs["k_step"])
    values = dict(common, prologue=prologue, epi_body=body, epi_out=out_expr, bm=bm, bn=bn,
                  bk=bk, trans_b=trans_b, kparams=kparams, kargs=kargs)
    if target == "cpu":
        threads = int(knobs["threads"])
        values.update(params=kparams, parallel=threads != 1, simdlen=4 * int(knobs["unroll"]),
                      omp_clause=f" num_threads(assay_threads({threads}))" if threads > 1 else "")
        gemm = templates.render(templates.CPP_GEMM, **values)
        if fused:
            return templates.render(templates.CPP_GEMM_HEAD, **common) + gemm
        return _fused_source(plan, target, knobs, summary, template) + gemm

    values["params"] = kparams + ", void* stream_ptr"
    if tc:
        wm, wn, stages = int(knobs["warp_m"]), int(knobs["warp_n"]), int(knobs["stages"])
        nt = (bm // wm) * (bn // wn) * 32
        a_tile = bm * (bk + 8)
        b_tile = bn * (bk + 8) if trans_b else bk * (bn + 8)
        smem = max(stages * (a_tile + b_tile) * 2, bm * (bn + 4) * 4)
        values.update(nt=nt, wm=wm, wn=wn, stages=stages, vec=int(knobs["load_vec"]),
                      store_vec=False, smem_bytes=f"(size_t){smem}", dtype=plan.dtype,
                      ctype=_CTYPE[plan.dtype], to_elt=_TO_ELT[plan.dtype])
        values["launcher"] = templates.render(templates.CUDA_GEMM_LAUNCH, **values)
        head = templates.render(templates.CUDA_COMMON, **common)
        return head + templates.render(templates.CUDA_GEMM_TC, **values)
    tm, tn, stages = int(knobs["thread_m"]), int(knobs["thread_n"]), int(knobs["stages"])
    nt = (bm // tm) * (bn // tn)
    while nt > 1024:  # 256 x 128 tiles of 4 x 4 threads: 8 x 4 instead (a block's limit)
        tm *= 2
        nt //= 2
    # cp.async (knob cp_async, or stages >= 3: register staging holds one slab ahead at most):
    # a ring of at least 2 slabs, A (and B^T) K-contiguous in rows padded every 4 rows.
    use_async = bool(knobs.get("cp_async", 0)) or stages >= 3
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
    values.update(nt=nt, tm=tm, tn=tn, stages=stages, vec=int(knobs["load_vec"]),
                  store_vec=True, smem_bytes=f"(size_t){smem}", cp_async=use_async,
                  min_blocks=min_blocks, warp_tile=bool(knobs["warp_tile"]))
    values["launcher"] = templates.render(templates.CUDA_GEMM_LAUNCH, **values)
    gemm = templates.render(templates.CUDA_GEMM, **values)
    if fused:
        return templates.render(templates.CUDA_COMMON, **common) + gemm
    return _fused_source(plan, target, knobs, summary, template) + gemm


# ----------------------------------------------------------------------------------------------
# Pooling (template pool)


def _pool_params(plan: Plan, target: str) -> list[_Param]:
    """assay_forward's parameters for a pooling plan: the pooled input, the epilogue's other
    leaves, the output, the geometry (planes = N*C, input H x W, output OH x OW), leaf
    geometry."""
    x = _pointer(target, "x", "lx.data_ptr()")
    ptrs, geometry = _leaf_params(plan, target, plan.pool_leaf)
    return [x] + ptrs + [_out_param(target)] + _sizes("planes", "H", "W", "OH", "OW") + geometry


def pool_source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The pooling kernel with its elementwise epilogue fused into the store."""
    pool = plan.pool
    assert pool is not None
    prologue, body, out_expr = _epilogue(plan, False)
    params = _pool_params(plan, target)
    kparams = ", ".join(f"{p.ctype} {p.name}" for p in params)
    geometry = {"kh": pool.kernel[0], "kw": pool.kernel[1], "sh": pool.stride[0],
                "sw": pool.stride[1], "ph": pool.padding[0], "pw": pool.padding[1],
                "dh": pool.dilation[0], "dw": pool.dilation[1]}
    avg_divide = templates.render(templates.POOL_AVG_DIVIDE, divisor=pool.divisor,
                                  count_include_pad=pool.count_include_pad)
    window = templates.render(templates.POOL_WINDOW, op=pool.op, avg_divide=avg_divide,
                              **geometry)
    kargs = ", ".join(p.name for p in params)
    values = dict(_common("pool", knobs, summary), prologue=prologue, epi_body=body,
                  epi_out=out_expr, window=window, kparams=kparams, kargs=kargs, **geometry)
    if target == "cpu":
        threads = int(knobs["threads"])
        return templates.render(templates.CPP_POOL, params=kparams, parallel=threads != 1,
                                omp_clause=(f" num_threads(assay_threads({threads}))"
                                            if threads > 1 else ""), **values)
    head = templates.render(templates.CUDA_COMMON, **values)
    # Vector input loads (knob vec) need the thread's stride chunk to be whole float4s, and
    # its span of columns few enough to stay in registers.
    cols, sw, dw = int(knobs["cols"]), pool.stride[1], pool.dilation[1]
    span = max((cols - 1) * sw + (pool.kernel[1] - 1) * dw + 1, pool.padding[1] + cols * sw)
    vloads = cols * sw // 4 if knobs["vec"] and cols * sw % 4 == 0 and span <= 32 else 0
    return head + templates.render(templates.CUDA_POOL, params=kparams + ", void* stream_ptr",
                                   block=int(knobs["block"]), cols=cols, vloads=vloads,
                                   op=pool.op, avg_divide=avg_divide, **values)


def _pool_lines(plan: Plan) -> list[str]:
    """The pooled input ``lx``, its planes and the output's size (torch's formula, ceil_mode
    included); ``gshape`` is the output's shape."""
    pool = plan.pool
    assert pool is not None
    lines = [f"lx = {_operand(pool.x)}",
             "_expect(lx.dim() in (3, 4), 'the pooled input is not CHW or NCHW')",
             "H, W = lx.shape[-2], lx.shape[-1]"]
    for out, size, k, s_, p, d in (("OH", "H", pool.kernel[0], pool.stride[0],
                                    pool.padding[0], pool.dilation[0]),
                                   ("OW", "W", pool.kernel[1], pool.stride[1],
                                    pool.padding[1], pool.dilation[1])):
        extra = s_ - 1 if pool.ceil_mode else 0
        lines.append(f"{out} = ({size} + {2 * p} - {d * (k - 1)} - 1 + {extra}) // {s_} + 1")
        if pool.ceil_mode:  # the last window must start inside the input or its left padding
            lines.append(f"{out} -= 1 if ({out} - 1) * {s_} >= {size} + {p} else 0")
    lines += ["_expect(OH > 0 and OW > 0, 'the pooled output would be empty')",
              "planes = math.prod(lx.shape[:-2])",
              "gshape = tuple(lx.shape[:-2]) + (OH, OW)"]
    return lines


# ----------------------------------------------------------------------------------------------
# The task's own code, reused for ModelNew's constructor

_DROP_FUNCS = {"get_inputs", "get_init_inputs"}


def task_prelude(source: str) -> tuple[str, bool]:
    """The task file minus what a candidate must not carry: Model.forward (the reference
    computation), get_inputs/get_init_inputs, size tables and top-level statements.

    Returns the code and whether the task used ``from __future__`` imports (hoisted by the
    caller: they must open the file).
    """
    tree = ast.parse(source)
    keep: list[ast.stmt] = []
    future = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future = True
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            keep.append(node)
        elif isinstance(node, ast.ClassDef):
            if node.name == "Model":
                node.body = [s for s in node.body
                             if not (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                                     and s.name == "forward")] or [ast.Pass()]
            keep.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name not in _DROP_FUNCS:
                keep.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            used = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}
            # Module constants stay (a constructor may read them), except the size table and
            # values computed from the input builders, which are gone.
            if "ASSAY_SIZES" not in names and not used & _DROP_FUNCS:
                keep.append(node)
    return ast.unparse(ast.Module(body=keep, type_ignores=[])), future


# ----------------------------------------------------------------------------------------------
# The candidate file


def _operand(lf: Any) -> str:
    if lf.source == "input":
        return f"_tensor({lf.name}, {lf.name!r})"
    return f"_tensor(_attr(self, {lf.name!r}), {'self.' + lf.name!r})"


_LIBRARY = {"mm": "torch.mm", "linear": "torch.mm", "bmm": "torch.bmm",
            "conv2d": "torch.nn.functional.conv2d"}


def library_of(plan: Plan, target: str) -> str:
    """What the library computes in the ``epilogue`` template, for the docstring."""
    assert plan.gemm is not None
    lib = ("cuDNN" if plan.gemm.op == "conv2d" else "cuBLAS") if target == "cuda" else "ATen"
    return f"the {plan.gemm.what} ({_LIBRARY[plan.gemm.op]}, {lib})"


def _gemm_lines(plan: Plan, target: str, template: str, layout: int = 0) -> list[str]:
    """The product's operands and sizes (lA, lB, M, N, K, batch, sA, sB, sC, gshape); in the
    epilogue template also the library call, whose result is leaf ``l<gemm_leaf>``.
    ``layout`` 1: the convolution runs on channels_last copies of its operands (its result,
    channels_last too, becomes contiguous NCHW again for the epilogue kernel: on cuda through
    the file's own transpose, assay_to_nchw)."""
    g = plan.gemm
    assert g is not None
    lines = [f"lA = {_operand(g.a)}", f"lB = {_operand(g.b)}"]
    gk = plan.gemm_leaf
    if g.op == "conv2d":
        lines.append("_expect(lA.dim() == 4 and lB.dim() == 4, 'conv2d operands are not NCHW')")
        if g.conv[0] == "module":
            lines.append(f"conv = _attr(self, {g.conv[1]!r})")
            lines.append("cargs = (conv.stride, conv.padding, conv.dilation, conv.groups)")
        else:
            lines.append(f"cargs = {tuple(g.conv[1:])!r}")
        if layout:
            lines.append("cl = torch.channels_last")
            call = ("g = torch.nn.functional.conv2d(lA.contiguous(memory_format=cl), "
                    "lB.contiguous(memory_format=cl), None, *cargs)")
        else:
            call = "g = torch.nn.functional.conv2d(lA, lB, None, *cargs)"
        if target == "cuda":
            lines += ["with _ieee_fp32():", f"    {call}"]
        else:
            lines.append(call)
        if _to_nchw(plan, target, layout):
            lines += ["if g.dtype == DTYPE and g.dim() == 4 and not g.is_contiguous() and "
                      "g.is_contiguous(memory_format=cl) and g.shape[0] <= 65535:",
                      f"    l{gk} = torch.empty(g.shape, dtype=DTYPE, device=g.device)",
                      f"    _check(_lib().assay_to_nchw(g.data_ptr(), l{gk}.data_ptr(), "
                      "g.shape[0], g.shape[1], g.shape[2] * g.shape[3], "
                      "torch.cuda.current_stream(g.device).cuda_stream))",
                      "else:",
                      f"    l{gk} = _tensor(g, 'the conv2d result')"]
        else:
            lines.append(f"l{gk} = _tensor(g, 'the conv2d result')")
        lines.append("gshape = tuple(g.shape)")
        return lines
    if g.op == "mm":
        lines += [f"_expect(lA.dim() == {g.a_ndim} and lB.dim() == 2 and lA.shape[-1] == "
                  f"lB.shape[0], 'matmul operand shapes')",
                  "K, N = lB.shape", "M = math.prod(lA.shape[:-1])", "batch, sA, sB = 1, 0, 0",
                  "gshape = tuple(lA.shape[:-1]) + (N,)"]
        lib = "torch.mm(lA.reshape(M, K), lB).view(gshape)"
    elif g.op == "linear":
        lines += [f"_expect(lA.dim() == {g.a_ndim} and lB.dim() == 2 and lA.shape[-1] == "
                  f"lB.shape[1], 'linear operand shapes')",
                  "N, K = lB.shape", "M = math.prod(lA.shape[:-1])", "batch, sA, sB = 1, 0, 0",
                  "gshape = tuple(lA.shape[:-1]) + (N,)"]
        lib = "torch.mm(lA.reshape(M, K), lB.t()).view(gshape)"
    else:  # bmm
        lines += ["_expect(lA.dim() == 3 and lB.dim() == 3 and lA.shape[0] == lB.shape[0] and "
                  "lA.shape[2] == lB.shape[1], 'bmm operand shapes')",
                  "batch, M, K = lA.shape", "N = lB.shape[2]", "sA, sB = M * K, K * N",
                  "gshape = (batch, M, N)"]
        lib = "torch.bmm(lA, lB)"
    lines.append("sC = M * N")
    if template == "epilogue":
        lines.append(f"l{gk} = {lib}")
    return lines


def _to_nchw(plan: Plan, target: str, layout: int) -> bool:
    """Whether the file carries assay_to_nchw: a library convolution run channels_last."""
    return bool(layout) and target == "cuda" and plan.gemm is not None and plan.gemm.op == "conv2d"


def _forward_lines(plan: Plan, target: str, template: str, layout: int = 0
                   ) -> tuple[list[str], list[tuple[str, list[_Param]]]]:
    """ModelNew.forward's body, and the kernel entry points it calls with their parameters."""
    g = plan.gemm
    gk = plan.head_leaf
    custom = template in ("gemm", "gemm_tc")
    fused = custom and plan.kind == "elementwise"
    pooled = plan.pool is not None
    if g is not None:
        lines = _gemm_lines(plan, target, template, layout)
    else:
        lines = _pool_lines(plan) if pooled else []
    for k, lf in enumerate(plan.leaves):
        if k == gk:
            continue
        if lf.source == "input":
            lines.append(f"l{k} = _tensor({lf.name}, {lf.name!r})")
        else:
            where = f"self.{lf.name}"
            lines.append(f"l{k} = _tensor(_attr(self, {lf.name!r}), {where!r})")
    a = plan.anchor
    dev = "lA" if g is not None else ("lx" if pooled else f"l{a}")
    nd, k = plan.ndim, plan.k
    what = ("the product" if g is not None else "the pooled tensor" if pooled
            else plan.leaves[a].name)
    lines.append("shape = gshape" if g is not None or pooled else f"shape = tuple(l{a}.shape)")
    lines.append(f"_expect(len(shape) == {nd}, {what + f' does not have {nd} dims'!r})")
    lines.append("n = math.prod(shape)")
    for j, lf in enumerate(plan.leaves):
        if j == gk:
            continue
        name = lf.name
        if lf.bcast == "full" and j != a:
            lines.append(f"_expect(l{j}.numel() == n, {name + ' does not match ' + what!r})")
        elif lf.bcast == "scalar":
            lines.append(f"_expect(l{j}.numel() == 1, {name + ' is not a single value'!r})")
        elif lf.bcast == "block":
            lines.append(f"inner{j} = math.prod(shape[{lf.b + 1}:])")
            lines.append(f"mid{j} = math.prod(shape[{lf.a}:{lf.b + 1}])")
            lines.append(f"_expect(l{j}.numel() == mid{j}, {name + ' does not broadcast'!r})")
    if plan.kind == "row":
        lines.append(f"cols = math.prod(shape[{nd - k}:])")
        if plan.groups:
            if plan.groups[0] == "attr":
                lines.append(f"groups = int(_attr(self, {plan.groups[1]!r}).num_groups)")
            else:
                lines.append(f"groups = {int(plan.groups[1])}")
            lines.append("_expect(groups > 0 and shape[1] % groups == 0, "
                         "'channels not divisible by the groups')")
            lines.append("cols = cols // groups")
        lines.append("rows = n // cols if cols else 0")
        if plan.out_is_row:
            keep = f" + {(1,) * k!r}" if plan.keepdim else ""
            lines.append(f"out = torch.empty(shape[:{nd - k}]{keep}, dtype=DTYPE, "
                         f"device={dev}.device)")
            lines.append("_expect(cols > 0 or rows == 0, 'a reduction over empty rows')")
        else:
            lines.append(f"out = torch.empty(shape, dtype=DTYPE, device={dev}.device)")
        lines.append("if rows == 0 or cols == 0:")
    else:
        lines.append(f"out = torch.empty(shape, dtype=DTYPE, device={dev}.device)")
        lines.append("if n == 0:")
    lines.append("    return out")
    stream = ([f"torch.cuda.current_stream({dev}.device).cuda_stream"] if target == "cuda"
              else [])
    entries: list[tuple[str, list[_Param]]] = []
    if custom:
        gp = _gemm_params(plan, target, fused)
        entries.append(("assay_gemm", gp))
        if not fused:
            lines.append(f"g = torch.empty(gshape, dtype=DTYPE, device={dev}.device)")
        lines.append(f"_check(_lib().assay_gemm({', '.join([p.py for p in gp] + stream)}))")
        if not fused:
            lines.append(f"l{gk} = g")
    if _to_nchw(plan, target, layout):
        ptr, i64 = "ctypes.c_void_p", "ctypes.c_int64"
        entries.append(("assay_to_nchw", [_Param("", "src", "", ptr), _Param("", "dst", "", ptr)]
                        + [_Param("", v, "", i64) for v in ("N", "C", "HW")]))
    if not fused:
        params = _pool_params(plan, target) if pooled else _params(plan, target)
        entries.append(("assay_forward", params))
        lines.append(f"_check(_lib().assay_forward({', '.join([p.py for p in params] + stream)}))")
    lines.append("return out")
    return lines, entries


def candidate_file(plan: Plan, target: str, knobs: dict[str, Any], summary: str,
                   task_source: str) -> str:
    """The full candidate module: the task's constructor, SOURCE, and ModelNew."""
    template = template_of(plan, knobs)
    layout = int(knobs.get("layout", 0))
    source = kernel_source(plan, target, knobs, summary)
    if _to_nchw(plan, target, layout):
        source += templates.CUDA_TO_NCHW
    forward, entries = _forward_lines(plan, target, template, layout)
    extra = ["ctypes.c_void_p"] if target == "cuda" else []
    code, future = task_prelude(task_source)
    if '"""' in source:  # never: the kernel has no triple quotes, but SOURCE is r"""..."""
        raise ValueError("kernel source contains a triple quote")
    return templates.render(
        templates.CANDIDATE, summary=summary, template=template, target=target,
        knob_line=_knob_line(knobs), knobs_repr=repr(dict(sorted(knobs.items()))),
        lang="cuda" if target == "cuda" else "cpp", source=source, task_code=code,
        future=future, inputs=list(plan.inputs),
        entries=[(name, ", ".join([p.ctypes_type for p in ps] + extra)) for name, ps in entries],
        device_type="cuda" if target == "cuda" else "cpu", forward=forward,
        policy="permissive" if template == "epilogue" else "strict",
        library=library_of(plan, target) if template == "epilogue" else "",
        dtype=plan.dtype)
