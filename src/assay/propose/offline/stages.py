"""Multi-kernel plans: a task that one kernel cannot fuse, cut into a sequence of stages.

One plan fuses one head op (a product, a convolution, a pooling) with the chain after it, and
reductions of one row shape. A task with more (every MLP, CNN block and residual block of
KernelBench's level 3, a level-2 chain with a pooling after its convolution or a reduction of a
reduced value) is cut right before the op that would not fit (the lowering says where: a
:class:`ir.NeedsCut`), and each piece becomes a plan of its own, written by its family as
usual. ``ModelNew.forward`` then runs the stages in order, each one's output an input of the
next (see :mod:`candidate`).

A cut is made only where exactly one computed value is live across it (the stage's output);
forward inputs, parameters and earlier stages' outputs may be read by any stage. So branches
that a torch.cat joins (an Inception module's four, a DenseNet block's growing list) are stages
one after the other, and the join is a stage of its own (ir.Concat). Where a cut would carry
several values, the first of them may end a kernel of its own (a DenseNet's pooling, read by the
normalization before the next convolution and by a later join); else (attention's q and k,
computed in one stretch) the task is declined with the reason.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from assay.propose.offline.graph import (RESHAPE_FUNCTIONS, SHAPE_ARITH, SIZE_METHODS, is_reshape,
                                         joined_expand, same_shape_source, shape_only,
                                         shape_value)
from assay.propose.offline.ir import PREFIX, Analysis, NeedsCut, Unsupported
from assay.propose.offline.own_kernels import (own_kernel, permute_node, recurrent_node,
                                               selections, view_chain, view_source)

# A stage's output, as the next stages' argument; and, where a view follows the stage, its
# output before the view (a later view's size queries may read it).
STAGE_INPUT = "stage{}"
STAGE_RAW = "stage{}_raw"


@dataclass(frozen=True)
class Pipeline:
    """The stages of a multi-kernel plan, in order; the last one's output is the task's.

    ``inputs`` are the forward's parameter names; each stage's ``plan.inputs`` names its own
    arguments: forward inputs, and ``stage<k>`` for the output of an earlier stage k."""

    stages: tuple[Analysis, ...]  # their shapes are one size's (ir.structure: the plans)
    inputs: tuple[str, ...]
    # Per stage: a view applied to its output before the next stages read it ("" for none), a
    # Python expression of ``{t}`` (the output), e.g. ``{t}.view({t}.size(0), -1)``; its size
    # queries may also read forward inputs and earlier stages' outputs by their names.
    views: tuple[str, ...] = ()
    # Views of the forward's inputs that the first kernels read (``view0 = x.view(x.size(0),
    # x.size(1), -1)`` before a permutation): assignments ModelNew.forward runs first.
    prelude: tuple[str, ...] = ()

    @property
    def dtype(self) -> str:
        return "float32"


def _shape_of(node: Any) -> Any:
    """The tensor whose ``x.size()`` or ``x.shape`` ``node`` is, else None."""
    if not isinstance(node, fx.Node) or len(node.args) < 1:
        return None
    if node.op == "call_method" and str(node.target) in SIZE_METHODS and len(node.args) == 1:
        return node.args[0]
    if node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",):
        return node.args[0]
    return None


def shape_expr(node: Any, src: fx.Node, names: dict[fx.Node, str] | None = None
               ) -> str | None:
    """An int argument of a view of ``src`` as a size-generic Python expression: ints, sizes
    of ``src`` (``{t}.size(d)``) or of a tensor ModelNew.forward holds by its name in
    ``names`` (a forward input, an earlier stage's output), and + - * // of those; else
    None."""
    if isinstance(node, int) and not isinstance(node, bool):
        return str(node)
    if not isinstance(node, fx.Node) or node.kwargs or not shape_value(node):
        return None

    def tensor(of: Any) -> str | None:
        # A value no kernel outputs (an activation fused into the next kernel) has the shape
        # of what it was computed from: DenseNet's relu(bn(x)).size(0) is x's.
        while of is not None and of is not src and of not in (names or {}):
            of = same_shape_source(of) if isinstance(of, fx.Node) else None
        return None if of is None else "{t}" if of is src else (names or {})[of]

    if node.op == "call_method":  # x.size(d) (x.size() alone is only read through its items)
        d = node.args[1] if len(node.args) == 2 else None
        base = tensor(node.args[0])
        return f"{base}.size({d})" if base is not None and isinstance(d, int) else None
    if node.target is operator.getitem:  # x.size()[d], x.shape[d]
        base = tensor(_shape_of(node.args[0]))
        return f"{base}.size({node.args[1]})" if base is not None else None
    if node.target in SHAPE_ARITH and len(node.args) == 2:
        left, right = (shape_expr(a, src, names) for a in node.args)
        if left is not None and right is not None:
            return f"({left} {SHAPE_ARITH[node.target]} {right})"
    return None


def view_expr(node: fx.Node, names: dict[fx.Node, str] | None = None) -> str | None:
    """The view ``node`` (of its first argument) as a size-generic expression of ``{t}``, or
    None if its arguments are not what shape_expr can write."""
    if not is_reshape(node):
        return None
    name = (RESHAPE_FUNCTIONS[node.target] if node.op == "call_function"
            else str(node.target))
    src, *args = node.args
    kwargs = dict(node.kwargs)
    if name in ("unsqueeze", "squeeze"):
        bound = dict(zip(("dim",), args), **kwargs)
        dim = bound.get("dim")
        if set(bound) - {"dim"} or not isinstance(dim, int) \
                or (name == "unsqueeze" and dim is None):
            return None
        return f"{{t}}.{name}({dim})"
    if name == "flatten":
        keys = ("start_dim", "end_dim")  # (not ``names``: that is the tensors' names)
        bound = dict(zip(keys, args), **kwargs)
        if set(bound) - set(keys) or not all(isinstance(v, int) for v in bound.values()):
            return None
        return f"{{t}}.flatten({bound.get('start_dim', 0)}, {bound.get('end_dim', -1)})"
    if kwargs:
        return None
    if len(args) == 1 and isinstance(args[0], (tuple, list)):  # view((a, b)) / reshape(x, s)
        args = list(args[0])
    parts = []
    for a in args:
        size = shape_expr(a, src, names)
        if size is None:
            return None
        parts.append(size)
    return f"{{t}}.reshape({', '.join(parts)})" if parts else None


def _more_views(view: str, carried: fx.Node, todo: list[fx.Node],
                names: dict[fx.Node, str]) -> tuple[str, fx.Node, list[fx.Node]]:
    """Fold the views that follow a boundary's view of ``carried`` (each the only reader of
    the one before, sizes aside) into its expression; ``.contiguous()`` of a fresh output or of
    a view of one is the same tensor."""
    while True:
        nxt = next((n for n in todo if not shape_only(n)), None)
        if nxt is None or not nxt.args or nxt.args[0] is not carried:
            return view, carried, todo
        contiguous = (nxt.op == "call_method" and str(nxt.target) == "contiguous"
                      and len(nxt.args) == 1 and not nxt.kwargs)
        more = "{t}" if contiguous else view_expr(nxt, names)
        if more is None or any(u is not nxt and not shape_only(u) for u in carried.users):
            return view, carried, todo
        view = more.format(t=view)
        todo = [n for n in todo if n is not nxt]
        carried = nxt


def _live_across(nodes: list[fx.Node], cut: fx.Node) -> list[fx.Node]:
    """The computed values before ``cut`` that ``cut`` or a later node reads."""
    order = {n: i for i, n in enumerate(nodes)}
    at = order[cut]
    return [n for n in nodes[:at] if n.op not in ("placeholder", "get_attr")
            and not shape_only(n) and any(order[u] >= at for u in n.users)]


def _subgraph(gm: fx.GraphModule, nodes: list[fx.Node], output: fx.Node,
              inputs: dict[fx.Node, str]) -> tuple[fx.GraphModule, dict[fx.Node, fx.Node]]:
    """A graph of ``nodes`` (computed ones; the parameters they read are copied in) whose
    arguments are ``inputs`` (a forward input or an earlier stage's output -> its name) and
    whose result is ``output``, and its nodes' originals. Its root is the task's model:
    modules and parameters resolve there."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    nodes = _with_shapes_read([n for n in nodes if not shape_value(n)])
    needed = {a for n in nodes for a in n.all_input_nodes} | {output}
    for src, name in inputs.items():  # forward inputs first, in order, then stage outputs
        if src in needed:
            env[src] = g.placeholder(name)
            env[src].meta = dict(src.meta)
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in env and a.op == "get_attr":
                env[a] = g.node_copy(a)
            if a not in env:  # the size of a value an earlier kernel computed inside itself
                raise Unsupported(f"{PREFIX} {n.name} reads {a.name}, a value inside another "
                                  f"kernel")
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(env[output])
    return fx.GraphModule(gm, g), {copy: src for src, copy in env.items()}


def _with_shapes_read(nodes: list[fx.Node]) -> list[fx.Node]:
    """``nodes`` and the shape values they read (a view's sizes, wherever they were computed),
    with the shape values those read, in graph order."""
    held = set(nodes)
    todo = [a for n in nodes for a in n.all_input_nodes if shape_value(a)]
    while todo:
        a = todo.pop()
        if a not in held:
            held.add(a)
            todo += [b for b in a.all_input_nodes if shape_value(b)]
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    return sorted(held, key=order.__getitem__)


def _end_at_first(gm: fx.GraphModule, analyze: Callable[[fx.GraphModule], Analysis],
                  names: dict[fx.Node, str], todo: list[fx.Node], live: list[fx.Node],
                  forward_inputs: list[fx.Node], output: fx.Node
                  ) -> tuple[Analysis, fx.Node] | None:
    """Where a cut would carry several values: a kernel that ends at the first of them, if
    that one alone is live right after it and one kernel can compute it; else None."""
    first = min(live, key=todo.index)
    end = todo.index(first) + 1
    if end >= len(todo) or _live_across(forward_inputs + todo + [output], todo[end]) != [first]:
        return None
    try:
        return analyze(_subgraph(gm, todo[:end], first, names)[0]), first
    except Unsupported:
        return None


def _own_stage(gm: fx.GraphModule, analyze: Callable[[fx.GraphModule], Analysis],
               names: dict[fx.Node, str], todo: list[fx.Node], at: fx.Node
               ) -> tuple[Analysis, str, fx.Node, fx.Node, list[fx.Node]]:
    """The stage of a node that is a kernel of its own (own_kernel), with the items of an
    RNN's result that select the tensor read (or the strided views after a strided view,
    copied once) and the views of its output folded in: (stage,
    view expression, its output, the value the next stages read, what is left to do)."""
    mine = ([at] + selections(at) if recurrent_node(at)
            else view_chain(at) if permute_node(at) else [at])
    stage = analyze(_subgraph(gm, mine, mine[-1], names)[0])
    rest = [n for n in todo[todo.index(at) + 1:] if n not in mine]
    view, carried, rest = _more_views("{t}", mine[-1], rest, names)
    return stage, view, mine[-1], carried, rest


def _output_view(at: fx.Node, todo: list[fx.Node], out: fx.Node, names: dict[fx.Node, str]
                 ) -> str | None:
    """Where ``at`` is a strided view of a value (``x.permute(1, 2, 0)``, ``x[:, 0]``,
    ``x.unfold(1, 4, 2)``) and only views of that follow it up to the task's output ``out``
    (ViT's ``x.permute(1, 2, 0).view(B, C, H, W)``): those views as one expression of ``{t}``
    (the value viewed), else None. No ``.contiguous()`` among them: after a permutation that is
    a copy with other strides."""
    expr, carried = _strided_view(at), at
    if expr is None:
        return None
    chain = [at]
    for n in todo[todo.index(at) + 1:]:
        if shape_only(n):
            continue
        # views, and further permutations and indexing (a slice of einsum's permuted result)
        more = (view_expr(n, names) or _strided_view(n)) if n.args and n.args[0] is carried \
            else None
        if more is None or any(u is not n and not shape_only(u) for u in carried.users):
            return None
        expr, carried = more.format(t=expr), n
        chain.append(n)
    if carried is not out or not _viewed_as_traced(chain):
        return None  # a reshape torch could not view copied it: the permutation is a copy
    return expr


def _strided_view(node: fx.Node) -> str | None:
    """A strided view of its first argument (a permutation, basic indexing, sliding windows:
    own_kernels.view_source) as an expression of ``{t}``, else None."""
    source = view_source(node)
    return None if source is None else "{t}" + source


def _viewed_as_traced(chain: list[fx.Node]) -> bool:
    """Whether the views, permutations and indexing of ``chain``, applied to a fresh
    (contiguous) tensor, give the strides the traced graph's last node has: not where a
    reshape of a permuted value merged dims it had separated (einops' ``b c l p -> b (c l) p``
    after a permute), which torch copies."""
    def meta(node: Any) -> Any:
        tm = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
        return tm if hasattr(tm, "stride") else None

    source, last = meta(chain[0].args[0]), meta(chain[-1])
    if source is None or last is None:
        return False
    t = torch.empty(tuple(source.shape), device="meta")
    for node in chain:
        strided = _strided_view(node)
        if strided is not None:
            # (the view's own source: ints, slices, None and ...)
            t = eval(strided.format(t="t"), {"t": t})  # noqa: S307
        elif meta(node) is not None:
            t = t.reshape(tuple(meta(node).shape))
        else:
            return False
    return all(a == b for a, b, size in zip(t.stride(), last.stride, last.shape) if size != 1)


def _forward_view(node: fx.Node, expr: str, names: dict[fx.Node, str],
                  prelude: dict[fx.Node, str]) -> None:
    """``node`` made by ModelNew.forward before the first kernel, as the line ``view<k> =
    expr`` of ``prelude`` (in the forward's order), and named so in ``names`` for the stages
    that read it."""
    names[node] = f"view{len(prelude)}"
    prelude[node] = f"{names[node]} = {expr}"


def _joined_parameters(todo: list[fx.Node], names: dict[fx.Node, str],
                       prelude: dict[fx.Node, str]) -> list[fx.Node]:
    """Parameters expanded over sizes of the forward's inputs and joined by a torch.cat
    (ViT's class token, ``self.cls_token.expand(x.size(0), -1, -1)``), made by the forward
    (:func:`_forward_view`): a join reads only arguments, and such a part is no kernel's
    output. The nodes made."""
    made = []
    for n in todo:
        if not joined_expand(n):
            continue
        sizes = [shape_expr(a, n.args[0], names) for a in n.args[1:]]
        if any(e is None or "{t}" in e for e in sizes):
            continue
        _forward_view(n, f"{_parameter_expr(n.args[0])}.expand({', '.join(sizes)})", names,
                      prelude)
        made.append(n)
    return made


def _input_views(nodes: list[fx.Node], names: dict[fx.Node, str],
                 prelude: dict[fx.Node, str]) -> bool:
    """``nodes`` (views and size queries of the forward's inputs), their views made by the
    forward (:func:`_forward_view`, size-generic); False, and nothing made, where one is not a
    view of a named tensor that view_expr can write."""
    views = [n for n in nodes if is_reshape(n)]  # (the views' expressions read the sizes)
    exprs = []
    for n in views:
        src = n.args[0] if n.args else None
        # a view of a parameter too (einops' blocks of Mamba2's A, B, C); not of a stage's
        # output, which the forward has not computed before the first kernel: only its
        # inputs and the views it made already are
        if src in names and not (src.op == "placeholder" or src in prelude):
            return False
        viewed = names.get(src) if src in names else _parameter_expr(src)
        expr = view_expr(n, names) if viewed is not None else None
        if expr is None:
            return False
        exprs.append(expr.format(t=viewed))
    for n, expr in zip(views, exprs):
        _forward_view(n, expr, names, prelude)
    return bool(views)


def _parameter_expr(node: Any) -> str | None:
    """The candidate's expression of a model tensor that ``node`` reads (``get_attr``)."""
    if isinstance(node, fx.Node) and node.op == "get_attr":
        return f"_attr(self, {str(node.target)!r})"
    return None


def _views_after_sources(gm: fx.GraphModule) -> None:
    """Move each view of a computed value whose sizes are numbers right after the value it
    views (einsum_products reshapes an operand just before the product, the slice of it may
    be far earlier), so that a stage's view folds into its boundary (:func:`_more_views`)."""
    for node in list(gm.graph.nodes):
        src = node.args[0] if node.args else None
        if (is_reshape(node) and isinstance(src, fx.Node) and node.all_input_nodes == [src]
                and src.op not in ("placeholder", "get_attr") and src.next is not node):
            src.append(node)


def split(gm: fx.GraphModule, analyze: Callable[[fx.GraphModule], Analysis]) -> Analysis:
    """Cut ``gm`` (traced, shapes propagated) into stages; ``analyze`` lowers one stage's
    graph into an :class:`Analysis`, raising :class:`NeedsCut` where it must end."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    out = output.args[0]
    if isinstance(out, (tuple, list)):
        if len(out) != 1:
            raise Unsupported(f"{PREFIX} a forward returning {len(out)} tensors (v1 writes one "
                              f"output)")
        out = out[0]
    _views_after_sources(gm)
    forward_inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names: dict[fx.Node, str] = {n: str(n.target) for n in forward_inputs}
    stages: list[Analysis] = []
    views: list[str] = []
    prelude: dict[fx.Node, str] = {}
    todo = [n for n in gm.graph.nodes if n.op not in ("placeholder", "get_attr", "output")]
    joined = set(_joined_parameters(todo, names, prelude))  # the forward expands them
    todo = [n for n in todo if n not in joined]
    while True:
        first = next((n for n in todo if not shape_only(n)), None)
        tail = _output_view(first, todo, out, names) if first is not None and stages else None
        if tail is not None and names.get(first.args[0]) == STAGE_INPUT.format(len(stages) - 1):
            # the task returns a permuted or indexed view of the last kernel's output: so does
            # the candidate (its strides are the reference's; a copy's would not be)
            views[-1] = tail.format(t=views[-1]) if views[-1] else tail
            break
        sub, original = _subgraph(gm, todo, out, names)
        try:
            stages.append(analyze(sub))
            views.append("")
            break
        except NeedsCut as cut:
            at = original.get(cut.before)
            if at not in todo:  # pragma: no cover - every cut names a node of the graph
                raise Unsupported(str(cut)) from None
            view = view_expr(at, names)
            # Sizes read by views belong to the views, not to a kernel.
            sizes = [n for n in todo if shape_only(n)]
            before = [n for n in todo[:todo.index(at)] if n not in sizes]
            if not before and own_kernel(at):  # a join, a permutation, an RNN
                stage, view, end, carried, todo = _own_stage(gm, analyze, names, todo, at)
                stages.append(stage)
                views.append("" if view == "{t}" else view)
                if view != "{t}":
                    names[end] = STAGE_RAW.format(len(stages) - 1)
                names[carried] = STAGE_INPUT.format(len(stages) - 1)
                if carried is out:
                    break
                continue
            if not before:
                raise Unsupported(str(cut)) from None
            if all(is_reshape(n) or str(n.target) in SIZE_METHODS for n in before):
                # views of the inputs only: the forward makes them, the kernels read them
                if not _input_views(before, names, prelude):
                    raise Unsupported(f"{cut} (what precedes it views the forward's inputs "
                                      f"and computes nothing: v1 has no kernel to end "
                                      f"there)") from None
                todo = [n for n in todo if n not in before]
                continue
            live = [n for n in _live_across(forward_inputs + todo + [output], at)
                    if n not in sizes]
            if view is not None and live != [at.args[0]]:
                raise Unsupported(f"{cut}: a view of a value that is also read elsewhere") \
                    from None
            if len(live) != 1:
                why = (f"{cut} (a kernel boundary there would carry {len(live)} values: "
                       f"{', '.join(n.name for n in live)})")
                early = None if view is not None else _end_at_first(gm, analyze, names, todo,
                                                                    live, forward_inputs,
                                                                    output)
                if early is None:
                    raise Unsupported(why) from None
                # The first of them ends a kernel of its own (a pooling whose output a later
                # join reads, before the normalization that feeds the convolution here); the
                # rest is tried again from there.
                stage, first = early
                stages.append(stage)
                views.append("")
                todo = todo[todo.index(first) + 1:]
                names[first] = STAGE_INPUT.format(len(stages) - 1)
                continue
            stages.append(analyze(_subgraph(gm, before, live[0], names)[0]))
            carried = at if view is not None else live[0]
            todo = todo[todo.index(at) + (1 if view is not None else 0):]
            if view is not None:  # views of the view (x.squeeze(-1).squeeze(-1)) fold into it
                view, carried, todo = _more_views(view, carried, todo, names)
                names[live[0]] = STAGE_RAW.format(len(stages) - 1)
            views.append(view or "")
            names[carried] = STAGE_INPUT.format(len(stages) - 1)
            if carried is out:  # the task returns the view: the last stage was the last kernel
                break
    if len(stages) == 1 and not views[0] and not prelude:  # pragma: no cover - tried whole
        raise Unsupported(f"{PREFIX} this task")
    pipeline = Pipeline(tuple(stages), tuple(str(n.target) for n in forward_inputs),
                        tuple(views), tuple(prelude.values()))
    ops = tuple(dict.fromkeys(op for st in stages for op in st.ops))
    summary = f"{len(stages)} kernels: " + "; ".join(st.summary for st in stages)
    if len(summary) > 160:
        summary = f"{len(stages)} kernels fusing {', '.join(ops)}"
    return Analysis(pipeline, stages[-1].shape, ops, summary)
