"""Issue 19: what is audited is what is timed.

The worker's CallAudit profiles every call from before the candidate loads; attribute_calls
gives each call its ATen ops and device kernels; policy.audit_consistency refuses a trace that
lost calls and timed calls that ran different code. The zoo holds the tricks (tests/zoo/
candidates/*cheat*, exploit_stop_the_profiler); here the pieces, on synthetic traces (the cuda
attribution included) and on the real profiler.
"""

from __future__ import annotations

import threading

import pytest
import torch

from assay.verify.policy import audit_consistency, call_signature
from assay.verify import harness
from assay.records import Verdict
from assay.verify.worker import (CALL_RANGE, CallAudit, attribute_calls, attribute_trace,
                                 merge_rows)
from test_zoo import CASES, GENEROUS_PEAKS, prepared, record, zoo_config, zoo_task


def ev(name, start, end, thread=1, corr=0, linked=0, act="cpu_op", cpu=True):
    return {"name": name, "cpu": cpu, "start": start, "end": end, "thread": thread,
            "corr": corr, "linked": linked, "act": act}


def names(rows):
    return sorted(r["name"] for r in rows)


def test_cpu_ops_go_to_the_call_that_ran_them():
    events = [
        ev(CALL_RANGE, 100, 200, corr=1),
        ev("aten::empty_like", 110, 120, corr=2),
        ev("aten::gelu", 130, 190, corr=3),
        ev("aten::empty", 140, 150, corr=4),        # nested in gelu: taken out of its self time
        ev("aten::mm", 150, 180, thread=2, corr=5),  # the candidate's own thread
        ev("aten::mul", 210, 230, corr=6),           # the harness between calls
        ev(CALL_RANGE, 300, 400, corr=7),
        ev(CALL_RANGE, 310, 320, corr=8),            # a range of the candidate's: not a call
        ev("aten::empty_like", 330, 340, corr=9),
    ]
    calls = attribute_calls(events, cuda=False)
    assert len(calls) == 2
    assert names(calls[0]) == ["aten::empty", "aten::empty_like", "aten::gelu", "aten::mm"]
    gelu = next(r for r in calls[0] if r["name"] == "aten::gelu")
    assert gelu["cpu_us"] == pytest.approx(0.05)  # 60 ns less the 10 ns of aten::empty
    assert names(calls[1]) == ["aten::empty_like"]
    assert call_signature(calls[0], "cpu") == ("aten::gelu", "aten::mm")
    assert call_signature(calls[1], "cpu") == ()


def test_cuda_kernels_go_to_the_call_that_launched_them():
    events = [
        ev("cudaLaunchKernel", 50, 60, corr=900, act="cuda_runtime"),   # the timer's spin
        ev(CALL_RANGE, 100, 200, corr=1),
        ev("cudaLaunchKernel", 110, 120, corr=901, linked=1, act="cuda_runtime"),
        ev("aten::add", 130, 160, corr=2),
        ev("cudaLaunchKernel", 140, 150, corr=902, linked=2, act="cuda_runtime"),
        ev("cudaLaunchKernel", 170, 180, thread=3, corr=903, act="cuda_runtime"),  # side thread
        ev(CALL_RANGE, 300, 400, corr=3),
        ev("spin", 55, 90, corr=900, act="kernel", cpu=False),
        ev("gelu_kernel", 210, 260, corr=901, linked=1, act="kernel", cpu=False),
        ev("vectorized_elementwise_kernel<add>", 260, 270, corr=902, linked=2, act="kernel",
           cpu=False),
        ev("side_kernel", 270, 290, corr=903, act="kernel", cpu=False),
        ev("linked_only", 310, 320, corr=777, linked=3, act="kernel", cpu=False),
    ]
    calls = attribute_calls(events, cuda=True)
    assert names(calls[0]) == ["aten::add", "gelu_kernel", "side_kernel",
                               "vectorized_elementwise_kernel<add>"]
    assert names(calls[1]) == ["linked_only"]
    gelu = next(r for r in calls[0] if r["name"] == "gelu_kernel")
    assert gelu["kind"] == "kernel" and gelu["device_us"] == pytest.approx(0.05)
    assert call_signature(calls[0], "cuda") == (
        "aten::add", "gelu_kernel", "side_kernel", "vectorized_elementwise_kernel<add>")
    merged = merge_rows(calls)
    assert {r["name"]: r["count"] for r in merged}["gelu_kernel"] == 1


