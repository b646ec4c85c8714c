"""The offline synthesizer as a Proposer: the four evolution operators, over knob spaces.

Every candidate of a task comes from one plan (analysis.analyze_task) and one knob set of the
plan's family (families.family_of: its knob spaces, defaults and code); the operators only move
in knob space: translate samples it (the defaults of each template first), mutate perturbs one
or two knobs of a parent, crossover takes each knob from one of the parents, repair falls back
to the defaults (or, if the parent already had them, to the most conservative set).

A family may have several templates, told apart by the knob ``lib`` (a matrix product: 0 = the
tiled GEMM of this package with the epilogue fused into its stores, strict policy; a
convolution: 2 = this package's convolution kernel, likewise; 1 = the library's GEMM or
convolution followed by one fused epilogue kernel, permissive policy; see families.gemm).
Mutating ``lib`` switches templates: the knobs both share keep their values, the others take the
new template's defaults.
"""

from __future__ import annotations

import ast
import random
import time
from typing import Any

from assay.propose.base import Parent, TaskContext
from assay.propose.offline.candidate import candidate_file
from assay.propose.offline.families import family_of
from assay.propose.offline.analysis import analyze_task
from assay.propose.offline.ir import PREFIX, Analysis, Unsupported
from assay.records import Proposal

TARGETS = ("cpu", "cuda", "triton")
# The families with a Triton form (target ``triton``); the others decline it for now.
TRITON_FAMILIES = ("elementwise", "row", "gemm", "pool")
POLICIES = ("any", "strict", "permissive")


def why_not(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    """Why no template can write this plan on ``target`` under ``policy``, or None."""
    plan = analysis.plan
    if plan.dtype != "float32" and (target == "cpu" or (target == "triton"
                                                        and plan.gemm is None)):
        return f"{PREFIX} {plan.dtype} on the {target} target (float32 only there)"
    family = family_of(plan)
    if target == "triton" and family.name not in TRITON_FAMILIES:
        return f"{PREFIX} the {family.name} family in Triton yet (no Triton template)"
    return family.declines(target, analysis, policy)


def normalize_knobs(knobs: Any, space: dict[str, tuple[int, ...]],
                    fallback: dict[str, int]) -> dict[str, int]:
    """Valid values of ``knobs`` (e.g. a parent's), the fallback's for the rest."""
    out = {k: v for k, v in fallback.items() if k in space}
    if isinstance(knobs, dict):
        for key, values in space.items():
            v = knobs.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and int(v) in values:
                out[key] = int(v)
    return out


def random_knobs(space: dict[str, tuple[int, ...]], rng: random.Random) -> dict[str, int]:
    return {key: rng.choice(values) for key, values in sorted(space.items())}


def mutate_knobs(knobs: dict[str, int], space: dict[str, tuple[int, ...]],
                 rng: random.Random) -> dict[str, int]:
    """Change one or two knobs to another of their values."""
    child = dict(knobs)
    keys = [k for k in sorted(space) if len(space[k]) > 1]
    for key in rng.sample(keys, min(len(keys), rng.choice((1, 2)))):
        child[key] = rng.choice([v for v in space[key] if v != knobs.get(key)])
    return child


def cross_knobs(parents: list[dict[str, int]], space: dict[str, tuple[int, ...]],
                rng: random.Random, fallback: dict[str, int] | None = None) -> dict[str, int]:
    """Each knob from a random parent that has it (else from ``fallback``)."""
    out = {}
    for key in sorted(space):
        have = [p[key] for p in parents if key in p]
        out[key] = rng.choice(have) if have else (fallback or {})[key]
    return out


def _parent_knobs(parent: Parent) -> Any:
    """A parent's knobs: from its record, else from the KNOBS line of its file."""
    knobs = (parent.meta or {}).get("knobs")
    if knobs:
        return knobs
    try:
        for node in ast.parse(parent.code or "").body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "KNOBS"):
                return ast.literal_eval(node.value)
    except (SyntaxError, ValueError):
        pass
    return None


