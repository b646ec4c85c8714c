"""fx rewrites of a traced forward, before it is lowered (:mod:`graph`) into a plan.

Each rewrite replaces a pattern of the forward with nodes the lowering and the own kernels
(:mod:`own_kernels`) read, or declines naming what it cannot express:

* reads after an in-place write point at the write's result (:func:`follow_writes`), values the
  output does not depend on are dropped (:func:`drop_dead`);
* composite ops that need a kernel boundary are decomposed into their ops (:func:`decompose`);
* torch's attention modules (``nn.TransformerEncoder``, ``nn.TransformerEncoderLayer``,
  ``nn.MultiheadAttention``) into their projections, :func:`own_kernels.packed_attention`,
  feed-forward blocks and norms (:func:`encoders`, :func:`encoder_layers`,
  :func:`multihead_attention`);
* after shapes are propagated: exclusive scans (:func:`exclusive_scans`), written attention
  blocks and products (:func:`attention_blocks`, :func:`attention_products`), joins with zeros
  (:func:`zero_joins`) and triangle masks (:func:`triangle_masks`).

:func:`tracing.trace` runs them in that order.
"""

from __future__ import annotations

import ast
import inspect
import math
import operator
import textwrap
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import fx, nn

from assay.propose.offline.fx_edits import recompile, replace_node
from assay.propose.offline.graph import (RESHAPE_FUNCTIONS, RESHAPE_METHODS, SAME_SHAPE_AS,
                                         SIGNATURES, WHY_KEPT, exclusive_scan, meta_shape,
                                         shape_value, swapped, triangle_fill)
from assay.propose.offline.ir import PREFIX, Unsupported
from assay.propose.offline.own_kernels import (CATS, PERMUTE_FUNCTIONS, module_of,
                                               packed_attention, zero_padded_cat)


def calls_to_rewrite(gm: fx.GraphModule, cls: type, why_not: Any) -> Any:
    """The calls of ``cls`` modules in ``gm`` that a rewrite takes, as (node, module); each
    other call marked with ``why_not(node, module)`` (``WHY_KEPT``) for the lowering's
    decline."""
    for node in list(gm.graph.nodes):
        m = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if not isinstance(m, cls):
            continue
        why = why_not(node, m)
        if why is None:
            yield node, m
        else:
            node.meta[WHY_KEPT] = why


def _self_attention_why_not(m: nn.MultiheadAttention) -> str | None:
    """Why ``m``'s self-attention is not :func:`packed_attention` between its projections (one
    packed in-projection, no key/value biases or zero attention, no attention dropout), or
    None."""
    if not m._qkv_same_embed_dim or m.in_proj_weight is None:
        return "with separate q, k and v projections"
    if m.bias_k is not None or m.bias_v is not None or m.add_zero_attn:
        return "with bias_k/bias_v or add_zero_attn"
    if m.dropout:
        return "with attention dropout (random weights in training mode)"
    return None


