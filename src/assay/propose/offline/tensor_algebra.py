"""Graph rewrites of index notation into the ops the planner expresses.

Both run after shape propagation, so that every size is known:

* :func:`einops_calls`: ``einops.rearrange``/``reduce``/``repeat`` of a traced value. The
  tracer records each call as one node (:data:`EINOPS_FUNCTIONS`, wrapped like ``math``'s
  functions); the rewrite runs einops itself on a stand-in tensor (:class:`_Recorder`) whose
  backend appends to the graph each op einops' recipe applies (reshape, permute, a reduction,
  new axes expanded), with the sizes einops computes at the analysed shapes.
* :func:`einsum_products`: ``torch.einsum`` of one or more operands becomes sums over the
  subscripts one operand alone carries, then pairwise contractions, each a batched product
  (``torch.matmul`` of the operands permuted and reshaped to ``[batch, M, K]`` and
  ``[batch, K, N]``) or, with nothing to contract, a broadcast multiply; the pair contracted
  next is the one whose result is smallest (greedy), the last result laid out as
  torch.einsum's own (its strides at the analysed size), since the verifier compares strides.

The sizes of the reshapes both make are the analysed size's numbers: the rewritten graph
serves that size only.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
from torch import fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from assay.propose.offline.fx_edits import recompile, replace_node
from assay.propose.offline.ir import PREFIX, Unsupported

try:
    import einops
    from einops._backends import AbstractBackend
except ImportError:  # einops is a dependency; a task that imports it fails to load without it
    einops = None
    AbstractBackend = object

# The einops functions the tracer records as one node each (a traced value has no shape for
# einops to read while tracing); einops.einsum is torch.einsum with named axes, not handled.
EINOPS_FUNCTIONS: tuple[Callable, ...] = (
    (einops.rearrange, einops.reduce, einops.repeat) if einops is not None else ())
_REDUCTIONS = ("sum", "mean", "max", "min", "prod")


def _tensor_meta(node: fx.Node) -> Any:
    """``node``'s propagated shape, dtype and strides."""
    tm = node.meta.get("tensor_meta")
    if not hasattr(tm, "shape"):
        raise Unsupported(f"{PREFIX} {node.name}: no shape was propagated to it")
    return tm


class _Recorder:
    """A value of the graph being rewritten as einops sees it: the fx proxy that appends ops
    and a meta tensor of its shape and dtype, which each op is also applied to, so that the
    next op's shape is known."""

    def __init__(self, proxy: fx.Proxy, meta: torch.Tensor) -> None:
        self.proxy, self.meta = proxy, meta

    def apply(self, method: str, *args: Any, **kwargs: Any) -> "_Recorder":
        proxy = getattr(self.proxy, method)(*args, **kwargs)
        meta = getattr(self.meta, method)(*args, **kwargs)
        # its shape for a later rewrite reading it (einops of einops' result)
        proxy.node.meta["tensor_meta"] = _extract_tensor_metadata(meta)
        return _Recorder(proxy, meta)


class _RecorderBackend(AbstractBackend):
    """einops' backend for :class:`_Recorder`: the ops einops' torch backend would call, each
    recorded. einops finds a backend among ``AbstractBackend``'s subclasses whose
    ``framework_name`` is an imported module: this one's."""

    framework_name = __name__

    def is_appropriate_type(self, tensor: Any) -> bool:
        return isinstance(tensor, _Recorder)

    def shape(self, x: _Recorder) -> tuple[int, ...]:
        return tuple(x.meta.shape)

    def reshape(self, x: _Recorder, shape: Any) -> _Recorder:
        return x.apply("reshape", tuple(int(d) for d in shape))

    def transpose(self, x: _Recorder, axes: Any) -> _Recorder:
        return x.apply("permute", tuple(int(a) for a in axes))

    def reduce(self, x: _Recorder, operation: str, axes: Any) -> _Recorder:
        dims = tuple(int(a) for a in axes)
        if operation in ("max", "min"):
            return x.apply("amax" if operation == "max" else "amin", dim=dims)
        if operation in ("sum", "mean"):
            return x.apply(operation, dim=dims)
        for d in sorted(dims, reverse=True):  # prod: torch reduces one dim at a time
            x = x.apply(operation, dim=d)
        return x

    def add_axis(self, x: _Recorder, new_position: int) -> _Recorder:
        return x.apply("unsqueeze", int(new_position))

    def add_axes(self, x: _Recorder, n_axes: int, pos2len: dict) -> _Recorder:
        sizes = [-1] * n_axes
        for position, length in pos2len.items():
            x = self.add_axis(x, position)
            sizes[position] = int(length)
        return x.apply("expand", tuple(sizes))

    def is_float_type(self, x: _Recorder) -> bool:
        return x.meta.dtype.is_floating_point


