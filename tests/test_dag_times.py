"""benchmarks/dag_times.py: per-rule job times from a Snakemake log (no device: a log written
here in Snakemake 9's format, two invocations that reuse job ids, as two device calls do)."""

from __future__ import annotations

import importlib.util
import sys

from helpers import REPO

_spec = importlib.util.spec_from_file_location("dag_times", REPO / "benchmarks/dag_times.py")
dag_times = importlib.util.module_from_spec(_spec)
sys.modules["dag_times"] = dag_times  # (its dataclasses look their module up)
_spec.loader.exec_module(dag_times)


def _start(stamp: str, rule: str, job: int, local: bool = True) -> str:
    return (f"[Sun Nov 29 {stamp} 2026]\n{'local' if local else ''}rule {rule}:\n"
            f"    output: /tmp/x/{rule}-{job}.json\n    jobid: {job}\n"
            f"    resources: tmpdir=/tmp, gpu=1\n")


def _finish(stamp: str, rule: str, job: int) -> str:
    return f"[Sun Nov 29 {stamp} 2026]\nFinished jobid: {job} (Rule: {rule})\n1 of 9 steps done\n"


LOG = ("Using workflow specific profile profiles/default\nBuilding DAG of jobs...\n"
       + _start("10:00:00", "extract", 3) + _start("10:00:00", "translate", 4, local=False)
       + _finish("10:00:07", "translate", 4) + _finish("10:00:12", "extract", 3)
       + _start("10:00:12", "verify", 5)  # killed at the call's end: never finished
       + "[gpu_phases] stopped at 540s\n"
       + "Building DAG of jobs...\n"
       + _start("11:00:00", "extract", 3) + _finish("11:00:20", "extract", 3)
       + _start("11:00:20", "verify", 4) + _finish("11:01:00", "verify", 4))


def test_jobs_are_matched_per_invocation_and_unfinished_ones_counted_apart(tmp_path):
    runs = dag_times.parse(LOG.splitlines())
    assert len(runs) == 2
    assert runs[0].finished == {4: ("translate", 7.0), 3: ("extract", 12.0)}
    assert runs[1].finished == {3: ("extract", 20.0), 4: ("verify", 40.0)}
    text = dag_times.table(runs)
    assert text.startswith("2 invocation(s), 72 s of Snakemake wall time, 4 jobs finished")
    assert "| extract | 2 | 12 | 16 | 20 | 32 | 0 |" in text
    assert "| verify | 1 | 40 | 40 | 40 | 40 | 1 |" in text
    assert "| translate | 1 | 7 | 7 | 7 | 7 | 0 |" in text
    later = dag_times.table(runs[1:])
    assert "| extract | 1 | 20 |" in later and "translate" not in later

    log = tmp_path / "dag.log"
    log.write_text(LOG)
    out = tmp_path / "times.md"
    assert dag_times.main([str(log), "--from-invocation", "2", "--out", str(out)]) == 0
    assert out.read_text() == later


def test_a_log_without_snakemake_says_so_in_one_line(tmp_path, capsys):
    log = tmp_path / "dag.log"
    log.write_text("nothing here\n")
    assert dag_times.main([str(log)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(log) in err and "no Snakemake invocation" in err
    assert dag_times.main([str(tmp_path / "missing.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
