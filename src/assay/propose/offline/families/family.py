"""What the synthesizer and the candidate file ask of a kernel family.

A family is one shape of work (a fused elementwise chain, a row reduction, a pooling, a matrix
product): the plans it writes, the knobs of its templates with their defaults, and the code.
Each family module ends with its ``FAMILY``; ``families.FAMILIES`` is the table of them all.

A family may have several templates, told apart by the knob ``lib`` (the matrix product or
convolution: its own kernel, or the library's followed by one fused epilogue kernel); ``libs``
lists the values that ``lib`` may take for a plan (empty: one template, no knob ``lib``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from assay.propose.offline.families.shared import Param
from assay.propose.offline.ir import Analysis, Plan

Space = dict[str, tuple[int, ...]]  # knob -> the values it may take
Entry = tuple[str, list[Param]]  # a kernel entry point of the file, with its parameters


@dataclass(frozen=True)
class Head:
    """The op at the head of a plan (a product, a pooling) whose result the kernel reads:
    ModelNew.forward's lines that compute it (its operands, ``gshape``, the output's shape),
    the tensor whose device the output takes, and its name in the shape checks."""

    lines: list[str]
    device: str
    what: str


def _one_template(target: str, analysis: Analysis, policy: str) -> tuple[int, ...]:
    return ()


def _never_declines(target: str, analysis: Analysis, policy: str) -> str | None:
    return None


def _no_head(plan: Plan, target: str, knobs: dict[str, Any]) -> Head | None:
    return None


def _no_library(plan: Plan, target: str, knobs: dict[str, Any]) -> str:
    return ""


@dataclass(frozen=True)
class Family:
    """One kernel family. ``target`` is ``cpu`` or ``cuda``, ``policy`` the verifier policy the
    candidates must pass (``any``, ``strict``, ``permissive``), ``lib`` the template chosen by
    knob ``lib`` (None: the plan's first)."""

    name: str
    # Whether this family writes the plan (the families' matchers exclude each other).
    matches: Callable[[Plan], bool]
    # (target, template) -> the values each knob of that template may take. Every value is
    # valid for every task; a kernel checks at run time what it needs and falls back if not.
    knob_spaces: dict[tuple[str, str], Space]
    # The knob space of the template ``lib`` selects: (target, analysis, lib, policy).
    space: Callable[[str, Analysis, int | None, str], Space]
    # Knobs expected to do well at the analysed size: (target, analysis, lib, policy).
    defaults: Callable[[str, Analysis, int | None, str], dict[str, int]]
    # The most conservative knobs of the template ``knobs`` selects (repair's last resort):
    # (target, plan, knobs).
    safe: Callable[[str, Plan, dict[str, int]], dict[str, int]]
    # The template a (plan, knobs) pair is written with, named in the candidate.
    template: Callable[[Plan, dict[str, Any]], str]
    # The candidate's niche (see synthesizer.strategy_of).
    strategy: Callable[[Plan, dict[str, Any]], str]
    # The whole kernel file (C++ or CUDA): (plan, target, knobs, summary). None: the file is
    # assembled from the stages' families (a multi-kernel plan, see candidate.py).
    source: Callable[[Plan, str, dict[str, Any], str], str] | None
    # ModelNew.forward's calls of the file's entry points once the output is allocated, and
    # those entry points: (plan, target, knobs, stream arguments); None as for ``source``.
    calls: Callable[[Plan, str, dict[str, Any], list[str]], tuple[list[str], list[Entry]]] | None
    # The values knob ``lib`` may take: (target, analysis, policy).
    libs: Callable[[str, Analysis, str], tuple[int, ...]] = _one_template
    # Why no template of the family can write the plan, or None: (target, analysis, policy).
    declines: Callable[[str, Analysis, str], str | None] = _never_declines
    # The plan's head op in ModelNew.forward, or None: (plan, target, knobs).
    head: Callable[[Plan, str, dict[str, Any]], Head | None] = _no_head
    # What the library computes in this candidate, for its docstring ("": nothing; otherwise
    # the candidate needs the permissive policy): (plan, target, knobs).
    library: Callable[[Plan, str, dict[str, Any]], str] = _no_library
    # ModelNew.forward's whole body and the file's entry points, for a plan that is not a
    # ir.Plan (a concatenation: its checks and output are its own); None: the candidate
    # writes the checks and output of the plan's leaves, then ``calls``. (plan, target, knobs)
    forward: Callable[[Any, str, dict[str, Any]], tuple[list[str], list[Entry]]] | None = None


# The streaming ops of their own (concat, permute): the elementwise family's streaming setting
# (OpenMP's default threads; 256 threads with float4 on cuda), not yet measured for them on a
# GPU; the safe values go one thread / one element at a time.
STREAMING_DEFAULTS = {"cpu": {"threads": 0}, "cuda": {"block": 256, "vec": 4}}
STREAMING_SAFE = {"cpu": {"threads": 1}, "cuda": {"block": 256, "vec": 1}}


def standalone_family(name: str, plan_type: type, knob_spaces: dict[tuple[str, str], Space],
                      defaults: dict[str, dict[str, int]], safe: dict[str, dict[str, int]],
                      strategy: str, source: Callable[..., str],
                      forward: Callable[[Any, str, dict[str, Any]],
                                        tuple[list[str], list[Entry]]]) -> Family:
    """A family of one template, named like it, for the plans of ``plan_type``, a kernel of its
    own in a multi-kernel plan (concat, permute, recurrent): its knobs' defaults and safest
    values per target do not depend on the plan, its ModelNew.forward lines are its own."""
    return Family(
        name=name, matches=lambda plan: isinstance(plan, plan_type), knob_spaces=knob_spaces,
        space=lambda target, analysis, lib=None, policy="any": dict(knob_spaces[(target, name)]),
        defaults=lambda target, analysis, lib=None, policy="any": dict(defaults[target]),
        safe=lambda target, plan=None, knobs=None: dict(safe[target]),
        template=lambda plan, knobs: name, strategy=lambda plan, knobs: strategy,
        source=source, calls=None, forward=forward)
