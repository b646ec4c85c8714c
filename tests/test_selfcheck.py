"""`assay selfcheck`: each task's own Model as the candidate (cpu, small sizes)."""

from __future__ import annotations

import json

import pytest

from assay.cli import main
from assay.tasks.model import Task, TaskError
from assay.verify import selfcheck
from helpers import REPO

ZOO = REPO / "tests" / "zoo" / "tasks"

STATEFUL = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):   # counts its calls: not a function of its inputs, nothing can pass
        self.calls += 1
        return (x > 0).long().sum(dim=1) + self.calls

def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return []
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """A private cache holding generous cpu ceilings: peaks measured on a loaded 2-core CI
    machine can put the roofline floor above an honest reference (a selfcheck finding on such
    a machine, not what these tests are about)."""
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path / "cache" / "kernels"))
    from assay.bench.device import _cache_file, device_name

    path = _cache_file(device_name("cpu"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": device_name("cpu"), "bandwidth_gbs": 1e4,
                                "flops_tflops": 1e3}))


def test_candidate_is_the_task_at_its_size():
    task = Task.from_file(REPO / "data/tasks/level1/1_ReLU.py", size="small")
    src = selfcheck.candidate_source(task)
    ns: dict = {}
    exec(compile(src, "cand.py", "exec"), ns)
    assert ns["ModelNew"] is ns["Model"]
    small = task.module()
    assert all(ns[k] == getattr(small, k) for k in ns["ASSAY_SIZES"]["small"])


def test_task_files_takes_level_folders_and_files(tmp_path):
    files = selfcheck.task_files([ZOO])
    assert files[0].parent.name == "level1"
    assert {p.parent.name for p in files} == {"level1", "level2"}
    assert selfcheck.task_files([ZOO / "level1", ZOO / "level1" / "1_gelu.py"]) == \
        selfcheck.task_files([ZOO / "level1"])
    with pytest.raises(TaskError, match="no such task"):
        selfcheck.task_files([tmp_path / "missing"])


def test_selfcheck_accepts_honest_lists_degenerate_and_rejects_what_no_kernel_can_pass(
        tmp_path, write_file, capsys):
    noisy = write_file("level1/90_Stateful.py", STATEFUL)
    broken = write_file("level1/91_Broken.py", "class Model: pass\n")  # no get_inputs
    paths = [ZOO / "level1" / "1_gelu.py", ZOO / "level1" / "6_layernorm_mean_degenerate.py",
             noisy, broken]
    jsonl = tmp_path / "out" / "selfcheck.jsonl"
    md = tmp_path / "out" / "summary.md"
    code = main(["selfcheck", "--tasks", *map(str, paths), "--device", "cpu",
                 "--jsonl", str(jsonl), "--markdown", str(md)])
    rows = {json.loads(line)["path"]: json.loads(line) for line in jsonl.read_text().splitlines()}
    status = {p: rows[str(p)]["status"] for p in paths}
    assert status == {paths[0]: "accepted", paths[1]: "degenerate", noisy: "rejected",
                      broken: "error"}
    assert code == 1  # a rejection and an error: not a clean self-check
    deg = rows[str(paths[1])]["degeneracy"]
    assert deg["degenerate"] and deg["input_sensitivity"] < 1e-3
    assert rows[str(noisy)]["reasons"] and not rows[str(noisy)]["accepted"]
    assert "missing get_inputs" in rows[str(broken)]["error"]
    # the skipped checks are not run at all; the rest are
    checks = rows[str(paths[0])]
    assert checks["accepted"] and not checks["failed"]
    text = md.read_text()
    assert "| L1_6_layernorm_mean_degenerate |" in text and "Rejected" in text
    assert "1 accepted, 1 degenerate, 0 too_large, 1 rejected, 1 error" in text
    assert "L1_90_Stateful" in capsys.readouterr().out

    # resumable: nothing is redone; --retry error redoes only the error
    before = jsonl.read_text()
    assert main(["selfcheck", "--tasks", *map(str, paths[:3]), "--device", "cpu",
                 "--jsonl", str(jsonl)]) == 1
    assert jsonl.read_text() == before
    main(["selfcheck", "--tasks", *map(str, paths), "--device", "cpu", "--jsonl", str(jsonl),
          "--retry", "error"])
    added = jsonl.read_text()[len(before):].splitlines()
    assert [json.loads(line)["path"] for line in added] == [str(broken)]
    # --retry accepted with one task: that task's numbers again (e.g. memory peaks after a fix)
    before = jsonl.read_text()
    main(["selfcheck", "--tasks", str(paths[0]), "--device", "cpu", "--jsonl", str(jsonl),
          "--retry", "accepted"])
    added = jsonl.read_text()[len(before):].splitlines()
    assert [json.loads(line)["path"] for line in added] == [str(paths[0])]


