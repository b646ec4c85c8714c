"""Honest: mean squared error in two passes: per-block partial sums (grid-stride, block tree),
then one block sums the partials and divides; a 0-dim output like the reference's."""
TASK = "level1/5_mse_loss"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
#define PARTS 1024
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__global__ void mse_partial_kernel(const float* __restrict__ p, const float* __restrict__ t,
                                   float* __restrict__ parts, int64_t n) {
  float s = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float d = p[i] - t[i];
    s += d * d;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) parts[blockIdx.x] = s;
}
__global__ void mse_final_kernel(const float* __restrict__ parts, float* __restrict__ out,
                                 int64_t n) {
  float s = 0.f;
  for (int i = threadIdx.x; i < PARTS; i += blockDim.x) s += parts[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s / (float)n;
}
extern "C" int mse(const float* p, const float* t, float* parts, float* out, int64_t n,
                   cudaStream_t s) {
  mse_partial_kernel<<<PARTS, 256, 0, s>>>(p, t, parts, n);
  mse_final_kernel<<<1, 1024, 0, s>>>(parts, out, n);
  return (int)cudaGetLastError();
}
"""
_lib = load_library(SOURCE, "cuda")
PARTS = 1024


def _launch(fn, *args):
    """Tensors as device pointers, ints as int64, then the caller's current stream."""
    err = fn(*[ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int64(a)
               for a in args], ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if err:
        raise RuntimeError(f"CUDA error {err}")


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        parts = torch.empty(PARTS, dtype=p.dtype, device=p.device)
        out = torch.empty((), dtype=p.dtype, device=p.device)
        _launch(_lib.mse, p, t, parts, out, p.numel())
        return out
