"""The pins hold together: environment.yml mirrors pyproject.toml, the full MLflow goes with
mlflow-skinny's version, and the pinned ninja is the one torch builds candidates with (from the
venv's bin, no system ninja needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import yaml

from helpers import REPO


def _pins(specs: list[str]) -> dict[str, str]:
    out = {}
    for spec in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", spec.strip())
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def _pyproject() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    return _pins(specs)


def test_environment_yml_mirrors_pyproject() -> None:
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda = _pins(pip)
    pinned = _pyproject()
    assert {k: conda.get(k) for k in pinned} == pinned
    assert pinned["mlflow"] == pinned["mlflow-skinny"]  # the UI and the client of one release
    assert "ninja" in pinned


def test_installed_versions_are_the_pinned_ones() -> None:
    pinned = _pyproject()
    for name in ("mlflow", "mlflow-skinny", "ninja"):
        assert metadata.version(name) == pinned[name], name


def test_torch_builds_with_the_venvs_ninja() -> None:
    """With only the interpreter's bin folder on PATH (no /usr/bin), torch's cpp_extension
    finds ninja: the pinned wheel's, not a system one."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "ninja").exists(), f"no ninja in {bin_dir}: pip install -e '.[pipeline]'"
    code = ("import shutil, torch.utils.cpp_extension as c; "
            "print(c.is_ninja_available(), shutil.which('ninja'))")
    env = {**os.environ, "PATH": str(bin_dir)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", str(bin_dir / "ninja")]
