"""What translate and evolve share: the task context and the archive's stepping stones."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from assay import app
from assay.evolve.functional import load_functional
from assay.evolve.population import best
from assay.evolve.state import (as_parent, load_members, load_stones, save_stones,
                                task_record)
from assay.layout import Campaign
from assay.propose.base import Parent, TaskContext

Where = tuple[Path, str, str, int, str]  # campaign folder, llm, task, generation, id


def find_stepping_stones(c: Campaign, llm: str, task: str, level: int,
                         k: int) -> list[tuple[Where, Parent]]:
    """The best accepted kernels of other tasks of the same level, from this campaign and
    earlier campaigns under the same results folder (stage 4: the innovation archive)."""
    if k <= 0 or not c.root.parent.is_dir():
        return []
    found: list[tuple[float, str, Where, Parent]] = []
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
                where = (other.root, llm, tdir.name, m.generation, m.id)
                found.append((m.speedup, m.id, where, as_parent(other, llm, tdir.name, m)))
    found.sort(key=lambda x: (-x[0], x[1]))
    return [(w, p) for _, _, w, p in found[:k]]


def stepping_stones(c: Campaign, llm: str, task: str, level: int, k: int) -> list[Parent]:
    return [p for _, p in find_stepping_stones(c, llm, task, level, k)]


def context(cfg: DictConfig, c: Campaign, tgt: str, gen: int | None = None) -> TaskContext | None:
    """The task (at the size of device ``tgt``), its record (with stage 1's verified functional
    form when there is one), the kernel target the proposers write for, and the stepping stones. With ``gen``, the stones are those recorded for that generation when
    a previous run of the step recorded them (resume), else found now and recorded."""
    record = task_record(c, cfg.task)
    if record.get("error"):
        return None
    llm = cfg.llm.name
    task = app.load_task(cfg, cfg.task, tgt)
    func = load_functional(c, llm, cfg.task)
    if func and func.get("source"):
        record = {**record, "functional_source": func["source"]}
    k = int(cfg.evolve.stepping_stones)
    stones = load_stones(c, llm, cfg.task, gen) if gen is not None else None
    if stones is None:
        found = find_stepping_stones(c, llm, cfg.task, task.level, k)
        if gen is not None:
            save_stones(c, llm, cfg.task, gen, [w for w, _ in found])
        stones = [p for _, p in found]
    return TaskContext(task=task, target=app.kernel_target(cfg, tgt), record=record,
                       stepping_stones=stones)
