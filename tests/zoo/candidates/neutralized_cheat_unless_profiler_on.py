"""Neutralized exploit (issue 19): ask torch whether a profiler is running and run the
candidate's own kernel only then; otherwise the library's GELU (correct, so only an audit can
tell). Against an audit of one profiled call after unobserved timed calls, every timed call was
the library's and the archive recorded a custom kernel. Here the profiler runs over every call
from before the candidate loads, so it always sees one running: it runs its own kernel on every
call, and that is what is timed (accepted, with its real time; the test checks no aten::gelu
ran while timed). Same file in tests/zoo_cuda/ (a link)."""
TASK = "level1/1_gelu"
EXPECT = []
KIND = "neutralized"

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from assay.bench.build import load_library

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" int gelu(const float* x, float* y, int64_t n) {
  #pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
  return 0;
}
"""
CUDA_SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}
extern "C" int gelu(const float* x, float* y, int64_t n, cudaStream_t s) {
  int64_t blocks = (n + 255) / 256;
  gelu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(x, y, n);
  return (int)cudaGetLastError();
}
"""
_LIBS = {}


def own_gelu(x):
    """The candidate's own kernel (C++ on cpu, CUDA on cuda): what it shows an auditor."""
    lang = "cuda" if x.is_cuda else "cpp"
    if lang not in _LIBS:
        _LIBS[lang] = load_library(CUDA_SOURCE if x.is_cuda else CPP_SOURCE, lang)
    x = x.contiguous()
    y = torch.empty_like(x)
    args = [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(x.numel())]
    if x.is_cuda:
        args.append(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if _LIBS[lang].gelu(*args):
        raise RuntimeError("kernel error")
    return y


def observed():
    """Python's profiler flag or the C++ profiler state, whichever says yes."""
    from torch.autograd import profiler

    for check in (lambda: profiler._is_profiler_enabled, torch.autograd._profiler_enabled):
        try:
            if check():
                return True
        except Exception:  # noqa: BLE001
            pass
    return False


class ModelNew(nn.Module):
    def forward(self, x):
        return own_gelu(x) if observed() else F.gelu(x)
