"""Graph analysis: what computation is this task, in terms the templates can express?

The task's model is traced with torch.fx, rewritten and shape-propagated on meta tensors (no
memory, any size: :func:`tracing.trace`, :mod:`rewrites`), then lowered here
(:func:`analyze_graph`) into a small IR, the :class:`Plan`:

* leaves: the forward's float tensor arguments and the module's parameters/buffers, each with how it
  broadcasts against the iteration shape ``S`` (full, a single value, or a contiguous block of
  dims, e.g. a bias of shape ``(C,)`` along the last dim);
* nodes in topological order: elementwise ops (``elem`` class: one value per element of ``S``),
  row reductions over the trailing ``k`` dims (``row`` class: one value per row) and arithmetic
  on row values, and ``uniform`` values (constants, the row length);
* the output node.

Plans without a head op are of three kinds: ``elementwise`` (no reduction), ``row`` (one or
more passes over each row: softmax, layer norm, RMSNorm, sums, ...) and ``axis``: reductions
over a block of ``k`` dims starting at ``axis`` that does not end at the last dim (a "row" is
then an (outer, inner) position, its values ``inner`` apart; RMSNorm over channels broadcasts
one back), prod and argmax/argmin (int64, only as the output) over any block, and scans
(cumsum, cumprod) along one dim: ``flip``, cumsum, ``flip`` of that dim is a reversed scan, a
bool input is a mask read as 0/1. A reduction over every dim (no dim: ``x.sum()``,
``torch.mean(x)``, ``torch.norm(x)``) is a row plan of one row (``k == ndim``), its value a 0-d
tensor that also broadcasts back over the tensor (``x / norm(x)``); the ``total`` family writes
those. Composite ops (softmax, layer_norm, rms_norm, logsumexp, normalize, mean, and the losses
mse_loss, l1_loss, smooth_l1_loss, huber_loss and kl_div with their reductions) are lowered
into reductions and elementwise nodes here so that the code generator only knows three
reductions (sum, max, min) and scalar formulas. triplet_margin_loss (a loss over rows of a
per-row reduction) is decomposed into its ops (``rewrites.decompose``); cross_entropy is a
kernel of its own (``own_kernels.xent_of``: logits and int64 class indices, the rows' losses
and their reduction in one entry point).

A task may open with one matrix product or convolution (``torch.matmul``/``mm``/``bmm``,
``F.linear``/``nn.Linear``, ``F.conv2d``/``nn.Conv2d``) whose operands are inputs or parameters:
it becomes :class:`Gemm`, and its result a leaf (``source="gemm"``) of the plan of what follows
it (bias, activation, scaling, residual, softmax, norms, sums: the epilogue). A matrix-vector
product (second operand ``(K,)`` or ``(K, 1)``) is lowered as a row reduction instead.
GroupNorm over NC... tensors is a row plan whose rows are (sample, group) pairs (``groups``).
A task may instead open with 1-D, 2-D or 3-D max or average pooling of a forward input
(``nn.MaxPool{1,2,3}d``/``nn.AvgPool{1,2,3}d``, ``F.max_pool{1,2,3}d``/``F.avg_pool{1,2,3}d``):
it becomes :class:`Pool`, its result the leaf ``pool_leaf`` of an elementwise plan over the
pooled shape (template ``pool``).

Where one kernel would have to end (a second head op, a reduction of a reduced value, a view
of a computed value), the lowering raises :class:`NeedsCut` naming the fx node, and
:mod:`stages` cuts the graph there into a multi-kernel plan. BatchNorm (and InstanceNorm with
running statistics) lowers to its eval-mode affine, as the verifier runs tasks; InstanceNorm
without them to a row plan over the spatial dims; adaptive average pooling to size 1 to a mean.
Anything the IR cannot express raises :class:`Unsupported` with a one-line reason that the
proposer returns as its decline. The plan holds no sizes: sizes are read from the tensors at
run time, so a plan learned at one size serves every size (``analyze_task`` checks that).
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import math
import operator
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from assay.propose.offline.ir import (ARG_REDUCTIONS, CONV_OPS, PREFIX, Analysis, Gemm, Leaf,
                                      NeedsCut, Node, Plan, Pool, Unsupported, conv_args,
                                      describe, needed_nodes)
from assay.propose.offline.own_kernels import (CATS, RECURRENT_MODULES, attention_of,
                                               concat_node, concat_of, module_of, packed_attention,
                                               permutation, permute_node, permute_of,
                                               recurrent_of, unfold_source, xent_of)
from assay.propose.offline.tensor_algebra import EINSUMS, einsum_call, product_form


class _Conflict(Unsupported):
    """A reduction that the builder's one row shape cannot hold (turned into a NeedsCut)."""


_CONV_MODULES = {nn.Conv1d: "conv1d", nn.Conv2d: "conv2d", nn.Conv3d: "conv3d",
                 nn.ConvTranspose1d: "conv_transpose1d", nn.ConvTranspose2d: "conv_transpose2d",
                 nn.ConvTranspose3d: "conv_transpose3d"}


# ----------------------------------------------------------------------------------------------
# Recognized torch callables, method names and modules -> canonical op names

_FUNCTIONS: dict[Any, str] = {}


def exclusive_scan(x: torch.Tensor, dim: int, kind: str) -> torch.Tensor:
    """The exclusive scan of ``x`` along ``dim`` (``kind`` sum or prod): each element the sum
    (product) of those before it, the first the identity. What :func:`exclusive_scans` puts
    in a graph for the form tasks write it in (KernelBench's L1_92), with its meaning."""
    run = torch.cumsum(x, dim) if kind == "sum" else torch.cumprod(x, dim)
    fill = torch.zeros_like if kind == "sum" else torch.ones_like
    return torch.cat([fill(x.narrow(dim, 0, 1)), run.narrow(dim, 0, x.size(dim) - 1)], dim)


def triangle_fill(input: torch.Tensor, upper: bool, diagonal: int, value: float
                  ) -> torch.Tensor:
    """``input`` where its element's column minus row (the last two dims) is >= (``upper``)
    or <= ``diagonal``, else ``value``: what ``input.masked_fill(~torch.tril(torch.ones(n, m,
    dtype=bool), diagonal), value)`` computes (and the triu and un-negated forms;
    :func:`triangle_masks`), without the mask."""
    keep = torch.ones(input.shape[-2:], dtype=torch.bool, device=input.device)
    keep = keep.triu(diagonal) if upper else keep.tril(diagonal)
    return input.masked_fill(~keep, value)


def _register(name: str, *targets: Any) -> None:
    for t in targets:
        if t is not None:
            _FUNCTIONS[t] = name


_register("add", operator.add, torch.add)
_register("sub", operator.sub, torch.sub, torch.subtract)
_register("mul", operator.mul, torch.mul, torch.multiply)
_register("div", operator.truediv, torch.div, torch.divide, torch.true_divide)
_register("neg", operator.neg, torch.neg, torch.negative)
_register("pos", operator.pos)
_register("pow", operator.pow, torch.pow)
_register("relu", torch.relu, F.relu)
_register("relu6", F.relu6)
_register("sigmoid", torch.sigmoid, F.sigmoid, torch.special.expit)
_register("tanh", torch.tanh, F.tanh)
_register("exp", torch.exp)
_register("log", torch.log)
_register("abs", operator.abs, torch.abs, torch.absolute)
_register("sqrt", torch.sqrt)
_register("rsqrt", torch.rsqrt)
_register("erf", torch.erf, torch.special.erf)
_register("sin", torch.sin)
_register("cos", torch.cos)
_register("log1p", torch.log1p)
_register("expm1", torch.expm1)
_register("reciprocal", torch.reciprocal)
_register("square", torch.square)
_register("gelu", F.gelu)
_register("silu", F.silu)
_register("mish", F.mish)
_register("elu", F.elu)
_register("selu", F.selu, torch.selu)
_register("softplus", F.softplus)
_register("softsign", F.softsign)
_register("hardsigmoid", F.hardsigmoid)
_register("hardswish", F.hardswish)
_register("leaky_relu", F.leaky_relu)
_register("hardtanh", F.hardtanh)
_register("clamp", torch.clamp, torch.clip)
_register("clamp_min", torch.clamp_min)
_register("clamp_max", torch.clamp_max)
_register("maximum", torch.maximum)
_register("minimum", torch.minimum)
_register("max", torch.max)
_register("min", torch.min)
_register("amax", torch.amax)
_register("amin", torch.amin)
_register("sum", torch.sum)
_register("mean", torch.mean)
_register("prod", torch.prod)
_register("argmax", torch.argmax)
_register("argmin", torch.argmin)
_register("cumsum", torch.cumsum)
_register("cumprod", torch.cumprod)
_register("exclusive_scan", exclusive_scan)
_register("flip", torch.flip)
_register("triu", torch.triu)
_register("tensor", torch.tensor)
_register("tril", torch.tril)
_register("triangle_fill", triangle_fill)
_register("softmax", torch.softmax, F.softmax, torch.special.softmax)
_register("log_softmax", torch.log_softmax, F.log_softmax, torch.special.log_softmax)
_register("logsumexp", torch.logsumexp, torch.special.logsumexp)
_register("layer_norm", F.layer_norm)
_register("rms_norm", getattr(F, "rms_norm", None))
_register("normalize", F.normalize)
_register("group_norm", F.group_norm)
_register("norm", torch.norm)
_register("vector_norm", torch.linalg.vector_norm)
_register("mse_loss", F.mse_loss)
_register("l1_loss", F.l1_loss)
_register("smooth_l1_loss", F.smooth_l1_loss)
_register("huber_loss", F.huber_loss)
_register("kl_div", F.kl_div)
_register("triplet_margin_loss", F.triplet_margin_loss)
_register("cross_entropy", F.cross_entropy)
_register("dropout", F.dropout)
_register("getitem", operator.getitem)
_register("getattr", builtins.getattr)

_METHODS = {
    "add", "sub", "mul", "div", "true_divide", "neg", "pow", "relu", "sigmoid", "tanh", "exp",
    "log", "abs", "sqrt", "rsqrt", "erf", "sin", "cos", "log1p", "expm1", "reciprocal",
    "square", "clamp", "clip", "clamp_min", "clamp_max", "maximum", "minimum", "max", "min",
    "amax", "amin", "sum", "mean", "prod", "argmax", "argmin", "cumsum", "cumprod", "flip",
    "softmax", "log_softmax", "logsumexp", "norm", "contiguous", "triu", "tril",
    "float", "clone", "detach",
}
# detach: the same values (tasks run without autograd; KernelBench keeps a residual with
# `x.clone().detach()`).
_METHOD_ALIASES = {"true_divide": "div", "clip": "clamp", "float": "identity",
                   "contiguous": "identity", "clone": "identity", "detach": "identity"}

# 1-D, 2-D and 3-D pooling, which may open a plan as its Pool: (op, spatial dims).
_POOL_FUNCTIONS: dict[Any, tuple[str, int]] = {
    F.max_pool2d: ("max", 2), F.avg_pool2d: ("avg", 2), torch.max_pool2d: ("max", 2),
    F.max_pool1d: ("max", 1), F.avg_pool1d: ("avg", 1), torch.max_pool1d: ("max", 1),
    F.max_pool3d: ("max", 3), F.avg_pool3d: ("avg", 3), torch.max_pool3d: ("max", 3)}
_POOL_MODULES = {nn.MaxPool2d: ("max", 2), nn.AvgPool2d: ("avg", 2), nn.MaxPool1d: ("max", 1),
                 nn.AvgPool1d: ("avg", 1), nn.MaxPool3d: ("max", 3), nn.AvgPool3d: ("avg", 3)}
_POOL_SIGNATURES = {
    "max": ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
            "return_indices"),
    "avg": ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
            "divisor_override"),
}

# Adaptive average pooling, lowered as a mean when its output size is 1 (global pooling).
_GLOBAL_POOLS = {F.adaptive_avg_pool1d: ("F.adaptive_avg_pool1d", 1),
                 F.adaptive_avg_pool2d: ("F.adaptive_avg_pool2d", 2),
                 F.adaptive_avg_pool3d: ("F.adaptive_avg_pool3d", 3)}

# The ops that may open a plan as its Gemm (see the module doc).
_GEMM_FUNCTIONS: dict[Any, str] = {
    torch.matmul: "matmul", operator.matmul: "matmul", torch.mm: "mm", torch.bmm: "bmm",
    F.linear: "linear", **{getattr(F, op): op for op in CONV_OPS},
    **{getattr(torch, op): op for op in CONV_OPS if hasattr(torch, op)}}
_GEMM_METHODS = {"matmul", "mm", "bmm"}
# ints computed from shapes (view arguments: x.size(1) // groups)
SHAPE_ARITH = {operator.floordiv: "//", operator.mul: "*", operator.add: "+",
                operator.sub: "-"}

