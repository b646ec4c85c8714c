"""The roofline floor is only as good as the measured peaks: a copy measured on a busy machine
puts the floor too high, and an honest kernel under it would be called impossible. The device
cache keeps the highest measurement, and a runtime under the floor is judged again against the
peaks measured now before it is rejected; the floor is never above the fastest baseline."""

from __future__ import annotations

import json

from assay.bench import device as device_mod
from assay.records import Verdict
from assay.verify.harness import _check_speed
from assay.verify.settings import VerifyConfig


def test_the_cache_keeps_the_highest_measurement(tmp_path, monkeypatch):
    monkeypatch.setattr(device_mod, "_cache_file", lambda name: tmp_path / f"{name}.json")
    rates = iter([18.0, 40.0, 25.0])
    monkeypatch.setattr(device_mod, "measure_peaks", lambda dev: {
        "name": "fake", "bandwidth_gbs": next(rates), "flops_tflops": 0.1})
    assert device_mod.peaks("cpu")["bandwidth_gbs"] == 18.0  # first measurement, cached
    assert device_mod.peaks("cpu")["bandwidth_gbs"] == 18.0  # from the cache
    assert device_mod.peaks("cpu", refresh=True)["bandwidth_gbs"] == 40.0
    assert device_mod.peaks("cpu", refresh=True)["bandwidth_gbs"] == 40.0  # 25 is lower: kept
    cached = json.loads((tmp_path / f"{device_mod.device_name('cpu')}.json").read_text())
    assert cached["bandwidth_gbs"] == 40.0


def test_a_runtime_under_a_stale_floor_is_judged_against_the_peaks_measured_now():
    cfg = VerifyConfig()
    honest = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    honest.runtime_ms, honest.roofline_ms = 0.9, 1.88  # floor from a copy measured under load
    _check_speed(honest, cfg, remeasure=lambda: 0.80)
    assert honest.checks["roofline"]["passed"] and honest.roofline_ms == 0.80
    faked = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    faked.runtime_ms, faked.roofline_ms = 0.05, 1.88  # work skipped: under any floor
    _check_speed(faked, cfg, remeasure=lambda: 0.80)
    assert not faked.checks["roofline"]["passed"] and "roofline" in faked.reasons
    slower = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    slower.runtime_ms, slower.roofline_ms = 0.05, 0.80  # a busier machine now: floor kept
    _check_speed(slower, cfg, remeasure=lambda: 1.5)
    assert slower.roofline_ms == 0.80 and "roofline" in slower.reasons


def test_a_failed_remeasurement_leaves_the_floor_standing(monkeypatch):
    """Measuring again needs buffers of its own; where they do not fit (a device the task's
    references nearly fill) the given floor stands and the verdict is still reached."""
    from assay.verify import harness

    def no_room(device, refresh=False):
        raise RuntimeError("CUDA out of memory. Tried to allocate 256.00 MiB")

    monkeypatch.setattr(device_mod, "peaks", no_room)
    given = {"name": "cpu-x86_64-unknown-1t", "bandwidth_gbs": 18.0, "flops_tflops": 0.05}
    assert harness._remeasured_roofline("cpu", {"min_bytes": 1e6, "flops": 0.0}, given) is None
    v = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    v.runtime_ms, v.roofline_ms = 0.05, 1.88
    _check_speed(v, VerifyConfig(), remeasure=lambda: harness._remeasured_roofline(
        "cpu", {"min_bytes": 1e6, "flops": 0.0}, given))
    assert v.roofline_ms == 1.88 and "roofline" in v.reasons


def test_the_floor_is_never_above_what_the_baselines_ran_in():
    """Peaks measured on a busy machine put MeanDim's floor at 0.92 ms where eager ran in 0.55
    ms: the reference itself shows the task can run that fast, so the floor comes down to the
    fastest baseline, and only what beats that by the margin is called impossible."""
    cfg = VerifyConfig()

    def judged(runtime: float, compile_ms: float | None = None) -> Verdict:
        v = Verdict(candidate="c", task="t", device="cpu", policy="strict")
        v.runtime_ms, v.roofline_ms = runtime, 0.92
        v.baseline_eager_ms, v.baseline_compile_ms = 0.553, compile_ms
        _check_speed(v, cfg, remeasure=lambda: 1.5)  # measured again, as busy: no help
        return v

    honest = judged(0.512)
    assert honest.checks["roofline"]["passed"] and honest.roofline_ms == 0.553
    assert judged(0.40, compile_ms=0.50).roofline_ms == 0.50  # the faster of the two
    faked = judged(0.05)  # work skipped: under any floor the reference allows
    assert "roofline" in faked.reasons
    slow = Verdict(candidate="c", task="t", device="cpu", policy="strict")
    slow.runtime_ms, slow.roofline_ms, slow.baseline_eager_ms = 0.05, 0.92, 2.0
    _check_speed(slow, cfg)  # a baseline slower than the floor leaves the floor as it is
    assert slow.roofline_ms == 0.92 and "roofline" in slow.reasons


def test_floor_counts_only_the_flops_no_algorithm_avoids():
    """A record's ``floor_flops`` (convolutions left out) sets the compute floor; a record made
    before it existed counts every FLOP."""
    from assay.verify.harness import roofline_ms

    peaks = {"bandwidth_gbs": 1000.0, "flops_tflops": 1.0}
    conv_heavy = {"min_bytes": 1e9, "flops": 1e12, "floor_flops": 1e9}
    assert roofline_ms(conv_heavy, peaks) == 1.0  # the bytes' 1 ms, not the conv's 1000 ms
    assert roofline_ms({"min_bytes": 1e9, "flops": 1e12}, peaks) == 1000.0
