"""The memory planner: shapes from the meta device (nothing of the task's size allocated), the
bytes of each placement against fake free-memory numbers, and KernelBench's largest tasks."""

from __future__ import annotations

import os
import resource

import pytest

from assay.tasks.model import Task
from assay.verify import memory
from assay.verify.memory import (CUDA_CONTEXT_B, Protocol, TaskShapes, cached_shapes, plan,
                                 plan_for, shapes_or_none, task_shapes)
from assay.verify.settings import VerifyConfig
from helpers import KERNELBENCH

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


def test_shapes_are_cached_per_task_content_and_what_cannot_be_planned_too(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSAY_BASELINE_CACHE", str(tmp_path / "cache"))
    meta_passes = []
    real = memory.shapes_or_none
    monkeypatch.setattr(memory, "shapes_or_none", lambda m: meta_passes.append(1) or real(m))
    task = _task(tmp_path)
    first = cached_shapes(task)
    assert first == (task_shapes(task.module()), "") and len(meta_passes) == 1
    assert cached_shapes(Task.from_file(task.path)) == first and len(meta_passes) == 1
    # another task's content is another key; one that cannot be planned is cached with why
    reads = _task(tmp_path, TASK.replace("return torch.sigmoid(y + self.w)",
                                         "return y * float(x.max().item())"), "2_Reads.py")
    shapes, why = cached_shapes(reads)
    assert shapes is None and "meta" in why and len(meta_passes) == 2
    assert cached_shapes(reads) == (None, why) and len(meta_passes) == 2
    # a damaged file, or one of another TaskShapes' fields, is made again
    [cached] = (tmp_path / "cache").glob(f"{task.id}-shapes-*.json")
    cached.write_text('{"shapes": {"inputs_b": 1}, "why": ""}')
    assert cached_shapes(task) == first and len(meta_passes) == 3


def _shapes(in_b, out_b, params_b=0) -> TaskShapes:
    return TaskShapes(in_b, 2 * in_b, out_b, 2 * out_b, out_b // 4, params_b, 2 * params_b,
                      out_b, 2 * out_b)


# The host transfer's protocol: the plans below are the host path's numbers (on cuda the
# default cuda_ipc is weighed against it: test_plan_transfers_takes_the_lighter_path)
HOST = VerifyConfig(transfer="host")
PROTO = Protocol.of(HOST)


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
    cfg = VerifyConfig(timing_sets=1, swap_sets=0, transfer="host")
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
    # the configured protocol cannot hold them on an 80 GB H100 box, but for the small-K GEMM
    # (16 MiB of inputs, 4 GiB of output) with its references recomputed at comparison ...
    full = plan(s, PROTO, "cuda", 79 * GiB, 120 * GiB, adapt=False)
    if stem.startswith("7_"):
        assert full.fits and full.placement == "recompute" and not full.reductions
        return
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
    nan_ref64 = ref64.clone()
    nan_ref64[[3, 4000]] = float("nan")
    ints = torch.arange(10_000)
    return [(honest, ref, ref64), (wrong, ref, ref64), (nan_ok, nan_ref, ref64),
            (nan_missing, nan_ref, ref64), (nan_missing, ref, ref64), (inf_ok, inf_ref, ref64),
            (-inf_ok, inf_ref, ref64), (honest.half(), ref.half(), ref64),
            (honest, ref, None), (ints, ints, None), (ints + (ints == 77), ints, None),
            (nan_missing, nan_ref, nan_ref64)]


@pytest.mark.parametrize("i", range(12))
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
    # 3: a value where the reference's NaN is its own artifact (float64 has that value) is
    # the value expected (compare._expected_where_the_reference_overflowed); 11: where float64
    # has the NaN too, a kernel must have it
    expect_ok = i in (0, 2, 3, 5, 7, 8, 9)
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


# --------------------------------------------------------------------------------------------
# The memory-adaptive protocol: each lighter step is taken when, and only when, the one before
# does not fit (fake free-memory numbers; KernelBench shapes from the meta device).

def _ladder_needs(s: TaskShapes, device: str) -> list[tuple[Protocol, int]]:
    """(protocol, bytes its host placement needs of the short side: the host on cpu, the
    device on cuda) along the ladder."""
    from assay.verify.memory import lighter_protocols, plan_for

    side = "host_need_b" if device == "cpu" else "device_need_b"
    return [(p, getattr(plan_for(s, p, device, "host", None, None), side))
            for p in lighter_protocols(PROTO)]


def test_the_ladder_goes_one_step_at_a_time_and_never_under_two_correctness_sets():
    from assay.verify.memory import lighter_protocols

    steps = lighter_protocols(PROTO)
    counts = [(p.wide_all, p.one_landing, p.timing_sets, p.swap_sets, p.check_sets)
              for p in steps]
    assert counts == [(True, False, 3, 2, 3), (False, False, 3, 2, 3), (False, True, 3, 2, 3),
                      (False, True, 2, 2, 3), (False, True, 1, 2, 3), (False, True, 1, 1, 3),
                      (False, True, 1, 0, 3), (False, True, 1, 0, 2)]
    # correctness, staleness, a correctness set swapped into a timed call, one after timing
    assert steps[-1].slots == 2 + 3 + 1 + 1
    assert list(steps[-1].reductions(PROTO)) == ["float64", "landing", "timing", "swap", "check"]
    assert steps[0].reductions(PROTO) == {}


def test_a_plan_takes_no_more_steps_than_the_ladder_needs_where_it_fits():
    """With just enough memory for the ladder's step i, the plan fits with at most that
    step's reductions: another protocol of the lattice may fit with fewer; the same number,
    then the one taken off least; none where the full protocol fits."""
    from assay.verify.memory import lighter_lattice, plan_for

    s = _shapes(GiB, GiB)
    needs = _ladder_needs(s, "cpu")
    assert all(a[1] > b[1] for a, b in zip(needs, needs[1:])), "each step needs less"
    for i, (proto, need) in enumerate(needs):
        free = int(need / 0.9) + (1 << 20)  # just enough for step i (10% allocator headroom)
        p = plan(s, PROTO, "cpu", None, free)
        assert p.fits and len(p.reductions) <= len(proto.reductions(PROTO)), (i, p.protocol)
        assert p.reductions == p.protocol.reductions(PROTO)
        fewer = [q for q in lighter_lattice(PROTO) if plan_for(s, q, "cpu", "host", None, free)
                 .fits and len(q.reductions(PROTO)) < len(p.reductions)]
        assert not fewer, (i, p.protocol, fewer[:1])
        assert plan(s, PROTO, "cpu", None, free, adapt=False).fits == (i == 0)
        assert (not p.reductions) == (i == 0)


def test_a_step_that_frees_nothing_short_is_not_taken():
    # float64 references and the landing buffers live on the host side (host transfer): a
    # short device skips those steps
    from dataclasses import replace

    from assay.verify.memory import plan_for

    s = _shapes(GiB, GiB)
    needs = _ladder_needs(s, "cuda")
    assert needs[1][1] == needs[0][1] and needs[2][1] >= needs[1][1]
    fewer = plan_for(s, replace(PROTO, timing_sets=2), "cuda", "host", None, None)
    assert fewer.device_need_b < needs[0][1]
    p = plan(s, PROTO, "cuda", int(fewer.device_need_b / 0.9) + (1 << 20), 1000 * GiB)
    assert p.fits and p.protocol == replace(PROTO, timing_sets=2)
    assert list(p.reductions) == ["timing"]


def test_the_host_placement_comes_before_any_lighter_protocol():
    s = _shapes(2 * GiB, 2 * GiB)
    on_dev = plan(s, PROTO, "cuda", 1000 * GiB, 1000 * GiB)
    assert on_dev.placement == "device" and not on_dev.reductions
    # a device short of the recomputed references' need too (its usable part is 90%)
    short = plan_for(s, PROTO, "cuda", "recompute", None, None).device_need_b
    p = plan(s, PROTO, "cuda", short, 1000 * GiB)
    assert p.fits and p.placement == "host" and not p.reductions


def test_too_large_only_after_the_lightest_protocol_and_says_so():
    s = _shapes(8 * GiB, 8 * GiB)
    lightest = _ladder_needs(s, "cpu")[-1][1]
    p = plan(s, PROTO, "cpu", None, int(lightest * 0.8))
    assert not p.fits and p.protocol.check_sets == 2 and "swap" in p.reductions
    assert "even with the lightest protocol" in p.too_large_detail()


def test_lighter_correctness_sets_keep_the_kinds_of_data():
    from assay.verify.memory import check_distributions

    assert check_distributions(["native", "native", "large"], 2) == ["native", "large"]
    assert check_distributions(["native", "large", "small"], 2) == ["native", "large"]
    assert check_distributions(["native", "native", "large"], 3) == ["native", "native", "large"]


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem, box, steps, placement", [
    # the configured protocol fits an 80 GB H100, nothing lighter, its references recomputed
    ("42_Max_Pooling_2D", (79, 120), set(), "recompute"),
    # 4 GiB of output per set, 16 MiB of inputs: the full protocol, the references recomputed
    ("7_Matmul_with_small_K_dimension_", (79, 120), set(), "recompute"),
    # 6 GiB per input and output: an H200 holds the sets with one timing buffer fewer and the
    # references recomputed; an H100 keeps the references on the host, one landing buffer
    # and the lightest sets (float64 references kept for every set: four steps where the
    # greedy ladder took all five)
    ("24_LogSoftmax", (139, 120), {"timing"}, "recompute"),
    ("24_LogSoftmax", (79, 120), {"landing", "timing", "swap", "check"}, "host"),
])
def test_kernelbench_tasks_on_h100_and_h200_numbers(stem, box, steps, placement):
    s = task_shapes(Task.from_file(KERNELBENCH / "level1" / f"{stem}.py").module())
    p = plan(s, PROTO, "cuda", box[0] * GiB, box[1] * GiB)
    assert p.fits, p.too_large_detail()
    assert set(p.reductions) == steps and p.placement == placement, (p.placement, p.reductions)


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem, box, transfer", [
    # small tensors: every transfer fits the whole protocol (a tie keeps the config's draw)
    ("42_Max_Pooling_2D", (139, 120), "draw"),
    # 6 GiB per input and output on an 80 GB card: no set held by either side (draw) keeps
    # every set where copies through the GPU or the host would lose checks
    ("24_LogSoftmax", (79, 120), "draw"),
    # 7 GiB norms on an H200: drawn, the sets the worker draws at once cost a check the
    # host arena (harness sets on the host) keeps
    ("38_L1Norm_", (139, 120), "host"),
])
def test_plan_transfers_takes_the_lighter_path(stem, box, transfer):
    from assay.verify.memory import plan_transfers

    s = task_shapes(Task.from_file(KERNELBENCH / "level1" / f"{stem}.py").module())
    cfg = VerifyConfig()
    assert cfg.transfer == "draw"
    p = plan_transfers(s, cfg, "cuda:0", box[0] * GiB, box[1] * GiB)
    every = [plan(s, Protocol.of(VerifyConfig(transfer=t)), "cuda", box[0] * GiB, box[1] * GiB)
             for t in ("draw", "cuda_ipc", "host")]
    assert p.fits and p.protocol.transfer == transfer, [(b.fits, b.reductions) for b in every]
    assert len(p.reductions) == min(len(b.reductions) for b in every if b.fits)
    # a transfer excluded (a task whose sets draw differently twice) is never taken
    assert plan_transfers(s, cfg, "cuda:0", box[0] * GiB, box[1] * GiB,
                          exclude=("draw",)).protocol.transfer != "draw"
    # the cpu target: one memory; drawn sets are held by neither side, so the plan needs
    # less of it than the shared-memory arena of every set
    on_cpu = plan_transfers(s, cfg, "cpu", None, 400 * GiB)
    assert on_cpu.protocol.transfer == "draw"
    drawn, host = (plan(s, Protocol.of(VerifyConfig(transfer=t)), "cpu", None, 400 * GiB,
                        adapt=False) for t in ("draw", "host"))
    assert drawn.host_need_b < host.host_need_b