# Positional parameter names of each canonical op (torch's order); keyword arguments are
# matched by name. A call with more positional arguments than listed is declined (unusual form).
SIGNATURES: dict[str, tuple[str, ...]] = {
    "add": ("input", "other", "alpha"), "sub": ("input", "other", "alpha"),
    "mul": ("input", "other"), "div": ("input", "other"), "neg": ("input",),
    "pos": ("input",), "pow": ("input", "exponent"),
    "relu": ("input", "inplace"), "relu6": ("input", "inplace"),
    "gelu": ("input", "approximate"), "silu": ("input", "inplace"), "mish": ("input", "inplace"),
    "elu": ("input", "alpha", "inplace"), "selu": ("input", "inplace"),
    "softplus": ("input", "beta", "threshold"), "softsign": ("input",),
    "hardsigmoid": ("input", "inplace"), "hardswish": ("input", "inplace"),
    "leaky_relu": ("input", "negative_slope", "inplace"),
    "hardtanh": ("input", "min_val", "max_val", "inplace"),
    "clamp": ("input", "min", "max"), "clamp_min": ("input", "min"),
    "clamp_max": ("input", "max"),
    "maximum": ("input", "other"), "minimum": ("input", "other"),
    "max": ("input", "dim", "keepdim"), "min": ("input", "dim", "keepdim"),
    "amax": ("input", "dim", "keepdim"), "amin": ("input", "dim", "keepdim"),
    "sum": ("input", "dim", "keepdim"), "mean": ("input", "dim", "keepdim"),
    "prod": ("input", "dim", "keepdim"), "argmax": ("input", "dim", "keepdim"),
    "argmin": ("input", "dim", "keepdim"), "cumsum": ("input", "dim"),
    "cumprod": ("input", "dim"), "exclusive_scan": ("input", "dim", "kind"),
    "flip": ("input", "dims"),
    "triu": ("input", "diagonal"), "tril": ("input", "diagonal"),
    "triangle_fill": ("input", "upper", "diagonal", "value"),
    "tensor": ("data", "dtype", "device", "requires_grad", "pin_memory"),
    "softmax": ("input", "dim"), "log_softmax": ("input", "dim"),
    "logsumexp": ("input", "dim", "keepdim"),
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    "rms_norm": ("input", "normalized_shape", "weight", "eps"),
    "group_norm": ("input", "num_groups", "weight", "bias", "eps"),
    "normalize": ("input", "p", "dim", "eps"),
    "norm": ("input", "p", "dim", "keepdim"),
    "vector_norm": ("input", "ord", "dim", "keepdim"),
    "mse_loss": ("input", "target", "size_average", "reduce", "reduction", "weight"),
    "l1_loss": ("input", "target", "size_average", "reduce", "reduction", "weight"),
    "smooth_l1_loss": ("input", "target", "size_average", "reduce", "reduction", "beta"),
    "huber_loss": ("input", "target", "reduction", "delta", "weight"),
    "kl_div": ("input", "target", "size_average", "reduce", "reduction", "log_target"),
    "triplet_margin_loss": ("anchor", "positive", "negative", "margin", "p", "eps", "swap",
                            "size_average", "reduce", "reduction"),
    "cross_entropy": ("input", "target", "weight", "size_average", "ignore_index", "reduce",
                      "reduction", "label_smoothing"),
    "dropout": ("input", "p", "training", "inplace"),
    "identity": ("input",),
    "getitem": ("input", "index"), "getattr": ("input", "name"),
}
_UNARY_FORMULAS = {"neg", "relu", "relu6", "sigmoid", "tanh", "exp", "log", "abs", "sqrt",
                   "rsqrt", "erf", "sin", "cos", "log1p", "expm1", "reciprocal", "square",
                   "silu", "mish", "selu", "softsign", "hardsigmoid", "hardswish"}

# Losses lowered into an elementwise chain and its reduction (Model losses: see _Lowering.loss).
_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div")
_LOSS_MODULES = {nn.MSELoss: "mse_loss", nn.L1Loss: "l1_loss", nn.SmoothL1Loss: "smooth_l1_loss",
                 nn.HuberLoss: "huber_loss", nn.KLDivLoss: "kl_div",
                 nn.TripletMarginLoss: "triplet_margin_loss",
                 nn.CrossEntropyLoss: "cross_entropy"}
# Losses whose value is a mean over rows of a per-row reduction (a reduction of reduced
# values, which a plan cannot hold yet), and what each needs.
_ROW_LOSSES = {"triplet_margin_loss": "per-row distances, then their mean"}

# Why a common op is out of reach, for the decline message.
_CATEGORIES = (
    (("matmul", "mm", "bmm", "linear", "addmm", "einsum", "baddbmm", "bilinear", "tensordot",
      "Linear", "Bilinear"), "matmul"),
    (("conv",), "convolution"),
    (("pool",), "pooling"),
    (("batch_norm", "BatchNorm", "instance_norm", "InstanceNorm", "group_norm", "GroupNorm"),
     "normalization over non-trailing dims"),
    (("view", "reshape", "permute", "transpose", "flatten", "unsqueeze", "squeeze", "cat",
      "stack", "split", "chunk", "expand", "repeat", "narrow", "select", "index", "size"),
     "layout/indexing op"),
    (("cumsum", "cumprod", "cummax", "scan"), "scan"),
    (("argmax", "argmin", "topk", "sort"), "index-valued op"),
)


# Views that may sit between two kernels of a multi-kernel plan (stages.py): the candidate
# applies them to one kernel's output, size-generic, before the next kernel reads it.
RESHAPE_METHODS = {"view", "reshape", "flatten", "unsqueeze", "squeeze"}
RESHAPE_FUNCTIONS = {torch.flatten: "flatten", torch.reshape: "reshape",
                     torch.unsqueeze: "unsqueeze", torch.squeeze: "squeeze"}
SIZE_METHODS = {"size"}


def is_reshape(node: fx.Node) -> bool:
    return ((node.op == "call_method" and str(node.target) in RESHAPE_METHODS)
            or (node.op == "call_function" and node.target in RESHAPE_FUNCTIONS))


def _category(name: str) -> str:
    low = name.lower()
    for keys, cat in _CATEGORIES:
        if any(k.lower() in low for k in keys):
            return cat
    return "op not in the v1 table"


def _unsupported(what: str) -> Unsupported:
    return Unsupported(f"{PREFIX} {what} ({_category(what)})")


def _callable_name(target: Any) -> str:
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or repr(target)
    mod = {"torch._C._nn": "torch.nn.functional", "torch._C._VariableFunctions": "torch",
           "_operator": "operator"}.get(mod, mod)
    if not mod and name in dir(torch):
        mod = "torch"
    return f"{mod}.{name}" if mod else name


# ----------------------------------------------------------------------------------------------
# Lowering fx -> IR


@dataclass
class _TupleRef:
    """A (values, indices) result of max/min with a dim; ``indices`` lowers the indices
    (argmax/argmin) when they are asked for."""

    values: int
    what: str
    indices: Any = None  # () -> the IR node of the indices


# A forward argument that the task's get_inputs() gives as a Python number (KernelBench L1_5's
# scalar): marked on its placeholder by analyze_module, read as a float32 0-d tensor.
NUMBER_ARG = "assay_number"
_NUMBER_META = types.SimpleNamespace(dtype=torch.float32, shape=())


# ``x.device``: read by torch.tensor(number, device=x.device) alone (a constant lives nowhere)
_DEVICE = object()


@dataclass
class _Transposed:
    """``t.T`` of a 2-D tensor, or a tensor of 3 or more dims with its last two swapped
    (``batched``, ``k.transpose(-2, -1)``): only a matmul operand can take it (read as the
    other layout of the product: ``A @ B.T`` is ``F.linear(A, B)``; ``q @ k.transpose(-2, -1)``
    a batch of products reading k's rows along K)."""

    of: Any  # the fx node transposed
    what: str
    batched: bool = False


@dataclass
class _IntInput:
    """A forward input of an integer dtype: declined where a kernel would read it, so that an
    op that cannot take it anyway (cross_entropy's targets) names itself first."""

    what: str


