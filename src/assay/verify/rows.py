"""Result rows as JSON lines: one line per decided item, appended and synced as soon as it is
decided, so a killed run loses nothing and a rerun skips what is already there (the self-check
and batch verification share this)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_rows(jsonl: Path | None) -> list[dict[str, Any]]:
    """Rows already written (a torn last line, from a killed run, is ignored)."""
    if jsonl is None or not jsonl.exists():
        return []
    rows = []
    for line in jsonl.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows.append(row)
    return rows


def append_row(jsonl: Path | None, row: dict[str, Any]) -> None:
    if jsonl is None:
        return
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    with open(jsonl, "a+") as f:
        torn = f.tell() > 0 and (f.seek(f.tell() - 1), f.read(1))[1] != "\n"
        f.write(("\n" if torn else "") + json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def latest(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last row per task (a retried task has several)."""
    return {r["key"]: r for r in rows}
