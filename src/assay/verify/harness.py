"""The harness: secret inputs, the reference, the candidate's worker, and the named checks.

The harness process holds the reference model and the expected outputs; the candidate runs in a
worker process it spawns (``assay.verify.worker``) and only ever returns outputs. Every
decision is a named check recorded in the verdict; a failed check's name is its reason.
"""

from __future__ import annotations

import math
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from assay.records import Verdict
from assay.tasks.instantiate import as_outputs, init_inputs, make_inputs, reference_model
from assay.tasks.model import Task
from assay.verify import policy as policy_mod
from assay.verify.sandbox import run_sandboxed
from assay.verify.settings import VerifyConfig


def resolve_device(device: str) -> str:
    if device in ("auto", "", None):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def set_reference_numerics(allow_tf32: bool) -> None:
    """The reference is computed in true fp32 unless the config says tf32."""
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")


def tolerance(dtype: torch.dtype, cfg: VerifyConfig) -> tuple[float, float]:
    key = str(dtype).removeprefix("torch.")
    if key == "float32" and cfg.allow_tf32:
        key = "tf32"
    rtol, atol = cfg.tolerances.get(key, cfg.tolerances["float32"])
    return float(rtol), float(atol)


def compare(out: dict[str, Any], ref: torch.Tensor, cfg: VerifyConfig) -> tuple[bool, str, float, float]:
    """Exact shape, dtype and strides; NaN where and only where the reference has NaN; then
    |out - ref| <= atol * rms(ref) + rtol * |ref| elementwise. Returns ok, detail, max|d|, rel."""
    val = out["value"]
    if tuple(val.shape) != tuple(ref.shape):
        return False, f"shape {tuple(val.shape)} != reference {tuple(ref.shape)}", math.inf, math.inf
    if val.dtype != ref.dtype:
        return False, f"dtype {val.dtype} != reference {ref.dtype}", math.inf, math.inf
    if tuple(out["stride"]) != tuple(ref.stride()):
        return False, f"strides {tuple(out['stride'])} != reference {tuple(ref.stride())}", \
            math.inf, math.inf
    r = ref.detach().cpu().to(torch.float64)
    v = val.to(torch.float64)
    nan_r, nan_v = torch.isnan(r), torch.isnan(v)
    if not torch.equal(nan_r, nan_v):
        return False, f"{int((nan_r != nan_v).sum())} NaN mismatches (unwritten or wrong " \
                      f"output elements)", math.inf, math.inf
    inf_mismatch = torch.isinf(r) != torch.isinf(v)
    if bool(inf_mismatch.any()) or not torch.equal(r[torch.isinf(r)], v[torch.isinf(v)]):
        return False, "infinities differ from the reference", math.inf, math.inf
    finite = torch.isfinite(r)
    r, v = r[finite], v[finite]
    if r.numel() == 0:
        return True, "", 0.0, 0.0
    diff = (v - r).abs()
    max_abs = float(diff.max())
    rms = float(r.pow(2).mean().sqrt())
    rel = float(diff.norm() / (r.norm() + 1e-30))
    rtol, atol = tolerance(ref.dtype, cfg)
    bound = atol * max(rms, 1e-30) + rtol * r.abs()
    bad = diff > bound
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        return False, (f"{int(bad.sum())}/{r.numel()} elements off (max |diff| {max_abs:.3g}, "
                       f"first at flat index {i}: got {float(v[i]):.6g}, want {float(r[i]):.6g}; "
                       f"rtol {rtol:g}, atol {atol:g}*rms)"), max_abs, rel
    return True, "", max_abs, rel


def roofline_ms(record: dict[str, Any] | None, peaks: dict[str, Any] | None) -> float | None:
    """The fastest any implementation could be: max(bytes / bandwidth, FLOPs / peak)."""
    if not record or not peaks:
        return None
    t_bytes = record.get("min_bytes", 0.0) / (peaks["bandwidth_gbs"] * 1e9)
    t_flops = record.get("flops", 0.0) / (peaks["flops_tflops"] * 1e12)
    return max(t_bytes, t_flops) * 1e3


@dataclass
class Prepared:
    """Everything the harness computed for one (task, device): reused across candidates."""

    task: Task
    device: str
    init_inputs: list
    init_seed: int
    state_dict: dict
    input_sets: list
    references: list[list[torch.Tensor]]
    timing_sets: list
    swap_sets: list
    set_references: list[list[torch.Tensor]]  # references for timing_sets + swap_sets
    poison_bytes: int


