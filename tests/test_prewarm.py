"""torch.compile on fake tensors before the device is taken (bench/prewarm.py): the real compile
after it is an FX-graph cache hit. On this machine the tensors claim the cpu; the KernelBench DAG
on the GPU machine measures the cuda case (its baseline logs)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from assay.bench import baseline, prewarm
from assay.bench.timing import TimingConfig
from assay.tasks.model import Task

TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)
        self.norm = nn.LayerNorm(2 * width)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.fc(x)))


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return [32]
"""

QUICK = TimingConfig(warmup_s=0.0, min_runs=3, max_runs=3, budget_s=0.05)


def test_a_compile_on_fake_tensors_leaves_the_real_one_a_cache_hit(tmp_path, monkeypatch):
    """Without the prewarm, the baseline's compile misses inductor's FX-graph cache; after it
    (a child process, fake tensors: no memory, no kernel run), it hits."""
    path = tmp_path / "task.py"
    path.write_text(TASK)
    task = Task.from_file(path, size="large")
    hits = {}
    for warmed in (False, True):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / f"inductor-{warmed}"))
        torch._dynamo.reset()
        if warmed:
            warm = prewarm.prewarm(path, "large", "cpu", timeout_s=600)
            # no error: its compiled graphs are not run (on fake tensors they would launch
            # kernels on pointers with nothing behind them: a device fault on a GPU; here
            # fake tensors meeting the compiled code's real ones)
            assert warm["seconds"] > 0 and warm["error"] == "", warm
        out = baseline.time_reference(task, "cpu", QUICK)
        assert out["compile_ms"] is not None and out["compile_s"] > 0, out
        hits[warmed] = out["fxgraph_cache"]
    assert hits == {False: {"hit": 0, "miss": 1}, True: {"hit": 1, "miss": 0}}, hits


def test_the_prewarm_command_prints_one_json_line(tmp_path):
    """``python -m assay.bench.prewarm``: one line, its seconds and error (a file that does
    not run is an error in the line, not a crash)."""
    bad = tmp_path / "bad.py"
    bad.write_text("raise SystemError('no')\n")
    p = subprocess.run([sys.executable, "-m", "assay.bench.prewarm", str(bad), "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    row = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == 0 and row["error"] and row["seconds"] >= 0, (p.stdout, p.stderr)
