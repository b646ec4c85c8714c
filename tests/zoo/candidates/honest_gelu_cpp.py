"""Honest: exact-erf GELU as an OpenMP C++ loop."""
TASK = "level1/1_gelu"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" void gelu(const float* x, float* y, int64_t n) {
  #pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        _lib.gelu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                  ctypes.c_int64(x.numel()))
        return y