def _einops_why_not(node: fx.Node) -> str | None:
    """Why an einops call is not rewritten, else None."""
    name = f"einops.{node.target.__name__}"
    if not node.args or not isinstance(node.args[0], fx.Node):
        return f"{name} of a list of tensors (stack them with torch.stack first)"
    if node.target is einops.reduce:
        reduction = node.args[2] if len(node.args) > 2 else node.kwargs.get("reduction")
        if reduction not in _REDUCTIONS:
            return f"{name} with reduction {reduction!r} (only {', '.join(_REDUCTIONS)})"
    if any(isinstance(a, fx.Node) for a in list(node.args[1:]) + list(node.kwargs.values())):
        return f"{name} with a pattern or axis length computed while tracing"
    return None


def einops_decline(error: BaseException) -> Unsupported | None:
    """The decline of an einops call that failed while shapes were propagated (a pattern
    that does not fit its tensor: einops' own message), or None for other errors."""
    while error is not None:
        if einops is not None and isinstance(error, einops.EinopsError):
            return Unsupported(f"{PREFIX} an einops call: {' '.join(str(error).split())}")
        error = error.__cause__
    return None


def einops_calls(gm: fx.GraphModule) -> bool:
    """Rewrite each einops call recorded while tracing into the torch ops its recipe applies
    at the analysed shapes (see the module's doc). Whether anything changed (the new nodes
    need their shapes). Needs the shapes (``tensor_meta``); a call not rewritten raises
    Unsupported saying why."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if not (node.op == "call_function" and node.target in EINOPS_FUNCTIONS):
            continue
        why = _einops_why_not(node)
        if why is not None:
            raise Unsupported(f"{PREFIX} {why}")
        x = node.args[0]
        tm = _tensor_meta(x)
        tracer = fx.proxy.GraphAppendingTracer(graph)
        source = _Recorder(fx.Proxy(x, tracer),
                           torch.empty(tuple(tm.shape), dtype=tm.dtype, device="meta"))
        with graph.inserting_before(node):
            try:
                out = node.target(source, *node.args[1:], **node.kwargs)
            except einops.EinopsError as e:
                raise Unsupported(f"{PREFIX} einops.{node.target.__name__}: "
                                  f"{' '.join(str(e).split())}") from None
        replace_node(node, out.proxy.node if out is not source else x, same_shape=False)
        changed = True
    if changed:
        recompile(gm)
    return changed


def einsum_call(node: fx.Node) -> tuple[str, list[Any]] | None:
    """(equation, operands) of a ``torch.einsum`` call written as an equation and operands
    (as arguments or one list), else None (the sublist form, keyword arguments)."""
    args = list(node.args)
    if not args or not isinstance(args[0], str) or node.kwargs:
        return None
    ops = args[1:]
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    return args[0], ops


def product_form(equation: str, n_operands: int) -> str | None:
    """The library product an einsum is, without any reshaping: ``P c, c k -> P k`` (``mm``
    over the leading subscripts P, e.g. ``bijl,lk->bijk``), ``P c, k c -> P k`` (``linear``)
    or ``b i c, b c k -> b i k`` (``bmm``); else None."""
    if n_operands != 2 or "->" not in equation or "." in equation:
        return None
    lhs, out = equation.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in terms + [out]):
        return None
    a, b = terms
    if len(b) == 2 and len(a) >= 2:
        c = a[-1]
        if b == c + out[-1] and out == a[:-1] + b[1] and b[1] not in a:
            return "mm"  # P c, c k -> P k
        if b == out[-1] + c and out == a[:-1] + b[0] and b[0] not in a:
            return "linear"  # P c, k c -> P k
    elif len(a) == len(b) == len(out) == 3 and a[0] == b[0] == out[0]:
        if a[2] == b[1] and out == a[:2] + b[2] and len({a[1], a[2], b[2]}) == 3:
            return "bmm"  # b i c, b c k -> b i k
    return None


def _subscripts(equation: str, n_operands: int) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, the output implicit where the equation has
    no ``->`` (the subscripts written once, in alphabetical order, as torch.einsum reads it);
    raises Unsupported for what the rewrite does not handle."""
    why = f"{PREFIX} torch.einsum {equation!r}"
    eq = equation.replace(" ", "")
    if "." in eq:
        raise Unsupported(f"{why}: an ellipsis ('...'; write the subscripts out)")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_operands:
        raise Unsupported(f"{why}: {len(terms)} subscript terms for {n_operands} operands")
    if not all(t.isalpha() for t in terms) or not (out.isalpha() or out == ""):
        raise Unsupported(f"{why}: subscripts other than letters")
    if not arrow:
        letters = "".join(terms)
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for t in terms:
        if len(set(t)) != len(t):
            raise Unsupported(f"{why}: a subscript repeated within one operand ({t!r}: a "
                              f"diagonal)")
    if len(set(out)) != len(out) or any(c not in lhs for c in out):
        raise Unsupported(f"{why}: an output subscript repeated or in no operand")
    return terms, out


