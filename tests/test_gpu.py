"""The cuda half: the verifier on a real GPU (marked gpu; skipped without CUDA).

Run on the GPU machine: `python3 -m pytest -p no:cacheprovider -q tests/test_gpu.py`.

Two parts: a few relu candidates written inline (below), and the cuda exploit zoo
(tests/zoo_cuda/, issue #3's cuda half; files described in tests/test_zoo.py and
tests/test_zoo_cuda.py): every exploit is rejected for the reason it declares, every honest
candidate is accepted, a naive KernelBench-style harness on the GPU accepts every exploit, and
every GPU fault (illegal address, endless kernel, GPU out of memory; issue #7) ends only its
worker, with a verdict that names the reason, within the time limit.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from assay.tasks.model import Task
from assay.verify.harness import verify
from assay.verify.reference import Prepared
from assay.verify.settings import VerifyConfig
from test_zoo import (GENEROUS_PEAKS, _param, assert_verdict, prepared, record, zoo_config,
                      zoo_task)
from test_zoo_cuda import CUDA_CASES, CUDA_ZOO, kernel_names, kernel_sources

pytestmark = pytest.mark.gpu

TASK = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
rows, cols = 4096, 4097
def get_inputs():
    return [torch.randn(rows, cols)]
def get_init_inputs():
    return []
"""

CUDA = '''
import ctypes, torch
from torch import nn
from assay.bench.build import load_library
SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < @LIMIT@;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" int relu(const float* x, float* y, int64_t n, cudaStream_t s) {
  int blocks = (int)((n + 255) / 256); if (blocks > 65535) blocks = 65535;
  @LAUNCH@
  return (int)cudaGetLastError();
}
"""
_lib = load_library(SOURCE, "cuda")
class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        err = _lib.relu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                        ctypes.c_int64(x.numel()),
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"CUDA error {err}")
        return y
'''


def cuda_kernel(limit="n", launch="relu_kernel<<<blocks, 256, 0, s>>>(x, y, n);"):
    return CUDA.replace("@LIMIT@", limit).replace("@LAUNCH@", launch)


CASES = {
    "honest": (cuda_kernel(), []),
    "partial_write": (cuda_kernel(limit="n / 2"), ["correctness"]),
    "no_kernel_launched": (cuda_kernel(launch=""), ["correctness", "kernel_audit"]),
    "library_call": ("""
import torch
from torch import nn
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
""", ["kernel_audit"]),
    "side_stream_unsynced": (cuda_kernel().replace(
        "torch.cuda.current_stream().cuda_stream", "_side.cuda_stream").replace(
        "class ModelNew", "_side = torch.cuda.Stream()\nclass ModelNew"),
        ["stream_ordered"]),
}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("gputask") / "level1" / "1_Relu.py"
    path.parent.mkdir()
    path.write_text(TASK)
    return Task.from_file(path)


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_candidate(name, task, tmp_path):
    code, expected = CASES[name]
    cand = tmp_path / f"{name}.py"
    cand.write_text(code)
    times: dict = {}
    v = verify(task, cand, "cuda", VerifyConfig(budget_s=0.3), times=times)
    print(name, v.accepted, v.reasons, v.runtime_ms, v.kernels_launched[:4])
    # the default transfer: the worker drew every set on the GPU as the harness had
    assert times["transfer"] == "draw" and "transfer_fallback" not in times, times
    assert v.accepted == (not expected), (v.reasons, {k: c["detail"][:300]
                                                      for k, c in v.checks.items()})
    assert all(r in v.reasons for r in expected) or not expected, v.reasons
    if not expected:
        assert any("relu_kernel" in k for k in v.kernels_launched)
        assert v.runtime_ms > 0


def test_inputs_are_sampled_on_the_gpu(tmp_path):
    """make_inputs on cuda: the task's own sampling runs on the device, the same values for the
    same seed, other values for another; a get_inputs that cannot (numpy) is sampled on cpu."""
    import types

    from assay.tasks.instantiate import make_inputs

    mod = types.SimpleNamespace(get_inputs=lambda: [torch.randn(1000, 3), 7])
    a, b, c = (make_inputs(mod, s, "cuda") for s in (5, 5, 6))
    assert a[0].device.type == "cuda" and a[1] == 7
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])

    import numpy as np

    mixed = types.SimpleNamespace(get_inputs=lambda: [
        torch.randn(8) + torch.from_numpy(np.ones(8, dtype=np.float32))])
    x = make_inputs(mixed, 5, "cuda")[0]
    assert x.device.type == "cuda"
    assert torch.equal(x, make_inputs(mixed, 5, "cuda")[0])


