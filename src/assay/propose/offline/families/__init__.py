"""The kernel families of the offline synthesizer, one module each (its plan matcher, knob
spaces, defaults, code generator and Jinja templates side by side), and the one table of them.

A new family is a module here that ends with its ``FAMILY`` (see :class:`family.Family`) and a
line in ``FAMILIES``; what every family shares is in :mod:`shared`. A family with several
templates may keep each in a module of its own (``gemm``: ``gemm_tiled``, ``gemm_tc``).
"""

from __future__ import annotations

from assay.propose.offline.families import (attention, axis, concat, elementwise, gemm,
                                            permute, pipeline, pool, recurrent, row, total,
                                            xent)
from assay.propose.offline.families.family import Family, Space
from assay.propose.offline.ir import Plan

# Their matchers exclude each other: a plan belongs to one family. A multi-kernel plan
# (stages.Pipeline) is the pipeline family's, its stages' plans the others'.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    elementwise.FAMILY, row.FAMILY, total.FAMILY, pool.FAMILY, gemm.FAMILY, axis.FAMILY,
    concat.FAMILY, permute.FAMILY, recurrent.FAMILY, xent.FAMILY, attention.FAMILY)}

# (target, template) -> the values each knob of that template may take.
KNOB_SPACES: dict[tuple[str, str], Space] = {
    key: space for f in FAMILIES.values() for key, space in f.knob_spaces.items()}


def family_of(plan: Plan) -> Family:
    """The family that writes ``plan``."""
    if pipeline.matches(plan):
        return pipeline.FAMILY
    found = [f for f in FAMILIES.values() if f.matches(plan)]
    if len(found) != 1:  # pragma: no cover - analysis.analyze_task makes plans of one family
        raise ValueError(f"a plan of {len(found)} families: {[f.name for f in found]}")
    return found[0]


__all__ = ["FAMILIES", "KNOB_SPACES", "Family", "family_of"]
