"""Evolution's logic as pure functions over member records: rank, keep, pick, plan.

A member is a verified candidate: its id, generation, verdict and proposal meta (strategy,
knobs, parents). Nothing here reads files or calls a proposer; the steps
``assay.steps.translate`` and ``assay.steps.evolve`` do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

# Checks whose failure a repair prompt can address (the code is wrong, not the idea).
REPAIRABLE = {"compiles", "constructs", "runs", "correctness", "output_layout", "parameters",
              "timed_outputs", "timeout"}


@dataclass(frozen=True)
class Member:
    id: str
    generation: int
    verdict: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    code_len: int = 0

    @property
    def accepted(self) -> bool:
        return bool(self.verdict.get("accepted"))

    @property
    def speedup(self) -> float:
        return float(self.verdict.get("speedup_eager") or 0.0) if self.accepted else 0.0

    @property
    def strategy(self) -> str:
        return self.meta.get("strategy") or "default"


def fitness(m: Member) -> tuple:
    """Verified speedup first; ties broken by correctness margin, then simplicity."""
    rel = m.verdict.get("rel_err")
    margin = -float(rel) if rel is not None else float("-inf")
    return (m.accepted, m.speedup, margin, -m.code_len, m.id)


def rank(members: list[Member]) -> list[Member]:
    return sorted(members, key=fitness, reverse=True)


def best(members: list[Member]) -> Member | None:
    accepted = [m for m in members if m.accepted]
    return rank(accepted)[0] if accepted else None


def survivors(members: list[Member], size: int) -> list[Member]:
    """Keep the best of each niche (strategy) first, then fill by rank: diversity survives."""
    accepted = rank([m for m in members if m.accepted])
    kept: list[Member] = []
    seen: set[str] = set()
    for m in accepted:
        if m.strategy not in seen:
            kept.append(m)
            seen.add(m.strategy)
    for m in accepted:
        if len(kept) >= size:
            break
        if m not in kept:
            kept.append(m)
    return kept[:size]


def tournament(pool: list[Member], rng: random.Random, k: int = 2) -> Member:
    contenders = rng.sample(pool, min(k, len(pool)))
    return max(contenders, key=fitness)


@dataclass(frozen=True)
class Operation:
    operator: str  # mutate | crossover | repair
    parents: tuple[Member, ...]


def plan(members: list[Member], latest_gen: int, children: int, population: int,
         crossover_rate: float, crossover_parents: int, repair: bool,
         rng: random.Random) -> list[Operation]:
    """The operations that make the next generation's ``children`` candidates."""
    pool = survivors(members, population)
    ops: list[Operation] = []
    if repair:
        # Only the latest generation's failures: older ones already had their chance.
        broken = [m for m in members if not m.accepted and m.generation == latest_gen
                  and set(m.verdict.get("reasons", [])) & REPAIRABLE]
        for m in rank(broken)[: max(1, children // 3)]:
            if len(ops) < children:
                ops.append(Operation("repair", (m,)))
    while len(ops) < children and pool:
        if len(pool) >= 2 and rng.random() < crossover_rate:
            n = min(crossover_parents, len(pool))
            parents = rng.sample(pool, n)
            ops.append(Operation("crossover", tuple(sorted(parents, key=fitness,
                                                           reverse=True))))
        else:
            ops.append(Operation("mutate", (tournament(pool, rng),)))
    return ops