def test_trace_spans_and_work_launched_between_calls():
    """A call's device span covers every stream; kernels a thread of the candidate's launches
    between calls are counted apart (they run untimed); the harness's own are not."""
    events = [
        ev("cudaLaunchKernel", 50, 60, corr=900, act="cuda_runtime"),    # harness: the spin
        ev(CALL_RANGE, 100, 200, corr=1),
        ev("cudaLaunchKernel", 110, 120, corr=901, act="cuda_runtime"),
        ev("cudaLaunchKernel", 130, 140, thread=3, corr=902, act="cuda_runtime"),  # in the call
        ev("cudaLaunchKernel", 250, 260, thread=3, corr=903, act="cuda_runtime"),  # between
        ev("cudaLaunchKernel", 270, 280, corr=904, act="cuda_runtime"),  # harness: a copy
        ev(CALL_RANGE, 300, 400, corr=2),
        ev("spin", 55, 95, corr=900, act="kernel", cpu=False),
        ev("main_stream_kernel", 200, 240, corr=901, act="kernel", cpu=False),
        ev("side_stream_kernel", 210, 330, corr=902, act="kernel", cpu=False),
        ev("late_kernel", 300, 350, corr=903, act="kernel", cpu=False),
        ev("harness_copy", 280, 290, corr=904, act="kernel", cpu=False),
    ]
    trace = attribute_trace(events, cuda=True)
    assert trace["spans_us"] == [pytest.approx(0.13), 0.0]  # 200 -> 330 ns; none in call 2
    assert trace["outside_us"] == pytest.approx(0.05)        # late_kernel only
    assert trace["side"] == [0, 0] and trace["joins"] == [0, 0]  # no stream ids: none known


def test_trace_counts_kernels_on_other_streams_and_the_waits_that_join_them():
    def k(name, start, end, corr, stream):
        return {**ev(name, start, end, corr=corr, act="kernel", cpu=False), "stream": stream}

    events = [
        ev("cudaLaunchKernel", 50, 60, corr=900, act="cuda_runtime"),    # harness: the hold
        ev(CALL_RANGE, 100, 200, corr=1),                                # side stream, no wait
        ev("cudaLaunchKernel", 110, 120, corr=901, act="cuda_runtime"),
        ev("cudaLaunchKernel", 260, 270, corr=902, act="cuda_runtime"),  # harness: a copy
        ev(CALL_RANGE, 300, 400, corr=2),                                # side stream, joined
        ev("cudaStreamWaitEvent", 305, 308, corr=903, act="cuda_runtime"),
        ev("cudaLaunchKernel", 310, 320, corr=904, act="cuda_runtime"),
        ev("cudaStreamWaitEvent", 330, 333, corr=905, act="cuda_runtime"),
        ev(CALL_RANGE, 500, 600, corr=3),                                # the caller's stream
        ev("cudaLaunchKernel", 510, 520, corr=906, act="cuda_runtime"),
        k("hold", 55, 95, 900, 7), k("copy", 270, 280, 902, 7),
        k("gelu", 120, 150, 901, 13), k("gelu", 320, 350, 904, 13), k("gelu", 520, 550, 906, 7),
    ]
    trace = attribute_trace(events, cuda=True)
    assert trace["side"] == [1, 1, 0] and trace["joins"] == [0, 2, 0]


class _OldKinetoEvent:
    """A kineto event as torch before 2.12 gives it (the GPU machine's 2.11): no
    ``activity_type``; a kernel is linked to the CPU op it was launched under."""

    def __init__(self, name, start, end, corr=0, linked=0, device="cpu", stream=None):
        self._v = (name, start, end, corr, linked, device, stream)

    def name(self):
        return self._v[0]

    def start_ns(self):
        return self._v[1]

    def end_ns(self):
        return self._v[2]

    def correlation_id(self):
        return self._v[3]

    def linked_correlation_id(self):
        return self._v[4]

    def device_type(self):
        return self._v[5]

    def start_thread_id(self):
        return 1

    def device_resource_id(self):
        return self._v[6]


