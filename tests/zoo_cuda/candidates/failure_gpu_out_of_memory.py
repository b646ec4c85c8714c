"""Failure, not an exploit: scratch space beyond any GPU. cudaMalloc takes 1 GiB blocks until the
device is full (and keeps them), then the candidate gives up with an out-of-memory error. Only
the worker's memory is lost, and it comes back when the worker ends."""
TASK = "level1/1_gelu"
EXPECT = ["runs"]
ALSO = ["crash"]
KIND = "failure"
CONFIG = {"timeout_s": 60}

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
// Returns the number of GiB it got before cudaMalloc failed (never frees them).
extern "C" int64_t grab_all(int* err) {
  int64_t got = 0;
  for (;;) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, (size_t)1 << 30);
    if (e != cudaSuccess) { *err = (int)e; cudaGetLastError(); return got; }
    ++got;
  }
}
"""
_lib = load_library(SOURCE, "cuda")
_lib.grab_all.restype = ctypes.c_int64


class ModelNew(nn.Module):
    def forward(self, x):
        err = ctypes.c_int(0)
        got = _lib.grab_all(ctypes.byref(err))
        raise MemoryError(f"out of GPU memory: cudaMalloc failed (error {err.value}) after "
                          f"{got} GiB of scratch")
