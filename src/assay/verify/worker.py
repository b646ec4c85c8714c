"""The candidate's own process: load it, run it on what the harness sends, return its outputs.

This process never sees the reference model, the expected outputs or the baseline timings: the
job file holds the candidate's path, the constructor arguments, the (randomized) state dict and
the input sets. Everything it produces goes back through ``result.pt`` for the harness to judge.

Usage: ``python -m assay.verify.worker JOB_DIR``
"""

from __future__ import annotations

# Clocks and settings are captured before torch or the candidate can be touched by anything.
import time as _time

_T0 = _time.perf_counter()

import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from assay.bench import timing  # noqa: E402  (captures the original clocks at import)
from assay.tasks.instantiate import as_outputs, seeded  # noqa: E402


def global_settings() -> dict[str, Any]:
    """Process-wide settings a candidate could flip to change numerics or slow a baseline."""
    s = {
        "num_threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.enabled": torch.backends.cudnn.enabled,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda.matmul.allow_fp16_reduced_precision_reduction":
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "default_dtype": str(torch.get_default_dtype()),
        "grad_enabled": torch.is_grad_enabled(),
    }
    return s


def tensor_digest(t: torch.Tensor) -> str:
    data = t.detach().contiguous().cpu()
    if data.dtype == torch.bfloat16:
        data = data.view(torch.int16)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]


def inputs_digest(inputs: list) -> list[str | None]:
    return [tensor_digest(v) if isinstance(v, torch.Tensor) else None for v in inputs]


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill memory the allocator will hand out next with NaN, then free it.

    An output the candidate never writes then holds NaN, not a stale copy of a previous result
    (the 2025 incident's kernels read the reference's freed output this way).
    """
    n = max(nbytes // 4, 1)
    for _ in range(2):
        junk = torch.full((n,), float("nan"), dtype=torch.float32, device=device)
        del junk
    timing.sync(device)


def clone_inputs(inputs: list, device: torch.device) -> list:
    return [v.to(device).clone() if isinstance(v, torch.Tensor) else v for v in inputs]


def load_candidate(path: Path):
    spec = importlib.util.spec_from_file_location("assay_candidate", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["assay_candidate"] = mod
    spec.loader.exec_module(mod)
    if not hasattr(mod, "ModelNew"):
        raise AttributeError("candidate does not define class ModelNew")
    return mod


def audit_kernels(model, inputs: list, device: torch.device) -> list[dict[str, Any]]:
    """What ran in one call: ATen ops (cpu) or device kernels (cuda), with their times."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), profile(activities=acts) as prof:
        model(*inputs)
        timing.sync(device)
    rows = []
    for evt in prof.key_averages():
        if device.type == "cuda":
            dev_us = getattr(evt, "self_device_time_total", None)
            if dev_us is None:
                dev_us = getattr(evt, "self_cuda_time_total", 0)
            kind = "kernel" if dev_us and evt.key and not evt.key.startswith("aten::") else "op"
            rows.append({"name": evt.key, "kind": kind, "count": evt.count,
                         "device_us": float(dev_us or 0), "cpu_us": float(evt.self_cpu_time_total)})
        else:
            rows.append({"name": evt.key, "kind": "op", "count": evt.count, "device_us": 0.0,
                         "cpu_us": float(evt.self_cpu_time_total)})
    return rows


