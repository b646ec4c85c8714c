"""What a KernelBench campaign's DAG still has to do, per level and rule, read from its files,
and how much of a stretch of time its GPU steps held the device (issue 16). No device: it reads
the results folder that ``gpu_phases.sh dag`` brings back (``STATE/dag/<campaign>``).

    python benchmarks/dag_left.py RESULTS/CAMPAIGN [--llm offline] [--generations 2]
        [--tasks L1=100,L2=100,L3=50] [--since "2026-12-07 04:00"]

A task's jobs: extract (``tasks/<t>.json``), translate (``<llm>/<t>/gen_0/proposals.json``),
baseline (``baselines/<t>.json``), verify (``gen_<k>/verdicts.json``, every generation),
evolve (``gen_<k>/proposals.json``, k >= 1), profile (``<llm>/<t>/profile.json``). A job is left
where its file is missing. ``--since``: the steps' logs (``logs/``) from then on: the union of
each GPU step's stretch from its "GPU N taken" line to its last line, against the stretch from
the first of those to the last line of any (what the device did while the DAG ran).
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

RULES = ("extract", "translate", "baseline", "verify", "evolve", "profile")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
TAKEN = re.compile(r" assay: GPU \S+ taken")


def left(root: Path, llm: str, generations: int, tasks: dict[str, int]
         ) -> dict[str, dict[str, int]]:
    """{level: {rule: jobs left}} (and ``total``) for ``tasks`` tasks per level prefix."""
    def count(pattern: str) -> int:
        return len(list(root.glob(pattern)))

    out = {}
    for level, n in tasks.items():
        done = {
            "extract": count(f"tasks/{level}_*.json"),
            "translate": count(f"{llm}/{level}_*/gen_0/proposals.json"),
            "baseline": count(f"baselines/{level}_*.json"),
            "verify": sum(count(f"{llm}/{level}_*/gen_{g}/verdicts.json")
                          for g in range(generations)),
            "evolve": sum(count(f"{llm}/{level}_*/gen_{g}/proposals.json")
                          for g in range(1, generations)),
            "profile": count(f"{llm}/{level}_*/profile.json"),
        }
        per_task = {"verify": generations, "evolve": generations - 1}
        row = {rule: n * per_task.get(rule, 1) - done[rule] for rule in RULES}
        row["total"] = sum(row.values())
        out[level] = row
    return out


def _stamp(line: str) -> datetime | None:
    m = STAMP.match(line)
    return datetime.strptime(f"{m.group(1)}.{m.group(2)}", "%Y-%m-%d %H:%M:%S.%f") if m else None


def held(logs: Path, since: datetime) -> tuple[float, float, dict[str, tuple[int, float]]]:
    """(seconds the device was held, seconds from the first take to the last line, {rule:
    (steps, seconds held)}) over the step logs' lines from ``since`` on."""
    spans, per_rule, first, last = [], {}, None, None
    for path in sorted(logs.rglob("*.log")):
        taken, end = None, None
        for line in path.read_text(errors="replace").splitlines():
            t = _stamp(line)
            if t is None or t < since:
                continue
            end = t
            if taken is None and TAKEN.search(line):
                taken = t
        if taken is None or end is None:
            continue
        spans.append((taken, end))
        rule = path.relative_to(logs).parts[0]
        steps, secs = per_rule.get(rule, (0, 0.0))
        per_rule[rule] = (steps + 1, secs + (end - taken).total_seconds())
        first = taken if first is None else min(first, taken)
        last = end if last is None else max(last, end)
    union, cur = 0.0, None
    for a, b in sorted(spans):
        if cur and a <= cur[1]:
            cur = (cur[0], max(cur[1], b))
        else:
            union += (cur[1] - cur[0]).total_seconds() if cur else 0.0
            cur = (a, b)
    union += (cur[1] - cur[0]).total_seconds() if cur else 0.0
    return union, (last - first).total_seconds() if first else 0.0, per_rule


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("root", type=Path, help="the campaign's results folder")
    a.add_argument("--llm", default="offline")
    a.add_argument("--generations", type=int, default=2)
    a.add_argument("--tasks", default="L1=100,L2=100,L3=50",
                   help="tasks per level, LEVEL=N,... (KernelBench's)")
    a.add_argument("--since", help='"YYYY-MM-DD HH:MM": the device-held share from then on')
    args = a.parse_args(argv)
    if not (args.root / "tasks").is_dir():
        print(f"error: {args.root}: no tasks/ folder (a campaign's results folder?)",
              file=sys.stderr)
        return 2
    try:
        tasks = {k: int(v) for k, v in (x.split("=", 1) for x in args.tasks.split(","))}
    except ValueError:
        a.error(f"--tasks {args.tasks!r}: expected LEVEL=N,...")
    rows = left(args.root, args.llm, args.generations, tasks)
    print("| level | " + " | ".join(RULES) + " | total |")
    print("| --- |" + " --- |" * (len(RULES) + 1))
    for level, row in rows.items():
        print(f"| {level} | " + " | ".join(str(row[r]) for r in RULES)
              + f" | **{row['total']}** |")
    print(f"jobs left: {sum(r['total'] for r in rows.values())}")
    if args.since:
        try:
            since = datetime.strptime(args.since, "%Y-%m-%d %H:%M")
        except ValueError:
            a.error(f"--since {args.since!r}: expected YYYY-MM-DD HH:MM")
        union, stretch, per_rule = held(args.root / "logs", since)
        share = f"{union / stretch:.0%}" if stretch else "n/a"
        print(f"device held {union:.0f} s of {stretch:.0f} s ({share}); "
              + ", ".join(f"{r} {n} steps {s:.0f} s" for r, (n, s) in sorted(per_rule.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
