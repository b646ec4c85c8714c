"""Batch verification: a folder of candidates (your own kernels) for one or many tasks.

``assay verify --task T.py|DIR --candidate C.py|DIR [--jsonl OUT]``: when either is a folder,
candidates are paired with tasks by name, in any of these layouts:

- KernelBench's runs folder: ``level_<L>_problem_<P>_sample_<S>_kernel.py`` (what KernelBench's
  generation scripts write into ``runs/<run name>/``), paired with the task numbered P in
  level folder L of ``--task`` (a KernelBench root, ``KernelBench/KernelBench``);
- a folder per task: ``<candidates>/<task file stem or task id>/*.py``;
- files named after the task: ``<task stem>.py`` or ``<task stem>_<anything>.py`` (the longest
  task stem that fits wins);
- with one task, every ``.py`` file in the folder is its candidate.

Candidates of one task are verified one after another against one preparation (the secret
inputs and the references are computed once per task), with the baselines and the task's
record (FLOPs, bytes, degeneracy) from the cache (``assay.bench.baseline_cache``). Every
candidate's kernels build on the CPU cores (a pool of sandboxed ``assay.bench.prebuild``
processes, ``build_workers`` at a time: candidate code is hostile, builds included) while the
device verifies others. One JSON line per candidate, as soon as it is decided; a rerun with
the same JSONL skips candidates already in it (the same folder and file name, the same content,
the same task content; absolute paths do not matter, so a folder carried to another machine
resumes).
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assay.tasks.model import Task, TaskError, level_of, one_line
from assay.verify.rows import append_row, latest, read_rows
from assay.verify.selfcheck import task_files

if TYPE_CHECKING:
    from assay.bench.baseline_cache import WarmChildren

KB_RUNS = re.compile(r"^level_(?P<level>\d+)_problem_(?P<problem>\d+)_sample_(?P<sample>\d+)"
                     r"_kernel\.py$")
_NUMBER = re.compile(r"^(?P<number>\d+)_")


@dataclass(frozen=True)
class Pair:
    task: Path
    candidate: Path


def _task_names(t: Path) -> set[str]:
    from assay.tasks.model import task_id_for

    return {t.stem, task_id_for(level_of(t), t)}


def pair_candidates(tasks: list[Path], candidates: Path) -> tuple[list[Pair], list[str]]:
    """(pairs in task order, one line per candidate file that names no task)."""
    if candidates.is_file():
        files, root = [candidates], candidates.parent
    else:
        files, root = sorted(candidates.rglob("*.py")), candidates
    by_number: dict[tuple[int, int], Path] = {}
    by_name: dict[str, Path] = {}
    for t in tasks:
        m = _NUMBER.match(t.name)
        if m:
            by_number.setdefault((level_of(t), int(m.group("number"))), t)
        for n in _task_names(t):
            by_name.setdefault(n, t)
    stems = sorted(by_name, key=len, reverse=True)
    pairs, unmatched = [], []
    for f in files:
        if f.name.startswith("_"):
            continue
        m = KB_RUNS.match(f.name)
        rel = f.relative_to(root).parts
        task = None
        if m:
            task = by_number.get((int(m.group("level")), int(m.group("problem"))))
        elif len(rel) > 1 and rel[0] in by_name:
            task = by_name[rel[0]]
        else:
            task = next((by_name[s] for s in stems
                         if f.stem == s or f.stem.startswith((s + "_", s + "-", s + "."))), None)
        if task is None and len(tasks) == 1:
            task = tasks[0]
        if task is None:
            unmatched.append(f"{f}: names no task in the task folder")
        else:
            pairs.append(Pair(task, f))
    order = {t: i for i, t in enumerate(tasks)}
    pairs.sort(key=lambda p: (order[p.task], str(p.candidate)))
    return pairs, unmatched


def candidate_key(pair: Pair, device: str, policy: str, size: str) -> str:
    """A candidate's identity in the JSONL: its folder and file name, its content and its
    task's (not absolute paths: a folder carried to another machine resumes)."""
    h = hashlib.sha256(pair.candidate.read_bytes()).hexdigest()[:16]
    t = hashlib.sha256(pair.task.read_bytes()).hexdigest()[:16]
    c = pair.candidate
    return f"{c.parent.name}/{c.name}|{h}|{pair.task.name}|{t}|{device}|{policy}|{size}"


