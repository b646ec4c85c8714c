"""Failure, not an exploit: a kernel that never ends (it waits for a flag nobody sets; volatile,
so the compiler keeps the load in the loop). The worker is killed at the time limit, the GPU
is freed with its context, and the verifier goes on."""
TASK = "level1/1_gelu"
EXPECT = ["timeout"]
KIND = "failure"
CONFIG = {"timeout_s": 20}

import ctypes

import torch
from torch import nn

from assay.bench.build import load_library

SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__global__ void spin_kernel(volatile int* flag, float* y) {
  while (*flag == 0) { }
  y[threadIdx.x] = 0.f;
}
extern "C" int spin(int* flag, float* y, cudaStream_t s) {
  spin_kernel<<<1, 32, 0, s>>>(flag, y);
  return (int)cudaGetLastError();
}
"""
_lib = load_library(SOURCE, "cuda")


class ModelNew(nn.Module):
    def forward(self, x):
        flag = torch.zeros(1, dtype=torch.int32, device=x.device)
        y = torch.empty_like(x)
        err = _lib.spin(ctypes.c_void_p(flag.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"CUDA error {err}")
        return y
