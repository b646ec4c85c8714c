"""Verify generated variants with the real verifier (shared by tests/test_redteam.py and
benchmarks/redteam.py): one preparation per task and process, the zoo's short timing budget."""

from __future__ import annotations

import time
from pathlib import Path

from assay.tasks.model import Task
from assay.verify.harness import Prepared, VerifyConfig, prepare, verify
from assay.verify.settings import SandboxLimits

from .generate import ROOTS, Variant, judge

_TASKS: dict[str, Task] = {}
_PREPARED: dict[str, Prepared] = {}


def config(budget_s: float = 0.1, policy: str = "strict") -> VerifyConfig:
    """The zoo's settings (tests/test_zoo.py: zoo_config): a short timing budget is enough for
    the checks; the timings themselves are not what the red team measures."""
    return VerifyConfig(policy=policy, budget_s=budget_s, warmup_s=0.02, min_runs=10,
                        max_runs=20, timeout_s=300, limits=SandboxLimits(memory_gb=32))


def task_of(v: Variant) -> Task:
    key = f"{v.target}:{v.task}"
    if key not in _TASKS:
        _TASKS[key] = Task.from_file(ROOTS[v.target] / "tasks" / f"{v.task}.py")
    return _TASKS[key]


def prepared_for(v: Variant, cfg: VerifyConfig) -> Prepared:
    key = f"{v.target}:{v.task}"
    if key not in _PREPARED:
        _PREPARED[key] = prepare(task_of(v), v.target, cfg)
    return _PREPARED[key]


def run(v: Variant, path: Path, budget_s: float = 0.1, times: dict | None = None) -> dict:
    """One verification; the row the benchmark records and the test asserts on (``times``:
    filled with the verdict's seconds per phase)."""
    cfg = config(budget_s)
    t0 = time.perf_counter()
    verdict = verify(task_of(v), path, v.target, cfg, prepared=prepared_for(v, cfg),
                     times=times)
    failed = {k: c["detail"][:300] for k, c in verdict.checks.items() if not c["passed"]}
    outcome = judge(v, verdict.accepted, list(verdict.reasons))
    row = {**v.meta(), "accepted": verdict.accepted, "got": list(verdict.reasons),
           "outcome": outcome, "runtime_ms": verdict.runtime_ms,
           "verify_s": round(time.perf_counter() - t0, 2), "failed": failed,
           "error": (verdict.error or "")[:300]}
    if outcome in ("accepted", "known_gap"):
        # what the checks its method should have failed saw (the cuda run accepted the bf16
        # MSE that the cpu run rejects for precision: these say by how much it passed)
        row["passed"] = {k: verdict.checks[k]["detail"][:300] for k in sorted(v.reasons)
                         if k in verdict.checks}
    return row
