"""The offline synthesizer's analysis of a task: its plan, one kernel or several.

:func:`analyze_task` traces the task's model (:func:`tracing.trace`), lowers it into one plan
(:func:`graph.analyze_graph`) and, where one kernel would have to end, cuts it into a
multi-kernel plan (:func:`stages.split`). Anything no plan can express is
:class:`~assay.propose.offline.ir.Unsupported`, with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from assay.propose.offline.graph import analyze_graph
from assay.propose.offline.tracing import trace
from assay.propose.offline.ir import PREFIX, Analysis, NeedsCut, Unsupported, structure
from assay.propose.offline.stages import split
from assay.tasks.model import Task


def analyze_module(mod: Any, real: bool = False) -> Analysis:
    """Trace and plan one executed task module (see :meth:`Task.module`).

    Shapes are propagated on meta tensors (no memory at any size), or with ``real`` on real
    CPU tensors: for a small task that is faster, because the first use of meta kernels imports
    torch's meta registrations and decompositions (about 1.5 s of every translate/evolve step
    of a CPU campaign)."""
    gm = trace(mod, real)
    try:
        return analyze_graph(gm)
    except NeedsCut:  # what one kernel cannot fuse: a kernel boundary there
        return split(gm, analyze_graph)


def analyze_task(task: Task) -> Analysis:
    """Analyse ``task`` at its size and, when it differs, at ``small`` too.

    The generated code is size-generic, so the plan must not depend on the size: a shape
    coincidence at one size (a batch equal to a feature count, a dim of 1) would otherwise
    turn into a wrong broadcast at another. Plans that differ are declined.
    """
    # Real tensors only where the small size is the task's own (a task without a small
    # variant, e.g. a KernelBench file, is as large at "small" as at "large").
    main = analyze_module(task.module(), real=task.size == "small" and task.has_small_variant)
    if task.size != "small" and task.has_small_variant:
        other = analyze_module(dataclasses.replace(task, size="small").module(), real=True)
        if structure(other.plan) != structure(main.plan):
            raise Unsupported(f"{PREFIX} this task: its graph's structure differs between "
                              f"sizes")
    return main
