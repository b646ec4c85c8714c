"""benchmarks/synth_suite.py's bookkeeping (no device needed): each decided task is kept in
--out/tasks/, a rerun takes those as done and judges only the rest, and the summary reports
issue #17's acceptance per level with every task lacking an accepted kernel and why."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

from helpers import KERNELBENCH as KB, REPO

_spec = importlib.util.spec_from_file_location("synth_suite", REPO / "benchmarks/synth_suite.py")
suite = importlib.util.module_from_spec(_spec)
sys.modules["synth_suite"] = suite  # dataclasses look their module up
_spec.loader.exec_module(suite)


def _run(tid: str, level: int, runtime: float | None, reasons=(), declined=None):
    run = suite.TaskRun(tid, level, Path(f"/tasks/{tid}.py"), declined=declined,
                        baseline={"eager_ms": 1.0, "compile_ms": 0.8},
                        record={"min_bytes": 8e6, "flops": 0.0})
    if declined is None:
        verdict = {"accepted": runtime is not None, "runtime_ms": runtime,
                   "reasons": list(reasons)}
        run.cands = [suite.Cand(f"c{tid}", Path(f"/c/{tid}.py"), "vectorize", {"block": 256},
                                "translate", "strict", True, verdict=verdict, verify_s=1.5)]
    return run


def test_decided_tasks_round_trip_and_the_summary_names_every_miss(tmp_path):
    runs = [_run("L1_1_A", 1, 0.5), _run("L1_2_B", 1, 1.2), _run("L1_3_C", 1, None, ["roofline"]),
            _run("L2_1_D", 2, None, declined="ConvTranspose3d: no template"),
            _run("L2_2_E", 2, None, declined="ConvTranspose3d: no template")]
    for r in runs:
        suite.save_done(tmp_path, r)
    back = suite.load_done(tmp_path)
    assert sorted(back) == sorted(r.id for r in runs)
    meta = {"source": "kb", "device": "cpu", "device_name": "x", "size": "small", "torch": "t",
            "wall_s": 1.0}
    peaks = {"bandwidth_gbs": 20.0, "flops_tflops": 0.1}
    md, data = suite.summarize(runs, peaks, meta)
    assert suite.summarize([back[r.id] for r in runs], peaks, meta)[1] == data
    lv1 = data["summary"]["levels"][1]
    assert (lv1["accepted"], lv1["tasks"]) == (2, 3) and lv1["below_min_eager"] == ["L1_2_B"]
    assert abs(lv1["geomean_speedup_eager"] - (2.0 / 1.2) ** 0.5) < 1e-9
    assert data["summary"]["levels"][2]["accepted"] == 0
    misses = md.split("## Tasks without an accepted kernel, by reason")[1].split("## Tasks")[0]
    assert "| 2 | ConvTranspose3d: no template | L2_1_D, L2_2_E |" in misses
    assert "rejected: roofline" in misses and "L1_3_C" in misses
    assert "Level 1: accepted 2/3" in md and "not met" in md  # 67% < 90%


def test_a_rerun_into_the_same_folder_judges_only_what_is_left(tmp_path):
    source = tmp_path / "kb"
    (source / "level1").mkdir(parents=True)
    for name in ("1_ReLU.py", "5_Swish.py"):
        shutil.copy(REPO / "data/tasks/level1" / name, source / "level1" / name)
    out = tmp_path / "out"
    for tid in ("L1_1_ReLU", "L1_5_Swish"):  # both decided by an earlier call
        suite.save_done(out, _run(tid, 1, 0.5))
    (out / "tasks" / "L1_9_Gone.json").write_text("{not json")  # unreadable: not done
    rc = suite.main(["--source", str(source), "--out", str(out), "--device", "cpu",
                     "--no-compile", "--budget-s", "60"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert [t["id"] for t in results["tasks"]] == ["L1_1_ReLU", "L1_5_Swish"]
    assert all(t["candidates"][0]["verdict"]["runtime_ms"] == 0.5 for t in results["tasks"])
    assert not (out / "candidates").exists()  # nothing proposed, built or verified again
    assert "Level 1: accepted 2/2" in (out / "summary.md").read_text()


def test_plans_only_reports_coverage_and_declines_without_a_device(tmp_path):
    """--plans-only: the synthesizer's plans for the suite (how many kernels, which forms) and
    its declines by reason; nothing is built or verified."""
    source = tmp_path / "kb"
    for level, name in ((1, "1_ReLU.py"), (1, "17_Conv2d.py"), (3, "1_MLP.py"),
                        (3, "4_ResNet_BasicBlock.py")):
        (source / f"level{level}").mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / f"data/tasks/level{level}" / name, source / f"level{level}" / name)
    (source / "level3" / "2_Sort_Rows.py").write_text(  # what no template writes: sorting
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.sort(x, dim=-1).values\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 33)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    out = tmp_path / "out"
    rc = suite.main(["--source", str(source), "--out", str(out), "--plans-only",
                     "--size", "small", "--variants", "2", "--mutations", "0"])
    assert rc == 0
    md = (out / "plans.md").read_text()
    assert "target cuda" in md and "nothing built or verified" in md
    assert "Level 1: a plan for 2/2 tasks" in md and "Level 3: a plan for 2/3 tasks" in md
    assert "| 1 | offline synthesizer v1 cannot express" in md and "L3_2_Sort_Rows" in md
    assert "| L3_1_MLP | 3 | 3 |" in md and "| L3_4_ResNet_BasicBlock | 3 |" in md
    rows = {r["task"]: r for r in json.loads((out / "plans.json").read_text())["tasks"]}
    assert rows["L3_1_MLP"]["kernels"] == 3 and rows["L3_1_MLP"]["declined"] is None
    assert rows["L3_2_Sort_Rows"]["declined"].startswith("offline synthesizer v1 cannot express")
    assert not (out / "results.json").exists() and not (out / "tasks").exists()


def test_a_task_too_large_for_the_memory_is_declined_before_its_baseline(tmp_path,
                                                                           monkeypatch):
    """The memory plan decides first: a task the machine cannot verify gets no baseline
    (KernelBench's L1_5 on the cpu machine had its eager baseline timed for 416 s before its
    too_large verdicts), and each candidate's verdict says too_large with the numbers."""
    import assay.bench.baseline

    source = tmp_path / "kb"
    (source / "level1").mkdir(parents=True)
    shutil.copy(REPO / "data/tasks/level1/1_ReLU.py", source / "level1" / "1_ReLU.py")
    monkeypatch.setenv("ASSAY_HOST_SHARE", str(10**8))  # the host's memory in 10^8 shares

    def no_baseline(*args, **kwargs):
        raise AssertionError("a baseline was timed")

    monkeypatch.setattr(assay.bench.baseline, "time_reference", no_baseline)
    out = tmp_path / "out"
    rc = suite.main(["--source", str(source), "--out", str(out), "--device", "cpu",
                     "--no-compile", "--budget-s", "120", "--variants", "1", "--mutations", "0"])
    assert rc == 0
    (task,) = json.loads((out / "results.json").read_text())["tasks"]
    assert task["error"] is None and task["baseline"] is None, task
    verdicts = [c["verdict"] for c in task["candidates"]]
    assert verdicts and all(v["reasons"] == ["too_large"] for v in verdicts), verdicts
    assert all("GiB" in v["checks"]["too_large"]["detail"] for v in verdicts), verdicts