def _self_attention(graph: fx.Graph, path: str, m: nn.MultiheadAttention, tokens: fx.Node,
                    sequence_first: bool = False) -> fx.Node:
    """The nodes of ``m``'s self-attention (module ``path``) over batch-first ``tokens``:
    the packed projection, :func:`packed_attention`, the output projection; with
    ``sequence_first`` the attention's result is transposed back before that projection (a
    row op, so the residual and norm after it fuse into its kernel)."""
    width, heads = int(m.embed_dim), int(m.num_heads)
    bias = graph.get_attr(f"{path}.in_proj_bias") if m.in_proj_bias is not None else None
    qkv = graph.call_function(F.linear, (tokens, graph.get_attr(f"{path}.in_proj_weight"), bias))
    y = graph.call_function(packed_attention, (qkv, None, width, heads,
                                               1.0 / math.sqrt(width // heads), "softmax"))
    if sequence_first:
        y = graph.call_method("transpose", (y, 0, 1))
    out_bias = graph.get_attr(f"{path}.out_proj.bias") if m.out_proj.bias is not None else None
    return graph.call_function(F.linear, (y, graph.get_attr(f"{path}.out_proj.weight"),
                                          out_bias))


def _activation(act: Any) -> Any:
    """ReLU or GELU (erf), given as a function or module, as the function
    :func:`encoder_layers` writes; else None (an ``nn.GELU(approximate='tanh')`` is GELU to
    torch's fast path, not to its module)."""
    if act is F.relu or isinstance(act, nn.ReLU):
        return torch.relu
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return F.gelu
    return None


def _encoder_layer_why_not(node: fx.Node, m: nn.TransformerEncoderLayer) -> str | None:
    """Why :func:`encoder_layers` leaves this call of ``m`` to the lowering, or None."""
    if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], fx.Node):
        return "called with a mask or other arguments"
    if _activation(m.activation) is None:
        return "with an activation other than ReLU or GELU (erf)"
    if any(d.p for d in (m.dropout, m.dropout1, m.dropout2)):
        return "with dropout (random in training mode)"
    return _self_attention_why_not(m.self_attn)


def encoder_layers(gm: fx.GraphModule) -> None:
    """Rewrite ``nn.TransformerEncoderLayer`` (no masks, no dropout, ReLU or GELU, its
    attention as :func:`_self_attention_why_not` allows) into what it computes in eval mode:
    the self-attention and the feed-forward block, each added to its input, with the layer's
    LayerNorms after (or, ``norm_first``, before) them. Its eval fast path
    (``torch._transformer_encoder_layer_fwd``) computes the same. A sequence-first layer
    (``batch_first=False``: [S, N, E], attention over dim 0) is the batch-first one between
    transposes (everything but the attention is per token); its output made contiguous, as
    torch's is. Where one such layer reads another's output, the transposes between them
    cancel: a stack is transposed once in, once out. Other layers are left to the lowering,
    which declines them with the reason (``WHY_KEPT``)."""
    graph = gm.graph
    back: set[fx.Node] = set()  # the written outputs of sequence-first layers (contiguous)
    for node, m in calls_to_rewrite(gm, nn.TransformerEncoderLayer, _encoder_layer_why_not):
        path, x, act = str(node.target), node.args[0], _activation(m.activation)
        sequence_first = not m.self_attn.batch_first
        with graph.inserting_before(node):
            if sequence_first and x in back:  # the previous layer's batch-first output
                x = x.args[0].args[0]
            elif sequence_first:
                x = graph.call_method("transpose", (x, 0, 1))

            def sublayer(v: fx.Node, block: str) -> fx.Node:
                if block == "attention":
                    return _self_attention(graph, f"{path}.self_attn", m.self_attn, v)
                hidden = graph.call_function(act, (graph.call_module(f"{path}.linear1", (v,)),))
                return graph.call_module(f"{path}.linear2", (hidden,))
            for block, norm in (("attention", "norm1"), ("feed_forward", "norm2")):
                if m.norm_first:
                    x = graph.call_function(operator.add, (x, sublayer(
                        graph.call_module(f"{path}.{norm}", (x,)), block)))
                else:
                    x = graph.call_module(f"{path}.{norm}", (
                        graph.call_function(operator.add, (x, sublayer(x, block))),))
            if sequence_first:
                x = graph.call_method("contiguous", (graph.call_method("transpose",
                                                                       (x, 0, 1)),))
                back.add(x)
        replace_node(node, x, same_shape=False)
    for x in back:  # those the next layer read in its batch-first form
        if not x.users:
            transposed = x.args[0]
            graph.erase_node(x)
            graph.erase_node(transposed)
    recompile(gm)


_ENCODER_ARGS = ("src", "mask", "src_key_padding_mask", "is_causal")


def _encoder_why_not(node: fx.Node, m: nn.TransformerEncoder) -> str | None:
    """Why :func:`encoders` leaves this call of ``m`` to the lowering, or None."""
    bound = dict(zip(_ENCODER_ARGS, node.args), **node.kwargs)
    if len(node.args) > len(_ENCODER_ARGS) or set(bound) - set(_ENCODER_ARGS) \
            or not isinstance(bound.get("src"), fx.Node) \
            or any(bound.get(k) is not None for k in ("mask", "src_key_padding_mask")) \
            or bound.get("is_causal"):
        return "called with a mask or other arguments"
    return None


def encoders(gm: fx.GraphModule) -> None:
    """Rewrite ``nn.TransformerEncoder`` (a leaf to fx, as torch.nn's modules are) called
    without masks into what it computes in eval mode: its layers in order, then its final norm
    if it has one (without a padding mask its nested-tensor fast path is not taken). The layers
    are then :func:`encoder_layers`'s."""
    graph = gm.graph
    for node, m in calls_to_rewrite(gm, nn.TransformerEncoder, _encoder_why_not):
        path, x = str(node.target), dict(zip(_ENCODER_ARGS, node.args), **node.kwargs)["src"]
        with graph.inserting_before(node):
            for i in range(len(m.layers)):
                x = graph.call_module(f"{path}.layers.{i}", (x,))
            if m.norm is not None:
                x = graph.call_module(f"{path}.norm", (x,))
        replace_node(node, x, same_shape=False)
    recompile(gm)


def _multihead_attention_why_not(node: fx.Node, m: nn.MultiheadAttention) -> str | None:
    """Why :func:`multihead_attention` leaves this call of ``m`` to the lowering, or None."""
    if m.batch_first:  # torch returns a transposed view, whose strides the ops after it keep
        return "with batch_first=True (its result is a transposed view)"
    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
             "average_attn_weights", "is_causal")
    if len(node.args) > len(names) or any(k not in names for k in node.kwargs):
        return "called with unusual arguments"
    bound = dict(zip(names, node.args), **node.kwargs)
    if not (isinstance(bound.get("query"), fx.Node)
            and bound.get("query") is bound.get("key") is bound.get("value")):
        return "as cross-attention (query, key and value differ)"
    if any(bound.get(k) is not None for k in ("key_padding_mask", "attn_mask")) or \
            bound.get("is_causal", False):
        return "with a mask"
    if not node.users or not all(u.op == "call_function" and u.target is operator.getitem
                                 and u.args[1] == 0 for u in node.users):
        return "with its attention weights read"
    return _self_attention_why_not(m)


def multihead_attention(gm: fx.GraphModule) -> None:
    """Rewrite ``nn.MultiheadAttention`` self-attention whose weights are not read (``out, _ =
    attn(x, x, x)``) into what it computes in eval mode: the packed input projection
    (``F.linear`` of ``in_proj_weight``), :func:`packed_attention` over batch-first tokens
    (softmax of the scores scaled by 1 / sqrt(head width), the heads side by side), the
    output projection. The sequence-first input is transposed to batch-first before the
    attention and back after it (kernels of their own: copies). Other calls (masks, cross-
    attention, weights read, ``batch_first``, ...) are left to the lowering, which declines
    them with the reason (``WHY_KEPT``)."""
    graph = gm.graph
    for node, m in calls_to_rewrite(gm, nn.MultiheadAttention, _multihead_attention_why_not):
        path, users = str(node.target), list(node.users)
        x = node.args[0] if node.args else node.kwargs["query"]
        with graph.inserting_before(node):  # batch-first for the attention kernel
            out = _self_attention(graph, path, m, graph.call_method("transpose", (x, 0, 1)),
                                  sequence_first=True)
        for u in users:
            replace_node(u, out, same_shape=False)
        graph.erase_node(node)
    recompile(gm)


