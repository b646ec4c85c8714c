"""The memory planner: shapes from the meta device (nothing of the task's size allocated), the
bytes of each placement against fake free-memory numbers, and KernelBench's largest tasks."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from assay.tasks.model import Task
from assay.verify.memory import (CUDA_CONTEXT_B, Protocol, TaskShapes, plan, shapes_or_none,
                                 task_shapes)
from assay.verify.settings import VerifyConfig

KERNELBENCH = Path("/work/shared/kernelbench")
GiB = 1 << 30

TASK = """
import torch
from torch import nn
class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n))
    def forward(self, x):
        y = x * 2.0          # an intermediate the size of the output
        return torch.sigmoid(y + self.w)
rows, cols = 1 << 20, 1 << 12   # 16 GiB of float32 per tensor: never allocated here
def get_inputs():
    return [torch.rand(rows, cols)]
def get_init_inputs():
    return [cols]
"""


def _task(tmp_path, text=TASK, name="1_Big.py") -> Task:
    p = tmp_path / name
    p.write_text(text)
    return Task.from_file(p)


def _rss_b() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_shapes_come_from_meta_without_allocating(tmp_path):
    before = _rss_b()
    s = task_shapes(_task(tmp_path).module())
    big = (1 << 32) * 4
    assert s.inputs_b == big and s.inputs64_b == 2 * big
    assert s.outputs_b == big and s.outputs64_b == 2 * big and s.outputs_numel == 1 << 32
    assert s.params_b == (1 << 12) * 4 and s.params64_b == (1 << 12) * 8
    # x * 2 and y + w live together before sigmoid frees nothing: at least two outputs' worth
    assert s.forward_peak_b >= 2 * big and s.forward64_peak_b >= 4 * big
    assert _rss_b() - before < GiB  # 16 GiB tensors were never made


def test_a_task_that_reads_data_has_no_plan_and_says_why(tmp_path):
    text = TASK.replace("return torch.sigmoid(y + self.w)",
                        "return y * float(x.max().item())")
    shapes, why = shapes_or_none(_task(tmp_path, text).module())
    assert shapes is None and "meta" in why


def _shapes(in_b, out_b, params_b=0) -> TaskShapes:
    return TaskShapes(in_b, 2 * in_b, out_b, 2 * out_b, out_b // 4, params_b, 2 * params_b,
                      out_b, 2 * out_b)


PROTO = Protocol.of(VerifyConfig())


def test_protocol_counts_the_default_config():
    assert (PROTO.sets, PROTO.check_sets, PROTO.timing_sets, PROTO.slots) == (8, 3, 3, 11)


def test_small_task_keeps_references_on_the_device():
    p = plan(_shapes(64 << 20, 64 << 20), PROTO, "cuda", 80 * GiB, 100 * GiB)
    assert p.fits and p.placement == "device"
    assert p.device_need_b > 2 * CUDA_CONTEXT_B


def test_references_move_to_the_host_when_the_device_cannot_hold_them():
    s = _shapes(512 << 20, 512 << 20)
    dev = plan(s, PROTO, "cuda", 1000 * GiB, 1000 * GiB)
    assert dev.placement == "device"
    p = plan(s, PROTO, "cuda", dev.device_need_b // 2, 1000 * GiB)
    assert p.fits and p.placement == "host"
    assert p.device_need_b < dev.device_need_b and p.host_need_b > dev.host_need_b


def test_too_large_names_the_bytes_needed_and_free():
    p = plan(_shapes(8 * GiB, 8 * GiB), PROTO, "cuda", 80 * GiB, 64 * GiB)
    assert not p.fits
    detail = p.too_large_detail()
    assert "GiB of host memory where 64.0 GiB is available" in detail
    assert "largest parts" in detail


def test_cpu_target_counts_everything_against_host_memory():
    s = _shapes(256 << 20, 256 << 20)
    p = plan(s, PROTO, "cpu", None, 100 * GiB)
    assert p.fits and p.device_need_b == p.host_need_b and p.device_free_b is None
    assert not plan(s, PROTO, "cpu", None, p.host_need_b // 2).fits
    assert "of host memory" in plan(s, PROTO, "cpu", None, 1 * GiB).too_large_detail()


def test_planner_scales_with_the_protocol():
    cfg = VerifyConfig(timing_sets=1, swap_sets=0)
    s = _shapes(GiB, GiB)
    lean = plan(s, Protocol.of(cfg), "cuda", None, None)
    full = plan(s, PROTO, "cuda", None, None)
    assert lean.host_need_b < full.host_need_b and lean.device_need_b < full.device_need_b


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem, in_b, out_b", [
    ("7_Matmul_with_small_K_dimension_", 2 * 32768 * 64 * 4, 32768 * 32768 * 4),
    ("24_LogSoftmax", 4096 * 393216 * 4, 4096 * 393216 * 4),
    ("25_Swish", 4096 * 393216 * 4, 4096 * 393216 * 4),
])
def test_kernelbench_tasks_that_ran_out_of_memory(stem, in_b, out_b):
    before = _rss_b()
    s = task_shapes(Task.from_file(KERNELBENCH / "level1" / f"{stem}.py").module())
    assert (s.inputs_b, s.outputs_b) == (in_b, out_b)
    assert _rss_b() - before < GiB
    # the configured protocol cannot hold them on an 80 GB H100 box ...
    full = plan(s, PROTO, "cuda", 79 * GiB, 120 * GiB, adapt=False)
    assert not full.fits and "GiB" in full.too_large_detail() and not full.reductions
    # ... a lighter one either holds them (and says how it is lighter) or says what it needs
    h100 = plan(s, PROTO, "cuda", 79 * GiB, 120 * GiB)
    assert h100.reductions and h100.protocol.check_sets >= 2
    assert h100.fits or "even with the lightest protocol" in h100.too_large_detail()


# --------------------------------------------------------------------------------------------
# Chunked comparison: the same answers a chunk at a time as in one piece.

def _cases():
    import torch

    g = torch.Generator().manual_seed(0)
    ref64 = torch.randn(10_000, generator=g, dtype=torch.float64) * 3
    ref = ref64.float()
    honest = (ref64 + 1e-7 * torch.randn(10_000, generator=g, dtype=torch.float64)).float()
    wrong = honest.clone()
    wrong[[17, 5000, 9999]] += 1.0
    nan_ref, nan_ok = ref.clone(), honest.clone()
    nan_ref[[3, 4000]] = float("nan")
    nan_ok[[3, 4000]] = float("nan")
    nan_missing = honest.clone()
    nan_missing[4000] = float("nan")
    inf_ref, inf_ok = ref.clone(), honest.clone()
    inf_ref[7000] = inf_ok[7000] = float("inf")
    ints = torch.arange(10_000)
    return [(honest, ref, ref64), (wrong, ref, ref64), (nan_ok, nan_ref, ref64),
            (nan_missing, nan_ref, ref64), (nan_missing, ref, ref64), (inf_ok, inf_ref, ref64),
            (-inf_ok, inf_ref, ref64), (honest.half(), ref.half(), ref64),
            (honest, ref, None), (ints, ints, None), (ints + (ints == 77), ints, None)]


@pytest.mark.parametrize("i", range(11))
def test_chunked_comparison_matches_one_piece(i):
    import math

    from assay.verify.compare import compare_tensor, reference_stats

    val, ref, ref64 = _cases()[i]
    cfg = VerifyConfig()
    whole = reference_stats(ref, ref64, chunk=1 << 30)
    parts = reference_stats(ref, ref64, chunk=999)
    assert whole.keys() == parts.keys()
    for k in whole:
        assert math.isclose(whole[k], parts[k], rel_tol=1e-9, abs_tol=1e-300), k
    a = compare_tensor(val, ref, ref64, whole, cfg, 64, chunk=1 << 30)
    b = compare_tensor(val, ref, ref64, whole, cfg, 64, chunk=999)
    assert (a.ok, a.precision_ok, a.detail) == (b.ok, b.precision_ok, b.detail)
    assert math.isclose(a.max_abs, b.max_abs) and math.isclose(a.rel, b.rel, rel_tol=1e-9)
    assert math.isclose(a.precision_ratio, b.precision_ratio, rel_tol=1e-9)
    expect_ok = i in (0, 2, 5, 7, 8, 9)
    assert a.ok == expect_ok, a.detail
    if i == 1:  # the first wrong element by its index in the whole output, each one counted
        assert a.detail.startswith("3/10000 elements off") and "index 17" in a.detail


def test_too_large_is_a_verdict_before_anything_is_prepared(tmp_path):
    from assay.verify.harness import verify
    from assay.verify.memory import TooLarge, plan_task
    from assay.verify.reference import prepare

    task = _task(tmp_path)  # 16 GiB per tensor: more than this machine (or a test) may use
    cand = tmp_path / "cand.py"
    cand.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    cfg = VerifyConfig()
    plan = plan_task(task, "cpu", cfg)
    assert plan is not None and plan.host_need_b > 16 * 8 * GiB
    if plan.fits:
        pytest.skip("a machine with this much memory")
    before = _rss_b()
    with pytest.raises(TooLarge, match="of host memory where"):
        prepare(task, "cpu", cfg)
    v = verify(task, cand, "cpu", cfg)
    assert not v.accepted and v.reasons == ["too_large"]
    assert "GiB of host memory where" in v.checks["too_large"]["detail"]
    assert _rss_b() - before < GiB
