"""Step `translate`: generation 0 of one (llm, task): candidates written from the task alone.

python -m assay.steps.translate llm=offline task=L1_1_ReLU [overrides]

With ``evolve.stage1_functional``, an LLM backend first rewrites the task in functional form
(stage 1); the rewrite is checked against the original in the sandbox and only an accepted one
is shown in the translation prompt (``<llm>/<task>/functional.{py,json}``). Under a budget cap
(``llm.budget_usd`` / ``llm.budget_tokens``) that is already reached, no request is made and the
generation is written empty with ``stopped: budget``.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.evolve.budget import STOPPED, Budget
from assay.evolve.context import context
from assay.evolve.state import known_ids, write_generation
from assay.propose import make_proposer

log = logging.getLogger("assay.translate")


def translate(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    llm, task = cfg.llm.name, cfg.task
    ctx = context(cfg, c, tgt, 0)
    if ctx is None:
        log.warning("%s: skipped (task has an extraction error)", task)
        return write_generation(c, llm, task, 0, [])
    budget = Budget.for_step(cfg, c, llm, task, 0)
    func = None
    proposer = None
    if cfg.evolve.stage1_functional and cfg.llm.kind != "offline":
        from assay.evolve.functional import load_functional, stage1

        func = load_functional(c, llm, task)
        if func is None and not budget.exhausted():
            proposer = make_proposer(cfg, app.kernel_target(cfg, tgt))
            func = stage1(c, llm, ctx, proposer, app.rng_for(cfg, llm, task, "functional"),
                          timeout_s=float(cfg.verify.timeout_s),
                          limits=_limits(cfg))
        if func is not None:
            budget.charge_raw(int(func.get("tokens_in") or 0) + int(func.get("tokens_out") or 0),
                              float(func.get("cost_usd") or 0.0))
            if func.get("source"):
                ctx.record = {**ctx.record, "functional_source": func["source"]}
    extra = (0, 0.0)
    if func is not None:
        extra = (int(func.get("tokens_in") or 0) + int(func.get("tokens_out") or 0),
                 float(func.get("cost_usd") or 0.0))
    if budget.exhausted():
        log.info("%s/%s: budget reached (%s); no translation requested", llm, task,
                 budget.note())
        return write_generation(c, llm, task, 0, [], stopped=STOPPED, budget=budget.note(),
                                extra_spend=extra, functional=func)
    proposer = proposer or make_proposer(cfg, app.kernel_target(cfg, tgt))
    log.info("%s/%s: asking for %d translations", llm, task, cfg.evolve.translate_n)
    proposals = proposer.translate(ctx, cfg.evolve.translate_n, app.rng_for(cfg, llm, task, 0))
    budget.charge(proposals)
    summary = write_generation(c, llm, task, 0, proposals, known_ids(c, llm, task, 0),
                               budget=budget.note(), extra_spend=extra, functional=func)
    for d in summary["declined"]:
        log.info("%s/%s: declined: %s", llm, task, d["reason"])
    log.info("%s/%s: generation 0 has %d candidates", llm, task, len(summary["candidates"]))
    return summary


def _limits(cfg: DictConfig):
    from assay.verify.settings import SandboxLimits

    return SandboxLimits(**cfg.verify.limits)  # the schema's type: every key is a field


main = app.step(translate)

if __name__ == "__main__":
    app.run_script(main)
