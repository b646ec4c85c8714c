"""The ops that are a kernel of their own in a multi-kernel plan, on the fx graph: ``torch.cat``
(:class:`~assay.propose.offline.ir.Concat`), a permutation or basic indexing made contiguous
(:class:`~assay.propose.offline.ir.Permute`), ``nn.GRU``/``nn.LSTM``
(:class:`~assay.propose.offline.ir.Recurrent`), the cross-entropy loss
(:class:`~assay.propose.offline.ir.CrossEntropy`) and multi-head self-attention of a packed
projection (:class:`~assay.propose.offline.ir.Attention`: a :func:`packed_attention` node, which
``rewrites.attention_blocks`` writes for the block). The ``*_node`` predicates say where
:mod:`stages` cuts around them; the ``*_of`` functions plan a stage that is one of them.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from assay.propose.offline.ir import (PERMUTE_MAX_DIMS, PREFIX, Analysis, Attention, Concat,
                                      CrossEntropy, Permute, Recurrent, Unsupported)


def zero_padded_cat(tensors: list, dim: int = 0) -> torch.Tensor:
    """``torch.cat(tensors, dim)`` where an int in ``tensors`` stands for that many slices of
    zeros along ``dim`` (``rewrites.zero_joins``: a ``torch.zeros_like`` part, ``F.pad``): the
    concat kernel writes them, no tensor of zeros is made."""
    ref = next(t for t in tensors if isinstance(t, torch.Tensor))
    d = dim % ref.dim()
    return torch.cat([t if isinstance(t, torch.Tensor) else
                      ref.new_zeros(ref.shape[:d] + (t,) + ref.shape[d + 1:]) for t in tensors],
                     dim)


CATS = {torch.cat, torch.concat, torch.concatenate, zero_padded_cat}

PERMUTE_METHODS = {"permute", "transpose", "swapaxes", "swapdims"}

PERMUTE_FUNCTIONS = {torch.permute: "permute", torch.transpose: "transpose",
                     torch.swapaxes: "transpose", torch.swapdims: "transpose"}


def concat_node(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in CATS


def permute_node(node: fx.Node) -> bool:
    """A strided view copied: a permutation, basic indexing of a tensor (``x[:, -1]``), sliding
    windows (``x.unfold(2, 4, 4)``)."""
    return ((node.op == "call_method" and str(node.target) in PERMUTE_METHODS)
            or (node.op == "call_function" and node.target in PERMUTE_FUNCTIONS)
            or index_source(node) is not None or unfold_source(node) is not None)


def unfold_source(node: fx.Node) -> str | None:
    """``.unfold(dim, size, step)`` for ``Tensor.unfold`` of a tensor by ints (a view: dim
    ``dim`` becomes the windows' starts, every ``step`` elements, and a last dim of ``size``
    the windows' elements; windows may overlap or skip elements), else None."""
    if node.op != "call_method" or str(node.target) != "unfold" or not node.args \
            or not isinstance(node.args[0], fx.Node):
        return None
    bound = dict(zip(("dimension", "size", "step"), node.args[1:]), **node.kwargs)
    if len(node.args) > 4 or set(bound) != {"dimension", "size", "step"} or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in bound.values()):
        return None
    return f".unfold({bound['dimension']}, {bound['size']}, {bound['step']})"


def view_source(node: fx.Node) -> str | None:
    """A strided view node (:func:`permute_node`) as Python source after its first argument
    (``[:, -1]``, ``.permute(1, 0, 2)``, ``.unfold(2, 4, 4)``), else None (arguments it cannot
    write, or an argument whose shape is unknown)."""
    index = index_source(node)
    if index is not None:
        return index
    unfold = unfold_source(node)
    if unfold is not None:
        return unfold
    perm = permutation(node)
    return None if perm is None else f".permute{perm}"


def view_chain(node: fx.Node) -> list[fx.Node]:
    """``node`` (a strided view) and the strided views that follow it, each the only reader of
    the one before (``x.unfold(2, p, p).unfold(3, p, p)``): one copy of the last view, not one
    per view."""
    chain = [node]
    while len(chain[-1].users) == 1:
        nxt = next(iter(chain[-1].users))
        if not nxt.args or nxt.args[0] is not chain[-1] or view_source(nxt) is None:
            break
        chain.append(nxt)
    return chain