def prepare(task: Task, device: str, cfg: VerifyConfig) -> Prepared:
    """Draw secret seeds, build the reference and compute the expected outputs."""
    set_reference_numerics(cfg.allow_tf32)
    module = task.module()
    init_seed = secrets.randbits(31)
    model = reference_model(module, init_seed, device)
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def run_ref(inputs: list) -> list[torch.Tensor]:
        with torch.no_grad():
            return [o.detach().cpu().clone() for o in as_outputs(model(*inputs))]

    def draw(distribution: str) -> list:
        return make_inputs(module, secrets.randbits(31), "cpu", distribution)

    input_sets = [draw(d) for d in cfg.input_distributions]
    timing_sets = [draw("native") for _ in range(cfg.timing_sets)]
    swap_sets = [draw("native") for _ in range(cfg.swap_sets)]
    to_dev = lambda xs: [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]  # noqa: E731
    references = [run_ref(to_dev(xs)) for xs in input_sets]
    set_refs = [run_ref(to_dev(xs)) for xs in timing_sets + swap_sets]
    out_bytes = sum(o.numel() * o.element_size() for o in references[0])
    return Prepared(task, device, init_inputs(module), init_seed, sd, input_sets, references,
                    timing_sets, swap_sets, set_refs, max(out_bytes, 1 << 20))


