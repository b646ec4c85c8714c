"""Per-rule job times of a Snakemake run, read from its log (issue 16: "say how many GPU-hours
the 250 tasks took"). No device: it reads the ``dag.log`` that ``gpu_phases.sh dag`` brings back.

    python benchmarks/dag_times.py STATE/dag.log [--from-invocation N] [--out FILE.md]

A log may hold several Snakemake invocations (one per device call: the phase restarts
Snakemake, which renumbers its jobs), so jobs are matched per invocation, from the
``[date]`` + ``rule NAME:`` + ``jobid: N`` block that starts one to the ``Finished jobid: N``
that ends it. A job started and never finished (killed at the end of a call, or failed) is
counted apart. With two GPU jobs in flight per GPU, a GPU job's wall time includes its wait for
the device. ``--from-invocation N``: only invocations N.. (1-based; earlier sessions' calls are
in the same log).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
INVOCATION = "Building DAG of jobs..."


@dataclass
class Invocation:
    started: dict[int, tuple[str, datetime]] = field(default_factory=dict)
    finished: dict[int, tuple[str, float]] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None


def parse(lines: list[str]) -> list[Invocation]:
    """The log's invocations, each with its started and finished jobs."""
    runs: list[Invocation] = []
    stamp: datetime | None = None
    rule: str | None = None
    for line in lines:
        line = line.rstrip("\n")
        if line == INVOCATION:
            runs.append(Invocation())
            continue
        if not runs:
            continue
        run = runs[-1]
        if m := STAMP.match(line):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
            run.first = run.first or stamp
            run.last = stamp
            rule = None
        elif m := RULE.match(line):
            rule = m.group(1)
        elif (m := JOBID.match(line)) and rule and stamp:
            run.started.setdefault(int(m.group(1)), (rule, stamp))
            rule = None
        elif (m := FINISHED.match(line)) and stamp:
            job = int(m.group(1))
            if job in run.started:
                run.finished[job] = (m.group(2), (stamp - run.started[job][1]).total_seconds())
    return runs


def table(runs: list[Invocation]) -> str:
    """Markdown: per rule, jobs finished (min/median/max/total wall seconds) and unfinished."""
    done: dict[str, list[float]] = {}
    unfinished: dict[str, int] = {}
    for run in runs:
        for rule, secs in run.finished.values():
            done.setdefault(rule, []).append(secs)
        for job, (rule, _) in run.started.items():
            if job not in run.finished:
                unfinished[rule] = unfinished.get(rule, 0) + 1
    wall = sum((r.last - r.first).total_seconds() for r in runs if r.first and r.last)
    out = [f"{len(runs)} invocation(s), {wall:.0f} s of Snakemake wall time, "
           f"{sum(len(v) for v in done.values())} jobs finished", "",
           "| rule | jobs | min s | median s | max s | total s | unfinished |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for rule in sorted(set(done) | set(unfinished), key=lambda r: -len(done.get(r, []))):
        secs = done.get(rule, [])
        if secs:
            out.append(f"| {rule} | {len(secs)} | {min(secs):.0f} | {statistics.median(secs):.0f} "
                       f"| {max(secs):.0f} | {sum(secs):.0f} | {unfinished.get(rule, 0)} |")
        else:
            out.append(f"| {rule} | 0 | | | | | {unfinished.get(rule, 0)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="a Snakemake log (gpu_phases.sh's dag.log)")
    ap.add_argument("--from-invocation", type=int, default=1, metavar="N",
                    help="only the log's invocations N.. (1-based)")
    ap.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args(argv)
    try:
        lines = args.log.read_text().splitlines()
    except OSError as e:
        print(f"dag_times: {args.log}: cannot read ({e.strerror})", file=sys.stderr)
        return 2
    runs = parse(lines)
    if not runs:
        print(f"dag_times: {args.log}: no Snakemake invocation in it", file=sys.stderr)
        return 2
    text = table(runs[args.from_invocation - 1:])
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
