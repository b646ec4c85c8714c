"""The timing protocol's statistics (assay.bench.timing): samples that average short calls;
baselines timed again while noisy (assay.bench.baseline.steady)."""

from __future__ import annotations

import dataclasses
import random
import statistics
import time

import pytest
import torch

from assay.bench import timing
from assay.bench.baseline import RETRIES, steady
from assay.bench.timing import Timing


def test_short_calls_are_averaged_into_samples_of_at_least_the_minimum():
    calls = [0.05] * 200  # 50 us calls: four of them make a 0.2 ms sample
    assert timing.group_size(calls) == 4
    assert timing.group_size([0.5] * 200) == 1  # long calls: one call a sample
    assert timing.group_size([0.001] * 200) == timing.MAX_GROUP
    # Never so few samples that the IQR means nothing.
    assert timing.group_size([0.05] * 20) == 20 // timing.MIN_SAMPLES


def test_averaging_narrows_the_spread_and_keeps_the_centre():
    rng = random.Random(0)
    calls = [0.064 + rng.gauss(0, 0.001) for _ in range(400)]
    single = timing.summarize(calls, 1)
    grouped = timing.summarize(calls, timing.group_size(calls))
    assert grouped.group == 4 and grouped.runs == 400 and len(grouped.samples_ms) == 100
    # The mean of four independent calls spreads half as much (1/sqrt(4)), within sampling.
    assert 0.35 < grouped.iqr_ms / single.iqr_ms < 0.7
    assert abs(grouped.median_ms - statistics.median(calls)) < 0.0005
    assert grouped.call_iqr_ms == single.iqr_ms  # the single-call spread is still reported
    assert grouped.to_dict()["group"] == 4


def test_samples_follow_call_order_and_drop_a_partial_group():
    t = timing.summarize([1.0, 1.0, 3.0, 3.0, 5.0], 2)
    assert t.samples_ms == [1.0, 3.0] and t.runs == 5


def test_time_calls_on_cpu_reports_its_grouping():
    cfg = timing.TimingConfig(warmup_s=0.0, min_runs=40, max_runs=40, budget_s=0.0)
    cpu = torch.device("cpu")
    # A call of microseconds: as many calls a sample as still leave eight samples.
    t = timing.time_calls(lambda i: None, cpu, cfg)
    assert t.runs == 40 * t.rounds and 2 <= t.rounds <= timing.CPU_MAX_ROUNDS
    assert t.group == 40 // timing.MIN_SAMPLES
    assert len(t.samples_ms) == timing.MIN_SAMPLES and 0 < t.host_ms < 1  # the call's own time
    # A call of 2 ms already covers a sample on its own.
    t = timing.time_calls(lambda i: time.sleep(0.002), cpu,
                          dataclasses.replace(cfg, min_runs=10, max_runs=10))
    assert t.group == 1 and len(t.samples_ms) == 10 and t.median_ms >= 2.0 and t.host_ms >= 2.0


def _clocked(monkeypatch, durations_ms):
    """A call whose duration is the next of ``durations_ms``, on a fake clock it advances."""
    now, left = [0.0], iter(durations_ms)
    monkeypatch.setattr(timing, "_perf_counter", lambda: now[0])

    def call(i: int) -> None:
        now[0] += next(left) / 1e3
    return call


def test_a_burst_of_cpu_interference_costs_a_round_not_the_timing(monkeypatch):
    cfg = timing.TimingConfig(warmup_s=0.0, min_runs=10, max_runs=20, budget_s=0.0,
                              flush_cache=False)
    seen = []
    # Two warm-up calls, a first round slowed throughout, then two rounds that agree.
    call = _clocked(monkeypatch, [1.0] * 2 + [3.0] * 10 + [1.0] * 10 + [1.01] * 10)
    t = timing.time_calls(call, torch.device("cpu"), cfg, before_call=seen.append)
    assert (round(t.median_ms, 9), t.rounds, t.runs) == (1.0, 3, 30)
    assert seen == list(range(30))  # one sequence of timed calls across the rounds


