"""An installed wheel works outside the checkout: `assay verify` and the CI campaign (`assay run`)
from a folder that holds nothing of the repository.

The wheel is built without network (`--no-build-isolation`) and installed `--no-deps` into a
fresh venv whose one `.pth` line lends it this interpreter's site-packages (torch, hydra,
snakemake...), but not this checkout: `assay` there is the wheel's copy, config, prompts,
Snakefile and bundled tasks included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.slow

RELU = '''
"""Honest ReLU in C++ (one pass, NaN kept)."""
import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
extern "C" void relu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] != x[i] || x[i] > 0.f) ? x[i] : 0.f;
}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.lib = load_library(SOURCE)

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        self.lib.relu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                      ctypes.c_int64(x.numel()))
        return y
'''


def sh(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("install")
    wheels, venv = tmp / "wheels", tmp / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ASSAY_CONFIG_DIR")}
    code, out = sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                    "--no-deps", "--no-index", "-w", str(wheels), str(REPO)], tmp, env)
    assert code == 0, out[-3000:]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = wheels.glob("assay-*.whl")
    code, out = sh([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], tmp, env)
    assert code == 0, out[-3000:]
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    env["ASSAY_KERNEL_CACHE"] = str(tmp / "kernels")
    work = tmp / "elsewhere"
    work.mkdir()
    code, where = sh([str(python), "-c", "import assay.resources as r; print(r.package_dir())"],
                     work, env)
    assert code == 0, where
    package = Path(where.strip())
    assert package.is_relative_to(venv) and not package.resolve().is_relative_to(REPO)
    return {"env": env, "work": work, "package": package}


def test_installed_wheel_verifies_a_bundled_task(installed):
    work, env = installed["work"], installed["env"]
    (work / "relu.py").write_text(RELU.lstrip())
    task = installed["package"] / "data" / "tasks" / "level1" / "1_ReLU.py"
    code, out = sh(["assay", "verify", "--task", str(task), "--candidate", "relu.py",
                    "--device", "cpu", "--size", "small", "--no-compile", "--json", "v.json"],
                   work, env)
    assert code == 0 and "ACCEPTED" in out, out[-3000:]
    assert (work / "v.json").exists()


def test_installed_wheel_runs_the_ci_campaign(installed):
    work, env = installed["work"], installed["env"]
    # one task, one generation, no torch.compile baselines: every rule runs, so what the
    # installed package carries (config, workflow, data, prompts) is all read; the CI suite's
    # three tasks run in tests/test_pipeline.py
    code, out = sh(["assay", "run", "campaign=ci", "tasks=ci", "tasks.include=[L1_1_ReLU]",
                    "evolve=ci", "evolve.generations=1", "baselines.compile=false"], work, env,
                   timeout=1500)
    assert code == 0, out[-4000:]
    campaign = work / "results" / "ci"
    assert (campaign / "report.html").exists() and list((campaign / "archive").glob("*.parquet"))
    # A bad config fails at start, in one line, from the installed package too.
    code, out = sh(["assay", "run", "campaign=ci", "verify.policy=lenient"], work, env)
    assert code != 0 and "verify.policy" in out and "strict, permissive" in out, out[-2000:]