def _batch_statistics(gm: fx.GraphModule, node: fx.Node, m: nn.Module) -> None:
    """A BatchNorm2d/3d in training mode (as KernelBench runs it) of an (N, C, d1, ...) input as its
    ops: the mean over the spatial dims then over the batch (groups of one size: the mean of
    their means is the whole mean), the same for the squared deviations (the biased variance
    torch normalizes with), then the module's affine; each reduction a contiguous block of dims,
    so that the stages can cut between them. Any other call is left to the lowering."""
    # (before shapes are propagated: the rank is the module's; BatchNorm1d's (N, C) input is
    # a row normalization over dim 0, graph.channel_norm's, and its (N, C, L) one declined)
    rank = {nn.BatchNorm2d: 4, nn.BatchNorm3d: 5}.get(type(m))
    if node.kwargs or len(node.args) != 1 or rank is None or not m.training:
        return
    graph, x = gm.graph, node.args[0]
    spatial = tuple(range(2, rank))
    view = (int(m.num_features),) + (1,) * len(spatial)

    def mean(v: fx.Node) -> fx.Node:
        per_sample = graph.call_function(torch.mean, (v, spatial), {"keepdim": True})
        return graph.call_function(torch.mean, (per_sample, 0), {"keepdim": True})

    with graph.inserting_before(node):
        d = graph.call_function(operator.sub, (x, mean(x)))
        var = mean(graph.call_function(operator.mul, (d, d)))
        out = graph.call_function(operator.mul, (d, graph.call_function(
            torch.rsqrt, (graph.call_function(operator.add, (var, float(m.eps))),))))
        if m.affine:
            w = graph.call_method("view", (graph.get_attr(f"{node.target}.weight"), view))
            b = graph.call_method("view", (graph.get_attr(f"{node.target}.bias"), view))
            out = graph.call_function(operator.add, (graph.call_function(
                operator.mul, (out, w)), b))
    replace_node(node, out)
    out.meta[SAME_SHAPE_AS] = x  # (DenseNet's relu(bn(x)).size(0), read between kernels)


def decompose(gm: fx.GraphModule) -> None:
    """Rewrite composite ops whose lowering would need a kernel boundary inside them into the
    primitive ops they are made of, so that the stages can cut between those: BatchNorm on the
    batch's statistics (:func:`_batch_statistics`), and the triplet
    margin loss (per-row distances, then their mean) as torch's formula,
    ``mean(clamp_min(||a - p + eps|| - ||a - n + eps|| + margin, 0))`` over the last dim
    (p-norm, no swap; other settings are left to the lowering, which declines them)."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module":
            m = gm.get_submodule(str(node.target))
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                _batch_statistics(gm, node, m)
                continue
            if not isinstance(m, nn.TripletMarginLoss) or node.kwargs:
                continue
            kw = {"margin": m.margin, "p": m.p, "eps": m.eps, "swap": m.swap,
                  "reduction": m.reduction}
        elif node.op == "call_function" and node.target is F.triplet_margin_loss:
            names = SIGNATURES["triplet_margin_loss"]
            kw = dict(zip(names[3:], node.args[3:]), **node.kwargs)
        else:
            continue
        args = dict(zip(("anchor", "positive", "negative"), node.args))
        if (len(args) != 3 or kw.get("swap") or kw.get("reduction", "mean") not in ("mean", "sum")
                or any(kw.get(k) is not None for k in ("size_average", "reduce"))):
            continue
        p, eps, margin = float(kw.get("p", 2.0)), float(kw.get("eps", 1e-6)), \
            float(kw.get("margin", 1.0))
        with graph.inserting_before(node):
            def dist(x):
                diff = graph.call_function(operator.add, (
                    graph.call_function(operator.sub, (args["anchor"], x)), eps))
                return graph.call_function(torch.norm, (diff,), {"p": p, "dim": -1})
            gap = graph.call_function(operator.add, (graph.call_function(
                operator.sub, (dist(args["positive"]), dist(args["negative"]))), margin))
            per_row = graph.call_function(torch.clamp_min, (gap, 0.0))
            total = graph.call_function(torch.mean if kw.get("reduction", "mean") == "mean"
                                        else torch.sum, (per_row,))
        replace_node(node, total, same_shape=False)
    recompile(gm)


_FILLS = {torch.zeros_like: "sum", torch.ones_like: "prod"}
_CUMULATIVE = {torch.cumsum: "sum", torch.cumprod: "prod"}


def _cumulative(node: Any) -> tuple[str, dict[str, Any]] | None:
    """(``sum`` or ``prod``, its arguments by name) of a cumsum/cumprod call, else None."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.target in _CUMULATIVE:
        kind = _CUMULATIVE[node.target]
    elif node.op == "call_method" and str(node.target) in ("cumsum", "cumprod"):
        kind = str(node.target).removeprefix("cum")
    else:
        return None
    return kind, dict(zip(("input", "dim"), node.args), **node.kwargs)