@dataclass
class _Builder:
    """Accumulates IR nodes (hash-consed) and the facts a Plan needs (leaves, row shape)."""

    nodes: list[Node] = field(default_factory=list)
    keep: dict[int, bool] = field(default_factory=dict)  # row node -> keepdim
    leaves: list[tuple[Leaf, tuple[int, ...]]] = field(default_factory=list)  # (leaf, shape)
    row_k: int | None = None
    row_shape: tuple[int, ...] | None = None
    groups: tuple | None = None  # the row grouping of the first reduction (see Plan.groups)
    axis: int = -1  # the first reduced or scanned dim of an axis plan (-1: trailing rows)
    scanned: bool = False  # the reduced dims are a scan's
    ops: list[str] = field(default_factory=list)
    gemm: Gemm | None = None
    gemm_node: int | None = None  # the load of the product's result
    pool: Pool | None = None
    pool_node: int | None = None  # the load of the pooled result
    own_bias: int | None = None  # the product's result plus the op's own bias
    dtypes: dict[str, str] = field(default_factory=dict)  # leaf name -> dtype (non-float32)
    eval_only: list[str] = field(default_factory=list)  # see Plan.eval_only
    viewed: set[int] = field(default_factory=set)  # leaves read through a view: no anchors
    _memo: dict[Node, int] = field(default_factory=dict)
    # the shapes triu/tril were applied to: each must be the iteration shape (their mask reads
    # the element's index in it)
    triangles: list[tuple[int, ...]] = field(default_factory=list)

    def add(self, node: Node, keepdim: bool | None = None) -> int:
        # Hash-consing: the same constant, leaf or subexpression is one node.
        if node in self._memo:
            return self._memo[node]
        self.nodes.append(node)
        idx = len(self.nodes) - 1
        self._memo[node] = idx
        if node.cls == "row":
            self.keep[idx] = bool(keepdim)
        return idx

    def const(self, value: float) -> int:
        return self.add(Node("const", attrs=(("value", float(value)),), cls="uniform"))

    def cols(self) -> int:
        return self.add(Node("cols", cls="uniform"))

    def leaf(self, source: str, name: str, index: int, meta: Any,
             shape: tuple[int, ...] | None = None) -> int:
        """A load of a tensor; ``shape`` overrides the tensor's own for broadcasting (a conv
        bias ``(C,)`` read as ``(C, 1, 1)``, a matrix-vector operand ``(K, 1)`` as ``(K,)``)."""
        self.dtype_of(meta.dtype, name)
        shape = tuple(int(s) for s in (meta.shape if shape is None else shape))
        for k, (lf, shp) in enumerate(self.leaves):
            if lf.source == source and lf.name == name and shp == shape:
                break
        else:
            self.leaves.append((Leaf(source, name, index), shape))
            k = len(self.leaves) - 1
        # A one-element tensor is one value for the whole kernel, so arithmetic between it and
        # a reduced row value stays a row value (``sum(x) * self.scale``).
        cls = "uniform" if math.prod(shape) == 1 else "elem"
        return self.add(Node("load", attrs=(("leaf", k),), cls=cls))

    def op(self, name: str, *args: int, **attrs: Any) -> int:
        if any(self.nodes[a].op in ARG_REDUCTIONS for a in args):
            raise Unsupported(f"{PREFIX} arithmetic on argmax/argmin indices (index-valued op)")
        classes = [self.nodes[a].cls for a in args]
        rows = [a for a in args if self.nodes[a].cls == "row"]
        if "elem" in classes and rows and all(
                self.row_shaped(a) for a in args if self.nodes[a].cls == "elem"):
            # A reduced value with parameters of its own shape (a bias added after a global
            # pooling): a value per row, not per element of S. Its own kernel computes it.
            raise _Conflict(f"{PREFIX} a reduced value combined with tensors of its shape in "
                            f"the kernel that reduces it")
        if "elem" in classes:
            cls, keepdim = "elem", None
            for r in rows:
                # A full reduction's 0-d value broadcasts against anything (x / norm(x)).
                if not self.keep[r] and not self.full:
                    raise Unsupported(f"{PREFIX} a reduced value without keepdim=True "
                                      f"broadcast against the unreduced tensor")
        elif rows:
            cls = "row"
            kinds = {self.keep[r] for r in rows}
            if len(kinds) > 1:
                raise Unsupported(f"{PREFIX} arithmetic between reductions with different "
                                  f"keepdim")
            keepdim = kinds.pop()
        else:
            cls, keepdim = "uniform", None
        node = Node(name, tuple(args), tuple(sorted(attrs.items())), cls)
        return self.add(node, keepdim)

    def row_shaped(self, a: int) -> bool:
        """Whether node ``a`` loads a tensor of size 1 along every reduced dim (it broadcasts
        like a reduced value, so arithmetic with one stays per row)."""
        node = self.nodes[a]
        if node.op != "load" or self.row_shape is None or self.row_k is None:
            return False
        shape = self.leaves[node.attr("leaf")][1]
        nd = len(self.row_shape)
        if len(shape) > nd:
            return False
        padded = (1,) * (nd - len(shape)) + tuple(shape)
        first = self.axis if self.axis >= 0 else nd - self.row_k
        return all(padded[d] == 1 for d in range(first, first + self.row_k))

    @property
    def full(self) -> bool:
        """Whether the reductions are over every dim (one row: a full reduction)."""
        return self.row_shape is not None and self.row_k == len(self.row_shape)

    def dtype_of(self, dtype: torch.dtype, what: str) -> None:
        """float32 always; float16/bfloat16 are noted (only a GEMM plan may use them, all
        tensors in one dtype: checked when the plan is finished), so is bool (a mask: axis
        plans only); anything else is declined."""
        if dtype in (torch.float16, torch.bfloat16, torch.bool):
            self.dtypes[what] = str(dtype).replace("torch.", "")
        elif dtype != torch.float32:
            _check_dtype(dtype, what)

    def reduce(self, kind: str, arg: int, dims: tuple[int, ...], keepdim: bool,
               in_shape: tuple[int, ...], groups: tuple = ()) -> int:
        """A reduction of ``arg`` (shape ``in_shape``) over ``dims``, a contiguous block:
        trailing (a row plan; ``groups`` splits each row into that many rows, GroupNorm) or
        not (an axis plan)."""
        nd = len(in_shape)
        k = len(dims)
        if k == 0 or dims != tuple(range(dims[0], dims[0] + k)):
            raise Unsupported(f"{PREFIX} a reduction over dim(s) {list(dims)} of a {nd}-D "
                              f"tensor (v1 reduces a contiguous block of dims only)")
        if kind in ("sum", "max", "min", "prod") and keepdim and self.unit_dims(arg, dims, nd):
            return arg  # over dims a keepdim reduction left of size 1: the value itself
        if self.nodes[arg].cls != "elem":
            raise _Conflict(f"{PREFIX} a reduction of an already reduced value")
        axis = -1 if dims[-1] == nd - 1 else dims[0]
        if groups and axis >= 0:  # pragma: no cover - GroupNorm reduces the trailing dims
            raise Unsupported(f"{PREFIX} a grouped reduction over non-trailing dims")
        self.over(k, in_shape, groups, axis, False, "reductions")
        # keepdim is part of the node: the same sum kept and squeezed are two shapes.
        return self.add(Node(f"reduce_{kind}", (arg,), (("keepdim", keepdim),), "row"), keepdim)

    def unit_dims(self, arg: int, dims: tuple[int, ...], nd: int) -> bool:
        """Whether ``dims`` are exactly those a keepdim reduction made ``arg`` of size 1 (by
        construction, whatever the task's sizes): reducing them again changes nothing
        (KernelBench L2_18: a sum with keepdim, then max, mean and logsumexp over that dim)."""
        if self.nodes[arg].cls != "row" or not self.keep.get(arg) or self.groups:
            return False
        if self.row_shape is None or self.row_k is None or nd != len(self.row_shape):
            return False
        first = self.axis if self.axis >= 0 else nd - self.row_k
        return dims == tuple(range(first, first + self.row_k))

    def over(self, k: int, in_shape: tuple[int, ...], groups: tuple, axis: int, scan: bool,
             what: str) -> None:
        """Records the dims a reduction or scan runs over: one set of dims per kernel. After a
        head op only trailing row reductions fuse (into the product's epilogue; none after a
        pooling): anything else starts a kernel of its own."""
        if self.pool is not None or (self.gemm is not None and (
                axis >= 0 or scan or k == len(in_shape))):
            head = self.pool.what if self.pool is not None else self.gemm.what
            raise _Conflict(f"{PREFIX} {what} over dims {list(range(len(in_shape)))[-k:]} "
                            f"after {head} in one kernel")
        if self.row_k is None:
            self.row_k, self.row_shape, self.groups = k, in_shape, groups
            self.axis, self.scanned = axis, scan
        elif (self.row_k, self.row_shape, self.groups, self.axis, self.scanned) != (
                k, in_shape, groups, axis, scan):
            raise _Conflict(f"{PREFIX} {what} over different dims in one kernel (or a scan "
                            f"beside a reduction)")

    def scan(self, kind: str, arg: int, dim: int, in_shape: tuple[int, ...],
             exclusive: bool = False) -> int:
        """The inclusive scan (cumsum, cumprod) of ``arg`` along ``dim``, or with ``exclusive``
        each element's scan of those before it; a scan of a flip of that dim is the flip of a
        reversed scan (flip, cumsum, flip: a suffix sum)."""
        node = self.nodes[arg]
        reverse = node.op == "flip" and node.attr("dims") == (dim,)
        if reverse:
            arg = node.args[0]
        if self.nodes[arg].cls != "elem":
            raise _Conflict(f"{PREFIX} a scan of a reduced or uniform value")
        self.over(1, in_shape, (), dim, True, "scans")
        attrs = ((("exclusive", True),) if exclusive else ()) + (("reverse", reverse),)
        out = self.add(Node(f"scan_{kind}", (arg,), attrs, "elem"))
        return self.flip(out, (dim,)) if reverse else out

    def flip(self, arg: int, dims: tuple[int, ...]) -> int:
        """``arg`` flipped along ``dims``: only a flip that a scan or another flip undoes
        survives into a plan (checked when it is finished)."""
        node = self.nodes[arg]
        if node.op == "flip" and node.attr("dims") == dims:
            return node.args[0]
        if node.cls != "elem":
            raise Unsupported(f"{PREFIX} a flip of a reduced or uniform value")
        return self.add(Node("flip", (arg,), (("dims", dims),), "elem"))

    def squeeze(self, row: int, keepdim: bool) -> int:
        """The row value ``row`` with another keepdim (the same numbers, another shape)."""
        if self.keep[row] == keepdim:
            return row
        return self.add(Node("keep", (row,), (("keepdim", keepdim),), "row"), keepdim)


def _check_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype != torch.float32:
        raise Unsupported(f"{PREFIX} {what} of dtype {str(dtype).replace('torch.', '')} "
                          f"(v1 handles float32 only)")


