"""Shared test fixtures: repo paths, task-file writers, a private kernel cache."""

from __future__ import annotations

import importlib.util
import os
import re
import textwrap
from pathlib import Path

# GPU tests spread over a machine's GPUs: with pytest-xdist and GPU_TESTS_SPREAD=N, worker gwK
# sees GPU K mod N only (set before torch touches CUDA: `-n N` on a machine of N GPUs runs the
# cuda zoo N times as fast, no test sharing a GPU's timing with another)
if os.environ.get("GPU_TESTS_SPREAD") and (m := re.fullmatch(
        r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(m[1]) % int(os.environ["GPU_TESTS_SPREAD"]))

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import REPO  # noqa: F401 - `from conftest import REPO` in older tests


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def write_file(tmp_path):
    """write_file("name.py", source) -> Path; dedents the source."""
    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        return path
    return write


def import_file(code: str, path: Path):
    """Write ``code`` to ``path`` and import it as a module (a candidate file, say)."""
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
