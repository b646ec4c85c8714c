"""The candidate file: a family's kernel source wrapped in a Python module that the verifier
loads like any other candidate (the task's constructor, SOURCE, ModelNew whose forward runs the
compiled kernels through ctypes; on the triton target the @triton.jit kernel is the module's
own code, families.triton_form).

Pure functions of their arguments: the same plan, knobs, target and task source give the same
text (and so the same candidate id); different knobs give different kernel source (the knobs
line at the top of SOURCE alone guarantees a distinct build-cache key).
"""

from __future__ import annotations

import ast
from typing import Any

from assay.propose.offline.families import Family, family_of, gemm, pipeline, triton_form
from assay.propose.offline.families.family import Entry
from assay.propose.offline.families.shared import (PY_ARG_HELPERS, knob_line, leaf_tensor,
                                                   render, stream_args)
from assay.propose.offline.ir import Plan
from assay.propose.offline.stages import STAGE_INPUT, STAGE_RAW, Pipeline

CANDIDATE = r'''"""Candidate written by Assay's offline synthesizer (v1).

Computes: {{ summary }}
Template: {{ template }} ({{ target }}); knobs: {{ knob_line }}.
{% if library %}

POLICY: permissive. The library computes {{ library }};
everything after it is one fused kernel of this file (the SOURCE below). The verifier's
permissive policy reports the library's share of the time; the strict policy refuses library
compute, as it should.
{% endif %}

ModelNew inherits the task's Model constructor (copied below without its forward), so its
parameters have the reference's names, shapes and seeded values; its forward runs the
compiled kernel(s) of SOURCE (loaded with ctypes) and allocates the output only.
"""
{% if future %}
from __future__ import annotations
{% endif %}

import contextlib
import ctypes
import functools
import math

import torch
from torch import nn

from assay.bench.build import load_library

# ---- the task's module, without Model.forward -----------------------------------------------
{{ task_code }}

# ---- the kernel -------------------------------------------------------------------------------
TEMPLATE = {{ template|tojson }}
TARGET = {{ target|tojson }}
KNOBS = {{ knobs_repr }}
LANG = {{ lang|tojson }}
POLICY = {{ policy|tojson }}  # the verifier policy this candidate can pass
DTYPE = torch.{{ dtype }}
{% if sources|length == 1 %}
SOURCE = r"""
{{ sources[0] }}"""
SOURCES = (SOURCE,)
{% else %}
SOURCES = (  # one library per kernel of the chain, loaded at its first call
{% for source in sources %}
    r"""
{{ source }}""",
{% endfor %}
)
{% endif %}

_LIBS = {}
_ARGTYPES = [
{% for lib_entries in entries %}
    {
{% for name, types in lib_entries %}
        {{ name|tojson }}: [{{ types }}],
{% endfor %}
    },
{% endfor %}
]


def _lib(i=0):
    lib = _LIBS.get(i)
    if lib is None:
        lib = load_library(SOURCES[i], lang=LANG)
        for name, types in _ARGTYPES[i].items():
            getattr(lib, name).argtypes = types
            getattr(lib, name).restype = ctypes.c_int
{% if target == "cuda" %}
        lib.assay_error_string.argtypes = [ctypes.c_int]
        lib.assay_error_string.restype = ctypes.c_char_p
{% endif %}
        _LIBS[i] = lib
    return lib


def _check(err):
    if err:
{% if target == "cuda" %}
        msg = _lib().assay_error_string(err).decode()
        raise RuntimeError(f"assay kernel launch failed: {msg} (cuda error {err})")
{% else %}
        raise RuntimeError(f"assay kernel failed with code {err}")
{% endif %}


def _tensor(t, what, dtype=DTYPE, strided=False):
    """A contiguous ``dtype`` tensor on this candidate's device (a copy only if it was
    strided; ``strided``: as it is, for a kernel that reads its strides)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a tensor, got {type(t).__name__}")
    # Attribute reads, not dispatcher calls (t.device builds an object, t.contiguous() goes
    # through the dispatcher even when it returns t): after the timing's cache flush each of
    # those costs ~10 us, as much as a small kernel.
    if t.dtype != dtype or not t.{{ "is_cuda" if device_type == "cuda" else "is_cpu" }}:
        raise TypeError(f"{what}: expected a {dtype} {{ device_type }} tensor, got {t.dtype} on "
                        f"{t.device}")
    return t if strided or t.is_contiguous() else t.contiguous()


{{ py_arg_helpers }}

@contextlib.contextmanager
def _ieee_fp32():
    """cuDNN may run float32 convolutions in TF32 by default; the task is float32, so the
    library call asks for IEEE float32 and the process-wide setting is put back afterwards."""
    prev = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = prev


class ModelNew(Model):
    def forward(self, {{ inputs|join(", ") }}):
{% for line in forward %}
        {{ line }}
{% endfor %}
{% for name, args, lines in methods %}

    def {{ name }}(self, {{ args|join(", ") }}):
{% for line in lines %}
        {{ line }}
{% endfor %}
{% endfor %}
'''


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
# ModelNew.forward and the file