def test_a_torn_last_line_is_ignored_and_the_next_row_starts_a_line(tmp_path):
    from assay.verify.rows import append_row, read_rows

    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text(json.dumps({"key": "a", "status": "accepted"}) + "\n{\"key\": \"b\", \"sta")
    assert [r["key"] for r in read_rows(jsonl)] == ["a"]
    append_row(jsonl, {"key": "c"})
    assert [r["key"] for r in read_rows(jsonl)] == ["a", "c"]


def test_budget_stops_before_starting_what_cannot_finish(tmp_path):
    out = selfcheck.run_selfcheck([ZOO / "level1" / "1_gelu.py"], "cpu", "small",
                                  jsonl=tmp_path / "s.jsonl", budget_s=5, progress=lambda s: 0)
    assert out["stopped"].startswith("time budget") and out["remaining"] == 1
    assert not (tmp_path / "s.jsonl").exists()
    assert main(["selfcheck", "--tasks", str(ZOO / "level1" / "1_gelu.py"), "--device", "cpu",
                 "--budget-s", "5"]) == 3


def test_budget_kills_a_task_in_flight_and_a_rerun_redoes_it(tmp_path, monkeypatch):
    import time

    slow = tmp_path / "level1" / "1_slow.py"
    slow.parent.mkdir()
    # the task's module sleeps when the self-check process loads it (the run's own process
    # never imports it): a task in flight past the budget
    slow.write_text("import time\ntime.sleep(120)\n" + (ZOO / "level1" / "1_gelu.py").read_text())
    monkeypatch.setattr(selfcheck, "MIN_START_S", 0.0)
    monkeypatch.setattr(selfcheck, "BUDGET_RESERVE_S", 1.0)
    seen: list = []
    t = time.perf_counter()
    out = selfcheck.run_selfcheck([slow], "cpu", "small", jsonl=tmp_path / "s.jsonl",
                                  budget_s=8, progress=seen.append)
    assert time.perf_counter() - t < 25
    assert out["killed"] == [str(slow)] and out["remaining"] == 1
    assert out["stopped"].startswith("time budget") and "killed" in out["stopped"]
    assert not (tmp_path / "s.jsonl").exists()  # not done: a rerun with the JSONL redoes it