def test_a_few_rounding_outliers_pass_in_a_large_output_and_never_many_or_in_a_small_one():
    """Cancellation leaves a float32 ulp of the output's largest values on a small one (x + bias
    near zero, then a nonlinearity): at most outlier_fraction of a large output may be off
    both bounds by no more than that rounding (KernelBench's L2_93 on an H200: 4 of 277 M)."""
    import torch

    from assay.verify.compare import compare_tensor, reference_stats
    from assay.verify.settings import VerifyConfig

    cfg = VerifyConfig()
    g = torch.Generator().manual_seed(0)
    r64 = torch.rand(3_000_000, generator=g, dtype=torch.float64) * 1e-3
    r64[500::100_000] = 1.0  # a few large values set the scale of the rounding
    r64[::1000] = 2e-4    # small values where that rounding is far out of rtol and atol
    ref = r64.float()
    stats = reference_stats(ref, r64)
    ulp = 2.0 ** -23  # two ulps at 0.5-1: rounding at the output's top scale

    def with_off(k: int, err: float, n: int = 3_000_000) -> bool:
        v = ref[:n].clone()
        v[:k * 1000:1000] += err
        st = stats if n == 3_000_000 else reference_stats(ref[:n], r64[:n])
        return compare_tensor(v, ref[:n], r64[:n], st, cfg).ok

    assert with_off(3, ulp)                  # 3 of 3 M: rounding, passes
    cfg.outlier_fraction = 0.0
    assert not with_off(3, ulp)              # ... and only as outliers
    cfg.outlier_fraction = VerifyConfig().outlier_fraction
    assert not with_off(3, 1e-3)             # as few, but far beyond rounding: wrong
    assert not with_off(30, ulp)             # over 1e-6 of the elements: not rounding
    assert not with_off(1, ulp, n=500_000)   # under a million elements: no outlier at all