def test_knobs_add_each_templates_defaults_with_them_where_its_space_has_them(tmp_path):
    """--knobs phases=0: a transposed convolution's conv template (by stride phase by default)
    gets its defaults without stride phases as a candidate always verified, beside the
    defaults, and so does the transposed convolution of a multi-kernel plan (its knob
    ``s1.phases``); a convolution that is not transposed (whose defaults have phases 0 already)
    gets nothing more; a malformed setting is a usage error naming it."""
    from assay.tasks.model import Task

    kb = KB / "level2"
    files = {"convt": next(kb.glob("5_ConvTranspose2d_*.py")),
             "conv": next(kb.glob("4_Conv2d_*.py")),
             "convt_pool": next(kb.glob("38_ConvTranspose3d_AvgPool_*.py"))}
    got = {}
    for kind, path in files.items():
        run = suite.TaskRun(kind, 2, path)
        run.task = Task.from_file(path, size="small", level=2)
        suite.propose(run, "cuda", 1, 0, 0, tmp_path, {"phases": 0})
        got[kind] = [(c.knobs.get("lib"), c.knobs.get("phases", c.knobs.get("s1.phases")),
                      c.must) for c in run.cands]
    assert (2, 1, True) in got["convt"] and (2, 0, True) in got["convt"], got
    assert {(p, must) for _, p, must in got["convt_pool"]} == {(1, True), (0, True)}, got
    conv = [phases for lib, phases, _ in got["conv"] if lib == 2]
    assert conv == [0], got
    assert suite.knob_settings("phases=1, k_step=8") == {"phases": 1, "k_step": 8}
    for bad in ("phases", "phases=one", "=1"):
        try:
            suite.knob_settings(bad)
        except suite.argparse.ArgumentTypeError as e:
            assert repr(bad.split(",")[0]) in str(e), e
        else:
            raise AssertionError(f"{bad!r} was taken")
