"""Step `evolve`: generation g >= 1 of one (llm, task): mutation, crossover and repair of the
verified population of generations 0..g-1.

python -m assay.evolve llm=offline task=L1_1_ReLU gen=1 [overrides]
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.evolve.population import plan
from assay.evolve.state import as_parent, known_ids, load_members, write_generation
from assay.evolve.steps import context

log = logging.getLogger("assay.evolve")


def evolve(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    llm, task, gen = cfg.llm.name, cfg.task, int(cfg.gen)
    if gen < 1:
        raise app.UserError(f"gen={gen}: evolve makes generations 1 and later (0 is translate)")
    ctx = context(cfg, c, tgt)
    members = load_members(c, llm, task, gen - 1) if ctx else []
    if not members:
        log.info("%s/%s gen %d: nothing to evolve from", llm, task, gen)
        return write_generation(c, llm, task, gen, [])
    e = cfg.evolve
    rng = app.rng_for(cfg, llm, task, gen)
    ops = plan(members, gen - 1, e.children, e.population, e.crossover_rate,
               e.crossover_parents, e.repair, rng)
    proposer = app.make_proposer(cfg, tgt)
    proposals = []
    for i, op in enumerate(ops, 1):
        parents = [as_parent(c, llm, task, m) for m in op.parents]
        log.info("%s/%s gen %d [%d/%d]: %s of %s", llm, task, gen, i, len(ops), op.operator,
                 ", ".join(p.id for p in parents))
        if op.operator == "mutate":
            proposals += proposer.mutate(ctx, parents[0], 1, rng)
        elif op.operator == "crossover":
            proposals += proposer.crossover(ctx, parents, rng)
        else:
            proposals += proposer.repair(ctx, parents[0], rng)
    summary = write_generation(c, llm, task, gen, proposals, known_ids(c, llm, task, gen))
    log.info("%s/%s gen %d: %d new candidates", llm, task, gen, len(summary["candidates"]))
    return summary


main = app.step(evolve)

if __name__ == "__main__":
    main()
