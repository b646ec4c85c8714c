"""torch.compile's compile of a task's reference before a GPU step takes the device.

The baseline step times torch.compile's form of the reference, and compiling it (dynamo's
trace, inductor's code generation, Triton's builds) held the device: KernelBench's L3_16
DenseNet201 held an H200 84 s for an 18 ms call. Compiled first on fake tensors (shapes, no
memory, no kernel run), in a process of its own while another job uses the device, the same
graph leaves inductor's FX-graph cache and Triton's cache filled, so the compile with the device
held is a cache hit: dynamo's trace and the cache's loads only.

    python -m assay.bench.prewarm TASK.py [--size large] [--device cuda] [--mode default]

prints one JSON line: the seconds it took and the error that stopped it, if any. The compiled
graphs are not run (:func:`_compile_only`): the fake call runs them op by op on fake tensors.
A failure after the compile leaves the caches written, so an error is reported, not raised.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def compile_fake(task_file: str, size: str, device: str, mode: str) -> dict:
    """Compile the reference of ``task_file`` under ``FakeTensorMode`` in this process:
    {"seconds", "error"} ("" when the fake call ran through)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from assay.tasks.instantiate import init_inputs, make_inputs, set_fp32_numerics, task_mode
    from assay.tasks.model import Task

    t0 = time.perf_counter()
    error = ""
    try:
        set_fp32_numerics(False)  # the numerics the baseline compiles under (its guards)
        module = Task.from_file(Path(task_file), size=size).module()
        with FakeTensorMode(allow_non_fake_inputs=True):
            # Made on the device, not moved there (a module of fake parameters cannot be
            # swapped onto another device) and not randomized (values: the graph is the same)
            with torch.device(device):
                model = task_mode(module.Model(*init_inputs(module)))
            inputs = make_inputs(module, 100, device)
            compiled = torch.compile(model, backend=_compile_only(mode))
            with torch.no_grad():
                compiled(*inputs)
    except Exception as e:  # noqa: BLE001 - after its compile the caches hold what it made
        error = f"{type(e).__name__}: {e}".splitlines()[0][:300] if str(e) else type(e).__name__
    return {"seconds": round(time.perf_counter() - t0, 3), "error": error}


def _compile_only(mode: str) -> Any:
    """torch.compile's inductor backend for ``mode`` that compiles each graph (filling the
    caches) and then runs the graph uncompiled: on fake tensors that launches nothing, where
    the compiled code would launch its kernels with no memory behind their pointers (an H100
    reported illegal memory accesses from the prewarm's process beside another job's timing)."""
    import torch

    class CompileOnly(torch._TorchCompileInductorWrapper):
        def __call__(self, model_: Any, inputs_: Any) -> Any:
            super().__call__(model_, inputs_)
            return model_.forward

    return CompileOnly(mode, None, None)


def prewarm(task_file: str | Path, size: str, device: str, mode: str = "default",
            timeout_s: float = 300.0) -> dict:
    """:func:`compile_fake` in a child process (this one's CUDA state and dynamo's in-memory
    caches untouched; the caches on disk are shared): {"seconds", "error"}; a child that
    fails or runs past ``timeout_s`` is an error, never an exception."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "assay.bench.prewarm", str(task_file), "--size", size,
           "--device", device, "--mode", mode]
    env = dict(os.environ)
    # a quarter of the cores for inductor's and Triton's compile workers (the user's setting
    # wins): the prewarm runs beside another job timing on the device, whose host side a
    # machine's worth of compilers would slow
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 4) // 4)))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"seconds": round(time.perf_counter() - t0, 3),
                "error": f"stopped after {timeout_s:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return {"seconds": round(time.perf_counter() - t0, 3), "error": last[:300]}
    out = json.loads(lines[-1])
    out["seconds"] = round(time.perf_counter() - t0, 3)  # the child's start-up included
    return out


def prewarm_before_lease(task: Any, device: str, mode: str, log: logging.Logger) -> dict:
    """:func:`prewarm` of ``task``'s baseline by a step, before it takes the device, logged.
    A prewarm that fails is a warning saying what that costs and how to turn it off; the step
    goes on (what it compiled before the error is cached all the same)."""
    log.info("%s: torch.compile on fake tensors first (no device)", task.id)
    warm = prewarm(task.path, task.size, device, mode)
    if warm.get("error"):
        log.warning("%s: the compile on fake tensors stopped after %.1f s (%s): the compile "
                    "with the device held may miss inductor's cache; turn it off with "
                    "baselines.prewarm=false if it keeps failing", task.id, warm["seconds"],
                    warm["error"])
    else:
        log.info("%s: prewarmed in %.1f s", task.id, warm["seconds"])
    return warm


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("task", help="a KernelBench-format task file")
    ap.add_argument("--size", default="large", help="the task's size (large | small)")
    ap.add_argument("--device", default="cuda", help="the device the tensors claim (fake)")
    ap.add_argument("--mode", default="default", help="torch.compile's mode")
    args = ap.parse_args(argv)
    print(json.dumps(compile_fake(args.task, args.size, args.device, args.mode)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
