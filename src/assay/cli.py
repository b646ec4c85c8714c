"""The `assay` command.

  assay verify --task T.py --candidate C.py [--device cuda|cpu] [--json out.json]
      exit 0 accepted, 1 rejected, 2 bad usage or unreadable input
  assay compare [CAMPAIGN ...] [--results results]
  assay export CAMPAIGN ... / assay report CAMPAIGN ... [--mlflow-ui URL] [--compare-with C ...]
  assay run [HYDRA_OVERRIDE ...] [--cores N]     the campaign DAG through Snakemake

argparse keeps `assay verify` light: it runs on the GPU machine with torch and small wheels.
"""

from __future__ import annotations

import argparse
import json
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
    from assay.verify.harness import verify
    from assay.verify.reference import resolve_device

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


def _run(args: argparse.Namespace) -> int:
    cmd = ["snakemake", "--cores", str(args.cores)]
    if args.overrides:
        cmd += ["--config", "overrides=[" + ",".join(args.overrides) + "]"]
    return subprocess.call(cmd)


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

    r = sub.add_parser("run", help="run the campaign DAG with Snakemake")
    r.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. campaign=ci tasks=ci")
    r.add_argument("--cores", type=int, default=2)
    r.set_defaults(fn=_run)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage: the contract's code too
        return int(e.code or 0)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
