"""Step `evolve`: generation g >= 1 of one (llm, task): mutation, crossover and repair of the
verified population of generations 0..g-1.

python -m assay.steps.evolve llm=offline task=L1_1_ReLU gen=1 [overrides]

Everything the step decides derives from files: the population and its niches from the
verdicts and proposal metadata of generations 0..g-1, the random choices from
``app.rng_for(cfg, llm, task, gen)``, the stepping stones from ``gen_<g>/stones.json`` (written
before the first request), the budget spent from the campaign's proposals.json files, and the
answers from the LLM disk cache. So a step killed half-way and run again makes the same
requests, replays their answers and writes the same generation.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.evolve.budget import STOPPED, Budget
from assay.evolve.context import context
from assay.evolve.population import plan
from assay.evolve.state import as_parent, known_ids, load_members, write_generation
from assay.propose import make_proposer

log = logging.getLogger("assay.evolve")


def evolve(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    llm, task, gen = cfg.llm.name, cfg.task, int(cfg.gen)
    if gen < 1:
        raise app.UserError(f"gen={gen}: evolve makes generations 1 and later (0 is translate)")
    members = load_members(c, llm, task, gen - 1)
    budget = Budget.for_step(cfg, c, llm, task, gen)
    if budget.exhausted():
        log.info("%s/%s gen %d: budget reached (%s); no requests", llm, task, gen,
                 budget.note())
        return write_generation(c, llm, task, gen, [], stopped=STOPPED, budget=budget.note())
    ctx = context(cfg, c, tgt, gen) if members else None
    if not ctx:
        log.info("%s/%s gen %d: nothing to evolve from", llm, task, gen)
        return write_generation(c, llm, task, gen, [], budget=budget.note())
    e = cfg.evolve
    rng = app.rng_for(cfg, llm, task, gen)
    ops = plan(members, gen - 1, e.children, e.population, e.crossover_rate,
               e.crossover_parents, e.repair, rng)
    proposer = make_proposer(cfg, app.kernel_target(cfg, tgt))
    proposals = []
    stopped = None
    for i, op in enumerate(ops, 1):
        if budget.exhausted():
            stopped = STOPPED
            log.info("%s/%s gen %d: budget reached after %d of %d operations", llm, task, gen,
                     i - 1, len(ops))
            break
        parents = [as_parent(c, llm, task, m) for m in op.parents]
        log.info("%s/%s gen %d [%d/%d]: %s of %s", llm, task, gen, i, len(ops), op.operator,
                 ", ".join(p.id for p in parents))
        if op.operator == "mutate":
            new = proposer.mutate(ctx, parents[0], 1, rng)
        elif op.operator == "crossover":
            new = proposer.crossover(ctx, parents, rng)
        else:
            new = proposer.repair(ctx, parents[0], rng)
        budget.charge(new)
        proposals += new
    summary = write_generation(c, llm, task, gen, proposals, known_ids(c, llm, task, gen),
                               stopped=stopped, budget=budget.note())
    log.info("%s/%s gen %d: %d new candidates", llm, task, gen, len(summary["candidates"]))
    return summary


main = app.step(evolve)

if __name__ == "__main__":
    app.run_script(main)
