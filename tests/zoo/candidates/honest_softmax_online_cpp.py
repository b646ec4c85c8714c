"""Honest: online softmax (running max and rescaled sum in one pass, then a write pass)."""
TASK = "level1/3_softmax"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" void online_softmax(const float* x, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY, s = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      float v = xr[c];
      if (v > m) { s = s * expf(m - v) + 1.f; m = v; } else { s += expf(v - m); }
    }
    float inv = 1.f / s;
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = expf(xr[c] - m) * inv;
  }
}
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.online_softmax(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                            ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]))
        return y
