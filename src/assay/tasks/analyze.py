"""What a task costs at least, and whether its output depends on its inputs at all.

- FLOPs from ``torch.utils.flop_counter`` (matmuls, convolutions, attention). Their direct
  form's count; the roofline's floor counts only ``floor_flops``, those of ops no known
  algorithm does with less arithmetic: convolutions are left out, since Winograd and FFT
  convolutions need fewer multiplications (cuDNN ran KernelBench's ConvTranspose2d at 107
  TFLOP/s of direct-form FLOPs in fp32 without TF32 on an H200, over the chip's fp32 rate).
- Minimum bytes: every input, parameter and output moved once. A lower bound on traffic.
Both are measured on the meta device when the task allows it (no memory, no time), so H100-size
tasks are analyzed on a laptop.
- Degeneracy: how much the output spreads, and how much it moves when the inputs or the initial
  weights change. A task whose output barely moves with its inputs can be "solved" by a constant
  (the 2025 incident), so it is flagged and the verifier refuses to report speedups on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from assay.tasks.instantiate import (as_outputs, build_model, make_inputs, reference_model,
                                     seeded)
from assay.tasks.model import Task

DEGENERATE_INPUT_SENSITIVITY = 1e-3
# The outputs' standard deviation over their RMS under which they are "nearly constant": their
# mean, as a constant, would then pass float32's rtol (1e-4). Relative, not absolute: a softmax
# over 393,216 values (KernelBench's L1_23) has a spread of 7e-7 and is anything but constant.
DEGENERATE_SPREAD = 1e-4


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def cost(task: Task, real: bool = True) -> dict[str, Any] | None:
    """FLOPs, minimum bytes and input signatures at the task's size, measured on the meta
    device (nothing allocated); where an op has no meta kernel, on the CPU for real, or None
    when ``real`` is off (a caller that must size the task first)."""
    module = task.module()
    try:
        with torch.device("meta"):
            model = build_model(module.Model, module, 0, "meta")
            with seeded(0):
                inputs = module.get_inputs()
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                outs = as_outputs(model(*inputs))
        where = "meta"
    except Exception:  # noqa: BLE001 - some ops have no meta kernel: run for real
        if not real:
            return None
        model = reference_model(module, 0, "cpu")
        inputs = make_inputs(module, 0, "cpu")
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            outs = as_outputs(model(*inputs))
        where = "cpu"
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    params = list(model.parameters()) + list(model.buffers())
    by_op = counter.get_flop_counts().get("Global", {})
    conv = sum(n for op, n in by_op.items() if "conv" in str(op))
    return {
        "flops": float(counter.get_total_flops()),
        "floor_flops": float(counter.get_total_flops() - conv),
        "min_bytes": float(sum(map(_nbytes, tensors)) + sum(map(_nbytes, params))
                           + sum(map(_nbytes, outs))),
        "weight_bytes": float(sum(map(_nbytes, params))),  # parameters and buffers
        "inputs": [{"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}
                   if isinstance(x, torch.Tensor) else {"value": repr(x)} for x in inputs],
        "outputs": [{"shape": list(o.shape), "dtype": str(o.dtype).removeprefix("torch.")}
                    for o in outs],
        "n_parameters": int(sum(p.numel() for p in model.parameters())),
        "analyzed_on": where,
    }


# Elements per float64 chunk of the statistics below: a GiB-sized output never gets a float64
# copy, on the device or the host.
_STAT_CHUNK = 1 << 24


def _chunks(x: torch.Tensor) -> Iterator[torch.Tensor]:
    flat = x.reshape(-1)
    for i in range(0, flat.numel(), _STAT_CHUNK):
        yield flat[i:i + _STAT_CHUNK].double()


def _rel_change(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = den = 0.0
    for x, y in zip(a, b):
        for cx, cy in zip(_chunks(x), _chunks(y)):
            num += float(torch.linalg.vector_norm(cx - cy)) ** 2
            den += float(torch.linalg.vector_norm(cx)) ** 2
    num, den = num ** 0.5, den ** 0.5
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def _spread_and_finite(outs: list[torch.Tensor]) -> tuple[float, float, int, bool]:
    """The standard deviation and the RMS of all outputs' elements together (float64, in
    chunks), their count, and whether every one is finite."""
    n, total, total_sq, finite, shift = 0, 0.0, 0.0, True, None
    for o in outs:
        for c in _chunks(o):
            if shift is None:  # sums about a value near the mean: no cancellation
                shift = float(c.mean())
            c = c - shift
            n += c.numel()
            total += float(c.sum())
            total_sq += float((c * c).sum())
            finite = finite and bool(torch.isfinite(c).all())
    if not finite:
        return float("nan"), float("nan"), n, False
    if n == 0:
        return 0.0, 0.0, 0, True
    mean = shift + total / n
    rms = (max(total_sq / n - (total / n) ** 2, 0.0) + mean * mean) ** 0.5
    if n < 2:
        return 0.0, rms, n, True
    var = max(total_sq - total * total / n, 0.0) / (n - 1)
    return var ** 0.5, rms, n, finite


def task_record(task: Task, device: str = "cpu") -> dict[str, Any]:
    """What a verification is given of its task: :func:`cost` and, under ``degeneracy``,
    :func:`degeneracy` on ``device`` (cached per task and device by
    ``assay.bench.baseline_cache.cached_record``)."""
    return {**cost(task), "degeneracy": degeneracy(task, device)}


# The base run of :func:`degeneracy`: the reference model of this seed on inputs of that one.
BASE_MODEL_SEED, BASE_INPUT_SEED = 1, 2


def degeneracy(task: Task, device: str = "cpu",
               base: tuple[torch.nn.Module, list[torch.Tensor]] | None = None
               ) -> dict[str, Any]:
    """Output spread, sensitivity to the inputs, and to the initial weights.

    ``base``: the base run's model (``reference_model`` of :data:`BASE_MODEL_SEED`) and its
    outputs on ``make_inputs`` of :data:`BASE_INPUT_SEED`, where the caller has run them
    already (the extract step's check of the forward): at KernelBench's sizes each model built
    and each forward run again is seconds of a GPU held. The model is reused for the run on
    other inputs."""
    module = task.module()
    model_of_base = base[0] if base is not None else None

    def run(model_seed: int, input_seed: int) -> list[torch.Tensor]:
        model = model_of_base if model_seed == BASE_MODEL_SEED and model_of_base is not None \
            else reference_model(module, model_seed, device)
        with torch.no_grad():
            # kept where they were made: the statistics run there, in float64 chunks
            return [o.float() for o in as_outputs(model(*make_inputs(module, input_seed,
                                                                     device)))]

    if base is None:
        model_of_base = reference_model(module, BASE_MODEL_SEED, device)
        first = run(BASE_MODEL_SEED, BASE_INPUT_SEED)
    else:
        first = [o.float() for o in base[1]]
    base = None  # the caller's tuple let go: the base model lives in model_of_base alone
    # from the real model: some constructors call .item() (Swin's drop-path schedule), which a
    # meta build cannot
    has_params = any(True for _ in model_of_base.parameters())
    input_sensitivity = _rel_change(first, run(BASE_MODEL_SEED, BASE_INPUT_SEED + 1))
    model_of_base = None  # each other run freed once compared; the base model before the next
    weight_sensitivity = _rel_change(first, run(BASE_MODEL_SEED + 3, BASE_INPUT_SEED)) \
        if has_params else None
    spread, rms, n, finite = _spread_and_finite(first)
    report = {
        "output_spread": spread,
        "relative_spread": spread / rms if rms > 0 else (0.0 if spread == 0 else float("nan")),
        "input_sensitivity": input_sensitivity,
        "weight_sensitivity": weight_sensitivity,
        "finite": finite,
    }
    why = []
    if report["input_sensitivity"] < DEGENERATE_INPUT_SENSITIVITY:
        why.append(f"output changes by only {report['input_sensitivity']:.2g} (relative) when "
                   f"the inputs change")
    if n > 1 and spread <= DEGENERATE_SPREAD * rms:
        why.append(f"output spread {spread:.2g} ({report['relative_spread']:.2g} of its RMS): "
                   f"nearly constant")
    if not report["finite"]:
        why.append("reference output has NaN or Inf on random inputs")
    report["degenerate"] = bool(why)
    report["why"] = "; ".join(why)
    return report
