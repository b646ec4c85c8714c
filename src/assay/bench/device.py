"""The device's two ceilings, measured once and cached: memory bandwidth and peak FLOP rate.

Datasheet numbers are leads; the roofline floor uses what this device actually does: a large
device-to-device copy (bytes read + written) and a large fp32 matrix product (tf32 off).
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

import torch

from assay.bench.build import cache_dir
from assay.bench.timing import TimingConfig, time_calls


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu-{platform.machine()}-{platform.processor() or 'unknown'}-{torch.get_num_threads()}t"


def _cache_file(name: str) -> Path:
    return cache_dir().parent / f"device-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.json"


def measure_peaks(device: str) -> dict[str, Any]:
    dev = torch.device(device)
    cfg = TimingConfig(warmup_s=0.05, min_runs=5, max_runs=30, budget_s=0.5, flush_cache=False)
    n = (256 << 20) // 4 if dev.type == "cuda" else (64 << 20) // 4
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    t_copy = time_calls(lambda i: dst.copy_(src), dev, cfg)
    bandwidth = 2 * n * 4 / (t_copy.median_ms * 1e-3) / 1e9
    m = 8192 if dev.type == "cuda" else 1024
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(m, m, device=dev), torch.randn(m, m, device=dev)
    t_mm = time_calls(lambda i: a @ b, dev, cfg)
    torch.backends.cuda.matmul.allow_tf32 = prev
    flops = 2 * m ** 3 / (t_mm.median_ms * 1e-3) / 1e12
    return {"name": device_name(device), "bandwidth_gbs": bandwidth, "flops_tflops": flops,
            "measured_with": {"copy_mb": n * 4 >> 20, "matmul_fp32": m}}


def peaks(device: str, refresh: bool = False) -> dict[str, Any]:
    """Measured peaks of ``device``, from the per-device cache when present; ``refresh``
    measures again. The cache keeps the highest of its measurements: a busy machine can only
    measure a peak low, and a low bandwidth makes the roofline floor reject honest kernels (a
    copy measured at 18 GB/s while tests ran, against 40 GB/s idle, made a ReLU kernel's 0.9 ms
    "impossible")."""
    name = device_name(device)
    path = _cache_file(name)
    cached = None
    if path.exists():
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
    if cached is not None and not refresh:
        return cached
    data = measure_peaks(device)
    if cached is not None:
        for key in ("bandwidth_gbs", "flops_tflops"):
            if isinstance(cached.get(key), (int, float)) and cached[key] > data[key]:
                data[key] = cached[key]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return data
