"""Honest: mean squared error as one fp32 reduction over 131072 terms (OpenMP partial sums)."""
TASK = "level1/5_mse_loss"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
extern "C" void mse(const float* p, const float* t, float* out, int64_t n) {
  float s = 0.f;
  #pragma omp parallel for reduction(+:s)
  for (int64_t i = 0; i < n; ++i) { float d = p[i] - t[i]; s += d * d; }
  out[0] = s / (float)n;
}
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        out = torch.empty((), dtype=p.dtype)
        _lib.mse(ctypes.c_void_p(p.data_ptr()), ctypes.c_void_p(t.data_ptr()),
                 ctypes.c_void_p(out.data_ptr()), ctypes.c_int64(p.numel()))
        return out