class _Term:
    """An operand (or an intermediate result) of the einsum being rewritten: its proxy and
    its subscripts, one per dim."""

    def __init__(self, proxy: fx.Proxy, subs: str) -> None:
        self.proxy, self.subs = proxy, subs

    def arranged(self, order: str, sizes: dict[str, int], shape: list[int] | None = None
                 ) -> fx.Proxy:
        """Its dims permuted to ``order`` (a permutation of its subscripts), then reshaped
        to ``shape``; each op left out where it changes nothing."""
        p = self.proxy
        if order != self.subs:
            p = p.permute(tuple(self.subs.index(c) for c in order))
        if shape is not None and tuple(shape) != tuple(sizes[c] for c in order):
            p = p.reshape(tuple(shape))
        return p


def _roles(a: _Term, b: _Term, keep: set[str]) -> tuple[str, str, str, str]:
    """The subscripts of a product of ``a`` and ``b``: (batch: shared and kept, summed: shared
    and not kept, a's own, b's own), each in the order ``a`` (or ``b``) has them."""
    return ("".join(c for c in a.subs if c in b.subs and c in keep),
            "".join(c for c in a.subs if c in b.subs and c not in keep),
            "".join(c for c in a.subs if c not in b.subs),
            "".join(c for c in b.subs if c not in a.subs))


def _permutes(a: _Term, b: _Term, keep: set[str]) -> int:
    """How many of the two operands :func:`_contract` would permute (a copy each) with ``a``
    on the left."""
    batch, summed, m, n = _roles(a, b, keep)
    return int(a.subs != batch + m + summed) + int(b.subs not in (batch + summed + n,
                                                                  batch + n + summed))


def _contract(a: _Term, b: _Term, keep: set[str], sizes: dict[str, int]) -> _Term:
    """The product of two terms summed over the subscripts they share that ``keep`` lacks:
    a batched product (``torch.matmul`` over the shared subscripts kept, flattened into one
    batch dim, of ``[M, K]`` and ``[K, N]``), or a broadcast multiply where nothing is summed
    (then summed, where each term's subscripts are all shared: a dot product per batch).
    The result's subscripts: the shared ones kept, then a's own, then b's own."""
    batch, summed, m, n = _roles(a, b, keep)
    size = (lambda s: math.prod(sizes[c] for c in s))
    if not summed:
        left = a.arranged(batch + m, sizes, [sizes[c] for c in batch + m] + [1] * len(n))
        right = b.arranged(batch + n, sizes,
                           [sizes[c] for c in batch] + [1] * len(m) + [sizes[c] for c in n])
        return _Term(operator.mul(left, right), batch + m + n)
    if not m and not n:  # a product of 1 x 1 matrices: multiply, then sum
        both = a.arranged(batch + summed, sizes) * b.arranged(batch + summed, sizes)
        return _Term(both.sum(dim=tuple(range(len(batch), len(batch + summed)))), batch)
    lead = [size(batch)] if batch else []
    left = a.arranged(batch + m + summed, sizes, lead + [size(m), size(summed)])
    if b.subs == batch + n + summed:  # read transposed in place (Gemm.trans_b)
        right = b.arranged(b.subs, sizes, lead + [size(n), size(summed)]).transpose(-2, -1)
    else:
        right = b.arranged(batch + summed + n, sizes, lead + [size(summed), size(n)])
    product = torch.matmul(left, right)
    out = batch + m + n
    shape = tuple(sizes[c] for c in out)
    if tuple(lead + [size(m), size(n)]) != shape:
        product = product.reshape(shape)
    return _Term(product, out)


