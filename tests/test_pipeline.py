"""The whole DAG on the cpu target: dry run, lint, and a campaign killed mid-way and resumed.

The campaign is the CI one (config tasks=ci, evolve=ci): three small tasks, two generations
after translation, the offline synthesizer. Runs in a temporary working directory. One campaign
serves both DAG tests (the `ci_campaign` fixture): the README's bare snakemake starts it, a
SIGKILL stops it mid-way, the same command finishes it; the resume test reads it, the README test
works on a copy of its own. (`assay run`, which `make run` calls, making the CI campaign from an
empty folder: tests/test_install.py, from the installed wheel.) pytest-xdist keeps both tests on
one worker under `--dist loadgroup` (`make test`); elsewhere each worker makes the campaign.

The campaign is made without torch.compile baselines (`baselines.compile=false`, its one override
beyond the README's): inductor's C++ builds cost 10-20 s of CPU per task, and none of these
tests reads a compile timing (a compile that failed would only be recorded). The README's own
commands then find nothing to do (a campaign's settings are those of its first run). The
compile baseline itself, through the baseline step: test_the_baseline_step_times_torch_compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# CI: the README's CI campaign, make run CAMPAIGN=ci OVERRIDES="tasks=ci evolve=ci"
from helpers import CI, env, snakemake  # noqa: F401 - shared by the DAG tests

pytestmark = pytest.mark.slow
STAGES = ("extract", "baseline", "translate", "evolve", "verify", "profile", "track", "export",
          "report")


def test_dry_run_lists_every_stage(tmp_path):
    r = subprocess.run(snakemake(tmp_path, "-n"), capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    for stage in STAGES:
        assert f"rule {stage}:" in out or f"\n{stage} " in out, stage


def test_lists_inside_the_overrides_list(tmp_path):
    """`--config overrides='[...,tasks.include=[L1_1_ReLU]]'`: Snakemake cannot parse the inner
    list; the Snakefile splits the text at its top-level commas."""
    cmd = snakemake(tmp_path, "-n")
    cmd[-1] = ("overrides=[campaign=ci,tasks=ci,llms=[offline],"
                                 "tasks.include=[L1_1_ReLU]]")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "L1_1_ReLU" in out and "L1_10_Softmax" not in out


def test_lint_is_clean(tmp_path):
    r = subprocess.run(snakemake(tmp_path, "--lint"), capture_output=True, text=True, env=env())
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "Lints for" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]


def test_the_baseline_step_times_torch_compile(tmp_path):
    """One baseline job of the README's CI campaign, torch.compile baseline included (on by
    default, `baselines.compile`): inductor compiles the reference (its C++ build, outside the
    CPU lease) and the compiled reference is timed beside eager. A failed compile would only be
    recorded (`compile_error`), so a campaign finishing proves nothing of it; here it must
    time."""
    target = "results/ci/baselines/L1_1_ReLU.json"
    r = subprocess.run(snakemake(tmp_path, target), capture_output=True, text=True, env=env(),
                       timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert {rule for rule, _ in jobs_run(r.stdout + r.stderr)} == {"extract", "baseline"}
    out = json.loads((tmp_path / target).read_text())
    assert "compile_error" not in out, out
    assert out["compile_ms"] > 0 and out["eager_ms"] > 0, out
    log = (tmp_path / "results/ci/logs/baseline/L1_1_ReLU.log").read_text()
    assert "L1_1_ReLU: timing eager and torch.compile on cpu" in log, log[-3000:]


# The campaign's overrides: the README's CI campaign, without torch.compile baselines (see above).
CAMPAIGN = (*CI, "baselines.compile=false")


def verdict_files(results: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(results)): (p.stat().st_mtime_ns,
                                          hashlib.sha256(p.read_bytes()).hexdigest())
            for p in results.glob("ci/*/*/gen_*/verdicts/*.json")}


@pytest.fixture(scope="module")
def ci_campaign(tmp_path_factory) -> dict:
    """The CI campaign in a folder of its own: started by the README's bare snakemake (with
    CAMPAIGN's overrides), killed with SIGKILL once some candidates are judged (generation 1
    still to come), finished by the same command. Its verdict files at the kill, and the resuming
    run."""
    work = tmp_path_factory.mktemp("ci_campaign")
    results = work / "results"
    proc = subprocess.Popen(snakemake(work, overrides=CAMPAIGN), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
    deadline = time.monotonic() + 900
    # Kill once some candidates are judged, while generation 1 is still to come.
    while time.monotonic() < deadline and proc.poll() is None:
        done = verdict_files(results)
        if len(done) >= 2:
            break
        time.sleep(0.5)
    finished_first = proc.poll() is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = verdict_files(results)
    resumed = subprocess.run(snakemake(work, overrides=CAMPAIGN), capture_output=True, text=True,
                             env=env(), timeout=1500)
    return {"work": work, "finished_first": finished_first, "before": before,
            "resumed": resumed}


@pytest.mark.xdist_group("ci_campaign")
def test_killed_campaign_resumes_without_losing_or_redoing_work(ci_campaign):
    results = ci_campaign["work"] / "results"
    assert not ci_campaign["finished_first"], "the campaign finished before it could be killed"
    before = ci_campaign["before"]
    assert before, "nothing was judged before the kill"

    r = ci_campaign["resumed"]
    assert r.returncode == 0, r.stderr[-4000:]
    after = verdict_files(results)
    for path, stamp in before.items():
        assert after.get(path) == stamp, f"{path} was redone or lost on resume"

    c = results / "ci"
    # Every proposed candidate has exactly one verdict, in its own generation.
    for props in c.glob("*/*/gen_*/proposals.json"):
        ids = json.loads(props.read_text())["candidates"]
        for cid in ids:
            assert (props.parent / "verdicts" / f"{cid}.json").exists()
    all_ids = [p.stem for p in c.glob("*/*/gen_*/verdicts/*.json")]
    assert len(all_ids) == len(set(all_ids)), "a candidate was verified twice"
    assert len(list(c.glob("offline/*/gen_2/verdicts.json"))) == 3
    # Where each verdict's seconds went, the generation's one preparation of its references
    # included (the step prepares once for all its candidates; it said 0.0 before).
    for p in c.glob("*/*/gen_*/verdicts/*.json"):
        times = json.loads(p.read_text())["times"]
        assert times["prepare_s"] > 0 and times["prepare_shared_by"] >= 1, (p, times)
        assert times["verify_s"] > times["worker_s"] > 0, (p, times)

    # The synthesizer earned kernels, the matmul's among them (its own tiled GEMM: the strict
    # policy leaves the library forms out).
    accepted = [json.loads(p.read_text()) for p in c.glob("*/*/gen_*/verdicts/*.json")]
    assert any(v["accepted"] for v in accepted)
    mm = [json.loads(p.read_text())
          for p in c.glob("offline/L1_14_Square_Matmul/gen_*/verdicts/*.json")]
    assert any(v["accepted"] for v in mm), [v["reasons"] for v in mm]

    # The archive, with exactly the documented columns.
    import polars as pl

    from assay.archive.export import ARCHIVE_COLUMNS

    frame = pl.read_parquet(c / "archive" / "level_1.parquet")
    assert frame.columns == list(ARCHIVE_COLUMNS)
    assert frame.height == len(all_ids)
    assert frame["Correct"].sum() == sum(v["accepted"] for v in accepted)

    # MLflow: one experiment, a parent run for the backend, a child run per task.
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ci")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 3
    assert (c / "report.html").read_text().count("L1_") >= 3

    # The report of this real campaign in headless Chromium (issue #9): no console problems,
    # nothing fetched, the plots drawn; screenshots saved as test artifacts.
    from test_report_browser import render_in_chromium

    facts, found, urls = render_in_chromium(c / "report.html", "report-ci-campaign")
    assert found == [], "the page logged problems:\n" + "\n".join(found)
    assert urls == [(c / "report.html").resolve().as_uri()], urls
    assert facts["leaderboard_rows"] == 3 and facts["roofline_points"] > 0
    assert facts["charts"] >= 4 and facts["svgs"] == facts["charts"] and facts["lineages"] >= 1

    # Every profiled kernel's torch-profiler table is its verdict's audit (every timed call),
    # not a run of its own.
    for path in c.glob("*/*/profile.json"):
        prof = json.loads(path.read_text())
        if prof["candidate"]:  # where its seconds went, per stage that ran
            assert all(k.endswith("_s") and v >= 0 for k, v in prof["times"].items()), prof
            assert ("clang_tidy_s" in prof["times"]) == bool(shutil.which("clang-tidy")), prof
            verdict = next(path.parent.glob(f"gen_*/verdicts/{prof['candidate']}.json"))
            rows = json.loads(verdict.read_text())["kernel_profile"]
            assert rows and prof["torch_profile"].startswith("(the verifier's audit"), prof
            assert rows[0]["name"][:60] in prof["torch_profile"], (rows[0], prof)

    # clang-tidy's findings on every profiled kernel, in the archive's Clang_Tidy column (CI
    # installs Debian's clang-tidy and libomp-dev in .ci/run). Checked last: skipping here
    # skips nothing else.
    if shutil.which("clang-tidy") is None:
        pytest.skip("clang-tidy absent: the archive's Clang_Tidy column was not checked "
                    "(apt-get install -y clang-tidy libomp-dev)")
    profiled = [p for p in c.glob("*/*/profile.json") if json.loads(p.read_text())["candidate"]]
    tidy = frame.filter(pl.col("Clang_Tidy").is_not_null())["Clang_Tidy"].to_list()
    assert profiled and len(tidy) == len(profiled), (len(tidy), len(profiled))
    for text in tidy:
        assert text.strip() and "clang-diagnostic-error" not in text, text[:2000]


# --- The README's recipes ("Running campaigns"), literally, on the CI campaign ------------------

CAMPAIGN_WIDE = {"track", "export", "report", "all"}


def assay_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """`assay run ARGS` in ``workdir``: what `make run`, `make dry-run` and `make rerun` call;
    its stdout and stderr together in ``.stdout``."""
    return subprocess.run([sys.executable, "-m", "assay.cli", "run", *args], cwd=workdir,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(),
                          timeout=1500)


def job_blocks(log: str) -> list[str]:
    """Each job's block of a Snakemake log: `rule NAME:`, its input/output/wildcards lines and,
    with -p, its shell command."""
    return [b for b in re.split(r"\n(?=(?:local)?rule \w+:)", log)
            if re.match(r"(?:local)?rule \w+:", b)]


def jobs_run(log: str) -> list[tuple[str, str | None]]:
    """(rule, task or None) of every job a Snakemake run printed."""
    out = []
    for block in job_blocks(log):
        task = re.search(r"wildcards:.*\btask=([A-Za-z0-9_]+)", block)
        out.append((re.match(r"(?:local)?rule (\w+):", block).group(1),
                    task.group(1) if task else None))
    return out


def files(folder: Path, pattern: str) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns,
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in folder.glob(pattern)}


@pytest.mark.xdist_group("ci_campaign")
def test_readme_recipes_on_the_ci_campaign(ci_campaign, tmp_path):
    """On a copy of `ci_campaign`'s folder (modification times kept): make run and make
    dry-run, and a bare snakemake, have nothing left to do; make rerun TASK=... redoes that task
    alone, verdicts judged again; a deleted task folder comes back; one step runs in an empty
    folder holding only its declared inputs."""
    r = ci_campaign["resumed"]
    assert r.returncode == 0, r.stderr[-4000:]
    shutil.copytree(ci_campaign["work"], tmp_path, dirs_exist_ok=True, symlinks=True)
    c = tmp_path / "results" / "ci"
    assert (c / "report.html").exists()
    r = assay_run(tmp_path, *CI)
    assert r.returncode == 0 and "Nothing to be done" in r.stdout, r.stdout[-3000:]

    # Nothing planned after the run: by `make dry-run`'s command, and by the README's bare one.
    r = assay_run(tmp_path, "--dry-run", *CI)
    assert r.returncode == 0 and "Nothing to be done" in r.stdout, r.stdout[-3000:]
    r = subprocess.run(snakemake(tmp_path, "-n"), capture_output=True, text=True, env=env())
    assert r.returncode == 0 and "Nothing to be done" in r.stdout + r.stderr, r.stderr[-3000:]

    # Every step in an empty folder with only the files its rule declares (issue 22, part 3).
    jobs = planned_jobs(tmp_path, [c / target for target in ALONE])
    for target, check in ALONE.items():
        runs_alone_with_its_declared_inputs(tmp_path, c / target, jobs, check)

    # make rerun TASK=L1_1_ReLU: that task's jobs and the campaign-wide ones, nothing else.
    verdicts = files(c, "offline/*/gen_*/verdicts/*.json")
    kept = files(c, "baselines/*.json") | files(c, "tasks/*.json") | files(c, "device.json")
    r = assay_run(tmp_path, "--rerun", "L1_1_ReLU", *CI)
    assert r.returncode == 0, r.stdout[-4000:]
    ran = jobs_run(r.stdout)
    assert {t for _, t in ran} == {"L1_1_ReLU", None}, ran
    assert {rule for rule, _ in ran} == {"translate", "verify", "evolve", "profile",
                                         *CAMPAIGN_WIDE}, ran
    assert files(c, "baselines/*.json") | files(c, "tasks/*.json") | files(c, "device.json") \
        == kept, "a baseline was re-timed"
    after = files(c, "offline/*/gen_*/verdicts/*.json")
    for path, stamp in verdicts.items():
        if "/L1_1_ReLU/" in path:  # judged again, or gone with a candidate no longer bred
            assert after.get(path, (None,))[0] != stamp[0], f"{path} was not judged again"
        else:
            assert after.get(path) == stamp, f"{path} of another task was redone"
    assert any("/L1_1_ReLU/gen_0/" in path for path in after)
    assert "0 already judged" in (c / "logs/verify/offline/L1_1_ReLU/gen_0.log").read_text()

    # Start one task from scratch: delete its folder, run again (the README's bare snakemake).
    shutil.rmtree(c / "offline" / "L1_10_Softmax")
    r = subprocess.run(snakemake(tmp_path), capture_output=True, text=True, env=env(),
                       timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    assert {t for _, t in jobs_run(r.stdout + r.stderr)} == {"L1_10_Softmax", None}
    assert (c / "offline/L1_10_Softmax/profile.json").exists()
    import polars as pl

    archive = pl.read_parquet(c / "archive" / "level_1.parquet")
    assert archive.height == len(list(c.glob("offline/*/gen_*/verdicts/*.json")))
    assert "Softmax" in archive["Op_Name"].to_list()
    assert "L1_10_Softmax" in (c / "report.html").read_text()
    r = assay_run(tmp_path, "--dry-run", *CI)
    assert r.returncode == 0 and "Nothing to be done" in r.stdout, r.stdout[-3000:]


def _same_candidates(made: Path, original: Path) -> None:
    assert json.loads(made.read_text())["candidates"] == \
        json.loads(original.read_text())["candidates"]


def _verdicts_made(made: Path, original: Path) -> None:
    _same_candidates(made, original)
    ids = json.loads(made.read_text())["candidates"]
    assert sorted(p.name for p in made.parent.glob("verdicts/*.json")) == \
        sorted(f"{cid}.json" for cid in ids)


def _same_keys(*keys: str):
    def check(made: Path, original: Path) -> None:
        got, want = json.loads(made.read_text()), json.loads(original.read_text())
        assert {k: got.get(k) for k in keys} == {k: want.get(k) for k in keys}
    return check


def _same_rows(made: Path, original: Path) -> None:
    import polars as pl

    assert pl.read_parquet(made).height == pl.read_parquet(original).height > 0


def _same_tasks(made: Path, original: Path) -> None:
    for task in ("L1_1_ReLU", "L1_10_Softmax", "L1_14_Square_Matmul"):
        assert task in made.read_text()


# One output of every rule of the CI campaign (all run on the cpu target), and how the output
# made in an empty folder must match the campaign's own.
ALONE = {
    "tasks/L1_1_ReLU.json": _same_keys("source_hash", "flops", "min_bytes", "error"),
    "device.json": _same_keys("device"),
    "baselines/L1_1_ReLU.json": _same_keys("task", "target"),
    "offline/L1_1_ReLU/gen_0/proposals.json": _same_candidates,
    "offline/L1_1_ReLU/gen_0/verdicts.json": _verdicts_made,
    "offline/L1_1_ReLU/gen_1/proposals.json": _same_candidates,
    "offline/L1_1_ReLU/profile.json": _same_keys("task", "llm", "candidate"),
    "offline/tracked.json": _same_keys("llm"),
    "archive/level_1.parquet": _same_rows,
    "report.html": _same_tasks,
}


def planned_jobs(workdir: Path, targets: list[Path]) -> dict[str, str]:
    """The job block (rule, input, output, shell command) Snakemake plans for each of
    ``targets``, forced to run, by one dry run with the campaign's overrides: output path
    relative to ``workdir`` -> its job's block."""
    rels = [str(t.relative_to(workdir)) for t in targets]
    r = subprocess.run(snakemake(workdir, "-n", "-p", "--forcerun", *rels, overrides=CAMPAIGN),
                       capture_output=True, text=True, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    blocks = {}
    for block in job_blocks(r.stdout + r.stderr):
        output = re.search(r"\n\s+output: (.*)", block)  # (none: the `all` target)
        for out in output.group(1).split(", ") if output else []:
            blocks[out] = block
    assert set(rels) <= set(blocks), sorted(set(rels) - set(blocks))
    return blocks


def runs_alone_with_its_declared_inputs(workdir: Path, target: Path, jobs: dict[str, str],
                                        check) -> None:
    """Copy only the inputs Snakemake lists for the job making ``target`` (its block in
    ``jobs``, from planned_jobs) into an empty folder, run the job's own command there, and
    ``check(made, target)`` its output: the step reads nothing under the campaign folder that
    its rule does not declare. A declared ``verdicts.json`` brings its generation's
    per-candidate ``verdicts/`` along: verify writes them together (undeclared, see
    workflow/rules/verify.smk)."""
    rel = target.relative_to(workdir)
    block = jobs[str(rel)]
    found = re.search(r"\n\s+input: (.*)", block)
    inputs = found.group(1).split(", ") if found else []
    command = re.search(r"Shell command: (.*)", block).group(1)
    alone = workdir / "alone" / re.match(r"(?:local)?rule (\w+):", block).group(1)
    for name in inputs:
        src, dst = workdir / name, alone / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
        if src.name == "verdicts.json" and (src.parent / "verdicts").is_dir():
            shutil.copytree(src.parent / "verdicts", dst.parent / "verdicts")
    log_file = re.search(r"> (\S+) 2>&1", command).group(1)
    (alone / log_file).parent.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["bash", "-c", command], cwd=alone, capture_output=True, text=True,
                       env=env(), timeout=900)
    assert r.returncode == 0, f"{rel}: " + (alone / log_file).read_text()[-3000:]
    assert (alone / rel).exists(), f"{rel}: not made"
    check(alone / rel, target)
