"""What translate and evolve share: the task context and the archive's stepping stones."""

from __future__ import annotations

from omegaconf import DictConfig

from assay import app
from assay.evolve.population import best
from assay.evolve.state import as_parent, load_members, task_record
from assay.layout import Campaign
from assay.propose.base import Parent, TaskContext


def stepping_stones(c: Campaign, llm: str, task: str, level: int, k: int) -> list[Parent]:
    """The best accepted kernels of other tasks of the same level, from this campaign and
    earlier campaigns under the same results folder (stage 4: the innovation archive)."""
    if k <= 0:
        return []
    found: list[tuple[float, Parent]] = []
    for camp_dir in sorted(p for p in c.root.parent.iterdir() if p.is_dir()):
        other = Campaign(camp_dir)
        llm_dir = other.root / llm
        if not llm_dir.is_dir():
            continue
        for tdir in sorted(llm_dir.iterdir()):
            if tdir.name == task or not tdir.name.startswith(f"L{level}_"):
                continue
            gens = other.generations(llm, tdir.name)
            if not gens:
                continue
            m = best(load_members(other, llm, tdir.name, gens[-1]))
            if m is not None:
                found.append((m.speedup, as_parent(other, llm, tdir.name, m)))
    found.sort(key=lambda x: -x[0])
    return [p for _, p in found[:k]]


def context(cfg: DictConfig, c: Campaign, tgt: str) -> TaskContext | None:
    record = task_record(c, cfg.task)
    if record.get("error"):
        return None
    task = app.load_task(cfg, cfg.task, tgt)
    stones = stepping_stones(c, cfg.llm.name, cfg.task, task.level, cfg.evolve.stepping_stones)
    return TaskContext(task=task, target=tgt, record=record, stepping_stones=stones)
