"""Step `translate`: generation 0 of one (llm, task): candidates written from the task alone.

python -m assay.propose llm=offline task=L1_1_ReLU [overrides]
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.evolve.state import known_ids, write_generation
from assay.evolve.steps import context

log = logging.getLogger("assay.translate")


def translate(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    llm = cfg.llm.name
    ctx = context(cfg, c, tgt)
    if ctx is None:
        log.warning("%s: skipped (task has an extraction error)", cfg.task)
        return write_generation(c, llm, cfg.task, 0, [])
    proposer = app.make_proposer(cfg, tgt)
    log.info("%s/%s: asking for %d translations", llm, cfg.task, cfg.evolve.translate_n)
    proposals = proposer.translate(ctx, cfg.evolve.translate_n, app.rng_for(cfg, llm, cfg.task, 0))
    summary = write_generation(c, llm, cfg.task, 0, proposals, known_ids(c, llm, cfg.task, 0))
    for d in summary["declined"]:
        log.info("%s/%s: declined: %s", llm, cfg.task, d["reason"])
    log.info("%s/%s: generation 0 has %d candidates", llm, cfg.task, len(summary["candidates"]))
    return summary


main = app.step(translate)

if __name__ == "__main__":
    main()
