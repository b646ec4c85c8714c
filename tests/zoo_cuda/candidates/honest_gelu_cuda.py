"""Honest: exact (erf) GELU, one thread per element in a grid-stride loop."""
TASK = "level1/1_gelu"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}
extern "C" int gelu(const float* x, float* y, int64_t n, cudaStream_t s) {
  int64_t blocks = (n + 255) / 256;
  gelu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(x, y, n);
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
