"""Why does `stream_ordered` reject candidates on cuda when the audit runs over every call?
(docs/evidence/2026-11-25-h100-cuda-zoo-every-call-audit.md.) Verifies CUDA zoo cases with the
audit on and off and prints, per verification, the verdict and the numbers the check decides
on (median, the sync-based escaped estimate, the audit trace's median device span and the work
launched between calls, host enqueue time, hold) as JSON lines.

    python benchmarks/stream_ordered_probe.py [CASE ...] [--out FILE]

Default cases: the neutralized candidate that was falsely rejected, an exploit that gained the
extra reason, two honest kernels, and the side-stream exploit the check exists for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

DEFAULT = ["neutralized_cheat_unless_profiler_on", "exploit_partial_write_half",
           "honest_gelu_cuda", "honest_softmax_cuda", "exploit_side_stream_unsynced"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", default=DEFAULT, help="CUDA zoo case names")
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    a = ap.parse_args(argv)

    import test_gpu as zoo

    from assay.bench.build import build
    from assay.verify import harness

    unknown = [c for c in a.cases if c not in zoo.CUDA_CASES]
    if unknown:
        print(f"error: not a CUDA zoo case: {', '.join(unknown)}", file=sys.stderr)
        return 2
    timing: dict = {}
    check_timing = harness._check_timing

    def spy(v, result, unsettled):  # the numbers stream_ordered is decided on
        timing.update(result["timing"])
        calls = (result.get("audit") or {}).get("calls") or []
        spans = sorted(c["span_us"] for c in calls if "span_us" in c)
        timing["trace_span_ms"] = spans[len(spans) // 2] / 1e3 if spans else None
        timing["outside_us"] = (result.get("audit") or {}).get("outside_us")
        return check_timing(v, result, unsettled)

    harness._check_timing = spy
    sources = [s for c in a.cases for s in zoo.kernel_sources(zoo.CUDA_CASES[c]["path"])]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: build(s, "cuda"), sources))
    rows = []
    for audit in (True, False):
        for case in a.cases:
            meta = zoo.CUDA_CASES[case]
            task = zoo.cuda_task(meta["TASK"])
            cfg = dataclasses.replace(zoo.zoo_config(meta), audit=audit)
            timing.clear()
            t0 = time.perf_counter()
            v = harness.verify(task, meta["path"], "cuda", cfg, record=zoo.cuda_record(task),
                               peaks=zoo.GENEROUS_PEAKS, prepared=zoo.cuda_prepared(task))
            row = {"case": case, "audit": audit, "accepted": v.accepted, "reasons": v.reasons,
                   "verify_s": round(time.perf_counter() - t0, 1),
                   "stream_ordered": v.checks.get("stream_ordered", {}).get("detail"),
                   **{k: timing.get(k) for k in ("median_ms", "escaped_ms", "trace_span_ms",
                                                  "outside_us", "host_ms", "hold_us", "runs",
                                                  "group")}}
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.out:
        Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
