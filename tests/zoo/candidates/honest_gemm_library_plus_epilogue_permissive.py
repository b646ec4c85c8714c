"""Honest under the permissive policy: the GEMM from the library (torch.mm, i.e. BLAS; cuBLAS on
cuda) and a custom fused bias+ReLU epilogue kernel; library_time_frac reports the BLAS share."""
TASK = "level2/1_gemm_bias_relu"
EXPECT = []
POLICY = "permissive"

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
extern "C" void bias_relu_inplace(float* y, const float* bias, int64_t B, int64_t O) {
  #pragma omp parallel for
  for (int64_t b = 0; b < B; ++b)
    for (int64_t o = 0; o < O; ++o) {
      float v = y[b * O + o] + bias[o];
      y[b * O + o] = v > 0.f ? v : 0.f;
    }
}
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = torch.mm(x, self.linear.weight.t()).contiguous()
        b = self.linear.bias.contiguous()
        _lib.bias_relu_inplace(ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                               ctypes.c_int64(y.shape[0]), ctypes.c_int64(y.shape[1]))
        return y