def test_rounding_outliers_of_an_ill_conditioned_output_scale_with_the_references_worst():
    """Softmax over large scores (KernelBench's SDPA on inputs up to 8) is ill-conditioned at
    near-ties: the fp32 reference is itself ~1e-3 off float64 there, and an honest kernel summing
    in another order is as far off at other near-ties (an H100: 92 of 537 M elements, 2.8e-3).
    Such outliers pass at the reference's own worst error (times the rounding slack), with or
    without a float64 reference for the set; far beyond it, or more than outlier_fraction of
    the elements, they do not; and where the reference has no such error, neither may they."""
    import torch

    from assay.verify.compare import compare_tensor, reference_stats
    from assay.verify.reference import borrowed_error
    from assay.verify.settings import VerifyConfig

    cfg = VerifyConfig()
    g = torch.Generator().manual_seed(1)
    r64 = torch.rand(6_000_000, generator=g, dtype=torch.float64) * 4
    exact = r64.float()
    ref = exact.clone()
    ref[7::3_000_000] += 2e-3   # the reference's own error at its near-ties (without r64 they
    # are outliers too: up to 6 in all may pass)
    stats, calm = reference_stats(ref, r64), reference_stats(exact, r64)
    borrowed = {**reference_stats(ref, None)}
    borrowed.update(borrowed_error([stats], borrowed["rms"], borrowed["max"]))
    assert stats["err_max"] == pytest.approx(2e-3, rel=1e-3) and "err_max_est" in borrowed

    def candidate(k: int, err: float) -> torch.Tensor:
        v = exact.clone()
        v[11:11 + k * 1000:1000] -= err  # other elements than the reference's
        return v

    assert compare_tensor(candidate(2, 2.8e-3), ref, r64, stats, cfg).ok
    assert compare_tensor(candidate(2, 2.8e-3), ref, None, borrowed, cfg).ok
    assert not compare_tensor(candidate(2, 0.1), ref, r64, stats, cfg).ok
    assert not compare_tensor(candidate(2, 0.1), ref, None, borrowed, cfg).ok
    assert not compare_tensor(candidate(30, 2.8e-3), ref, r64, stats, cfg).ok
    assert not compare_tensor(candidate(30, 2.8e-3), ref, None, borrowed, cfg).ok
    assert not compare_tensor(candidate(2, 2.8e-3), exact, r64, calm, cfg).ok


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
def test_on_cuda_with_a_host_arena_the_workers_sets_stay_on_the_host():
    """memory.sets_stay_on_host (the worker asks it too): with ``transfer: host`` the worker's
    device holds its calls' inputs (and one set's copy for the pristine check), not every set
    besides; with cuda_ipc
    it keeps its own device copies. KernelBench's GroupNorm (7 GiB per input) was too_large on
    an H100 (97.5 GiB with cuda_ipc, 69.5 with the sets on the device); it now fits there."""
    s = task_shapes(Task.from_file(KERNELBENCH / "level1" / "35_GroupNorm_.py").module())
    host, ipc = (Protocol.of(VerifyConfig(transfer=t)) for t in ("host", "cuda_ipc"))
    w_host = plan_for(s, host, "cuda", "host", None, None).parts["worker"]
    w_ipc = plan_for(s, ipc, "cuda", "host", None, None).parts["worker"]
    assert w_ipc - w_host >= (host.sets - 1 - host.timing_sets) * s.inputs_b
    p = plan(s, host, "cuda", int(76.5 * GiB), 120 * GiB)
    assert p.fits, p.too_large_detail()
    # on the cpu target the one memory holds everything alike: nothing changes there
    cpu = [plan_for(s, q, "cpu", "host", None, None).parts["worker"] for q in (host, ipc)]
    assert cpu[0] == cpu[1]


