"""Reference self-check: each task's own ``Model``, submitted as the candidate, must be accepted.

``assay selfcheck --tasks PATH... [--device D] [--jsonl OUT]``: for every task file (a folder
takes every task file in it, a KernelBench root its level folders) a candidate file is generated
from the task itself (its source, its size's ``ASSAY_SIZES`` overrides, ``ModelNew = Model``)
and verified through every check except ``kernel_audit`` and ``reference_fallback`` (the
reference's own ops are exactly what it runs). Honest work by construction, so a rejection is a
finding about the verifier (a tolerance, an input distribution, the parameter randomization,
a memory plan), never about the task; a task whose output barely depends on its inputs is
listed as degenerate with its numbers (``assay.tasks.analyze.degeneracy``).

One JSON line per task, written as soon as it is decided; a rerun with the same JSONL skips the
tasks already in it (``retry`` names the statuses to redo: ``error``; ``rejected`` after a
verifier fix; ``too_large`` on a larger GPU). Tasks run in worker
processes (``jobs`` at a time), so a task that kills its process (a segfault, the OOM killer)
costs that task, not the run. No baseline is timed: the self-check needs none.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from assay.tasks.model import Task, TaskError, level_of, one_line, read_source
from assay.tasks.suite import _task_files
from assay.verify.rows import append_row, latest, read_rows
from assay.verify.settings import VerifyConfig

STATUSES = ("accepted", "degenerate", "too_large", "rejected", "error")
SKIPPED_CHECKS = ("kernel_audit", "reference_fallback")


# --------------------------------------------------------------------------------------------
# Which tasks, and the candidate made of each.

def task_files(paths: Iterable[str | Path]) -> list[Path]:
    """Task files named by ``paths``: a file is itself; a folder gives its task files, or, when
    it holds level folders (a KernelBench root), theirs. A missing path is a TaskError."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            levels = sorted((d for d in p.iterdir() if d.is_dir() and level_of(d / "x", 0)),
                            key=lambda d: level_of(d / "x"))
            for folder in levels or [p]:
                out += _task_files(folder)
        else:
            raise TaskError(f"{p}: no such task file or folder")
    seen: set[Path] = set()
    return [p for p in out if not (p.resolve() in seen or seen.add(p.resolve()))]


def candidate_source(task: Task) -> str:
    """The task's own file as a candidate: ModelNew is Model, at the task's size."""
    return (task.source.rstrip() + "\n\n\n# --- assay selfcheck: the reference as the candidate\n"
            f"globals().update((globals().get('ASSAY_SIZES') or {{}}).get({task.size!r}, {{}}))\n"
            "ModelNew = Model\n")


def selfcheck_config(cfg: VerifyConfig | None = None) -> VerifyConfig:
    """The verifier's config without the two checks that reject the reference by design, with
    degeneracy flagged (listed, not a rejection) and a short timing budget (no speedup is read
    from a self-check; the runtime still meets the roofline check)."""
    cfg = cfg or VerifyConfig()
    return dataclasses.replace(cfg, audit=False, reject_reference_ops=False,
                               on_degenerate="flag", warmup_s=min(cfg.warmup_s, 0.05),
                               budget_s=min(cfg.budget_s, 0.2))


def row_key(path: str | Path, size: str, device: str) -> str:
    """A task's identity in the JSONL: its level folder, file name and content (not its
    absolute path: a checkout carried to another machine, or another folder, resumes)."""
    import hashlib

    p = Path(path)
    try:
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    except OSError:
        digest = "unreadable"
    return f"{p.parent.name}/{p.name}|{digest}|{size}|{device}"


# --------------------------------------------------------------------------------------------
# One task.

def _finite(x: Any) -> Any:
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)