def _norm_dims(dim: Any, ndim: int, what: str, full: bool = False) -> tuple[int, ...]:
    """The sorted non-negative dims of ``dim``; no dim means every dim where ``full`` (a
    reduction to one value: sum, mean, amax, norm), a decline otherwise."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        if full:
            return tuple(range(ndim))
        raise Unsupported(f"{PREFIX} {what} without a dim")
    dims = dim if isinstance(dim, (list, tuple)) else (dim,)
    if not all(isinstance(d, int) for d in dims):
        raise Unsupported(f"{PREFIX} {what} with a dim computed at run time")
    out = sorted({d + ndim if d < 0 else d for d in dims})
    if any(d < 0 or d >= max(ndim, 1) for d in out):
        raise Unsupported(f"{PREFIX} {what} with dim {dim} of a {ndim}-D tensor")
    return tuple(out)


class _Lowering:
    """Walks the traced graph once, turning each fx node into IR nodes (or declining)."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self.b = _Builder()
        self.env: dict[fx.Node, Any] = {}
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.inputs: list[str] = []
        self.node: fx.Node | None = None  # the fx node being lowered (where a cut would go)

    # -- helpers --------------------------------------------------------------------------

    def cut(self, reason: str) -> NeedsCut:
        """The decline ``reason``, which a kernel boundary before the current node may lift."""
        assert self.node is not None
        return NeedsCut(reason, self.node)

    def meta(self, node: fx.Node) -> Any:
        tm = node.meta.get("tensor_meta")
        if tm is None or not hasattr(tm, "shape"):
            raise Unsupported(f"{PREFIX} the non-tensor value {node.name!r} "
                              f"({node.op} {getattr(node.target, '__name__', node.target)})")
        return tm

    def shape(self, node: fx.Node) -> tuple[int, ...]:
        return tuple(int(s) for s in self.meta(node).shape)

    def value(self, a: Any) -> int:
        """An IR node for an argument: a traced tensor or a Python number."""
        if isinstance(a, fx.Node):
            v = self.env[a]
            if isinstance(v, _TupleRef):
                raise Unsupported(f"{PREFIX} the (values, indices) pair of {v.what}")
            if isinstance(v, _IntInput):
                raise Unsupported(f"{PREFIX} {v.what} (v1 handles float32 only)")
            if isinstance(v, _Transposed):
                raise Unsupported(f"{PREFIX} {v.what} other than as a matmul's operand")
            if v is _DEVICE:
                raise Unsupported(f"{PREFIX} {a.name} (a tensor's .device) other than in "
                                  f"torch.tensor(number, device=...)")
            if not isinstance(v, int):
                raise Unsupported(f"{PREFIX} the non-tensor value {a.name!r}")
            return v
        if isinstance(a, bool) or not isinstance(a, (int, float)):
            raise Unsupported(f"{PREFIX} the argument {a!r} of type {type(a).__name__}")
        return self.b.const(float(a))

    @staticmethod
    def bind(op: str, args: tuple, kwargs: dict) -> dict[str, Any]:
        positional = SIGNATURES.get(op, ("input",))  # unary formulas take just the input
        names = positional + ("inplace",)
        if len(args) > len(positional):
            raise Unsupported(f"{PREFIX} {op} called with {len(args)} positional arguments")
        bound = dict(zip(names, args))
        for key, val in kwargs.items():
            if key in ("_stacklevel",):
                continue
            if key not in names and key not in ("dtype", "approximate", "out"):
                raise Unsupported(f"{PREFIX} {op} with keyword {key}=")
            bound[key] = val
        if bound.get("out") is not None:
            raise Unsupported(f"{PREFIX} {op} with out=")
        dtype = bound.get("dtype")
        if dtype is not None and dtype != torch.float32:
            raise Unsupported(f"{PREFIX} {op} with dtype={dtype}")
        return bound

    def check_inplace(self, node: fx.Node, op: str, bound: dict) -> None:
        """An in-place op is its out-of-place twin only if nothing reads its input later."""
        if not bound.pop("inplace", False):
            return
        src = bound.get("input")
        if isinstance(src, fx.Node) and any(self.order[u] > self.order[node] for u in src.users
                                            if u is not node):
            raise Unsupported(f"{PREFIX} in-place {op} on a tensor that is read afterwards")

    # -- the walk -------------------------------------------------------------------------

    def run(self) -> tuple[int, list[str]]:
        output = None
        for node in self.gm.graph.nodes:
            self.node = node
            try:
                if node.op == "output":
                    output = node.args[0]
                else:
                    self.step(node)
                    self.check_row_shape(node)
            except _Conflict as e:  # a reduction this kernel cannot hold: a boundary may
                raise self.cut(str(e)) from None
        if isinstance(output, (tuple, list)):
            if len(output) != 1:
                raise Unsupported(f"{PREFIX} a forward returning {len(output)} tensors "
                                  f"(v1 writes one output)")
            output = output[0]
        if not isinstance(output, fx.Node):
            raise Unsupported(f"{PREFIX} a forward that returns {type(output).__name__}")
        out = self.value(output)
        if self.b.nodes[out].op not in ARG_REDUCTIONS:  # those are int64, as torch's
            self.b.dtype_of(self.meta(output).dtype, "the output")
        return out, self.inputs

    def check_row_shape(self, node: fx.Node) -> None:
        """After a reduction the kernel iterates over the reduced tensor's shape: a per-element
        value of another shape (a reduced value plus a parameter that broadcasts it to a larger
        tensor, KernelBench L2_75) is a kernel boundary."""
        v = self.env.get(node)
        tm = node.meta.get("tensor_meta")
        if (node.op not in ("call_function", "call_method", "call_module")
                or not isinstance(v, int) or self.b.nodes[v].cls != "elem"
                or self.b.nodes[v].op == "load" or self.b.row_shape is None
                or tm is None or not hasattr(tm, "shape")):
            return  # (operands of other shapes broadcast against S: leaves, not values)
        if tuple(int(d) for d in tm.shape) != tuple(self.b.row_shape):
            raise _Conflict(f"{PREFIX} a value of shape {list(tm.shape)} beside reductions of "
                            f"shape {list(self.b.row_shape)} in one kernel")

    def step(self, node: fx.Node) -> None:
        """Lower one fx node (not the output) into ``self.env``."""
        if is_reshape(node) and self.leaf_view(node):
            return
        if is_reshape(node):
            # A view of a computed value is free between two kernels (stages.py), not in one.
            what = (_callable_name(node.target) if node.op == "call_function"
                    else f"Tensor.{node.target}")
            raise self.cut(f"{PREFIX} {what} (layout/indexing op) inside one kernel")
        if shape_only(node):
            self.env[node] = None  # a size read by views alone: their boundary computes it
            return
        if joined_expand(node):
            self.env[node] = None  # made by the forward for the join after a boundary
            return
        batched = self.batched_transpose(node)
        if batched is not None:  # read in place by the product(s) that take it
            self.env[node] = batched
            return
        if permute_node(node):  # a kernel of its own (copy_of), after a boundary
            raise self.cut(f"{PREFIX} a permutation of a computed value beside other work in "
                           f"one kernel")
        if node.op == "placeholder":
            tm = node.meta.get("tensor_meta")
            if tm is None and node.meta.get(NUMBER_ARG):  # a number: one value per call
                self.inputs.append(str(node.target))
                self.env[node] = self.b.leaf("scalar", str(node.target), len(self.inputs) - 1,
                                             _NUMBER_META)
                return
            if tm is None or not hasattr(tm, "shape"):
                raise Unsupported(f"{PREFIX} the non-tensor forward argument "
                                  f"{node.target!r} (v1 takes tensors only)")
            self.inputs.append(str(node.target))
            if tm.dtype != torch.bool and not tm.dtype.is_floating_point:  # bool: a mask
                self.env[node] = _IntInput(f"{node.target} of dtype "
                                           f"{str(tm.dtype).replace('torch.', '')}")
                return
            self.env[node] = self.b.leaf("input", str(node.target), len(self.inputs) - 1, tm)
        elif node.op == "get_attr" and str(node.target).startswith("_tensor_constant"):
            # a tensor the forward makes from constants (torch.tensor(2.0)), which fx keeps on
            # the traced module, not on the task's: its value, where it is one float
            t = getattr(self.gm, str(node.target))
            if not (isinstance(t, torch.Tensor) and t.numel() == 1 and t.dtype == torch.float32
                    and t.device.type != "meta"):
                raise Unsupported(f"{PREFIX} a tensor constant made in forward (shape "
                                  f"{list(getattr(t, 'shape', []))}, "
                                  f"{str(getattr(t, 'dtype', '?')).replace('torch.', '')})")
            self.env[node] = self.b.const(float(t.item()))
        elif node.op == "get_attr":
            self.env[node] = self.b.leaf("attr", str(node.target), -1, self.meta(node))
        elif node.op == "call_function":
            if node.target in EINSUMS:
                self.env[node] = self.einsum(node)
                return
            if node.target in CATS:  # a kernel of its own (concat_of), after a boundary
                raise self.cut(f"{PREFIX} torch.cat beside other work in one kernel")
            if node.target is packed_attention:  # a kernel of its own (attention_of)
                raise self.cut(f"{PREFIX} attention beside other work in one kernel")
            if node.target in _GEMM_FUNCTIONS:
                self.env[node] = self.gemm_call(node, _GEMM_FUNCTIONS[node.target],
                                                node.args, dict(node.kwargs))
                return
            if node.target in _POOL_FUNCTIONS:
                op, spatial = _POOL_FUNCTIONS[node.target]
                names = _POOL_SIGNATURES[op]
                if len(node.args) > len(names) or any(k not in names for k in node.kwargs):
                    raise _unsupported(f"{op}_pool{spatial}d called with unusual arguments")
                bound = dict(zip(names, node.args), **node.kwargs)
                self.env[node] = self.pool_head(node, op, bound, f"F.{op}_pool{spatial}d", "",
                                                spatial)
                return
            if node.target in _GLOBAL_POOLS:
                what, spatial = _GLOBAL_POOLS[node.target]
                bound = dict(zip(("input", "output_size"), node.args), **node.kwargs)
                if set(bound) != {"input", "output_size"}:
                    raise _unsupported(f"{what} called with unusual arguments")
                self.env[node] = self.global_pool(bound["input"], bound["output_size"],
                                                  spatial, what)
                return
            name = _FUNCTIONS.get(node.target)
            if name is None:
                raise _unsupported(_callable_name(node.target))
            self.env[node] = self.call(node, name, node.args, dict(node.kwargs))
        elif node.op == "call_method" and str(node.target) in _GEMM_METHODS:
            self.env[node] = self.gemm_call(node, str(node.target), node.args,
                                            dict(node.kwargs))
        elif node.op == "call_method":
            base = str(node.target)
            name = base[:-1] if base.endswith("_") and base[:-1] in _METHODS else base
            inplace = name != base
            if base == "unfold":  # with ints, a strided view copied (own_kernels.permute_node)
                raise Unsupported(f"{PREFIX} Tensor.unfold with a dim, size or step other than "
                                  f"an int (the forward computes it)")
            if name not in _METHODS:
                raise _unsupported(f"Tensor.{base}")
            name = _METHOD_ALIASES.get(name, name)
            kwargs = dict(node.kwargs)
            if inplace:
                kwargs["inplace"] = True
            self.env[node] = self.call(node, name, node.args, kwargs)
        elif node.op == "call_module":
            self.env[node] = self.module(node)

    def batched_transpose(self, node: fx.Node) -> _Transposed | None:
        """``b.transpose(-2, -1)`` (or any view swapping b's last two dims) of a forward input
        or parameter of 3 or more dims whose every reader is a batched product taking it as its
        second operand: that product reads b in place, K along its rows (no copy); else None
        (the permutation is a kernel of its own)."""
        src = swapped(node, -2, -1)
        if not (isinstance(src, fx.Node) and src.op in ("placeholder", "get_attr")
                and len(meta_shape(src) or ()) >= 3 and node.users):
            return None
        if not all(_GEMM_FUNCTIONS.get(u.target) in ("matmul", "bmm")
                   if u.op == "call_function" else
                   u.op == "call_method" and str(u.target) in ("matmul", "bmm")
                   for u in node.users) or \
                any(len(u.args) != 2 or u.args[1] is not node or u.args[0] is node
                    for u in node.users):
            return None
        return _Transposed(src, f"the transpose {src.name}.transpose(-2, -1)", batched=True)

    def leaf_view(self, node: fx.Node) -> bool:
        """A view of a forward input or parameter (``a.unsqueeze(1) * b``): the same tensor
        read in the view's shape, which the kernel's broadcast follows (the candidate hands the
        kernel a contiguous tensor, whose elements a view keeps in order). Never the shape the
        kernel iterates over (an anchor): the candidate reads that from a tensor it is given."""
        src = node.args[0] if node.args else None
        load = self.env.get(src) if isinstance(src, fx.Node) else None
        if not isinstance(load, int) or self.b.nodes[load].op != "load":
            return False
        lf, _ = self.b.leaves[self.b.nodes[load].attr("leaf")]
        if lf.source not in ("input", "attr"):
            return False
        view = self.b.leaf(lf.source, lf.name, lf.index, self.meta(node))
        self.b.viewed.add(self.b.nodes[view].attr("leaf"))
        self.env[node] = view
        return True

    # -- the product or convolution at the head of the chain -------------------------------

    def operand(self, a: Any, op: str) -> tuple[Leaf, Any]:
        """Where a GEMM operand comes from: a forward input or a model attribute."""
        if isinstance(a, fx.Node) and a.op == "placeholder":
            return Leaf("input", str(a.target), self.inputs.index(str(a.target))), self.meta(a)
        if isinstance(a, fx.Node) and a.op == "get_attr":
            return Leaf("attr", str(a.target), -1), self.meta(a)
        v = self.env.get(a) if isinstance(a, fx.Node) else None
        if isinstance(v, int) and self.b.nodes[v].op == "load":  # an identity (dropout in eval)
            k = self.b.nodes[v].attr("leaf")
            lf, shape = self.b.leaves[k]
            if (lf.source in ("input", "attr") and k not in self.b.viewed
                    and shape == self.shape(a)):
                return Leaf(lf.source, lf.name, lf.index), self.meta(a)
        raise self.cut(f"{PREFIX} {op} of a computed tensor (v1 fuses what follows one "
                       f"matmul/convolution of inputs and parameters, not what precedes it)")

    def gemm_call(self, node: fx.Node, op: str, args: tuple, kwargs: dict) -> int:
        """torch.matmul / mm / bmm / F.linear / F.conv*d / F.conv_transpose*d (also as methods
        and operator.matmul)."""
        if op in CONV_OPS:
            names = ("input", "weight", "bias") + tuple(k for k, _ in conv_args(op))
        else:
            names = {"matmul": ("input", "other"), "mm": ("input", "mat2"),
                     "bmm": ("input", "mat2"), "linear": ("input", "weight", "bias")}[op]
        if len(args) > len(names) or any(k not in names for k in kwargs):
            raise _unsupported(f"torch.{op} called with unusual arguments ({op})")
        bound = dict(zip(names, args), **kwargs)
        x, w = bound["input"], bound.get("other", bound.get("mat2", bound.get("weight")))
        what = {"matmul": "torch.matmul", "mm": "torch.mm", "bmm": "torch.bmm",
                "linear": "F.linear"}.get(op, f"F.{op}")
        tx, tw = (self.env.get(v) if isinstance(v, fx.Node) else None for v in (x, w))
        trans_a = isinstance(tx, _Transposed)
        # B's last two dims swapped in a batched product: read in place ([..., N, K])
        trans_b = isinstance(tw, _Transposed) and tw.batched
        # (a batched transpose is only ever a second operand: batched_transpose)
        if (trans_a and op not in ("matmul", "mm")) or (isinstance(tw, _Transposed) and op not in
                                                        (("matmul", "bmm") if trans_b
                                                         else ("matmul", "mm"))):
            raise Unsupported(f"{PREFIX} {what} of a transpose (matmul)")
        if trans_a:  # A.T @ B with A of shape [K, M]: the product reads A column-wise
            x = tx.of
        if isinstance(tw, _Transposed) and not trans_b:
            # A @ B.T with B of shape [N, K]: a linear layer's product, B read as its weight
            op, w = "linear", tw.of
        elif trans_b:
            w = tw.of
        if op in CONV_OPS:
            conv = ("const",) + tuple(bound.get(k, d) for k, d in conv_args(op))
            if any(isinstance(v, fx.Node) for v in conv) or isinstance(conv[1], str):
                raise Unsupported(f"{PREFIX} {what} with arguments computed at run time or "
                                  f"padding={conv[2]!r} (convolution)")
            return self.head(node, op, x, w, bound.get("bias"), what, conv)
        if (op in ("matmul", "mm") and not trans_a and isinstance(w, fx.Node)
                and isinstance(x, fx.Node)):
            ws, xs = self.shape(w), self.shape(x)
            if len(xs) == 2 and (len(ws) == 1 or (len(ws) == 2 and ws[1] == 1)):
                return self.matvec(x, w, xs, ws)
        return self.head(node, op, x, w, bound.get("bias"), what, trans_a=trans_a,
                         trans_b=trans_b)

    def triangle(self, x: Any, upper: bool, diagonal: Any, fill: float = 0.0) -> int:
        """torch.triu / torch.tril: the element where its column minus its row (the last two
        dims) is >= (<=) ``diagonal``, else ``fill`` (0; :func:`triangle_fill`: a
        masked_fill's value). The kernels read the element's flat index in the iteration
        shape, so ``x`` must have that shape (checked once it is known)."""
        if isinstance(diagonal, bool) or not isinstance(diagonal, int):
            raise Unsupported(f"{PREFIX} torch.{'triu' if upper else 'tril'} with a diagonal "
                              f"computed at run time")
        shape = self.shape(x)
        v = self.value(x)
        if len(shape) < 2 or self.b.nodes[v].cls != "elem" or self.b.pool is not None:
            raise Unsupported(f"{PREFIX} torch.{'triu' if upper else 'tril'} of a "
                              f"{len(shape)}-D, reduced or pooled value")
        self.b.triangles.append(tuple(int(d) for d in shape))
        attrs = {"fill": float(fill)} if fill != 0 else {}
        return self.b.op("tri", v, upper=bool(upper), diagonal=int(diagonal), **attrs)

    def einsum(self, node: fx.Node) -> int:
        """torch.einsum that is one library product as it stands
        (:func:`tensor_algebra.product_form`); the others were rewritten after shape
        propagation (:func:`tensor_algebra.einsum_products`)."""
        equation, ops = einsum_call(node) or ("", [])
        form = product_form(equation, len(ops))
        if form is None:
            raise Unsupported(f"{PREFIX} torch.einsum {equation!r} (matmul)")
        return self.head(node, form, ops[0], ops[1], None, f"torch.einsum {equation!r}")

    def matvec(self, x: fx.Node, w: fx.Node, xs: tuple, ws: tuple) -> int:
        """``A[M, K] @ v`` with ``v`` of shape ``(K,)`` or ``(K, 1)``: a row reduction."""
        if xs[1] != ws[0]:
            raise Unsupported(f"{PREFIX} a matrix-vector product of shapes {list(xs)} and "
                              f"{list(ws)}")
        self.b.ops.append("matvec")
        a, b = self.value(x), self.value(w)
        # The vector broadcasts along the rows: read it as (K,) whatever its own shape.
        vec = self.b.nodes[b]
        if vec.op != "load":  # pragma: no cover - operands are leaves (value() of a placeholder)
            raise Unsupported(f"{PREFIX} a matrix-vector product of a computed vector")
        lf, _ = self.b.leaves[vec.attr("leaf")]
        self.b.leaves[vec.attr("leaf")] = (lf, (int(ws[0]),))
        prod = self.b.op("mul", a, b)
        return self.b.reduce("sum", prod, (1,), len(ws) == 2, xs)

    def head(self, node: fx.Node, op: str, x: Any, w: Any, bias: Any, what: str,
             conv: tuple = (), trans_a: bool = False, trans_b: bool = False) -> int:
        """The GEMM/convolution: its operands, checks, and a leaf for its result. ``x``, ``w``
        and ``bias`` are fx nodes, or (Leaf, meta) pairs for a module's parameters;
        ``trans_a``: ``x`` is the product's first operand transposed (2-D, [K, M]);
        ``trans_b``: ``w`` is a batched product's second operand with its last two dims
        swapped ([..., N, K])."""
        if self.b.gemm is not None or self.b.pool is not None:
            raise self.cut(f"{PREFIX} a second matmul/convolution ({what}) in one task (v1 "
                           f"fuses one GEMM or library call with the chain after it)")
        a, ma = x if isinstance(x, tuple) else self.operand(x, what)
        b, mb = w if isinstance(w, tuple) else self.operand(w, what)
        xs, ws = tuple(int(d) for d in ma.shape), tuple(int(d) for d in mb.shape)
        if trans_a:  # the checks below read the product's own A, [M, K]
            if len(xs) != 2:
                raise Unsupported(f"{PREFIX} {what} of a transposed {len(xs)}-D operand "
                                  f"(matmul)")
            xs = (xs[1], xs[0])
        if trans_b:  # the checks below read the product's own B, [..., K, N]
            ws = ws[:-2] + (ws[-1], ws[-2])
        if ma.dtype != mb.dtype:
            raise Unsupported(f"{PREFIX} {what} of mixed dtypes")
        if op == "matmul":
            if len(xs) >= 2 and len(ws) == 2 and not trans_b:
                op = "mm"
            elif len(xs) == len(ws) >= 3 and xs[:-2] == ws[:-2]:
                op = "bmm"  # the same leading dims: a batch of products
            else:
                raise Unsupported(f"{PREFIX} torch.matmul of shapes {list(xs)} and {list(ws)} "
                                  f"(v1: an N-D by 2-D product, or a batch of products with "
                                  f"the same leading dims, none broadcast; matmul)")
        if op == "mm" and (len(xs) < 2 or len(ws) != 2 or xs[-1] != ws[0]):
            raise Unsupported(f"{PREFIX} {what} of shapes {list(xs)} and {list(ws)} (matmul)")
        if op == "bmm" and (len(xs) < 3 or len(ws) != len(xs) or xs[:-2] != ws[:-2]
                            or xs[-1] != ws[-2]):
            raise Unsupported(f"{PREFIX} {what} of shapes {list(xs)} and {list(ws)} (matmul)")
        if op == "linear" and (len(xs) < 1 or len(ws) != 2 or xs[-1] != ws[1]):
            raise Unsupported(f"{PREFIX} {what} of shapes {list(xs)} and {list(ws)} (matmul)")
        if op in CONV_OPS:
            nd = CONV_OPS[op] + 2
            if len(xs) != nd or len(ws) != nd:
                raise Unsupported(f"{PREFIX} {what} of a {len(xs)}-D input (v1: batched, "
                                  f"{nd}-D; convolution)")
            if ma.dtype != torch.float32:
                raise Unsupported(f"{PREFIX} {what} of dtype "
                                  f"{str(ma.dtype).replace('torch.', '')} (v1 fuses float32 "
                                  f"convolutions only; convolution)")
        self.b.dtype_of(ma.dtype, "the matmul operands")
        self.b.ops.append(op)
        leaf = self.b.leaf("gemm", "gemm", -1, self.meta(node))
        self.b.gemm = Gemm(op, a, b, len(xs), conv, what=what, trans_a=trans_a,
                           trans_b=trans_b)
        self.b.gemm_node = leaf
        if bias is None:
            self.b.own_bias = leaf
            return leaf
        bl, mbias = bias if isinstance(bias, tuple) else self.operand(bias, f"the bias of {what}")
        bshape = tuple(int(d) for d in mbias.shape)
        if op in CONV_OPS:  # (C,) -> (C, 1, 1): along the channels of NCHW
            bshape = bshape + (1,) * CONV_OPS[op]
        v = self.b.op("add", leaf, self.b.leaf(bl.source, bl.name, bl.index, mbias, bshape))
        self.b.own_bias = v
        return v

    def pool_head(self, node: fx.Node, op: str, bound: dict, what: str, module: str,
                  spatial: int = 2) -> int:
        """max_pool / avg_pool of a forward input: the Pool, and a leaf for its result.
        1-D pooling of an (N, C, L) input is the 2-D pooling of that tensor read as CHW with a
        window of height 1 (planes N, rows C, columns L): the same windows, the same divisor.
        3-D pooling reads (N, C, D, H, W) or (C, D, H, W) with its depth window apart."""
        if self.b.gemm is not None or self.b.pool is not None:
            raise self.cut(f"{PREFIX} {what} after another matmul/convolution/pooling "
                              f"(v1 fuses one head op with the elementwise chain after it; "
                              f"pooling)")
        x, mx = self.operand(bound["input"], what)
        xs = tuple(int(d) for d in mx.shape)
        if len(xs) not in {1: (3,), 2: (3, 4), 3: (4, 5)}[spatial]:
            raise Unsupported(f"{PREFIX} {what} of a {len(xs)}-D input (v1: NCHW or CHW, NCL "
                              f"for 1-D, NCDHW or CDHW for 3-D; pooling)")
        _check_dtype(mx.dtype, f"the input of {what}")
        if bound.get("return_indices"):
            raise Unsupported(f"{PREFIX} {what} with return_indices (index-valued op)")
        n = max(spatial, 2)  # 1-D pooling is 2-D pooling with windows of height 1

        def dims(name: str, default: Any) -> tuple[int, ...]:
            v = bound.get(name, default)
            if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
                v = default
            if isinstance(v, fx.Node):
                raise Unsupported(f"{PREFIX} {what} with {name} computed at run time")
            v = tuple(v) if isinstance(v, (list, tuple)) else (v,) * spatial
            if len(v) == 1:
                v = (v[0],) * n if spatial > 1 else ((0 if name == "padding" else 1), v[0])
            if len(v) != n or not all(isinstance(a, int) and not isinstance(a, bool)
                                      for a in v):
                raise Unsupported(f"{PREFIX} {what} with {name}={bound.get(name)!r}")
            return tuple(int(a) for a in v)

        kernel = dims("kernel_size", None)
        stride = dims("stride", kernel)
        padding = dims("padding", 0)
        dilation = dims("dilation", 1) if op == "max" else (1,) * n
        divisor = bound.get("divisor_override") or 0
        # torch's checks: positive windows, strides and dilations; padding at most half the
        # window (the output's size is checked at run time)
        if (min(kernel) <= 0 or min(stride) <= 0 or min(dilation) <= 0 or min(padding) < 0
                or any(p > k // 2 for p, k in zip(padding, kernel))
                or isinstance(divisor, fx.Node)):
            raise Unsupported(f"{PREFIX} {what} with kernel {kernel}, stride {stride}, "
                              f"padding {padding} (pooling)")
        self.b.ops.append(f"{op}_pool{spatial}d")
        depth = (1, 1, 0, 1)
        if spatial == 3:
            depth = (kernel[0], stride[0], padding[0], dilation[0])
            kernel, stride, padding, dilation = (t[1:] for t in (kernel, stride, padding,
                                                                 dilation))
        self.b.pool = Pool(op, x, kernel, stride, padding, dilation,  # type: ignore[arg-type]
                           bool(bound.get("ceil_mode", False)),
                           bool(bound.get("count_include_pad", True)), int(divisor), module,
                           what, depth, 3 if spatial == 3 else 2)
        leaf = self.b.leaf("pool", "pool", -1, self.meta(node))
        self.b.pool_node = leaf
        return leaf

    def group_norm(self, x: Any, groups: tuple, num_groups: int, w: int | None,
                   bias: int | None, eps: float, what: str) -> int:
        """GroupNorm of an (N, C, ...) tensor: rows are (sample, group), a row is the group's
        channels times the spatial dims (contiguous in memory), the affine is per channel."""
        shape = self.shape(x)
        if len(shape) < 2 or num_groups <= 0 or shape[1] % num_groups:
            raise Unsupported(f"{PREFIX} {what} of shape {list(shape)} with {num_groups} "
                              f"groups")
        return self.normalize(x, tuple(range(1, len(shape))), shape, w, bias, eps, groups)

    def normalize(self, x: Any, dims: tuple[int, ...], shape: tuple, w: int | None,
                  bias: int | None, eps: float, groups: tuple = ()) -> int:
        """(x - mean) / sqrt(var + eps) over the trailing ``dims`` (per group of a row with
        ``groups``), then the affine. Two passes (the mean, then the mean of squared
        deviations): as accurate as torch's Welford without its serial dependency."""
        b, v = self.b, self.value(x)
        mu = b.op("div", b.reduce("sum", v, dims, True, shape, groups), b.cols())
        d = b.op("sub", v, mu)
        var = b.op("div", b.reduce("sum", b.op("mul", d, d), dims, True, shape, groups),
                   b.cols())
        out = b.op("mul", d, b.op("rsqrt", b.op("add", var, b.const(eps))))
        if w is not None:
            out = b.op("mul", out, w)
        if bias is not None:
            out = b.op("add", out, bias)
        return out

    def channel_norm(self, x: Any, m: nn.Module, t: str) -> int:
        """BatchNorm and InstanceNorm of an (N, C, ...) tensor. The verifier runs them in
        training mode, as KernelBench does (``instantiate.task_mode``): InstanceNorm normalizes
        each (sample, channel) over its spatial dims, a row plan; BatchNorm over the batch's
        statistics, dims 0, 2, ...: one block of dims for an (N, C) input (BatchNorm2d/3d are
        decomposed before, ``rewrites._batch_statistics``; an (N, C, L) BatchNorm1d is
        declined by the reduction). A module its task put in eval mode, with running
        statistics, is a per-channel affine ``(x - mean) * rsqrt(var + eps)`` (then the
        module's weight and bias), whose kernel reads the statistics at run time and refuses
        training mode."""
        kind = type(m).__name__
        shape = self.shape(x)
        stats = m.track_running_stats and m.running_mean is not None and not m.training
        # num_features matters only to the affine and the running statistics (torch ignores
        # it, with a warning, in an InstanceNorm that has neither).
        if len(shape) < 2 or ((m.affine or stats) and shape[1] != m.num_features):
            raise Unsupported(f"{PREFIX} nn.{kind} {t!r} of shape {list(shape)}")
        self.b.ops.append("batch_norm" if "Batch" in kind else "instance_norm")
        view = (int(m.num_features),) + (1,) * (len(shape) - 2)
        w = bias = None
        if m.affine:
            w = self.b.leaf("attr", f"{t}.weight", -1, m.weight, view)
            bias = self.b.leaf("attr", f"{t}.bias", -1, m.bias, view)
        if stats:
            self.b.eval_only.append(t)
            b = self.b
            mean = b.leaf("attr", f"{t}.running_mean", -1, m.running_mean, view)
            var = b.leaf("attr", f"{t}.running_var", -1, m.running_var, view)
            scale = b.op("rsqrt", b.op("add", var, b.const(float(m.eps))))
            out = b.op("mul", b.op("sub", self.value(x), mean), scale)
            if w is not None:
                out = b.op("mul", out, w)
            return b.op("add", out, bias) if bias is not None else out
        if "Batch" in kind:  # the batch's statistics: dims 0, 2, ...
            return self.normalize(x, (0,) + tuple(range(2, len(shape))), shape, w, bias,
                                  float(m.eps))
        if len(shape) < 3:
            raise Unsupported(f"{PREFIX} nn.{kind} {t!r} of a {len(shape)}-D input (no spatial "
                              f"dims to normalize each channel over)")
        return self.normalize(x, tuple(range(2, len(shape))), shape, w, bias, float(m.eps))

    def global_pool(self, x: Any, size: Any, spatial: int, what: str) -> int:
        """Adaptive average pooling of ``spatial`` dims to one value per plane (output size 1):
        the mean over those dims, kept as dims of 1. Other output sizes are windows of varying
        extent."""
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size,) * spatial
        if len(sizes) != spatial or any(v != 1 for v in sizes):
            raise Unsupported(f"{PREFIX} {what} to output size {size!r} (v1: 1, the global "
                              f"average; pooling)")
        nd = len(self.shape(x))
        self.b.ops.append("adaptive_avg_pool")
        return self.reduction(x, "mean", tuple(range(nd - spatial, nd)), True)

    def module(self, node: fx.Node) -> Any:
        """A leaf torch.nn module: its op with the module's attributes as arguments."""
        m = self.gm.get_submodule(str(node.target))
        t = str(node.target)
        if type(m) in _LOSS_MODULES:  # the module's settings as the functional's arguments
            names = ("reduction", "beta", "delta", "log_target", "margin", "p", "eps", "swap",
                     "ignore_index", "label_smoothing", "weight")
            kw = {k: getattr(m, k) for k in names if hasattr(m, k)}
            if isinstance(kw.get("weight"), torch.Tensor):
                raise Unsupported(f"{PREFIX} nn.{type(m).__name__} with weight=")
            return self.call(node, _LOSS_MODULES[type(m)], tuple(node.args),
                             {**node.kwargs, **kw})
        if type(m) in RECURRENT_MODULES:  # a kernel of its own (recurrent_of)
            raise self.cut(f"{PREFIX} nn.{type(m).__name__} beside other work in one kernel")
        if node.meta.get(WHY_KEPT):  # a module of torch's attention the rewrites left
            raise Unsupported(f"{PREFIX} nn.{type(m).__name__} {node.meta[WHY_KEPT]}")
        if len(node.args) != 1 or node.kwargs:
            raise _unsupported(f"nn.{type(m).__name__} called with extra arguments")
        x = node.args[0]
        kw = {"inplace": True} if getattr(m, "inplace", False) else {}
        simple = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu",
                  nn.Mish: "mish", nn.SELU: "selu", nn.Softsign: "softsign",
                  nn.Hardsigmoid: "hardsigmoid", nn.Hardswish: "hardswish",
                  nn.Identity: "identity"}
        if type(m) in simple:
            return self.call(node, simple[type(m)], (x,), kw)
        if type(m) is nn.GELU:
            return self.call(node, "gelu", (x,), {"approximate": m.approximate})
        if type(m) is nn.LeakyReLU:
            return self.call(node, "leaky_relu", (x, m.negative_slope), kw)
        if isinstance(m, nn.Hardtanh):  # nn.ReLU6 too
            return self.call(node, "hardtanh", (x, m.min_val, m.max_val), kw)
        if type(m) is nn.ELU:
            return self.call(node, "elu", (x, m.alpha), kw)
        if type(m) is nn.Softplus:
            return self.call(node, "softplus", (x, m.beta, m.threshold), {})
        if isinstance(m, nn.modules.dropout._DropoutNd):
            return self.call(node, "dropout", (x, m.p, m.training), kw)
        if type(m) is nn.Softmax:
            return self.call(node, "softmax", (x, m.dim), {})
        if type(m) is nn.LogSoftmax:
            return self.call(node, "log_softmax", (x, m.dim), {})
        if type(m) is nn.LayerNorm:
            self.b.ops.append("layer_norm")
            w = self.b.leaf("attr", f"{t}.weight", -1, m.weight) if m.weight is not None else None
            bias = self.b.leaf("attr", f"{t}.bias", -1, m.bias) if m.bias is not None else None
            return self.layer_norm(x, tuple(m.normalized_shape), w, bias, m.eps)
        if type(m) is nn.Linear:
            w = (Leaf("attr", f"{t}.weight", -1), m.weight)
            bias = (Leaf("attr", f"{t}.bias", -1), m.bias) if m.bias is not None else None
            return self.head(node, "linear", x, w, bias, f"nn.Linear {t!r}")
        if type(m) in _CONV_MODULES:
            if m.padding_mode != "zeros" or isinstance(m.padding, str):
                raise Unsupported(f"{PREFIX} nn.{type(m).__name__} with padding_mode="
                                  f"{m.padding_mode!r}, padding={m.padding!r} (convolution)")
            w = (Leaf("attr", f"{t}.weight", -1), m.weight)
            bias = (Leaf("attr", f"{t}.bias", -1), m.bias) if m.bias is not None else None
            return self.head(node, _CONV_MODULES[type(m)], x, w, bias,
                             f"nn.{type(m).__name__} {t!r}", ("module", t))
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
            return self.channel_norm(x, m, t)
        if type(m) is nn.GroupNorm:
            self.b.ops.append("group_norm")
            shape = self.shape(x)
            view = (int(m.num_channels),) + (1,) * (len(shape) - 2)
            w = bias = None
            if m.affine:
                w = self.b.leaf("attr", f"{t}.weight", -1, m.weight, view)
                bias = self.b.leaf("attr", f"{t}.bias", -1, m.bias, view)
            return self.group_norm(x, ("attr", t), int(m.num_groups), w, bias, float(m.eps),
                                   f"nn.GroupNorm {t!r}")
        if type(m) in _POOL_MODULES:
            op, spatial = _POOL_MODULES[type(m)]
            names = _POOL_SIGNATURES[op][1:]
            bound = {"input": x, **{k: getattr(m, k) for k in names if hasattr(m, k)}}
            return self.pool_head(node, op, bound, f"nn.{type(m).__name__} {t!r}", t, spatial)
        if isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
            spatial = {nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2}.get(type(m), 3)
            return self.global_pool(x, m.output_size, spatial, f"nn.{type(m).__name__} {t!r}")
        if hasattr(nn, "RMSNorm") and type(m) is nn.RMSNorm:
            self.b.ops.append("rms_norm")
            w = self.b.leaf("attr", f"{t}.weight", -1, m.weight) if m.weight is not None else None
            return self.rms_norm(x, tuple(m.normalized_shape), w, m.eps)
        raise _unsupported(f"nn.{type(m).__name__}")

    def call(self, node: fx.Node, op: str, args: tuple, kwargs: dict) -> Any:
        bound = self.bind(op, tuple(args), kwargs)
        self.check_inplace(node, op, bound)
        x = bound.get("input")
        b = self.b
        self.b.ops.append(op)

        if op == "getitem":
            src = self.env.get(x) if isinstance(x, fx.Node) else None
            if isinstance(src, _TupleRef):
                if bound["index"] == 0:
                    return src.values
                if bound["index"] == 1:
                    return src.indices()
                raise _unsupported(f"element {bound['index']!r} of {src.what}")
            raise _unsupported("tensor indexing/slicing")
        if op == "getattr":
            src = self.env.get(x) if isinstance(x, fx.Node) else None
            if isinstance(src, _TupleRef) and bound["name"] in ("values", "indices"):
                return src.values if bound["name"] == "values" else src.indices()
            if bound["name"] == "T" and isinstance(x, fx.Node) and len(self.shape(x)) == 2:
                return _Transposed(x, f"the transpose {x.name}.T")
            if bound["name"] == "device":  # only torch.tensor(number, device=...) reads it
                return _DEVICE
            raise _unsupported(f"the attribute .{bound['name']}")
        if op == "tensor":  # torch.tensor(number[, device=x.device]): a constant
            data = bound.get("data")  # (a dtype other than float32: bind declined it)
            if not isinstance(data, float):  # an int makes an int64 tensor, a list a vector
                kind = "list" if isinstance(data, (list, tuple)) else type(data).__name__
                raise Unsupported(f"{PREFIX} torch.tensor of {kind} data (v1: a float "
                                  f"number)")
            return b.const(data)
        if op in ("identity", "pos"):
            return self.value(x)
        if op == "dropout":
            if bound.get("training", True) and bound.get("p", 0.5) != 0:
                raise Unsupported(f"{PREFIX} dropout in training mode (random)")
            return self.value(x)

        if op in ("triu", "tril"):
            return self.triangle(x, op == "triu", bound.get("diagonal", 0))
        if op == "triangle_fill":
            return self.triangle(x, bound["upper"], bound["diagonal"], bound["value"])
        if op in _UNARY_FORMULAS:
            return b.op(op, self.value(x))
        if op in ("add", "sub"):
            other = self.value(bound["other"])
            alpha = bound.get("alpha", 1)
            if alpha is not None and alpha != 1:
                other = b.op("mul", other, self.value(alpha))
            return b.op(op, self.value(x), other)
        if op in ("mul", "div"):
            if bound.get("rounding_mode") is not None:
                raise Unsupported(f"{PREFIX} div with rounding_mode")
            return b.op(op, self.value(x), self.value(bound["other"]))
        if op == "pow":
            base, exp = bound["input"], bound["exponent"]
            if isinstance(exp, (int, float)) and not isinstance(exp, bool):
                return b.op("pow_const", self.value(base), exponent=float(exp))
            if isinstance(base, (int, float)) and not isinstance(base, bool):
                return b.op("rpow_const", self.value(exp), base=float(base))
            return b.op("pow", self.value(base), self.value(exp))
        if op == "gelu":
            approx = bound.get("approximate", "none")
            return b.op("gelu_tanh" if approx == "tanh" else "gelu_erf", self.value(x))
        if op == "leaky_relu":
            return b.op("leaky_relu", self.value(x),
                        slope=float(bound.get("negative_slope", 0.01)))
        if op == "elu":
            return b.op("elu", self.value(x), alpha=float(bound.get("alpha", 1.0)))
        if op == "softplus":
            return b.op("softplus", self.value(x), beta=float(bound.get("beta", 1.0)),
                        threshold=float(bound.get("threshold", 20.0)))
        if op == "hardtanh":
            return self.clamp(x, bound.get("min_val", -1.0), bound.get("max_val", 1.0))
        if op in ("clamp", "clamp_min", "clamp_max"):
            return self.clamp(x, bound.get("min"), bound.get("max"))
        if op in ("maximum", "minimum"):
            return b.op("max2" if op == "maximum" else "min2", self.value(x),
                        self.value(bound["other"]))
        if op in ("max", "min"):
            dim = bound.get("dim")
            if isinstance(dim, fx.Node):  # torch.max(a, b): elementwise
                return b.op(f"{op}2", self.value(x), self.value(dim))
            if dim is None:  # torch.max(x): one value, no indices
                return self.reduction(x, op, None, False)
            keep = bool(bound.get("keepdim", False))
            values = self.reduction(x, op, dim, keep)
            return _TupleRef(values, f"torch.{op}(dim=...)",
                             lambda: self.reduction(x, f"arg{op}", dim, keep))
        if op in ("amax", "amin", "sum", "mean", "prod", "argmax", "argmin"):
            return self.reduction(x, op, bound.get("dim"), bool(bound.get("keepdim", False)))
        if op in ("cumsum", "cumprod"):
            shape = self.shape(x)
            dim = bound.get("dim")
            if dim is None:
                raise Unsupported(f"{PREFIX} {op} without a dim")
            (d,) = _norm_dims(dim, len(shape), op)
            return b.scan(op.removeprefix("cum"), self.value(x), d, shape)
        if op == "exclusive_scan":
            shape = self.shape(x)
            (d,) = _norm_dims(bound.get("dim"), len(shape), op)
            return b.scan(bound["kind"], self.value(x), d, shape, exclusive=True)
        if op == "flip":
            return b.flip(self.value(x), _norm_dims(bound.get("dims"), len(self.shape(x)),
                                                    op))
        if op in ("softmax", "log_softmax"):
            return self.softmax(x, bound.get("dim"), log=op == "log_softmax")
        if op == "logsumexp":
            dims = _norm_dims(bound.get("dim"), len(self.shape(x)), op)
            keep = bool(bound.get("keepdim", False))
            m, s, _ = self.exp_sums(x, dims)
            return b.squeeze(b.op("add", b.op("log", s), m), keep)
        if op == "norm":
            return self.norm(x, bound.get("p", "fro"), bound.get("dim"),
                             bool(bound.get("keepdim", False)))
        if op == "vector_norm":
            return self.norm(x, bound.get("ord", 2), bound.get("dim"),
                             bool(bound.get("keepdim", False)))
        if op in _LOSSES:
            return self.loss(op, bound)
        if op == "cross_entropy":  # a kernel of its own (xent_of), after a boundary
            raise self.cut(f"{PREFIX} cross_entropy beside other work in one kernel")
        if op in _ROW_LOSSES:
            raise Unsupported(f"{PREFIX} {op} ({_ROW_LOSSES[op]}: a reduction of reduced "
                              f"values)")
        if op == "normalize":
            p, dim, eps = bound.get("p", 2.0), bound.get("dim", 1), bound.get("eps", 1e-12)
            n = self.norm(x, p, dim, True)
            return b.op("div", self.value(x), self.clamp_value(n, eps, None))
        if op == "layer_norm":
            w, bias = bound.get("weight"), bound.get("bias")
            return self.layer_norm(x, tuple(bound["normalized_shape"]),
                                   self.value(w) if w is not None else None,
                                   self.value(bias) if bias is not None else None,
                                   float(bound.get("eps", 1e-5)))
        if op == "group_norm":
            g = bound.get("num_groups")
            if not isinstance(g, int) or isinstance(g, bool):
                raise Unsupported(f"{PREFIX} F.group_norm with num_groups computed at run time")
            shape = self.shape(x)
            view = (shape[1] if len(shape) > 1 else 1,) + (1,) * max(len(shape) - 2, 0)
            leaves = []
            for key in ("weight", "bias"):
                a = bound.get(key)
                if a is None:
                    leaves.append(None)
                    continue
                lf, meta = self.operand(a, "F.group_norm's affine")
                leaves.append(self.b.leaf(lf.source, lf.name, lf.index, meta, view))
            return self.group_norm(x, ("const", g), g, leaves[0], leaves[1],
                                   float(bound.get("eps", 1e-5)), "F.group_norm")
        if op == "rms_norm":
            w = bound.get("weight")
            return self.rms_norm(x, tuple(bound["normalized_shape"]),
                                 self.value(w) if w is not None else None, bound.get("eps"))
        raise _unsupported(op)  # pragma: no cover - every registered op is handled above

    # -- composite ops, lowered -----------------------------------------------------------

    def clamp(self, x: Any, lo: Any, hi: Any) -> int:
        if isinstance(lo, fx.Node) or isinstance(hi, fx.Node):
            v = self.value(x)
            if lo is not None:
                v = self.b.op("max2", v, self.value(lo))
            if hi is not None:
                v = self.b.op("min2", v, self.value(hi))
            return v
        return self.clamp_value(self.value(x), lo, hi)

    def clamp_value(self, v: int, lo: Any, hi: Any) -> int:
        if lo is None and hi is None:
            raise Unsupported(f"{PREFIX} clamp without bounds")
        attrs = {}
        if lo is not None:
            attrs["lo"] = float(lo)
        if hi is not None:
            attrs["hi"] = float(hi)
        return self.b.op("clamp", v, **attrs)

    def reduction(self, x: Any, op: str, dim: Any, keepdim: bool) -> int:
        shape = self.shape(x)
        # No dim: every dim, a full reduction (the total family), for those that have one.
        dims = _norm_dims(dim, len(shape), op, full=op in ("sum", "mean", "amax", "amin", "max",
                                                          "min"))
        kind = {"sum": "sum", "mean": "sum", "amax": "max", "max": "max", "amin": "min",
                "min": "min", "prod": "prod", "argmax": "argmax", "argmin": "argmin"}[op]
        if (op in ("max", "min", "argmax", "argmin", "prod") and dim is not None
                and len(dims) != 1):
            raise Unsupported(f"{PREFIX} torch.{op} over several dims")
        v = self.value(x)
        r = self.b.reduce(kind, v, dims, keepdim, shape)
        if op == "mean" and r != v:  # (a mean over dims of size 1 is the value itself)
            r = self.b.op("div", r, self.b.cols())
        return r

    def loss(self, op: str, bound: dict) -> int:
        """mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div: torch's per-element loss,
        then its reduction: ``mean`` and ``sum`` over every element (a full reduction),
        kl_div's ``batchmean`` (the sum over the input's first dim's size), ``none`` (the
        elementwise chain itself)."""
        for legacy in ("size_average", "reduce", "weight"):
            if bound.get(legacy) is not None:
                raise Unsupported(f"{PREFIX} {op} with {legacy}=")
        x, t = bound["input"], bound["target"]
        if not (isinstance(x, fx.Node) and isinstance(t, fx.Node)):
            raise Unsupported(f"{PREFIX} {op} of a number")
        b, xv, tv = self.b, self.value(x), self.value(t)
        if op == "kl_div":
            if bound.get("log_target", False):  # exp(t) * (t - x)
                per = b.op("mul", b.op("exp", tv), b.op("sub", tv, xv))
            else:  # xlogy(t, t) - t * x: a zero target contributes 0, as in torch
                per = b.op("sub", b.op("xlogy", tv, tv), b.op("mul", tv, xv))
        else:
            d = b.op("sub", xv, tv)
            if op == "mse_loss":
                per = b.op("mul", d, d)
            elif op == "l1_loss":
                per = b.op("abs", d)
            elif op == "smooth_l1_loss":
                per = b.op("smooth_l1", b.op("abs", d), beta=float(bound.get("beta", 1.0)))
            else:
                per = b.op("huber", b.op("abs", d), delta=float(bound.get("delta", 1.0)))
        reduction = bound.get("reduction", "mean")
        if reduction == "none":
            return per
        shape = tuple(int(d) for d in torch.broadcast_shapes(self.shape(x), self.shape(t)))
        if reduction not in ("mean", "sum") and not (op == "kl_div" and reduction == "batchmean"):
            raise Unsupported(f"{PREFIX} {op} with reduction={reduction!r}")
        if reduction == "batchmean" and len(self.shape(x)) != len(shape):
            raise Unsupported(f"{PREFIX} kl_div batchmean of an input broadcast to "
                              f"{list(shape)}")
        r = b.reduce("sum", per, tuple(range(len(shape))), False, shape)
        if reduction == "mean":
            return b.op("div", r, b.cols())
        if reduction == "batchmean":  # the first dim's size, read at run time
            return b.op("div", r, b.add(Node("size", attrs=(("dim", 0),), cls="uniform")))
        return r

    def exp_sums(self, x: Any, dims: tuple[int, ...]) -> tuple[int, int, int]:
        """max m, sum s of exp(x - m) (both keepdim), and x - m: the stable softmax pieces."""
        shape, v = self.shape(x), self.value(x)
        m = self.b.reduce("max", v, dims, True, shape)
        d = self.b.op("sub", v, m)
        s = self.b.reduce("sum", self.b.op("exp", d), dims, True, shape)
        return m, s, d

    def softmax(self, x: Any, dim: Any, log: bool) -> int:
        if dim is None:
            raise Unsupported(f"{PREFIX} softmax with an implicit dim")
        shape = self.shape(x)
        dims = _norm_dims(dim, len(shape), "softmax")
        _, s, d = self.exp_sums(x, dims)
        if log:
            return self.b.op("sub", d, self.b.op("log", s))
        return self.b.op("div", self.b.op("exp", d), s)

    def norm(self, x: Any, p: Any, dim: Any, keepdim: bool) -> int:
        shape = self.shape(x)
        dims = _norm_dims(dim, len(shape), "norm", full=True)
        v = self.value(x)
        if p in ("fro", 2, 2.0):
            return self.b.op("sqrt", self.b.reduce("sum", self.b.op("mul", v, v), dims,
                                                   keepdim, shape))
        if p in (1, 1.0):
            return self.b.reduce("sum", self.b.op("abs", v), dims, keepdim, shape)
        if p in (math.inf, float("inf"), "inf"):
            return self.b.reduce("max", self.b.op("abs", v), dims, keepdim, shape)
        raise Unsupported(f"{PREFIX} a p={p!r} norm")

    def _trailing(self, x: Any, normalized_shape: tuple[int, ...], what: str) -> tuple:
        shape = self.shape(x)
        k = len(normalized_shape)
        if k == 0 or k > len(shape) or tuple(shape[-k:]) != tuple(normalized_shape):
            raise Unsupported(f"{PREFIX} {what} whose normalized_shape {list(normalized_shape)}"
                              f" is not the input's trailing dims")
        return shape, tuple(range(len(shape) - k, len(shape)))

    def layer_norm(self, x: Any, normalized_shape: tuple, w: int | None,
                   bias: int | None, eps: float) -> int:
        shape, dims = self._trailing(x, normalized_shape, "layer_norm")
        return self.normalize(x, dims, shape, w, bias, eps)

    def rms_norm(self, x: Any, normalized_shape: tuple, w: int | None,
                 eps: float | None) -> int:
        shape, dims = self._trailing(x, normalized_shape, "rms_norm")
        b, v = self.b, self.value(x)
        eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
        ms = b.op("div", b.reduce("sum", b.op("mul", v, v), dims, True, shape), b.cols())
        out = b.op("mul", v, b.op("rsqrt", b.op("add", ms, b.const(eps))))
        if w is not None:
            out = b.op("mul", out, w)
        return out


