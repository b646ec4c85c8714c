"""assay: judge kernels against PyTorch tasks, run campaigns of LLM-written kernels, and
compare and report them.

  assay verify --task T.py --candidate C.py [--device cuda|cpu] [--json out.json]
      exit 0 accepted, 1 rejected, 2 bad usage, unreadable input or a device not there
  assay verify --task DIR|T.py --candidate DIR [--jsonl out.jsonl]   a folder of candidates
      exit 0 all accepted, 1 any not, 2 bad usage
  assay compare [CAMPAIGN ...] [--results results]
  assay export CAMPAIGN ... / assay report CAMPAIGN ... [--mlflow-ui URL] [--compare-with C ...]
  assay selfcheck --tasks PATH... [--device D] [--jsonl OUT]
      each task's own Model as the candidate; exit 0 all accepted or degenerate, 1 not
  assay run [HYDRA_OVERRIDE|TARGET ...] [--cores N] [--dry-run] [--rerun TASK]
      the campaign DAG through Snakemake (`assay run --help`)

argparse keeps `assay verify` light: it runs on the GPU machine with torch and small wheels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
from pathlib import Path


def _verify(args: argparse.Namespace) -> int:
    import time

    if Path(args.candidate).is_dir() or Path(args.task).is_dir():
        return _verify_folder(args)
    from assay.tasks.model import Task, TaskError, resolve_size

    times: dict[str, float | str] = {}
    t = time.perf_counter()
    cand = Path(args.candidate)
    if not cand.is_file():
        print(f"error: {cand}: candidate file not found", file=sys.stderr)
        return 2
    from assay.verify.preflight import preflight

    # Parsed, never run: a candidate that cannot parse, lacks ModelNew or imports what is not
    # installed is rejected before anything is timed.
    refused = preflight(cand)
    device = _device(args.device)
    if device is None:
        print("error: --device cuda: no CUDA device is visible on this machine "
              "(use --device cpu or auto)", file=sys.stderr)
        return 2
    from assay.app import compose

    t_cfg = time.perf_counter()
    composed = compose(_verify_overrides(args, device))
    times["config_s"] = time.perf_counter() - t_cfg
    _hold_cpu_threads(device, composed)
    from assay.bench.baseline_cache import TrustedChild

    child = None if args.no_baseline or refused else TrustedChild()
    try:
        cand.read_text()
        task = Task.from_file(args.task, size=resolve_size(args.size, device))
        task.module()
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: {cand}: cannot read candidate: {e}", file=sys.stderr)
        return 2
    times["load_task_s"] = time.perf_counter() - t - times["config_s"]

    from assay.bench.baseline import time_reference
    from assay.bench.baseline_cache import baseline_is_cached, cached_baseline, cached_record
    from assay.bench.timing import TimingConfig
    from assay.verify.config import from_cfg
    from assay.verify.harness import reportable_times, verify
    from assay.verify.memory import plan_task

    cfg = from_cfg(composed.verify)
    tcfg, compile_ = TimingConfig.of(cfg), not args.no_compile
    # On cpu the baseline's process compiles the reference while this one plans and prepares,
    # and times it only once this one is done (it waits for the lease, held until then). Not on
    # cuda: the compile's input sets would take device memory the plan counts as free.
    cached = child is not None and not args.retime_baseline \
        and baseline_is_cached(task, device, tcfg, compile_)
    if cached:
        child.close()  # not needed: its imports would only take the cores this one works on
    early = child is not None and device == "cpu" and not cached
    prep = None
    if early:
        child.lease.acquire()
        child.submit(time_reference, task, device, tcfg, compile_, held=True)
    try:
        # A task too large for this machine's memory is decided before any baseline too.
        t = time.perf_counter()
        plan = None if refused else plan_task(task, device, cfg)
        times["plan_s"] = time.perf_counter() - t
        baseline = record = peaks = None
        fits = not refused and (plan is None or plan.fits)
        if fits:
            from assay.bench.device import peaks as device_peaks

            t = time.perf_counter()
            # Cached per (task, device, torch version) beside the baselines: seconds on a
            # GB-sized task, the same for every candidate of it (assay.bench.baseline_cache).
            record, hit = cached_record(task, device, refresh=args.retime_baseline)
            times["record_cached"] = "yes" if hit else "no"
            peaks = device_peaks(device)
            times["record_s"] = time.perf_counter() - t
        if fits and early:
            from assay.verify.memory import TooLarge
            from assay.verify.reference import prepare

            t = time.perf_counter()
            with contextlib.suppress(TooLarge):  # (verify prepares again and says too_large)
                prep = prepare(task, device, cfg, plan)
            times["prepare_s"] = time.perf_counter() - t
    finally:
        if early:
            child.lease.release()
    if fits and child is not None:
        t = time.perf_counter()
        try:
            # Cached per (task, device, torch version, timing config): a second candidate
            # of the task reuses it (assay.bench.baseline_cache).
            baseline, hit = cached_baseline(
                task, device, tcfg, compile_,
                child.result if child.submitted else
                lambda: child.run(time_reference, task, device, tcfg, compile_),
                refresh=args.retime_baseline)
            times["baseline_cached"] = "yes" if hit else "no"
        except RuntimeError as e:  # judged all the same, without a speedup
            print(f"warning: baseline timing failed: {e}", file=sys.stderr)
            times["baseline_error"] = str(e)[:300]
        times["baseline_s"] = time.perf_counter() - t
    if child is not None:
        child.close()
    verdict = verify(task, cand, device, cfg, baseline, record, peaks, times=times,
                     plan=plan, prepared=prep)
    out = {**verdict.to_dict(), "times": reportable_times(times)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str) + "\n")
    summary = "ACCEPTED" if verdict.accepted else "REJECTED: " + ", ".join(verdict.reasons)
    speed = (f" speedup {verdict.speedup_eager:.2f}x eager"
             if verdict.accepted and verdict.speedup_eager else "")
    print(f"{cand.name} on {task.id} ({device}, {task.size} size, {cfg.policy}): "
          f"{summary}{speed}")
    for name in verdict.reasons:
        print(f"  {name}: {verdict.checks[name]['detail'][:400]}")
    return 0 if verdict.accepted else 1


def _verify_folder(args: argparse.Namespace) -> int:
    """``assay verify`` with a folder for the task or the candidate: a batch, one JSON line per
    candidate (assay.verify.batch)."""
    from assay.app import compose
    from assay.tasks.model import resolve_size
    from assay.verify.batch import cli as batch
    from assay.verify.config import from_cfg

    device = _device(args.device)
    if device is None:
        print("error: --device cuda: no CUDA device is visible on this machine "
              "(use --device cpu or auto)", file=sys.stderr)
        return 2
    composed = compose(_verify_overrides(args, device))
    _hold_cpu_threads(device, composed)
    args.device, args.size = device, resolve_size(args.size, device)
    return batch(args, from_cfg(composed.verify))


def _verify_overrides(args: argparse.Namespace, device: str) -> list[str]:
    """The Hydra overrides `assay verify` takes from its options (the verify group) and its
    device (the target group: on cpu, the thread count it times on). One compose for both
    (Hydra's is 0.3-0.6 s)."""
    return [f"verify={args.policy}"] + ([f"verify.transfer={args.transfer}"]
                                        if args.transfer else []) \
        + (["target=cpu"] if device == "cpu" else [])


def _hold_cpu_threads(device: str, composed) -> None:
    """On cpu, eager, torch.compile and the candidate compute on the campaign's thread count
    (target.cpu_threads), here and in every process started after (the baseline's child, the
    sandboxed worker): with the libraries' default of one thread per core, a reference sharing
    a busy machine waits at each OpenMP barrier for a descheduled thread (a tiny MLP measured
    23 ms eager instead of 0.02 ms, and its candidate '156x faster')."""
    if device != "cpu":
        return
    from assay import gpu

    gpu.hold_cpu_threads(int(composed.target.cpu_threads))


def _device(name: str) -> str | None:
    """cpu, cuda, or None for cuda asked on a machine that shows none."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        return None
    return name


def _campaigns(args: argparse.Namespace):
    from assay.layout import Campaign

    names = args.campaigns or ["default"]
    out = []
    for n in names:
        c = Campaign.at(args.results, n)
        if not c.root.is_dir():
            raise SystemExit(f"error: {c.root}: no such campaign folder")
        out.append(c)
    return out


def _compare(args: argparse.Namespace) -> int:
    from assay.report.compare import compare_table, render_compare

    print(render_compare(compare_table(_campaigns(args))))
    return 0


def _export(args: argparse.Namespace) -> int:
    from assay.archive.export import export

    for c in _campaigns(args):
        for p in export(c):
            print(p)
    return 0


def _report(args: argparse.Namespace) -> int:
    from assay.layout import Campaign
    from assay.report.html import write_report

    others = []
    for n in args.compare_with or []:
        c = Campaign.at(args.results, n)
        if not c.root.is_dir():
            raise SystemExit(f"error: {c.root}: no such campaign folder")
        others.append(c)
    for c in _campaigns(args):
        print(write_report(c, mlflow_ui=args.mlflow_ui, compare_with=others))
    return 0


def snakemake_command(words: list[str], cores: int, dry_run: bool = False,
                      forcerun: list[str] = (), extra: list[str] = (),
                      snakefile: Path | None = None) -> list[str]:
    """The Snakemake command line of ``assay run``: ``words`` holding ``=`` are Hydra overrides,
    the others targets. Targets come first because ``--forcerun`` and ``--config`` take every
    word after them; with no override, workflow.yaml's defaults apply, as for a bare
    ``snakemake``."""
    overrides = [w for w in words if "=" in w]
    targets = [w for w in words if "=" not in w]
    cmd = [sys.executable, "-m", "snakemake", "--cores", str(cores)]
    if snakefile is not None:
        cmd += ["--snakefile", str(snakefile)]
    if dry_run:
        cmd.append("--dry-run")
    cmd += targets
    if forcerun:
        cmd += ["--forcerun", *forcerun]
    if overrides:
        cmd += ["--config", "overrides=[" + ",".join(overrides) + "]"]
    return cmd + list(extra)


def profile_args(extra: list[str], cwd: Path | None = None) -> list[str]:
    """The workflow profile for Snakemake run on the package's Snakefile: the folder's own
    profiles/default if it has one (a checkout's), else the package's, so `assay run` from any
    folder resumes a killed campaign (rerun-incomplete, nolock, keep-going: the profile's) as a
    bare `snakemake` in the checkout does. A profile named after `--` wins."""
    if any(a.split("=")[0] in ("--profile", "--workflow-profile") for a in extra):
        return []
    if ((cwd or Path.cwd()) / "profiles" / "default").is_dir():
        return []  # Snakemake finds it there by itself
    from assay.resources import package_dir

    return ["--workflow-profile", str(package_dir() / "workflow" / "profiles" / "default")]


def rerun_files(overrides: list[str], tasks: list[str]) -> list[str]:
    """The first file of each task's DAG, one per LLM backend (translation's proposals):
    forcing it redoes every stage of the task, verification included, then the campaign's
    MLflow runs, archive and report."""
    from assay.app import UserError, campaign, compose, task_refs

    cfg = compose(overrides)
    known = {r.id for r in task_refs(cfg)[0]}
    for t in tasks:
        if t not in known:
            raise UserError(f"--rerun {t}: not a task of campaign {cfg.campaign} "
                            f"(tasks.source={cfg.tasks.source}, with its filters)")
    c = campaign(cfg)
    return [str(c.proposals(str(llm), t, 0)) for t in tasks for llm in cfg.llms]


def _run(args: argparse.Namespace) -> int:
    from assay.app import UserError, workflow_overrides
    from assay.resources import snakefile

    overrides = [w for w in args.words if "=" in w] or workflow_overrides()
    try:
        forced = rerun_files(overrides, args.rerun) if args.rerun else []
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # This interpreter runs Snakemake (and through it every step) on the Snakefile inside the
    # package, so `assay run` works from any folder; results land in the current one.
    extra = profile_args(args.snakemake_args) + list(args.snakemake_args)
    cmd = snakemake_command(args.words, args.cores, args.dry_run, forced, extra, snakefile())
    print("assay: " + " ".join(shlex.quote(w) for w in cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd)


RUN_HELP = """\
Run the campaign DAG with Snakemake in this folder (results/ lands here).

  assay run                                   the default campaign
  assay run campaign=ci tasks=ci evolve=ci    the CI campaign (Hydra overrides)
  assay run --rerun L1_1_ReLU                 every stage of one task again, verdicts included
  assay run --dry-run                         the jobs a run would do, doing none
  assay run campaign=ci -- --keep-incomplete  words after -- go to Snakemake as they are

Words holding '=' are Hydra overrides, the others Snakemake targets (files under results/).
The workflow profile is this folder's profiles/default if it has one, else the package's
(name another after --: --workflow-profile slurm). The command it runs is printed first.
To start a task from scratch, delete results/<campaign>/<llm>/<task>/ and run again.
`make run`, `make dry-run` and `make rerun TASK=...` call this."""


def parser() -> argparse.ArgumentParser:
    from assay.verify.settings import Transfer  # (dataclasses only: no torch)

    p = argparse.ArgumentParser(prog="assay", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser(
        "verify", help="judge one candidate against one task, or a folder of candidates",
        description="Judge one candidate (a file defining class ModelNew) against one task (a "
                    "KernelBench-format file): correctness on secret inputs against float64, "
                    "the anti-cheating checks, and its speed against eager and torch.compile.",
        epilog="exit status: 0 accepted, 1 rejected (the reasons are printed, one per line), "
               "2 bad usage, an unreadable file, or a device that is not there")
    v.add_argument("--task", required=True,
                   help="task file (KernelBench format), or a folder of them (a KernelBench root)")
    v.add_argument("--candidate", required=True,
                   help="candidate file defining class ModelNew, or a folder of candidates "
                        "(KernelBench runs layout, <task stem>/*.py, or files named after tasks)")
    v.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="where the candidate runs (auto: cuda if a GPU is visible, else cpu; "
                        "on cpu, Triton kernels run in Triton's interpreter)")
    v.add_argument("--json", metavar="FILE",
                   help="write the verdict JSON here, with seconds per phase under 'times'")
    v.add_argument("--policy", default="strict", choices=["strict", "permissive"],
                   help="strict: custom kernels only, any library or ATen compute op "
                        "rejects; permissive: library calls allowed and reported")
    v.add_argument("--transfer", choices=[t.value for t in Transfer], default=None,
                   help="how the sandboxed worker gets its inputs and returns its outputs "
                        "(default: the config's verify.transfer, draw: the worker draws each "
                        "input set from its seed, no copies, outputs through device memory on "
                        "cuda; cuda_ipc: every set copied through device memory; host: shared "
                        "host memory); the memory plan may choose another to keep the protocol")
    v.add_argument("--size", default="auto", choices=["auto", "large", "medium", "small"],
                   help="task size (auto: the task's own on cuda, its medium variant on cpu "
                        "where it has one, else its small one)")
    v.add_argument("--no-baseline", action="store_true", help="skip eager/compile timing")
    v.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    v.add_argument("--retime-baseline", action="store_true",
                   help="time the baselines and analyze the task (FLOPs, bytes, degeneracy) "
                        "again instead of reusing the cached ones "
                        "(~/.cache/assay/baselines, or $ASSAY_BASELINE_CACHE)")
    v.add_argument("--jsonl", help="with folders: one JSON line per candidate; a rerun skips "
                                   "candidates already in it")
    v.add_argument("--build-workers", type=int, default=4,
                   help="with folders: sandboxed builds on the CPU cores at once (0: build in "
                        "each worker)")
    v.set_defaults(fn=_verify)

    from assay.verify import selfcheck

    selfcheck.add_parser(sub)

    for name, fn, text in (("compare", _compare, "LLM backends side by side"),
                           ("export", _export, "write the parquet archive"),
                           ("report", _report, "write the HTML report")):
        s = sub.add_parser(name, help=text)
        s.add_argument("campaigns", nargs="*", help="campaign names (default: default)")
        s.add_argument("--results", default="results", help="results folder")
        s.set_defaults(fn=fn)
        if name == "report":
            s.add_argument("--mlflow-ui", metavar="URL",
                           help="base URL of the MLflow UI the run links point to (default: "
                                "$ASSAY_MLFLOW_UI, else http://localhost:5000)")
            s.add_argument("--compare-with", nargs="+", metavar="CAMPAIGN",
                           help="also compare with these campaigns (in the same results folder)")

    r = sub.add_parser("run", help="run the campaign DAG with Snakemake", description=RUN_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       usage="assay run [OVERRIDE|TARGET ...] [--cores N] [--dry-run] "
                             "[--rerun TASK] [-- SNAKEMAKE_ARG ...]")
    r.add_argument("words", nargs="*", metavar="OVERRIDE|TARGET",
                   help="Hydra overrides (key=value, e.g. campaign=ci tasks=ci) and targets")
    r.add_argument("--cores", type=int, default=2, help="CPU cores Snakemake may use (default 2)")
    r.add_argument("-n", "--dry-run", action="store_true", help="list the jobs, run none")
    r.add_argument("--rerun", action="append", default=[], metavar="TASK",
                   help="redo every stage of this task (translation to profile, verdicts "
                        "judged again), then the campaign's tracking, archive and report; "
                        "repeat it for several tasks")
    r.set_defaults(fn=_run, snakemake_args=[])
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if argv[:1] == ["run"] and "--" in argv:  # `assay run ... -- SNAKEMAKE_ARG ...`
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    try:
        args = p.parse_args(argv)
        if extra:
            args.snakemake_args = extra
    except SystemExit as e:  # argparse exits 2 on bad usage: the contract's code too
        return int(e.code or 0)
    return args.fn(args)


def entry() -> None:
    """The `assay` command (and ``python -m assay.cli``): :func:`main`, then the process ends
    without the interpreter's teardown (:func:`assay.process.exit_now`)."""
    from assay.process import exit_now

    exit_now(main())


if __name__ == "__main__":
    entry()
