"""Stage 1: the task rewritten in functional form (``module_fn`` + a ``Model`` calling it),
checked against the original before any prompt uses it.

Files, beside generation 0 of each (llm, task):
  <llm>/<task>/functional.py    the rewrite (when the LLM returned one)
  <llm>/<task>/functional.json  what happened: accepted, reasons, detail, max_abs_err, id,
                                model, tokens_in, tokens_out, cost_usd, declined
Only an accepted rewrite reaches the prompts (``functional_source``). The record is written
once; a rerun reuses it without asking the LLM again or re-checking. Its tokens and cost are
counted in generation 0's proposals.json totals (the budget's and compare's spend).
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from assay.layout import Campaign, read_json, write_atomic, write_json
from assay.records import candidate_id

log = logging.getLogger("assay.functional")

DISTRIBUTIONS = ("native", "native", "large")


def functional_paths(c: Campaign, llm: str, task: str) -> tuple[Path, Path]:
    d = c.task_dir(llm, task)
    return d / "functional.py", d / "functional.json"


def load_functional(c: Campaign, llm: str, task: str) -> dict[str, Any] | None:
    """The stage-1 record of (llm, task), with ``source`` when the rewrite was accepted."""
    code_path, rec_path = functional_paths(c, llm, task)
    if not rec_path.exists():
        return None
    rec = read_json(rec_path)
    if rec.get("accepted") and code_path.exists():
        rec["source"] = code_path.read_text()
    return rec


def check_functional(task: Any, code: str, timeout_s: float = 300.0, limits: Any = None,
                     rtol: float = 1e-5, atol: float = 1e-6) -> dict[str, Any]:
    """Run ``functional_check`` on ``code`` against ``task`` (a Task) in the verifier's
    sandbox, on fresh secret seeds; the result dict (``accepted``, ``reasons``, ``detail``...)."""
    from assay.verify.sandbox import run_sandboxed
    from assay.verify.settings import SandboxLimits

    scratch = Path(tempfile.mkdtemp(prefix="assay-functional-"))
    try:
        shutil.copyfile(task.path, scratch / "task.py")
        (scratch / "functional.py").write_text(code)
        sets = [[secrets.randbits(30), d] for d in DISTRIBUTIONS]
        job = {"task": str(scratch / "task.py"), "size": task.size, "level": task.level,
               "rewrite": str(scratch / "functional.py"), "sets": sets, "rtol": rtol,
               "atol": atol}
        (scratch / "job.json").write_text(json.dumps(job))
        t0 = time.perf_counter()
        outcome = run_sandboxed([sys.executable, "-m", "assay.evolve.functional_check",
                                 str(scratch)], scratch, timeout_s, limits or SandboxLimits(),
                                device="cpu")
        result_path = scratch / "result.json"
        if result_path.exists():
            result = read_json(result_path)
        else:
            result = {"accepted": False, "reasons": ["crash"], "detail": str(outcome)}
        result["check_s"] = round(time.perf_counter() - t0, 3)
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def stage1(c: Campaign, llm: str, ctx: Any, proposer: Any, rng: random.Random,
           timeout_s: float = 300.0, limits: Any = None) -> dict[str, Any] | None:
    """The stage-1 record of (llm, ctx.task): reused when on disk, else asked for, checked
    and written. None when the proposer has no functional operator (offline)."""
    task_id = ctx.task.id
    done = load_functional(c, llm, task_id)
    if done is not None:
        return done
    if not hasattr(proposer, "functional"):
        log.info("%s/%s: stage 1 skipped (the %s proposer has no functional rewrite)", llm,
                 task_id, type(proposer).__name__)
        return None
    p = proposer.functional(ctx, rng)
    code_path, rec_path = functional_paths(c, llm, task_id)
    rec: dict[str, Any] = {"operator": "functional", "task": task_id, "llm": llm,
                           "model": p.model, "tokens_in": p.tokens_in,
                           "tokens_out": p.tokens_out, "cost_usd": p.cost_usd,
                           "wall_s": p.wall_s, "declined": p.declined,
                           "id": candidate_id(p.code) if p.code is not None else None}
    if p.code is None:
        rec.update(accepted=False, reasons=["declined"], detail=p.declined or "no code")
    else:
        result = check_functional(ctx.task, p.code, timeout_s, limits)
        rec.update(accepted=bool(result.get("accepted")), reasons=result.get("reasons", []),
                   detail=result.get("detail", ""), max_abs_err=result.get("max_abs_err"),
                   check_s=result.get("check_s"))
        write_atomic(code_path, p.code)
    write_json(rec_path, rec)
    log.info("%s/%s: stage 1 functional rewrite %s%s", llm, task_id,
             "accepted" if rec["accepted"] else "rejected",
             "" if rec["accepted"] else f" ({', '.join(rec['reasons'])}: {rec['detail']})")
    if rec["accepted"]:
        rec["source"] = p.code
    return rec
