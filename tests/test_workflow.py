"""One way to run a campaign (fast checks; the DAG itself runs in test_pipeline.py): the
commands `make run`, `make dry-run`, `make rerun` and `assay run` build, and the verdicts a
rerun must judge again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assay.app import UserError
from assay.cli import rerun_files, snakemake_command
from assay.layout import is_fresh
from conftest import REPO

CI = ["campaign=ci", "tasks=ci", "evolve=ci"]


def test_words_with_equals_are_overrides_and_targets_come_first():
    cmd = snakemake_command([*CI, "results/ci/offline/L1_1_ReLU/profile.json"], 2,
                            forcerun=["a.json", "b.json"], extra=["--keep-incomplete"])
    assert cmd[:3] == [sys.executable, "-m", "snakemake"]
    rest = cmd[3:]
    # --forcerun and --config take every word after them: the target is placed before both.
    assert rest == ["--cores", "2", "results/ci/offline/L1_1_ReLU/profile.json",
                    "--forcerun", "a.json", "b.json",
                    "--config", "overrides=[campaign=ci,tasks=ci,evolve=ci]",
                    "--keep-incomplete"]


def test_no_overrides_means_workflow_yaml_as_for_a_bare_snakemake():
    assert "--config" not in snakemake_command([], 2, dry_run=True)
    assert "--dry-run" in snakemake_command([], 2, dry_run=True)


def test_assay_run_outside_the_checkout_uses_the_packages_workflow_profile(tmp_path):
    """Snakemake finds profiles/default in the folder it runs in or beside the Snakefile; the
    package's Snakefile has none beside it, so from any other folder `assay run` names the
    package's (without it a killed campaign's resume stops at its incomplete files)."""
    from assay.cli import profile_args

    args = profile_args([], cwd=tmp_path)
    assert args[0] == "--workflow-profile"
    assert (Path(args[1]) / "config.yaml").read_text() == (
        REPO / "profiles" / "default" / "config.yaml").read_text()
    assert profile_args([], cwd=REPO) == []  # a checkout's own, found by Snakemake
    assert profile_args(["--workflow-profile", "slurm"], cwd=tmp_path) == []


def test_rerun_forces_the_first_file_of_the_task_per_backend():
    assert rerun_files([*CI, "llms=[offline,other]"], ["L1_1_ReLU"]) == [
        "results/ci/offline/L1_1_ReLU/gen_0/proposals.json",
        "results/ci/other/L1_1_ReLU/gen_0/proposals.json"]
    with pytest.raises(UserError, match="L1_999_Nope: not a task of campaign ci"):
        rerun_files(CI, ["L1_999_Nope"])


def test_assay_run_with_an_unknown_task_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, "-m", "assay.cli", "run", "--rerun", "L1_999_Nope", *CI],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: --rerun L1_999_Nope"), r.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("goal, extra, want", [
    ("run", [], "assay run --cores 2 campaign=ci tasks=ci evolve=ci"),
    ("dry-run", [], "assay run --cores 2 campaign=ci tasks=ci evolve=ci --dry-run"),
    ("rerun", ["TASK=L1_1_ReLU"],
     "assay run --cores 2 campaign=ci tasks=ci evolve=ci --rerun L1_1_ReLU"),
])
def test_make_targets_call_assay_run(goal, extra, want):
    """`make run|dry-run|rerun` all go through `assay run` (one builder of the command)."""
    r = subprocess.run(["make", "-n", "-C", str(REPO), goal, "CAMPAIGN=ci",
                        "OVERRIDES=tasks=ci evolve=ci", *extra],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert want in " ".join(r.stdout.split()), r.stdout


def test_the_default_overrides_live_in_the_workflow_config():
    import yaml

    from assay.app import workflow_overrides

    assert workflow_overrides() == ["campaign=default"]  # what a bare `snakemake` runs with
    assert rerun_files(workflow_overrides(), ["L1_1_ReLU"]) == [
        "results/default/offline/L1_1_ReLU/gen_0/proposals.json"]
    profile = yaml.safe_load((REPO / "workflow/profiles/default/config.yaml").read_text())
    assert "params" not in profile["rerun-triggers"] and "cpu_timing=2" in profile["resources"]


def test_a_verdict_is_fresh_only_when_written_after_its_inputs(tmp_path):
    proposals, baseline, verdict = (tmp_path / n for n in ("p.json", "b.json", "v.json"))
    for f in (proposals, baseline):
        f.write_text("{}")
    assert not is_fresh(verdict, proposals, baseline)  # not judged yet
    verdict.write_text("{}")
    assert is_fresh(verdict, proposals, baseline, tmp_path / "missing.json")
    later = time.time_ns() + 10**9
    os.utime(baseline, ns=(later, later))  # the baseline timed again after the verdict
    assert not is_fresh(verdict, proposals, baseline)
