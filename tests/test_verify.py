"""The verifier's first version on the cpu target: honest kernels pass, cheats fail by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from assay.tasks.model import Task
from assay.verify.harness import verify
from assay.verify.settings import VerifyConfig

TASK = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
rows, cols = 16, 999
def get_inputs():
    return [torch.randn(rows, cols)]
def get_init_inputs():
    return []
"""

KERNEL = '''
import ctypes, torch
from torch import nn
from assay.bench.build import load_library
SOURCE = r"""
#include <cstdint>
extern "C" void relu(const float* x, float* y, int64_t n) {
  #pragma omp parallel for
  for (int64_t i = 0; i < LIMIT; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""
_lib = load_library(SOURCE.replace("LIMIT", "@LIMIT@"), "cpp")
class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = @ALLOC@
        _lib.relu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(x.numel()))
        @EXTRA@
        return y
'''


def kernel(limit="n", alloc="torch.empty_like(x)", extra="pass", prelude=""):
    return prelude + (KERNEL.replace("@LIMIT@", limit).replace("@ALLOC@", alloc)
                      .replace("@EXTRA@", extra))


CASES = {
    "honest": (kernel(), []),
    "partial_write": (kernel(limit="n / 2"), ["correctness"]),
    "library_call": ("""
import torch
from torch import nn
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp(x, min=0)
""", ["kernel_audit"]),
    "in_place_input": (kernel(alloc="x", extra="pass"), ["inputs_unchanged"]),
    "wrong_shape_broadcasts": (kernel(extra="y = y[:1]"), ["output_layout", "correctness"]),
    "patched_clock": (kernel(prelude="import time\ntime.perf_counter = lambda: 0.0\n"),
                      ["harness_integrity"]),
    # one thread where the harness runs more, else more than it runs
    "changes_thread_count": (kernel(prelude="import torch\ntorch.set_num_threads("
                                            "1 if torch.get_num_threads() > 1 else 2)\n"),
                             ["global_state"]),
    "crash": ("import os\nos._exit(7)\nclass ModelNew: ...\n", ["crash"]),
    "compile_error": ("""
from assay.bench.build import load_library
_lib = load_library("int main( {", "cpp")
""", ["compiles"]),
    "stale_cache": (kernel(extra="""
        key = x.data_ptr()
        cache = globals().setdefault("_cache", {})
        if key in cache:
            return cache[key]
        cache[key] = y"""), ["timed_outputs"]),
}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "level1" / "1_Relu.py"
    path.parent.mkdir()
    path.write_text(TASK)
    return Task.from_file(path)


@pytest.mark.parametrize("name", list(CASES))
def test_candidate(name, task, tmp_path):
    code, expected = CASES[name]
    cand = tmp_path / f"{name}.py"
    cand.write_text(code)
    v = verify(task, cand, "cpu", VerifyConfig(budget_s=0.2, min_runs=10, max_runs=40))
    assert v.accepted == (not expected), (v.reasons, {k: c["detail"][:300]
                                                      for k, c in v.checks.items()})
    for reason in expected:
        assert reason in v.reasons, (reason, v.reasons)
    if not expected:
        assert v.runtime_ms > 0 and v.max_abs_err == 0.0


def test_timeout_is_a_verdict(task, tmp_path):
    cand = tmp_path / "sleepy.py"
    cand.write_text("import time\ntime.sleep(60)\nclass ModelNew: ...\n")
    v = verify(task, cand, "cpu", VerifyConfig(timeout_s=5))
    assert not v.accepted and v.reasons == ["timeout"]
    assert v.verify_s < 30


def test_permissive_policy_reports_library_share(task, tmp_path):
    """The share is the median of the timed calls' (policy.audit): summed over the calls, one
    preempted 1 us aten::to beside another test worker made it 0.17 (0.96 alone)."""
    cand = tmp_path / "lib.py"
    cand.write_text(CASES["library_call"][0])
    v = verify(task, cand, "cpu", VerifyConfig(policy="permissive", budget_s=0.2))
    assert v.accepted and v.library_time_frac > 0.5


