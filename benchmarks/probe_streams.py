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
import contextlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe(path: Path, calls: int, tf32: bool, device_name: str = "cuda") -> list[str]:
    """The audit's view of ``calls`` calls of the task's reference (the worker's CallAudit and
    trace attribution, unchanged), with a small kernel of the harness's between calls."""
    import torch

    from assay.tasks.instantiate import make_inputs, reference_model, set_fp32_numerics
    from assay.tasks.model import Task
    from assay.verify.worker import _CPU, CallAudit, _event, attribute_trace, launcher_of

    set_fp32_numerics(tf32)
    mod = Task.from_file(path).module()
    device = torch.device(device_name)
    cuda = device.type == "cuda"
    model = reference_model(mod, seed=0, device=device).eval()
    inputs = make_inputs(mod, seed=1, device=device)
    flag = torch.zeros(1, device=device)
    on_side = torch.cuda.stream(torch.cuda.Stream()) if cuda else contextlib.nullcontext()
    with torch.no_grad(), on_side:
        model(*inputs)  # warm-up: algorithm choice, workspaces
        if cuda:
            torch.cuda.synchronize()
        audit = CallAudit(device)
        audit.start()
        for _ in range(calls):
            flag.add_(1)  # the harness's own work between calls: its stream is "own"
            audit.call("timed", model, *inputs)
        flag.add_(1)
        report = audit.finish()
        events = [d for e in audit.prof.kineto_results.events() if (d := _event(e, _CPU))]
    trace = attribute_trace(events, cuda)
    launcher = launcher_of([e for e in events if e["cpu"]])  # as the audit attributes them
    rows: collections.Counter = collections.Counter()
    for e in events:
        if not e["cpu"]:
            by = launcher(e)
            rows[(e["stream"], by["name"] if by else "?", e["name"][:90])] += 1
    out = [f"## {path.stem}: {calls} calls; per call, kernels off the caller's stream: "
           f"{trace['side']}, stream waits: {trace['joins']}; audit: "
           f"{ {k: v for k, v in report.items() if k != 'calls'} }",
           "", "| stream | launched by | kernel | count |", "| --- | --- | --- | --- |"]
    out += [f"| {sid} | {by} | `{name}` | {n} |" for (sid, by, name), n in sorted(
        rows.items(), key=lambda kv: -kv[1])]
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tasks", nargs="+", type=Path)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--device", default="cuda", help="cuda (cpu: a smoke test, no kernels)")
    ap.add_argument("--tf32", action="store_true",
                    help="let matmuls and convolutions use TF32 (default: true fp32, as the "
                         "verifier runs them)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    for path in args.tasks:
        try:
            print("\n".join(probe(path, args.calls, args.tf32, args.device)), flush=True)
        except Exception as e:  # noqa: BLE001 - one task's failure is reported, the rest go on
            print(f"## {path}: failed: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