def check_task(path: str | Path, device: str, size: str = "large",
               cfg: VerifyConfig | None = None, workdir: str | Path | None = None,
               peaks: dict | None = None, share: int = 1) -> dict[str, Any]:
    """Self-check one task file; a row (never raises for anything the task does).

    ``share``: how many tasks share the machine now. A task whose memory plan fits the machine
    but not a 1/share part of its free memory is not run: its row says ``deferred`` (the
    caller runs it again alone), so tasks in flight together never run each other out of
    memory; so is one that does not fit what the others leave free now (only a task that does
    not fit alone is ``too_large``). On a GPU, tasks that share it take turns for their timed
    parts (:class:`assay.gpu.DeviceTurns`)."""
    import tempfile

    t0 = time.perf_counter()
    row: dict[str, Any] = {"path": str(path), "size": size, "device": device,
                           "key": row_key(path, size, device)}
    try:
        row.update(_check(Path(path), device, size, selfcheck_config(cfg),
                          Path(workdir or tempfile.gettempdir()), peaks, share))
    except TaskError as e:
        row.update(status="error", error=str(e))
    except Exception as e:  # noqa: BLE001 - the harness's own failure: recorded, run goes on
        row.update(status="error", error=one_line(e, 500))
    finally:
        _release(device)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _release(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _memory_plan(task: Task, device: str, cfg: VerifyConfig, share: int):
    """(the plan to verify with, whether it fits a 1/share part of the machine). The plan is
    the 1/share part's when that holds the same protocol as the whole machine's (its placement
    keeps the task within its part), else the whole machine's: a task that would need a lighter
    protocol to share the machine runs alone, with the fuller one. Its transfer is
    memory.plan_transfers' choice (verify takes it from the plan)."""
    from assay.verify import memory

    shapes, _ = memory.cached_shapes(task)  # one meta pass for every plan below
    if shapes is None:
        return None, True
    dev_free, host_free = memory.free_memory(device)
    room = memory.arena_room()
    plan = memory.plan_transfers(shapes, cfg, device, dev_free, host_free, arena_free_b=room)
    if not plan.fits or share <= 1:
        return plan, True
    part = memory.plan_transfers(shapes, cfg, device,
                                 None if dev_free is None else dev_free // share,
                                 None if host_free is None else host_free // share,
                                 arena_free_b=None if room is None else room // share)
    if part.fits and part.reductions == plan.reductions:
        return part, True
    return plan, False


def _eager_default_ms(task: Task, device: str, cfg: VerifyConfig, turns) -> float | None:
    """The task's eager time under PyTorch's default numerics where those differ from the
    verifier's (assay.bench.baseline.time_default_numerics), on one input set, the GPU held as
    for a worker run; None where they do not, or where it does not fit beside what runs (the
    caller's _release frees what it made)."""
    import torch

    from assay.bench.baseline import runs_cudnn, time_default_numerics
    from assay.bench.timing import TimingConfig
    from assay.gpu import turns_alone
    from assay.tasks.instantiate import make_inputs, reference_model

    try:
        module = task.module()
        model = reference_model(module, 0, device)
        if not runs_cudnn(model):
            return None
        sets = [make_inputs(module, 100, device)]
        with turns_alone(turns):
            return time_default_numerics(model, sets, torch.device(device),
                                         TimingConfig.of(cfg))
    except RuntimeError:  # out of memory beside what runs (torch's OOM is one): not timed
        return None


def _check(path: Path, device: str, size: str, cfg: VerifyConfig, workdir: Path,
           peaks: dict | None, share: int = 1) -> dict[str, Any]:
    from assay.gpu import DeviceTurns, turns_shared
    from assay.tasks.analyze import cost, degeneracy
    from assay.verify.harness import reportable_times, resolve_device, verify

    device = resolve_device(device)
    read_source(path)
    task = Task.from_file(path, size=size)
    times: dict[str, Any] = {}
    t = time.perf_counter()
    plan, fits_part = _memory_plan(task, device, cfg, share)
    times["plan_s"] = round(time.perf_counter() - t, 3)
    if plan is not None and not plan.fits and share > 1:
        # The free memory measured now is what the other tasks in flight leave: an H100's
        # self-check at 3 jobs called ten KernelBench tasks too large (84-147 GiB "needed"
        # where 60-75 GiB was free) that fit the card alone. Only a task that does not fit the
        # machine alone is too large: this one is decided alone, after the others.
        return {"task": task.id, "status": "deferred", "plan": plan.to_dict()}
    if plan is not None and not plan.fits:  # decided before anything of its size exists
        return {"task": task.id, "status": "too_large", "accepted": False,
                "reasons": ["too_large"], "detail": plan.too_large_detail(),
                "plan": plan.to_dict(), "times": times}
    if not fits_part:
        return {"task": task.id, "status": "deferred", "plan": plan.to_dict()}
    # Tasks in flight on one GPU take turns for their timed parts (assay.gpu.DeviceTurns)
    turns = DeviceTurns(device) if share > 1 and device.startswith("cuda") else None
    t = time.perf_counter()
    with turns_shared(turns):
        deg = degeneracy(task, device)
    times["degeneracy_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    record = {**cost(task), "degeneracy": {**deg, "degenerate": False}}  # flagged, judged below
    times["cost_s"] = round(time.perf_counter() - t, 2)
    workdir.mkdir(parents=True, exist_ok=True)
    cand = workdir / f"selfcheck_{task.id}_{os.getpid()}.py"
    cand.write_text(candidate_source(task))
    try:
        v = verify(task, cand, device, cfg, None, record, peaks, times=times, plan=plan,
                   turns=turns)
    finally:
        cand.unlink(missing_ok=True)
    d = v.to_dict()
    failed = {n: c.get("detail", "") for n, c in d["checks"].items() if not c.get("passed")}
    lighter = plan.reductions if plan is not None else {}
    harness_degenerate = d["checks"].get("task_not_degenerate", {}).get("detail", "")
    row: dict[str, Any] = {
        "task": task.id, "accepted": bool(v.accepted), "reasons": list(v.reasons),
        "failed": {k: str(x)[:600] for k, x in failed.items()},
        "max_abs_err": _finite(v.max_abs_err), "rel_err": _finite(v.rel_err),
        "runtime_ms": v.runtime_ms, "roofline_ms": v.roofline_ms,
        "degeneracy": {k: _finite(x) for k, x in deg.items()},
        "harness_degenerate": harness_degenerate,
        "times": reportable_times(times, 3),
    }
    if v.accepted and device.startswith("cuda"):
        # beside the verifier's fp32 eager (runtime_ms), eager as PyTorch runs it by default,
        # where that differs (cuDNN in TF32): what KernelBench's published times measured
        row["eager_default_ms"] = _eager_default_ms(task, device, cfg, turns)
    if lighter:  # verified with a lighter protocol to fit memory (the memory_plan check)
        row["lighter"] = lighter
    if plan is not None:  # where the sets and references lived (where the seconds went)
        row["placement"] = plan.placement
    # helper `mem`'s memory plan: a task that cannot fit gets a `too_large` check or verdict
    if "too_large" in [*v.reasons, *d["checks"], str(d.get("verdict")), str(d.get("status"))]:
        row["status"] = "too_large"
        row["detail"] = str(d["checks"].get("too_large", {}).get("detail", v.error or ""))
    elif deg["degenerate"] or harness_degenerate:
        row["status"] = "degenerate"
    elif v.accepted:
        row["status"] = "accepted"
    else:
        row["status"] = "rejected"
    if v.error and row["status"] not in ("accepted",):
        row["error"] = str(v.error)[:600]
    if share > 1 and not v.accepted and _out_of_memory(row):  # (degenerate ones too: L1_23)
        # The free memory the plan saw was what the tasks in flight left at that moment; they
        # can grow past it (an H200 at 3 jobs: L1_4's worker found 8 of 140 GiB free). A
        # reference cannot be at fault for another process's memory: decided alone, later.
        return {"task": task.id, "status": "deferred", "plan": plan.to_dict() if plan else None,
                "why": "out of device memory while sharing the GPU"}
    return row


def _out_of_memory(row: dict[str, Any]) -> bool:
    text = " ".join([str(row.get("error", "")), *map(str, row.get("failed", {}).values())])
    return "OutOfMemoryError" in text or "out of memory" in text


# --------------------------------------------------------------------------------------------
# Many tasks: worker processes, the JSONL, the budget.

def _pool_init(env: dict[str, str]) -> None:
    os.environ.update(env)
    if sys.platform.startswith("linux"):  # die with the run: no orphan holding device memory
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


# Statuses a rerun may redo (``retry``): an error, a rejection (after a verifier fix), a task too
# large for the GPU it met (on a larger one), a degenerate one (after the criterion changed), an
# accepted one (its numbers again: the worker's memory peaks after a change, with --only).
RETRYABLE = ("error", "rejected", "too_large", "degenerate", "accepted")
# Seconds of a time budget kept for what comes after the last task (summaries, shutdown),
# and the least time left in which a task is started.
BUDGET_RESERVE_S = 10.0
MIN_START_S = 30.0


def _kill_pool(pool: ProcessPoolExecutor, before: set) -> None:
    """SIGKILL the pool's worker processes (the multiprocessing children started since
    ``before``); their sandboxed workers die with them (PDEATHSIG)."""
    import multiprocessing as mp

    for proc in mp.active_children():
        if proc not in before:
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def run_selfcheck(paths: list[Path], device: str, size: str = "large",
                  cfg: VerifyConfig | None = None, jsonl: Path | None = None, jobs: int = 1,
                  budget_s: float | None = None, retry: Collection[str] = (),
                  workdir: Path | None = None,
                  progress: Callable[[str], None] | None = None,
                  on_row: Callable[[dict[str, dict]], None] | None = None) -> dict[str, Any]:
    """Self-check ``paths``; returns {"rows": latest row per task, "stopped": reason or "",
    "killed": tasks stopped in flight, "seconds", "remaining"}.

    ``budget_s`` bounds the whole call: no task starts once the time left (less
    ``BUDGET_RESERVE_S`` for the caller's summaries) is under 1.5x the median task so far (at
    least 30 s), and tasks still in flight when it runs out are killed and left out of the
    JSONL, so a rerun redoes them. ``on_row(rows)``: called with the latest row per task after
    each one is written (the caller's summaries stay current)."""
    import multiprocessing as mp

    from assay.verify.harness import resolve_device

    device = resolve_device(device)
    if size == "auto":
        size = "small" if device == "cpu" else "large"
    say = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    done = latest(read_rows(jsonl))
    todo = [p for p in paths
            if row_key(p, size, device) not in done
            or done[row_key(p, size, device)].get("status") in retry]
    say(f"selfcheck: {len(paths)} tasks on {device} ({size}), {len(paths) - len(todo)} already "
        f"in {jsonl}" if jsonl else f"selfcheck: {len(paths)} tasks on {device} ({size})")
    peaks = None
    if device.startswith("cuda") or device == "cpu":
        from assay.bench.device import peaks as measure

        peaks = measure(device)  # once, cached per device: every task's roofline floor
    ctx = mp.get_context("spawn")
    env = {"ASSAY_CUDA_ARCH": os.environ.get("ASSAY_CUDA_ARCH", "")}
    queue = list(todo)
    alone: list[Path] = []  # deferred: their plan does not fit a 1/jobs part of the machine
    died: dict[str, int] = {}
    seconds: list[float] = []
    stopped = ""
    killed: list[str] = []
    n_done = 0
    deadline = None if budget_s is None else t0 + budget_s - BUDGET_RESERVE_S
    while queue or alone:
        if not queue:  # the deferred ones, fewer at a time (3, 2, then 1 in flight)
            queue, alone, jobs = alone, [], max(1, jobs - 1)
        before = set(mp.active_children())
        pool = ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx,
                                   initializer=_pool_init, initargs=(env,))
        running: dict[Future, Path] = {}
        broken = False
        try:
            while (queue or running) and not broken:
                while queue and len(running) < max(1, jobs) and not stopped:
                    left = None if deadline is None else deadline - time.perf_counter()
                    typical = sorted(seconds)[len(seconds) // 2] if seconds else 0.0
                    if left is not None and left < max(MIN_START_S, 1.5 * typical):
                        stopped = (f"time budget: {left:.0f} s left of {budget_s:.0f} s, a "
                                   f"typical task takes {typical:.0f} s")
                        break
                    p = queue.pop(0)
                    running[pool.submit(check_task, p, device, size, cfg, workdir, peaks,
                                        max(1, jobs))] = p
                if not running:
                    break
                timeout = None if deadline is None else max(deadline - time.perf_counter(), 0)
                finished, _ = wait(list(running), timeout=timeout, return_when=FIRST_COMPLETED)
                if not finished:  # the budget ran out with tasks in flight: killed, not done
                    killed = [str(p) for p in running.values()]
                    stopped = (f"time budget: {budget_s:.0f} s ran out with {len(killed)} "
                               f"task(s) in flight, killed (a rerun redoes them)")
                    say(stopped + ": " + ", ".join(Path(k).stem for k in killed))
                    _kill_pool(pool, before)
                    running = {}
                    broken = True
                    break
                for fut in finished:
                    p = running.pop(fut)
                    try:
                        row = fut.result()
                    except BrokenProcessPool:
                        broken = True
                        died[str(p)] = died.get(str(p), 0) + 1
                        if died[str(p)] < 2 and jobs > 1:
                            queue.insert(0, p)  # maybe another task's death: once more
                            continue
                        row = {"path": str(p), "size": size, "device": device,
                               "key": row_key(p, size, device), "status": "error",
                               "error": "the self-check process died (segfault or killed for "
                                        "memory)", "seconds": None}
                    if row.get("status") == "deferred":
                        alone.append(p)  # too big for this share: again with fewer in flight
                        why = row.get("why") or "does not fit a share of the GPU"
                        say(f"{row.get('task')}: deferred ({why}), runs later with fewer in flight")
                        continue
                    seconds.append(row.get("seconds") or 0.0)
                    n_done += 1
                    append_row(jsonl, row)
                    done[row["key"]] = row
                    if on_row is not None:
                        on_row(done)
                    say(_progress_line(row, n_done, len(todo), time.perf_counter() - t0))
            if broken:  # the in-flight tasks of a dead pool are retried in a fresh one
                for fut, p in running.items():
                    died[str(p)] = died.get(str(p), 0) + 1
                    queue.insert(0, p)
        finally:
            pool.shutdown(wait=not broken, cancel_futures=True)
        if stopped:
            break
    rows = {row_key(p, size, device): done[row_key(p, size, device)] for p in paths
            if row_key(p, size, device) in done}
    return {"rows": rows, "stopped": stopped, "killed": killed,
            "seconds": time.perf_counter() - t0, "remaining": len(paths) - len(rows)}


def _progress_line(row: dict[str, Any], i: int, n: int, elapsed: float) -> str:
    what = row["status"]
    if what == "rejected":
        what += ": " + ", ".join(row.get("reasons", []))
    elif what == "error":
        what += ": " + str(row.get("error", ""))[:200]
    eta = elapsed / i * (n - i)
    return (f"[{i}/{n}] {row.get('task') or Path(row['path']).stem} {what} "
            f"({row.get('seconds') or 0:.1f} s; {elapsed / 60:.1f} min elapsed, "
            f"~{eta / 60:.1f} min left)")


# --------------------------------------------------------------------------------------------
# The summary.

def _g(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, (int, float)) else ("-" if x is None else str(x))


def summary_markdown(rows: list[dict[str, Any]], title: str = "Reference self-check") -> str:
    """Counts per status; the degenerate tasks with their numbers; every rejection and error
    with its reasons; seconds per task."""
    by: dict[str, list[dict]] = {s: [] for s in STATUSES}
    for r in rows:
        by.setdefault(r.get("status", "error"), []).append(r)
    secs = sorted(r["seconds"] for r in rows if isinstance(r.get("seconds"), (int, float)))
    out = [f"# {title}", "",
           f"{len(rows)} tasks: " + ", ".join(f"{len(by[s])} {s}" for s in STATUSES) + ".",
           ""]
    if secs:
        out += [f"Seconds per task: median {secs[len(secs) // 2]:.1f}, max {secs[-1]:.1f}, "
                f"total {sum(secs) / 60:.1f} min.", ""]
    name = lambda r: r.get("task") or Path(r["path"]).stem  # noqa: E731
    if by["degenerate"]:
        out += ["## Degenerate (listed, not judged)", "",
                "| task | output spread | input sensitivity | weight sensitivity | finite | "
                "reference accepted | why |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in by["degenerate"]:
            d = r.get("degeneracy", {})
            why = d.get("why") or r.get("harness_degenerate", "")
            out.append(f"| {name(r)} | {_g(d.get('output_spread'))} | "
                       f"{_g(d.get('input_sensitivity'))} | {_g(d.get('weight_sensitivity'))} | "
                       f"{d.get('finite', '-')} | {r.get('accepted', '-')} | {why[:160]} |")
        out.append("")
    lighter = [r for r in rows if r.get("lighter")]
    if lighter:
        out += ["## Verified with a lighter protocol (to fit memory)", "",
                "| task | status | steps taken |", "| --- | --- | --- |"]
        for r in lighter:
            steps = "; ".join(r["lighter"].values()).replace("|", "\\|")
            out.append(f"| {name(r)} | {r.get('status')} | {steps} |")
        out.append("")
    for status, head in (("rejected", "Rejected (a finding: honest work refused)"),
                         ("too_large", "Too large for the device"), ("error", "Errors")):
        if by[status]:
            out += [f"## {head}", "", "| task | reasons | detail |", "| --- | --- | --- |"]
            for r in by[status]:
                detail = r.get("detail") or r.get("error") or "; ".join(
                    f"{k}: {v}" for k, v in r.get("failed", {}).items())
                detail = " ".join(str(detail).split()).replace("|", "\\|")[:300]
                out.append(f"| {name(r)} | {', '.join(r.get('reasons', [])) or '-'} | "
                           f"{detail} |")
            out.append("")
    out += seconds_table(rows)
    out += ["## Every task", "", "| task | status | seconds | max abs err | rel err |",
            "| --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {name(r)} | {r.get('status')} | {_g(r.get('seconds'))} | "
                   f"{_g(r.get('max_abs_err'))} | {_g(r.get('rel_err'))} |")
    return "\n".join(out) + "\n"


# Where a task's seconds go: the row's ``times`` (assay.verify.harness.verify's breakdown).
PHASES = (("plan_s", "memory plan (meta pass)"), ("cost_s", "cost record (FLOPs, bytes)"),
          ("degeneracy_s", "degeneracy record"),
          ("prepare_s", "reference preparation (every set, float64 included)"),
          ("inputs_arena_s", "input arena (host transfer)"), ("spawn_s", "worker start"),
          ("import_s", "worker imports torch"), ("worker.materialize_s", "worker: inputs in"),
          ("worker.load_s", "worker: candidate load"),
          ("worker.correctness_s", "worker: correctness and staleness calls"),
          ("worker.timing_s", "worker: timing"), ("worker.after_s", "worker: after timing"),
          ("exit_s", "worker exit"), ("compare_s", "comparison (landing to references)"))


def seconds_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: per phase, the median and the total over the tasks that ran it."""
    timed = [r for r in rows if isinstance(r.get("times"), dict)]
    if not timed:
        return []
    out = ["## Where the seconds go", "", "| phase | median s | total s | share |",
           "| --- | --- | --- | --- |"]
    total = sum(r.get("seconds") or 0.0 for r in timed) or 1.0
    for key, label in PHASES:
        xs = sorted(float(r["times"][key]) for r in timed
                    if isinstance(r["times"].get(key), (int, float)))
        if xs:
            out.append(f"| {label} | {xs[len(xs) // 2]:.2f} | {sum(xs):.1f} | "
                       f"{sum(xs) / total:.0%} |")
    out.append(f"| whole task | {sorted(r.get('seconds') or 0.0 for r in timed)[len(timed) // 2]:.2f}"
               f" | {total:.1f} | 100% |")
    return out + [""]


def summary_table(rows: list[dict[str, Any]]) -> str:
    """The terminal's end-of-run table (rich)."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    t = Table(title="assay selfcheck")
    for col in ("task", "status", "seconds", "why"):
        t.add_column(col)
    for r in rows:
        why = ""
        if r.get("status") == "degenerate":
            d = r.get("degeneracy", {})
            why = (f"spread {_g(d.get('output_spread'))}, inputs {_g(d.get('input_sensitivity'))}"
                   f", weights {_g(d.get('weight_sensitivity'))}")
        elif r.get("status") in ("rejected", "too_large", "error"):
            why = ", ".join(r.get("reasons", [])) or str(r.get("error") or r.get("detail"))[:120]
        t.add_row(r.get("task") or Path(r["path"]).stem, str(r.get("status")),
                  _g(r.get("seconds")), why)
    buf = StringIO()
    Console(file=buf, width=140).print(t)
    counts = {s: sum(r.get("status") == s for r in rows) for s in STATUSES}
    return buf.getvalue() + ", ".join(f"{n} {s}" for s, n in counts.items()) + "\n"


# --------------------------------------------------------------------------------------------
# `assay selfcheck` (argparse lives in assay.cli).

def cli(args) -> int:
    """Exit 0 when every task not degenerate was accepted, 1 when any was rejected, too large
    or failed, 2 on bad usage; 3 when the time budget stopped the run before the end."""
    try:
        paths = task_files(args.tasks)
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not paths:
        print(f"error: {', '.join(args.tasks)}: no task files", file=sys.stderr)
        return 2
    jsonl = Path(args.jsonl) if args.jsonl else None
    out = run_selfcheck(paths, args.device, args.size, jsonl=jsonl, jobs=args.jobs,
                        budget_s=args.budget_s, retry=args.retry)
    rows = list(out["rows"].values())
    try:
        print(summary_table(rows), end="")
    except ImportError:  # rich is not on every GPU box: the markdown says the same
        print(summary_markdown(rows), end="")
    if args.markdown:
        Path(args.markdown).write_text(summary_markdown(rows))
    if out["stopped"]:
        print(f"stopped: {out['stopped']}; {out['remaining']} tasks left (run again to resume)",
              file=sys.stderr)
        return 3
    bad = [r for r in rows if r.get("status") not in ("accepted", "degenerate")]
    return 1 if bad else 0


def add_parser(sub) -> None:
    s = sub.add_parser("selfcheck", help="each task's own Model as the candidate: must pass",
                       description=__doc__.split("\n\n")[0])
    s.add_argument("--tasks", nargs="+", required=True,
                   help="task files or folders (a level folder, or a KernelBench root)")
    s.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    s.add_argument("--size", default="auto", choices=["auto", "large", "small"],
                   help="task size; auto: small on cpu, large on cuda")
    s.add_argument("--jsonl", help="one JSON line per task; tasks already in it are skipped")
    s.add_argument("--markdown", help="also write the summary as markdown here")
    s.add_argument("--jobs", type=int, default=1,
                   help="tasks in flight at once (each in its own process)")
    s.add_argument("--budget-s", type=float, default=None,
                   help="bound the whole run: start no task that would likely end past "
                        "it, kill what is in flight when it runs out (a rerun redoes it)")
    s.add_argument("--retry", nargs="+", default=[], choices=RETRYABLE, metavar="STATUS",
                   help="redo tasks whose JSONL row has one of these statuses "
                        f"({', '.join(RETRYABLE)})")
    s.set_defaults(fn=cli)
