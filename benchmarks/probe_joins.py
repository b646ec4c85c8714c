"""What the kernel audit sees of a candidate that runs its work on a side stream joined back to
the caller's (issue #19: `stream_ordered` refused 13 honest red-team variants on an H200 for
"kernels on a stream other than the caller's without a stream wait in the call").

    PYTHONPATH=src python benchmarks/probe_joins.py [--calls 20] [--out FILE.md]

For the profiler as the worker configures it, and with kineto's CUDA synchronization events on
(``enable_cuda_sync_events``): each call's ``side`` and ``joins`` as attribute_trace counts
them, and for the first calls every runtime/driver/sync event around the call range, with its
start and end relative to the range (us). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from assay.verify import worker


def _joined(state: dict, x: torch.Tensor) -> torch.Tensor:
    cur = torch.cuda.current_stream()
    if "s" not in state:
        state["s"] = torch.cuda.Stream()
    s = state["s"]
    s.wait_stream(cur)
    with torch.cuda.stream(s):
        out = torch.nn.functional.gelu(x)
    cur.wait_stream(s)
    out.record_stream(cur)
    return out


def _activity(e) -> str:
    """The event's kineto activity type; "?" where torch gives none (before 2.12)."""
    act = getattr(e, "activity_type", None)
    return act() if callable(act) else "?"


def probe(sync_events: bool, calls: int, show: int) -> list[str]:
    dev = torch.device("cuda")
    x = torch.randn(1 << 20, device=dev)
    audit = worker.CallAudit(dev)
    if sync_events:
        from torch._C._profiler import _ExperimentalConfig

        audit.prof = torch.autograd.profiler.profile(
            use_kineto=True, use_device="cuda", experimental_config=_ExperimentalConfig(
                profile_all_threads=True, enable_cuda_sync_events=True))
    state: dict = {}
    audit.start()
    for _ in range(calls):
        audit.call("timed", _joined, state, x)
        torch.cuda.synchronize()
    found = audit.finish(keep=("timed",))
    lines = [f"## enable_cuda_sync_events={sync_events}", "",
             f"expected {found.get('expected')}, found {found.get('found')}, "
             f"error {found.get('error')}", "",
             "side per call: " + str([c["side"] for c in found.get("calls", [])]),
             "joins per call: " + str([c["joins"] for c in found.get("calls", [])]), ""]
    raw = list(audit.prof.kineto_results.events())
    ranges = sorted((e.start_ns(), e.end_ns()) for e in raw if e.name() == worker.CALL_RANGE)
    names = ("Stream", "Event", "Launch", "Sync", "sync", "Wait")
    lines += ["| call | name | activity | device type | start - range start (us) | "
              "end - range end (us) |", "|---|---|---|---|---|---|"]
    for k, (r0, r1) in enumerate(ranges[:show]):
        lo, hi = r0 - 200_000, r1 + 200_000
        for e in sorted(raw, key=lambda e: e.start_ns()):
            if lo <= e.start_ns() <= hi and any(n in e.name() for n in names):
                lines.append(f"| {k} | {e.name()} | {_activity(e)} | {e.device_type()} | "
                             f"{(e.start_ns() - r0) / 1e3:.1f} | {(e.end_ns() - r1) / 1e3:.1f} |")
    kinds: dict[str, int] = {}
    for e in raw:
        if any(n in e.name() for n in names):
            key = f"{e.name()} ({_activity(e)})"
            kinds[key] = kinds.get(key, 0) + 1
    lines += ["", "every such event in the trace: " + ", ".join(
        f"{k}: {v}" for k, v in sorted(kinds.items())), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--show", type=int, default=3, help="calls whose events are listed")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_joins: needs a CUDA device", file=sys.stderr)
        return 2
    lines = [f"# probe_joins: {torch.cuda.get_device_name()}, torch {torch.__version__}", ""]
    for sync in (False, True):
        lines += probe(sync, a.calls, a.show)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