def _forward_lines(plan: Plan, target: str, knobs: dict[str, Any], family: Family
                   ) -> tuple[list[str], list[Entry]]:
    """ModelNew.forward's body, and the kernel entry points it calls with their parameters."""
    if family.forward is not None:
        return family.forward(plan, target, knobs)
    head = family.head(plan, target, knobs)
    gk = plan.head_leaf
    lines: list[str] = []
    for path in plan.eval_only:  # computed with running statistics: eval mode only
        why = f"{path}: this kernel computes the eval-mode form; call .eval() first"
        lines += [f"if _attr(self, {path!r}).training:", f"    raise RuntimeError({why!r})"]
    lines += list(head.lines) if head is not None else []
    for k, lf in enumerate(plan.leaves):
        if k != gk and lf.source != "scalar":
            lines.append(f"l{k} = {leaf_tensor(lf)}")
    a = plan.anchor
    tensors = [k for k, lf in enumerate(plan.leaves) if lf.source != "scalar"]
    dev = head.device if head is not None else f"l{a if a >= 0 else tensors[0]}"
    for k, lf in enumerate(plan.leaves):  # numbers: 0-d tensors on the tensors' device
        if lf.source == "scalar":
            lines.append(f"l{k} = _scalar({lf.name}, {lf.name!r}, {dev}.device)")
    nd, k = plan.ndim, plan.k
    what = head.what if head is not None else (plan.leaves[a].name if a >= 0 else
                                               "the operands' broadcast")
    if head is not None:
        lines.append("shape = gshape")
    elif a >= 0:
        lines.append(f"shape = tuple(l{a}.shape)")
    else:  # no operand has S: the shape they broadcast to, as torch computes it
        lines.append("shape = tuple(torch.broadcast_shapes("
                     + ", ".join(f"l{k}.shape" for k in tensors) + "))")
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
        elif lf.bcast == "block2":
            lines.append(f"inner{j} = math.prod(shape[{lf.b + 1}:])")
            lines.append(f"mid{j} = math.prod(shape[{lf.a}:{lf.b + 1}])")
            lines.append(f"inner2_{j} = math.prod(shape[{lf.b2 + 1}:])")
            lines.append(f"mid2_{j} = math.prod(shape[{lf.a2}:{lf.b2 + 1}])")
            lines.append(f"_expect(l{j}.numel() == mid{j} * mid2_{j}, "
                         f"{name + ' does not broadcast'!r})")
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
    elif plan.kind == "axis":
        a = plan.axis
        lines.append(f"outer = math.prod(shape[:{a}])")
        lines.append(f"mid = math.prod(shape[{a}:{a + k}])")
        lines.append(f"inner = math.prod(shape[{a + k}:])")
        out_dtype = "DTYPE" if plan.out_dtype == plan.dtype else f"torch.{plan.out_dtype}"
        if plan.out_is_row:
            keep = f" + {(1,) * k!r}" if plan.keepdim else ""
            lines.append(f"out = torch.empty(shape[:{a}]{keep} + shape[{a + k}:], "
                         f"dtype={out_dtype}, device={dev}.device)")
            lines.append("_expect(mid > 0 or out.numel() == 0, 'a reduction over an empty "
                         "dim')")
        else:
            lines.append(f"out = torch.empty(shape, dtype={out_dtype}, device={dev}.device)")
        lines.append("if n == 0:")
    else:
        lines.append(f"out = torch.empty(shape, dtype=DTYPE, device={dev}.device)")
        lines.append("if n == 0:")
    lines.append("    return out")
    stream = stream_args(target, dev)
    calls, entries = family.calls(plan, target, knobs, stream)
    lines += calls
    lines.append("return out")
    return lines, entries


