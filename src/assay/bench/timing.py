"""One timing protocol for candidates, eager and torch.compile alike.

CUDA: a device-wide sync, then per call an L2 flush (a read over a buffer twice the L2) and a
short spin kernel that holds the stream while the host enqueues the call (sized from the call's
own enqueue time, bounded), device events around the call alone (so host launch overhead and
host jitter stay out of the device time), inputs rotated among several buffers, warm-up by
time, median and IQR over samples that each average enough consecutive calls to cover 0.2 ms
(each call still flushed and timed on its own). CPU: the same with ``perf_counter`` (CPU ops are
synchronous) and a cache flush by a write over a buffer larger than the last-level cache, in
rounds of half the budget until two agree, the fastest kept (a shared CPU's interference comes
in bursts and only adds time).

The functions here keep references to the clocks taken at import, before any candidate code is
loaded, so a candidate that patches ``time.perf_counter`` or ``torch.cuda.Event`` later does not
change what this module measures (the verifier also checks that they are unchanged).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

_perf_counter = time.perf_counter
_cuda_event = torch.cuda.Event
# Bound now: a candidate that patches the class's methods later changes nothing measured here.
_record = torch.cuda.Event.record
_elapsed = torch.cuda.Event.elapsed_time
_cuda_sync = torch.cuda.synchronize
_cuda_spin = getattr(torch.cuda, "_sleep", None)  # spins a number of GPU clock cycles

ORIGINALS = {
    "time.perf_counter": _perf_counter,
    "torch.cuda.Event": _cuda_event,
    "torch.cuda.synchronize": _cuda_sync,
    "torch.cuda.Event.elapsed_time": _elapsed,
    "torch.cuda.Event.record": _record,
    "torch.cuda._sleep": _cuda_spin,
}


def tampered_clocks() -> list[str]:
    """Names of timing functions that no longer are the originals."""
    now = {
        "time.perf_counter": time.perf_counter,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.record": torch.cuda.Event.record,
        "torch.cuda._sleep": getattr(torch.cuda, "_sleep", None),
    }
    return [k for k, v in now.items() if v is not ORIGINALS[k]]


@dataclass
class Timing:
    median_ms: float  # of the samples (each the mean of ``group`` consecutive calls)
    iqr_ms: float  # of the samples
    runs: int  # timed calls
    samples_ms: list[float] = field(default_factory=list)
    # CUDA: device time that finished only after a device-wide sync, beyond the caller's
    # stream (median, sync latency subtracted). Work hidden on a side stream shows here.
    escaped_ms: float = 0.0
    group: int = 1  # calls averaged per sample
    call_iqr_ms: float = 0.0  # IQR of single calls: the spread a sample of one call would have
    host_ms: float = 0.0  # median host time to enqueue one call (CUDA) or to run it (CPU)
    hold_us: float = 0.0  # CUDA: how long the spin kernel held the stream before each call
    rounds: int = 1  # CPU: rounds timed, of which this is the fastest (see time_calls)
    # CPU: every timed call's time in call order, all rounds, and the rounds' lengths: the
    # verifier recomputes the timing from them (cpu_timing) and holds each against its call
    calls_ms: list[float] = field(default_factory=list)
    round_sizes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {"median_ms": self.median_ms, "iqr_ms": self.iqr_ms, "runs": self.runs,
               "escaped_ms": self.escaped_ms, "group": self.group,
               "call_iqr_ms": self.call_iqr_ms, "host_ms": self.host_ms,
               "hold_us": self.hold_us, "rounds": self.rounds}
        if self.round_sizes:
            out.update(calls_ms=self.calls_ms, round_sizes=self.round_sizes)
        return out


# A sample averages consecutive calls until it covers this much time. Measured on an H200
# (2026-11-23, benchmarks/probe_gpu.py): a 64 us memory-bound kernel spreads by 2.0-2.5% IQR
# from call to call, with one buffer or three, with or without the stream held while the host
# enqueues the call (so neither placement nor launch jitter): the device's own variation, about
# 1 us, which a mean of four calls halves. Kernels of 0.2 ms and more are one call a sample.
SAMPLE_MIN_MS = 0.2
MAX_GROUP = 8
MIN_SAMPLES = 8

# The hold: 1.5x the slowest tenth of the warm-up's enqueue times, within these bounds. Measured
# on an H200: enqueueing torch.relu takes ~37 us of Python and driver time, a candidate's
# forward 40-60 us, longer on a loaded host, while the read flush lasts ~28 us; without a hold,
# the rest lands in the timed region (4-15% IQR on 50-140 us kernels on a busy host). Bounded,
# so that host work a call hides under the hold stays small next to the kernels timed.
HOLD_MIN_US = 20.0
HOLD_MAX_US = 500.0
_SPIN_RATE: dict[int, float] = {}  # device index -> spin cycles per microsecond

# CPU rounds (time_calls): the fastest round's median must be confirmed by another round's within
# this fraction; more rounds, up to the most (each half the budget), until it is.
CPU_AGREE = 0.02
CPU_MAX_ROUNDS = 3

# Measured on an H200: with 0.05 s of warm-up, 64-170 us kernels showed 2-10% IQR in some runs
# (clocks still ramping); with 0.2 s, 0.5-2%.
CUDA_MIN_WARMUP_S = 0.2
# Calls in a cuda warm-up at most; the rest of its time the device spins. A call of a few
# microseconds ran ~4,000 times in 0.2 s, and the verifier's audit traces every call the worker
# makes: those warm-up calls' events made the audit cost up to 2.6 s a verification on an H200
# (docs/evidence/2026-11-29-h200-audit-precision.md). Code loading, autotuning and the
# allocator's growth happen in the first calls; the clocks need the device busy, not the calls.
CUDA_WARMUP_CALLS = 200


@dataclass
class TimingConfig:
    warmup_s: float = 0.05
    min_runs: int = 10
    max_runs: int = 200
    budget_s: float = 1.0
    flush_cache: bool = True
    # How the cache is flushed (cuda): "read" a buffer twice the L2 (leaves only clean lines),
    # or "write" it (leaves the L2 full of dirty lines that the timed call then pays to write
    # back: measured on an H200, 2-4% IQR on 70-140 us memory-bound kernels).
    flush_mode: str = "read"

    @classmethod
    def of(cls, verify: Any) -> "TimingConfig":
        """The timing of a verify config (``VerifyConfig`` or its Hydra node): baselines are
        timed with the candidates' protocol."""
        return cls(warmup_s=verify.warmup_s, min_runs=verify.min_runs,
                   max_runs=verify.max_runs, budget_s=verify.budget_s)


