"""Issue #7: a campaign killed with SIGKILL at 10 random points, resumed each time, ends with the
same archive as an uninterrupted run (the offline proposer's answers are its seeded choices, as
an LLM campaign's are its recorded answers).

"The same" is every column that does not measure something: runtimes, speedups, the largest
error on the verifier's secret inputs and the profiles (clang-tidy's too: only the fastest
kernel is profiled) differ between any two runs of a kernel,
killed or not. The campaign keeps its choices independent of those measurements: one
translation, one round of evolution from it (selection between parents by speed would let
timing noise pick a different parent in two uninterrupted runs too).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import env, snakemake

pytestmark = pytest.mark.slow
OVERRIDES = ["campaign=kr", "tasks=ci", "tasks.include=[L1_10_Softmax]", "evolve=ci",
             "evolve.generations=1", "evolve.translate_n=1", "evolve.children=2",
             "baselines.compile=false"]
MEASURED = {"CUDA_Runtime", "PyTorch_Native_Runtime", "PyTorch_Compile_Runtime",
            "CUDA_Speedup_Native", "CUDA_Speedup_Compile", "Max_Diff", "NCU_Profile",
            "Torch_Profile",
            # filled for the profiled kernel only, which the campaign picks by its runtime
            "Clang_Tidy"}
KILLS = 10


def archive(workdir: Path):
    import polars as pl

    frame = pl.read_parquet(workdir / "results" / "kr" / "archive" / "level_1.parquet")
    keep = [c for c in frame.columns if c not in MEASURED]
    return frame.select(keep).sort("Candidate_ID"), frame.height


def test_ten_sigkills_at_random_points_leave_the_same_archive(tmp_path):
    calm, killed = tmp_path / "calm", tmp_path / "killed"
    t0 = time.monotonic()
    r = subprocess.run(snakemake(calm, overrides=OVERRIDES), capture_output=True, text=True,
                       env=env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    span = time.monotonic() - t0

    # Kill points: random moments of each attempt, from Snakemake's start-up (which is a point
    # too) to well into the jobs; each resumed attempt starts where the last one was killed.
    rng = random.Random(20261122)
    kills = attempts = 0
    while kills < KILLS:
        attempts += 1
        assert attempts <= 3 * KILLS, f"only {kills} kills landed in {attempts} attempts"
        proc = subprocess.Popen(snakemake(killed, overrides=OVERRIDES), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
        try:
            proc.wait(timeout=rng.uniform(1.0, max(3.0, span / 6)))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        assert proc.returncode == 0, "an attempt failed instead of resuming"
        break  # it finished before this kill point: the campaign is done
    assert kills == KILLS, f"the campaign finished after {kills} kills"
    r = subprocess.run(snakemake(killed, overrides=OVERRIDES), capture_output=True, text=True,
                       env=env(), timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]

    want, n_want = archive(calm)
    got, n_got = archive(killed)
    assert n_want >= 3  # the translation and its two children, judged
    assert n_got == n_want
    assert got.equals(want), (got.to_dicts(), want.to_dicts())
