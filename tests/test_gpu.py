"""The cuda half: the verifier on a real GPU (marked gpu; skipped without CUDA).

Run on the GPU machine: `python3 -m pytest -m gpu -q`.
"""

from __future__ import annotations

import pytest

from assay.tasks.model import Task
from assay.verify.harness import VerifyConfig, verify

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
    v = verify(task, cand, "cuda", VerifyConfig(budget_s=0.3))
    print(name, v.accepted, v.reasons, v.runtime_ms, v.kernels_launched[:4])
    assert v.accepted == (not expected), (v.reasons, {k: c["detail"][:300]
                                                      for k, c in v.checks.items()})
    assert all(r in v.reasons for r in expected) or not expected, v.reasons
    if not expected:
        assert any("relu_kernel" in k for k in v.kernels_launched)
        assert v.runtime_ms > 0


def test_illegal_address_is_a_verdict(task, tmp_path):
    cand = tmp_path / "oob.py"
    cand.write_text(cuda_kernel(launch="relu_kernel<<<blocks, 256, 0, s>>>(x, (float*)8, n);"))
    v = verify(task, cand, "cuda", VerifyConfig(budget_s=0.3, timeout_s=120))
    assert not v.accepted and set(v.reasons) & {"runs", "crash", "correctness"}