# ----------------------------------------------------------------------------------------------
# From the lowered graph to a Plan


def _classify(shape: tuple[int, ...], s: tuple[int, ...], name: str
              ) -> tuple[str, int, int, int, int]:
    """How a leaf of ``shape`` broadcasts onto the iteration shape ``s``: (bcast, a, b, a2, b2)
    of :class:`ir.Leaf`."""
    nd = len(s)
    if len(shape) > nd:
        raise Unsupported(f"{PREFIX} {name} of shape {list(shape)} broadcast to {list(s)}")
    padded = (1,) * (nd - len(shape)) + tuple(shape)
    if padded == tuple(s):
        return "full", 0, max(nd - 1, 0), 0, 0
    if math.prod(padded) == 1:
        return "scalar", 0, 0, 0, 0
    dims = [j for j in range(nd) if padded[j] != 1]
    if any(padded[j] != s[j] for j in dims):
        raise Unsupported(f"{PREFIX} {name} of shape {list(shape)} broadcast to {list(s)}")
    # The runs of S's dims the leaf has; S's dims of size 1 join either side.
    runs: list[list[int]] = []
    for j in range(dims[0], dims[-1] + 1):
        if padded[j] == s[j]:
            if runs and runs[-1][1] == j - 1:
                runs[-1][1] = j
            else:
                runs.append([j, j])
    if len(runs) == 1:
        return "block", runs[0][0], runs[0][1], 0, 0
    if len(runs) == 2:
        return "block2", runs[0][0], runs[0][1], runs[1][0], runs[1][1]
    raise Unsupported(f"{PREFIX} {name} of shape {list(shape)} broadcast to {list(s)} "
                      f"(more than two runs of broadcast dims)")