def test_cli_exit_codes(task, tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(CASES["honest"][0])
    bad.write_text(CASES["partial_write"][0])
    base = [sys.executable, "-m", "assay.cli", "verify", "--task", str(task.path), "--device",
            "cpu", "--no-compile"]
    out = tmp_path / "v.json"
    r = subprocess.run(base + ["--candidate", str(good), "--json", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    verdict = json.loads(out.read_text())
    for key in ("accepted", "checks", "reasons", "max_abs_err", "rel_err", "runtime_ms",
                "baseline_eager_ms", "baseline_compile_ms", "speedup_eager", "speedup_compile",
                "roofline_ms", "kernels_launched", "library_time_frac"):
        assert key in verdict
    assert verdict["baseline_eager_ms"] > 0 and verdict["speedup_eager"] > 0
    # where the seconds go: the worker's stages, and what its verified calls' outputs cost
    times = verdict["times"]
    # on cpu the CLI prepares while the baseline's process compiles: its seconds still said
    assert times["prepare_s"] > 0 and times["baseline_cached"] in ("yes", "no"), times
    steps = [times[f"worker.record.{k}_s"] for k in
             ("snapshot", "settle", "landing", "inputs_check", "handover")]
    assert all(x >= 0 for x in steps) and steps[1] > 0, times  # settle sleeps settle_s a call
    assert sum(steps) + times["worker.correctness_inputs_s"] <= \
        times["worker.correctness_s"] + times["worker.timing_s"] + times["worker.after_s"], times
    r = subprocess.run(base + ["--candidate", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "correctness" in r.stdout
    r = subprocess.run(base + ["--candidate", str(tmp_path / "missing.py")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "missing.py" in r.stderr
    r = subprocess.run([sys.executable, "-m", "assay.cli", "verify", "--task", str(task.path)],
                       capture_output=True, text=True)
    assert r.returncode == 2


def test_cli_rejects_what_cannot_load_before_any_baseline(task, tmp_path):
    base = [sys.executable, "-m", "assay.cli", "verify", "--task", str(task.path), "--device",
            "cpu"]
    cases = {"broken_syntax.py": ("import torch\nclass ModelNew(torch.nn.Module:\n    pass\n",
                                  "syntax error at line 2"),
             "no_model.py": ("import torch\nclass Model(torch.nn.Module):\n    pass\n",
                             "does not define class ModelNew"),
             "missing_import.py": ("import torch\nimport no_such_module_here\nModelNew = 1\n",
                                   "'no_such_module_here', which is not installed")}
    for name, (code, why) in cases.items():
        cand, out = tmp_path / name, tmp_path / f"{name}.json"
        cand.write_text(code)
        r = subprocess.run(base + ["--candidate", str(cand), "--json", str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "REJECTED: compiles" in r.stdout and "speedup" not in r.stdout
        assert str(cand) in r.stdout and why in r.stdout, r.stdout  # the user's own file
        verdict = json.loads(out.read_text())
        assert verdict["reasons"] == ["compiles"] and verdict["baseline_eager_ms"] is None
        assert "baseline_s" not in verdict["times"] and "worker_s" not in verdict["times"]


def test_cli_cuda_without_a_gpu_is_one_line_and_exit_2(task, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cand = tmp_path / "c.py"
    cand.write_text(CASES["honest"][0])
    r = subprocess.run([sys.executable, "-m", "assay.cli", "verify", "--task", str(task.path),
                        "--candidate", str(cand), "--device", "cuda"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "no CUDA device" in r.stderr
    h = subprocess.run([sys.executable, "-m", "assay.cli", "verify", "--help"],
                       capture_output=True, text=True).stdout
    assert "exit status: 0 accepted, 1 rejected" in h and "where the candidate runs" in h


def test_an_import_error_names_the_users_file_and_line(task, tmp_path):
    cand = tmp_path / "my_kernel.py"
    cand.write_text("import torch\nx = 1\nraise ValueError('boom')\nclass ModelNew: ...\n")
    v = verify(task, cand, "cpu", VerifyConfig(budget_s=0.1))
    assert v.reasons == ["compiles"]
    assert v.checks["compiles"]["detail"].startswith(f"{cand}, line 3: ValueError: boom")


@pytest.mark.parametrize("policy", ["strict", "permissive"])
def test_cli_transfer_reaches_the_verify_config(policy):
    """`assay verify --transfer cuda_ipc` sets verify.transfer under either policy; without the
    option the config's own value (draw) holds."""
    import argparse

    from assay.app import compose
    from assay.cli import _verify_overrides
    from assay.verify.config import from_cfg

    for transfer, expected in (("host", "host"), (None, "draw")):
        args = argparse.Namespace(policy=policy, transfer=transfer)
        # (one compose: on cpu the target group's thread count comes with it)
        for device, target in (("cpu", "cpu"), ("cuda", "auto")):
            composed = compose(_verify_overrides(args, device))
            cfg = from_cfg(composed.verify)
            assert (cfg.transfer, cfg.policy, composed.target.name) == (expected, policy, target)
