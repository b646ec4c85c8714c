"""A CUDA kernel of a generated candidate run on the host, for the index arithmetic and the
barriers of a template where no GPU is (CI): one OS thread per CUDA thread of a block, so
``__syncthreads`` is a real barrier and a read that no barrier orders after its write races as
it would on a GPU; blocks one after another, ``__shared__`` arrays static (one block at a
time; dynamic shared memory too, :func:`static_dynamic_shared`). Not a GPU: no warps, no
memory model beyond the barriers, no timing. The stride phases of the transposed convolution
(gemm_conv.py's knob ``phases``) were checked this way in both forms of the implicit GEMM before
any GPU ran them, and the check found a race in the first: a phase with no tap had no barrier
between its pixel table's writes and the epilogue's reads.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

HEADER = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <math.h>
#include <stdint.h>
#include <thread>
#include <vector>
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
static std::barrier<>* assay_emul_barrier = nullptr;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(x)
inline void __syncthreads() { assay_emul_barrier->arrive_and_wait(); }
template <class T> inline T __ldg(const T* p) { return *p; }
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct int4 { int x, y, z, w; };
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
// kernel() once per thread of every block of grid, nt threads a block
template <class F> void assay_emul_launch(dim3 grid, unsigned nt, F kernel) {
  gridDim = grid;
  blockDim = dim3(nt);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> bar(nt);
        assay_emul_barrier = &bar;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < nt; ++t)
          threads.emplace_back([=] { blockIdx = dim3(x, y, z); threadIdx = dim3(t); kernel(); });
        for (auto& th : threads) th.join();
      }
}
"""


def device_code(source: str, first: str, end: str) -> str:
    """The candidate SOURCE's scalar helpers (from its ASSAY_FN definition to its first
    template) and its text from ``first`` up to ``end``: the device code an emulation needs,
    without the host code that calls the CUDA runtime."""
    helpers = source[source.index("#define ASSAY_FN"):source.index("template <int VEC>")]
    return helpers + source[source.index(first):source.index(end)]


def static_dynamic_shared(code: str, name: str, suffix: str, elements: int = 1 << 16) -> str:
    """``code`` with its dynamic shared memory (``extern __shared__ T name[]``) a static array
    of ``elements`` (blocks run one at a time here), renamed ``name + suffix`` so that two
    kernels of one program keep theirs apart."""
    code = code.replace(name, name + suffix)
    return re.sub(rf"extern __shared__ (\w+) {name + suffix}\[\];",
                  rf"static \1 {name + suffix}[{elements}];", code)


def launch_bounds(source: str, kernel: str) -> int:
    """The threads a block of ``kernel`` runs (its ``__launch_bounds__``)."""
    return int(re.search(rf"__launch_bounds__\((\d+)\)\s*\n{kernel}\(", source).group(1))


def build(code: str, path: Path) -> Path:
    """``code`` (after HEADER) compiled by g++ into an executable at ``path``."""
    src = path.with_suffix(".cpp")
    src.write_text(HEADER + code)
    r = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", "-o", str(path),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return path
