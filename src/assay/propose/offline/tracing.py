"""Tracing a task's forward into an fx graph whose nodes carry their shapes.

:class:`Tracer` is fx's tracer with the module's buffers as graph values and the guards a
forward may branch on (devices, known dtypes) decided while tracing; :func:`trace` builds the
task's model (on meta tensors, or small real ones), traces it, runs the rewrites
(:mod:`rewrites`) and propagates shapes. :func:`graph.analyze_graph` lowers the result.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import operator
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from assay.propose.offline.graph import NUMBER_ARG, first_unknown_op
from assay.propose.offline.ir import PREFIX, Unsupported
from assay.propose.offline.own_kernels import RECURRENT_MODULES
from assay.propose.offline.rewrites import (attention_blocks, attention_products, augmented_alias,
                                            decompose, device_moves, drop_dead, encoder_layers,
                                            encoders, exclusive_scans, follow_writes,
                                            module_state, multihead_attention, on_common_device,
                                            one_node_per_attribute, triangle_masks, zero_joins)
from assay.propose.offline.tensor_algebra import (EINOPS_FUNCTIONS, einops, einops_calls,
                                                  einops_decline, einsum_products)
from assay.tasks.instantiate import init_inputs, make_inputs, task_mode


def _meta_model(mod: Any) -> nn.Module:
    """The task's model with meta parameters (no memory), in the mode the verifier runs it
    (``instantiate.task_mode``: norms on batch statistics, the rest in eval mode)."""
    args = init_inputs(mod)
    try:
        with torch.device("meta"):
            model = mod.Model(*args)
    except Exception:  # noqa: BLE001 - an __init__ that needs real data: build it on the CPU
        model = mod.Model(*args)
    return task_mode(model)


def _meta_inputs(mod: Any) -> list:
    try:
        with torch.device("meta"):
            values = mod.get_inputs()
        return list(values)
    except Exception:  # noqa: BLE001 - fall back to real (small) CPU inputs
        return make_inputs(mod, seed=0, device="cpu")


# Factories of random values: a forward that draws them matches no reference.
_RANDOM = frozenset((torch.rand, torch.randn, torch.randint, torch.randperm, torch.rand_like,
                     torch.randn_like, torch.randint_like, torch.normal, torch.bernoulli,
                     torch.multinomial, torch.poisson))
# Factories of the sizes given: traced as a node where a size is a traced value (a constant
# mask of a traced length, ``torch.ones(T, T)``), as other calls with a traced argument are;
# the random ones too, so that the decline names them (_RANDOM).
_SIZED_FACTORIES = (torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.eye,
                    torch.rand, torch.randn, torch.randint, torch.randperm)
# The dtypes torch reads Python's types as (``torch.ones(n, dtype=bool)``).
_PYTHON_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64,
                  complex: torch.complex128}


class Tracer(fx.Tracer):
    """fx's tracer with the module's buffers as graph values (``get_attr``), as its parameters
    are: a forward that slices a buffer by a traced size (a causal mask cut to the sequence,
    ``self.bias[:, :, :T, :T]``) traces, where a plain tensor cannot take a traced index.

    A branch on a comparison of devices or dtypes (a guard such as NetVLAD's ``if x.device !=
    self.clusters.device: raise ...``) is decided while tracing, so that the branch not taken
    is not traced: the verifier runs the module and its inputs on one device, so two values
    computed from them share it; the dtypes of the forward's inputs (``inputs``, in the
    forward's order) and of the module's tensors are known. Any other branch on a traced value
    is a :class:`fx.proxy.TraceError` that says so."""

    proxy_buffer_attributes = True

    def __init__(self, inputs: list | tuple = ()) -> None:
        # einops' functions are recorded as one node each (a traced value has no shape for
        # einops to read), rewritten once shapes are known (tensor_algebra.einops_calls), and
        # torch's factories likewise where a size is traced. fx finds the functions to wrap
        # in the forward's globals; torch's and einops' namespaces are searched too, for
        # ``torch.ones(...)`` and ``einops.rearrange(...)``.
        super().__init__(autowrap_functions=EINOPS_FUNCTIONS + _SIZED_FACTORIES)
        self._autowrap_search.append(torch)
        if einops is not None:
            self._autowrap_search.append(einops)
        self._inputs = list(inputs)

    def create_arg(self, a: Any) -> Any:
        # ``dtype=bool`` (a Python type, which torch reads as its dtype) as that dtype: fx
        # records no types
        if isinstance(a, type) and a in _PYTHON_DTYPES:
            return _PYTHON_DTYPES[a]
        return super().create_arg(a)

    def to_bool(self, obj: fx.Proxy) -> bool:
        node = obj.node
        if (node.op == "call_function" and node.target in (operator.eq, operator.ne)
                and len(node.args) == 2 and not node.kwargs):
            sides = [self._known(a) for a in node.args]
            if None not in sides and sides[0][0] == sides[1][0]:
                return (sides[0] == sides[1]) == (node.target is operator.eq)
        raise fx.proxy.TraceError(
            f"control flow on a traced value ({_written(node)}): only a comparison of two "
            f"tensors' devices, or of the forward's inputs' and the module's tensors' dtypes, "
            f"is decided while tracing")

    def _known(self, arg: Any) -> tuple[str, Any] | None:
        """``("device", None)`` for ``t.device`` of a value on the module's and inputs' device
        (all are one), ``("dtype", dtype)`` for a known dtype; None where it is not known."""
        if isinstance(arg, torch.dtype):
            return ("dtype", arg)
        if not (isinstance(arg, fx.Node) and arg.op == "call_function" and arg.target is getattr
                and len(arg.args) == 2 and arg.args[1] in ("device", "dtype")):
            return None
        tensor, attr = arg.args
        if attr == "device":
            return ("device", None) if on_common_device(tensor, self._root) else None
        value = self._concrete(tensor)
        return ("dtype", value.dtype) if isinstance(value, torch.Tensor) else None

    def _concrete(self, node: Any) -> Any:
        """The forward's input or the module's tensor that ``node`` is, else None."""
        if not isinstance(node, fx.Node):
            return None
        if node.op == "placeholder":
            index = [n for n in node.graph.nodes if n.op == "placeholder"].index(node)
            return self._inputs[index] if index < len(self._inputs) else None
        if node.op == "get_attr":
            owner, name = self._owner(node)
            for table in (owner._parameters, owner._buffers, vars(owner)):
                if name in table:
                    return table[name]
        return None

    def _owner(self, node: fx.Node) -> tuple[nn.Module, str]:
        """The module holding ``get_attr`` node's tensor, and its name there: through the
        modules' own tables, since while tracing the tracer's patched ``Module.__getattr__``
        would hand back the proxy of a parameter."""
        *path, name = str(node.target).split(".")
        return functools.reduce(lambda m, part: m._modules[part], path, self.root), name

    def _root(self, node: fx.Node) -> bool | None:
        """For :func:`on_common_device`: whether ``node`` (an input or a module tensor) is a
        tensor that the verifier puts on its device, None where it is no tensor. A plain tensor
        attribute is not one: ``Module.to`` moves parameters and buffers only."""
        if node.op == "get_attr":
            owner, name = self._owner(node)
            if name not in owner._parameters and name not in owner._buffers and \
                    isinstance(vars(owner).get(name), torch.Tensor):
                return False
        return True if isinstance(self._concrete(node), torch.Tensor) else None


def _written(node: Any) -> str:
    """A traced value as the forward wrote it, near enough to find it: ``gt(sum_1, 0)``,
    ``x.device``."""
    if not isinstance(node, fx.Node):
        return repr(node)
    if node.op == "call_function" and node.target is getattr:
        return f"{_written(node.args[0])}.{node.args[1]}"
    if node.op in ("call_function", "call_method"):
        name = getattr(node.target, "__name__", str(node.target))
        return f"{name}({', '.join(_written(a) for a in node.args)})"
    return node.name


def _tensor_attributes(model: nn.Module) -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """The model's tensors that are plain attributes (not parameters or buffers), by qualified
    name: the module that holds each and the tensor."""
    return {f"{path}.{name}" if path else name: (m, value)
            for path, m in model.named_modules()
            for name, value in vars(m).items() if isinstance(value, torch.Tensor)}


def _restore(attributes: dict[str, tuple[nn.Module, torch.Tensor]]) -> set[str]:
    """Give each module its tensor attribute back where the traced forward set another value;
    the qualified names of those."""
    reassigned = set()
    for qualified, (m, value) in attributes.items():
        name = qualified.rsplit(".", 1)[-1]
        if vars(m).get(name) is not value:
            vars(m)[name] = value
            reassigned.add(qualified)
    return reassigned


def _unpassed_nones(model: nn.Module, inputs: list) -> dict[str, None] | None:
    """The forward's arguments past those ``get_inputs`` gives whose default is None, each as
    None: traced so, ``if initial_states is None:`` takes the branch the verifier's calls take
    (a traced argument is never None); fx checks the value in the graph, a check that
    ``drop_dead`` drops with the argument."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    nones = {p.name: None for p in params[len(inputs):]
             if p.default is None and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return nones or None


