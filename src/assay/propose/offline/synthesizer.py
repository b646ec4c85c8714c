"""The offline synthesizer as a Proposer: knob spaces and the four evolution operators.

Every candidate of a task comes from one plan (graph.analyze_task) and one knob set; the
operators only move in knob space: translate samples it (defaults first), mutate perturbs one
or two knobs of a parent, crossover takes each knob from one of the parents, repair falls back
to the defaults (or, if the parent already had them, to the most conservative set).
"""

from __future__ import annotations

import ast
import random
import time
from typing import Any

from assay.propose.base import Parent, TaskContext
from assay.propose.offline import codegen
from assay.propose.offline.graph import Analysis, Unsupported, analyze_task
from assay.records import Proposal

TARGETS = ("cpu", "cuda")

# The values each knob may take, per (target, template). Every value is valid for every task;
# a kernel checks at run time what it needs (alignment for vectors) and falls back if not.
KNOB_SPACES: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {
    # threads: 0 = OpenMP default, 1 = serial, k = at most k; chunk: elements per OpenMP task;
    # unroll: simd length in units of 4 lanes.
    ("cpu", "elementwise"): {"threads": (0, 1, 2, 4, 8), "chunk": (2048, 8192, 16384, 65536),
                             "unroll": (1, 2, 4, 8)},
    # chunk: rows per OpenMP task (0 = an even static split).
    ("cpu", "row"): {"threads": (0, 1, 2, 4, 8), "chunk": (0, 1, 4, 16),
                     "unroll": (1, 2, 4, 8)},
    # block: threads per block; vec: floats per load (float4 = 16 bytes); unroll: vectors per
    # thread per grid-stride step; persistent: 1 = a grid capped at a few waves per SM that
    # strides over the data, 0 = one pass with as many blocks as the data needs.
    ("cuda", "elementwise"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                              "unroll": (1, 2, 4), "persistent": (0, 1)},
    # warp_per_row: 1 = a warp per row (short rows), 0 = a block per row; cache_row: 1 = keep
    # inputs that several passes read in shared memory (when the row fits).
    ("cuda", "row"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                      "warp_per_row": (0, 1), "cache_row": (0, 1)},
}


def knob_space(target: str, template: str) -> dict[str, tuple[int, ...]]:
    return KNOB_SPACES[(target, template)]


def default_knobs(target: str, analysis: Analysis) -> dict[str, int]:
    """Knobs expected to do well at the analysed size (the code itself stays size-generic)."""
    plan = analysis.plan
    if target == "cpu":
        if plan.kind == "elementwise":
            return {"threads": 0, "chunk": 16384, "unroll": 2}
        return {"threads": 0, "chunk": 0, "unroll": 2}
    if plan.kind == "elementwise":
        # Measured on H200 (ReLU and GELU over 4096 x 16384): within 1% of eager torch, the
        # best of the 56 variants tried; a persistent grid was ~4% slower.
        return {"block": 256, "vec": 4, "unroll": 2, "persistent": 0}
    cols = 1
    for d in analysis.shape[len(analysis.shape) - plan.k:]:
        cols *= d
    if cols <= 1024:  # a block per row would leave most of its threads without work
        return {"block": 256, "vec": 4, "warp_per_row": 1, "cache_row": 1}
    return {"block": 256 if cols < 8192 else 512, "vec": 4, "warp_per_row": 0, "cache_row": 1}


def safe_knobs(target: str, template: str) -> dict[str, int]:
    """The most conservative form: no vector accesses, no unrolling, serial on the host."""
    if target == "cpu":
        return {"threads": 1, "chunk": 16384 if template == "elementwise" else 0, "unroll": 1}
    if template == "elementwise":
        return {"block": 256, "vec": 1, "unroll": 1, "persistent": 1}
    return {"block": 256, "vec": 1, "warp_per_row": 0, "cache_row": 0}


