"""Honest: LayerNorm with the variance from one pass (sum and sum of squares in fp32, summed in
blocks of 32 as GPU threads do), the common fast form. It loses the square of any common level
of the data: the opt-in ``offset`` input set rejects it, and every default set must accept it
(the off-grid ``large`` set included: moving data off bf16's grid changes no level)."""
TASK = "level1/7_layernorm"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" void layernorm(const float* x, const float* w, const float* b, float* y,
                          int64_t rows, int64_t n, float eps) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float sum = 0.f, sq = 0.f;
    for (int64_t j0 = 0; j0 < n; j0 += 32) {  // one block of 32 lanes, then across blocks
      float bs = 0.f, bq = 0.f;
      for (int64_t j = j0; j < j0 + 32 && j < n; ++j) { bs += xr[j]; bq += xr[j] * xr[j]; }
      sum += bs; sq += bq;
    }
    float mean = sum / (float)n;
    float var = sq / (float)n - mean * mean;
    float inv = 1.0f / std::sqrt(var + eps);
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = (xr[j] - mean) * inv * w[j] + b[j];
  }
}
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.shape[-1]
        _lib.layernorm(ctypes.c_void_p(x.data_ptr()),
                       ctypes.c_void_p(self.norm.weight.data_ptr()),
                       ctypes.c_void_p(self.norm.bias.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                       ctypes.c_int64(x.numel() // n), ctypes.c_int64(n),
                       ctypes.c_float(self.norm.eps))
        return y
