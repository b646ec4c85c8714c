"""Step `track`: log one LLM backend's tasks of the campaign to MLflow.

python -m assay.steps.track llm=offline [overrides]
One experiment per campaign, a parent run per backend, a child run per task with metrics per
generation (step = generation). Safe to rerun: runs are found by their tags and updated.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.layout import write_json

log = logging.getLogger("assay.track")


def track(cfg: DictConfig) -> dict:
    from assay.track.mlflow_log import log_task

    c = app.campaign(cfg)
    llm = cfg.llm.name
    refs, _ = app.task_refs(cfg)
    params = app.flat_params(cfg)
    runs = {}
    for i, ref in enumerate(refs, 1):
        if not c.generations(llm, ref.id):
            continue
        runs[ref.id] = log_task(cfg.mlflow.tracking_uri, c, llm, ref.id, params)
        log.info("[%d/%d] %s/%s -> run %s", i, len(refs), llm, ref.id, runs[ref.id]["run_id"])
    out = {"llm": llm, "tracking_uri": cfg.mlflow.tracking_uri, "runs": runs}
    write_json(c.backend_tracked(llm), out)
    return out


main = app.step(track)

if __name__ == "__main__":
    app.run_script(main)