def test_stream_waits_join_on_a_torch_without_activity_types():
    """The H200's torch 2.11 gave its events no activity type, and the worker dropped every
    runtime call: a side stream joined back with wait_stream read as unjoined, and 13 honest
    red-team variants were refused. The waits are told by name there."""
    from assay.verify.worker import _event

    E = _OldKinetoEvent
    raw = [
        E("aten::fill_", 50, 60, corr=10), E("hold", 55, 95, linked=10, device="cuda", stream=7),
        E(CALL_RANGE, 100, 200, corr=1),                                 # side stream, no wait
        E("aten::gelu", 110, 120, corr=11),
        E("cudaLaunchKernel", 112, 118, corr=901),                       # dropped: not a wait
        E(CALL_RANGE, 300, 400, corr=2),                                 # side stream, joined
        E("cudaStreamWaitEvent", 305, 308, corr=903),
        E("aten::gelu", 310, 320, corr=12),
        E("cudaStreamWaitEvent", 330, 333, corr=905),
        E(CALL_RANGE, 500, 600, corr=3),                                 # the caller's stream
        E("aten::gelu", 510, 520, corr=13),
        E("gelu", 120, 150, linked=11, device="cuda", stream=13),
        E("gelu", 320, 350, linked=12, device="cuda", stream=13),
        E("gelu", 520, 550, linked=13, device="cuda", stream=7),
    ]
    events = [d for e in raw if (d := _event(e, "cpu")) is not None]
    assert [e["name"] for e in events if e["act"] == "cuda_runtime"] == ["cudaStreamWaitEvent"] * 2
    trace = attribute_trace(events, cuda=True)
    assert trace["side"] == [1, 1, 0] and trace["joins"] == [0, 2, 0]


def test_a_library_ops_own_streams_are_not_a_side_stream():
    """cuDNN's FFT convolutions fork onto streams of their own inside the ATen op, joined by
    waits the trace does not show (H200, KernelBench L2_19, 2026-11-28): an op that launched
    work on the caller's stream too is ordered by ATen. Side work launched outside any ATen
    op, by an op that ran wholly on another stream, or by an op a candidate registered in the
    aten namespace, still counts."""
    def k(name, start, end, corr, stream):
        return {**ev(name, start, end, corr=corr, act="kernel", cpu=False), "stream": stream}

    events = [
        ev("cudaLaunchKernel", 50, 60, corr=900, act="cuda_runtime"),    # harness: the hold
        ev(CALL_RANGE, 100, 200, corr=1),                     # a convolution that forks
        ev("aten::cudnn_convolution_transpose", 105, 190, corr=2),
        ev("cudaLaunchKernel", 110, 112, corr=901, act="cuda_runtime"),
        ev("cuLaunchKernel", 120, 122, corr=902, act="cuda_driver"),
        ev("cuLaunchKernel", 130, 132, corr=903, act="cuda_runtime"),
        ev(CALL_RANGE, 300, 400, corr=3),                     # a raw launch on a side stream
        ev("cudaLaunchKernel", 310, 312, corr=904, act="cuda_runtime"),
        ev("aten::add", 320, 340, corr=4),
        ev("cudaLaunchKernel", 325, 327, corr=905, act="cuda_runtime"),
        ev(CALL_RANGE, 500, 600, corr=5),                     # an op wholly on a side stream
        ev("aten::mm", 505, 560, corr=6),
        ev("cudaLaunchKernel", 510, 512, corr=906, act="cuda_runtime"),
        ev("cudaLaunchKernel", 570, 572, corr=907, act="cuda_runtime"),
        ev(CALL_RANGE, 700, 800, corr=7),                     # an op the candidate registered
        ev("aten::assay_fork", 705, 790, corr=8),             # in the aten namespace
        ev("cudaLaunchKernel", 710, 712, corr=908, act="cuda_runtime"),
        ev("cudaLaunchKernel", 720, 722, corr=909, act="cuda_runtime"),
        k("hold", 55, 95, 900, 7),
        k("fft_r2c", 120, 150, 901, 7), k("fft_gemm", 150, 170, 902, 41),
        k("fft_c2r", 170, 180, 903, 42),
        k("mine", 320, 350, 904, 13), k("add", 350, 360, 905, 7),
        k("sgemm", 520, 550, 906, 13), k("epilogue", 570, 580, 907, 7),
        k("mine", 720, 740, 908, 7), k("hidden", 730, 760, 909, 13),
    ]
    trace = attribute_trace(events, cuda=True)
    assert trace["side"] == [0, 1, 1, 1] and trace["joins"] == [0, 0, 0, 0]