def index_source(node: fx.Node) -> str | None:
    """``[...]`` for a getitem of a tensor by ints, slices of ints, None and Ellipsis (basic
    indexing: a view), else None."""
    if node.op != "call_function" or node.target is not operator.getitem \
            or not isinstance(node.args[0], fx.Node) \
            or not hasattr(node.args[0].meta.get("tensor_meta"), "shape"):
        return None
    items = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)

    def one(v: Any) -> str | None:
        if v is None:
            return "None"
        if v is Ellipsis:
            return "..."
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        if isinstance(v, slice):
            parts = (v.start, v.stop, v.step)
            if not all(p is None or (isinstance(p, int) and not isinstance(p, bool))
                       for p in parts):
                return None
            text = ":".join("" if p is None else str(p) for p in parts[:2])
            return text + (f":{v.step}" if v.step is not None else "")
        return None

    rendered = [one(v) for v in items]
    if not items or any(r is None for r in rendered):
        return None
    return "[" + ", ".join(rendered) + ("," if len(rendered) == 1 and isinstance(
        node.args[1], tuple) else "") + "]"


RECURRENT_MODULES = {nn.GRU: "gru", nn.LSTM: "lstm"}


def module_of(node: fx.Node) -> nn.Module | None:
    """The module a call_module node calls, else None."""
    owner = node.graph.owning_module
    if node.op != "call_module" or owner is None:
        return None
    try:
        return owner.get_submodule(str(node.target))
    except AttributeError:
        return None


def recurrent_node(node: fx.Node) -> bool:
    return type(module_of(node)) in RECURRENT_MODULES


def xent_node(node: fx.Node) -> bool:
    return ((node.op == "call_function" and node.target is F.cross_entropy)
            or isinstance(module_of(node), nn.CrossEntropyLoss))


def own_kernel(node: fx.Node) -> bool:
    """A node that is a kernel of its own in a multi-kernel plan (the ``*_of`` below)."""
    return (concat_node(node) or permute_node(node) or recurrent_node(node) or xent_node(node)
            or attention_node(node))


def selections(node: fx.Node) -> list[fx.Node]:
    """The items a recurrent module's result is read through (``out, h_n = gru(x, h0)``;
    LSTM's ``(h_n, c_n)`` one level deeper), ending at the one tensor the task reads; [] if it
    reads the tuple otherwise or more than one of its items (tracing.trace drops dead items)."""
    chain, at = [], node
    while not hasattr(at.meta.get("tensor_meta"), "shape"):
        users = list(at.users)
        if len(users) != 1 or users[0].op != "call_function" \
                or users[0].target is not operator.getitem or users[0].args[0] is not at \
                or not isinstance(users[0].args[1], int):
            return []
        at = users[0]
        chain.append(at)
    return chain


