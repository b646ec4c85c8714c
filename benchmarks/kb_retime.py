"""A KernelBench campaign's baselines timed again on this GPU, where the campaign timed them on
another (issue 16: "our eager and torch.compile baselines within 10% of KernelBench's published
H100 times": a campaign resumed across an H200 and an H100 holds baselines of both).

    python benchmarks/kb_retime.py --campaign results/kb --source KB [--jobs 3] [--budget-s S]
        [--only GLOB ...] [--override KEY=VALUE ...]

Each baseline goes where the verify step looks for this GPU's (``assay.bench.baseline_cache``,
``$ASSAY_BASELINE_CACHE``), timed as that step times it (``bench.baseline.baseline_here``; the
campaign's config:
``campaign=kb`` and the overrides; the verify config's timing protocol): a later verification of
the task finds it, and ``benchmarks/kb_baselines.py --cache`` compares it with KernelBench's
published times. A task already cached for this GPU is skipped, so a run stopped at its budget
(or killed) goes on where it stopped. ``--jobs`` tasks are in flight: each compiles its
torch.compile on fake tensors first (``assay.bench.prewarm``, CPU only), then takes the device
alone (``gpu.DeviceTurns``) for its timings. One line per task; the summary at the end.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import multiprocessing
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

def config(source: str, overrides: list[str]):
    from assay.app import compose

    return compose(["campaign=kb", "tasks=kernelbench", f"tasks.source={source}",
                    "tasks.levels=[1,2,3]", "target=cuda", *overrides])


def timed_baselines(campaign: Path) -> dict[str, dict]:
    """The campaign's baselines that hold a timing (``eager_ms``; a declined task's has none),
    by task; a file that is not JSON ends the run naming it."""
    if not (campaign / "baselines").is_dir():
        sys.exit(f"error: {campaign}: no baselines/ folder (a campaign's results folder?)")
    out = {}
    for f in sorted((campaign / "baselines").glob("*.json")):
        try:
            b = json.loads(f.read_text())
        except ValueError as e:
            sys.exit(f"error: {f}: not JSON ({e.msg})")
        if b.get("eager_ms") is not None:
            out[f.stem] = b
    return out


def to_retime(campaign: Path, here: str) -> list[str]:
    """The campaign's timed baselines of another GPU than ``here`` (one that names none was
    timed on the campaign's ``device.json`` GPU)."""
    try:
        default = json.loads((campaign / "device.json").read_text()).get("name")
    except (OSError, ValueError):
        default = None
    return [t for t, b in timed_baselines(campaign).items()
            if (b.get("device_name") or default) != here]


def with_norms(campaign: Path, paths: dict[str, Path]) -> list[str]:
    """The campaign's timed tasks whose file (``paths``: task id -> file, the campaign's task
    suite) has a norm whose mode matters (``instantiate.MODE_DEPENDENT``): baselines timed
    before ``task_mode`` ran them in eval mode."""
    from assay.tasks.instantiate import MODE_DEPENDENT

    return [t for t in timed_baselines(campaign)
            if t in paths and MODE_DEPENDENT.search(paths[t].read_text())]


