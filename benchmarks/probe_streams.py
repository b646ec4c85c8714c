"""Which streams a task's reference launches its kernels on, as the verifier's audit sees them
(kineto's kernel events, their stream ids and the CPU call that launched each), with the call
made on a side stream of the harness's kind. Used where ``stream_ordered`` rejected a
candidate whose only work beside its own kernels was a library call (issue #19: a library that
runs work on streams of its own must not read as a candidate hiding work).

    python3 benchmarks/probe_streams.py TASK.py [TASK.py ...] [--calls 3] [--tf32]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe(path: Path, calls: int, tf32: bool) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from assay.tasks.instantiate import make_inputs, reference_model, set_fp32_numerics
    from assay.tasks.model import Task

    set_fp32_numerics(tf32)
    task = Task.from_file(path)
    mod = task.module()
    model = reference_model(mod, seed=0, device="cuda").eval()
    inputs = make_inputs(mod, seed=1, device="cuda")
    side = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(side):
        model(*inputs)  # warm-up: algorithm choice, workspaces
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                model(*inputs)
            torch.cuda.synchronize()
    events = prof.events()
    launch = {e.correlation_id: e.name for e in events
              if e.device_type == torch.autograd.DeviceType.CPU and e.correlation_id}
    rows: collections.Counter = collections.Counter()
    streams: collections.Counter = collections.Counter()
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        sid = getattr(e, "device_resource_id", None)
        streams[sid] += 1
        rows[(sid, launch.get(e.correlation_id, "?"), e.name[:90])] += 1
    waits = sum(1 for e in events if "StreamWaitEvent" in e.name)
    graphs = sum(1 for e in events if "GraphLaunch" in e.name)
    out = [f"## {path.stem}: {calls} calls on stream {side.cuda_stream:#x} "
           f"(kineto ids: {dict(streams)}), stream waits {waits}, graph launches {graphs}",
           "| stream | launched by | kernel | count |", "| --- | --- | --- | --- |"]
    out += [f"| {sid} | {by} | `{name}` | {n} |" for (sid, by, name), n in sorted(
        rows.items(), key=lambda kv: -kv[1])]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="+", type=Path)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--tf32", action="store_true",
                    help="let matmuls and convolutions use TF32 (default: true fp32, as the "
                         "verifier runs them)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    for path in args.tasks:
        try:
            print("\n".join(probe(path, args.calls, args.tf32)), flush=True)
        except Exception as e:  # noqa: BLE001 - one task's failure is reported, the rest go on
            print(f"## {path}: failed: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