def _finish(builder: _Builder, out: int, inputs: list[str], out_shape: tuple[int, ...]
            ) -> tuple[Plan, tuple[int, ...]]:
    nodes = builder.nodes
    if nodes[out].cls == "uniform":
        raise Unsupported(f"{PREFIX} a forward whose result does not depend on a tensor")
    if nodes[out].op == "load" and out not in (builder.gemm_node, builder.pool_node):
        raise Unsupported(f"{PREFIX} a forward that returns an input unchanged (nothing to "
                          f"compute)")
    # Keep only what the output needs, renumbered in topological order.
    order = sorted(needed_nodes(nodes, out))
    remap = {old: new for new, old in enumerate(order)}
    used_leaves = sorted({nodes[i].attr("leaf") for i in order if nodes[i].op == "load"})
    leaf_remap = {old: new for new, old in enumerate(used_leaves)}

    kind = "row" if builder.row_k is not None else "elementwise"
    s = builder.row_shape if kind == "row" else out_shape
    assert s is not None
    k = builder.row_k or 0
    flips = [i for i in order if nodes[i].op == "flip"]
    if flips:
        raise Unsupported(f"{PREFIX} a flip along dims {list(nodes[flips[0]].attr('dims'))} "
                          f"(v1 flips only around a scan of that dim: flip, cumsum, flip)")
    # Reductions over non-trailing dims, and those the row family lacks (prod, argmax,
    # argmin) even over the trailing dims, are axis plans (see families.axis), so are scans.
    axis = builder.axis
    if axis < 0 and kind == "row" and any(
            nodes[i].op in ("reduce_prod",) + ARG_REDUCTIONS for i in order):
        axis = len(s) - k
    if axis >= 0:
        kind = "axis"
    keepdim = builder.keep.get(out, False) if nodes[out].cls == "row" else False
    # The output's shape must be what the templates produce from S.
    if nodes[out].cls == "elem":
        expected = tuple(s)
    elif kind == "axis":
        expected = tuple(s[:axis]) + ((1,) * k if keepdim else ()) + tuple(s[axis + k:])
    else:
        expected = tuple(s[: len(s) - k]) + ((1,) * k if keepdim else ())
    if tuple(out_shape) != expected:
        raise Unsupported(f"{PREFIX} an output of shape {list(out_shape)} from an iteration "
                          f"shape {list(s)} (broadcast beyond the inputs)")
    if any(shape != tuple(s) for shape in builder.triangles):
        raise Unsupported(f"{PREFIX} torch.triu/tril of a tensor broadcast against others "
                          f"(its mask reads the element's place in the iteration shape)")

    masks = {lf.name for lf, _ in builder.leaves if builder.dtypes.get(lf.name) == "bool"}
    leaves = []
    for old in used_leaves:
        lf, shape = builder.leaves[old]
        bcast, a, bb, a2, b2 = _classify(shape, tuple(s), repr(lf.name))
        if bcast == "block2" and (kind != "elementwise" or builder.gemm is not None
                                  or builder.pool is not None):
            raise Unsupported(f"{PREFIX} {lf.name!r} of shape {list(shape)} broadcast to "
                              f"{list(s)} in a {kind} plan (two runs of broadcast dims: "
                              f"elementwise plans only)")
        leaves.append(dataclasses.replace(lf, bcast=bcast, a=a, b=bb, a2=a2, b2=b2,
                                          dtype="bool" if lf.name in masks else ""))
    anchors = [j for j, (lf, old) in enumerate(zip(leaves, used_leaves))
               if lf.bcast == "full" and old not in builder.viewed]
    if anchors:  # prefer a forward input as the anchor: its shape is what the caller passes
        anchor = min(anchors, key=lambda j: (leaves[j].source != "input", j))
    elif (kind == "elementwise" and builder.gemm is None and builder.pool is None
          and any(lf.source != "scalar" for lf in leaves)
          and not builder.viewed.intersection(used_leaves)):
        # S is the leaves' broadcast shape (an outer sum: x[N, 1] + b[1, C, 1, 1]); never
        # through a view, whose tensor the candidate gets in another shape
        anchor = -1
    else:
        raise Unsupported(f"{PREFIX} an iteration shape {list(s)} that no input has "
                          f"(outer broadcast)")

    gemm, gemm_leaf = builder.gemm, -1
    if gemm is not None:
        found = [j for j, lf in enumerate(leaves) if lf.source == "gemm"]
        if not found:  # the product's result is never used: nothing of it to compute
            gemm = None
        else:
            gemm_leaf = anchor = found[0]
            if leaves[gemm_leaf].bcast != "full":
                raise Unsupported(f"{PREFIX} a {gemm.what} result broadcast to a larger shape "
                                  f"{list(s)}")
            gemm = dataclasses.replace(gemm, trivial=out in (builder.gemm_node,
                                                             builder.own_bias))
            if kind == "axis":  # pragma: no cover - the builder cuts before (head_conflict)
                raise Unsupported(f"{PREFIX} a reduction or scan over a dim after "
                                  f"{gemm.what} (v1 fuses trailing row reductions only)")
            if builder.full:  # pragma: no cover - likewise
                raise Unsupported(f"{PREFIX} a full reduction after {gemm.what} (v1 fuses "
                                  f"rows of a product's result, not one value of all of it)")
    pool, pool_leaf = builder.pool, -1
    if pool is not None:
        found = [j for j, lf in enumerate(leaves) if lf.source == "pool"]
        if not found:  # the pooled value is never used
            pool = None
        else:
            pool_leaf = anchor = found[0]
            if kind != "elementwise" or leaves[pool_leaf].bcast != "full":
                raise Unsupported(f"{PREFIX} a reduction or broadcast after {pool.what} (v1 "
                                  f"fuses an elementwise chain after pooling)")
    groups = builder.groups or ()
    if groups and nodes[out].cls != "elem":
        raise Unsupported(f"{PREFIX} a per-group reduced output (group statistics)")

    # Dtypes: float32, or one of float16/bfloat16 throughout a GEMM with an elementwise
    # epilogue (the tensor-core template).
    names = [lf.name for lf in leaves if lf.source != "gemm"] + ["the output"]
    if gemm is not None:
        names.append("the matmul operands")
    used_masks = [n for n in names if n in masks]
    if used_masks and kind != "axis":
        raise Unsupported(f"{PREFIX} the bool tensor {used_masks[0]!r} here (v1 reads bool "
                          f"masks in reductions and scans over a dim only)")
    low = {builder.dtypes[n] for n in names if n in builder.dtypes and n not in masks}
    dtype = "float32"
    if low:
        ok = (gemm is not None and gemm.matmul and kind == "elementwise" and len(low) == 1
              and all(n in builder.dtypes for n in names))
        if not ok:
            raise Unsupported(f"{PREFIX} tensors of dtype {min(low)} (v1 handles float32, and "
                              f"float16/bfloat16 only for a matmul with an elementwise "
                              f"epilogue, all in one dtype)")
        dtype = low.pop()

    new_nodes = []
    for i in order:
        n = nodes[i]
        attrs = n.attrs
        if n.op == "load":
            attrs = (("leaf", leaf_remap[n.attr("leaf")]),)
        new_nodes.append(Node(n.op, tuple(remap[a] for a in n.args), attrs, n.cls))
    plan = Plan(kind=kind, inputs=tuple(inputs), ndim=len(s), k=k, leaves=tuple(leaves),
                nodes=tuple(new_nodes), output=remap[out], keepdim=keepdim, anchor=anchor,
                gemm=gemm, gemm_leaf=gemm_leaf, groups=tuple(groups), dtype=dtype,
                pool=pool, pool_leaf=pool_leaf, axis=axis if kind == "axis" else -1,
                eval_only=tuple(dict.fromkeys(builder.eval_only)))
    return plan, tuple(s)


