"""Compile service: build candidates' kernels on the CPU cores while the GPU verifies others.

Each candidate is imported in build-only mode (``assay.bench.prebuild``) in its own sandboxed
process with no GPU visible; its kernels land in the content-hash build cache, so the worker
that later verifies it on the GPU loads them in milliseconds. Builds run ``workers`` at a time;
``wait(path)`` blocks only on that candidate's build.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from assay.verify.sandbox import run_sandboxed
from assay.verify.settings import SandboxLimits


@dataclass
class Prebuilt:
    candidate: str
    outcome: str  # "ok", or why the import failed (the verifier reports it properly)
    seconds: float


class CompileService:
    def __init__(self, workers: int = 4, timeout_s: float = 600.0,
                 limits: SandboxLimits | None = None):
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers),
                                       thread_name_prefix="assay-build")
        self.timeout_s = timeout_s
        self.limits = limits or SandboxLimits()
        self.futures: dict[str, Future] = {}

    def submit(self, candidate: Path) -> Future:
        key = str(candidate)
        if key not in self.futures:
            self.futures[key] = self.pool.submit(self._build, Path(candidate))
        return self.futures[key]

    def wait(self, candidate: Path) -> Prebuilt:
        return self.submit(candidate).result()

    def _build(self, candidate: Path) -> Prebuilt:
        t0 = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix="assay-build-"))
        try:
            copy = scratch / "candidate.py"
            shutil.copyfile(candidate, copy)
            # No GPU for builds: CUDA_VISIBLE_DEVICES is emptied for this process only.
            cmd = ["env", "CUDA_VISIBLE_DEVICES=", sys.executable, "-m",
                   "assay.bench.prebuild", str(copy)]
            outcome = run_sandboxed(cmd, scratch, self.timeout_s, self.limits, device="cpu")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return Prebuilt(candidate.stem, str(outcome), time.perf_counter() - t0)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def pin_cuda_arch() -> None:
    """Builds without a GPU must target the verifying GPU: fix the arch in the environment
    the builds and the workers inherit, so both compute the same cache key. Asked of the
    driver (nvidia-smi) where it answers, not of torch: a GPU step calls this before it takes
    the device (assay.gpu.hold_device), while another job may be using it, and CUDA's runtime
    is not to be started in this process before then."""
    if os.environ.get("ASSAY_CUDA_ARCH"):
        return
    from assay.gpu import driver_arch

    arch = driver_arch()
    if arch is None:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}"
    if arch:
        os.environ["ASSAY_CUDA_ARCH"] = arch


def built_first(candidates: list[Path], workers: int, timeout_s: float,
                limits: SandboxLimits) -> dict[str, Prebuilt]:
    """Every candidate's kernels built before a GPU step takes the device (the arch pinned
    first): {path: its build}. A build waited for with the device held leaves it idle while
    another job waits for it, so a step builds all its candidates first; ``workers`` 0 (the
    config's ``build.workers``): none here, each worker builds its own."""
    if workers <= 0 or not candidates:
        return {}
    pin_cuda_arch()
    service = CompileService(workers, timeout_s, limits)
    try:
        for path in candidates:  # all start now
            service.submit(path)
        return {str(path): service.wait(path) for path in candidates}
    finally:
        service.close()
