"""Eager and torch.compile timings of a task's reference, with the candidates' protocol.

Runs in a process that never loads a candidate (the workflow's `baseline` step), so no
candidate can touch the baseline's clock, memory or settings.
"""

from __future__ import annotations

from typing import Any

import torch

from assay.bench.timing import TimingConfig, time_calls
from assay.tasks.instantiate import make_inputs, reference_model
from assay.tasks.model import Task


def time_reference(task: Task, device: str, cfg: TimingConfig, compile_: bool = True,
                   compile_mode: str = "default", rotating: int = 3) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    module = task.module()
    dev = torch.device(device)
    model = reference_model(module, 0, device)
    sets = [make_inputs(module, 100 + i, device) for i in range(rotating)]
    out: dict[str, Any] = {"task": task.id, "device": device, "size": task.size}
    with torch.no_grad():
        eager = time_calls(lambda i: model(*sets[i % rotating]), dev, cfg)
        out["eager_ms"], out["eager_iqr_ms"] = eager.median_ms, eager.iqr_ms
        # The same code timed twice: the spread is what counts as "no difference".
        again = time_calls(lambda i: model(*sets[i % rotating]), dev, cfg)
        lo, hi = sorted((eager.median_ms, again.median_ms))
        out["noise_frac"] = (hi - lo) / lo if lo > 0 else 0.0
        out["compile_ms"] = None
        if compile_:
            try:
                compiled = torch.compile(model, mode=compile_mode)
                for s in sets:
                    compiled(*s)
                t = time_calls(lambda i: compiled(*sets[i % rotating]), dev, cfg)
                out["compile_ms"], out["compile_iqr_ms"] = t.median_ms, t.iqr_ms
            except Exception as e:  # noqa: BLE001 - inductor failures are recorded, not fatal
                out["compile_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:500]
    return out