def test_runs_sharing_the_host_plan_with_their_part_of_it(monkeypatch):
    """ASSAY_HOST_SHARE=N (one self-check shard per GPU): each plans with 1/N of the host."""
    from assay.verify.memory import free_memory

    monkeypatch.delenv("ASSAY_HOST_SHARE", raising=False)
    whole = free_memory("cpu")[1]
    monkeypatch.setenv("ASSAY_HOST_SHARE", "4")
    part = free_memory("cpu")[1]
    assert whole and part and abs(part * 4 - whole) < whole * 0.2  # (the host moves a little)


def test_a_workers_own_copy_is_fresh_and_a_strided_input_keeps_its_strides_on_the_host():
    """worker.fresh never hands back the arena's own tensor; host_view keeps a dense input a
    view of the arena (no copy) and gives a strided one a host copy with its strides."""
    import torch

    from assay.verify.arenas import Layout, arena_view
    from assay.verify.worker import fresh, host_view, moved

    t = torch.randn(5, 7)
    assert moved(t, "cpu") is t and fresh(t, "cpu") is not t and torch.equal(fresh(t, "cpu"), t)
    layout = Layout("in")
    dense = {"tensor": layout.add((5, 7), torch.float32)}
    strided = {"tensor": layout.add((7, 5), torch.float32, (1, 7))}
    buf = torch.zeros(layout.size, dtype=torch.uint8)
    arena_view(buf, dense["tensor"]).copy_(t)
    arena_view(buf, strided["tensor"]).copy_(t.t())
    arenas = {"in": buf}
    v = host_view(arenas, dense)
    assert torch.equal(v, t) and v.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    s = host_view(arenas, strided)
    assert s.stride() == (1, 7) and torch.equal(s, t.t())
    assert host_view(arenas, {"value": 3}) == 3


