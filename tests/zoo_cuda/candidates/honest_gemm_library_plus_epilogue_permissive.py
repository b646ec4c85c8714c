"""Honest under the permissive policy: the product from cuBLAS (torch.matmul), then a custom
kernel adds the bias and applies the ReLU in place. The audit reports cuBLAS's share of the
device time; the reference's own ops (linear/addmm, relu) are not re-run."""
TASK = "level2/1_gemm_bias_relu"
EXPECT = []
POLICY = "permissive"

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__global__ void bias_relu_kernel(float* __restrict__ y, const float* __restrict__ bias,
                                 int64_t n, int64_t cols) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = fmaxf(y[i] + bias[i % cols], 0.f);
}
extern "C" int bias_relu(float* y, const float* bias, int64_t n, int64_t cols, cudaStream_t s) {
  int64_t blocks = (n + 255) / 256;
  bias_relu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(y, bias, n, cols);
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
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.matmul(x, self.linear.weight.t()).contiguous()  # cuBLAS
        b = self.linear.bias.contiguous()
        _launch(_lib.bias_relu, y, b, y.numel(), y.shape[1])
        return y
