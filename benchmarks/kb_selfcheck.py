"""Reference self-check of KernelBench at its own sizes (issue 16's acceptance): every task's own
Model, as the candidate, through every check but kernel_audit and reference_fallback.

    python benchmarks/kb_selfcheck.py --source /path/to/KernelBench/KernelBench --levels 1 2 3 \\
        --out DIR [--resume] [--budget-s 540] [--jobs 2] [--device cuda]

Writes ``DIR/selfcheck.jsonl`` (one line per task, as soon as it is decided), ``DIR/summary.md``
(accepted / degenerate with their numbers / too_large / rejected / errors, seconds per task)
and ``DIR/summary.json`` (counts, GPU, torch, seconds). Resumable across device calls: carry DIR
back and forth and pass ``--resume``; tasks already in the JSONL are skipped (``--retry error``
redoes those that ended in an error; ``rejected`` after a verifier fix; ``too_large`` on a larger GPU).
``--budget-s`` bounds the whole call: no task starts that would likely end past it, a task still
in flight when it runs out is killed and left out of the JSONL (``--resume`` redoes it), and the
summaries are rewritten after every task, so a call under a device time limit ends cleanly with
everything decided so far written. Exit 0 when the run reached the end (whatever
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
    from assay.verify.selfcheck import RETRYABLE

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True,
                   help="KernelBench's task root (the folder holding level1/ level2/ level3/)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", required=True, help="output folder (JSONL, summaries)")
    p.add_argument("--resume", action="store_true",
                   help="continue the JSONL in --out (without it an existing one is an error)")
    p.add_argument("--retry", nargs="+", default=[], choices=RETRYABLE, metavar="STATUS",
                   help=f"redo tasks whose row has one of these statuses ({', '.join(RETRYABLE)})")
    p.add_argument("--budget-s", type=float, default=None, help="stop cleanly before this")
    p.add_argument("--jobs", type=int, default=2, help="tasks in flight at once")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--size", default="large", choices=["large", "small"])
    p.add_argument("--transfer", default="draw", choices=["draw", "host", "cuda_ipc"],
                   help="how inputs and outputs reach the worker: draw (the verifier's default: "
                        "the worker draws each set from its seed), host (shared-memory files) "
                        "or cuda_ipc (device memory); the memory plan may take another where "
                        "it keeps more of the protocol")
    p.add_argument("--limit", type=int, default=None, help="first N tasks per level (a trial)")
    p.add_argument("--only", nargs="+", default=None, metavar="GLOB",
                   help="task ids to run, as globs (e.g. L1_23_* L3_*): a rerun of a few")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="every N-th task from the I-th (0-based): one of N processes, one per "
                        "GPU (CUDA_VISIBLE_DEVICES), each with its own --out")
    a = p.parse_args(argv)
    if a.shard is not None:
        try:
            i, n = (int(x) for x in a.shard.split("/"))
        except ValueError:
            p.error(f"--shard {a.shard}: expected I/N, e.g. 0/4")
        if not 0 <= i < n:
            p.error(f"--shard {a.shard}: I must be in 0..N-1")
        a.shard = (i, n)
    return a


def task_paths(a: argparse.Namespace) -> list[Path]:
    """The task files of ``a.levels`` under ``a.source``, cut by ``--limit``, ``--only`` and
    ``--shard``, in level and task order."""
    from assay.verify import selfcheck

    paths = []
    for f in (Path(a.source) / f"level{n}" for n in a.levels):
        paths += selfcheck.task_files([f])[:a.limit] if a.limit else selfcheck.task_files([f])
    if a.only:
        import fnmatch

        from assay.tasks.model import level_of, task_id_for

        paths = [p for p in paths if any(fnmatch.fnmatch(task_id_for(level_of(p), p), g)
                                         for g in a.only)]
    if a.shard is not None:  # round robin: KernelBench's huge tasks come in runs
        paths = paths[a.shard[0]::a.shard[1]]
    return paths


def write_summaries(out: Path, a: argparse.Namespace, paths: list, rows: list[dict],
                    res: dict, t0: float, gpu: str, torch_version: str) -> None:
    """DIR/summary.md and DIR/summary.json from the rows so far (rewritten after every task, so
    a call cut off by the device's time limit still leaves them current)."""
    from assay.verify import selfcheck

    counts = {s: sum(r.get("status") == s for r in rows) for s in selfcheck.STATUSES}
    device = rows[0]["device"] if rows else a.device
    title = (f"KernelBench reference self-check (levels {' '.join(map(str, a.levels))}, "
             f"{a.size} sizes, {device}: {gpu}, torch {torch_version})")
    text = selfcheck.summary_markdown(rows, title)
    remaining = len(paths) - len(rows)
    if remaining:
        text += (f"\n{remaining} of {len(paths)} tasks not yet run "
                 f"({res.get('stopped') or 'in progress or interrupted'}); rerun with "
                 f"--resume.\n")
    if res.get("killed"):
        text += ("Killed in flight when the time budget ran out (not in the JSONL; --resume "
                 "redoes them): " + ", ".join(Path(k).stem for k in res["killed"]) + "\n")
    secs = sum(r.get("seconds") or 0 for r in rows)
    for name, body in (("summary.md", text), ("summary.json", json.dumps({
            "tasks": len(paths), "decided": len(rows), "remaining": remaining,
            "counts": counts, "device": device, "gpu": gpu, "torch": torch_version,
            "task_seconds": secs, "this_call_s": time.perf_counter() - t0, "jobs": a.jobs,
            "stopped": res.get("stopped", ""), "killed": res.get("killed", [])},
            indent=2) + "\n")):
        tmp = out / (name + ".tmp")
        tmp.write_text(body)
        tmp.replace(out / name)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    t0 = time.perf_counter()
    import torch  # before the budget's clock matters: the summaries name the GPU and torch

    from assay.verify import selfcheck

    src = Path(a.source)
    missing = [str(src / f"level{n}") for n in a.levels if not (src / f"level{n}").is_dir()]
    if missing:
        print(f"error: {', '.join(missing)}: no such level folder", file=sys.stderr)
        return 2
    paths = task_paths(a)
    out = Path(a.out)
    jsonl = out / "selfcheck.jsonl"
    if jsonl.exists() and not a.resume:
        print(f"error: {jsonl} exists; pass --resume to continue it", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    keys = {selfcheck.row_key(p, a.size, a.device if a.device != "auto" else
                              ("cuda" if torch.cuda.is_available() else "cpu")) for p in paths}

    def on_row(done: dict) -> None:
        write_summaries(out, a, paths, [r for k, r in done.items() if k in keys], {}, t0, gpu,
                        torch.__version__)

    budget = None if a.budget_s is None else a.budget_s - (time.perf_counter() - t0)
    from assay.verify.settings import VerifyConfig

    res = selfcheck.run_selfcheck(paths, a.device, a.size, VerifyConfig(transfer=a.transfer),
                                  jsonl=jsonl, jobs=a.jobs, budget_s=budget,
                                  retry=a.retry, on_row=on_row)
    rows = list(res["rows"].values())
    write_summaries(out, a, paths, rows, res, t0, gpu, torch.__version__)
    counts = {s: sum(r.get("status") == s for r in rows) for s in selfcheck.STATUSES}
    print(f"{len(rows)}/{len(paths)} decided: " + ", ".join(f"{n} {s}" for s, n in counts.items())
          + f"; summary in {out / 'summary.md'}")
    if res["stopped"]:
        print(f"stopped: {res['stopped']}; rerun with --resume", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