def normalize_knobs(knobs: Any, space: dict[str, tuple[int, ...]],
                    fallback: dict[str, int]) -> dict[str, int]:
    """Valid values of ``knobs`` (e.g. a parent's), the fallback's for the rest."""
    out = dict(fallback)
    if isinstance(knobs, dict):
        for key, values in space.items():
            v = knobs.get(key)
            if isinstance(v, (int, float)) and int(v) in values:
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
                rng: random.Random) -> dict[str, int]:
    return {key: rng.choice(parents)[key] for key in sorted(space)}


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


def strategy_of(analysis: Analysis) -> str:
    """The niche of a template: a single op streams (vectorize), several fuse (fusion)."""
    plan = analysis.plan
    if plan.kind == "row":
        return "rowreduce"
    compute = [n for n in plan.nodes if n.op not in ("load", "const", "cols")]
    return "fusion" if len(compute) > 1 or len(plan.leaves) > 1 else "vectorize"


class OfflineSynthesizer:
    """Writes fused elementwise and row-reduction kernels without an LLM (see package doc)."""

    name = "offline"

    def __init__(self, target: str = "cpu"):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
        self.target = target
        self._analyses: dict[tuple[str, str, str], Analysis | Unsupported] = {}

    # -- shared -------------------------------------------------------------------------------

    def analyse(self, ctx: TaskContext) -> Analysis:
        """The task's plan (cached per task source and size); raises Unsupported."""
        key = (ctx.task.source_hash, ctx.task.size, str(ctx.task.path))
        if key not in self._analyses:
            try:
                self._analyses[key] = analyze_task(ctx.task)
            except Unsupported as e:
                self._analyses[key] = e
        result = self._analyses[key]
        if isinstance(result, Unsupported):
            raise result
        return result

    def _space(self, analysis: Analysis) -> dict[str, tuple[int, ...]]:
        return knob_space(self.target, analysis.plan.kind)

    def _proposal(self, ctx: TaskContext, analysis: Analysis, knobs: dict[str, int],
                  operator: str, parents: list[str], started: float) -> Proposal:
        code = codegen.candidate_file(analysis.plan, self.target, knobs, analysis.summary,
                                      ctx.task.source)
        return Proposal(code=code, operator=operator, parents=list(parents),
                        strategy=strategy_of(analysis), knobs=dict(sorted(knobs.items())),
                        model=self.name, wall_s=round(time.perf_counter() - started, 4))

    def _declined(self, operator: str, parents: list[str], reason: str,
                  started: float) -> list[Proposal]:
        return [Proposal(code=None, operator=operator, parents=list(parents), strategy="none",
                         declined=reason, model=self.name,
                         wall_s=round(time.perf_counter() - started, 4))]

    # -- the Proposer protocol ----------------------------------------------------------------

    def translate(self, ctx: TaskContext, n: int, rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("translate", [], str(e), started)
        space = self._space(analysis)
        chosen = [default_knobs(self.target, analysis)]
        for _ in range(50 * max(n, 1)):
            if len(chosen) >= n:
                break
            knobs = random_knobs(space, rng)
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
        space = self._space(analysis)
        base = normalize_knobs(_parent_knobs(parent), space, default_knobs(self.target, analysis))
        children: list[dict[str, int]] = []
        for _ in range(50 * max(n, 1)):
            if len(children) >= n:
                break
            child = mutate_knobs(base, space, rng)
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
        space = self._space(analysis)
        default = default_knobs(self.target, analysis)
        pk = [normalize_knobs(_parent_knobs(p), space, default) for p in parents]
        child = cross_knobs(pk, space, rng)
        for _ in range(16):  # prefer a child that is none of its parents
            if child not in pk:
                break
            child = cross_knobs(pk, space, rng)
        if child in pk:  # the parents agree on every knob: step off them
            child = mutate_knobs(child, space, rng)
        return [self._proposal(ctx, analysis, child, "crossover", ids, started)]

    def repair(self, ctx: TaskContext, parent: Parent, rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("repair", [parent.id], str(e), started)
        space = self._space(analysis)
        knobs = default_knobs(self.target, analysis)
        current = _parent_knobs(parent)
        if isinstance(current, dict) and normalize_knobs(current, space, knobs) == knobs:
            knobs = safe_knobs(self.target, analysis.plan.kind)
        return [self._proposal(ctx, analysis, knobs, "repair", [parent.id], started)]
