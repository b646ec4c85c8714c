"""The whole DAG with target=triton: the offline synthesizer writes Triton kernels, every step
runs them (on a machine without a GPU, verify and profile in Triton's interpreter, in the
sandbox; with one, compiled) and are accepted, and the report says what the kernels are. The
interpreter's times are not a GPU's: nothing here is about speed."""

from __future__ import annotations

import json
import subprocess

import pytest

from assay.layout import read_json
from helpers import env, snakemake

pytestmark = pytest.mark.slow
pytest.importorskip("triton")

# ReLU, Softmax, matmul; one translation and one child of it in one generation of evolution,
# and no torch.compile baselines (inductor's C++ builds): every step of the DAG still runs its
# Triton kernels (in the interpreter on cpu, seconds per verification), a quarter of the work
OVERRIDES = ("campaign=tri", "tasks=ci", "evolve=ci", "target=triton", "evolve.generations=1",
             "evolve.translate_n=1", "evolve.children=1", "baselines.compile=false")


def test_a_triton_campaign_runs_end_to_end(tmp_path):
    from assay.gpu import visible_gpus

    device = "cuda" if visible_gpus() else "cpu"  # target=triton's device (compiled on a GPU)
    r = subprocess.run(snakemake(tmp_path, overrides=OVERRIDES), capture_output=True, text=True,
                       env=env(), timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    root = tmp_path / "results" / "tri"
    for task, kernel in (("L1_1_ReLU", "assay_elementwise"), ("L1_10_Softmax", "assay_row"),
                         ("L1_14_Square_Matmul", "assay_gemm")):
        tdir = root / "offline" / task
        codes = [p.read_text() for p in sorted((tdir / "gen_0" / "candidates").glob("*.py"))]
        assert codes and all("@triton.jit" in c and "load_library" not in c for c in codes)
        verdicts = [json.loads(p.read_text()) for p in sorted(tdir.glob("gen_*/verdicts/*.json"))]
        assert verdicts and all(v["accepted"] for v in verdicts), \
            [(v["reasons"], v["error"]) for v in verdicts]
        launched = f"triton::{kernel}" if device == "cpu" else kernel
        assert all(v["device"].startswith(device) and launched in v["kernels_launched"]
                   for v in verdicts)
    relu = root / "offline" / "L1_1_ReLU"
    assert read_json(root / "baselines" / "L1_1_ReLU.json")["kernels"] == "triton"
    assert "assay_elementwise" in read_json(relu / "profile.json")["torch_profile"]
    assert f"target: {device}, Triton kernels;" in (root / "report.html").read_text()
