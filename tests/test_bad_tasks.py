"""Twenty malformed task files (tests/bad_tasks/level1): one clear line each, and the valid tasks
of the same folder finish.

A file that fails the static check (parse + required names) is left out by discovery with one
line; one that fails when executed gets a task record whose ``error`` is one line, written by
the extract step, which runs the task in a child process with a time limit and checks sizes on
the meta device before allocating anything.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from assay.tasks.record import analyze_file
from assay.tasks.suite import discover
from helpers import REPO, env, snakemake

BAD = REPO / "tests" / "bad_tasks" / "level1"

# file -> what its one line must say
STATIC = {
    "1_Syntax_Error.py": "syntax error at line 6",
    "2_Missing_Get_Inputs.py": "missing get_inputs",
    "3_Missing_Model.py": "missing Model",
    "4_Empty.py": "empty file",
    "5_Not_Utf8.py": "not UTF-8 text (byte 0xe9",
    "6_Nul_Bytes.py": "contains a NUL byte",
}
EXTRACT = {
    "7_Get_Inputs_Not_List.py": "get_inputs() returned a Tensor, expected a list",
    "8_Get_Inputs_No_Tensors.py": "get_inputs() element 0 is a numpy.ndarray",
    "9_Init_Inputs_Wrong_Type.py": "get_init_inputs() returned a dict, expected a list",
    "10_Init_Raises.py": "Model(*get_init_inputs()) raised ValueError: features must be",
    "11_Forward_Raises.py": "forward raised RuntimeError: mat1 and mat2 shapes",
    "12_Forward_Returns_Non_Tensor.py": "forward returned a dict, expected a tensor",
    "13_Absurd_Size.py": "absurd size: inputs (1000000, 1000000) and outputs need 8 TB",
    "14_Nan_Output.py": "forward returns NaN",
    "15_Sleeps_At_Import.py": "timed out after",
    "16_Sys_Exit.py": "calls sys.exit(3)",
    "17_Import_Error.py": "ModuleNotFoundError: No module named 'kernels_that_do_not_exist'",
    "18_Model_Not_Module.py": "Model is not a torch.nn.Module subclass",
    "19_Get_Inputs_Raises.py": "get_inputs() raised NameError",
    "20_Os_Exit.py": "ended the process with exit status 0 while executing the file",
}

GOOD = {
    "21_Good_Relu.py": """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
""",
    "22_Good_Softmax.py": """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
""",
}


def one_clear_line(line: str, name: str, problem: str) -> None:
    assert "\n" not in line, line
    assert name in line and problem in line, (name, problem, line)
    assert line.count(name) == 1, line


def test_the_fixture_folder_holds_twenty_bad_files():
    assert sorted(p.name for p in BAD.iterdir()) == sorted({**STATIC, **EXTRACT})


def test_static_check_gives_one_line_per_unparsable_file():
    refs, errors = discover(BAD)
    assert len(errors) == len(STATIC), errors
    for name, problem in STATIC.items():
        (line,) = [e for e in errors if f"/{name}:" in e]
        one_clear_line(line, name, problem)
    assert sorted(r.path.name for r in refs) == sorted(EXTRACT)


SAMPLE = ["13_Absurd_Size.py", "15_Sleeps_At_Import.py", "16_Sys_Exit.py", "20_Os_Exit.py"]


def test_extract_catches_sleep_exit_and_absurd_size_in_a_child():
    """The ones that would hang, end or exhaust the extract process itself (the whole table
    is checked through the pipeline below)."""
    def run(name):
        limit = 8 if name == "15_Sleeps_At_Import.py" else 300  # the others end by themselves
        t0 = time.monotonic()
        return name, analyze_file(BAD / name, 1, "large", "cpu", timeout_s=limit), \
            time.monotonic() - t0

    with ThreadPoolExecutor(2) as ex:
        for name, record, took in ex.map(run, SAMPLE):
            one_clear_line(record["error"], name, EXTRACT[name])
            if name == "15_Sleeps_At_Import.py":
                assert took < 8 + 15, took


def snakemake_cmd(workdir: Path, source: Path) -> list[str]:
    # Generation 0 only: every stage of the DAG runs for every task (22 x 5 jobs) in about
    # three minutes on two cores; evolution itself is test_pipeline's business. The sleeping
    # task costs tasks.extract_timeout_s, not 10 minutes.
    return snakemake(workdir, overrides=[
        "campaign=bad", "tasks=kernelbench", f"tasks.source={source}", "tasks.size=large",
        "evolve=ci", "evolve.generations=0", "baselines.compile=false",
        "tasks.extract_timeout_s=45"])


@pytest.mark.slow
def test_campaign_over_bad_and_good_tasks_finishes_the_good_ones(tmp_path):
    source = tmp_path / "tasks"
    shutil.copytree(BAD, source)
    for name, text in GOOD.items():
        (source / name).write_text(text.lstrip())
    work = tmp_path / "run"
    r = subprocess.run(snakemake_cmd(work, source), capture_output=True, text=True, env=env(),
                       timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]

    left_out = [ln for ln in r.stderr.splitlines() if ln.startswith("assay: task left out:")]
    # The Snakefile is parsed by the main process only here, so each line appears once.
    for name, problem in STATIC.items():
        lines = {ln for ln in left_out if f"/{name}:" in ln}
        assert len(lines) == 1, (name, left_out)
        one_clear_line(lines.pop(), name, problem)

    c = work / "results" / "bad"
    records = {Path(json.loads(p.read_text())["path"]).name: json.loads(p.read_text())
               for p in (c / "tasks").glob("*.json")}
    assert sorted(records) == sorted({**EXTRACT, **GOOD})
    for name, problem in EXTRACT.items():
        one_clear_line(records[name]["error"], name, problem)

    verdicts = []
    for name in GOOD:
        rec = records[name]
        assert rec["error"] is None and not rec["degeneracy"]["degenerate"], rec
        tdir = c / "offline" / rec["id"]
        assert (tdir / "profile.json").exists()
        gen0 = json.loads((tdir / "gen_0" / "proposals.json").read_text())
        assert gen0["candidates"], gen0
        verdicts += [json.loads(p.read_text()) for p in tdir.glob("gen_*/verdicts/*.json")]
    assert any(v["accepted"] for v in verdicts), [v["reasons"] for v in verdicts]

    import polars as pl

    frame = pl.read_parquet(c / "archive" / "level_1.parquet")
    # a row per verdict, and one per task that could not be run, its one line the row's Error
    kernels = frame.filter(pl.col("Kernel_Name").is_not_null())
    assert kernels.height == len(verdicts)
    broken = frame.filter(pl.col("Kernel_Name").is_null())
    assert broken.height == len(EXTRACT), broken
    assert set(broken["Error"]) == {records[name]["error"] for name in EXTRACT}
    assert broken["Verdict_Reasons"].to_list() == [["task_error"]] * len(EXTRACT)
    assert (c / "report.html").exists()
