"""benchmarks/kb_retime.py: which of a campaign's baselines are timed again on this GPU (no
device: a campaign folder and task files written here; the timing itself is GPU work)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("kb_retime", REPO / "benchmarks/kb_retime.py")
kr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kr)


def test_the_baselines_of_another_gpu_and_those_with_a_norm_are_timed_again(tmp_path):
    campaign, source = tmp_path / "kb", tmp_path / "KernelBench"
    (campaign / "baselines").mkdir(parents=True)
    (source / "level1").mkdir(parents=True)
    (campaign / "device.json").write_text(json.dumps({"name": "NVIDIA H200"}))
    rows = {"L1_1_Relu": {"eager_ms": 1.0},                                   # device.json's
            "L1_2_Gelu": {"eager_ms": 1.0, "device_name": "NVIDIA H100"},
            "L1_3_BatchNorm": {"eager_ms": 1.0, "device_name": "NVIDIA H100"},
            "L1_4_Declined": {"eager_ms": None, "skipped": "a decline"}}
    paths = {}
    for task, row in rows.items():
        (campaign / "baselines" / f"{task}.json").write_text(json.dumps(row))
        number, name = task.split("_")[1:]
        body = "nn.BatchNorm2d(3)" if "Norm" in name else "nn.ReLU()"
        paths[task] = source / "level1" / f"{number}_{name}.py"
        paths[task].write_text(f"m = {body}\n")
    assert kr.to_retime(campaign, "NVIDIA H100") == ["L1_1_Relu"]
    assert kr.to_retime(campaign, "NVIDIA H200") == ["L1_2_Gelu", "L1_3_BatchNorm"]
    assert kr.with_norms(campaign, paths) == ["L1_3_BatchNorm"]
    (campaign / "baselines" / "L1_5_Broken.json").write_text("{")
    with pytest.raises(SystemExit, match="L1_5_Broken.json: not JSON"):
        kr.to_retime(campaign, "NVIDIA H100")