# ----------------------------------------------------------------------------------------------
# What the lowering knows, and fx helpers the rewrites share (rewrites.py)


_KNOWN_MODULES = (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.Mish, nn.SELU, nn.Softsign,
                  nn.Hardsigmoid, nn.Hardswish, nn.Identity, nn.GELU, nn.LeakyReLU, nn.Hardtanh,
                  nn.ELU, nn.Softplus, nn.modules.dropout._DropoutNd, nn.Softmax, nn.LogSoftmax,
                  nn.LayerNorm, nn.Linear, nn.GroupNorm, *_POOL_MODULES,
                  nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
                  nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                  *_CONV_MODULES, *_LOSS_MODULES) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm")
                                                     else ())


def first_unknown_op(gm: fx.GraphModule) -> Unsupported | None:
    """The decline for the first op outside the v1 tables, found without shapes."""
    for node in gm.graph.nodes:
        if (node.op == "call_function" and not any(
                node.target in table for table in (_FUNCTIONS, _GEMM_FUNCTIONS, _POOL_FUNCTIONS,
                                                   _GLOBAL_POOLS, RESHAPE_FUNCTIONS))):
            return _unsupported(_callable_name(node.target))
        if (node.op == "call_method" and str(node.target).rstrip("_") not in _METHODS
                and str(node.target) not in _GEMM_METHODS | RESHAPE_METHODS | SIZE_METHODS
                and unfold_source(node) is None):  # windows by ints: a strided view copied
            return _unsupported(f"Tensor.{node.target}")
        if node.op == "call_module":
            m = gm.get_submodule(str(node.target))
            if node.meta.get(WHY_KEPT):  # a module of torch's attention the rewrites left
                return Unsupported(f"{PREFIX} nn.{type(m).__name__} {node.meta[WHY_KEPT]}")
            if not isinstance(m, _KNOWN_MODULES):
                return _unsupported(f"nn.{type(m).__name__}")
    return None


