"""The records that steps pass to one another through the results tree (plain JSON)."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

OPERATORS = ("functional", "translate", "mutate", "crossover", "repair")


def candidate_id(code: str) -> str:
    """Candidates are named by content: the same code is never verified twice."""
    return "c" + hashlib.sha256(code.encode()).hexdigest()[:12]


@dataclass
class Proposal:
    """What a proposer returns: a candidate file's text, or a decline with its reason."""

    code: str | None
    operator: str = "translate"
    parents: list[str] = field(default_factory=list)
    strategy: str = "default"  # niche: tiling, fusion, vectorization, ...
    knobs: dict[str, Any] = field(default_factory=dict)  # offline synthesizer's parameters
    declined: str | None = None  # why no code was produced
    model: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0

    @property
    def id(self) -> str | None:
        return candidate_id(self.code) if self.code is not None else None

    def meta(self, gen: int, llm: str, task: str) -> dict[str, Any]:
        d = asdict(self)
        d.pop("code")
        d.update(id=self.id, generation=gen, llm=llm, task=task)
        return d


@dataclass
class Check:
    passed: bool
    detail: str = ""


@dataclass
class Verdict:
    """The verifier's decision, in the design's contract (docs/ARCHITECTURE.md)."""

    accepted: bool = False
    checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    max_abs_err: float | None = None
    rel_err: float | None = None
    runtime_ms: float | None = None
    runtime_iqr_ms: float | None = None
    baseline_eager_ms: float | None = None
    baseline_compile_ms: float | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    roofline_ms: float | None = None
    kernels_launched: list[str] = field(default_factory=list)
    library_time_frac: float | None = None
    # the audit's rows over every timed call (name, kind, count, device_us, cpu_us), busiest
    # first: the profile step's torch-profiler table, read from here instead of a new run
    kernel_profile: list[dict[str, Any]] = field(default_factory=list)
    # bookkeeping (not part of the decision)
    candidate: str = ""
    task: str = ""
    device: str = ""
    policy: str = ""
    error: str = ""
    verify_s: float = 0.0

    def check(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks[name] = asdict(Check(passed, detail))
        if not passed and name not in self.reasons:
            self.reasons.append(name)
        return passed

    def finish(self) -> "Verdict":
        self.accepted = bool(self.checks) and not self.reasons
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
