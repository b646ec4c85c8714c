"""Baselines cached per (task, device, torch version, timing config)."""

from __future__ import annotations

import pytest

from assay.bench.baseline_cache import baseline_key, cached_baseline
from assay.bench.timing import TimingConfig
from assay.tasks.model import Task
from helpers import REPO

RELU = REPO / "data/tasks/level1/1_ReLU.py"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASSAY_BASELINE_CACHE", str(tmp_path / "baselines"))


def test_second_candidate_reuses_the_baseline_and_refresh_retimes():
    task, cfg, timed = Task.from_file(RELU, size="small"), TimingConfig(), []

    def time_it():
        timed.append(1)
        return {"eager_ms": 1.5, "compile_ms": 1.2}

    first, hit1 = cached_baseline(task, "cpu", cfg, True, time_it)
    second, hit2 = cached_baseline(task, "cpu", cfg, True, time_it)
    assert (hit1, hit2, len(timed)) == (False, True, 1)
    assert second["eager_ms"] == first["eager_ms"] == 1.5
    _, hit3 = cached_baseline(task, "cpu", cfg, True, time_it, refresh=True)
    assert not hit3 and len(timed) == 2
    cached_baseline(task, "cpu", cfg, False, time_it)  # no torch.compile: another baseline
    assert len(timed) == 3


def test_key_covers_content_size_device_torch_and_timing(tmp_path):
    small, large = Task.from_file(RELU, size="small"), Task.from_file(RELU, size="large")
    edited = tmp_path / "1_ReLU.py"
    edited.write_text(RELU.read_text() + "\n# edited\n")
    cfg = TimingConfig()
    base = baseline_key(small, "H100", "2.11", cfg, True)
    others = [baseline_key(large, "H100", "2.11", cfg, True),
              baseline_key(Task.from_file(edited, size="small"), "H100", "2.11", cfg, True),
              baseline_key(small, "H200", "2.11", cfg, True),
              baseline_key(small, "H100", "2.13", cfg, True),
              baseline_key(small, "H100", "2.11", TimingConfig(budget_s=0.5), True),
              baseline_key(small, "H100", "2.11", cfg, True, "max-autotune")]
    assert base == baseline_key(small, "H100", "2.11", cfg, True)
    assert len({base, *others}) == 1 + len(others)