def exclusive_scans(gm: fx.GraphModule) -> None:
    """Rewrite the exclusive scans tasks write as an inclusive one shifted by one into
    :func:`exclusive_scan` nodes: ``torch.cat([zeros_like(Z), torch.cumsum(x.narrow(d, 0, n -
    1), d)], d)`` with Z of x's shape but 1 along d, n = x.size(d) (cumprod with ones_like),
    which the lowering could not express (a narrow by a traced size, a join). Needs the shapes
    (``tensor_meta``); the nodes left unread are dropped."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in CATS:
            continue
        bound = dict(zip(("tensors", "dim"), node.args), **node.kwargs)
        parts, dim = bound.get("tensors"), bound.get("dim", 0)
        out = meta_shape(node)
        if set(bound) - {"tensors", "dim"} or not isinstance(parts, (list, tuple)) or \
                len(parts) != 2 or out is None or not isinstance(dim, int):
            continue
        d = dim % len(out)
        fill, scan = parts
        fill_kind = _FILLS.get(fill.target) if isinstance(fill, fx.Node) and \
            fill.op == "call_function" and len(fill.args) == 1 and not fill.kwargs else None
        cum = _cumulative(scan)
        if fill_kind is None or cum is None or cum[0] != fill_kind:
            continue
        cargs = cum[1]
        narrow = cargs.get("input")
        if set(cargs) != {"input", "dim"} or not isinstance(narrow, fx.Node) or \
                not isinstance(cargs["dim"], int) or cargs["dim"] % len(out) != d or not (
                    (narrow.op == "call_method" and str(narrow.target) == "narrow")
                    or (narrow.op == "call_function" and narrow.target is torch.narrow)):
            continue
        nargs = dict(zip(("input", "dim", "start", "length"), narrow.args), **narrow.kwargs)
        x = nargs.get("input")
        xs = meta_shape(x)
        if (xs != out or nargs.get("start") != 0 or not isinstance(nargs.get("dim"), int)
                or nargs["dim"] % len(out) != d
                or meta_shape(narrow) != out[:d] + (out[d] - 1,) + out[d + 1:]
                or meta_shape(fill) != out[:d] + (1,) + out[d + 1:]
                or fill.meta["tensor_meta"].dtype != x.meta["tensor_meta"].dtype):
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(exclusive_scan, (x, d, fill_kind))
        replace_node(node, new)
        changed = True
    if changed:
        drop_dead(gm)


def _method_or_function(node: Any, method: str, functions: tuple[Any, ...]) -> bool:
    return isinstance(node, fx.Node) and (
        (node.op == "call_method" and str(node.target) == method)
        or (node.op == "call_function" and node.target in functions))


def _only_user(node: fx.Node, user: fx.Node) -> bool:
    return list(node.users) == [user]


# Arithmetic of numbers in a traced forward (an attention's ``1.0 / math.sqrt(k.size(-1))``)
_NUMBER_OPS = {math.sqrt, operator.truediv, operator.mul, operator.add, operator.sub,
               operator.pow, operator.floordiv}


def _number(node: Any, shape_of: Any) -> float | None:
    """A number argument as its value: a constant, a size of a tensor (its shape at the analysed
    size), or :data:`_NUMBER_OPS` of those, else None."""
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return float(node)
    if not isinstance(node, fx.Node) or node.kwargs:
        return None
    if node.op == "call_method" and str(node.target) == "size" and len(node.args) == 2:
        shape = shape_of(node.args[0])
        return float(shape[node.args[1]]) if shape and isinstance(node.args[1], int) else None
    args = [_number(a, shape_of) for a in node.args]
    if node.op != "call_function" or node.target not in _NUMBER_OPS or \
            any(a is None for a in args) or len(args) != (1 if node.target is math.sqrt else 2):
        return None
    return float(node.target(*args))


def _sizes_within(node: fx.Node, block: set[fx.Node]) -> bool:
    """Whether ``node`` is a size read (``k.size(-1)``, arithmetic of sizes) whose values end
    in ``block`` alone (the attention's scale), so the block can go with it."""
    todo, seen = [node], set()
    while todo:
        n = todo.pop()
        if n in block or n in seen:
            continue
        number = n.op == "call_function" and n.target in _NUMBER_OPS and not any(
            meta_shape(a) is not None for a in n.args)  # arithmetic of numbers, no tensor
        if not (shape_value(n) or number):
            return False
        seen.add(n)
        todo += list(n.users)
    return True


def attention_blocks(gm: fx.GraphModule) -> None:
    """Rewrite multi-head self-attention written out as minGPT does into one
    :func:`packed_attention` node, a kernel of its own: from ``qkv.split(C, dim=2)`` through
    ``q.view(B, T, nh, C // nh).transpose(1, 2)`` (k and v alike), ``(q @ k.transpose(-2, -1))
    * scale``, an optional ``masked_fill(buf[:, :, :T, :T] == 0, -inf)`` of a model buffer,
    softmax over the keys or ReLU, an eval-mode dropout, ``@ v``, to ``.transpose(1, 2)
    .contiguous().view(B, T, C)``. Each value of the block read by the next step alone; the
    scale a number at the analysed size. Needs the shapes (``tensor_meta``)."""
    graph = gm.graph
    changed = False
    for out in list(graph.nodes):
        # the end: y.transpose(1, 2).contiguous().view(B, T, C)
        if not (out.op == "call_method" and str(out.target) in ("view", "reshape")):
            continue
        cont = out.args[0]
        if not (isinstance(cont, fx.Node) and cont.op == "call_method"
                and str(cont.target) == "contiguous" and len(cont.args) == 1
                and _only_user(cont, out)):
            continue
        y = swapped(cont.args[0], 1, 2)
        tr_out = cont.args[0]
        if y is None or not _only_user(tr_out, cont) or not _only_user(y, tr_out):
            continue
        if not _method_or_function(y, "matmul", (torch.matmul, operator.matmul)) or \
                len(y.args) != 2 or y.kwargs:
            continue
        p, v4 = y.args
        # the probabilities: [dropout] <- act <- [masked_fill] <- [scale] <- q @ k^T
        chain = [p]
        if isinstance(p, fx.Node) and p.op == "call_module" and isinstance(
                gm.get_submodule(str(p.target)), nn.modules.dropout._DropoutNd):
            p = p.args[0]
            chain.append(p)
        act = None
        if _method_or_function(p, "softmax", (torch.softmax, F.softmax)):
            dim = dict(zip(("input", "dim"), p.args), **{k: v for k, v in p.kwargs.items()
                                                          if k != "_stacklevel"}).get("dim")
            if dim in (-1, 3) and p.kwargs.get("dtype") is None:
                act = "softmax"
        elif _method_or_function(p, "relu", (torch.relu, F.relu)) and len(p.args) == 1 \
                and not p.kwargs.get("inplace"):
            act = "relu"
        elif isinstance(p, fx.Node) and p.op == "call_module" and isinstance(
                gm.get_submodule(str(p.target)), nn.ReLU):
            act = "relu"
        if act is None:
            continue
        s = p.args[0]
        mask = mask_view = None
        if _method_or_function(s, "masked_fill", ()) and len(s.args) == 3 and not s.kwargs \
                and s.args[2] == float("-inf"):
            cond = s.args[1]
            sliced = cond.args[0] if isinstance(cond, fx.Node) and cond.op == "call_function" \
                and cond.target in (operator.eq, torch.eq) and len(cond.args) == 2 \
                and cond.args[1] == 0 else None
            buf = sliced.args[0] if isinstance(sliced, fx.Node) and \
                sliced.op == "call_function" and sliced.target is operator.getitem else None
            if not (isinstance(buf, fx.Node) and buf.op == "get_attr"):
                continue
            items = sliced.args[1]
            if not (isinstance(items, tuple) and len(items) == 4 and all(
                    isinstance(i, slice) and i.start in (None, 0) and i.step is None
                    for i in items) and items[0].stop is None and items[1].stop is None):
                continue
            chain += [s, cond, sliced]
            mask, mask_view = buf, sliced
            s = s.args[0]
        scale = 1.0
        if isinstance(s, fx.Node) and s.op == "call_function" and s.target in (
                operator.mul, operator.truediv) and len(s.args) == 2 and not s.kwargs:
            factor = _number(s.args[1], meta_shape)
            if factor is None or factor == 0:
                continue
            scale = factor if s.target is operator.mul else 1.0 / factor
            chain.append(s)
            s = s.args[0]
        if not _method_or_function(s, "matmul", (torch.matmul, operator.matmul)) or \
                len(s.args) != 2:
            continue
        q4, kt = s.args
        k4 = swapped(kt, 2, 3)
        if k4 is None:
            continue
        # q, k, v: views of the thirds of one split, in that order
        thirds = []
        for x4 in (q4, k4, v4):
            view = swapped(x4, 1, 2)
            third = view.args[0] if isinstance(view, fx.Node) and \
                view.op == "call_method" and str(view.target) in ("view", "reshape") else None
            if not (isinstance(third, fx.Node) and third.op == "call_function"
                    and third.target is operator.getitem and isinstance(third.args[1], int)):
                thirds = None
                break
            thirds.append((third.args[0], third.args[1], meta_shape(view)))
        if not thirds or len({t[0] for t in thirds}) != 1 or [t[1] for t in thirds] != [0, 1, 2]:
            continue
        split = thirds[0][0]
        if not (split.op == "call_method" and str(split.target) == "split"):
            continue
        sargs = dict(zip(("split_size", "dim"), split.args[1:]), **split.kwargs)
        qkv = split.args[0]
        qs, views = meta_shape(qkv), [t[2] for t in thirds]
        width = sargs.get("split_size")
        if qs is None or len(qs) != 3 or sargs.get("dim") not in (2, -1) or \
                not isinstance(width, int) or qs[2] != 3 * width or \
                len(set(views)) != 1 or views[0] is None or len(views[0]) != 4 or \
                views[0][:2] != qs[:2] or views[0][2] * views[0][3] != width or \
                meta_shape(out) != (qs[0], qs[1], width):
            continue
        heads = views[0][2]
        if mask is not None:  # its top-left T x T block, over every batch and head
            ms = meta_shape(mask)
            if ms is None or len(ms) != 4 or ms[:2] != (1, 1) or min(ms[2:]) < qs[1] or \
                    meta_shape(mask_view) != (1, 1, qs[1], qs[1]):
                continue
        # every value between the split and the end is read inside the block only
        block = {out, cont, tr_out, y, *chain, s, kt} | {a for x4 in (q4, k4, v4)
                                                          for a in (x4, x4.args[0],
                                                                    x4.args[0].args[0])}
        block |= {split}
        if any(u not in block and not _sizes_within(u, block)
               for n in block - {out} for u in n.users):
            continue
        with graph.inserting_before(out):
            new = graph.call_function(packed_attention,
                                      (qkv, mask, width, heads, float(scale), act))
        replace_node(out, new)
        changed = True
    if changed:
        drop_dead(gm)


def attention_products(gm: fx.GraphModule) -> bool:
    """Rewrite ``F.scaled_dot_product_attention(q, k, v)`` (no mask, no dropout, not causal, no
    grouped heads) into what it computes, ``softmax(q @ k.transpose(-2, -1) * scale, -1) @ v``
    (scale: the call's, else 1 / sqrt of q's last dim at the analysed size), so that the
    stages plan it as products and a row kernel: heads of any width, where the attention
    family's kernel keeps a head's values in registers. Whether anything changed (the new
    nodes need their shapes). Needs the shapes (``tensor_meta``)."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if not (node.op == "call_function" and node.target is F.scaled_dot_product_attention):
            continue
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                 "enable_gqa")
        if len(node.args) > len(names) or any(k not in names for k in node.kwargs):
            continue
        bound = dict(zip(names, node.args), **node.kwargs)
        q, k, v = (bound.get(n) for n in names[:3])
        shapes = [meta_shape(x) for x in (q, k, v)]
        if (bound.get("attn_mask") is not None or bound.get("dropout_p", 0.0) != 0
                or bound.get("is_causal", False) is not False or bound.get("enable_gqa", False)
                or any(sh is None or len(sh) < 3 for sh in shapes)
                or len({len(sh) for sh in shapes}) != 1
                or len({sh[:-2] for sh in shapes}) != 1
                or shapes[0][-1] != shapes[1][-1] or shapes[1][-2] != shapes[2][-2]):
            continue  # declined by the lowering, which names the op
        scale = bound.get("scale")
        if scale is None:
            scale = 1.0 / math.sqrt(shapes[0][-1])
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            continue
        with graph.inserting_before(node):
            kt = graph.call_method("transpose", (k, -2, -1))
            scores = graph.call_function(torch.matmul, (q, kt))
            scaled = graph.call_function(operator.mul, (scores, float(scale)))
            probs = graph.call_function(torch.softmax, (scaled, -1))
            out = graph.call_function(torch.matmul, (probs, v))
        replace_node(node, out, same_shape=False)
        changed = True
    if changed:
        recompile(gm)
    return changed


def _zero_fill(node: Any) -> bool:
    """``torch.zeros_like(t)``, ``t.new_zeros(sizes)`` or ``torch.zeros(sizes)``: zeros of a
    known shape, no value read."""
    if not isinstance(node, fx.Node) or set(node.kwargs) - {"device", "dtype"}:
        return False
    return ((node.op == "call_function" and node.target in (torch.zeros_like, torch.zeros))
            or (node.op == "call_method" and str(node.target) == "new_zeros"))


def zero_joins(gm: fx.GraphModule) -> bool:
    """Rewrite the joins with zeros into :func:`zero_padded_cat`, whose zero parts the concat
    kernel writes: ``torch.cat`` of a :func:`_zero_fill` part (Mamba2's ``initial_states =
    torch.zeros_like(states[:, :1])`` before ``torch.cat([initial_states, states], dim=1)``)
    and ``F.pad`` with zeros (constant mode, no cropping: one join per padded dim). Whether
    anything changed (a pad of several dims makes joins with no shape yet). Needs the shapes
    (``tensor_meta``); what it does not match is declined by the lowering."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        shape = meta_shape(node)
        if node.target in (torch.cat, torch.concat, torch.concatenate):
            bound = dict(zip(("tensors", "dim"), node.args), **node.kwargs)
            parts, dim = bound.get("tensors"), bound.get("dim", 0)
            if (set(bound) - {"tensors", "dim"} or not isinstance(parts, (list, tuple))
                    or not any(_zero_fill(p) for p in parts) or shape is None
                    or isinstance(dim, bool) or not isinstance(dim, int)
                    or all(_zero_fill(p) for p in parts)):
                continue
            dtype = node.meta["tensor_meta"].dtype
            if any(_zero_fill(p) and (meta_shape(p) is None
                                      or p.meta["tensor_meta"].dtype != dtype) for p in parts):
                continue
            dim %= len(shape)
            joined = [meta_shape(p)[dim] if _zero_fill(p) else p for p in parts]
            with graph.inserting_before(node):
                new = graph.call_function(zero_padded_cat, (joined, dim))
        elif node.target is F.pad:
            bound = dict(zip(("input", "pad", "mode", "value"), node.args), **node.kwargs)
            pad, x = bound.get("pad"), bound.get("input")
            if (set(bound) - {"input", "pad", "mode", "value"} or shape is None
                    or bound.get("mode", "constant") != "constant"
                    or bound.get("value") not in (None, 0) or not isinstance(pad, (list, tuple))
                    or len(pad) % 2 or len(pad) > 2 * len(shape)
                    or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                               for p in pad)):
                continue
            new = x
            with graph.inserting_before(node):
                for i in range(len(pad) // 2):  # pairs from the last dim backwards
                    before, after = pad[2 * i], pad[2 * i + 1]
                    if before or after:
                        joined = [n for n in (before, new, after) if not isinstance(n, int) or n]
                        new = graph.call_function(zero_padded_cat,
                                                  (joined, len(shape) - 1 - i))
        else:
            continue
        if new is node.args[0]:  # F.pad by nothing
            continue
        replace_node(node, new)
        changed = True
    if changed:
        drop_dead(gm)
    return changed


def _bool_triangle(node: Any) -> tuple[bool, int] | None:
    """(upper, diagonal) of ``torch.tril``/``triu`` (function or method) of ``torch.ones`` of
    two sizes with ``dtype=torch.bool``, else None."""
    upper = _method_or_function(node, "triu", (torch.triu,))
    if not (upper or _method_or_function(node, "tril", (torch.tril,))):
        return None
    bound = dict(zip(("input", "diagonal"), node.args), **node.kwargs)
    ones, diagonal = bound.get("input"), bound.get("diagonal", 0)
    if (set(bound) - {"input", "diagonal"} or isinstance(diagonal, bool)
            or not isinstance(diagonal, int) or not isinstance(ones, fx.Node)
            or not (ones.op == "call_function" and ones.target is torch.ones)
            or ones.kwargs.get("dtype") is not torch.bool or len(meta_shape(ones) or ()) != 2):
        return None
    return upper, diagonal


def triangle_masks(gm: fx.GraphModule) -> bool:
    """Rewrite ``x.masked_fill(mask, value)`` whose mask is a triangle of a bool ones matrix
    made in the forward (``~torch.tril(torch.ones(T, T, dtype=bool))``, a causal mask of the
    last two dims; triu, and not negated, too) into :func:`triangle_fill`, which the kernels
    compute from the element's index (``ir`` op ``tri`` with a fill): the mask is no tensor any
    kernel reads. Whether anything changed. Needs the shapes (``tensor_meta``); x's last two
    dims must be the mask's."""
    graph = gm.graph
    changed = False
    for node in list(graph.nodes):
        if not _method_or_function(node, "masked_fill", (torch.masked_fill,)) or node.kwargs \
                or len(node.args) != 3:
            continue
        x, mask, value = node.args
        negated = (isinstance(mask, fx.Node) and mask.op == "call_function"
                   and mask.target in (operator.invert, torch.logical_not))
        triangle = _bool_triangle(mask.args[0] if negated else mask)
        shape = meta_shape(x)
        if (triangle is None or isinstance(value, bool) or not isinstance(value, (int, float))
                or shape is None or len(shape) < 2
                or shape[-2:] != meta_shape(mask.args[0] if negated else mask)):
            continue
        upper, diagonal = triangle
        # kept where the mask is False: ~tril(d) keeps col - row <= d, tril(d) keeps >= d + 1,
        # ~triu(d) keeps >= d, triu(d) keeps <= d - 1
        if not negated:
            upper, diagonal = not upper, diagonal + (1 if not upper else -1)
        with graph.inserting_before(node):
            fill = graph.call_function(triangle_fill, (x, upper, diagonal, float(value)))
        replace_node(node, fill)
        changed = True
    if changed:
        drop_dead(gm)
    return changed


# Ops whose result may share memory with their first argument (a write to one shows in the
# other); getitem counts (basic indexing is a view).
_VIEW_METHODS = RESHAPE_METHODS | {"permute", "transpose", "swapaxes", "swapdims", "t", "expand",
                                   "expand_as", "view_as", "narrow", "select", "unflatten",
                                   "diagonal", "unfold", "as_strided", "split", "chunk",
                                   "unbind", "movedim", "detach", "contiguous"}


def _in_place(node: fx.Node) -> bool:
    """Whether ``node`` may write a tensor it is given (so it is kept even if unread)."""
    if node.kwargs.get("inplace") or node.target is operator.setitem:
        return True
    if node.op == "call_method":
        return str(node.target).endswith("_")
    if node.op == "call_function":
        return getattr(node.target, "__name__", "").endswith("_")
    if node.op == "call_module":
        m = module_of(node)
        return m is None or bool(getattr(m, "inplace", False))
    return True


def _writes_first(node: fx.Node) -> bool:
    """Whether ``node`` writes its first argument and returns it (``x.relu_()``,
    ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``; ``y += 1`` is no such node: fx
    records it as ``y + 1``, see :func:`augmented_alias`)."""
    if node.op == "call_function":
        return (node.kwargs.get("inplace") is True
                or getattr(node.target, "__name__", "").endswith("_"))
    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).startswith("_")
    if node.op == "call_module":
        return getattr(module_of(node), "inplace", False) is True
    return False