def test_a_cpu_timing_is_recomputed_from_the_per_call_times_it_carries(monkeypatch):
    """The verifier recomputes a cpu report's timing (verify/observer.timing_disagreement): the
    timing loop's result is cpu_timing of its calls, round by round, in call order."""
    cfg = timing.TimingConfig(warmup_s=0.0, min_runs=10, max_runs=20, budget_s=0.0,
                              flush_cache=False)
    timed = [3.0] * 10 + [1.0 + 0.01 * (i % 3) for i in range(10)] + [1.02] * 10
    t = timing.time_calls(_clocked(monkeypatch, [1.0] * 2 + timed), torch.device("cpu"), cfg)
    d = t.to_dict()
    assert d["round_sizes"] == [10, 10, 10] and d["calls_ms"] == pytest.approx(timed)
    again = timing.cpu_timing([d["calls_ms"][:10], d["calls_ms"][10:20], d["calls_ms"][20:]])
    assert again.to_dict() == d


def test_cpu_rounds_are_bounded_and_keep_the_fastest(monkeypatch):
    cfg = timing.TimingConfig(warmup_s=0.0, min_runs=10, max_runs=20, budget_s=0.0,
                              flush_cache=False)
    per_round = [2.0, 1.5, 1.2, 1.4, 1.7, 1.0]  # no two within CPU_AGREE
    call = _clocked(monkeypatch, [1.0] * 2 + [ms for ms in per_round for _ in range(10)])
    t = timing.time_calls(call, torch.device("cpu"), cfg)
    assert (round(t.median_ms, 9), t.rounds) == (min(per_round[:timing.CPU_MAX_ROUNDS]),
                                                 timing.CPU_MAX_ROUNDS)
    assert t.runs == 10 * timing.CPU_MAX_ROUNDS
    near, far = (dataclasses.replace(t, median_ms=1.2 * (1 + f * timing.CPU_AGREE))
                 for f in (0.9, 1.1))
    assert timing.confirmed([t, near]) and not timing.confirmed([t, far])


def test_the_hold_covers_the_enqueue_time_within_bounds():
    assert timing.hold_for([]) == timing.HOLD_MIN_US
    assert timing.hold_for([40e-6] * 10) == 60.0  # 1.5x a 40 us enqueue
    assert timing.hold_for([1e-6] * 10) == timing.HOLD_MIN_US
    assert timing.hold_for([0.1] * 10) == timing.HOLD_MAX_US  # a host-bound call is not hidden
    # The slowest tenth decides: a jittery host gets a longer hold.
    assert timing.hold_for([40e-6] * 8 + [100e-6] * 2) == 150.0


def _timing(median: float, iqr: float) -> Timing:
    return Timing(median_ms=median, iqr_ms=iqr, runs=10)


def test_a_noisy_baseline_is_timed_again_and_the_steadiest_kept():
    runs = iter([_timing(0.181, 0.136), _timing(0.127, 0.001), _timing(9.0, 0.0)])
    best, taken = steady(lambda: next(runs))
    assert (best.median_ms, taken) == (0.127, 2)  # stops at the first steady run


def test_a_steady_baseline_is_timed_once_and_retries_are_bounded():
    calls = []

    def once() -> Timing:
        calls.append(1)
        return _timing(1.0, 0.05)

    assert steady(once) == (_timing(1.0, 0.05), 1) and len(calls) == 1
    noisy = iter([_timing(1.0, 0.5), _timing(2.0, 0.6), _timing(1.0, 0.4), _timing(1.0, 0.0)])
    best, taken = steady(lambda: next(noisy))
    assert taken == 1 + RETRIES and best.iqr_ms == 0.6  # 0.6 / 2.0 is steadier than 0.5 / 1.0


