"""Can torch.compile's compile of a task's reference run before a GPU step takes the device?

Issue #16: the baseline step (and the verify step's re-timing of another GPU's baseline) holds
the device through inductor's compile, as ``bench.baseline.time_reference`` compiles on the
device's tensors: on an H200, KernelBench's L3_16 DenseNet201 held it 84 s for an 18 ms eager
call. A compile that filled inductor's caches without the device (fake tensors: nothing
allocated, no kernel run) before the step takes it would leave the step a cache hit.

For each task file, three fresh processes, each with an inductor and Triton cache of its run:

- ``cold``: torch.compile(Model) and its first call on real inputs (cache A);
- ``fake``: the same under ``FakeTensorMode`` (cache B), as the baseline step's prewarm does it
  (``assay.bench.prewarm.compile_fake``: an error after the compile is reported, the caches are
  written by then): its seconds, and whether the process made a CUDA context
  (``torch.cuda.is_initialized()`` and the driver's list of compute processes: a context is
  device memory another job's plan did not count);
- ``warm``: the real compile and first call again with cache B.

    python benchmarks/probe_compile_prewarm.py TASK.py ... [--out prewarm.json]

A prewarm that makes no context and brings ``warm`` well under ``cold`` is the way to take the
compile off the device. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(mode: str, task_file: str) -> dict:
    """One compile and first call in this process (``mode``: real or fake)."""
    import torch

    sys.path.insert(0, str(REPO / "src"))
    from assay.tasks.instantiate import make_inputs, reference_model, set_fp32_numerics
    from assay.tasks.model import Task

    set_fp32_numerics(False)
    module = Task.from_file(Path(task_file)).module()
    out: dict = {"mode": mode}
    t0 = time.perf_counter()
    try:
        if mode == "fake":  # the baseline step's prewarm (its errors after the compile: kept)
            from assay.bench.prewarm import compile_fake

            fake = compile_fake(task_file, "large", "cuda", "default")
            if fake["error"]:
                raise RuntimeError(fake["error"])  # (reported as the run's error, ok false)
        else:
            model = reference_model(module, 0, "cuda")
            inputs = make_inputs(module, 100, "cuda")
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*inputs)
            torch.cuda.synchronize()
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - what the probe reports
        out["ok"], out["error"] = False, f"{type(e).__name__}: {e}".splitlines()[0][:300]
    out["seconds"] = round(time.perf_counter() - t0, 2)
    from torch._dynamo.utils import counters

    out["fxgraph_cache"] = {k: counters["inductor"].get(f"fxgraph_cache_{k}", 0)
                            for k in ("hit", "miss")}
    out["cuda_initialized"] = torch.cuda.is_initialized()
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True)
    out["context"] = str(os.getpid()) in smi.stdout.split()
    return out


def run(mode: str, task_file: str, cache: Path) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache),
               TRITON_CACHE_DIR=str(cache / "triton"))
    p = subprocess.run([sys.executable, __file__, "--child", mode, task_file], env=env,
                       capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"mode": mode, "ok": False, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("tasks", nargs="*", help="KernelBench-format task files")
    a.add_argument("--child", nargs=2, metavar=("MODE", "TASK"), help=argparse.SUPPRESS)
    a.add_argument("--out", help="the rows as JSON")
    args = a.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)), flush=True)
        return 0
    if not args.tasks:
        a.error("give task files")
    rows = []
    print("| task | cold s | fake s (ok, context) | warm s after fake (FX-graph cache) |")
    print("| --- | --- | --- | --- |")
    for i, task in enumerate(args.tasks, 1):
        with tempfile.TemporaryDirectory() as a_dir, tempfile.TemporaryDirectory() as b_dir:
            cold = run("real", task, Path(a_dir))
            fake = run("fake", task, Path(b_dir))
            warm = run("real", task, Path(b_dir))
        row = {"task": task, "cold": cold, "fake": fake, "warm": warm}
        rows.append(row)
        print(f"| {Path(task).stem} | {cold.get('seconds')} {cold.get('error', '')} | "
              f"{fake.get('seconds')} ({fake.get('ok')}, {fake.get('context')}) "
              f"{fake.get('error', '')} | {warm.get('seconds')} {warm.get('fxgraph_cache')} "
              f"{warm.get('error', '')} |", flush=True)
        print(f"[{i}/{len(args.tasks)}] {Path(task).stem}", file=sys.stderr, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
