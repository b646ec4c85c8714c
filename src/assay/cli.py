"""The `assay` command.

  assay verify --task T.py --candidate C.py [--device cuda|cpu] [--json out.json]
      exit 0 accepted, 1 rejected, 2 bad usage or unreadable input
  assay compare [CAMPAIGN ...] [--results results]
  assay export CAMPAIGN ... / assay report CAMPAIGN ... [--mlflow-ui URL] [--compare-with C ...]
  assay run [HYDRA_OVERRIDE|TARGET ...] [--cores N] [--dry-run] [--rerun TASK]
      the campaign DAG through Snakemake (`assay run --help`)

argparse keeps `assay verify` light: it runs on the GPU machine with torch and small wheels.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


def _verify(args: argparse.Namespace) -> int:
    from assay.tasks.model import Task, TaskError

    cand = Path(args.candidate)
    if not cand.is_file():
        print(f"error: {cand}: candidate file not found", file=sys.stderr)
        return 2
    try:
        cand.read_text()
        task = Task.from_file(args.task, size=args.size)
        task.module()
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: {cand}: cannot read candidate: {e}", file=sys.stderr)
        return 2

    from assay.app import compose
    from assay.bench.baseline import time_reference
    from assay.bench.device import peaks
    from assay.bench.timing import TimingConfig
    from assay.tasks.analyze import cost, degeneracy
    from assay.verify.config import from_cfg
    from assay.verify.harness import resolve_device, verify

    cfg = from_cfg(compose([f"verify={args.policy}"]).verify)
    device = resolve_device(args.device)
    record = {**cost(task), "degeneracy": degeneracy(task, device)}
    baseline = None
    if not args.no_baseline:
        # Timed in a child process that never loads the candidate.
        baseline = _in_child(time_reference, task, device,
                             TimingConfig(cfg.warmup_s, cfg.min_runs, cfg.max_runs, cfg.budget_s),
                             not args.no_compile)
    verdict = verify(task, cand, device, cfg, baseline, record, peaks(device))
    text = json.dumps(verdict.to_dict(), indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    summary = "ACCEPTED" if verdict.accepted else "REJECTED: " + ", ".join(verdict.reasons)
    speed = (f" speedup {verdict.speedup_eager:.2f}x eager" if verdict.speedup_eager else "")
    print(f"{cand.name} on {task.id} ({device}, {cfg.policy}): {summary}{speed}")
    for name in verdict.reasons:
        print(f"  {name}: {verdict.checks[name]['detail'][:400]}")
    return 0 if verdict.accepted else 1


def _child(conn, fn, args) -> None:
    try:
        conn.send(("ok", fn(*args)))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", f"{type(e).__name__}: {e}"))


def _in_child(fn, *args):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, fn, args))
    proc.start()
    status, value = parent.recv()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"baseline timing failed: {value}")
    return value


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
    from assay.app import UserError, repo_root, workflow_overrides

    overrides = [w for w in args.words if "=" in w] or workflow_overrides()
    try:
        forced = rerun_files(overrides, args.rerun) if args.rerun else []
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    snakefile = repo_root() / "Snakefile"
    cmd = snakemake_command(args.words, args.cores, args.dry_run, forced, args.snakemake_args,
                            snakefile if snakefile.is_file() else None)
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
The command it runs is printed first. To start a task from scratch, delete
results/<campaign>/<llm>/<task>/ and run again. `make run`, `make dry-run` and
`make rerun TASK=...` call this."""
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="assay", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("verify", help="judge one candidate against one task")
    v.add_argument("--task", required=True, help="task file (KernelBench format)")
    v.add_argument("--candidate", required=True, help="candidate file defining class ModelNew")
    v.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    v.add_argument("--json", help="write the verdict JSON here")
    v.add_argument("--policy", default="strict", choices=["strict", "permissive"])
    v.add_argument("--size", default="large", choices=["large", "small"],
                   help="task size (bundled tasks have a small variant)")
    v.add_argument("--no-baseline", action="store_true", help="skip eager/compile timing")
    v.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    v.set_defaults(fn=_verify)

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


if __name__ == "__main__":
    sys.exit(main())