def run_batch(pairs: list[Pair], device: str, cfg, size: str = "auto", jsonl: Path | None = None,
              baselines: bool = True, compile_: bool = True, build_workers: int = 4,
              build_timeout_s: float = 600.0, budget_s: float | None = None,
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Verify every pair; returns the rows of this run's pairs (from the JSONL when resumed).
    ``budget_s``: start no candidate once the time left is under 1.5x the slowest so far."""
    from assay.bench.baseline_cache import WarmChildren
    from assay.verify.compile_service import CompileService, pin_cuda_arch
    from assay.verify.harness import resolve_device

    say = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    device = resolve_device(device)
    if size == "auto":
        size = "small" if device == "cpu" else "large"
    keys = {p: candidate_key(p, device, cfg.policy, size) for p in pairs}
    done = latest(read_rows(jsonl))
    todo = [p for p in pairs if keys[p] not in done]
    say(f"verify: {len(pairs)} candidates of {len({p.task for p in pairs})} tasks on {device}"
        + (f", {len(pairs) - len(todo)} already in {jsonl}" if jsonl else ""))
    builds = None
    if todo and build_workers > 0:
        # Builds on the CPU cores while the device verifies. On the cpu target the builds
        # would share the cores being timed, so there they all finish before the first
        # verification (still in parallel, and each worker then imports a cached library).
        if device.startswith("cuda"):
            pin_cuda_arch()
        builds = CompileService(build_workers, build_timeout_s, cfg.limits)
        for p in todo:
            builds.submit(p.candidate)
        if device == "cpu":
            t_build = time.perf_counter()
            for p in todo:
                builds.wait(p.candidate)
            say(f"verify: {len(todo)} builds done in {time.perf_counter() - t_build:.1f} s "
                f"({build_workers} at a time) before any timing (cpu target)")
    t0 = time.perf_counter()
    n, slowest = 0, 0.0
    # each task's baseline in a trusted process of its own, on a GPU started one task ahead
    children = WarmChildren(ahead=device.startswith("cuda"))

    def out_of_time() -> bool:
        return budget_s is not None and \
            budget_s - (time.perf_counter() - t0) < max(1.5 * slowest, 5.0)

    try:
        for task_path in dict.fromkeys(p.task for p in todo):
            if out_of_time():
                break
            group = [p for p in todo if p.task == task_path]
            ctx = _TaskContext.open(task_path, size, device, cfg, baselines, compile_, say,
                                    children)
            try:
                for p in group:
                    if out_of_time():
                        say(f"verify: time budget reached; {len(todo) - n} candidates left")
                        break
                    t_row = time.perf_counter()
                    row = ctx.verify(p, builds)
                    slowest = max(slowest, time.perf_counter() - t_row)
                    row["key"] = keys[p]
                    append_row(jsonl, row)
                    done[keys[p]] = row
                    n += 1
                    say(_line(row, n, len(todo), time.perf_counter() - t0))
            finally:
                ctx.close()
    finally:
        children.close()
        if builds:
            builds.close()
    return [done[keys[p]] for p in pairs if keys[p] in done]


class _TaskContext:
    """What the candidates of one task share: the task, its record, baseline and preparation."""

    def __init__(self, path: Path, device: str, cfg, error: str = ""):
        self.path, self.device, self.cfg, self.error = path, device, cfg, error
        self.task = self.record = self.baseline = self.prepared = self.peaks = self.plan = None
        self.baseline_cached = self.record_cached = False
        self.setup_s = 0.0

    @classmethod
    def open(cls, path: Path, size: str, device: str, cfg, baselines: bool, compile_: bool,
             say, children: WarmChildren) -> "_TaskContext":
        from assay.bench.baseline_cache import cached_record
        from assay.bench.device import peaks
        from assay.verify.harness import prepare
        from assay.verify.memory import TooLarge, plan_task

        t0 = time.perf_counter()
        ctx = cls(path, device, cfg)
        try:
            ctx.task = Task.from_file(path, size=size)
            ctx.task.module()
            ctx.plan = plan_task(ctx.task, device, cfg)
            if ctx.plan is not None and not ctx.plan.fits:
                # each candidate's verdict says too_large with the numbers; nothing is timed
                say(f"task {path.name}: too large: {ctx.plan.too_large_detail()}")
                return ctx
            ctx.record, ctx.record_cached = cached_record(ctx.task, device)
            ctx.peaks = peaks(device)
            if baselines:
                ctx.baseline, ctx.baseline_cached = _baseline(ctx.task, device, cfg, compile_,
                                                              children)
            if not ctx.record["degeneracy"]["degenerate"]:
                try:
                    ctx.prepared = prepare(ctx.task, device, cfg, ctx.plan)
                except TooLarge:
                    pass  # each verdict records it
        except TaskError as e:
            ctx.error = str(e)
        except Exception as e:  # noqa: BLE001 - recorded on every candidate of the task
            ctx.error = f"{path}: {one_line(e, 500)}"
        ctx.setup_s = time.perf_counter() - t0
        if ctx.error:
            say(f"task {path.name}: {ctx.error}")
        return ctx

    def verify(self, pair: Pair, builds) -> dict[str, Any]:
        from assay.verify.harness import reportable_times, verify

        row: dict[str, Any] = {"task": self.task.id if self.task else pair.task.stem,
                               "task_path": str(pair.task), "candidate": str(pair.candidate),
                               "device": self.device, "policy": self.cfg.policy}
        t0 = time.perf_counter()
        built = builds.wait(pair.candidate) if builds else None
        row["build_s"] = round(built.seconds, 2) if built else None
        row["build_wait_s"] = round(time.perf_counter() - t0, 2)
        if self.error:
            row.update(accepted=False, status="task_error", error=self.error)
            return row
        times: dict[str, Any] = {"task_setup_s": round(self.setup_s, 2),
                                 "baseline_cached": self.baseline_cached,
                                 "record_cached": self.record_cached}
        try:
            v = verify(self.task, pair.candidate, self.device, self.cfg, self.baseline,
                       self.record, self.peaks, self.prepared, times=times, plan=self.plan)
        except Exception as e:  # noqa: BLE001 - the harness failed, not the candidate
            row.update(accepted=False, status="error", error=one_line(e, 500))
            return row
        self.setup_s = 0.0  # charged to the task's first candidate only
        verdict = v.to_dict()
        row = {**verdict, **row, "candidate_id": verdict.get("candidate")}
        row["status"] = "accepted" if v.accepted else \
            "too_large" if "too_large" in v.reasons else "rejected"
        row["times"] = reportable_times(times, 3)
        row["seconds"] = round(time.perf_counter() - t0, 2)
        return row

    def close(self) -> None:
        from assay.verify.selfcheck import _release

        self.prepared = None
        _release(self.device)


def _baseline(task: Task, device: str, cfg, compile_: bool,
              children: WarmChildren) -> tuple[dict, bool]:
    from assay.bench.baseline import time_reference
    from assay.bench.baseline_cache import cached_baseline
    from assay.bench.timing import TimingConfig

    tcfg = TimingConfig.of(cfg)

    def time_it() -> dict:
        child = children.take()
        try:
            return child.run(time_reference, task, device, tcfg, compile_)
        finally:
            child.close()  # (its one job done: joined, not left to exit unwaited)
            children.refill()  # the next task's process imports while these candidates verify

    return cached_baseline(task, device, tcfg, compile_, time_it)


def _line(row: dict[str, Any], i: int, n: int, elapsed: float) -> str:
    what = row.get("status", "?")
    if what == "accepted" and row.get("speedup_eager"):
        what += f", {row['speedup_eager']:.2f}x eager"
    elif what != "accepted":
        what += ": " + (", ".join(row.get("reasons") or []) or str(row.get("error", ""))[:200])
    return (f"[{i}/{n}] {row['task']} {Path(row['candidate']).name} {what} "
            f"(build {row.get('build_s') or 0:.1f} s, waited {row.get('build_wait_s') or 0:.1f}"
            f" s, verify {row.get('seconds') or 0:.1f} s; {i / max(elapsed, 1e-9) * 3600:.0f}"
            f"/hour)")


def cli(args, cfg) -> int:
    """``assay verify`` with a folder: exit 0 when every candidate was accepted, 1 when any
    was not, 2 on bad usage (no task, no candidate, a candidate naming no task)."""
    try:
        tasks = task_files([args.task])
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cands = Path(args.candidate)
    if not cands.exists():
        print(f"error: {cands}: no such candidate file or folder", file=sys.stderr)
        return 2
    pairs, unmatched = pair_candidates(tasks, cands)
    for line in unmatched:
        print(f"warning: {line}", file=sys.stderr)
    if not pairs:
        print(f"error: {cands}: no candidate pairs with a task of {args.task}", file=sys.stderr)
        return 2
    rows = run_batch(pairs, args.device, cfg, args.size,
                     jsonl=Path(args.jsonl) if args.jsonl else None,
                     baselines=not args.no_baseline, compile_=not args.no_compile,
                     build_workers=args.build_workers)
    acc = sum(bool(r.get("accepted")) for r in rows)
    print(f"{acc}/{len(rows)} candidates accepted" + (f"; rows in {args.jsonl}" if args.jsonl
                                                      else ""))
    for r in rows:
        if not r.get("accepted"):
            why = ", ".join(r.get("reasons") or []) or r.get("error", "")
            print(f"  {r['task']} {Path(r['candidate']).name}: {why}")
    return 0 if acc == len(rows) else 1