def test_bad_usage_exits_2(tmp_path):
    assert main(["selfcheck", "--tasks", str(tmp_path / "nope.py")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["selfcheck", "--tasks", str(tmp_path / "empty")]) == 2


def test_kb_selfcheck_benchmark_resumes_and_refuses_to_overwrite(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("kb_selfcheck",
                                                  REPO / "benchmarks" / "kb_selfcheck.py")
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)
    out = tmp_path / "kb"
    argv = ["--source", str(ZOO), "--levels", "2", "--limit", "1", "--out", str(out),
            "--device", "cpu", "--size", "small", "--jobs", "1"]
    assert kb.main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["decided"] == 1 and summary["counts"]["accepted"] == 1
    assert "L2_1_gemm_bias_relu" in (out / "summary.md").read_text()
    assert kb.main(argv) == 2  # the JSONL exists: --resume or another folder
    lines = (out / "selfcheck.jsonl").read_text()
    assert kb.main(argv + ["--resume"]) == 0
    assert (out / "selfcheck.jsonl").read_text() == lines  # nothing redone
    assert kb.main(["--source", str(ZOO), "--levels", "7", "--out", str(tmp_path / "x")]) == 2


def test_kb_selfcheck_shards_partition_the_tasks(tmp_path):
    """--shard I/N (one process per GPU): the N shards together are every task once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kb_selfcheck",
                                                  REPO / "benchmarks" / "kb_selfcheck.py")
    kb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kb)
    base = ["--source", str(ZOO), "--levels", "1", "2", "--out", str(tmp_path)]
    every = kb.task_paths(kb.parse(base))
    shards = [kb.task_paths(kb.parse(base + ["--shard", f"{i}/3"])) for i in range(3)]
    assert len(every) >= 3 and all(shards)
    assert sorted(p for s in shards for p in s) == sorted(every)
    with pytest.raises(SystemExit):
        kb.parse(base + ["--shard", "3/3"])


def test_memory_plan_decides_too_large_and_defers_what_cannot_share(monkeypatch):
    from assay.verify import memory

    task = Task.from_file(ZOO / "level1" / "1_gelu.py", size="small")
    cfg = selfcheck.selfcheck_config()
    full = memory.plan_task(task, "cpu", cfg)
    assert full is not None and full.fits
    need = full.host_need_b
    # room for one such task but not for two: deferred at share=2, run at share=1
    monkeypatch.setattr(memory, "free_memory", lambda device: (None, int(need * 1.5)))
    assert selfcheck._memory_plan(task, "cpu", cfg, 2)[1] is False
    assert selfcheck._memory_plan(task, "cpu", cfg, 1)[1] is True
    row = selfcheck.check_task(task.path, "cpu", "small", share=2)
    assert row["status"] == "deferred"
    # room for a lighter protocol only: accepted, the row says how it was lighter
    shapes = memory.task_shapes(task.module())
    lightest = memory.plan_for(shapes, memory.lighter_protocols(memory.Protocol.of(cfg))[-1],
                               "cpu", "host", None, None).host_need_b
    free = int(lightest / 0.9) + 64
    monkeypatch.setattr(memory, "free_memory", lambda device: (None, free))
    row = selfcheck.check_task(task.path, "cpu", "small")
    steps = memory.plan(shapes, memory.Protocol.of(cfg), "cpu", None, free).reductions
    assert row["status"] == "accepted" and row["lighter"] == steps and steps
    assert "memory_plan" not in row["failed"]
    # no room at all: while other tasks share the machine (their memory is not free now),
    # deferred to run alone; alone, too_large with the numbers, before anything of the
    # task's size exists
    monkeypatch.setattr(memory, "free_memory", lambda device: (None, int(lightest * 0.8)))
    assert selfcheck.check_task(task.path, "cpu", "small", share=3)["status"] == "deferred"
    row = selfcheck.check_task(task.path, "cpu", "small")
    assert row["status"] == "too_large" and "host memory" in row["detail"]
    assert "even with the lightest protocol" in row["detail"]


def test_rows_are_keyed_by_level_name_and_content_not_absolute_path(tmp_path):
    a = tmp_path / "one" / "level1" / "1_gelu.py"
    b = tmp_path / "two" / "level1" / "1_gelu.py"
    for p in (a, b):
        p.parent.mkdir(parents=True)
        p.write_text((ZOO / "level1" / "1_gelu.py").read_text())
    assert selfcheck.row_key(a, "large", "cuda") == selfcheck.row_key(b, "large", "cuda")
    b.write_text(b.read_text() + "\n# edited\n")
    assert selfcheck.row_key(a, "large", "cuda") != selfcheck.row_key(b, "large", "cuda")
    assert selfcheck.row_key(a, "large", "cuda") != selfcheck.row_key(a, "small", "cuda")


STRIDED_VIEW = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):   # the last of a stack: a view that is not dense (Mamba2's states)
        y = torch.stack([x.sin(), x.cos(), x * 2], dim=1)
        return y[:, -1]

def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return []
"""


def test_a_reference_returning_a_view_that_is_not_dense_is_accepted_as_it_is(write_file):
    """The reference's outputs are kept as contiguous copies; the layout check also takes the
    strides its forward returned (KernelBench's Mamba2ReturnFinalState was rejected as its own
    candidate on an H200), and still refuses any other layout."""
    from assay.verify.harness import _layout_mismatches

    row = selfcheck.check_task(write_file("level1/92_View.py", STRIDED_VIEW), "cpu", "small")
    assert row["status"] == "accepted", row
    ref = __import__("torch").zeros(64, 32)
    meta = {"device": "cpu", "shape": [64, 32], "dtype": "float32"}
    assert not _layout_mismatches({**meta, "stride": [96, 1]}, ref, "cpu", "cpu", (96, 1))
    assert not _layout_mismatches({**meta, "stride": [32, 1]}, ref, "cpu", "cpu", (96, 1))
    assert _layout_mismatches({**meta, "stride": [1, 64]}, ref, "cpu", "cpu", (96, 1))


PERMUTED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):   # dense, in another memory order (as SDPA's fused backends return)
        return (x * 2).transpose(1, 2)

