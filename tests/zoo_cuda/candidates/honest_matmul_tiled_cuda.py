"""Honest: shared-memory tiled fp32 matmul (32 x 32 tiles); the tails of M, K and N (1000 is
not a multiple of 32) are loaded as zeros and never written out of bounds."""
TASK = "level1/4_matmul"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
#define T 32
__global__ void matmul_tiled_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ c, int M, int K, int N) {
  __shared__ float As[T][T + 1];
  __shared__ float Bs[T][T + 1];
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += T) {
    int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
    As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? a[(int64_t)row * K + ka] : 0.f;
    Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? b[(int64_t)kb * N + col] : 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < T; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) c[(int64_t)row * N + col] = acc;
}
extern "C" int matmul(const float* a, const float* b, float* c, int64_t M, int64_t K, int64_t N,
                      cudaStream_t s) {
  dim3 block(T, T), grid((unsigned)((N + T - 1) / T), (unsigned)((M + T - 1) / T));
  matmul_tiled_kernel<<<grid, block, 0, s>>>(a, b, c, (int)M, (int)K, (int)N);
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
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        _launch(_lib.matmul, a, b, c, a.shape[0], a.shape[1], b.shape[1])
        return c