def _worker_job(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> dict[str, Any]:
    return {
        "candidate": str(candidate), "device": prep.device, "init_inputs": prep.init_inputs,
        "init_seed": prep.init_seed, "state_dict": prep.state_dict,
        "input_sets": prep.input_sets, "timing_sets": prep.timing_sets,
        "swap_sets": prep.swap_sets, "swap_seed": secrets.randbits(31),
        "poison_bytes": prep.poison_bytes, "audit": cfg.audit,
        "timing": {"warmup_s": cfg.warmup_s, "min_runs": cfg.min_runs, "max_runs": cfg.max_runs,
                   "budget_s": cfg.budget_s, "flush_cache": True},
    }


def run_worker(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> tuple[dict | None, str]:
    """Run the candidate's worker in a sandbox; return its result (or None) and a failure line."""
    scratch = Path(tempfile.mkdtemp(prefix="assay-verify-"))
    try:
        cand_copy = scratch / "candidate.py"
        shutil.copyfile(candidate, cand_copy)
        torch.save(_worker_job(prep, cand_copy, cfg), scratch / "job.pt")
        outcome = run_sandboxed([sys.executable, "-m", "assay.verify.worker", str(scratch)],
                                scratch, cfg.timeout_s, cfg.limits, device=prep.device)
        result_file = scratch / "result.pt"
        # weights_only: the candidate wrote this file; a full unpickle would run its code here.
        result = torch.load(result_file, weights_only=True) if result_file.exists() else None
        return result, outcome
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def verify(task: Task, candidate: Path, device: str = "auto", cfg: VerifyConfig | None = None,
           baseline: dict[str, Any] | None = None, record: dict[str, Any] | None = None,
           peaks: dict[str, Any] | None = None, prepared: Prepared | None = None) -> Verdict:
    """Judge one candidate file against one task. Never raises for anything the candidate does."""
    cfg = cfg or VerifyConfig()
    device = resolve_device(device)
    t0 = time.perf_counter()
    v = Verdict(candidate=Path(candidate).stem, task=task.id, device=device, policy=cfg.policy)
    if baseline:
        v.baseline_eager_ms = baseline.get("eager_ms")
        v.baseline_compile_ms = baseline.get("compile_ms")
    v.roofline_ms = roofline_ms(record, peaks)

    degenerate = bool(record and record.get("degeneracy", {}).get("degenerate"))
    if degenerate:
        detail = record["degeneracy"].get("why", "output barely depends on the inputs")
        if not v.check("task_not_degenerate", cfg.on_degenerate != "reject", detail):
            v.error = f"task {task.id} is degenerate: {detail}"
            v.verify_s = time.perf_counter() - t0
            return v.finish()

    prep = prepared or prepare(task, device, cfg)
    result, outcome = run_worker(prep, Path(candidate), cfg)
    _judge(v, prep, result, outcome, cfg)
    v.verify_s = time.perf_counter() - t0
    return v.finish()


def _judge(v: Verdict, prep: Prepared, result: dict | None, outcome: str,
           cfg: VerifyConfig) -> None:
    if result is None:
        name = "timeout" if outcome.startswith("timeout") else "crash"
        v.check(name, False, outcome)
        v.error = outcome
        return
    stage = result.get("stage")
    if "error" in result:
        name = {"load": "compiles", "construct": "constructs"}.get(stage, "runs")
        if result.get("build_log"):
            name = "compiles"
        v.check(name, False, result["error"] + ("\n" + result["build_log"]
                                                 if result.get("build_log") else ""))
        v.error = result["error"]
        return
    v.check("compiles", True)
    v.check("constructs", True)
    v.check("runs", True)
    params = result["parameters"]
    v.check("parameters", bool(result["parameters_loaded"]),
            "" if result["parameters_loaded"] else
            f"ModelNew's parameters {params['candidate']} do not match the reference's "
            f"{params['reference']}: the harness cannot load the reference's weights")

    max_abs, rel = 0.0, 0.0
    problems = []
    for i, (outs, refs) in enumerate(zip(result["outputs"], prep.references)):
        if len(outs) != len(refs):
            problems.append(f"input set {i}: {len(outs)} outputs, reference has {len(refs)}")
            continue
        for j, (o, r) in enumerate(zip(outs, refs)):
            if o["device"].split(":")[0] != prep.device.split(":")[0]:
                problems.append(f"input set {i} output {j}: on {o['device']}, expected "
                                f"{prep.device}")
                continue
            ok, detail, ma, re_ = compare(o, r, cfg)
            max_abs, rel = max(max_abs, ma), max(rel, re_)
            if not ok:
                problems.append(f"input set {i} ({cfg.input_distributions[i]}) output {j}: "
                                f"{detail}")
    v.max_abs_err, v.rel_err = max_abs, rel
    layout = [p for p in problems if "shape" in p or "dtype" in p or "strides" in p]
    v.check("output_layout", not layout, "; ".join(layout))
    v.check("correctness", not problems, "; ".join(problems[:4]))

    changed = [i for i, d in enumerate(result["input_digests"]) if d["before"] != d["after"]]
    v.check("inputs_unchanged", not changed,
            f"inputs modified in place on input sets {changed}" if changed else "")
    aliased = [i for i, a in enumerate(result["aliasing"]) if any(a)]
    v.check("no_output_aliasing", not aliased,
            "an output shares memory with an input" if aliased else "")

    stale = []
    for chk in result["timing_checks"]:
        refs = prep.set_references[chk["set"]]
        for o, r in zip(chk["values"], refs):
            ok, detail, *_ = compare({"value": o, "stride": tuple(o.stride()),
                                      "device": prep.device}, r, cfg)
            if not ok:
                stale.append(f"timed call on set {chk['set']}: {detail}")
    v.check("timed_outputs", not stale, "; ".join(stale[:3]))

    tampered = result.get("tampered_clocks", [])
    v.check("harness_integrity", not tampered,
            f"replaced: {', '.join(tampered)}" if tampered else "")
    before, after = result["settings_before"], result["settings_after"]
    changed_settings = [f"{k}: {before[k]} -> {after[k]}" for k in before if before[k] != after[k]]
    v.check("global_state", not changed_settings, "; ".join(changed_settings))

    t = result["timing"]
    v.runtime_ms, v.runtime_iqr_ms = t["median_ms"], t["iqr_ms"]
    escaped = t.get("escaped_ms", 0.0)
    v.check("stream_ordered", escaped <= max(0.25 * v.runtime_ms, 0.01),
            f"{escaped:.4g} ms of device work finished only after a device-wide sync, outside "
            f"the {v.runtime_ms:.4g} ms timed on the caller's stream (side stream or thread)"
            if escaped > max(0.25 * v.runtime_ms, 0.01) else "")
    if v.baseline_eager_ms:
        v.speedup_eager = v.baseline_eager_ms / v.runtime_ms if v.runtime_ms > 0 else None
    if v.baseline_compile_ms:
        v.speedup_compile = v.baseline_compile_ms / v.runtime_ms if v.runtime_ms > 0 else None
    if v.roofline_ms:
        v.check("roofline", v.runtime_ms >= cfg.roofline_margin * v.roofline_ms,
                f"runtime {v.runtime_ms:.4g} ms is under the roofline floor "
                f"{v.roofline_ms:.4g} ms: impossible, so something was skipped"
                if v.runtime_ms < cfg.roofline_margin * v.roofline_ms else "")

    if "kernels" in result:
        audit = policy_mod.audit(result["kernels"], prep.device, cfg.policy,
                                 cfg.max_library_time_frac)
        v.kernels_launched = audit.kernels
        v.library_time_frac = audit.library_time_frac
        v.check("kernel_audit", audit.ok, audit.detail)