def _nested_ops(rng, n, thread=1):
    """``n`` properly nested ATen ops of one thread (a random tree of spans), by start."""
    ops, t, stack = [], 0, []
    while len(ops) < n:
        t += rng.randint(1, 5)
        if stack and rng.random() < 0.45:
            stack.pop()["end"] = t
        else:
            stack.append(ev("aten::add", t, None, thread=thread, corr=len(ops)))
            ops.append(stack[-1])
    while stack:
        t += 1
        stack.pop()["end"] = t
    return ops


def test_the_innermost_op_holding_a_launch_is_found_up_the_chain_of_enclosing_ops():
    """The chain (worker.Nesting) gives what a search of every op would: the op with the
    latest start among those whose span holds the time, or none."""
    import random

    from assay.verify.worker import Nesting
    rng = random.Random(7)
    for _ in range(20):
        ops = sorted(_nested_ops(rng, rng.randint(1, 60)), key=lambda e: (e["start"], -e["end"]))
        nesting = Nesting(ops)
        for t in range(0, ops[-1]["end"] + 3):
            holding = [o for o in ops if o["start"] <= t <= o["end"]]
            assert nesting.innermost(t) is (holding[-1] if holding else None), t


def _launch_trace(calls, launches, ops):
    """A recurrent candidate's trace: per call, ``ops`` ATen ops, then ``launches`` kernels
    launched outside any of them (its own host loop), on one stream."""
    events, t, corr = [], 0, 1
    for _ in range(calls):
        t0, t = t, t + 10
        for _ in range(ops):
            events.append(ev("aten::empty", t, t + 5, corr=corr))
            corr, t = corr + 1, t + 10
        for _ in range(launches):
            events.append(ev("cudaLaunchKernel", t, t + 2, corr=corr, act="cuda_runtime"))
            events.append({**ev("step", t + 1, t + 3, corr=corr, act="kernel", cpu=False),
                           "stream": 7})
            corr, t = corr + 1, t + 4
        events.append(ev(CALL_RANGE, t0, t, corr=corr))
        corr, t = corr + 1, t + 10
    return events


def test_the_audit_read_back_grows_linearly_with_launches_outside_aten_ops():
    """Each launch outside any ATen op used to walk back over every earlier op of its thread:
    a recurrent candidate (6144 launches a call, KernelBench L3_41) spent 30 of its 34 s of
    verification there on an H100. Four times the ops and launches now take about four times as
    long (a walk over all would take sixteen: 12-15x measured before the fix)."""
    import time

    def best(events):
        out = []
        for _ in range(3):
            t = time.perf_counter()
            trace = attribute_trace(events, cuda=True)
            out.append(time.perf_counter() - t)
        assert len(trace["rows"]) == 4 and trace["side"] == [0] * 4
        return min(out)

    small, large = _launch_trace(4, 1000, 100), _launch_trace(4, 4000, 400)
    ratio = best(large) / best(small)
    assert ratio < 8, ratio


def test_an_unjoined_side_stream_is_out_of_order():
    calls = [{"phase": "timed", "rows": [], "span_us": 1.0, "side": 1, "joins": 0}] * 4 + \
            [{"phase": "timed", "rows": [], "span_us": 1.0, "side": 0, "joins": 0}] * 4
    passed, detail = _timing_verdict(0.03, 0.0, {"expected": 20, "calls": calls})
    assert not passed and "4 timed call(s) ran kernels on a stream other than" in detail
    joined = [{**c, "joins": 2} for c in calls]
    assert _timing_verdict(0.03, 0.0, {"expected": 20, "calls": joined})[0]


