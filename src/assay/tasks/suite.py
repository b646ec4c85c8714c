"""Find task files: the bundled suite or any KernelBench-format folder.

``source`` may be a folder of level folders (``data/tasks`` or ``KernelBench/KernelBench``) or a
single level folder (``KernelBench/KernelBench/level1``). Only a static check runs here (parse
the file, look for the required names), so the workflow can list tasks at parse time without
importing torch; a file that fails it is reported in one line and left out.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from assay.tasks.model import TaskError, check_source, level_of, read_source, task_id_for


@dataclass(frozen=True)
class TaskRef:
    id: str
    level: int
    path: Path


def _task_files(folder: Path) -> list[Path]:
    files = [p for p in folder.glob("*.py") if not p.name.startswith("_")]
    key = lambda p: (int(p.stem.split("_")[0]) if p.stem.split("_")[0].isdigit() else 10**9,  # noqa: E731
                     p.name)
    return sorted(files, key=key)


def discover(source: str | Path, levels: Iterable[int] | None = None,
             include: Iterable[str] = (), exclude: Iterable[str] = (),
             limit: int | None = None, root: Path | None = None,
             ) -> tuple[list[TaskRef], list[str]]:
    """Return (valid task refs, one-line errors). ``include``/``exclude`` are id globs."""
    src = Path(source)
    if root is not None and not src.is_absolute():
        src = root / src
    if not src.is_dir():
        raise TaskError(f"{src}: task source is not a folder")
    level_dirs = sorted((p for p in src.iterdir() if p.is_dir() and level_of(p / "x", 0)),
                        key=lambda p: level_of(p / "x"))
    folders = level_dirs or [src]
    wanted = set(levels) if levels else None
    refs, errors = [], []
    for folder in folders:
        for path in _task_files(folder):
            level = level_of(path, default=1)
            if wanted is not None and level not in wanted:
                continue
            tid = task_id_for(level, path)
            if include and not any(fnmatch.fnmatch(tid, pat) for pat in include):
                continue
            if any(fnmatch.fnmatch(tid, pat) for pat in exclude):
                continue
            try:
                check_source(path, read_source(path))
            except TaskError as e:
                errors.append(str(e))
                continue
            refs.append(TaskRef(tid, level, path))
    if limit:
        refs = refs[:limit]
    ids = [r.id for r in refs]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise TaskError(f"{src}: task ids collide: {', '.join(sorted(dupes))}")
    return refs, errors
