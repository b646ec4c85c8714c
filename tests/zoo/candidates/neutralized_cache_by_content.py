"""Neutralized exploit: memoize on the input's exact content (a hash of its bytes). Against a
harness that times the same few buffers over and over, every timed call is a cache hit. Here
every timed call gets data no call has seen (inputs rescaled by a fresh random factor before
each unverified call, independent sets for verified ones), so the cache never hits while timed:
the candidate is correct and its time is its real compute time (the 50 ms sleep stands in for
an expensive kernel; test_content_cache_never_hits_while_timed checks the median)."""
TASK = "level1/1_gelu"
EXPECT = []
KIND = "neutralized"

import ctypes
import hashlib
import time

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
_memo = {}


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        key = hashlib.blake2b(x.numpy().tobytes(), digest_size=16).digest()
        if key in _memo:
            return _memo[key].clone()
        y = torch.empty_like(x)
        _lib.gelu(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                  ctypes.c_int64(x.numel()))
        time.sleep(0.05)  # an expensive kernel
        _memo[key] = y.clone()
        return y
