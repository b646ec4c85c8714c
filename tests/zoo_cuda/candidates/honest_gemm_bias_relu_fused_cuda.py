"""Honest: the whole Linear + ReLU in one custom kernel: a shared-memory tiled x @ W^T with the
bias and the ReLU applied in the epilogue, before the single store."""
TASK = "level2/1_gemm_bias_relu"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

# (The kernel's name avoids "gemm": the audit reads names like that as a library's kernels.)
SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
#define T 32
__global__ void linear_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ bias, float* __restrict__ y,
                                        int M, int K, int N) {
  __shared__ float Xs[T][T + 1];
  __shared__ float Ws[T][T + 1];  // Ws[k][n] = w[n][k]
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  int wrow = blockIdx.x * T + threadIdx.y;  // the output column this thread loads for the tile
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += T) {
    int k = k0 + threadIdx.x;
    Xs[threadIdx.y][threadIdx.x] = (row < M && k < K) ? x[(int64_t)row * K + k] : 0.f;
    Ws[threadIdx.x][threadIdx.y] = (wrow < N && k < K) ? w[(int64_t)wrow * K + k] : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T; ++kk) acc += Xs[threadIdx.y][kk] * Ws[kk][threadIdx.x];
    __syncthreads();
  }
  if (row < M && col < N) y[(int64_t)row * N + col] = fmaxf(acc + bias[col], 0.f);
}
extern "C" int linear_bias_relu(const float* x, const float* w, const float* bias, float* y,
                                int64_t M, int64_t K, int64_t N, cudaStream_t s) {
  dim3 block(T, T), grid((unsigned)((N + T - 1) / T), (unsigned)((M + T - 1) / T));
  linear_bias_relu_kernel<<<grid, block, 0, s>>>(x, w, bias, y, (int)M, (int)K, (int)N);
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
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)  # the reference's weights load here

    def forward(self, x):
        x = x.contiguous()
        w, b = self.linear.weight.contiguous(), self.linear.bias.contiguous()
        y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
        _launch(_lib.linear_bias_relu, x, w, b, y, x.shape[0], x.shape[1], w.shape[0])
        return y