def packed_attention(qkv: torch.Tensor, mask: torch.Tensor | None, split: int, heads: int,
                     scale: float, act: str) -> torch.Tensor:
    """Multi-head self-attention of a packed projection, as :func:`rewrites.attention_blocks`
    finds it in a graph (minGPT's form: KernelBench's L3_43, 44, 50), with its meaning: q, k, v the
    thirds of ``qkv`` [B, T, 3 * split], each split into ``heads``; the scores scaled, -inf
    where ``mask``'s top-left T x T block is 0, softmax over the keys (or ReLU), times v, the
    heads side by side again: [B, T, split]."""
    b, t, _ = qkv.shape
    q, k, v = (x.view(b, t, heads, split // heads).transpose(1, 2)
               for x in qkv.split(split, dim=2))
    att = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf"))
    att = torch.softmax(att, dim=-1) if act == "softmax" else torch.relu(att)
    return (att @ v).transpose(1, 2).contiguous().view(b, t, split)


def attention_node(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is packed_attention


def _computed(gm: fx.GraphModule) -> list[fx.Node]:
    """A stage graph's nodes that compute something (neither arguments nor its output)."""
    return [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def _arguments(gm: fx.GraphModule) -> tuple[str, ...]:
    """A stage graph's argument names, in order (a plan's ``inputs``)."""
    return tuple(str(n.target) for n in gm.graph.nodes if n.op == "placeholder")


def concat_of(gm: fx.GraphModule) -> Analysis | None:
    """The plan of a graph that computes one torch.cat of its arguments (a multi-kernel plan's
    stage), or None for any other graph."""
    computed = _computed(gm)
    if len(computed) != 1 or not concat_node(computed[0]):
        return None
    node = computed[0]
    bound = dict(zip(("tensors", "dim"), node.args), **node.kwargs)
    parts, dim = bound.get("tensors"), bound.get("dim", 0)
    if set(bound) - {"tensors", "dim"} or not isinstance(parts, (list, tuple)) or not parts:
        raise Unsupported(f"{PREFIX} torch.cat called with unusual arguments")
    zeros = [a for a in parts if isinstance(a, int) and not isinstance(a, bool) and a >= 0]
    tensors = [a for a in parts if a not in zeros]
    if not tensors or any(not isinstance(a, fx.Node) or a.op != "placeholder"
                          for a in tensors):
        raise Unsupported(f"{PREFIX} torch.cat of a model attribute (only computed values and "
                          f"forward inputs)")
    out = node.meta.get("tensor_meta")
    metas = [a.meta.get("tensor_meta") for a in tensors]
    if out is None or any(m is None or not hasattr(m, "shape") for m in metas):
        raise Unsupported(f"{PREFIX} torch.cat of non-tensor values")
    if any(m.dtype != torch.float32 for m in metas):
        raise Unsupported(f"{PREFIX} torch.cat of {metas[0].dtype} tensors (float32 only)")
    ndim = len(out.shape)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -ndim <= dim < ndim or \
            any(len(m.shape) != ndim for m in metas):
        raise Unsupported(f"{PREFIX} torch.cat over dim {dim!r} of tensors of other ranks")
    names = _arguments(gm)
    plan = Concat(names, tuple(a if a in zeros else str(a.target) for a in parts), dim % ndim,
                  ndim)
    return Analysis(plan, tuple(int(d) for d in out.shape), ("cat",),
                    f"cat({', '.join(map(str, plan.parts))}, dim={plan.dim})")


def permutation(node: fx.Node) -> tuple[int, ...] | None:
    """The dims that a permutation node (``permute``, ``transpose``, ... of PERMUTE_METHODS
    and PERMUTE_FUNCTIONS; not indexing) takes its first argument's in, each in
    ``range(ndim)``; None for arguments it cannot read (computed, not a permutation) or an
    argument whose shape is unknown."""
    name = (str(node.target) if node.op == "call_method"
            else PERMUTE_FUNCTIONS.get(node.target, ""))
    if name not in PERMUTE_METHODS:  # an unfold or indexing: no permutation
        return None
    src, *rest = node.args
    tm = src.meta.get("tensor_meta") if isinstance(src, fx.Node) else None
    if tm is None or not hasattr(tm, "shape"):
        return None
    nd = len(tm.shape)
    kwargs = dict(node.kwargs)
    if name == "permute":
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else \
            tuple(rest) or kwargs.get("dims")
        perm = tuple(dims) if isinstance(dims, (tuple, list)) else None
    else:
        bound = dict(zip(("dim0", "dim1"), rest), **kwargs)
        perm = None
        if set(bound) == {"dim0", "dim1"} and all(isinstance(v, int) for v in bound.values()):
            swapped = list(range(nd))
            a, b = bound["dim0"] % max(nd, 1), bound["dim1"] % max(nd, 1)
            swapped[a], swapped[b] = swapped[b], swapped[a]
            perm = tuple(swapped)
    if (perm is None or any(not isinstance(d, int) or isinstance(d, bool) for d in perm)
            or sorted(d % max(nd, 1) for d in perm) != list(range(nd))):
        return None
    return tuple(d % max(nd, 1) for d in perm)


def permute_of(gm: fx.GraphModule) -> Analysis | None:
    """The plan of a graph that makes a strided view of one of its arguments (a chain of
    permutations, basic indexing and unfolds: :func:`view_chain`) contiguous (a multi-kernel
    plan's stage), or None for any other graph."""
    computed = _computed(gm)
    if not computed or not all(permute_node(n) for n in computed):
        return None
    src = computed[0].args[0]
    if not isinstance(src, fx.Node) or src.op != "placeholder":
        raise Unsupported(f"{PREFIX} a strided view (permutation, indexing, unfold) of a model "
                          f"attribute")
    tm = src.meta.get("tensor_meta")
    if tm is None or not hasattr(tm, "shape") or tm.dtype != torch.float32:
        raise Unsupported(f"{PREFIX} a strided view (permutation, indexing, unfold) of a "
                          f"non-float32 value")
    view, ops = "", []
    for i, node in enumerate(computed):
        part = view_source(node)
        if node.args[0] is not (computed[i - 1] if i else src) or part is None:
            name = (str(node.target) if node.op == "call_method"
                    else PERMUTE_FUNCTIONS.get(node.target, "indexing"))
            raise Unsupported(f"{PREFIX} Tensor.{name} called with unusual arguments")
        view += part
        ops.append("index" if part.startswith("[") else part[1:part.index("(")])
    out = computed[-1].meta.get("tensor_meta")
    if out is None or not hasattr(out, "shape"):
        raise Unsupported(f"{PREFIX} a strided view of unknown shape")
    nd = len(out.shape)
    if nd > PERMUTE_MAX_DIMS:
        raise Unsupported(f"{PREFIX} a view of {nd} dims (at most {PERMUTE_MAX_DIMS})")
    plan = Permute(_arguments(gm), str(src.target), view, nd)
    return Analysis(plan, tuple(int(d) for d in out.shape), tuple(dict.fromkeys(ops)),
                    f"{src.target}{view}.contiguous()")


def recurrent_of(gm: fx.GraphModule) -> Analysis | None:
    """The plan of a graph that runs one nn.GRU/nn.LSTM on its arguments and returns one of
    its outputs (a multi-kernel plan's stage), or None for any other graph."""
    computed = _computed(gm)
    if not computed or not recurrent_node(computed[0]):
        return None
    node = computed[0]
    m = gm.get_submodule(str(node.target))
    cell = RECURRENT_MODULES[type(m)]
    chain = selections(node)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if not chain:
        raise Unsupported(f"{PREFIX} nn.{type(m).__name__}'s result read other than as one of "
                          f"its tensors")
    if computed[1:] != chain or out is not chain[-1]:
        return None  # more work after it: the lowering cuts there
    path = tuple(n.args[1] for n in chain)
    results = {(0,): "output", (1,): "h_n"} if cell == "gru" else \
        {(0,): "output", (1, 0): "h_n", (1, 1): "c_n"}
    if path not in results:
        raise Unsupported(f"{PREFIX} item {path} of nn.{type(m).__name__}'s result")
    if getattr(m, "proj_size", 0) or m.mode not in ("GRU", "LSTM"):
        raise Unsupported(f"{PREFIX} nn.{type(m).__name__} with projections")
    bound = dict(zip(("input", "hx"), node.args), **node.kwargs)
    if set(bound) - {"input", "hx"}:
        raise Unsupported(f"{PREFIX} nn.{type(m).__name__} called with unusual arguments")
    x, hx = bound.get("input"), bound.get("hx")
    states = ([] if hx is None else list(hx) if isinstance(hx, (tuple, list)) else [hx])
    if cell == "lstm" and states and len(states) != 2:
        raise Unsupported(f"{PREFIX} nn.LSTM's state other than (h0, c0)")
    if cell == "gru" and len(states) > 1:
        raise Unsupported(f"{PREFIX} nn.GRU's state other than h0")
    for a in [x] + states:
        tm = a.meta.get("tensor_meta") if isinstance(a, fx.Node) else None
        if not isinstance(a, fx.Node) or a.op != "placeholder" or tm is None \
                or not hasattr(tm, "shape") or tm.dtype != torch.float32:
            raise Unsupported(f"{PREFIX} nn.{type(m).__name__} of other than float32 forward "
                              f"inputs or stage outputs")
    if len(x.meta["tensor_meta"].shape) != 3:
        raise Unsupported(f"{PREFIX} nn.{type(m).__name__} of one unbatched sequence")
    names = _arguments(gm)
    h0, c0 = (str(states[0].target), str(states[1].target) if cell == "lstm" else "") \
        if states else ("", "")
    plan = Recurrent(names, cell, str(node.target), str(x.target), h0, c0, results[path])
    shape = tuple(int(d) for d in chain[-1].meta["tensor_meta"].shape)
    layers = f"{m.num_layers} layer{'s' if m.num_layers > 1 else ''}"
    return Analysis(plan, shape, (cell,),
                    f"{type(m).__name__}({x.target}, {layers}"
                    f"{', bidirectional' if m.bidirectional else ''}) -> {results[path]}")


def xent_of(gm: fx.GraphModule) -> Analysis | None:
    """The plan of a graph that computes one cross-entropy loss of its arguments (a multi-kernel
    plan's stage, or the whole task), or None for any other graph."""
    computed = _computed(gm)
    if len(computed) != 1 or not xent_node(computed[0]):
        return None
    node = computed[0]
    m = module_of(node)
    if m is not None:  # its settings are read at run time; what the kernel lacks, checked now
        bound = dict(zip(("input", "target"), node.args), **node.kwargs)
        if m.weight is not None or m.label_smoothing:
            raise Unsupported(f"{PREFIX} nn.CrossEntropyLoss with class weights or label "
                              f"smoothing")
    else:
        try:  # torch's own signature: its defaults, and its names for the arguments
            call = inspect.signature(F.cross_entropy).bind(*node.args, **node.kwargs)
        except TypeError as e:
            raise Unsupported(f"{PREFIX} cross_entropy called with unusual arguments ({e})")
        call.apply_defaults()
        bound = call.arguments
        if bound["weight"] is not None or bound["label_smoothing"] \
                or bound["size_average"] is not None or bound["reduce"] is not None:
            raise Unsupported(f"{PREFIX} cross_entropy with class weights, label smoothing or "
                              f"the deprecated reduction flags")
    reduction, ignore = ((m.reduction, m.ignore_index) if m is not None else
                         (bound["reduction"], bound["ignore_index"]))
    if reduction not in ("mean", "sum", "none") or isinstance(ignore, bool) \
            or not isinstance(ignore, int):
        raise Unsupported(f"{PREFIX} cross_entropy with reduction {reduction!r} and "
                          f"ignore_index {ignore!r}")
    x, t = bound.get("input"), bound.get("target")
    metas = [a.meta.get("tensor_meta") if isinstance(a, fx.Node) and a.op == "placeholder"
             else None for a in (x, t)]
    if any(tm is None or not hasattr(tm, "shape") for tm in metas):
        raise Unsupported(f"{PREFIX} cross_entropy of other than forward inputs or stage outputs")
    xm, tm = metas
    if xm.dtype != torch.float32 or tm.dtype != torch.int64:
        raise Unsupported(f"{PREFIX} cross_entropy of {xm.dtype} logits and {tm.dtype} targets "
                          f"(float32 logits and int64 class indices only)")
    if len(xm.shape) != 2 or len(tm.shape) != 1:
        raise Unsupported(f"{PREFIX} cross_entropy of {len(xm.shape)}-D logits (v1: [N, C] "
                          f"with [N] class indices)")
    names = _arguments(gm)
    plan = CrossEntropy(names, str(x.target), str(t.target), str(node.target) if m else "",
                        str(reduction), int(ignore))
    out = node.meta.get("tensor_meta")
    shape = tuple(int(d) for d in out.shape) if out is not None and hasattr(out, "shape") else ()
    return Analysis(plan, tuple(int(d) for d in xm.shape), ("cross_entropy",),
                    f"cross_entropy({x.target}, {t.target}, reduction={reduction!r})"
                    + (f" of {shape}" if shape else ""))


def attention_of(gm: fx.GraphModule) -> Analysis | None:
    """The plan of a graph that computes one :func:`packed_attention` of its argument (a
    multi-kernel plan's stage), or None for any other graph."""
    computed = [n for n in _computed(gm) if n.op != "get_attr"]
    if len(computed) != 1 or not attention_node(computed[0]):
        return None
    node = computed[0]
    qkv, mask, split, heads, scale, act = node.args
    tm = qkv.meta.get("tensor_meta") if isinstance(qkv, fx.Node) else None
    if not isinstance(qkv, fx.Node) or qkv.op != "placeholder" or tm is None \
            or tm.dtype != torch.float32:
        raise Unsupported(f"{PREFIX} attention of other than a float32 stage argument")
    mm = mask.meta.get("tensor_meta") if isinstance(mask, fx.Node) else None
    if mask is not None and (mm is None or mm.dtype != torch.float32):
        raise Unsupported(f"{PREFIX} attention with a mask buffer of other than float32")
    plan = Attention(_arguments(gm), str(qkv.target), int(split), int(heads), float(scale),
                     str(act), str(mask.target) if mask is not None else "")
    shape = tuple(int(d) for d in node.meta["tensor_meta"].shape)
    return Analysis(plan, shape, ("attention",),
                    f"{act} attention of {qkv.target} ({heads} heads of {split // heads}"
                    f"{', masked by ' + plan.mask if plan.mask else ''})")