def test_what_a_killed_harness_left_is_swept_before_the_next_scratch(tmp_path, monkeypatch):
    """A verification killed at its time limit leaves its scratch folder (the landing arena:
    gigabytes at KernelBench's sizes) behind; choosing where the next one goes removes every
    such folder whose harness is gone, and nothing of a live one."""
    import subprocess
    import tempfile

    from assay.verify.arenas import shm_dir

    gone = subprocess.Popen(["true"])
    gone.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"assay-verify-{gone.pid}-abc"
    live = tmp_path / f"assay-verify-{os.getppid()}-abc"
    other = tmp_path / "unrelated-123-4-5"
    for d in (dead, live, other):
        d.mkdir()
        (d / "landing-arena").write_bytes(b"x" * 10)
    shm_dir(1)
    assert not dead.exists() and live.exists() and other.exists()


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
def test_file_arenas_are_planned_against_the_room_they_go_to():
    """Available memory is not room for file arenas: KernelBench's L1_87 (8 GB outputs) took
    the host path on an H200, whose 72 GB landing arena found no room in /dev/shm and filled
    the 64 GB disk (a SIGBUS in the worker). With the file systems' room given, the plan keeps
    the host path's arenas within it, takes another path, or says too_large with both numbers."""
    from assay.verify.memory import plan_transfers

    s = task_shapes(Task.from_file(KERNELBENCH / "level1" / "87_conv_pointwise_2D.py").module())
    cfg = VerifyConfig(transfer="host")
    # (drawn, its references recomputed, it needs no file arena at all: the test below)
    files = ("draw", "cuda_ipc")
    roomy = plan_transfers(s, cfg, "cuda:0", 139 * GiB, 110 * GiB, files, 400 * GiB)
    assert roomy.fits and roomy.protocol.transfer == "host" and roomy.arena_need_b > 30 * GiB
    room = roomy.arena_need_b  # (90% of it usable)
    tight = plan_transfers(s, cfg, "cuda:0", 139 * GiB, 110 * GiB, files, room)
    assert tight.fits and tight.arena_need_b <= 0.9 * room, (tight.protocol, tight.reductions)
    # on the cpu target every arena is a file: no room for the lightest is too_large
    none = plan(s, Protocol.of(cfg), "cpu", None, 400 * GiB, arena_free_b=1 * GiB)
    assert not none.fits and "of file arenas where shared memory or the temp folder has 1.0 " \
        "GiB" in none.too_large_detail()


