"""Failure, not an exploit: a kernel that writes through a null pointer (SIGSEGV)."""
TASK = "level1/1_gelu"
EXPECT = ["crash"]
KIND = "failure"

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
extern "C" void boom(float* y, int64_t n) { volatile float* p = nullptr; for (int64_t i = 0; i < n; ++i) p[i] = y[i]; }
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.boom(ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(y.numel()))
        return y
