"""A verdict's speedup divides one GPU's times: a campaign resumed on another GPU (or a
cluster's jobs on several kinds) gets the baseline and the device's peaks of the GPU that
verifies (steps/verify.py: ``other_device``, ``this_gpu``)."""

from __future__ import annotations

import pytest
import torch

from assay import app
from assay.steps.verify import other_device, peaks_used, this_gpu


def test_timings_of_another_gpu_or_of_an_unnamed_one_are_not_this_gpus():
    here = "NVIDIA H100 80GB HBM3"
    assert other_device(here, here) == ""
    assert other_device("NVIDIA H200", here) == \
        "timed on NVIDIA H200, not on this NVIDIA H100 80GB HBM3"
    assert "does not name" in other_device(None, here)  # older baseline files


def test_a_verdict_keeps_the_peaks_it_was_judged_against():
    """What reads a verdict later (evolve's parent profiles, the report) takes the GPU it was
    timed on from it, not from device.json, which is the campaign's first GPU's."""
    peaks = {"name": "NVIDIA H100 80GB HBM3", "bandwidth_gbs": 3000.0, "flops_tflops": 50.0,
             "measured_with": {"copy_mb": 256}}
    assert peaks_used(peaks) == {"name": "NVIDIA H100 80GB HBM3", "bandwidth_gbs": 3000.0,
                                 "flops_tflops": 50.0}
    assert peaks_used(None) is None and peaks_used({}) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_baseline_timed_on_another_gpu_is_timed_again_on_this_one(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSAY_BASELINE_CACHE", str(tmp_path / "baselines"))
    cfg = app.compose(["target=cuda", "tasks=ci", "baselines.compile=false"])
    task = app.load_task(cfg, app.task_refs(cfg)[0][0].id, "cuda")
    here = torch.cuda.get_device_name()
    elsewhere = {"task": task.id, "device": "cuda", "eager_ms": 1e6, "compile_ms": None,
                 "device_name": "NVIDIA H200 (another GPU)", "target": "cuda"}
    peaks = {"name": "NVIDIA H200 (another GPU)", "bandwidth_gbs": 1e9, "flops_tflops": 1e9}
    shared: dict = {}
    baseline, peaks_here = this_gpu(cfg, task, elsewhere, peaks, shared)
    assert baseline["device_name"] == here and 0 < baseline["eager_ms"] < 1e6, baseline
    assert "NVIDIA H200 (another GPU)" in shared["baseline_retimed"], shared
    assert shared["baseline_here_s"] > 0
    assert peaks_here["name"] == here and peaks_here["bandwidth_gbs"] < 1e9
    # this GPU's baseline: kept as it is, and the second time from the cache
    again, _ = this_gpu(cfg, task, baseline, peaks_here, {})
    assert again is baseline
    retimed, _ = this_gpu(cfg, task, elsewhere, peaks, {})  # (from the baseline cache)
    assert retimed["eager_ms"] == baseline["eager_ms"]


def test_the_verify_step_prewarms_only_a_baseline_this_gpu_must_time_again(monkeypatch):
    """``baselines.prewarm``: before the device is taken, torch.compile on fake tensors for a
    baseline that ``this_gpu`` will time again (another GPU's, not in this one's cache), and
    for no other: this GPU's own, a cached one, prewarm off."""
    import assay.bench.baseline_cache
    import assay.bench.device
    import assay.bench.prewarm
    from assay.steps.verify import prewarmed_baseline

    warmed, cached = [], {"now": False}
    monkeypatch.setattr(assay.bench.device, "device_name", lambda device: "NVIDIA H100")
    monkeypatch.setattr(assay.bench.baseline_cache, "baseline_is_cached",
                        lambda *a, **k: cached["now"])
    monkeypatch.setattr(assay.bench.prewarm, "prewarm", lambda path, size, device, mode,
                        **kw: warmed.append(device) or {"seconds": 2.5, "error": "x"})
    cfg = app.compose(["target=cuda", "tasks=ci", "baselines.prewarm=true"])
    task = app.load_task(cfg, app.task_refs(cfg)[0][0].id, "cuda")
    h200 = {"eager_ms": 1.0, "device_name": "NVIDIA H200"}
    shared: dict = {}
    prewarmed_baseline(cfg, task, h200, shared)
    assert warmed == ["cuda"] and shared == {"baseline_prewarm_s": 2.5,
                                             "baseline_prewarm_error": "x"}, shared
    for baseline, now, config in (({"eager_ms": 1.0, "device_name": "NVIDIA H100"}, False, cfg),
                                  (h200, True, cfg),
                                  (h200, False, app.compose(["target=cuda", "tasks=ci",
                                                             "baselines.prewarm=false"]))):
        cached["now"], shared = now, {}
        prewarmed_baseline(config, task, baseline, shared)
        assert warmed == ["cuda"] and shared == {}, (baseline, now)
