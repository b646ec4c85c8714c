"""Building, timing and baselines (see docs/ARCHITECTURE.md)."""

from __future__ import annotations

import os
from pathlib import Path


def absolute_pythonpath(src: str | Path) -> None:
    """Sandboxed workers run in scratch folders: a relative PYTHONPATH (``src``) must become
    absolute, and ``src`` (this checkout's package root) must be on it."""
    parts = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(src) not in parts:
        parts.insert(0, str(src))
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
