"""Step `extract`: one task's record (sizes, FLOPs, bytes, degeneracy), ``tasks/<task>.json``.

python -m assay.steps.extract task=L1_1_ReLU [overrides]

The task file is executed in a child process with a time limit (``assay.tasks.record``); a task
that cannot be used gets a record whose ``error`` is one line, and the campaign goes on.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from assay import app
from assay import gpu as lease
from assay.layout import write_json
from assay.tasks.record import analyze_file

log = logging.getLogger("assay.extract")


def extract(cfg: DictConfig) -> dict:
    c = app.campaign(cfg)
    name = cfg.target.name
    tgt = app.target(cfg) if name != "auto" else "auto"  # auto is resolved in the child
    ref = app.find_task(cfg, cfg.task)
    # The analysis runs the task at its size on the device: its child takes the GPU before its
    # first use of it, once torch is imported and the file executed (seconds a task, beside
    # another job's device work).
    record = analyze_file(ref.path, ref.level, str(cfg.tasks.size), tgt,
                          timeout_s=cfg.tasks.extract_timeout_s,
                          max_bytes=cfg.tasks.max_task_bytes, device_lock=lease.device_lock())
    record = {"id": ref.id, "level": ref.level, "path": str(ref.path), **record}
    if record["error"]:
        log.error("%s", record["error"])
    elif record.get("degeneracy", {}).get("degenerate"):
        log.warning("%s is degenerate: %s", ref.id, record["degeneracy"]["why"])
    write_json(c.task_record(ref.id), record)
    return record


main = app.step(extract, gpu="late")

if __name__ == "__main__":
    app.run_script(main)