def _entry_types(entries: list[Entry], target: str) -> list[tuple[str, str]]:
    extra = ["ctypes.c_void_p"] if target == "cuda" else []
    return [(name, ", ".join([p.ctypes_type for p in ps] + extra)) for name, ps in entries]


def _stages(plan: Pipeline, target: str, knobs: dict[str, Any]
            ) -> tuple[list[str], list[str], list[list[Entry]], list[tuple]]:
    """A multi-kernel plan's forward (one method call per stage), its kernel sources, their
    entry points and the stage methods ``(name, arguments, body)``."""
    forward: list[str] = list(plan.prelude)
    sources: list[str] = []
    entries: list[list[Entry]] = []
    methods: list[tuple] = []
    for k, (stage, chosen) in enumerate(zip(plan.stages, pipeline.stage_choices(target, plan,
                                                                                   knobs))):
        sp = stage.plan
        if chosen is None:  # the library's call, no kernel
            body = gemm.library_lines(sp, target)
        else:
            family = family_of(sp)
            # No names in the kernel's summary: the same plan and knobs in several stages (the
            # blocks of a ResNet) are one source, built and loaded once.
            label = f"one {family.template(sp, chosen)} kernel of a multi-kernel plan"
            src = family.source(sp, target, chosen, label)
            lines, stage_entries = _forward_lines(sp, target, chosen, family)
            if src not in sources:
                sources.append(src)
                entries.append(stage_entries)
            body = [line.replace("_lib()", f"_lib({sources.index(src)})") for line in lines]
        name = f"_stage{k}"
        methods.append((name, list(sp.inputs), body))
        call = f"self.{name}({', '.join(sp.inputs)})"
        last = k == len(plan.stages) - 1
        if last and not plan.views[k]:
            forward.append(f"return {call}")
            continue
        out = STAGE_INPUT.format(k)
        if plan.views[k]:  # metadata only: the stage's output is a fresh contiguous tensor
            raw = STAGE_RAW.format(k)  # kept: a later view's sizes may read it
            forward.append(f"{raw} = {call}")
            forward.append(f"{'return' if last else out + ' ='} {plan.views[k].format(t=raw)}")
        else:
            forward.append(f"{out} = {call}")
    return forward, sources, entries, methods


def candidate_file(plan: Plan | Pipeline, target: str, knobs: dict[str, Any], summary: str,
                   task_source: str) -> str:
    """The full candidate module: the task's constructor, SOURCE (SOURCES: one per kernel of
    a multi-kernel plan; on the triton target the @triton.jit kernel itself), and ModelNew."""
    family = family_of(plan)
    code, future = task_prelude(task_source)
    if isinstance(plan, Pipeline):
        forward, sources, entries, methods = _stages(plan, target, knobs)
    else:
        source = family.source(plan, target, knobs, summary)
        forward, lib_entries = _forward_lines(plan, target, knobs, family)
        if target == "triton":
            return triton_form.candidate(
                summary=summary, template=family.template(plan, knobs), knobs=knobs,
                kernel=source, task_code=code, future=future, inputs=list(plan.inputs),
                forward=forward, dtype=plan.dtype)
        sources, entries, methods = [source], [lib_entries], []
    if any('"""' in src for src in sources):  # never: SOURCE is r"""...""" and kernels have none
        raise ValueError("kernel source contains a triple quote")
    # A candidate whose product the library computes can pass the permissive policy only.
    library = family.library(plan, target, knobs)
    return render(
        CANDIDATE, py_arg_helpers=PY_ARG_HELPERS, summary=summary,
        template=family.template(plan, knobs), target=target,
        knob_line=knob_line(knobs), knobs_repr=repr(dict(sorted(knobs.items()))),
        lang="cuda" if target == "cuda" else "cpp", sources=sources, task_code=code,
        future=future, inputs=list(plan.inputs),
        entries=[_entry_types(e, target) for e in entries],
        device_type="cuda" if target == "cuda" else "cpu", forward=forward, methods=methods,
        policy="permissive" if library else "strict", library=library, dtype=plan.dtype)
