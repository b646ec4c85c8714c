"""The offline synthesizer's plans: what a kernel computes, independent of sizes.

:mod:`graph` lowers a traced task into these; :mod:`stages` chains them into multi-kernel
plans; the families (``families/``) write code for them. Nothing here traces or runs a model.
A :class:`Plan` is one fused kernel (``elementwise``, ``row`` or ``axis``, possibly opening with
a :class:`Gemm` or a :class:`Pool`); :class:`Concat`, :class:`Permute` and :class:`Recurrent`
are kernels of their own (a join, a strided view copied, an RNN; :class:`CrossEntropy`, a loss
over rows of a per-row reduction) between a multi-kernel plan's
fused ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import fx


PREFIX = "offline synthesizer v1 cannot express"

# Index-valued reductions: their int64 result can only be the plan's output.
ARG_REDUCTIONS = ("reduce_argmax", "reduce_argmin")


class Unsupported(Exception):
    """The task is outside what the offline synthesizer can write; ``str(e)`` says why."""


class NeedsCut(Unsupported):
    """What one kernel cannot fuse (a second product, a reduction of a reduced value, ...) but a
    kernel boundary right before fx node ``before`` may: see :mod:`stages`. Without a boundary
    it is a decline like any other."""

    def __init__(self, reason: str, before: fx.Node):
        super().__init__(reason)
        self.before = before


@dataclass(frozen=True)
class Leaf:
    """A tensor read by the kernel.

    ``source`` is ``"input"`` (forward argument number ``index``, named ``name``), ``"attr"``
    (a parameter, buffer or tensor attribute at dotted path ``name`` on the model) or
    ``"scalar"`` (a forward argument that is a Python number: a 0-d tensor the candidate makes
    from it at each call).
    ``bcast`` is how it maps onto the iteration shape S (``ndim`` dims): ``"full"`` (same shape),
    ``"scalar"`` (one element) or ``"block"``: its non-1 dims are S's dims ``a..b`` inclusive, so
    element ``i`` of S reads ``(i // inner) % mid`` with ``inner = prod(S[b+1:])`` and
    ``mid = prod(S[a:b+1])`` (a bias ``(C,)`` is the block of the last dim); ``"block2"``: its
    non-1 dims are two such blocks, ``a..b`` and ``a2..b2`` (``a2 > b + 1``), element ``i``
    reading ``((i // inner) % mid) * mid2 + (i // inner2) % mid2`` (a sum over a middle dim
    kept, ``(B, 1, K)``, against ``(B, D, K)``; elementwise plans only).
    ``dtype``: "" (the plan's dtype) or "bool" (a mask, read as 0/1; axis plans only).
    """

    source: str
    name: str
    index: int
    bcast: str = "full"
    a: int = 0
    b: int = 0
    dtype: str = ""
    a2: int = 0
    b2: int = 0


@dataclass(frozen=True)
class Node:
    """One value. ``op`` is a formula name (see families.shared.FORMULAS), ``load``, ``const``,
    ``cols`` (the row length, or an axis plan's reduced length), ``size`` (the run-time size
    of S's dim ``dim``: kl_div's batchmean, in full reductions only) or
    ``reduce_sum``/``reduce_max``/``reduce_min``; axis plans add ``reduce_prod``,
    ``reduce_argmax``/``reduce_argmin`` (int64 indices, first of ties; only as the output) and
    the scans ``scan_sum``/``scan_prod`` (``elem`` class; attr ``reverse``: from the end;
    ``exclusive``: each element the scan of those before it, the first the identity).

    ``cls``: ``elem`` (per element of S), ``row`` (per row) or ``uniform`` (one value).
    ``attrs`` is a sorted tuple of (name, value) pairs so plans compare and hash by value.
    """

    op: str
    args: tuple[int, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    cls: str = "elem"

    def attr(self, name: str, default: Any = None) -> Any:
        return dict(self.attrs).get(name, default)


@dataclass(frozen=True)
class Gemm:
    """The matrix product or convolution at the head of a plan (see the module doc).

    ``op``: ``mm`` (``A[..., M, K] @ B[K, N]``), ``bmm`` (``A[..., M, K] @ B[..., K, N]``, the
    same leading dims: a batch of products; with ``trans_b``, B given as its transpose
    ``[..., N, K]``, as ``q @ k.transpose(-2, -1)`` reads k),
    ``linear`` (``A[..., K] @ W[N, K]^T``) or a convolution of :data:`CONV_OPS` (``conv2d``:
    NCHW; ``conv_transpose3d``: NCDHW, ...). ``a`` and ``b`` say where the operands come from (a
    forward input or a model attribute; ``bcast`` is unused). ``conv``: ``("module", path)``
    (the arguments read from that nn.Conv*d/ConvTranspose*d at run time) or ``("const",
    *args)``: the functional call's arguments after the bias, in its order (stride, padding,
    dilation, groups; transposed: stride, padding, output_padding, groups, dilation).
    ``trivial``: what follows the
    product is at most the op's own bias, so a library call plus an epilogue kernel would only
    redo the library's work. ``what`` names the op for descriptions and declines.
    """

    op: str
    a: Leaf
    b: Leaf
    a_ndim: int
    conv: tuple = ()
    trivial: bool = False
    what: str = ""
    trans_a: bool = False  # mm/linear: A given as its transpose (``A.T @ B``), stored [K, M]
    trans_b: bool = False  # bmm: B given as its transpose, stored [..., N, K]

    @property
    def b_rows(self) -> bool:
        """Whether B is stored with K along its rows (``[..., N, K]``): a linear layer's
        weight, or a batched product's transposed B."""
        return self.op == "linear" or self.trans_b

    @property
    def matmul(self) -> bool:
        return self.op in ("mm", "bmm", "linear")

    @property
    def is_conv(self) -> bool:
        return self.op in CONV_OPS


# Convolutions the head may be (the gemm family's conv template, or the library form:
# torch.nn.functional.<op>), with their spatial dims.
CONV_OPS = {"conv1d": 1, "conv2d": 2, "conv3d": 3, "conv_transpose1d": 1,
            "conv_transpose2d": 2, "conv_transpose3d": 3}


# The functional forms' arguments after (input, weight, bias), with their defaults.
_CONV_ARGS = (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1))

_CONV_TRANSPOSE_ARGS = (("stride", 1), ("padding", 0), ("output_padding", 0), ("groups", 1),
                        ("dilation", 1))


def conv_args(op: str) -> tuple[tuple[str, Any], ...]:
    """The arguments of ``torch.nn.functional.<op>`` after the bias, with their defaults."""
    return _CONV_TRANSPOSE_ARGS if op.startswith("conv_transpose") else _CONV_ARGS


@dataclass(frozen=True)
class Pool:
    """2-D or 3-D max or average pooling of a forward input (NCHW or CHW; NCDHW or CDHW when
    ``spatial`` is 3) at the head of a plan; its result is leaf ``pool_leaf`` and what follows
    is an elementwise epilogue. Pairs are (height, width); ``depth`` is the window along D of
    3-D pooling as (kernel, stride, padding, dilation), (1, 1, 0, 1) for 2-D (and for 1-D,
    lowered as 2-D). ``divisor`` 0 = none (``divisor_override``); ``module``: the nn module's
    path whose attributes must still match at run time ("" for F calls)."""

    op: str  # "max" or "avg"
    x: Leaf
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor: int = 0
    module: str = ""
    what: str = ""
    depth: tuple[int, int, int, int] = (1, 1, 0, 1)  # along D: kernel, stride, padding, dilation
    spatial: int = 2  # the pooled dims the kernel reads: 2 (1-D runs as 2-D) or 3


@dataclass(frozen=True)
class Plan:
    """What to compute, independent of sizes. ``kind`` is ``elementwise``, ``row`` or ``axis``
    (a reduction or scan over the dims ``S[axis:axis + k]``, which do not all trail for a
    reduction; see the module doc)."""

    kind: str
    inputs: tuple[str, ...]  # the forward's parameter names, in order
    ndim: int  # rank of the iteration shape S
    k: int  # row plans: the trailing dims reduced (rows x cols with cols = prod(S[-k:]));
    # axis plans: the dims reduced or scanned, S[axis:axis + k]; k == ndim: a full
    # reduction (one row)
    leaves: tuple[Leaf, ...]
    nodes: tuple[Node, ...]
    output: int
    keepdim: bool  # row plans whose output is a row value: keep the reduced dims as size 1
    anchor: int  # a full leaf: its run-time shape is S (-1: S is the leaves' broadcast shape)
    gemm: Gemm | None = None  # the product/convolution whose result is leaf ``gemm_leaf``
    gemm_leaf: int = -1
    # Row plans whose rows are groups of the trailing dims (GroupNorm): ("attr", path of the
    # module whose num_groups it is) or ("const", groups); () for plain rows.
    groups: tuple = ()
    dtype: str = "float32"  # of every leaf and the output (float16/bfloat16: GEMM plans only)
    pool: Pool | None = None  # the pooling whose result is leaf ``pool_leaf``
    pool_leaf: int = -1
    # Modules computed with their eval-mode semantics (BatchNorm's running statistics): the
    # candidate refuses to run in training mode.
    eval_only: tuple[str, ...] = ()
    axis: int = -1  # axis plans: the first reduced or scanned dim

    @property
    def out_dtype(self) -> str:
        """The output's dtype: int64 for an argmax/argmin, else the plan's."""
        return "int64" if self.nodes[self.output].op in ARG_REDUCTIONS else self.dtype

    @property
    def head_leaf(self) -> int:
        """The leaf a head op (product, convolution, pooling) computes; -1 without one."""
        return self.gemm_leaf if self.gemm is not None else self.pool_leaf

    @property
    def out_is_row(self) -> bool:
        return self.nodes[self.output].cls == "row"

    def reductions(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.op.startswith("reduce_")]


@dataclass(frozen=True, kw_only=True)
class OwnKernel:
    """What the families' matchers and the synthesizer read of any plan, for the plans that
    are a kernel of their own in a multi-kernel plan (Concat, Permute, Recurrent): float32, no
    head op (a product, a pooling) to fuse after."""

    dtype: str = "float32"
    gemm: Any = None
    pool: Any = None
    head_leaf: int = -1


@dataclass(frozen=True)
class Concat(OwnKernel):
    """``torch.cat(parts, dim)``: a kernel of its own in a multi-kernel plan (stages.py), which
    copies each part into its slice of the output. Its operands are the stage's arguments
    (forward inputs and earlier stages' outputs), never a value it computes."""

    inputs: tuple[str, ...]  # the stage's arguments, in order
    # the tensors joined, in order (names among ``inputs``; may repeat), an int k standing
    # for k slices of zeros (own_kernels.zero_padded_cat)
    parts: tuple[str | int, ...]
    dim: int  # the joined dim, non-negative
    ndim: int
    kind: ClassVar[str] = "concat"


PERMUTE_MAX_DIMS = 6  # the permute kernel's geometry: sizes and strides of at most this many dims


@dataclass(frozen=True)
class Permute(OwnKernel):
    """A strided view of a stage's argument made contiguous: a kernel of its own in a
    multi-kernel plan (a ShuffleNet's channel shuffle, the last step of an RNN's output, ViT's
    patches). The view is a chain of permutations (``permute``, ``transpose``), basic indexing
    (``out[:, -1, :]``) and sliding windows (``unfold``), which the candidate makes (metadata
    only) and the kernel copies."""

    inputs: tuple[str, ...]  # the stage's arguments, in order
    src: str  # the tensor read (a name among ``inputs``)
    view: str  # the view of ``src``, as Python source after it (".permute(0, 2, 1)[:, -1]")
    ndim: int  # the view's dims
    kind: ClassVar[str] = "permute"


@dataclass(frozen=True)
class Recurrent(OwnKernel):
    """``nn.GRU`` or ``nn.LSTM`` over a batch of sequences, every layer and direction: a kernel
    of its own in a multi-kernel plan. The module's sizes and settings are read at run time;
    ``result`` is which of its outputs the task keeps."""

    inputs: tuple[str, ...]  # the stage's arguments, in order
    cell: str  # "gru" or "lstm"
    module: str  # the module's path in the model
    x: str  # the input sequences (a name among ``inputs``)
    h0: str = ""  # the initial hidden state ("": zeros)
    c0: str = ""  # LSTM: the initial cell state ("": zeros)
    result: str = "output"  # "output", "h_n" or "c_n"
    kind: ClassVar[str] = "recurrent"


@dataclass(frozen=True)
class Attention(OwnKernel):
    """Multi-head self-attention from one packed projection ``qkv`` [B, T, 3C] (q, k and v its
    thirds, each [B, T, heads, C / heads] seen as [B, heads, T, C / heads]), as minGPT writes
    it: ``act(masked(q @ k^T * scale)) @ v`` with the heads put back side by side, [B, T, C].
    ``act`` is the softmax over the keys or ReLU; ``mask`` a buffer of the model (its top-left
    T x T block, broadcast over batch and heads) whose zeros make a score -inf. A kernel of its
    own in a multi-kernel plan: the projections before and after it are stages of their own."""

    inputs: tuple[str, ...]  # the stage's arguments, in order
    qkv: str  # the packed projection (a name among ``inputs``)
    split: int  # C: each of q, k and v's width
    heads: int
    scale: float
    act: str = "softmax"  # or "relu"
    mask: str = ""  # the mask buffer's path in the model ("": none)
    kind: ClassVar[str] = "attention"


@dataclass(frozen=True)
class CrossEntropy(OwnKernel):
    """``F.cross_entropy(x, target)`` (or ``nn.CrossEntropyLoss``) of float32 logits ``[N, C]``
    and int64 class indices ``[N]``: per row, the logsumexp minus the target's logit (0 where
    the target is ``ignore_index``), then their mean over the rows not ignored, their sum, or
    the rows as they are (``reduction``). A kernel of its own in a multi-kernel plan: the
    per-row reduction and the reduction of those are one entry point."""

    inputs: tuple[str, ...]  # the stage's arguments, in order
    x: str  # the logits (a name among ``inputs``)
    target: str  # the class indices (a forward input)
    module: str = ""  # nn.CrossEntropyLoss's path: its settings are read at run time
    reduction: str = "mean"  # the functional's (module: the module's at run time)
    ignore_index: int = -100
    kind: ClassVar[str] = "xent"


@dataclass(frozen=True)
class Analysis:
    plan: Plan  # or a stages.Pipeline: one plan per kernel, in order
    shape: tuple[int, ...]  # S at the analysed size (for default knobs only, never in code)
    ops: tuple[str, ...]  # the task's ops as recognized, for descriptions
    summary: str
    row_groups: int = 1  # rows per row of S (plan.groups) at the analysed size, likewise


def needed_nodes(nodes: list[Node] | tuple[Node, ...], j: int) -> set[int]:
    """Node ``j`` and every node it reads, transitively (indices into ``nodes``)."""
    need: set[int] = set()
    stack = [j]
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(nodes[i].args)
    return need


def structure(plan: Any) -> Any:
    """What of a plan (or a multi-kernel plan's stages) must not depend on the task's size."""
    stages = getattr(plan, "stages", None)
    return plan if stages is None else (tuple(s.plan for s in stages), plan.views, plan.prelude)


def describe(plan: Plan) -> str:
    """A short human-readable formula of the plan, for docstrings and logs."""
    names: dict[int, str] = {}
    for i, n in enumerate(plan.nodes):
        args = [names[a] for a in n.args]
        if n.op == "load":
            lf = plan.leaves[n.attr("leaf")]
            if lf.source == "pool" and plan.pool is not None:
                pl, x = plan.pool, plan.pool.x
                k, s, p = pl.kernel, pl.stride, pl.padding
                if pl.spatial == 3:
                    k, s, p = ((pl.depth[j],) + t for j, t in enumerate((k, s, p)))
                names[i] = (f"{pl.op}_pool{pl.spatial}d("
                            f"{x.name if x.source == 'input' else 'self.' + x.name}, "
                            f"k={k}, s={s}, p={p})")
            elif lf.source == "gemm" and plan.gemm is not None:
                g = plan.gemm
                ops = [o.name if o.source == "input" else f"self.{o.name}" for o in (g.a, g.b)]
                if g.trans_b:
                    ops[1] += ".transpose(-2, -1)"
                names[i] = f"{g.op}({', '.join(ops)})"
            else:
                names[i] = lf.name if lf.source == "input" else f"self.{lf.name}"
        elif n.op == "const":
            names[i] = f"{n.attr('value'):g}"
        elif n.op == "cols":
            names[i] = "N"
        elif n.op in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[n.op]
            names[i] = f"({args[0]} {sym} {args[1]})"
        else:
            extra = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in n.attrs]
            names[i] = f"{n.op}({', '.join(args + extra)})"
    return names[plan.output]
