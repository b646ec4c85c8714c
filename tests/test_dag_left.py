"""benchmarks/dag_left.py: a KernelBench campaign's jobs left per level and rule, by its files,
and the share of a stretch of time its GPU steps held the device, by their logs."""

from __future__ import annotations

import importlib.util

from helpers import REPO

_spec = importlib.util.spec_from_file_location("dag_left", REPO / "benchmarks/dag_left.py")
dag_left = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dag_left)


def _touch(root, *paths):
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text("{}")


def test_jobs_left_per_level_and_rule_from_the_files(tmp_path, capsys):
    _touch(tmp_path, "tasks/L1_1_A.json", "tasks/L1_2_B.json", "tasks/L2_1_C.json",
           "offline/L1_1_A/gen_0/proposals.json", "baselines/L1_1_A.json",
           "offline/L1_1_A/gen_0/verdicts.json", "offline/L1_1_A/gen_1/proposals.json",
           "offline/L1_1_A/gen_1/verdicts.json", "offline/L1_1_A/profile.json")
    rows = dag_left.left(tmp_path, "offline", 2, {"L1": 2, "L2": 1})
    # L1: A done (7 jobs), B extracted only: 6 left; L2: C extracted only: 6 left
    assert rows["L1"] == {"extract": 0, "translate": 1, "baseline": 1, "verify": 2,
                          "evolve": 1, "profile": 1, "total": 6}
    assert rows["L2"]["total"] == 6 and rows["L2"]["extract"] == 0
    assert dag_left.main([str(tmp_path), "--tasks", "L1=2,L2=1"]) == 0
    assert "jobs left: 12" in capsys.readouterr().out
    assert dag_left.main([str(tmp_path / "nowhere")]) == 2


def test_the_device_held_is_the_union_of_the_steps_from_their_take(tmp_path, capsys):
    logs = tmp_path / "logs"
    for rule, name, lines in (
            ("verify", "a.log", ["04:00:00,000 assay: GPU lease: device 0",
                                 "04:00:10,000 assay: GPU 0 taken after 10.0 s",
                                 "04:00:40,000 assay.verify: done"]),
            ("baseline", "b.log", ["04:00:20,000 assay: GPU 0 taken",  # overlaps a: 40-50 new
                                   "04:00:50,000 assay.baseline: done"]),
            ("profile", "c.log", ["04:01:30,000 assay: GPU 0 taken",
                                  "04:01:40,000 assay.profile: done"]),
            ("verify", "old.log", ["03:00:00,000 assay: GPU 0 taken",  # before --since
                                   "03:10:00,000 assay.verify: done"])):
        (logs / rule).mkdir(parents=True, exist_ok=True)
        (logs / rule / name).write_text("".join(f"2026-12-07 {ln}\n" for ln in lines))
    union, stretch, per_rule = dag_left.held(logs, dag_left.datetime(2026, 12, 7, 3, 30))
    assert (union, stretch) == (50.0, 90.0), (union, stretch)  # 10-50 and 90-100, of 10-100
    assert per_rule == {"verify": (1, 30.0), "baseline": (1, 30.0), "profile": (1, 10.0)}
    (tmp_path / "tasks").mkdir()
    assert dag_left.main([str(tmp_path), "--since", "2026-12-07 03:30"]) == 0
    assert "device held 50 s of 90 s (56%)" in capsys.readouterr().out
