"""One timing protocol for candidates, eager and torch.compile alike.

CUDA: a device-wide sync, then per call an L2 flush (a read over a buffer twice the L2), device
events around the call alone (the call is enqueued while the flush still runs, so host launch
overhead stays out of the device time), inputs rotated among several buffers, warm-up by time,
median and IQR. CPU: the same with ``perf_counter`` (CPU ops are synchronous) and a cache flush by a write
over a buffer larger than the last-level cache.

The functions here keep references to the clocks taken at import, before any candidate code is
loaded, so a candidate that patches ``time.perf_counter`` or ``torch.cuda.Event`` later does not
change what this module measures (the verifier also checks that they are unchanged).
"""

from __future__ import annotations

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

ORIGINALS = {
    "time.perf_counter": _perf_counter,
    "torch.cuda.Event": _cuda_event,
    "torch.cuda.synchronize": _cuda_sync,
    "torch.cuda.Event.elapsed_time": _elapsed,
    "torch.cuda.Event.record": _record,
}


def tampered_clocks() -> list[str]:
    """Names of timing functions that no longer are the originals."""
    now = {
        "time.perf_counter": time.perf_counter,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.record": torch.cuda.Event.record,
    }
    return [k for k, v in now.items() if v is not ORIGINALS[k]]


@dataclass
class Timing:
    median_ms: float
    iqr_ms: float
    runs: int
    samples_ms: list[float] = field(default_factory=list)
    # CUDA: device time that finished only after a device-wide sync, beyond the caller's
    # stream (median, sync latency subtracted). Work hidden on a side stream shows here.
    escaped_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"median_ms": self.median_ms, "iqr_ms": self.iqr_ms, "runs": self.runs,
                "escaped_ms": self.escaped_ms}


# Measured on an H200: with 0.05 s of warm-up, 64-170 us kernels showed 2-10% IQR in some runs
# (clocks still ramping); with 0.2 s, 0.5-2%.
CUDA_MIN_WARMUP_S = 0.2


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


def sync(device: torch.device) -> None:
    """Device-wide: waits for every stream, so no work can hide on a side stream."""
    if device.type == "cuda":
        _cuda_sync()


def summarize(samples_ms: Sequence[float]) -> Timing:
    s = sorted(samples_ms)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = 0.0
    return Timing(statistics.median(s), iqr, len(s), list(s))


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
    while _perf_counter() - t0 < warmup_s or i < 2:
        fn(i)
        i += 1
        sync(device)
    samples: list[float] = []
    whole: list[float] = []  # start -> after a device-wide sync (cuda)
    sync_ms = _sync_latency_ms() if device.type == "cuda" else 0.0
    t0 = _perf_counter()
    call = 0
    while call < cfg.max_runs and (call < cfg.min_runs or _perf_counter() - t0 < cfg.budget_s):
        if before_call is not None:
            before_call(call)
        if flush is not None:
            flush()
        if device.type == "cuda":
            start, end, after = (_cuda_event(enable_timing=True) for _ in range(3))
            if flush is None:
                _cuda_sync()
            # With a flush, no sync here: the device is still busy flushing (tens of us) when
            # ``start`` and the call are enqueued, so ``start`` fires when the flush ends and the
            # call's kernels follow at once. A sync here would leave the device idle while the
            # call's Python launches its kernels, and that host jitter (2-4% of a 70 us kernel
            # on an H200) would land inside the timed region. The previous call still ended in
            # a device-wide sync, so nothing else can be running.
            _record(start)
            out = fn(call)
            _record(end)
            _cuda_sync()  # waits for every stream: ``after`` cannot precede hidden work
            _record(after)
            _cuda_sync()
            samples.append(_elapsed(start, end))
            whole.append(_elapsed(start, after))
        else:
            s = _perf_counter()
            out = fn(call)
            samples.append((_perf_counter() - s) * 1e3)
        if after_call is not None:
            after_call(call, out)
        call += 1
    t = summarize(samples)
    if whole:
        t.escaped_ms = max(0.0, statistics.median(whole) - sync_ms - t.median_ms)
    return t


def _sync_latency_ms(n: int = 20) -> float:
    """Median event time across an empty region closed by a device-wide sync."""
    vals = []
    for _ in range(n):
        start, after = _cuda_event(enable_timing=True), _cuda_event(enable_timing=True)
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