def test_arena_room_is_what_shm_dir_would_give(monkeypatch):
    """shm_dir puts an arena in shared memory only with room twice over, so the plan counts
    half of it: planned whole, an H200 self-check's 80 GiB landing arena (100 GiB of /dev/shm
    in the plan) went to a 64 GiB temp folder, and KernelBench's L1_87 was called too large."""
    from assay.verify import arenas

    shm, tmp = arenas.arena_folders()
    margin = 256 << 20
    for rooms, want in [({shm: 100 * GiB, tmp: 64 * GiB}, 64 * GiB),
                        ({shm: 200 * GiB, tmp: 64 * GiB}, 100 * GiB - margin // 2),
                        ({shm: None, tmp: 64 * GiB}, 64 * GiB),
                        ({shm: 100 * GiB, tmp: None}, 50 * GiB - margin // 2),
                        ({shm: None, tmp: None}, None)]:
        monkeypatch.setattr(arenas, "_room", rooms.get)
        assert arenas.folder_room() == want, rooms
        if want is not None and rooms[shm] is not None:
            # an arena of the planned room's size goes to shared memory exactly where that room
            # is shared memory's, and one byte more never does
            in_shm = rooms[shm] // 2 > (rooms[tmp] or 0)
            assert (arenas.shm_dir(want) == shm) == in_shm, rooms
            assert arenas.shm_dir(want + 1) == tmp, rooms


def test_where_the_float32_reference_overflows_the_float64_value_is_expected():
    """KernelBench's L1_90 cumprod on the ``large`` data: torch's float32 running product
    overflows after ~80 elements, and a zero after that makes 0 x inf = NaN, where float64 has
    finite values (0 after the zero). A kernel that multiplies in float64 and stores float32
    (the synthesizer's, rejected on an H200 for "NaN mismatches") matches float64 and passes; so
    does the float32 reference itself (the self-check). Wrong values still fail: an infinity
    that is neither the reference's NaN nor float64's 0, a finite value where float64 is beyond
    float32's range, a NaN where both have a value; and an infinity both references share (a
    masked -inf) is still required. (A finite value at the NaN is judged by the usual bounds,
    relative to an output whose RMS is float32's largest values here.)"""
    import torch

    from assay.verify.compare import compare_tensor, reference_stats

    cfg = VerifyConfig()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 2048, generator=g) * 8
    x[:, 300] = 0.0  # after float32's overflow (~80), before float64's (~650)
    # a float32 running product as CUDA's cumprod keeps it (the CPU's accumulates in double)
    ref, acc = torch.empty_like(x), torch.ones(8)
    for j in range(x.shape[1]):
        acc = acc * x[:, j]
        ref[:, j] = acc
    r64 = torch.cumprod(x.double(), 1)
    assert ref.isnan().any() and not r64.isnan().any()  # 0 x inf in float32 alone
    stats = reference_stats(ref, r64)

    def passes(v):
        return compare_tensor(v, ref, r64, stats, cfg, 2048).ok

    in_float64 = r64.float()  # inf beyond float32's range, 0 after the zero
    assert passes(in_float64) and passes(ref.clone())
    assert ref[0, 400].isnan() and r64[0, 400] == 0
    neither = in_float64.clone()
    neither[0, 400] = float("inf")  # neither the reference's NaN nor float64's 0
    assert not passes(neither)
    finite_for_overflow = in_float64.clone()
    finite_for_overflow[0, 200] = 1.0  # float64: beyond float32's range there
    assert not torch.isfinite(r64[0, 200].float()) and not passes(finite_for_overflow)
    unwritten = in_float64.clone()
    unwritten[1, 10] = float("nan")  # where both references have a value
    assert not passes(unwritten)

    # a zero past float64's own overflow (~650) and none before: both references have
    # inf x 0 = NaN from there on, the exact product is 0 (a block scan whose partial products
    # were still finite wrote it); with the float32 reference overflowed in this output no
    # reference holds the exact value, so any value passes there, and nothing else changes
    x[:, 300] = 1.0
    x[:, 1500] = 0.0
    past, acc = torch.empty_like(x), torch.ones(8)
    for j in range(x.shape[1]):
        acc = acc * x[:, j]
        past[:, j] = acc
    past64 = torch.cumprod(x.double(), 1)
    assert past64[:, 1600].isnan().all() and past[:, 1600].isnan().all()
    st = reference_stats(past, past64)
    assert st["lost"] > 0
    exact = past64.float()
    exact[:, 1500:] = 0.0
    assert compare_tensor(exact, past, past64, st, cfg, 2048).ok
    assert compare_tensor(past.clone(), past, past64, st, cfg, 2048).ok
    wrong = exact.clone()
    wrong[0, 200] = 5.0  # float64 beyond float32's range there: inf expected
    assert not compare_tensor(wrong, past, past64, st, cfg, 2048).ok
    unwritten = exact.clone()
    unwritten[2, 20] = float("nan")
    assert not compare_tensor(unwritten, past, past64, st, cfg, 2048).ok

    masked = torch.randn(4096, generator=g, dtype=torch.float64)
    masked[::7] = float("-inf")  # a masked -inf: both references have it
    mref = masked.float()
    mstats = reference_stats(mref, masked)
    assert compare_tensor(mref.clone(), mref, masked, mstats, cfg).ok
    unmasked = mref.clone()
    unmasked[::7] = -1e30
    assert not compare_tensor(unmasked, mref, masked, mstats, cfg).ok
    # a NaN both references share where the task-dtype one lost nothing to its range (a NaN
    # the task defines) is still required
    masked[1::7] = float("nan")
    mref = masked.float()
    mstats = reference_stats(mref, masked)
    assert mstats["lost"] == 0 and compare_tensor(mref.clone(), mref, masked, mstats, cfg).ok
    filled = mref.clone()
    filled[1::7] = 0.0
    assert not compare_tensor(filled, mref, masked, mstats, cfg).ok


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
def test_a_large_output_has_its_references_recomputed_rather_than_moved_through_the_host():
    """KernelBench's L1_87 (4 GiB in, 8 GiB out) on the DAG's H200 (131 GiB free, 80 GiB of host
    memory): its references were kept on the host with five protocol steps taken, and every
    verified call's comparison moved them back through a pinned stage, ~10 s a call (109 s of
    preparation, 133 s of comparison for one candidate), where its two forwards take 3.7 and
    9.5 ms (benchmarks/probe_reference.py). Counted once each (a set made again from its drawn
    inputs, the degeneracy test's two sets in preparation only), recomputing fits with one
    step."""
    from assay.app import compose
    from assay.verify.config import from_cfg
    from assay.verify.memory import plan_transfers

    s = task_shapes(Task.from_file(KERNELBENCH / "level1" / "87_conv_pointwise_2D.py").module())
    p = plan_transfers(s, from_cfg(compose(["target=cuda"]).verify), "cuda:0", int(131.17 * GiB),
                       80 * GiB, arena_free_b=400 * GiB)
    assert p.fits and p.placement == "recompute" and p.protocol.transfer == "draw"
    assert list(p.reductions) == ["landing"], p.reductions
    # the comparison while the worker waits (one landing) counts one set made again (and
    # the landing output brought to the device whole)
    one_set = s.inputs_b + s.outputs_b + s.params64_b + s.inputs64_b + s.forward64_peak_b
    assert p.parts["comparison transient"] == one_set + s.outputs_b
    assert p.parts["preparation transient"] == s.outputs_b + s.outputs64_b + one_set


def test_the_degeneracy_test_makes_each_recomputed_set_once():
    """Under ``recompute`` the degeneracy test takes the first correctness set's references in
    both precisions once: asked for in turn with another set's, each request made a set again
    (L1_87: two forwards and a draw of 4 GiB each time)."""
    import torch

    from assay.verify.compare import reference_stats
    from assay.verify.reference import Recomputed, _degenerate
    from assay.verify.settings import VerifyConfig

    made = []
    sets = [[torch.randn(256, generator=torch.Generator().manual_seed(i))] for i in range(3)]

    def run_ref(xs):  # a degenerate task: the test compares every set's with the first's
        made.append(xs[0][0].item())
        return [torch.ones(256)]

    def run_ref64(xs, want):
        return [torch.ones(256, dtype=torch.float64)]

    rec = Recomputed(run_ref, run_ref64, sets, {0, 1, 2})
    refs, refs64 = rec.view(0), rec.view(1)
    stats = [[reference_stats(refs[i][0], refs64[i][0])] for i in range(3)]
    made.clear()
    assert _degenerate(refs, refs64, stats, ["native"] * 3, [0, 1, 2], VerifyConfig(), "cpu")
    assert sorted(made) == sorted(s[0][0].item() for s in sets)  # each set made once
