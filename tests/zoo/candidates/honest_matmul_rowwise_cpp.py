"""Honest: untiled i-k-j matrix product, each output row accumulated in a local buffer."""
TASK = "level1/4_matmul"
EXPECT = []

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <vector>
extern "C" void matmul_rows(const float* a, const float* b, float* c, int64_t M, int64_t K, int64_t N) {
  #pragma omp parallel for
  for (int64_t i = 0; i < M; ++i) {
    std::vector<float> acc(N, 0.f);
    for (int64_t k = 0; k < K; ++k) {
      float av = a[i * K + k];
      const float* br = b + k * N;
      for (int64_t j = 0; j < N; ++j) acc[j] += av * br[j];
    }
    for (int64_t j = 0; j < N; ++j) c[i * N + j] = acc[j];
  }
}
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
        _lib.matmul_rows(ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                         ctypes.c_void_p(c.data_ptr()), ctypes.c_int64(a.shape[0]),
                         ctypes.c_int64(a.shape[1]), ctypes.c_int64(b.shape[1]))
        return c
