"""What an observer outside the candidate's Python sees against the worker's report, and what
it costs (issue 19): the zoo's forged-report exploits and honest kernels of the same tasks.

    python benchmarks/report_observer.py --out /tmp/observer          # cuda if present, else cpu
    python benchmarks/report_observer.py --device cpu --out /tmp/observer-cpu

Per candidate:
1. the verdict (the full protocol, the audit over every call) and its time;
2. the same light job the profile tools run (`assay.profile.tools.sandboxed_worker`: three timed
   calls, no warm-up), once plainly and once behind Nsight Compute (cuda, when `ncu` is on the
   PATH: `--metrics gpu__time_duration.sum`, every launch, the worker's own profiler off), each
   timed; the ratio is the observer's cost on that job;
3. the kernels the report credits to the candidate (its audit's timed calls) against the
   launches ncu recorded: a credited kernel ncu never saw launched is one the report invented
   or a decoy that never ran; kernels ncu saw that the audit does not list are named.

ncu runs inside the sandbox with the candidate and writes its CSV in the scratch folder (as the
profile tools do): good enough to measure, not yet an observer the candidate cannot reach
(docs/ARCHITECTURE.md, "What the worker's report can prove"). Writes report_observer.md and
report_observer.json under --out. Exit 0 when every run finished (findings are data, not
failures), 2 when a candidate could not be prepared.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CASES = {  # (zoo folder, candidate, task)
    "cpu": [("zoo", "honest_softmax_cpp", "level1/3_softmax"),
            ("zoo", "exploit_forged_worker_report", "level1/3_softmax")],
    "cuda": [("zoo_cuda", "honest_gelu_cuda", "level1/1_gelu"),
             ("zoo_cuda", "exploit_forged_worker_report", "level1/1_gelu"),
             ("zoo_cuda", "honest_softmax_cuda", "level1/3_softmax"),
             ("zoo_cuda", "exploit_forged_audit_invented_kernel", "level1/3_softmax")],
}
NCU_METRIC = "gpu__time_duration.sum"


def ncu_launches(text: str) -> dict[str, dict[str, float]]:
    """{kernel name: {"count", "device_us"}} from ncu's CSV (one row per launch and metric)."""
    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "device_us": 0.0})
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        if r.get("Metric Name") != NCU_METRIC:
            continue
        name = r.get("Kernel Name", "")
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(r.get("Metric Unit", ""), 1.0)
        out[name]["count"] += 1
        out[name]["device_us"] += value * scale
    return dict(out)


def compare(credited: list[str], seen: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    """Credited kernels ncu never saw launched, and kernels ncu saw the audit does not list,
    matched on the kernel's identifier (the two tools demangle with different spacing)."""
    from assay.verify.provenance import kernel_identifier

    seen_ids = {kernel_identifier(n) for n in seen}
    credited_ids = {kernel_identifier(n) for n in credited}
    return {"never_launched": sorted(n for n in credited if kernel_identifier(n) not in seen_ids),
            "not_in_audit": sorted((n for n in seen if kernel_identifier(n) not in credited_ids),
                                   key=lambda n: -seen[n]["device_us"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per ncu run")
    ap.add_argument("--out", default=None, help="folder for report_observer.md/.json")
    args = ap.parse_args(argv)

    from assay.profile.tools import sandboxed_worker
    from assay.tasks.model import Task
    from assay.verify import policy, provenance
    from assay.verify.harness import prepare, resolve_device, verify
    from assay.verify.settings import VerifyConfig

    device = resolve_device(args.device)
    target = "cuda" if device.startswith("cuda") else "cpu"
    ncu = shutil.which("ncu") if target == "cuda" else None
    cfg = VerifyConfig()
    rows = []
    for folder, name, task_rel in CASES[target]:
        if args.only and name not in args.only.split(","):
            continue
        root = REPO / "tests" / folder
        task = Task.from_file(root / "tasks" / f"{task_rel}.py")
        cand = root / "candidates" / f"{name}.py"
        try:
            prep = prepare(task, device, cfg)
        except Exception as e:  # noqa: BLE001 - reported, the other candidates go on
            print(f"{name}: cannot prepare {task.id}: {e}", file=sys.stderr)
            return 2
        row: dict = {"candidate": name, "task": task.id}
        t = time.perf_counter()
        v = verify(task, cand, device, cfg, prepared=prep)
        row.update(verify_s=time.perf_counter() - t, accepted=v.accepted, reasons=v.reasons,
                   provenance=v.checks.get("audit_provenance", {}).get("detail", "not recorded"))
        print(f"{name}: verdict {'accepted' if v.accepted else v.reasons}", file=sys.stderr,
              flush=True)

        t = time.perf_counter()
        with sandboxed_worker(prep, cand, cfg) as (outcome, report, _):
            row["plain_s"] = time.perf_counter() - t
            kernels = (report or {}).get("kernels") or []
        if target == "cuda":
            credited = provenance.credited(kernels, policy.LIBRARY_KERNEL)
        else:
            credited = sorted({r["name"] for r in kernels if r["name"].startswith("aten::")})
        row["report_credits"] = sorted(set(credited))
        row["ncu"] = None
        if ncu is not None:
            prefix = [ncu, "--metrics", NCU_METRIC, "--csv", "--target-processes", "all",
                      "--log-file", "ncu.csv"]
            t = time.perf_counter()
            with sandboxed_worker(prep, cand, cfg, prefix, args.timeout, audit=False) \
                    as (outcome, _, scratch):
                row["ncu_s"] = time.perf_counter() - t
                try:
                    text = (scratch / "ncu.csv").read_text(errors="replace")
                except OSError:
                    text = ""
            seen = ncu_launches(text)
            row["ncu"] = {"outcome": str(outcome)[:300], "launches": sum(
                int(s["count"]) for s in seen.values()), "kernels": seen,
                **compare(row["report_credits"], seen)}
            row["ncu_ratio"] = row["ncu_s"] / row["plain_s"] if row["plain_s"] else None
        print(f"{name}: done", file=sys.stderr, flush=True)
        rows.append(row)

    import torch

    dev_name = torch.cuda.get_device_name() if target == "cuda" else "cpu"
    observer = f"ncu ({ncu})" if ncu else "none (needs a CUDA device and ncu on the PATH)"
    lines = [f"# The worker's report against an outside observer ({device}, {dev_name})", "",
             f"Observer: {observer}.", "",
             "| candidate | verdict | audit_provenance | report credits | ncu: credited, never "
             "launched | ncu: launched, not in the audit | light job s | under ncu s | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["ncu"]
        verdict = "accepted" if r["accepted"] else "rejected " + ", ".join(r["reasons"])
        never = ", ".join(x[:50] for x in n["never_launched"]) if n else "n/a"
        extra = ", ".join(x[:50] for x in n["not_in_audit"][:3]) if n else "n/a"
        lines.append(f"| {r['candidate']} | {verdict} | {r['provenance'][:90]} | "
                     f"{', '.join(x[:50] for x in r['report_credits'][:3]) or 'none'} | "
                     f"{never or 'none'} | {extra or 'none'} | {r['plain_s']:.1f} | "
                     + (f"{r['ncu_s']:.1f} | {r['ncu_ratio']:.1f} |" if n else "n/a | n/a |"))
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report_observer.md").write_text(text + "\n")
        (out / "report_observer.json").write_text(json.dumps(
            {"device": device, "device_name": dev_name, "observer": observer, "rows": rows},
            indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