def retime(task_id: str, source: str, overrides: list[str]) -> dict:
    """One task's baseline on this GPU, in the cache (worker process): its torch.compile
    compiled on fake tensors first, then the device taken alone for the timings."""
    import torch

    from assay import app, gpu
    from assay.bench.baseline import baseline_here
    from assay.bench.baseline_cache import baseline_is_cached
    from assay.bench.prewarm import prewarm
    from assay.bench.timing import TimingConfig

    t0 = time.perf_counter()
    cfg = config(source, overrides)
    task = app.load_task(cfg, task_id, "cuda")
    tcfg = TimingConfig.of(cfg.verify)
    compile_, mode = cfg.baselines.compile, cfg.baselines.compile_mode
    if baseline_is_cached(task, "cuda", tcfg, compile_, mode):
        return {"task": task_id, "cached": True, "seconds": 0.0}
    warm = prewarm(task.path, task.size, "cuda", mode) if compile_ else {}
    torch.zeros(1, device="cuda")  # (the CUDA context made beside another task's timings)
    with gpu.DeviceTurns("cuda").alone():  # (the turns verifications sharing a GPU take)
        waited = time.perf_counter() - t0
        try:
            timed, _ = baseline_here(task, tcfg, compile_, mode)
        finally:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # (the next task's timings get the whole device)
    return {"task": task_id, "cached": False, "seconds": round(time.perf_counter() - t0, 1),
            "prewarm_s": warm.get("seconds"), "before_device_s": round(waited, 1),
            "eager_ms": timed.get("eager_ms"), "eager_default_ms": timed.get("eager_default_ms"),
            "compile_ms": timed.get("compile_ms"), "compile_error": timed.get("compile_error")}


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--campaign", required=True, help="the campaign's results folder "
                   "(results/<campaign>) whose baselines/ are read")
    a.add_argument("--source", required=True, help="the KernelBench folder the campaign used")
    a.add_argument("--jobs", type=int, default=3, help="tasks in flight (one times at a time)")
    a.add_argument("--budget-s", type=float, default=0, help="start no task after this (0: none)")
    a.add_argument("--only", nargs="*", default=[], help="task-id globs")
    a.add_argument("--override", nargs="*", default=[], help="config overrides (KEY=VALUE)")
    a.add_argument("--out", help="a JSONL file: one row per task timed")
    a.add_argument("--norms", action="store_true", help="also the tasks with a BatchNorm or "
                   "InstanceNorm, whatever GPU timed them: their campaign's baselines may "
                   "predate instantiate.task_mode (eval mode, running statistics)")
    args = a.parse_args(argv)
    import torch

    from assay.bench.device import device_name

    if not torch.cuda.is_available():
        print("error: no CUDA device: baselines are timed again on a GPU", file=sys.stderr)
        return 2
    here = device_name("cuda")
    todo = to_retime(Path(args.campaign), here)
    print(f"{len(todo)} baselines of {args.campaign} timed on another GPU than {here}",
          flush=True)
    if args.norms:
        from assay.app import task_refs

        paths = {ref.id: ref.path for ref in task_refs(config(args.source, args.override))[0]}
        norms = [t for t in with_norms(Path(args.campaign), paths) if t not in todo]
        print(f"and {len(norms)} with a norm (timed again in the task mode)", flush=True)
        todo += norms
    todo = [t for t in todo if not args.only or any(fnmatch.fnmatch(t, g) for g in args.only)]
    t0, done, rows = time.perf_counter(), 0, []
    pending: dict = {}
    queue = list(todo)
    out = open(args.out, "a") if args.out else None
    while queue or pending:
        # (spawned: this process has a CUDA context; one task a process, as the DAG's steps)
        pool = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                                   max_tasks_per_child=1)
        try:
            while queue or pending:
                while queue and len(pending) < args.jobs and not (
                        args.budget_s and time.perf_counter() - t0 > args.budget_s):
                    t = queue.pop(0)
                    pending[pool.submit(retime, t, args.source, args.override)] = t
                if not pending:
                    queue = []  # the budget is spent
                    break
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    t = pending.pop(f)
                    done += 1
                    try:
                        row = f.result()
                    except BrokenProcessPool:
                        raise
                    except Exception as e:  # noqa: BLE001 - one task's failure is its row
                        row = {"task": t, "error": f"{type(e).__name__}: {e}"[:300]}
                    rows.append(row)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                    print(f"[{done}/{len(todo)} {time.perf_counter() - t0:.0f}s] "
                          + " ".join(f"{k}={v}" for k, v in row.items() if v is not None),
                          flush=True)
        except BrokenProcessPool:  # a worker died (killed, crashed): its tasks are a row each
            for f, t in pending.items():
                done += 1
                rows.append({"task": t, "error": "the worker process died"})
                print(f"[{done}/{len(todo)}] task={t} error=the worker process died", flush=True)
            pending = {}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    timed = [r for r in rows if "eager_ms" in r and not r.get("cached")]
    print(f"timed {len(timed)}, cached before {sum(bool(r.get('cached')) for r in rows)}, "
          f"failed {sum('error' in r for r in rows)}, not reached {len(todo) - len(rows)} "
          f"in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
