"""Step `extract`: one task's record (sizes, FLOPs, minimum bytes, degeneracy).

python -m assay.tasks task=L1_1_ReLU [overrides]
A task that cannot be used gets a record with its one-line error; the campaign goes on.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay.layout import write_json
from assay.tasks.analyze import cost, degeneracy
from assay.tasks.model import TaskError

log = logging.getLogger("assay.extract")


def extract(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    tgt = app.target(cfg)
    ref = app.find_task(cfg, cfg.task)
    record = {"id": ref.id, "level": ref.level, "path": str(ref.path), "error": None}
    try:
        task = app.load_task(cfg, cfg.task, tgt)
        record.update(number=task.number, name=task.name, size=task.size,
                      source_hash=task.source_hash, source=task.source,
                      functional_source=None, target=tgt)
        log.info("%s: measuring FLOPs and bytes", task.id)
        record.update(cost(task))
        log.info("%s: degeneracy analysis", task.id)
        record["degeneracy"] = degeneracy(task, device="cuda" if tgt == "cuda" else "cpu")
        if record["degeneracy"]["degenerate"]:
            log.warning("%s is degenerate: %s", task.id, record["degeneracy"]["why"])
    except (TaskError, TypeError, RuntimeError, ValueError) as e:
        msg = str(e) if isinstance(e, TaskError) else f"{ref.path}: {type(e).__name__}: {e}"
        record["error"] = msg.splitlines()[0]
        log.error("%s", record["error"])
    write_json(c.task_record(ref.id), record)
    return record


main = app.step(extract, gpu=True)

if __name__ == "__main__":
    main()
