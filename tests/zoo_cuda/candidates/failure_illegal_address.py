"""Failure, not an exploit: the kernel writes far past the end of its output (an illegal address,
a sticky error of the worker's CUDA context). Only the worker is lost; the verdict says why."""
TASK = "level1/1_gelu"
EXPECT = ["runs"]
ALSO = ["crash"]
KIND = "failure"
CONFIG = {"timeout_s": 60}

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i + ((int64_t)1 << 40)] = x[i];  // a terabyte past the end
}
extern "C" int gelu(const float* x, float* y, int64_t n, cudaStream_t s) {
  gelu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, y, n);
  return (int)cudaGetLastError();
}
"""
_lib = load_library(SOURCE, "cuda")


def _launch(fn, *args):
    """Tensors as device pointers, ints as int64, then the caller's current stream."""
    err = fn(*[ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int64(a)
               for a in args], ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if err:
        raise RuntimeError(f"CUDA error {err}")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _launch(_lib.gelu, x, y, x.numel())
        return y
