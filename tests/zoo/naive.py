"""A deliberately naive harness (the kind the 2025 incident fooled), to show that every exploit in
the zoo would pass one: reference first (after a warm-up call), same inputs for every call
(torch.manual_seed(42), as KernelBench does), the reference's fp32 output freed once copied, torch.allclose(rtol=atol=1e-2),
timing with time.perf_counter.

Run as a server: one JSON request per stdin line ({"task": path, "candidate": path}, optionally
"device": "cuda"), one JSON answer per stdout line ({"accepted": bool, "detail": str, "ms": float}).
torch is imported once; each request runs in a forked child (candidates patch clocks, exit,
crash...), with a time limit. On cuda (KernelBench's own setting) inputs and both models move to
the device, and the device is synchronized after the candidate's call, before the comparison;
the parent never touches CUDA, so every forked child can initialize it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import sys
import time
import traceback

import ctypes

# Freed blocks are recycled the way the CUDA caching allocator recycles them: keep every block on
# glibc's heap (no mmap for big ones, no trimming), so a block freed by the reference is the
# next one handed out for the same size.
_libc = ctypes.CDLL(None)
_libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
_libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD

import torch  # noqa: E402  imported once, before any fork; no op runs in this parent


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def naive_check(task_path: str, cand_path: str, device: str = "cpu") -> dict:
    task = _load(task_path, "naive_task")
    cand = _load(cand_path, "naive_candidate")
    dev = torch.device(device)
    torch.manual_seed(42)
    init = task.get_init_inputs()
    inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    torch.manual_seed(42)
    ref_model = task.Model(*init).to(dev)
    torch.manual_seed(42)
    new_model = cand.ModelNew(*init).to(dev)
    with torch.no_grad():
        # warm-up; sizes the float64 copy of the expected output. Kept until the end: freed
        # here, its block (as big as the output) was the one glibc handed the candidate in
        # about 3 runs of 4, 64 bytes off its start, so a candidate reading the reference's
        # freed output saw it shifted (the caching allocator hands back a block whole).
        warm = ref_model(*inputs)
        ref = torch.empty_like(warm, dtype=torch.float64)
        out = ref_model(*inputs)
        ref.copy_(out)
        del out  # the reference's output is freed here, before the candidate runs
        out = new_model(*inputs)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ok = torch.allclose(out.double(), ref, rtol=1e-2, atol=1e-2)
        t0 = time.perf_counter()
        for _ in range(5):
            new_model(*inputs)
        ms = (time.perf_counter() - t0) / 5 * 1e3
    return {"accepted": bool(ok), "detail": "" if ok else "allclose failed", "ms": ms}


def _child(req: dict, w: int) -> None:
    try:
        res = naive_check(req["task"], req["candidate"], req.get("device", "cpu"))
    except BaseException as e:  # noqa: BLE001
        res = {"accepted": False, "detail": f"{type(e).__name__}: {e}"[:500],
               "traceback": traceback.format_exc()[-1500:]}
    os.write(w, json.dumps(res).encode())
    os._exit(0)


def serve() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - candidates may print
            _child(req, w)
        os.close(w)
        chunks, deadline = [], time.monotonic() + float(req.get("timeout_s", 120))
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                chunks = [json.dumps({"accepted": False, "detail": "naive harness: timeout"})
                          .encode()]
                break
            data = os.read(r, 1 << 16)
            if not data:
                break
            chunks.append(data)
        os.close(r)
        os.waitpid(pid, 0)
        text = b"".join(chunks).decode() or json.dumps(
            {"accepted": False, "detail": "naive harness: the candidate killed the process"})
        sys.stdout.write(text.replace("\n", " ") + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