class CacheFlusher:
    """Evicts caches between calls with a pass over a buffer larger than the last-level cache."""

    def __init__(self, device: torch.device, mode: str = "read"):
        if mode not in ("read", "write"):
            raise ValueError(f"flush_mode must be read or write, not {mode!r}")
        self.device, self.mode = device, mode
        if device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20)
            nbytes = 2 * max(l2, 8 << 20)
        else:
            nbytes = 64 << 20
        self.buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        self.sink = torch.empty((), dtype=torch.float32, device=device)

    def __call__(self) -> None:
        if self.mode == "read" and self.device.type == "cuda":
            torch.sum(self.buf, dim=0, dtype=torch.float32, out=self.sink)
        else:  # cpu: a write also evicts (and CPU caches write back on their own)
            self.buf.fill_(1.0)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def steady_host_allocator() -> bool:
    """Fix glibc malloc's thresholds in a process that times cpu code (the baseline step and
    the verifier's worker), so that eager and candidate outputs are served alike, call after
    call. Left dynamic, a freed block of up to 32 MB may go back to the kernel or stay, by the
    process's allocation history: the same eager ReLU over a 16 MB output timed 0.9 ms in one
    baseline step and 5.8-6.9 ms (IQR 3 ms, page faults on every call) in the next, and the
    campaign's speedups over such a baseline were 7-13x where the kernel was 1.0x. Fixed
    (blocks up to 32 MB from the heap, the heap's top kept), six baseline steps in a row timed
    it at 0.88 ms. Not a guarantee: in a bare process the same output is still faulted in anew
    on most runs (where the heap cannot grow in place), so both processes get the same
    settings rather than the same page faults. Returns whether it applied (glibc only)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def sync(device: torch.device) -> None:
    """Device-wide: waits for every stream, so no work can hide on a side stream."""
    if device.type == "cuda":
        _cuda_sync()


def _iqr(s: Sequence[float]) -> float:
    if len(s) < 4:
        return 0.0
    q = statistics.quantiles(s, n=4)
    return q[2] - q[0]


def group_size(calls_ms: Sequence[float]) -> int:
    """Calls per sample: enough to cover SAMPLE_MIN_MS, at most MAX_GROUP, and few enough to
    leave MIN_SAMPLES samples."""
    if not calls_ms:
        return 1
    med = statistics.median(calls_ms)
    want = math.ceil(SAMPLE_MIN_MS / med) if med > 0 else MAX_GROUP
    return max(1, min(want, MAX_GROUP, len(calls_ms) // MIN_SAMPLES))


def summarize(calls_ms: Sequence[float], group: int = 1) -> Timing:
    """Median and IQR of samples that each average ``group`` consecutive calls (in call order;
    a last partial group is dropped)."""
    calls = list(calls_ms)
    group = max(1, min(group, len(calls)))
    n = len(calls) // group * group
    samples = sorted(statistics.fmean(calls[i:i + group]) for i in range(0, n, group))
    return Timing(statistics.median(samples), _iqr(samples), len(calls), samples,
                  group=group, call_iqr_ms=_iqr(sorted(calls)))


def time_calls(fn: Callable[[int], Any], device: torch.device, cfg: TimingConfig,
               before_call: Callable[[int], None] | None = None,
               after_call: Callable[[int, Any], None] | None = None) -> Timing:
    """Time ``fn(i)`` for i = 0, 1, ...; ``fn`` picks its rotating input from ``i``.

    ``before_call`` runs untimed before each timed call (the verifier swaps data there) and
    ``after_call`` gets each result (the verifier keeps some of them to check).
    """
    flush = CacheFlusher(device, cfg.flush_mode) if cfg.flush_cache else None
    # Warm-up by time: module loading, autotuning and allocator growth stay out of the numbers;
    # on a GPU also long enough for its clocks to settle.
    warmup_s = max(cfg.warmup_s, CUDA_MIN_WARMUP_S) if device.type == "cuda" else cfg.warmup_s
    sync(device)
    t0 = _perf_counter()
    i = 0
    enqueue: list[float] = []  # host seconds per warm-up call (the first two load code)
    cuda = device.type == "cuda"
    while _perf_counter() - t0 < warmup_s or i < 2:
        if cuda and i >= CUDA_WARMUP_CALLS and _cuda_spin is not None:
            rest_us = (warmup_s - (_perf_counter() - t0)) * 1e6
            if rest_us > 0:
                _cuda_spin(int(rest_us * spin_rate(device)))
                sync(device)
            break
        h = _perf_counter()
        fn(i)
        if i >= 2:
            enqueue.append(_perf_counter() - h)
        i += 1
        sync(device)
    hold_us, spin_cycles = 0.0, 0
    if cuda and flush is not None and _cuda_spin is not None:
        hold_us = hold_for(enqueue)
        spin_cycles = int(hold_us * spin_rate(device))
    sync_ms = _sync_latency_ms(flush, spin_cycles) if cuda else 0.0
    calls = 0  # across rounds: before_call and after_call see one sequence of timed calls

    def one_round(budget_s: float, most: int) -> Timing:
        nonlocal calls
        samples: list[float] = []
        host: list[float] = []
        whole: list[float] = []  # start -> after a device-wide sync (cuda)
        t0 = _perf_counter()
        n = 0
        while n < most and (n < cfg.min_runs or _perf_counter() - t0 < budget_s):
            if before_call is not None:
                before_call(calls)
            if flush is not None:
                flush()
            if cuda:
                start, end, after = (_cuda_event(enable_timing=True) for _ in range(3))
                if flush is None:
                    _cuda_sync()
                elif spin_cycles:
                    _cuda_spin(spin_cycles)
                # With a flush, no sync here: the device is still busy flushing (~28 us) and
                # then spinning (the hold) when ``start`` and the call are enqueued, so
                # ``start`` fires when the hold ends and the call's kernels follow at once. A
                # sync here would leave the device idle while the call's Python launches its
                # kernels, and that host jitter would land inside the timed region. The
                # previous call still ended in a device-wide sync, so nothing else can run.
                _record(start)
                h = _perf_counter()
                out = fn(calls)
                host.append(_perf_counter() - h)
                _record(end)
                _cuda_sync()  # waits for every stream: ``after`` cannot precede hidden work
                _record(after)
                _cuda_sync()
                samples.append(_elapsed(start, end))
                whole.append(_elapsed(start, after))
            else:
                s = _perf_counter()
                out = fn(calls)
                samples.append((_perf_counter() - s) * 1e3)
            if after_call is not None:
                after_call(calls, out)
            calls += 1
            n += 1
        if not cuda:
            return cpu_round(samples)
        t = summarize(samples, group_size(samples))
        t.host_ms = statistics.median(host) * 1e3
        t.hold_us = hold_us
        t.escaped_ms = max(0.0, statistics.median(whole) - sync_ms - t.median_ms)
        return t

    if cuda:
        return one_round(cfg.budget_s, cfg.max_runs)
    # CPU: rounds of half the budget until the fastest is confirmed by another within
    # CPU_AGREE (at most CPU_MAX_ROUNDS); that fastest round is the timing. Interference on a
    # shared CPU only ever adds time, and it comes in bursts: on the 2-core CI machine one of
    # five verifications of the same ReLU kernel in a single 0.5 s window measured 14% slower
    # than the other four (which agreed within 2.5%), its IQR twice theirs.
    most = max(cfg.min_runs, cfg.max_runs // 2)
    rounds = [one_round(cfg.budget_s / 2, most), one_round(cfg.budget_s / 2, most)]
    while not confirmed(rounds) and len(rounds) < CPU_MAX_ROUNDS:
        rounds.append(one_round(cfg.budget_s / 2, most))
    return cpu_timing([r.calls_ms for r in rounds])


def cpu_round(calls_ms: Sequence[float]) -> Timing:
    """One cpu round's timing from its calls' times (the host time is the call itself)."""
    t = summarize(calls_ms, group_size(calls_ms))
    t.host_ms = statistics.median(calls_ms)
    t.calls_ms = list(calls_ms)
    return t


def cpu_timing(rounds_ms: Sequence[Sequence[float]]) -> Timing:
    """The cpu timing of rounds of calls: the fastest round's, with every call's time kept. A
    pure function of the calls' times, so the verifier recomputes a report's timing from them."""
    rounds = [cpu_round(r) for r in rounds_ms]
    best = min(rounds, key=lambda r: r.median_ms)
    best.runs, best.rounds = sum(len(r) for r in rounds_ms), len(rounds)
    best.calls_ms = [ms for r in rounds_ms for ms in r]
    best.round_sizes = [len(r) for r in rounds_ms]
    return best


def confirmed(rounds: Sequence[Timing]) -> bool:
    """Whether the fastest round's median has another within CPU_AGREE of it."""
    fast, second = sorted(r.median_ms for r in rounds)[:2]
    return second - fast <= CPU_AGREE * fast