# Where a rewrite of torch's attention modules left a call to the lowering: why (the lowering's
# decline says it, rather than that the module is not in its table).
WHY_KEPT = "assay_why_not_rewritten"
# meta key of a rewrite's result: the node whose shape it has at every size (the ops a
# rewrite made of a module that kept its input's shape, rewrites._batch_statistics)
SAME_SHAPE_AS = "assay_same_shape_as"


def meta_shape(node: Any) -> tuple[int, ...] | None:
    """The shape a node's value had at the analysed size (its ``tensor_meta``), else None."""
    tm = node.meta.get("tensor_meta") if isinstance(node, fx.Node) else None
    return tuple(int(v) for v in tm.shape) if hasattr(tm, "shape") else None


def swapped(node: Any, a: int, b: int) -> fx.Node | None:
    """The tensor that ``node`` views with its dims ``a`` and ``b`` swapped and the others in
    place (``x.transpose(a, b)``, ``swapaxes``, ``permute``; negative dims from the end), else
    None. Needs the shapes (``tensor_meta``)."""
    perm = permutation(node) if isinstance(node, fx.Node) and permute_node(node) else None
    if perm is None or a % len(perm) == b % len(perm):
        return None
    want = list(range(len(perm)))
    want[a % len(perm)], want[b % len(perm)] = want[b % len(perm)], want[a % len(perm)]
    return node.args[0] if perm == tuple(want) else None


def analyze_graph(gm: fx.GraphModule) -> Analysis:
    """One plan of a traced graph whose nodes carry their shapes (``tensor_meta``); raises
    :class:`NeedsCut` where one kernel would have to end, Unsupported for the rest."""
    own = (concat_of(gm) or permute_of(gm) or recurrent_of(gm) or xent_of(gm)
           or attention_of(gm))
    if own is not None:
        return own
    low = _Lowering(gm)
    out, names = low.run()
    out_node = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if isinstance(out_node, (tuple, list)):
        out_node = out_node[0]
    plan, s = _finish(low.b, out, names, tuple(int(d) for d in low.meta(out_node).shape))
    ops = tuple(dict.fromkeys(low.b.ops))
    summary = describe(plan)
    if len(summary) > 160:  # composite ops expand into long formulas: name them instead
        summary = f"{plan.kind} kernel fusing {', '.join(ops)}"
    return Analysis(plan, s, ops, summary, _row_groups(plan, gm))


def shape_value(node: Any) -> bool:
    """An int computed from tensor shapes alone: ``x.size(d)``, ``x.size()`` or ``x.shape`` and
    their items, and + - * // of those and ints."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method" and str(node.target) in SIZE_METHODS:
        return True
    if node.op != "call_function":
        return False
    if node.target is getattr:
        return len(node.args) == 2 and node.args[1] == "shape"
    if node.target is operator.getitem:
        return shape_value(node.args[0]) and isinstance(node.args[1], int)
    if node.target in SHAPE_ARITH:
        return (any(isinstance(a, fx.Node) for a in node.args)
                and all(shape_value(a) or (isinstance(a, int) and not isinstance(a, bool))
                        for a in node.args))
    return False


# Ops whose output has their one tensor argument's shape, whatever the sizes: a size read of
# their output is a size read of their input (stages.shape_expr).
_SAME_SHAPE_OPS = _UNARY_FORMULAS | {"gelu", "dropout", "identity", "leaky_relu", "hardtanh",
                                     "elu", "softplus", "softmax", "log_softmax", "add", "sub",
                                     "mul", "div", "pow", "clamp", "clamp_min", "clamp_max"}
_SAME_SHAPE_MODULES = (nn.ReLU, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.Mish, nn.SELU, nn.Softsign,
                       nn.Hardsigmoid, nn.Hardswish, nn.Identity, nn.GELU, nn.LeakyReLU,
                       nn.Hardtanh, nn.ELU, nn.Softplus, nn.modules.dropout._DropoutNd,
                       nn.Softmax, nn.LogSoftmax, nn.modules.batchnorm._BatchNorm,
                       nn.modules.instancenorm._InstanceNorm, nn.LayerNorm, nn.GroupNorm)


def same_shape_source(node: fx.Node) -> fx.Node | None:
    """The tensor whose shape ``node``'s output has for every size (an activation, a dropout,
    a normalization of it, arithmetic with numbers, a rewrite's result that says so:
    ``SAME_SHAPE_AS``), or None."""
    same = node.meta.get(SAME_SHAPE_AS)
    if isinstance(same, fx.Node) and not getattr(same, "_erased", False):
        return same
    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    if len(tensors) != 1 or node.args[0] is not tensors[0] or any(
            isinstance(v, fx.Node) for v in node.kwargs.values()):
        return None
    if node.op == "call_module":
        return tensors[0] if isinstance(module_of(node), _SAME_SHAPE_MODULES) else None
    if node.op == "call_function":
        name = _FUNCTIONS.get(node.target)
    elif node.op == "call_method":
        name = str(node.target).rstrip("_")
        name = _METHOD_ALIASES.get(name, name)
    else:
        return None
    return tensors[0] if name in _SAME_SHAPE_OPS else None


def shape_only(node: fx.Node) -> bool:
    """A shape value that only views and other such values read (so no kernel computes it)."""
    return (shape_value(node) and bool(node.users)
            and all(is_reshape(u) or shape_only(u) or joined_expand(u)
                    or (u.op == "call_method" and str(u.target) == "unfold")
                    for u in node.users))


def joined_expand(node: fx.Node) -> bool:
    """``self.p.expand(sizes)`` of a model attribute whose every reader is a torch.cat: a
    view the forward makes for the join (ViT's class token), no kernel's work."""
    return (node.op == "call_method" and str(node.target) == "expand" and not node.kwargs
            and len(node.args) >= 2 and isinstance(node.args[0], fx.Node)
            and node.args[0].op == "get_attr" and bool(node.users)
            and all(concat_node(u) for u in node.users))


def _row_groups(plan: Plan, model: Any) -> int:
    """How many rows each row of the output's shape makes (GroupNorm's groups), or 1."""
    if not plan.groups:
        return 1
    if plan.groups[0] == "const":
        return int(plan.groups[1])
    try:
        return int(functools.reduce(getattr, plan.groups[1].split("."), model).num_groups)
    except (AttributeError, TypeError, ValueError):
        return 1  # defaults only: the kernel reads the groups at run time