def test_staged_copies_between_device_and_host_are_exact(monkeypatch):
    """worker.copy_staged through a pinned buffer smaller than the tensor, both ways, with a
    last chunk that is partial; a strided source takes the plain copy."""
    from assay.verify import worker

    monkeypatch.setattr(worker, "STAGE_B", 1 << 12)
    monkeypatch.setattr(worker, "STAGE_MIN_B", 1 << 10)  # (12 kB, staged: over this floor)
    monkeypatch.setattr(worker, "_STAGE", [])
    x = torch.randn(3001, device="cuda")
    host = torch.empty(3001)
    worker.copy_staged(host, x)
    assert torch.equal(host, x.cpu())
    back = torch.empty_like(x)
    worker.copy_staged(back, host)
    assert torch.equal(back, x) and worker._STAGE[0].is_pinned()
    t = torch.randn(64, 80, device="cuda").t()
    out = torch.empty(80, 64)
    worker.copy_staged(out, t)
    assert torch.equal(out, t.cpu())


def test_a_cuda_warm_up_of_a_tiny_call_is_capped_and_still_lasts_its_time():
    """A call of microseconds warms up CUDA_WARMUP_CALLS times at most (the audit traces every
    call), and the device is kept busy for the rest of the warm-up's time (its clocks)."""
    from assay.bench import timing

    x = torch.randn(1024, device="cuda")
    calls, first_timed = [], []
    t0 = time.perf_counter()

    def before(call: int) -> None:
        if not first_timed:
            first_timed.append((len(calls), time.perf_counter() - t0))

    cfg = timing.TimingConfig(warmup_s=0.0, min_runs=10, max_runs=10, budget_s=0.0)
    timing.time_calls(lambda i: calls.append(i) or x * 2, torch.device("cuda"), cfg, before)
    warm_calls, warm_s = first_timed[0]
    assert warm_calls == timing.CUDA_WARMUP_CALLS, warm_calls
    assert warm_s >= 0.9 * timing.CUDA_MIN_WARMUP_S, warm_s


def test_illegal_address_is_a_verdict(task, tmp_path):
    cand = tmp_path / "oob.py"
    cand.write_text(cuda_kernel(launch="relu_kernel<<<blocks, 256, 0, s>>>(x, (float*)8, n);"))
    v = verify(task, cand, "cuda", VerifyConfig(budget_s=0.3, timeout_s=120))
    assert not v.accepted and set(v.reasons) & {"runs", "crash", "correctness"}


# --- the cuda exploit zoo ----------------------------------------------------------------------

NAIVE = Path(__file__).parent / "zoo" / "naive.py"


def cuda_task(rel: str) -> Task:
    return zoo_task(rel, CUDA_ZOO)


def cuda_prepared(task: Task) -> Prepared:
    return prepared(task, "cuda")


def cuda_record(task: Task) -> dict:
    """Roofline inputs as in the cpu zoo, judged against GENEROUS_PEAKS (10 TB/s), which no
    honest kernel beats and a faked time does."""
    return record(task, "cuda")


@pytest.fixture(scope="module")
def prebuilt():
    """Every zoo kernel compiled up front, 8 at a time, into the kernel cache the workers share
    (each worker would otherwise compile its own, in series, a few seconds each)."""
    from assay.bench.build import build

    sources = [s for m in CUDA_CASES.values() for s in kernel_sources(m["path"])]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda src: build(src, "cuda"), sources))


def run_cuda_case(name: str):
    meta = CUDA_CASES[name]
    task = cuda_task(meta["TASK"])
    t0 = time.perf_counter()
    v = verify(task, meta["path"], "cuda", zoo_config(meta), record=cuda_record(task),
               peaks=GENEROUS_PEAKS, prepared=cuda_prepared(task))
    elapsed = time.perf_counter() - t0
    print(name, v.accepted, v.reasons, f"{v.runtime_ms} ms", f"verify {elapsed:.1f} s",
          (v.kernels_launched or [])[:4], v.error[:200])
    return v, elapsed