def get_inputs():
    return [torch.randn(4, 8, 16)]

def get_init_inputs():
    return []
"""

CONTIGUOUS_CANDIDATE = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return (x * 2).transpose(1, 2).contiguous()
"""


def test_a_contiguous_output_is_accepted_whatever_order_the_reference_returns(write_file,
                                                                             tmp_path):
    """Which dense memory order a library returns is its run-time choice (SDPA on an H100:
    (batch, seq, heads, dim) order, KernelBench's L1_97), so a contiguous output passes the
    layout check; another order than the reference's and the contiguous one does not, and a
    dim of size 1 addresses nothing."""
    import torch

    from assay.tasks.model import Task
    from assay.verify.harness import _layout_mismatches, strides_accepted, verify
    from assay.verify.settings import VerifyConfig

    ref = torch.zeros(2, 3, 4, 5).permute(0, 2, 1, 3)  # shape (2, 4, 3, 5), strides (60, 5, 20, 1)
    meta = {"device": "cpu", "shape": [2, 4, 3, 5], "dtype": "float32"}
    assert not _layout_mismatches({**meta, "stride": [60, 5, 20, 1]}, ref, "cpu", "cpu")
    assert not _layout_mismatches({**meta, "stride": [60, 15, 5, 1]}, ref, "cpu", "cpu")
    assert _layout_mismatches({**meta, "stride": [60, 1, 20, 4]}, ref, "cpu", "cpu")
    assert strides_accepted((2, 1, 3), (3, 99, 1), [(3, 3, 1)])
    assert not strides_accepted((2, 2, 3), (6, 1, 2), [(6, 3, 1)])
    task = Task.from_file(write_file("level1/93_Permuted.py", PERMUTED), size="small")
    cand = tmp_path / "contiguous.py"
    cand.write_text(CONTIGUOUS_CANDIDATE)
    verdict = verify(task, cand, "cpu", VerifyConfig(policy="permissive", budget_s=0.05,
                                                     min_runs=3, max_runs=10))
    assert verdict.checks["output_layout"]["passed"], verdict.checks["output_layout"]


def test_out_of_memory_beside_other_tasks_defers_the_task(monkeypatch, tmp_path):
    """A worker out of device memory while other tasks share the GPU is no verdict on the
    reference: the row says deferred (run again with fewer in flight); alone, it is one."""
    from assay.records import Verdict
    from assay.verify import checks, harness

    def out_of_memory(task, cand, device, *a, **k):
        v = Verdict(candidate=cand.stem, task=task.id, device=device, policy="strict")
        checks.record(v, "runs", False, "OutOfMemoryError: CUDA out of memory.")
        v.error = "OutOfMemoryError: CUDA out of memory."
        return v.finish()

    monkeypatch.setattr(harness, "verify", out_of_memory)
    path = REPO / "data/tasks/level1/1_ReLU.py"
    shared = selfcheck.check_task(path, "cpu", "small", workdir=tmp_path, share=3)
    assert shared["status"] == "deferred" and "memory" in shared["why"]
    alone = selfcheck.check_task(path, "cpu", "small", workdir=tmp_path, share=1)
    assert alone["status"] == "rejected" and alone["reasons"] == ["runs"]