def hold_for(enqueue_s: Sequence[float]) -> float:
    """Microseconds to hold the stream before a call whose warm-up enqueue times (seconds) were
    ``enqueue_s``: 1.5x their slowest tenth, within [HOLD_MIN_US, HOLD_MAX_US]."""
    if not enqueue_s:
        return HOLD_MIN_US
    s = sorted(enqueue_s)
    p90 = s[min(len(s) - 1, int(0.9 * len(s)))] * 1e6
    return min(HOLD_MAX_US, max(HOLD_MIN_US, 1.5 * p90))


def spin_rate(device: torch.device) -> float:
    """Spin cycles per microsecond on ``device`` (the spin counts SM clock cycles), measured
    once per process."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SPIN_RATE:
        cycles = 1_000_000
        _cuda_spin(cycles)  # clocks up
        start, end = _cuda_event(enable_timing=True), _cuda_event(enable_timing=True)
        _record(start)
        _cuda_spin(cycles)
        _record(end)
        _cuda_sync()
        ms = _elapsed(start, end)
        _SPIN_RATE[index] = cycles / (ms * 1e3) if ms > 0 else 2000.0
    return _SPIN_RATE[index]


def _sync_latency_ms(flush: CacheFlusher | None, spin_cycles: int, n: int = 20) -> float:
    """Median event time from ``start`` to ``after`` around an empty call, under the timed
    loop's own protocol (flush, hold, the host waiting in a device-wide sync): how late
    ``after`` lands with no work at all. A host that waited long in a sync wakes later than one
    that waited briefly (measured on an H200: ~20 us more behind a held stream), so the
    calibration must wait as long as the timed calls do."""
    vals = []
    for _ in range(n):
        start, after = _cuda_event(enable_timing=True), _cuda_event(enable_timing=True)
        if flush is not None:
            flush()
            if spin_cycles:
                _cuda_spin(spin_cycles)
        else:
            _cuda_sync()
        _record(start)
        _cuda_sync()
        _record(after)
        _cuda_sync()
        vals.append(_elapsed(start, after))
    return statistics.median(vals)


def noise_ratio(a: Timing, b: Timing) -> float:
    """Relative spread of two timings of the same code: what counts as 'no difference'."""
    lo, hi = sorted((a.median_ms, b.median_ms))
    return (hi - lo) / lo if lo > 0 else 0.0