@pytest.mark.parametrize("name", [_param(n, CUDA_CASES) for n, m in CUDA_CASES.items()
                                  if m["KIND"] != "failure"])
def test_cuda_zoo_verdict(name, prebuilt):
    meta = CUDA_CASES[name]
    v, _ = run_cuda_case(name)
    assert_verdict(meta, v)
    if not meta["EXPECT"]:
        assert v.runtime_ms > 0 and v.kernels_launched is not None
        assert v.checks["precision"]["passed"] and v.checks["stale_results"]["passed"]
        own = kernel_names(meta["path"])
        assert any(k in launched for k in own for launched in v.kernels_launched), \
            (own, v.kernels_launched)
        if meta["POLICY"] == "permissive":
            assert v.library_time_frac is not None and v.library_time_frac > 0
        else:  # the harness found each of its kernels in its own build (issue #19)
            found = v.checks["audit_provenance"]
            assert found["passed"] and "defined in the candidate's build" in found["detail"], found


@pytest.mark.parametrize("name", [n for n, m in CUDA_CASES.items() if m["KIND"] == "failure"])
def test_cuda_fault_ends_only_its_worker(name, prebuilt):
    """Issue #7 on the GPU: the fault is a verdict with its reason, within the time limit; the
    harness's own CUDA context still works, the worker's device memory comes back, and the next
    candidate is judged normally."""
    meta = CUDA_CASES[name]
    cuda_record(cuda_task(meta["TASK"]))  # prepared before the memory is measured

    def free() -> int:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info()[0]

    free_before = free()
    v, elapsed = run_cuda_case(name)
    assert_verdict(meta, v)
    limit = zoo_config(meta).timeout_s
    assert elapsed < limit + 60, (elapsed, limit)
    x = torch.ones(1 << 20, device="cuda")
    assert float(x.sum()) == float(1 << 20)
    deadline = time.monotonic() + 20
    while free() < free_before - (1 << 30) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert free() >= free_before - (1 << 30), (torch.cuda.mem_get_info(), free_before)
    after, _ = run_cuda_case("honest_gelu_cuda")
    assert after.accepted, after.reasons


@pytest.fixture(scope="module")
def naive_cuda():
    """tests/zoo/naive.py (the harness the 2025 incident fooled) with device "cuda"."""
    proc = subprocess.Popen([sys.executable, str(NAIVE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)

    def once(task: Path, candidate: Path, timeout_s: float) -> dict:
        proc.stdin.write(json.dumps({"task": str(task), "candidate": str(candidate),
                                     "timeout_s": timeout_s, "device": "cuda"}) + "\n")
        proc.stdin.flush()
        if not select.select([proc.stdout], [], [], timeout_s + 30)[0]:
            raise TimeoutError("naive harness server did not answer")
        return json.loads(proc.stdout.readline())

    def ask(task: Path, candidate: Path, timeout_s: float = 120.0) -> dict:
        # The naive harness plans no memory: beside other pytest-xdist workers on one GPU
        # (gpu_phases.sh XDIST=4 on an H100), their verifications' sets can leave it none. That
        # is no answer about the candidate: asked again when they may have finished.
        for wait_s in (5, 15, 30):
            r = once(task, candidate, timeout_s)
            if "out of memory" not in r.get("detail", ""):
                return r
            time.sleep(wait_s)
        return once(task, candidate, timeout_s)

    yield ask
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.parametrize("name", [n for n, m in CUDA_CASES.items() if m["KIND"] == "exploit"])
def test_naive_harness_accepts_cuda_exploit(name, prebuilt, naive_cuda):
    """Each exploit is a real one: on the GPU, a harness that runs the reference first in its
    own process, frees its output, syncs and calls allclose(1e-2) accepts it (the CUDA caching
    allocator hands a freed block back deterministically: one try)."""
    meta = CUDA_CASES[name]
    if isinstance(meta.get("NAIVE"), str):
        pytest.skip(meta["NAIVE"])
    r = naive_cuda(CUDA_ZOO / "tasks" / f"{meta['TASK']}.py", meta["path"])
    assert r["accepted"], r
