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
