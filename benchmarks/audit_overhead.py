"""What auditing every timed call costs (issue 19): honest zoo kernels verified with the audit
on (the profiler over every call) and off (no profiler at all, a lower bound on the old audit
of one call), interleaved, the same preparation for both.

    python benchmarks/audit_overhead.py                      # cuda if present, else cpu
    python benchmarks/audit_overhead.py --device cpu --repeat 5 --out docs/evidence/audit-cpu
    python benchmarks/audit_overhead.py --device cuda --repeat 5 --out /tmp/audit-cuda

Per candidate: the verdict with and without the audit (the audit's own checks aside they must
be the same); the median verification time of each and their ratio; the median time of the
worker's calls (load with the profiler's start, correctness, timing, post-timing checks, the
trace's read-back: the part the audit can slow; spawn, torch import and the comparison are
left out, they only add noise) and its ratio; the median timed runtime of each (the profiler's
cost inside a timed call). Writes audit_overhead.md and audit_overhead.json under --out; exits
1 when a verdict changes or the median verification-time ratio over the candidates exceeds
--max-ratio (1.2, the issue's limit; single candidates are noisy on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CASES = {  # honest candidates of the zoo, strict policy: (zoo folder, candidate, task)
    "cpu": [("zoo", "honest_gelu_cpp", "level1/1_gelu"),
            ("zoo", "honest_softmax_cpp", "level1/3_softmax"),
            ("zoo", "honest_matmul_tiled_cpp", "level1/4_matmul"),
            ("zoo", "honest_gemm_bias_relu_fused_cpp", "level2/1_gemm_bias_relu")],
    "cuda": [("zoo_cuda", "honest_gelu_cuda", "level1/1_gelu"),
             ("zoo_cuda", "honest_mse_cuda", "level1/5_mse_loss"),
             ("zoo_cuda", "honest_matmul_tiled_cuda", "level1/4_matmul"),
             ("zoo_cuda", "honest_softmax_cuda", "level1/3_softmax"),
             ("zoo_cuda", "honest_gemm_bias_relu_fused_cuda", "level2/1_gemm_bias_relu")],
}
WORKER_CALLS = ("load_s", "correctness_s", "timing_s", "after_s", "audit_s")
AUDIT_CHECKS = {"kernel_audit", "reference_fallback", "audit_consistency", "audit_provenance"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--repeat", type=int, default=5, help="verifications per candidate and mode")
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    ap.add_argument("--max-ratio", type=float, default=1.2)
    ap.add_argument("--out", default=None, help="folder for audit_overhead.md/.json")
    args = ap.parse_args(argv)

    from assay.bench.build import BuildError
    from assay.tasks.model import Task
    from assay.verify.harness import prepare, resolve_device, verify
    from assay.verify.settings import VerifyConfig

    device = resolve_device(args.device)
    target = "cuda" if device.startswith("cuda") else "cpu"
    cases = [c for c in CASES[target] if not args.only or c[1] in args.only.split(",")]
    rows, failed = [], []
    for folder, name, task_rel in cases:
        root = REPO / "tests" / folder
        task = Task.from_file(root / "tasks" / f"{task_rel}.py")
        cand = root / "candidates" / f"{name}.py"
        prep = prepare(task, device, VerifyConfig())
        runs: dict[bool, list] = {True: [], False: []}
        for i in range(args.repeat + 1):  # the first round builds and warms caches: not kept
            for audit in (False, True):
                t = time.perf_counter()
                times: dict = {}
                try:
                    v = verify(task, cand, device, VerifyConfig(audit=audit), prepared=prep,
                               times=times)
                except BuildError as e:
                    print(f"{name}: build failed: {e}", file=sys.stderr)
                    return 2
                if i:
                    calls_s = sum(float(times.get(f"worker.{k}", 0.0)) for k in WORKER_CALLS)
                    runs[audit].append((time.perf_counter() - t, v, calls_s))
            print(f"{name}: round {i}/{args.repeat} done", file=sys.stderr, flush=True)
        on, off = runs[True], runs[False]
        med = lambda xs: statistics.median(xs)  # noqa: E731
        verdicts_same = all(
            a.accepted == b.accepted and
            {k: c["passed"] for k, c in a.checks.items() if k not in AUDIT_CHECKS} ==
            {k: c["passed"] for k, c in b.checks.items() if k not in AUDIT_CHECKS}
            for (_, a, _), (_, b, _) in zip(on, off))
        row = {"candidate": name, "task": task.id,
               "accepted_on": [v.accepted for _, v, _ in on],
               "accepted_off": [v.accepted for _, v, _ in off],
               "reasons_on": sorted({r for _, v, _ in on for r in v.reasons}),
               "verdicts_same": verdicts_same,
               "verify_s_off": med([r[0] for r in off]), "verify_s_on": med([r[0] for r in on]),
               "calls_s_off": med([r[2] for r in off]), "calls_s_on": med([r[2] for r in on]),
               "runtime_ms_off": med([r[1].runtime_ms for r in off]),
               "runtime_ms_on": med([r[1].runtime_ms for r in on])}
        row["verify_ratio"] = row["verify_s_on"] / row["verify_s_off"]
        row["calls_ratio"] = row["calls_s_on"] / row["calls_s_off"]
        row["runtime_ratio"] = row["runtime_ms_on"] / row["runtime_ms_off"]
        rows.append(row)
        if not verdicts_same or not all(row["accepted_on"]):
            failed.append(name)
        # written after every candidate: a run stopped at its time limit keeps what it measured
        write_report(rows, device, target, args)
    median_ratio = statistics.median(r["verify_ratio"] for r in rows)
    if median_ratio > args.max_ratio:
        failed.append(f"median verification-time ratio {median_ratio:.3f}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def write_report(rows: list[dict], device: str, target: str, args) -> None:
    """The table of ``rows``, printed and written under ``--out``."""
    import torch

    name = torch.cuda.get_device_name() if target == "cuda" else "cpu"
    lines = [f"# Audit of every timed call: cost ({device}, {name}, {args.repeat} runs per mode)",
             "", "| candidate | task | verdict on / off | verify s off | verify s on | ratio "
             "| worker calls s off | on | ratio | runtime ms off | runtime ms on | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        verdict = ("accepted" if all(r["accepted_on"]) else f"rejected {r['reasons_on']}") + \
            (" / same" if r["verdicts_same"] else " / DIFFERENT")
        lines.append(f"| {r['candidate']} | {r['task']} | {verdict} | {r['verify_s_off']:.2f} | "
                     f"{r['verify_s_on']:.2f} | {r['verify_ratio']:.3f} | "
                     f"{r['calls_s_off']:.2f} | {r['calls_s_on']:.2f} | {r['calls_ratio']:.3f} | "
                     f"{r['runtime_ms_off']:.4g} | {r['runtime_ms_on']:.4g} | "
                     f"{r['runtime_ratio']:.3f} |")
    ratios = [r["verify_ratio"] for r in rows]
    calls = [r["calls_ratio"] for r in rows]
    lines += ["", f"Median verification-time ratio {statistics.median(ratios):.3f} "
              f"(max {max(ratios):.3f}, limit {args.max_ratio}); worker calls "
              f"{statistics.median(calls):.3f} (max {max(calls):.3f}); "
              + ("every verdict unchanged." if all(r["verdicts_same"] for r in rows)
                 else "VERDICTS CHANGED.")]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "audit_overhead.md").write_text(text + "\n")
        (out / "audit_overhead.json").write_text(json.dumps(
            {"device": device, "device_name": name, "repeat": args.repeat, "rows": rows},
            indent=2))


if __name__ == "__main__":
    sys.exit(main())
