"""Where a task's reference preparation spends its seconds (issue #16: KernelBench's L1_87, a
1x1 convolution of 16x64x1024x1024, took 109 s in ``harness.prepare`` on an H200 while other
level-1 tasks took 3-8 s). For each task file: one forward of the reference in float32 and in
float64 (cuDNN on and off), the verifier's memory plan (placement, sets) and ``prepare`` itself.

    python3 benchmarks/probe_reference.py TASK.py [TASK.py ...] [--device cuda] [--repeat 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path


def _timed(fn, sync, repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds (the first may choose algorithms)."""
    best = float("inf")
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def probe(path: Path, device: str, repeat: int, whole: bool = True) -> dict:
    import torch

    from assay.tasks.instantiate import make_inputs, reference_model
    from assay.tasks.model import Task
    from assay.verify.settings import VerifyConfig
    from assay.verify.reference import plan_task, prepare

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    task = Task.from_file(path)
    mod = task.module()
    model = reference_model(mod, seed=0, device=device).eval()
    xs = make_inputs(mod, seed=1, device=device)
    row: dict = {"task": path.name}
    with torch.no_grad():
        row["fp32_s"] = _timed(lambda: model(*xs), sync, repeat)
        model64 = copy.deepcopy(model).to(torch.float64)
        xs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                for x in xs]
        xs = None
        row["fp64_s"] = _timed(lambda: model64(*xs64), sync, repeat)
        if device == "cuda":
            with torch.backends.cudnn.flags(enabled=False):
                row["fp64_no_cudnn_s"] = _timed(lambda: model64(*xs64), sync, 1)
    model = model64 = xs64 = None
    if device == "cuda":
        torch.cuda.empty_cache()
    cfg = VerifyConfig()
    plan = plan_task(task, device, cfg)
    if plan is not None:
        row["placement"] = plan.placement
        if plan.protocol is not None:
            p = plan.protocol
            row["sets"] = {"check": p.check_sets, "timing": p.timing_sets, "swap": p.swap_sets,
                           "wide_all": p.wide_all}
    if not whole:
        return row
    t0 = time.perf_counter()
    prep = prepare(task, device, cfg, plan)
    row["prepare_s"] = round(time.perf_counter() - t0, 2)
    row["prepared_sets"] = len(prep.distributions)
    row["prepared_placement"] = prep.placement
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tasks", nargs="+", type=Path, help="KernelBench-format task files")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=2, help="runs per forward; the fastest counts")
    ap.add_argument("--forwards-only", action="store_true",
                    help="the forwards and the plan, not prepare itself (minutes on large tasks)")
    args = ap.parse_args()
    for path in args.tasks:
        try:
            row = probe(path, args.device, args.repeat, not args.forwards_only)
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                              for k, v in row.items()}), flush=True)
        except Exception as e:  # noqa: BLE001 - one task's failure is its row, the rest go on
            print(json.dumps({"task": path.name, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main()