def _sum_private(term: _Term, others: list[_Term], out: str) -> _Term:
    """``term`` summed over the subscripts that neither the output nor another term has."""
    needed = set(out).union(*(t.subs for t in others))
    private = [i for i, c in enumerate(term.subs) if c not in needed]
    if not private:
        return term
    return _Term(term.proxy.sum(dim=tuple(private)),
                 "".join(c for c in term.subs if c in needed))


def _lower_einsum(graph: fx.Graph, node: fx.Node, equation: str, operands: list[Any]) -> None:
    """Append the ops ``torch.einsum(equation, *operands)`` stands for before ``node`` and
    point its readers at them, ``node`` erased (see the module's doc)."""
    why = f"{PREFIX} torch.einsum {equation!r}"
    if not all(isinstance(o, fx.Node) for o in operands):
        raise Unsupported(f"{why}: an operand that is not a tensor of the graph")
    subs, out = _subscripts(equation, len(operands))
    sizes: dict[str, int] = {}
    for o, s in zip(operands, subs):
        shape = tuple(_tensor_meta(o).shape)
        if len(shape) != len(s):
            raise Unsupported(f"{why}: operand {s!r} has {len(shape)} dims")
        for c, d in zip(s, shape):
            if sizes.setdefault(c, int(d)) != int(d):
                raise Unsupported(f"{why}: subscript {c!r} has sizes {sizes[c]} and {d} "
                                  f"(broadcast size-1 dims)")
    tracer = fx.proxy.GraphAppendingTracer(graph)
    terms = [_Term(fx.Proxy(o, tracer), s) for o, s in zip(operands, subs)]
    with graph.inserting_before(node):
        terms = [_sum_private(t, terms[:i] + terms[i + 1:], out) for i, t in enumerate(terms)]
        while len(terms) > 1:
            def kept(i: int, j: int) -> set[str]:
                rest = [t.subs for k, t in enumerate(terms) if k not in (i, j)]
                return set(terms[i].subs + terms[j].subs) & set(out).union(*rest)
            pairs = [(i, j) for i in range(len(terms)) for j in range(i + 1, len(terms))]
            # the pair whose result is smallest; among equals, the first
            i, j = min(pairs, key=lambda p: math.prod(sizes[c] for c in kept(*p)))
            if _permutes(terms[j], terms[i], kept(i, j)) < _permutes(terms[i], terms[j],
                                                                     kept(i, j)):
                i, j = j, i  # the order that copies less (a parameter read in place)
            done = _contract(terms[i], terms[j], kept(i, j), sizes)
            terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [done]
        last = _sum_private(terms[0], [], out)
        # torch.einsum's own layout (its strides at the analysed size): the output's dims in
        # that memory order made contiguous, then viewed in the output's order, so a reader
        # of the strides (a view of it, the task's output) sees what the reference does
        stride = tuple(_tensor_meta(node).stride)
        memory = "".join(out[d] for d in sorted(range(len(out)), key=lambda d: -stride[d]))
        result = last.arranged(memory, sizes)
        if memory != last.subs:
            result = result.contiguous()
        if memory != out:
            result = result.permute(tuple(memory.index(c) for c in out))
    if result.node not in operands:  # einsum's shape and strides, for a later rewrite
        result.node.meta["tensor_meta"] = node.meta["tensor_meta"]
    replace_node(node, result.node, same_shape=False)


def einsum_products(gm: fx.GraphModule) -> bool:
    """Rewrite each ``torch.einsum`` that is not one library product as it stands
    (:func:`product_form`) into sums, products and broadcast multiplies (see the module's
    doc). Whether anything changed (the new nodes need their shapes). Needs the shapes
    (``tensor_meta``); an einsum the rewrite cannot express raises Unsupported saying why."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if not (node.op == "call_function" and node.target in EINSUMS):
            continue
        call = einsum_call(node)
        if call is None:
            raise Unsupported(f"{PREFIX} torch.einsum in the sublist form or with keywords")
        equation, operands = call
        if product_form(equation, len(operands)) is not None:
            continue  # one product of the gemm family as it stands
        _lower_einsum(graph, node, equation, operands)
        changed = True
    if changed:
        recompile(gm)
    return changed


EINSUMS = frozenset({torch.einsum, getattr(torch.functional, "einsum", torch.einsum)})
