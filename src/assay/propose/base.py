"""The Proposer protocol: every source of candidates (LLMs, the offline synthesizer) is one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from assay.records import Proposal
from assay.tasks.model import Task


@dataclass
class Parent:
    """A candidate already verified, offered to a proposer as a parent or a stepping stone."""

    id: str
    code: str
    verdict: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] | None = None


@dataclass
class TaskContext:
    task: Task
    target: str  # "cpu" or "cuda"
    record: dict[str, Any] = field(default_factory=dict)  # the task record from extraction
    stepping_stones: list[Parent] = field(default_factory=list)  # best kernels of similar tasks


class Proposer(Protocol):
    name: str

    def translate(self, ctx: TaskContext, n: int, rng: random.Random) -> list[Proposal]:
        """Generation 0: candidates written from the task alone."""

    def mutate(self, ctx: TaskContext, parent: Parent, n: int,
               rng: random.Random) -> list[Proposal]:
        """Children of one parent (its code, verdict, timing and profile are in ``parent``)."""

    def crossover(self, ctx: TaskContext, parents: list[Parent],
                  rng: random.Random) -> list[Proposal]:
        """Children that combine two or three parents; each child lists all their ids."""

    def repair(self, ctx: TaskContext, parent: Parent, rng: random.Random) -> list[Proposal]:
        """A fix for a parent that failed to compile or computed wrong results."""
