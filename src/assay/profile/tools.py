"""Profiles of one kernel: the torch-profiler kernel list, Nsight Compute, clang-tidy.

Each runs the candidate in its own sandboxed worker (never in this process) or reads only its
source. Each returns text for the archive's NCU_Profile / Torch_Profile / Clang_Tidy columns, or
None with the reason logged when the tool is not available here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from assay.verify.harness import worker_job
from assay.verify.reference import Prepared
from assay.verify.sandbox import run_sandboxed
from assay.verify.settings import VerifyConfig

_SOURCE_BLOCK = re.compile(r"r?(\"\"\"|''')(.*?)\1", re.S)


def kernel_sources(code: str) -> list[str]:
    """The C++/CUDA sources inside a candidate file (triple-quoted strings that look like C)."""
    return [m.group(2) for m in _SOURCE_BLOCK.finditer(code)
            if re.search(r"#include|__global__|extern \"C\"", m.group(2))]


def torch_profile_table(kernels: list[dict[str, Any]], device: str) -> str:
    key = "device_us" if device.startswith("cuda") else "cpu_us"
    rows = sorted(kernels, key=lambda r: -r[key])
    total = sum(r[key] for r in rows) or 1.0
    lines = [f"{'name':60s} {'calls':>6s} {key:>12s} {'share':>7s}"]
    for r in rows[:30]:
        lines.append(f"{r['name'][:60]:60s} {r['count']:6d} {r[key]:12.1f} "
                     f"{r[key] / total:7.1%}")
    return "\n".join(lines)


def _job_dir(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="assay-profile-"))
    shutil.copyfile(candidate, scratch / "candidate.py")
    job = worker_job(prep, scratch / "candidate.py", cfg)
    job["timing"].update(min_runs=3, max_runs=3, warmup_s=0.0)
    torch.save(job, scratch / "job.pt")
    return scratch


def torch_profile(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> str | None:
    scratch = _job_dir(prep, candidate, cfg)
    try:
        outcome = run_sandboxed([sys.executable, "-m", "assay.verify.worker", str(scratch)],
                                scratch, cfg.timeout_s, cfg.limits, device=prep.device)
        res = scratch / "result.pt"
        if not res.exists():
            return f"profile run failed: {outcome}"
        result = torch.load(res, weights_only=True)  # written by the candidate's process
        if "kernels" not in result:
            return f"profile run failed: {result.get('error', outcome)}"
        return torch_profile_table(result["kernels"], prep.device)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ncu_profile(prep: Prepared, candidate: Path, cfg: VerifyConfig, metrics: list[str],
                timeout_s: float) -> str | None:
    ncu = shutil.which("ncu")
    if ncu is None or not prep.device.startswith("cuda"):
        return None
    scratch = _job_dir(prep, candidate, cfg)
    try:
        cmd = [ncu, "--metrics", ",".join(metrics), "--launch-count", "20", "--csv",
               "--target-processes", "all", sys.executable, "-m", "assay.verify.worker",
               str(scratch)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              cwd=scratch)
        summary = summarize_ncu_csv(proc.stdout)
        return summary or f"ncu gave no metrics for the candidate's kernels: {proc.stderr[-500:]}"
    except subprocess.TimeoutExpired:
        return f"ncu timed out after {timeout_s:.0f} s"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def summarize_ncu_csv(text: str) -> str:
    """One line per (candidate kernel, metric), averaged over its launches. The harness's own
    kernels (ATen fills and copies) are left out: they are not the candidate's."""
    import csv
    import io
    from collections import defaultdict

    from assay.verify.policy import LIBRARY_KERNEL

    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not rows:
        return ""
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        name = r.get("Kernel Name", "")
        if LIBRARY_KERNEL.search(name):
            continue
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        values[(name, r["Metric Name"], r.get("Metric Unit", ""))].append(value)
    lines = [f"{k[0][:70]} | {k[1]} = {sum(v) / len(v):.4g} {k[2]} (n={len(v)})"
             for k, v in sorted(values.items())]
    return "\n".join(lines)


def clang_tidy(code: str, target: str, timeout_s: float = 120) -> str | None:
    tidy = shutil.which("clang-tidy")
    if tidy is None:
        return None
    out = []
    with tempfile.TemporaryDirectory(prefix="assay-tidy-") as tmp:
        for i, src in enumerate(kernel_sources(code)):
            cuda = "__global__" in src or target == "cuda"
            path = Path(tmp) / (f"k{i}.cu" if cuda else f"k{i}.cpp")
            path.write_text(src)
            args = ["-x", "cuda", "--cuda-host-only", "-nocudalib", "-nocudainc"] if cuda \
                else ["-std=c++17", "-fopenmp"]
            proc = subprocess.run([tidy, str(path), "--checks=-*,bugprone-*,performance-*,"
                                   "readability-*,-readability-magic-numbers,"
                                   "-readability-identifier-length", "--", *args],
                                  capture_output=True, text=True, timeout=timeout_s)
            out.append(proc.stdout.replace(str(path), path.name).strip())
    return "\n".join(o for o in out if o) or "clang-tidy: no findings"
