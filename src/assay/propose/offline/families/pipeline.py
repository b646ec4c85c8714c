"""The pipeline family: a multi-kernel plan (:mod:`stages`), each stage written by its own
family, run one after the other by ``ModelNew.forward`` (the file: :mod:`candidate`).

Knobs: each stage's, prefixed ``s<k>.`` (``s0.block``, ``s2.lib``...), so the evolution tunes
every kernel of the chain. The knob ``lib`` picks the templates of all stages at once: 0 = each
stage's first (its own kernels: GEMMs and convolutions of this package, strict policy), 1 = the
library's product or convolution with a fused epilogue wherever a stage has that form
(permissive). Under lib 1 a stage that is a convolution and nothing else (a convolution feeding
another convolution) has no kernel of its own: ``ModelNew`` calls the library for it (unless
every stage is one such: then lib 1 is not offered).
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline import families
from assay.propose.offline.families.family import Family, Space
from assay.propose.offline.ir import PREFIX, Analysis
from assay.propose.offline.stages import Pipeline


def matches(plan: Any) -> bool:
    return isinstance(plan, Pipeline)


def _lone_conv(stage: Analysis) -> bool:
    """A convolution with at most its own bias after it."""
    g = getattr(stage.plan, "gemm", None)
    return g is not None and g.is_conv and g.trivial


def library_stage(stage: Analysis, lib: int | None) -> bool:
    """A lone convolution under the pipeline's ``lib`` 1: the library's call, no kernel (under
    lib 0 the gemm family's convolution kernel writes it)."""
    return lib == 1 and _lone_conv(stage)


def _stage_lib(target: str, stage: Analysis, lib: int | None, policy: str) -> int | None:
    """The template of ``stage`` under the pipeline's ``lib`` (None: a single-template stage)."""
    values = families.family_of(stage.plan).libs(target, stage, policy)
    if not values:
        return None
    return 1 if lib == 1 and 1 in values else values[0]


def stage_knobs(knobs: dict[str, Any], k: int) -> dict[str, Any]:
    """Stage ``k``'s knobs, unprefixed (``lib``: its template)."""
    prefix = f"s{k}."
    return {key[len(prefix):]: v for key, v in knobs.items() if key.startswith(prefix)}


def _prefixed(k: int, knobs: dict[str, Any]) -> dict[str, Any]:
    return {f"s{k}.{key}": v for key, v in knobs.items()}


def unprefixed(key: str) -> str:
    """A knob's name without its stage's prefix (``s1.phases`` -> ``phases``)."""
    stage, dot, name = key.partition(".")
    return name if dot and stage[:1] == "s" and stage[1:].isdigit() else key


def libs(target: str, analysis: Analysis, policy: str = "any") -> tuple[int, ...]:
    stages = analysis.plan.stages
    differ = any(_stage_lib(target, s, 0, policy) != _stage_lib(target, s, 1, policy)
                 for s in stages)
    # Lone convolutions become library calls under lib 1 (permissive), if a kernel is left.
    lone = sum(map(_lone_conv, stages))
    return (0, 1) if differ or (policy != "strict" and 0 < lone < len(stages)) else ()


def declines(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    stages = analysis.plan.stages
    for k, s in enumerate(stages):
        if s.plan.dtype != "float32":
            return f"{PREFIX} {s.plan.dtype} in a multi-kernel plan (float32 only)"
        why = families.family_of(s.plan).declines(target, s, policy)
        if why:
            return f"kernel {k + 1} of {len(stages)}: {why}"
    return None


def _each(target: str, analysis: Analysis, lib: int | None, policy: str):
    """(k, stage, its family, its template) of every stage with a kernel of its own."""
    for k, s in enumerate(analysis.plan.stages):
        if not library_stage(s, lib):
            yield k, s, families.family_of(s.plan), _stage_lib(target, s, lib, policy)


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    out: Space = {}
    for k, s, fam, slib in _each(target, analysis, lib, policy):
        out.update(_prefixed(k, {key: v for key, v in fam.space(target, s, slib, policy).items()
                                 if key != "lib"}))
    if libs(target, analysis, policy):
        out["lib"] = (0, 1)
    return out


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    out: dict[str, int] = {}
    for k, s, fam, slib in _each(target, analysis, lib, policy):
        out.update(_prefixed(k, {key: v for key, v in fam.defaults(target, s, slib,
                                                                   policy).items()
                                 if key != "lib"}))
    if libs(target, analysis, policy):
        out["lib"] = 1 if lib == 1 else 0
    return out


def stage_choices(target: str, plan: Pipeline, knobs: dict[str, Any], policy: str = "any"
                  ) -> list[dict[str, Any] | None]:
    """Each stage's knobs for its template (``lib`` included where the family has several);
    None for a library stage."""
    out: list[dict[str, Any] | None] = []
    for k, s in enumerate(plan.stages):
        if library_stage(s, knobs.get("lib")):
            out.append(None)
            continue
        slib = _stage_lib(target, s, knobs.get("lib"), policy)
        own = stage_knobs(knobs, k)
        out.append({**own, "lib": slib} if slib is not None else own)
    return out


def safe(target: str, plan: Pipeline, knobs: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, (s, chosen) in enumerate(zip(plan.stages, stage_choices(target, plan, knobs))):
        if chosen is not None:
            out.update(_prefixed(k, families.family_of(s.plan).safe(target, s.plan, chosen)))
    return out


def template(plan: Pipeline, knobs: dict[str, Any]) -> str:
    return "pipeline"


def strategy(plan: Pipeline, knobs: dict[str, Any]) -> str:
    """The strategy of the first stage with a head op (a product, a pooling), else the
    first stage's: what most of the time goes to."""
    # Family.strategy takes no target; a pipeline's stages are float32, whose templates are
    # the same on every native target, so any one gives the same choices.
    chosen = stage_choices("cuda", plan, knobs)
    ranked = sorted(range(len(plan.stages)),
                    key=lambda k: (chosen[k] is None, getattr(plan.stages[k].plan, "head_leaf",
                                                              -1) < 0, k))
    k = ranked[0]
    if chosen[k] is None:  # pragma: no cover - declines() refuses all-library pipelines
        return "epilogue"
    s = plan.stages[k]
    return families.family_of(s.plan).strategy(s.plan, chosen[k])


def library(plan: Pipeline, target: str, knobs: dict[str, Any]) -> str:
    """What the library computes in this candidate, over all stages ("": nothing)."""
    parts = []
    for s, chosen in zip(plan.stages, stage_choices(target, plan, knobs)):
        fam = families.family_of(s.plan)
        if chosen is None:
            parts.append(families.gemm.library_of(s.plan, target))
        elif fam.library(s.plan, target, chosen):
            parts.append(fam.library(s.plan, target, chosen))
    return "; ".join(parts)


FAMILY = Family(name="pipeline", matches=matches, knob_spaces={}, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=None, calls=None, libs=libs, declines=declines, library=library)
