"""The whole DAG with target=triton on a machine without a GPU: the offline synthesizer writes
Triton kernels, every step runs them (verify and profile in Triton's interpreter, in the
sandbox), what has no Triton form is declined with its reason, and the report says what the
kernels are. The interpreter's times are not a GPU's: nothing here is about speed."""

from __future__ import annotations

import json
import subprocess

import pytest

from assay.layout import read_json
from helpers import env, snakemake

pytestmark = pytest.mark.slow
pytest.importorskip("triton")

OVERRIDES = ("campaign=tri", "tasks=ci", "evolve=ci", "target=triton",
             "tasks.include=[L1_1_ReLU,L1_10_Softmax]")


def test_a_triton_campaign_runs_end_to_end_in_the_interpreter(tmp_path):
    r = subprocess.run(snakemake(tmp_path, overrides=OVERRIDES), capture_output=True, text=True,
                       env=env(), timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    root = tmp_path / "results" / "tri"
    relu = root / "offline" / "L1_1_ReLU"
    codes = [p.read_text() for p in sorted((relu / "gen_0" / "candidates").glob("*.py"))]
    assert codes and all("@triton.jit" in c and "load_library" not in c for c in codes)
    verdicts = [json.loads(p.read_text()) for p in sorted(relu.glob("gen_*/verdicts/*.json"))]
    assert verdicts and all(v["accepted"] for v in verdicts), [v["reasons"] for v in verdicts]
    assert all(v["device"] == "cpu" and "triton::assay_elementwise" in v["kernels_launched"]
               for v in verdicts)
    softmax = read_json(root / "offline" / "L1_10_Softmax" / "gen_0" / "proposals.json")
    assert not softmax["candidates"]
    assert "row family in Triton" in softmax["declined"][0]["reason"]
    assert read_json(root / "baselines" / "L1_1_ReLU.json")["kernels"] == "triton"
    assert "triton::assay_elementwise" in read_json(relu / "profile.json")["torch_profile"]
    assert "target: cpu, Triton kernels;" in (root / "report.html").read_text()