def strategy_of(analysis: Analysis, knobs: dict[str, int] | None = None) -> str:
    """The niche of a template: a single op streams (vectorize), several fuse (fusion), a row
    reduces (rowreduce), a reduction over a dim walks it (axisreduce), a line scans (scan),
    a window pools (pooling); a product tiles (tiling), uses tensor cores
    (tensor_cores) or leaves the product to the library and fuses the rest (epilogue)."""
    return family_of(analysis.plan).strategy(analysis.plan, knobs or {})


class OfflineSynthesizer:
    """Writes fused elementwise, row-reduction and GEMM(+epilogue) kernels without an LLM.

    ``policy``: ``any`` (default) proposes both forms of a product (own GEMM, library GEMM +
    fused epilogue); ``strict`` only kernels of its own (library forms would be refused by the
    strict kernel audit); ``permissive`` is the same as ``any``.
    """

    name = "offline"

    def __init__(self, target: str = "cpu", policy: str = "any"):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
        self.target = target
        self.policy = policy
        self._analyses: dict[tuple[str, str, str], Analysis | Unsupported] = {}

    # -- shared -------------------------------------------------------------------------------

    def analyse(self, ctx: TaskContext) -> Analysis:
        """The task's plan (cached per task source and size); raises Unsupported, also when
        no template can write the plan on this target under this policy."""
        key = (ctx.task.source_hash, ctx.task.size, str(ctx.task.path))
        if key not in self._analyses:
            try:
                analysis = analyze_task(ctx.task)
                reason = why_not(self.target, analysis, self.policy)
                self._analyses[key] = Unsupported(reason) if reason else analysis
            except Unsupported as e:
                self._analyses[key] = e
        result = self._analyses[key]
        if isinstance(result, Unsupported):
            raise result
        return result

    def space(self, analysis: Analysis, knobs: Any = None) -> dict[str, tuple[int, ...]]:
        """The knob space of the template ``knobs`` (a dict, maybe partial) selects."""
        lib = knobs.get("lib") if isinstance(knobs, dict) else None
        return family_of(analysis.plan).space(self.target, analysis, lib, self.policy)

    def defaults(self, analysis: Analysis, knobs: Any = None) -> dict[str, int]:
        lib = knobs.get("lib") if isinstance(knobs, dict) else None
        return family_of(analysis.plan).defaults(self.target, analysis, lib, self.policy)

    def normalize(self, analysis: Analysis, knobs: Any) -> dict[str, int]:
        """A complete, valid knob set of the template ``knobs`` selects."""
        return normalize_knobs(knobs, self.space(analysis, knobs), self.defaults(analysis, knobs))

    def with_knobs(self, ctx: TaskContext, knobs: dict[str, int]) -> Proposal:
        """The candidate of ``knobs`` over the task's defaults, for sweeps and tests that pick
        the knobs themselves; a knob outside its template's space is an error, not replaced."""
        analysis = self.analyse(ctx)
        space = self.space(analysis, knobs)
        bad = sorted(k for k, v in knobs.items() if v not in space.get(k, ()))
        if bad:
            def allowed(k: str) -> str:
                return (", ".join(map(str, space[k])) if k in space
                        else "none, not a knob of this template")
            raise ValueError(f"{ctx.task.id}: knobs outside the space of their template: "
                             + "; ".join(f"{k}={knobs[k]} (allowed: {allowed(k)})"
                                         for k in bad))
        chosen = {**self.defaults(analysis, knobs), **knobs}
        return self._proposal(ctx, analysis, chosen, "translate", [], time.perf_counter())

    def _proposal(self, ctx: TaskContext, analysis: Analysis, knobs: dict[str, int],
                  operator: str, parents: list[str], started: float) -> Proposal:
        code = candidate_file(analysis.plan, self.target, knobs, analysis.summary,
                              ctx.task.source)
        return Proposal(code=code, operator=operator, parents=list(parents),
                        strategy=strategy_of(analysis, knobs),
                        knobs=dict(sorted(knobs.items())), model=self.name,
                        wall_s=round(time.perf_counter() - started, 4))

    def _declined(self, operator: str, parents: list[str], reason: str,
                  started: float) -> list[Proposal]:
        return [Proposal(code=None, operator=operator, parents=list(parents), strategy="none",
                         declined=reason, model=self.name,
                         wall_s=round(time.perf_counter() - started, 4))]

    def _mutant(self, analysis: Analysis, base: dict[str, int],
                rng: random.Random) -> dict[str, int]:
        child = mutate_knobs(base, self.space(analysis, base), rng)
        if child.get("lib") != base.get("lib"):  # another template: its knobs, shared ones kept
            child = self.normalize(analysis, child)
        return child

    # -- the Proposer protocol ----------------------------------------------------------------

    def translate(self, ctx: TaskContext, n: int, rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("translate", [], str(e), started)
        family = family_of(analysis.plan)
        libs = family.libs(self.target, analysis, self.policy) or (None,)
        # The defaults of every template first, then random points of each in turn.
        chosen = []
        for lib in libs:
            d = family.defaults(self.target, analysis, lib, self.policy)
            if d not in chosen:
                chosen.append(d)
            if "layout" in d:  # which layout suits a convolution is known only by timing it
                chosen.append(dict(d, layout=1))
        for i in range(50 * max(n, 1)):
            if len(chosen) >= n:
                break
            lib = libs[i % len(libs)]
            knobs = random_knobs(family.space(self.target, analysis, lib, self.policy), rng)
            if lib is not None:
                knobs["lib"] = lib
            if knobs not in chosen:
                chosen.append(knobs)
        return [self._proposal(ctx, analysis, k, "translate", [], started) for k in chosen[:n]]

    def mutate(self, ctx: TaskContext, parent: Parent, n: int,
               rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("mutate", [parent.id], str(e), started)
        base = self.normalize(analysis, _parent_knobs(parent))
        children: list[dict[str, int]] = []
        for _ in range(50 * max(n, 1)):
            if len(children) >= n:
                break
            child = self._mutant(analysis, base, rng)
            if child != base and child not in children:
                children.append(child)
        return [self._proposal(ctx, analysis, k, "mutate", [parent.id], started)
                for k in children]

    def crossover(self, ctx: TaskContext, parents: list[Parent],
                  rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        ids = [p.id for p in parents]
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("crossover", ids, str(e), started)
        if not parents:
            return []
        pk = [self.normalize(analysis, _parent_knobs(p)) for p in parents]

        def cross() -> dict[str, int]:
            # The template (lib) of a random parent, then each of its knobs from a parent of
            # the same template when one has it.
            first = rng.choice(pk)
            space = self.space(analysis, first)
            same = [p for p in pk if p.get("lib") == first.get("lib")]
            return cross_knobs(same, space, rng, self.defaults(analysis, first))

        child = cross()
        for _ in range(16):  # prefer a child that is none of its parents
            if child not in pk:
                break
            child = cross()
        if child in pk:  # the parents agree on every knob: step off them
            child = self._mutant(analysis, child, rng)
        return [self._proposal(ctx, analysis, child, "crossover", ids, started)]

    def repair(self, ctx: TaskContext, parent: Parent, rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("repair", [parent.id], str(e), started)
        current = _parent_knobs(parent)
        knobs = self.defaults(analysis, current)
        if isinstance(current, dict) and self.normalize(analysis, current) == knobs:
            safe = family_of(analysis.plan).safe(self.target, analysis.plan, knobs)
            knobs = {**knobs, **safe}
        return [self._proposal(ctx, analysis, knobs, "repair", [parent.id], started)]
