"""The pins hold together: environment.yml mirrors pyproject.toml (versions and platform
markers), the full MLflow goes with mlflow-skinny's version, the pinned ninja is the one torch
builds candidates with (from the venv's bin, no system ninja needed), and the pinned Triton runs
kernels on cpu tensors in its interpreter beside the CPU torch of CI."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from helpers import REPO


def _pins(specs: list[str]) -> dict[str, str]:
    """name -> version, with the platform marker when there is one (``3.9.0; platform_...``)."""
    out = {}
    for spec in specs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)\s*(?:;\s*(.+))?", spec.strip())
        if m:
            marker = " ".join(m.group(3).replace('"', "'").split()) if m.group(3) else ""
            out[m.group(1).lower()] = m.group(2) + (f"; {marker}" if marker else "")
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
    # exact, and only where its wheels exist (Linux x86_64)
    assert pinned["triton"].startswith("3.9.0; ") and "platform_machine == 'x86_64'" in \
        pinned["triton"], pinned["triton"]


def test_installed_versions_are_the_pinned_ones() -> None:
    pinned = _pyproject()
    for name in ("mlflow", "mlflow-skinny", "ninja"):
        assert metadata.version(name) == pinned[name], name
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert metadata.version("triton") == pinned["triton"].split(";")[0], "triton"


TRITON_ON_CPU = """
import torch, triton, triton.language as tl

@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m),
             mask=m)

x, y = torch.randn(1000), torch.randn(1000)
out = torch.full_like(x, float("nan"))
scale_add[(triton.cdiv(1000, 256),)](x, y, out, 1000, BLOCK=256)
assert torch.equal(out, 2.0 * x + y), (out - (2.0 * x + y)).abs().max()
print(torch.__version__, triton.__version__)
"""


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                    reason="Triton's wheels are for Linux x86_64")
def test_triton_runs_in_its_interpreter_beside_the_cpu_torch() -> None:
    """target=triton's tests run on cpu tensors under TRITON_INTERPRET=1: the pinned Triton
    does that with the torch installed here (CI's CPU build), without a GPU or a driver."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_ON_CPU], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[1] == _pyproject()["triton"].split(";")[0], done.stdout


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