def trace(mod: Any, real: bool = False) -> fx.GraphModule:
    """One executed task module (see :meth:`Task.module`) traced, its dead values dropped, its
    composite losses decomposed and every node's shape propagated (``tensor_meta``).

    Shapes are propagated on meta tensors (no memory at any size), or with ``real`` on real
    CPU tensors: for a small task that is faster, because the first use of meta kernels imports
    torch's meta registrations and decompositions (about 1.5 s of every translate/evolve step
    of a CPU campaign)."""
    try:
        if real:
            model = task_mode(mod.Model(*init_inputs(mod)))
            inputs = make_inputs(mod, seed=0, device="cpu")
        else:
            model, inputs = _meta_model(mod), _meta_inputs(mod)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"{PREFIX} this task: building it failed ({type(e).__name__}: {e})")
    aliased = augmented_alias(getattr(type(model), "forward", None))
    if aliased is not None:
        raise Unsupported(f"{PREFIX} an augmented assignment to {aliased!r} while another name "
                          f"for that tensor is read after it (fx records it as a new value)")
    attributes = _tensor_attributes(model)
    try:
        traced = Tracer(inputs).trace(model, _unpassed_nones(model, inputs))
        for node in traced.nodes:
            # no ``torch.fx.wrap("torch.ones")`` in the module's code: run, it registers a
            # global name that the next trace's patching cannot find (KeyError)
            node.meta.pop("is_wrapped", None)
        # a forward that sets a tensor attribute (``self.hidden = ...``) left a traced value
        # there: the module gets its tensor back, and the graph's reads of it are marked
        reassigned = _restore(attributes)
        gm = fx.GraphModule(model, traced)
    except Exception as e:  # noqa: BLE001
        raise Unsupported(f"{PREFIX} a forward that torch.fx cannot trace "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    one_node_per_attribute(gm, set(attributes), reassigned)
    for node, value in zip([n for n in gm.graph.nodes if n.op == "placeholder"], inputs):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            node.meta[NUMBER_ARG] = True
    follow_writes(gm)
    drop_dead(gm, passed=len(inputs))
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _RANDOM:
            # (L3_35's LSTM draws its initial states when the forward is not given them)
            raise Unsupported(f"{PREFIX} a random tensor made in the forward "
                              f"(torch.{node.target.__name__}: drawn anew at each call)")
    decompose(gm)
    encoders(gm)
    encoder_layers(gm)
    multihead_attention(gm)

    def propagate() -> None:
        # ShapeProp prints the failing node's traceback before raising; the decline says why.
        with contextlib.redirect_stderr(io.StringIO()):
            _ShapeProp(gm).propagate(*inputs)

    try:
        propagate()
        if einops_calls(gm):
            propagate()  # the new nodes' shapes
        module_state(gm)
        device_moves(gm)
        exclusive_scans(gm)
        attention_blocks(gm)
        # every rewrite runs; then the new nodes' shapes
        if any([zero_joins(gm), triangle_masks(gm), attention_products(gm),
                einsum_products(gm)]):
            propagate()
    except Unsupported:
        raise  # a rewrite's decline, which says why
    except Exception as e:  # noqa: BLE001
        einops_failed = einops_decline(e)
        if einops_failed is not None:
            raise einops_failed from None
        # Most often an op without a meta kernel, which v1 could not express anyway: name it.
        unknown = first_unknown_op(gm)
        if unknown is not None:
            raise unknown from None
        raise Unsupported(f"{PREFIX} this task: shape propagation failed "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    return gm


class _ShapeProp(ShapeProp):
    """ShapeProp, with nn.GRU/nn.LSTM's outputs made from their shapes rather than by running
    them: on meta tensors torch runs them step by step (KernelBench's 6-layer LSTM over 512
    steps took 10 s to propagate; this takes none)."""

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        m = self.fetch_attr(target)
        x = args[0] if args else None
        if type(m) not in RECURRENT_MODULES or not isinstance(x, torch.Tensor) or x.dim() != 3:
            return super().call_module(target, args, kwargs)
        t, b = (x.shape[1], x.shape[0]) if m.batch_first else (x.shape[0], x.shape[1])
        dirs = 2 if m.bidirectional else 1
        out = torch.zeros((t, b, dirs * m.hidden_size), dtype=x.dtype, device=x.device)
        state = torch.zeros((m.num_layers * dirs, b, m.hidden_size), dtype=x.dtype,
                            device=x.device)
        out = out.transpose(0, 1) if m.batch_first else out  # torch's strides
        return (out, (state, state.clone())) if isinstance(m, nn.LSTM) else (out, state)
