"""Eager and torch.compile timings of a task's reference, with the candidates' protocol.

Runs in a process that never loads a candidate (the workflow's `baseline` step), so no
candidate can touch the baseline's clock, memory or settings.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager

import torch

from assay.bench.timing import Timing, TimingConfig, steady_host_allocator, time_calls
from assay.tasks.instantiate import make_inputs, reference_model, set_fp32_numerics
from assay.tasks.model import Task

# A baseline is the denominator of every speedup against it, so a noisy one is timed again:
# an IQR over this fraction of the median (an H200 timed torch.compile's GELU at 0.181 ms, IQR
# 0.136 ms, where its other runs gave 0.127 ms, IQR under 1%) earns up to RETRIES more runs,
# and the steadiest (smallest relative IQR) is kept.
NOISY_IQR = 0.1
RETRIES = 2


def steady(time_once: Callable[[], Timing]) -> tuple[Timing, int]:
    """The steadiest of up to 1 + RETRIES timings, stopping at the first that is not noisy;
    and how many were taken."""
    best, taken = time_once(), 1
    while best.iqr_ms > NOISY_IQR * best.median_ms and taken <= RETRIES:
        again = time_once()
        taken += 1
        if again.iqr_ms * best.median_ms < best.iqr_ms * again.median_ms:
            best = again
    return best, taken


def runs_cudnn(model: torch.nn.Module) -> bool:
    """Whether the model holds modules whose forward goes through cuDNN on a GPU (convolutions,
    transposed ones, recurrent layers): those run in TF32 under PyTorch's default numerics."""
    kinds = (torch.nn.modules.conv._ConvNd, torch.nn.RNNBase)
    return any(isinstance(m, kinds) for m in model.modules())


def time_default_numerics(model: torch.nn.Module, sets: list[list], dev: torch.device,
                          cfg: TimingConfig, run: Callable[..., Any] | None = None
                          ) -> float | None:
    """The median time of ``run`` (default: eager, the model itself; torch.compile's wrapper
    of it for ``compile_default_ms``) under PyTorch's default numerics, where those differ from
    the verifier's: on cuda, a model with cuDNN modules (cuDNN in TF32, torch's default; the
    verifier's baselines and every candidate are held to true fp32). What a user's PyTorch takes
    by default and what KernelBench's published times measured (its convolutions' eager ran
    1.68x faster than the verifier's fp32 eager on an H200: docs/evidence/2026-11-28-cpu-kb-
    baselines.md; its torch.compile ones 1.5-5x: 2026-11-29-h200-kb-dag-resumed.md). None
    where the numerics are the same, or it could not be timed. (The flag is read by cuDNN at
    each call: a compiled model is not recompiled for it.)"""
    if dev.type != "cuda" or not runs_cudnn(model):
        return None
    fn = model if run is None else run
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True  # torch's own default
    try:
        with torch.no_grad():
            t = time_calls(lambda i: fn(*sets[i % len(sets)]), dev, cfg)
        return t.median_ms
    except RuntimeError:  # out of memory beside what runs (a RuntimeError too): not timed
        return None
    finally:
        torch.backends.cudnn.allow_tf32 = before


def time_reference(task: Task, device: str, cfg: TimingConfig, compile_: bool = True,
                   compile_mode: str = "default", rotating: int = 3,
                   hold: Callable[[], ContextManager[Any]] = contextlib.nullcontext
                   ) -> dict[str, Any]:
    """Eager's and torch.compile's timings of the task's reference (and ``eager_default_ms``:
    :func:`time_default_numerics`). torch.compile compiles (and warms up on every input set)
    first; ``hold()`` is entered around the timings alone (the
    baseline step's CPU lease: inductor's compile, seconds of C++ builds on the cpu target,
    runs beside another step's timing)."""
    set_fp32_numerics(False)
    if device == "cpu":
        steady_host_allocator()  # as the worker does: outputs served alike in both processes
    module = task.module()
    dev = torch.device(device)
    model = reference_model(module, 0, device)
    sets = [make_inputs(module, 100 + i, device) for i in range(rotating)]
    out: dict[str, Any] = {"task": task.id, "device": device, "size": task.size}
    with torch.no_grad():
        out["compile_ms"] = None
        compiled = None
        if compile_:
            from torch._dynamo.utils import counters

            before = dict(counters["inductor"])
            t0 = time.perf_counter()
            try:
                compiled = torch.compile(model, mode=compile_mode)
                for s in sets:
                    compiled(*s)
            except Exception as e:  # noqa: BLE001 - inductor failures are recorded, not fatal
                out["compile_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
                compiled = None
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            # the compile and its first calls, and whether inductor's FX-graph cache served it
            # (a prewarmed compile: bench/prewarm.py)
            out["compile_s"] = round(time.perf_counter() - t0, 3)
            out["fxgraph_cache"] = {k: counters["inductor"].get(f"fxgraph_cache_{k}", 0)
                                    - before.get(f"fxgraph_cache_{k}", 0)
                                    for k in ("hit", "miss")}
        with hold():
            eager, out["eager_timings"] = steady(
                lambda: time_calls(lambda i: model(*sets[i % rotating]), dev, cfg))
            out["eager_ms"], out["eager_iqr_ms"] = eager.median_ms, eager.iqr_ms
            # The same code timed twice: the spread is what counts as "no difference".
            again = time_calls(lambda i: model(*sets[i % rotating]), dev, cfg)
            lo, hi = sorted((eager.median_ms, again.median_ms))
            out["noise_frac"] = (hi - lo) / lo if lo > 0 else 0.0
            # beside it, eager as PyTorch runs it by default (cuDNN in TF32), where that differs
            out["eager_default_ms"] = time_default_numerics(model, sets, dev, cfg)
            if compiled is not None:
                try:
                    t, out["compile_timings"] = steady(
                        lambda: time_calls(lambda i: compiled(*sets[i % rotating]), dev, cfg))
                    out["compile_ms"], out["compile_iqr_ms"] = t.median_ms, t.iqr_ms
                    out["compile_default_ms"] = time_default_numerics(model, sets, dev, cfg,
                                                                      run=compiled)
                except Exception as e:  # noqa: BLE001 - a recompile that fails mid-timing
                    out["compile_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    return out


def baseline_here(task: Task, cfg: TimingConfig, compile_: bool, compile_mode: str = "default"
                  ) -> tuple[dict[str, Any], bool]:
    """The task's baseline on this process's GPU: from the baseline cache, else timed now
    (:func:`time_reference`) and stored there naming the GPU (``device_name``, which
    ``benchmarks/kb_baselines.py --cache`` reads); and whether it came from the cache. The
    verify step's baseline where the campaign's was another GPU's, and
    ``benchmarks/kb_retime.py``'s."""
    from assay.bench.baseline_cache import cached_baseline
    from assay.bench.device import device_name

    here = device_name("cuda")
    return cached_baseline(
        task, "cuda", cfg, compile_,
        lambda: {**time_reference(task, "cuda", cfg, compile_, compile_mode),
                 "device_name": here}, compile_mode)
