"""Baselines cached per (task, device, torch version, timing config), and task records
per (task, device, torch version)."""

from __future__ import annotations

import json
import math

import pytest

from assay.bench.baseline_cache import baseline_key, cached_baseline, cached_record, record_key
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


def test_the_verify_step_times_another_gpus_baseline_again_once_and_names_this_gpu(
        monkeypatch):
    """steps/verify.this_gpu: a campaign baseline of another GPU is timed again here
    (bench.baseline.baseline_here, kb_retime.py's too), cached and named with this GPU; one of
    this GPU is used as it is."""
    import assay.bench.baseline as baseline
    import assay.bench.device as device
    from assay.app import compose
    from assay.steps import verify as step

    calls = []
    monkeypatch.setattr(device, "device_name", lambda dev="cuda": "GPU B")
    monkeypatch.setattr(baseline, "time_reference", lambda *a, **k: calls.append(1) or {
        "eager_ms": 2.0, "compile_ms": 1.0})
    cfg, task = compose(["verify=strict"]), Task.from_file(RELU, size="small")
    other = {"eager_ms": 1.0, "device_name": "GPU A"}
    for _ in range(2):  # timed the first time, from the cache the second
        shared = {}
        got, _peaks = step.this_gpu(cfg, task, other, None, shared)
        assert (got["eager_ms"], got["device_name"], len(calls)) == (2.0, "GPU B", 1)
        assert shared["baseline_retimed"] == ("the campaign's baseline was timed on GPU A, "
                                              "not on this GPU B")
    mine = {"eager_ms": 1.0, "device_name": "GPU B"}
    assert step.this_gpu(cfg, task, mine, None, {})[0] is mine and len(calls) == 1


def test_a_task_with_a_norm_takes_the_task_modes_version_in_its_keys(tmp_path, monkeypatch):
    """Baselines and records of a task with BatchNorm made before its norms ran on batch
    statistics (instantiate.task_mode) are not reused; other tasks keep their keys."""
    from assay.tasks import instantiate

    bn = tmp_path / "2_BN.py"
    bn.write_text(RELU.read_text().replace("torch.relu(x)", "nn.BatchNorm2d(3)(x)"))
    relu, norm, cfg = Task.from_file(RELU), Task.from_file(bn), TimingConfig()
    before = {t.path: (baseline_key(t, "H100", "2.11", cfg, True), record_key(t, "H100", "2.11"))
              for t in (relu, norm)}
    monkeypatch.setattr(instantiate, "TASK_MODE", "another mode")
    after = {t.path: (baseline_key(t, "H100", "2.11", cfg, True), record_key(t, "H100", "2.11"))
             for t in (relu, norm)}
    assert after[relu.path] == before[relu.path]
    assert all(a != b for a, b in zip(after[norm.path], before[norm.path]))


# --------------------------------------------------------------------------------------------
# Task records (cost + degeneracy), cached beside the baselines.

def _record_file(task):
    from assay.bench.baseline_cache import cache_root

    [path] = cache_root().glob(f"{task.id}-record-*.json")
    return path


def test_second_call_reuses_the_record_and_refresh_recomputes():
    task, computed = Task.from_file(RELU, size="small"), []

    def compute():
        computed.append(1)
        return {"flops": 2.0, "inputs": [{"shape": (4, 8), "dtype": "float32"}],
                "degeneracy": {"degenerate": False, "relative_spread": float("nan"),
                               "weight_sensitivity": None, "why": ""}}

    first, hit1 = cached_record(task, "cpu", compute)
    second, hit2 = cached_record(task, "cpu", compute)
    assert (hit1, hit2, len(computed)) == (False, True, 1)
    # a fresh record is returned as the cache holds it (the tuple a list), so the two are equal
    assert first["inputs"] == second["inputs"] == [{"shape": [4, 8], "dtype": "float32"}]
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert math.isnan(second["degeneracy"]["relative_spread"])
    assert "cache_key" not in second  # the key stays in the file, out of the record
    _, hit3 = cached_record(task, "cpu", compute, refresh=True)
    assert not hit3 and len(computed) == 2
    cached_record(Task.from_file(RELU, size="large"), "cpu", compute)  # another size
    assert len(computed) == 3


def test_a_cached_record_equals_the_fresh_one():
    from assay.tasks.analyze import task_record

    task = Task.from_file(RELU, size="small")
    fresh = task_record(task, "cpu")
    stored, hit1 = cached_record(task, "cpu", lambda: fresh)
    cached, hit2 = cached_record(task, "cpu", lambda: pytest.fail("computed again"))
    assert (hit1, hit2) == (False, True)
    assert json.dumps(cached, sort_keys=True) == json.dumps(stored, sort_keys=True) == \
        json.dumps(fresh, sort_keys=True)


def test_record_key_covers_content_size_device_and_torch(tmp_path):
    small, large = Task.from_file(RELU, size="small"), Task.from_file(RELU, size="large")
    edited = tmp_path / "1_ReLU.py"
    edited.write_text(RELU.read_text() + "\n# edited\n")
    base = record_key(small, "H100", "2.11")
    others = [record_key(large, "H100", "2.11"),
              record_key(Task.from_file(edited, size="small"), "H100", "2.11"),
              record_key(small, "H200", "2.11"),
              record_key(small, "H100", "2.13")]
    assert base == record_key(small, "H100", "2.11")
    assert len({base, *others}) == 1 + len(others)
    # not a baseline's key: the two never share a file
    assert base != baseline_key(small, "H100", "2.11", TimingConfig(), True)


@pytest.mark.parametrize("damage", ["{\"record\": {\"flops\": 1.0", "", "[]",
                                    "{\"cache_key\": \"x\"}", "{\"record\": null}"])
