"""Honest: each row summed sequentially in fp32 (16384 terms). torch's pairwise sum is ~20x more
accurate; the verifier must still accept this (long-reduction tolerance)."""
TASK = "level1/2_row_sum"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
extern "C" void row_sum(const float* x, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    float s = 0.f;
    for (int64_t c = 0; c < cols; ++c) s += x[r * cols + c];
    y[r] = s;
  }
}
"""
_lib = load_library(SOURCE, "cpp", flags=("-fno-fast-math",))


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], dtype=x.dtype)
        _lib.row_sum(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                     ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]))
        return y
