"""Honest: row sums, one block per row: fp32 partial sums per thread, then a warp-shuffle tree
(another summation order than torch's; the tolerance allows for it, sqrt(N) rounding)."""
TASK = "level1/2_row_sum"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float part[32];
  const float* xr = x + (int64_t)blockIdx.x * cols;
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  s = warp_sum(s);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = warp_sum(lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f);
    if (lane == 0) y[blockIdx.x] = s;
  }
}
extern "C" int row_sum(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  row_sum_kernel<<<(unsigned)rows, 256, 0, s>>>(x, y, cols);
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
        y = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
        _launch(_lib.row_sum, x, y, x.shape[0], x.shape[1])
        return y