def _may_view(node: fx.Node) -> bool:
    return ((node.op == "call_method" and str(node.target) in _VIEW_METHODS)
            or (node.op == "call_function" and (node.target is operator.getitem
                                                or node.target in RESHAPE_FUNCTIONS
                                                or node.target in PERMUTE_FUNCTIONS)))


def augmented_alias(forward: Any) -> str | None:
    """The name of a tensor that ``forward`` writes by an augmented assignment (``y += 1``)
    while another name for it is read after that, else None. fx records ``y += 1`` on a traced
    tensor as ``y = y + 1`` (a proxy has no in-place operators), so ``z = y; y += 1; return z``
    would be computed as returning the old ``y``: eager returns the new one. Read from the
    source (names bound to names, in line order); None where the source is not available."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except Exception:  # noqa: BLE001 - no source (built-in, generated, wrapped oddly): no check
        return None
    steps = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))),
                   key=lambda n: (n.lineno, n.col_offset))
    loads = [(n.lineno, n.id) for n in ast.walk(tree)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    group: dict[str, object] = {}
    for st in steps:
        if isinstance(st, ast.Assign):
            fresh = object()
            for t in st.targets:
                if isinstance(t, ast.Name):
                    value = st.value
                    group[t.id] = group.setdefault(value.id, object()) \
                        if isinstance(value, ast.Name) else fresh
        elif isinstance(st.target, ast.Name) and st.target.id in group:
            name = st.target.id
            others = {v for v, g in group.items() if g is group[name] and v != name}
            if any(line > st.lineno and v in others for line, v in loads):
                return name
    return None


# Reads of a module's plain tensor attribute (not a parameter or buffer: fx's GraphModule
# makes every tensor it copies a buffer), marked by tracing; REASSIGNED: one that the forward
# sets (``self.hidden = ...``), whose value is the one the previous call left.
PLAIN = "assay_plain_attribute"
REASSIGNED = "assay_reassigned_attribute"
# Tensor factories: a value made by one lives where its ``device=`` says, else on the CPU,
# whatever device the module and the inputs are on.
_FACTORIES = frozenset((torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
                        torch.rand, torch.randn, torch.randint, torch.randperm, torch.tensor,
                        torch.as_tensor, torch.eye, torch.linspace, torch.logspace))
# Tensor methods that may move a value to another device (or change its dtype).
_MOVES = frozenset(("to", "cpu", "cuda", "type"))


def one_node_per_attribute(gm: fx.GraphModule, plain: set[str], reassigned: set[str]
                           ) -> None:
    """One ``get_attr`` node per module tensor: fx records a read of a plain tensor attribute
    (``self.hidden``) as a node at each read, and a write in place through one of them
    (``self.hidden.copy_(h0)``) must be seen by the reads after it (:func:`follow_writes`).
    The reads of a plain tensor attribute (``plain``: qualified names) are marked ``PLAIN``,
    of one in ``reassigned`` (those the forward set) ``REASSIGNED`` too, for
    :func:`module_state` and :func:`device_moves`."""
    first: dict[str, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        target = str(node.target)
        if target in first:
            replace_node(node, first[target], same_shape=False)
            continue
        first[target] = node
        if target in plain:
            node.meta[PLAIN] = True
        if target in reassigned:
            node.meta[REASSIGNED] = True
    gm.recompile()


def module_state(gm: fx.GraphModule) -> None:
    """A module tensor that the forward writes (in place, or by setting the attribute) is
    state kept between calls, which a plan cannot hold: declined where the forward reads it
    before it is overwritten whole. Overwritten whole first (KernelBench's L3_33: its hidden
    state copied from the forward's argument, ``self.hidden.copy_(initial_hidden)``), the
    output depends on this call's inputs alone: the reads after the copy read its source.
    Needs the shapes (``tensor_meta``)."""
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        writes = [u for u in node.users if _writes_first(u) and u.args and u.args[0] is node]
        if not writes and not node.meta.get(REASSIGNED):
            continue
        copy = writes[0] if writes else None
        source = copy.args[1] if copy is not None and len(copy.args) == 2 else None
        if (copy is None or len(node.users) != 1 or copy.op != "call_method"
                or str(copy.target) != "copy_" or copy.kwargs
                or not isinstance(source, fx.Node) or meta_shape(source) != meta_shape(node)
                or source.meta["tensor_meta"].dtype != node.meta["tensor_meta"].dtype):
            raise Unsupported(f"{PREFIX} state kept on the module between calls (self."
                              f"{node.target}: the forward writes it and reads the value the "
                              f"previous call left)")
        replace_node(copy, source, same_shape=False)
        gm.graph.erase_node(node)
    recompile(gm)


def on_common_device(node: fx.Node, root: Callable[[fx.Node], bool | None]) -> bool:
    """Whether ``node`` is computed on the device the verifier runs the module and its inputs
    on: from tensors ``root`` says are there (``root(n)`` of a placeholder or ``get_attr``:
    True, False for a tensor on a device of its own, None for no tensor), through no move
    (``.to``, ``.cpu``, ...) and no tensor factory but one given a traced device
    (``device=x.device``; one given none, or a constant such as ``"cpu"``, makes its value on
    a fixed device, whatever device the verifier runs on)."""
    seen, todo, rooted = set(), [node], False
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op in ("placeholder", "get_attr"):
            at = root(n)
            if at is False:
                return False
            rooted = rooted or bool(at)
            continue
        if ((n.op == "call_method" and n.target in _MOVES)
                or (n.op == "call_function" and n.target in _FACTORIES
                    and not isinstance(n.kwargs.get("device"), fx.Node))):
            return False
        todo += n.all_input_nodes
    return rooted


def _traced_root(node: fx.Node) -> bool | None:
    """:func:`on_common_device`'s ``root`` for a traced graph with shapes: a plain tensor
    attribute (``PLAIN``) stays where it was made; other module tensors and the forward's
    tensor inputs are on the verifier's device."""
    if node.meta.get(PLAIN):
        return False
    return True if node.op == "get_attr" or "tensor_meta" in node.meta else None


def device_moves(gm: fx.GraphModule) -> None:
    """``v.to(t.device)`` (or ``device=t.device``) where ``v`` and ``t`` are both on the
    verifier's device (:func:`on_common_device`) moves nothing: ``v`` itself. Needs the shapes
    (``tensor_meta``: which inputs are tensors). A move to a fixed device, or of a value
    that may be elsewhere, stays (and the lowering declines it)."""
    changed = False
    for node in list(gm.graph.nodes):
        if not (node.op == "call_method" and node.target == "to" and node.args):
            continue
        value = node.args[0]
        bound = dict(zip(("device",), node.args[1:]), **node.kwargs)
        device = bound.get("device") if len(node.args) <= 2 and set(bound) == {"device"} \
            else None
        if not (isinstance(device, fx.Node) and device.op == "call_function"
                and device.target is getattr and device.args[1:] == ("device",)
                and isinstance(value, fx.Node) and isinstance(device.args[0], fx.Node)):
            continue
        if on_common_device(value, _traced_root) and \
                on_common_device(device.args[0], _traced_root):
            replace_node(node, value, same_shape=False)
            changed = True
    if changed:
        drop_dead(gm)


def follow_writes(gm: fx.GraphModule) -> None:
    """Reads of a tensor after an in-place write to it read the written value, as in eager:
    fx records ``z = y; y += 1; return z`` as ``iadd = y + 1`` with ``z`` still the node ``y``,
    so the later reads of ``y`` are pointed at the write's result (the same tensor). A write
    to or through a view whose other aliases are read after it is declined: the plan computes
    values, not shared memory."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    changed = False
    for node in list(gm.graph.nodes):
        if not _writes_first(node) or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        target = node.args[0]
        for user in list(target.users):
            if user is not node and order[user] > order[node]:
                user.replace_input_with(target, node)
                changed = True
        # the tensors that share the written memory: what it views, and views taken of it
        aliases = [target.args[0]] if _may_view(target) and target.args and \
            isinstance(target.args[0], fx.Node) else []
        aliases += [u for u in target.users if u is not node and _may_view(u)]
        if any(order[u] > order[node] for a in aliases for u in a.users if u is not target):
            raise Unsupported(f"{PREFIX} an in-place write to a tensor whose view (or base) is "
                              f"read after it (the plan computes values, not shared memory)")
    if changed:
        gm.recompile()


def drop_dead(gm: fx.GraphModule, passed: int | None = None) -> None:
    """Remove the values no output depends on (KernelBench's LSTM tasks compute a linear layer
    on the output sequence, then return the state), keeping whatever may write in place; with
    ``passed`` (how many arguments ``get_inputs`` gives), also the forward's optional arguments
    past those that nothing reads (NetVLAD's ``mask=None``): the forward is never given them."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "output" or node.users:
            continue
        if node.op == "placeholder":
            if passed is not None and placeholders.index(node) >= passed and node.args:
                gm.graph.erase_node(node)  # args: (its default,)
        elif node.op == "get_attr" or not _in_place(node):  # (a module tensor nothing reads)
            gm.graph.erase_node(node)
    gm.recompile()