def test_the_baseline_compiles_before_its_hold_and_times_only_inside_it(monkeypatch):
    """The baseline step's CPU lease covers the timings alone: torch.compile's compile (seconds
    of C++ builds on the cpu target) runs before it, beside another step's timing."""
    from assay.bench import baseline
    from assay.resources import resolve_data
    from assay.tasks.model import Task

    events: list[str] = []
    held = [False]

    class Hold:
        def __enter__(self):
            held[0] = True
            events.append("hold")

        def __exit__(self, *exc):
            held[0] = False
            events.append("release")

    def fake_compile(model, mode="default"):
        def compiled(*xs):
            events.append("compiled call, held" if held[0] else "compiled call")
            return model(*xs)
        events.append("compile, held" if held[0] else "compile")
        return compiled

    def fake_time_calls(fn, device, cfg):
        events.append("time" if held[0] else "time, not held")
        return Timing(median_ms=1.0, iqr_ms=0.0, runs=10)

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(baseline, "time_calls", fake_time_calls)
    task = Task.from_file(resolve_data("data/tasks") / "level1" / "1_ReLU.py", size="small")
    out = baseline.time_reference(task, "cpu", timing.TimingConfig(), hold=Hold)
    assert out["eager_ms"] == out["compile_ms"] == 1.0
    assert events[:5] == ["compile"] + ["compiled call"] * 3 + ["hold"], events
    assert events[-1] == "release" and "time, not held" not in events, events


def test_eager_under_default_numerics_is_timed_only_where_they_differ(monkeypatch):
    """time_default_numerics: cuDNN's modules (convolutions, transposed ones, recurrent
    layers) run in TF32 under PyTorch's default numerics, nothing else does; on the cpu target
    the numerics are the same, so time_reference records None and times nothing more."""
    from torch import nn

    from assay.bench import baseline
    from assay.resources import resolve_data
    from assay.tasks.model import Task

    assert baseline.runs_cudnn(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()))
    assert baseline.runs_cudnn(nn.Sequential(nn.Linear(2, 2), nn.ConvTranspose1d(2, 2, 2)))
    assert baseline.runs_cudnn(nn.GRU(4, 4))
    assert not baseline.runs_cudnn(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    conv = nn.Conv1d(2, 2, 3)
    x = [[torch.randn(1, 2, 8)]]
    assert baseline.time_default_numerics(conv, x, torch.device("cpu"), timing.TimingConfig()) \
        is None
    calls = []
    monkeypatch.setattr(baseline, "time_calls", lambda fn, dev, cfg: calls.append(1) or
                        timing.Timing(median_ms=1.0, iqr_ms=0.0, runs=10))
    task = Task.from_file(resolve_data("data/tasks") / "level1" / "1_ReLU.py", size="small")
    out = baseline.time_reference(task, "cpu", timing.TimingConfig(), compile_=False)
    assert out["eager_default_ms"] is None and len(calls) == 2  # eager, and eager again
    assert not torch.backends.cudnn.allow_tf32  # the verifier's numerics are back


def test_torch_compile_under_default_numerics_times_the_compiled_call(monkeypatch):
    """compile_default_ms: what ``run`` (torch.compile's wrapper) takes with cuDNN in TF32,
    KernelBench's published numerics; the verifier's true fp32 is back afterwards, also when
    the timing fails."""
    from torch import nn

    from assay.bench import baseline

    seen = []

    def fake_time_calls(fn, dev, cfg):
        fn(0)
        return timing.Timing(median_ms=2.0, iqr_ms=0.0, runs=10)

    monkeypatch.setattr(baseline, "time_calls", fake_time_calls)
    conv, sets = nn.Conv1d(2, 2, 3), [[torch.randn(1, 2, 8)]]
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # the verifier's numerics (set_fp32_numerics)
    try:
        def run(*args):
            seen.append(torch.backends.cudnn.allow_tf32)

        assert baseline.time_default_numerics(conv, sets, torch.device("cuda"),
                                              timing.TimingConfig(), run=run) == 2.0
        assert seen == [True] and not torch.backends.cudnn.allow_tf32

        def out_of_memory(*a):
            raise RuntimeError("CUDA out of memory")

        assert baseline.time_default_numerics(conv, sets, torch.device("cuda"),
                                              timing.TimingConfig(), run=out_of_memory) is None
        assert not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32 = before