def _timing_verdict(runtime_ms, escaped_ms, audit=None):
    v = Verdict(task="t", candidate="c", device="cuda")
    result = {"timing": {"median_ms": runtime_ms, "iqr_ms": 0.0, "escaped_ms": escaped_ms}}
    if audit is not None:
        result["audit"] = audit
    harness._check_timing(v, result, [])
    return v.checks["stream_ordered"]["passed"], v.checks["stream_ordered"]["detail"]


def test_stream_ordered_trusts_the_trace_over_sync_latency():
    """Under the every-call audit the sync-latency estimate is inflated by the profiler's
    callbacks (an honest kernel was rejected on an H100): the trace decides where there is one."""
    honest = {"expected": 40, "calls": [{"phase": "timed", "rows": [], "span_us": 70.0}] * 9,
              "outside_us": 0.0}
    assert _timing_verdict(0.076, 0.026, honest)[0]  # the sync estimate says late; trace: no
    side = {"expected": 40, "calls": [{"phase": "timed", "rows": [], "span_us": 500.0}] * 9,
            "outside_us": 0.0}
    passed, detail = _timing_verdict(0.076, 0.0, side)
    assert not passed and "audit's trace" in detail
    # A side stream that ran an 8 us kernel during the hold, 2 us timed: under the sync
    # estimate's 10 us floor, over the trace's.
    hold = {"expected": 40, "calls": [{"phase": "timed", "rows": [], "span_us": 8.0}] * 9,
            "outside_us": 0.0}
    assert not _timing_verdict(0.002, 0.0, hold)[0]
    assert _timing_verdict(0.002, 0.006)[0]
    thread = {"expected": 40, "calls": [{"phase": "timed", "rows": [], "span_us": 70.0}] * 9,
              "outside_us": 40 * 50.0}
    assert not _timing_verdict(0.076, 0.0, thread)[0]
    assert not _timing_verdict(0.076, 0.026)[0]  # no trace: the sync estimate decides
    assert _timing_verdict(0.076, 0.005)[0]


def _calls(sigs, phase="timed", device_us=10.0):
    return [{"phase": phase, "rows": [{"name": n, "kind": "kernel", "count": 1,
                                       "device_us": device_us, "cpu_us": 0.0} for n in sig]}
            for sig in sigs]


def test_audit_consistency():
    ok = {"expected": 30, "found": 30, "calls": _calls([["k"]] * 8)}
    assert audit_consistency(ok, "cuda")[0]
    assert not audit_consistency({"error": "the profiler could not be read back"}, "cpu")[0]
    lost = {"expected": 30, "found": 3}
    passed, detail = audit_consistency(lost, "cpu")
    assert not passed and "30 calls made, 3 found" in detail
    mixed = {"expected": 30, "found": 30, "calls": _calls([["k"]] * 6 + [["cublasGemm"]] * 2)}
    passed, detail = audit_consistency(mixed, "cuda")
    assert not passed and "6 ran k" in detail and "2 ran also cublasGemm, without k" in detail
    # A call lacking one kernel record of the others' (CUPTI drops one now and then under
    # load): at most 1% of the calls on cuda, where it cannot move the median; more, or on cpu,
    # or a call with a kernel of its own, are refused.
    many = [["a", "b", "c"]] * 199
    dropped = {"expected": 200, "found": 200, "calls": _calls(many + [["a", "c"]])}
    passed, detail = audit_consistency(dropped, "cuda")
    assert passed and "1 lacking one kernel record" in detail, detail
    on_cpu = {**dropped, "calls": [{"phase": "timed", "rows": [
        {**r, "kind": "interpreted"} for r in c["rows"]]} for c in dropped["calls"]]}
    assert not audit_consistency(on_cpu, "cpu")[0]  # no device trace to drop a record
    two = {"expected": 100, "found": 100, "calls": _calls([["a", "b"]] * 98 + [["a"]] * 2)}
    passed, detail = audit_consistency(two, "cuda")
    assert not passed and "2 ran without b" in detail, detail
    other = {"expected": 200, "found": 200, "calls": _calls(many + [["a", "c", "cublasGemm"]])}
    passed, detail = audit_consistency(other, "cuda")
    assert not passed and "1 ran also cublasGemm" in detail, detail
    swapped = {"expected": 200, "found": 200, "calls": _calls(many + [["a", "c", "d"]])}
    assert not audit_consistency(swapped, "cuda")[0]
    # a call that ran none of the kernels, or lacks two, is no dropped record
    for sig in ([], ["a"]):
        short = {"expected": 200, "found": 200, "calls": _calls(many + [sig])}
        assert not audit_consistency(short, "cuda")[0], sig
    # nor is a call that lacks an ATen op (the host's profiler records, not the device trace)
    rows = [{"name": n, "kind": "op" if n.startswith("aten::") else "kernel", "count": 1,
             "device_us": 10.0, "cpu_us": 0.0} for n in ("k", "aten::mm")]
    host = {"expected": 200, "found": 200,
            "calls": [{"phase": "timed", "rows": rows}] * 199 + [{"phase": "timed",
                                                                   "rows": rows[:1]}]}
    passed, detail = audit_consistency(host, "cuda")
    assert not passed and "without aten::mm" in detail, detail
    # Movement kernels do not make calls differ (an allocation on the first timed call).
    moved = {"expected": 9, "found": 9, "calls": _calls([["k"], ["k", "Memset (Device)"]])}
    assert audit_consistency(moved, "cuda")[0]
    slow_when_checked = {"expected": 9, "found": 9,
                         "calls": _calls([["k"]] * 6) + _calls([["k"]] * 2, "timed_verified",
                                                               device_us=50.0)}
    passed, detail = audit_consistency(slow_when_checked, "cuda")
    assert not passed and "device time" in detail
    assert audit_consistency(slow_when_checked, "cpu")[0]  # no device time on the cpu target


