"""Failure, not an exploit: a kernel that never terminates; the worker must be killed at the
time limit and the verifier must go on."""
TASK = "level1/1_gelu"
EXPECT = ["timeout"]
KIND = "failure"
CONFIG = {"timeout_s": 12}

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
extern "C" void spin(float* y, int64_t n) { volatile int64_t i = 0; for (;;) { i = i + 1; } }
"""
_lib = load_library(SOURCE, "cpp")


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _lib.spin(ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(y.numel()))
        return y
