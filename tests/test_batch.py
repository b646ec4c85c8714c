"""Batch verification: `assay verify` over a folder of candidates (cpu, zoo tasks)."""

from __future__ import annotations

import json
import shutil

import pytest

from assay.cli import main
from assay.verify.batch import pair_candidates
from assay.verify.selfcheck import task_files
from helpers import REPO

ZOO = REPO / "tests" / "zoo"


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    monkeypatch.setenv("ASSAY_BASELINE_CACHE", str(tmp_path / "cache" / "baselines"))


def test_pairing_understands_the_three_layouts(tmp_path):
    tasks = task_files([ZOO / "tasks"])
    d = tmp_path / "c"
    for rel in ("level_1_problem_2_sample_0_kernel.py", "level_1_problem_2_sample_3_kernel.py",
                "level_9_problem_1_sample_0_kernel.py",  # no level 9
                "3_softmax/try1.py", "L1_4_matmul/a.py",  # a folder per task (stem or id)
                "1_gelu.py", "1_gelu_fast.py", "2_row_sum-v2.py",  # named after the task
                "readme_notes.py", "_private.py"):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text("")
    pairs, unmatched = pair_candidates(tasks, d)
    got = {str(p.candidate.relative_to(d)): p.task.stem for p in pairs}
    assert got == {"level_1_problem_2_sample_0_kernel.py": "2_row_sum",
                   "level_1_problem_2_sample_3_kernel.py": "2_row_sum",
                   "3_softmax/try1.py": "3_softmax", "L1_4_matmul/a.py": "4_matmul",
                   "1_gelu.py": "1_gelu", "1_gelu_fast.py": "1_gelu",
                   "2_row_sum-v2.py": "2_row_sum"}
    assert sorted(u.split(":")[0].rsplit("/", 1)[1] for u in unmatched) == \
        ["level_9_problem_1_sample_0_kernel.py", "readme_notes.py"]
    # one task: every file is its candidate
    one, none_left = pair_candidates([ZOO / "tasks/level1/1_gelu.py"], d / "3_softmax")
    assert [p.task.stem for p in one] == ["1_gelu"] and not none_left


def test_batch_verify_writes_a_line_per_candidate_and_resumes(tmp_path, capsys):
    runs = tmp_path / "runs" / "my_run"  # KernelBench's layout
    runs.mkdir(parents=True)
    for name, src in (("level_1_problem_1_sample_0_kernel.py", "honest_gelu_cpp.py"),
                      ("level_1_problem_2_sample_0_kernel.py", "exploit_cache_by_id.py"),
                      ("level_1_problem_2_sample_1_kernel.py",
                       "honest_row_sum_sequential_cpp.py")):
        shutil.copyfile(ZOO / "candidates" / src, runs / name)
    jsonl = tmp_path / "verdicts.jsonl"
    argv = ["verify", "--task", str(ZOO / "tasks"), "--candidate", str(runs), "--device", "cpu",
            "--no-compile", "--jsonl", str(jsonl), "--build-workers", "2"]
    assert main(argv) == 1  # the exploit is rejected
    rows = {json.loads(x)["candidate"].rsplit("/", 1)[1]: json.loads(x)
            for x in jsonl.read_text().splitlines()}
    assert len(rows) == 3
    honest = rows["level_1_problem_1_sample_0_kernel.py"]
    assert honest["accepted"] and honest["task"] == "L1_1_gelu"
    assert honest["baseline_eager_ms"] > 0 and honest["build_s"] is not None
    exploit = rows["level_1_problem_2_sample_0_kernel.py"]
    assert not exploit["accepted"] and "stale_results" in exploit["reasons"]
    second = rows["level_1_problem_2_sample_1_kernel.py"]
    assert second["accepted"]
    # the second candidate of a task reused the task's baseline and preparation
    assert second["times"]["prepare_s"] == 0.0 and second["times"]["baseline_cached"] is False
    assert second["times"]["record_cached"] is False  # analyzed once for the task, then cached
    assert second["baseline_eager_ms"] == exploit["baseline_eager_ms"]
    assert "2/3 candidates accepted" in capsys.readouterr().out

    before = jsonl.read_text()
    assert main(argv) == 1
    assert jsonl.read_text() == before  # nothing judged twice
    (runs / "level_1_problem_2_sample_1_kernel.py").write_text(
        (ZOO / "candidates/honest_row_sum_sequential_cpp.py").read_text() + "\n# edited\n")
    main(argv)
    added = jsonl.read_text()[len(before):].splitlines()
    assert len(added) == 1 and json.loads(added[0])["times"]["baseline_cached"] is True
    assert json.loads(added[0])["times"]["record_cached"] is True


def test_batch_bad_usage_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    base = ["verify", "--device", "cpu"]
    assert main(base + ["--task", str(ZOO / "tasks"), "--candidate",
                        str(tmp_path / "empty")]) == 2
    assert main(base + ["--task", str(tmp_path / "nope"), "--candidate",
                        str(tmp_path / "empty")]) == 2


def test_a_task_too_large_for_the_machine_is_decided_before_any_timing(tmp_path, monkeypatch):
    from assay.verify import batch, memory
    from assay.verify.settings import VerifyConfig

    monkeypatch.setattr(memory, "free_memory", lambda device: (None, 1 << 20))  # 1 MiB free
    monkeypatch.setattr(batch, "_baseline", lambda *a: pytest.fail("timed a baseline"))
    cand = tmp_path / "1_gelu.py"
    shutil.copyfile(ZOO / "candidates/honest_gelu_cpp.py", cand)
    pairs, _ = pair_candidates(task_files([ZOO / "tasks"]), cand)
    rows = batch.run_batch(pairs, "cpu", VerifyConfig(), "small", build_workers=0,
                           progress=lambda s: None)
    assert [r["status"] for r in rows] == ["too_large"]
    assert "host memory" in rows[0]["checks"]["too_large"]["detail"]


INLINE_GELU = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <cmath>
torch::Tensor gelu_forward(torch::Tensor x) {
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  const float* a = xc.data_ptr<float>();
  float* b = y.data_ptr<float>();
  for (int64_t i = 0; i < xc.numel(); ++i) {
    float v = a[i];
    b[i] = 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
  }
  return y;
}
"""
_ext = load_inline(name="zoo_gelu_inline", cpp_sources=source, functions=["gelu_forward"])


class ModelNew(nn.Module):
    def forward(self, x):
        return _ext.gelu_forward(x)
'''


def test_load_inline_candidates_build_once_in_the_pool_and_import_in_the_workers(tmp_path):
    """The sandboxed prebuild fills the shared cache; both workers import the library."""
    from assay.verify import batch
    from assay.verify.settings import VerifyConfig

    folder = tmp_path / "1_gelu"
    folder.mkdir()
    for name in ("a.py", "b.py"):  # the same kernel twice (two samples that agree)
        (folder / name).write_text(INLINE_GELU)
    pairs, _ = pair_candidates(task_files([ZOO / "tasks"]), tmp_path)
    rows = batch.run_batch(pairs, "cpu", VerifyConfig(policy="permissive"), "small",
                           baselines=False, build_workers=1, progress=lambda s: None)
    assert [r["status"] for r in rows] == ["accepted", "accepted"], [r.get("reasons")
                                                                     for r in rows]
    cache = tmp_path / "cache" / "kernels"
    assert len(list(cache.glob("inline-*.so"))) == 1
    build_s = rows[0]["build_s"]
    for r in rows:  # an import of the cached library, not a build
        assert r["times"]["worker.load_s"] < 0.2 * build_s