def test_the_real_profiler_sees_every_call_and_every_thread():
    audit = CallAudit(torch.device("cpu"))
    audit.start()
    x = torch.randn(64, 64)

    def own(x):
        return torch.empty_like(x)

    def side(x):
        out = []
        t = threading.Thread(target=lambda: out.append(torch.mm(x, x)))
        t.start()
        t.join()
        return out[0]

    audit.call("check", own, x)
    for _ in range(3):
        audit.call("timed", own, x)
    audit.call("timed", side, x)
    torch.mul(x, 2.0)  # the harness's own op: in no call
    info = audit.finish()
    assert info["expected"] == info["found"] == 5
    assert [c["phase"] for c in info["calls"]] == ["timed"] * 4
    sigs = [call_signature(c["rows"], "cpu") for c in info["calls"]]
    assert sigs[:3] == [()] * 3 and "aten::mm" in sigs[3], sigs
    passed, detail = audit_consistency(info, "cpu")
    assert not passed and "aten::mm" in detail


def test_a_stopped_profiler_is_a_lost_trace():
    audit = CallAudit(torch.device("cpu"))
    audit.start()
    x = torch.randn(8)
    audit.call("timed", torch.relu, x)
    audit.call("timed", lambda x: torch.autograd._disable_profiler(), x)
    audit.call("timed", torch.relu, x)
    info = audit.finish()
    assert not audit_consistency(info, "cpu")[0], info


def _verify(name, **overrides):
    from assay.verify.harness import verify

    meta = CASES[name]
    task = zoo_task(meta["TASK"])
    cfg = zoo_config(meta)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return verify(task, meta["path"], "cpu", cfg, record=record(task), peaks=GENEROUS_PEAKS,
                  prepared=prepared(task))


def test_profiler_flag_trick_runs_its_kernel_when_timed():
    """The candidate that runs its kernel only when a profiler is on always sees one: its
    timed calls ran no aten::gelu (the library's), and it is accepted."""
    v = _verify("neutralized_cheat_unless_profiler_on")
    assert v.accepted, v.reasons
    assert v.kernels_launched and "aten::gelu" not in v.kernels_launched, v.kernels_launched
    assert v.checks["audit_consistency"]["passed"]


def test_honest_verdict_is_the_same_with_and_without_the_audit():
    on = _verify("honest_gelu_cpp")
    off = _verify("honest_gelu_cpp", audit=False)
    assert on.accepted and off.accepted, (on.reasons, off.reasons)
    audit_checks = {"kernel_audit", "reference_fallback", "audit_consistency", "audit_provenance",
                    "timing_observed"}
    assert {k: c["passed"] for k, c in on.checks.items() if k not in audit_checks} == \
        {k: c["passed"] for k, c in off.checks.items()}
