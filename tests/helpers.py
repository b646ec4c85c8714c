"""Helpers shared by the test modules (import them: `from helpers import REPO, snakemake`).

pytest puts tests/ on sys.path (rootdir conftest, no __init__.py), so this imports as
`helpers` from every test module.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CI = ("campaign=ci", "tasks=ci", "evolve=ci")  # the CI campaign: three small tasks


def overrides_arg(overrides: Sequence[str]) -> str:
    """Snakemake's `--config` value carrying these Hydra overrides; each is JSON-quoted, so
    nested lists (`llms=[a,b]`) and commas survive Snakemake's parsing."""
    return "overrides=[" + ",".join(json.dumps(o) for o in overrides) + "]"


def snakemake(workdir: Path, *args: str, overrides: Sequence[str] = CI,
              cores: int = 2) -> list[str]:
    """The command line running the campaign DAG of this checkout in ``workdir`` with this
    interpreter. ``args`` (targets, -n, --forcerun X ...) come before `--config`, which would
    swallow a target placed after it."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(workdir), "--cores", str(cores), *args,
            "--config", overrides_arg(overrides)]


def env(**extra: str) -> dict[str, str]:
    """This process's environment with this interpreter's bin first (the rules call `python
    -m`, Snakemake's profiles `snakemake`), plus ``extra``."""
    e = dict(os.environ)
    e["PATH"] = f"{Path(sys.executable).parent}:{e['PATH']}"
    e.update(extra)
    return e