def run(job_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Fill ``result`` stage by stage, so a failure still says how far the candidate got."""
    job = torch.load(job_dir / "job.pt", weights_only=False)
    device = torch.device(job["device"])
    if device.type == "cuda":
        # An explicit index: "cuda" alone is refused by set_device and synchronize.
        device = torch.device("cuda", device.index if device.index is not None else 0)
        torch.cuda.set_device(device)
    torch.set_grad_enabled(False)
    result.update(stage="start", settings_before=global_settings())

    result["stage"] = "load"
    t = timing._perf_counter()
    mod = load_candidate(Path(job["candidate"]))
    result["load_s"] = timing._perf_counter() - t

    result["stage"] = "construct"
    with seeded(job["init_seed"]):
        model = mod.ModelNew(*job["init_inputs"])
    model = model.to(device).eval()
    ref_sd = job["state_dict"]
    own = model.state_dict()
    ref_shapes = {k: tuple(v.shape) for k, v in ref_sd.items()}
    own_shapes = {k: tuple(v.shape) for k, v in own.items()}
    result["parameters"] = {"reference": ref_shapes, "candidate": own_shapes}
    if ref_shapes and ref_shapes == own_shapes:
        model.load_state_dict(ref_sd)
        model = model.to(device)
        result["parameters_loaded"] = True
    else:
        result["parameters_loaded"] = not ref_shapes and not own_shapes

    result["stage"] = "correctness"
    outputs, digests_after, aliasing = [], [], []
    for inputs in job["input_sets"]:
        xs = clone_inputs(inputs, device)
        before = inputs_digest(xs)
        poison_allocator(device, job["poison_bytes"])
        out = as_outputs(model(*xs))
        # Copy out on the caller's stream before any device-wide sync: work the candidate left
        # running on another stream (or a thread) is not finished when the caller may read it.
        values = [o.detach().to("cpu") if o.device.type != "cpu" else o.detach().clone()
                  for o in out]
        timing.sync(device)
        ptrs = {v.data_ptr() for v in xs if isinstance(v, torch.Tensor)}
        aliasing.append([o.data_ptr() in ptrs for o in out])
        outputs.append([{"value": v, "stride": tuple(o.stride()), "device": str(o.device)}
                        for v, o in zip(values, out)])
        digests_after.append({"before": before, "after": inputs_digest(xs)})
        del out
    result.update(outputs=outputs, input_digests=digests_after, aliasing=aliasing)

    result["stage"] = "timing"
    bufs = [clone_inputs(s, device) for s in job["timing_sets"]]
    holds = list(range(len(bufs)))  # which timing set each buffer holds now
    swaps = job["swap_sets"]
    rng = random.Random(job["swap_seed"])
    cfg = timing.TimingConfig(**job["timing"])
    swap_at = set(rng.sample(range(cfg.min_runs), k=min(len(swaps), cfg.min_runs)))
    pending: dict[int, int] = {}
    checked: list[dict[str, Any]] = []

    def before(call: int) -> None:
        if call in swap_at and swaps:
            s = len(pending) % len(swaps)
            b = call % len(bufs)
            for dst, src in zip(bufs[b], swaps[s]):  # same pointers, new data
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src.to(device))
            holds[b] = len(job["timing_sets"]) + s
            pending[call] = holds[b]

    def after(call: int, out: Any) -> None:
        if call in pending:
            vals = as_outputs(out)
            checked.append({"set": pending.pop(call),
                            "values": [v.detach().cpu().clone() for v in vals]})

    result["timing"] = timing.time_calls(lambda i: model(*bufs[i % len(bufs)]), device, cfg,
                                         before, after).to_dict()
    # After timing, every buffer is checked once more: stale results would show here.
    for b, xs in enumerate(bufs):
        vals = as_outputs(model(*xs))
        timing.sync(device)
        checked.append({"set": holds[b], "values": [v.detach().cpu().clone() for v in vals]})
    result["timing_checks"] = checked

    result["stage"] = "audit"
    if job.get("audit", True):
        result["kernels"] = audit_kernels(model, clone_inputs(job["input_sets"][0], device), device)
    result["settings_after"] = global_settings()
    result["tampered_clocks"] = timing.tampered_clocks()
    result["stage"] = "done"
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_dir = Path(argv[0])
    result: dict[str, Any] = {"stage": "start"}
    code = 0
    try:
        run(job_dir, result)
    except BaseException as e:  # noqa: BLE001 - report every failure of candidate code
        from assay.bench.build import BuildError

        result = {"stage": result.get("stage", "unknown"), "error_type": type(e).__name__,
                  "error": f"{type(e).__name__}: {e}"[:2000],
                  "traceback": traceback.format_exc()[-4000:],
                  "build_log": getattr(e, "log", "")[-8000:] if isinstance(e, BuildError) else ""}
        code = 3
    tmp = job_dir / "result.pt.tmp"
    torch.save(result, tmp)
    tmp.replace(job_dir / "result.pt")
    return code


if __name__ == "__main__":
    sys.exit(main())