def test_a_damaged_record_file_is_computed_again(damage):
    task, computed = Task.from_file(RELU, size="small"), []

    def compute():
        computed.append(1)
        return {"flops": 2.0, "degeneracy": {"degenerate": False}}

    cached_record(task, "cpu", compute)
    _record_file(task).write_text(damage)
    again, hit = cached_record(task, "cpu", compute)
    assert (hit, len(computed), again["flops"]) == (False, 2, 2.0)
    assert json.loads(_record_file(task).read_text())["record"] == again  # repaired
    assert cached_record(task, "cpu", compute) == (again, True) and len(computed) == 2


def test_a_damaged_baseline_file_is_timed_again():
    from assay.bench.baseline_cache import cache_root

    task, cfg, timed = Task.from_file(RELU, size="small"), TimingConfig(), []

    def time_it():
        timed.append(1)
        return {"eager_ms": 1.5}

    cached_baseline(task, "cpu", cfg, True, time_it)
    [path] = [p for p in cache_root().glob(f"{task.id}-*.json") if "-record-" not in p.name]
    path.write_text('{"eager_ms": 1.')
    again, hit = cached_baseline(task, "cpu", cfg, True, time_it)
    assert (hit, len(timed), again["eager_ms"]) == (False, 2, 1.5)
    assert cached_baseline(task, "cpu", cfg, True, time_it)[1] and len(timed) == 2


def test_cli_verify_caches_the_record_and_retime_baseline_recomputes_it(tmp_path, monkeypatch):
    from assay import cli
    from assay.bench import device as device_mod
    from assay.records import Verdict
    from assay.tasks import analyze
    from assay.verify import harness

    analyzed, seen = [], []
    real_cost = analyze.cost
    monkeypatch.setattr(analyze, "cost", lambda task: analyzed.append(1) or real_cost(task))
    monkeypatch.setattr(device_mod, "peaks", lambda device: {"name": "test",
                                                             "bandwidth_gbs": 10.0,
                                                             "flops_tflops": 1.0})

    def fake_verify(task, cand, device, cfg, baseline, record, peaks, times=None, plan=None,
                    prepared=None):
        seen.append((record, dict(times)))
        v = Verdict(candidate=cand.stem, task=task.id, device=device, policy=cfg.policy)
        v.check("compiles", True)
        return v.finish()

    monkeypatch.setattr(harness, "verify", fake_verify)
    cand = tmp_path / "c.py"
    cand.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    argv = ["verify", "--task", str(RELU), "--candidate", str(cand), "--device", "cpu",
            "--size", "small", "--no-baseline"]
    for extra in ([], [], ["--retime-baseline"]):
        assert cli.main(argv + extra) == 0
    assert [times["record_cached"] for _, times in seen] == ["no", "yes", "no"]
    assert len(analyzed) == 2
    fresh, cached, _ = (json.dumps(r, sort_keys=True) for r, _ in seen)
    assert cached == fresh and '"degeneracy"' in cached and '"flops"' in cached


def _stamped(flag: str = "", hold=None):
    """A trusted job: when it started (also said by creating ``flag``), and when it got the
    lease (what time_reference times under)."""
    import time
    from pathlib import Path

    started = time.monotonic()
    if flag:
        Path(flag).touch()
    with hold():
        return started, time.monotonic()


def test_a_baseline_submitted_early_times_only_once_the_lease_is_given_back(tmp_path):
    """`assay verify` on cpu sends the baseline's job to its process before it plans and
    prepares, holding the lease: the job starts (compiles) beside it and times only after."""
    import time

    from assay.bench.baseline_cache import TrustedChild

    flag = tmp_path / "started"
    child = TrustedChild()
    child.lease.acquire()
    child.submit(_stamped, str(flag), held=True)
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the job has started; it must not time while the lease is held
    given_back = time.monotonic()
    child.lease.release()
    started, timed = child.result()
    assert started < given_back <= timed


def test_closing_a_child_stops_a_job_whose_result_is_not_wanted():
    import time

    from assay.bench.baseline_cache import TrustedChild

    child = TrustedChild()
    child.lease.acquire()  # (the job could never time: it waits for the lease)
    child.submit(_stamped, held=True)
    t = time.monotonic()
    child.close()
    assert time.monotonic() - t < 10 and not child.proc.is_alive()


def test_closing_a_child_never_sent_a_job_cuts_its_imports_short():
    """A cached baseline needs no process: closing it stops it at once (SIGTERM), where
    telling it to exit waited for torch.compile's imports (5.6 s of a 17 s `assay verify`)."""
    import signal

    from assay.bench.baseline_cache import TrustedChild

    child = TrustedChild()
    child.close()
    assert child.proc.exitcode == -signal.SIGTERM
    child.close()  # twice: nothing left to stop


def test_warm_children_are_started_one_task_ahead_on_a_gpu_only():
    """Batch verification times each task's baseline in a trusted process of its own; on a GPU
    the next one is started when the last one's timings are done, so its imports run while
    the task's candidates verify. On cpu none is started ahead (it would share timed cores)."""
    import os

    from assay.bench.baseline_cache import WarmChildren

    ahead = WarmChildren(ahead=True)
    first = ahead.take()
    ahead.refill()
    spare = ahead._spare
    assert spare is not None and spare.proc.is_alive() and spare is not first
    pids = {first.run(os.getpid), ahead.take().run(os.getpid)}
    assert len(pids) == 2 and os.getpid() not in pids and ahead._spare is None
    ahead.refill()
    last = ahead._spare
    ahead.close()  # the spare nobody took is ended with the batch
    assert ahead._spare is None and not last.proc.is_alive()

    on_cpu = WarmChildren(ahead=False)
    child = on_cpu.take()
    on_cpu.refill()
    assert on_cpu._spare is None
    child.close()
