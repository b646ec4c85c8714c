"""Shared test fixtures: repo paths, task-file writers, a private kernel cache."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch

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
