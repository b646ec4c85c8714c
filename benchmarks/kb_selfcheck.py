"""Reference self-check of KernelBench at its own sizes (issue 16's acceptance): every task's own
Model, as the candidate, through every check but kernel_audit and reference_fallback.

    python benchmarks/kb_selfcheck.py --source /path/to/KernelBench/KernelBench --levels 1 2 3 \\
        --out DIR [--resume] [--budget-s 540] [--jobs 2] [--device cuda]

Writes ``DIR/selfcheck.jsonl`` (one line per task, as soon as it is decided), ``DIR/summary.md``
(accepted / degenerate with their numbers / too_large / rejected / errors, seconds per task)
and ``DIR/summary.json`` (counts, GPU, torch, seconds). Resumable across device calls: carry DIR
back and forth and pass ``--resume``; tasks already in the JSONL are skipped (``--retry-errors``
redoes those that ended in an error, e.g. with ``--jobs 1`` after a memory error at ``--jobs 2``).
``--budget-s`` starts no task that could end past it, so a call under a device time limit ends
cleanly with everything decided so far written. Exit 0 when the run reached the end (whatever
the verdicts), 3 when the budget stopped it (run again with ``--resume``), 2 on bad usage.

Needs torch and assay only (argparse, no Hydra): ``PYTHONPATH=src python benchmarks/...``.
No baseline is timed; ``--jobs`` tasks are prepared and verified at once, each in its own
process (a task that kills its process costs that task only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
# The sandboxed workers are separate interpreters: they import this checkout's assay too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True,
                   help="KernelBench's task root (the folder holding level1/ level2/ level3/)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", required=True, help="output folder (JSONL, summaries)")
    p.add_argument("--resume", action="store_true",
                   help="continue the JSONL in --out (without it an existing one is an error)")
    p.add_argument("--retry-errors", action="store_true")
    p.add_argument("--budget-s", type=float, default=None, help="stop cleanly before this")
    p.add_argument("--jobs", type=int, default=2, help="tasks in flight at once")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--size", default="large", choices=["large", "small"])
    p.add_argument("--limit", type=int, default=None, help="first N tasks per level (a trial)")
    p.add_argument("--only", nargs="+", default=None, metavar="GLOB",
                   help="task ids to run, as globs (e.g. L1_23_* L3_*): a rerun of a few")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    t0 = time.perf_counter()
    from assay.verify import selfcheck

    src = Path(a.source)
    folders = [src / f"level{n}" for n in a.levels]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        print(f"error: {', '.join(missing)}: no such level folder", file=sys.stderr)
        return 2
    paths = []
    for f in folders:
        paths += selfcheck.task_files([f])[:a.limit] if a.limit else selfcheck.task_files([f])
    if a.only:
        import fnmatch

        from assay.tasks.model import level_of, task_id_for

        paths = [p for p in paths if any(fnmatch.fnmatch(task_id_for(level_of(p), p), g)
                                         for g in a.only)]
    out = Path(a.out)
    jsonl = out / "selfcheck.jsonl"
    if jsonl.exists() and not a.resume:
        print(f"error: {jsonl} exists; pass --resume to continue it", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    budget = None if a.budget_s is None else a.budget_s - (time.perf_counter() - t0)
    res = selfcheck.run_selfcheck(paths, a.device, a.size, jsonl=jsonl, jobs=a.jobs,
                                  budget_s=budget, retry_errors=a.retry_errors)
    rows = list(res["rows"].values())
    import torch

    counts = {s: sum(r.get("status") == s for r in rows) for s in selfcheck.STATUSES}
    device = rows[0]["device"] if rows else a.device
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    title = (f"KernelBench reference self-check (levels {' '.join(map(str, a.levels))}, "
             f"{a.size} sizes, {device}: {gpu}, torch {torch.__version__})")
    text = selfcheck.summary_markdown(rows, title)
    if res["remaining"]:
        text += (f"\n{res['remaining']} of {len(paths)} tasks not yet run "
                 f"({res['stopped'] or 'interrupted'}); rerun with --resume.\n")
    (out / "summary.md").write_text(text)
    secs = sum(r.get("seconds") or 0 for r in rows)
    (out / "summary.json").write_text(json.dumps({
        "tasks": len(paths), "decided": len(rows), "remaining": res["remaining"],
        "counts": counts, "device": device, "gpu": gpu, "torch": torch.__version__,
        "task_seconds": secs, "this_call_s": time.perf_counter() - t0, "jobs": a.jobs,
        "stopped": res["stopped"]}, indent=2) + "\n")
    print(f"{len(rows)}/{len(paths)} decided: " + ", ".join(f"{n} {s}" for s, n in counts.items())
          + f"; summary in {out / 'summary.md'}")
    if res["stopped"]:
        print(f"stopped: {res['stopped']}; rerun with --resume", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
