"""The permute family: a strided view made contiguous, a kernel of its own (ir.Permute:
``x.permute(...)``/``transpose``, basic indexing such as ``out[:, -1, :]``, sliding windows
``x.unfold(dim, size, step)`` and chains of those; a ShuffleNet's channel shuffle, an RNN's last
step, ViT's patches). The candidate makes the view (metadata only); the entry point
gets its first element's address, sizes and strides (padded to PERMUTE_MAX_DIMS), drops dims of
size 1 and merges dims that stay adjacent, so a channel shuffle of [N, G, C/G, H, W] is rows
of H * W floats to copy. Where the last merged dim is contiguous in the source, rows are copied (CUDA:
rows on the grid's y, vectors of ``vec`` floats on x; C++: a memcpy per row); otherwise each
output element gathers its source element.
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import (STREAMING_DEFAULTS, STREAMING_SAFE,
                                                   Entry, Space, standalone_family)
from assay.propose.offline.families.shared import (CPP_PREAMBLE, Param, forward_call,
                                                   own_kernel_source, pointer, stream_args)
from assay.propose.offline.ir import PERMUTE_MAX_DIMS, Permute

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP's default over rows, 1 = serial
    ("cpu", "permute"): {"threads": (0, 1)},
    # block: threads per block; vec: floats per load and store in the row form (where rows,
    # their source offsets and both pointers allow it)
    ("cuda", "permute"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4)},
}

# The geometry, shared by both targets: collapse the dims, then rows if the last is contiguous.
GEOMETRY = r"""
constexpr int assay_pdims = {{ nd }};  // dims of the geometry
struct AssayGeo {
  int nd;  // dims after collapsing, at least 1
  int64_t size[assay_pdims];
  int64_t stride[assay_pdims];
};

// Size-1 dims dropped, neighbours merged where the source keeps them adjacent.
static inline AssayGeo assay_collapse(const int64_t* size, const int64_t* stride) {
  AssayGeo g;
  g.nd = 0;
  for (int j = 0; j < assay_pdims; ++j) {
    if (size[j] == 1) continue;
    if (g.nd > 0 && g.stride[g.nd - 1] == stride[j] * size[j]) {
      g.size[g.nd - 1] *= size[j];
      g.stride[g.nd - 1] = stride[j];
    } else {
      g.size[g.nd] = size[j];
      g.stride[g.nd] = stride[j];
      ++g.nd;
    }
  }
  if (g.nd == 0) {
    g.nd = 1;
    g.size[0] = 1;
    g.stride[0] = 1;
  }
  return g;
}
"""

CPP_PERMUTE = CPP_PREAMBLE + r"""
#include <string.h>
""" + GEOMETRY + r"""
extern "C" int assay_permute({{ params }}) {
  const int64_t size[assay_pdims] = { {{ sizes }} };
  const int64_t stride[assay_pdims] = { {{ strides }} };
  const AssayGeo g = assay_collapse(size, stride);
  int64_t n = 1;
  for (int j = 0; j < g.nd; ++j) n *= g.size[j];
  if (n <= 0) return 0;
  const bool rows_form = g.stride[g.nd - 1] == 1;
  const int64_t inner = rows_form ? g.size[g.nd - 1] : 1;
  const int64_t rows = n / inner;
  const int last = rows_form ? g.nd - 1 : g.nd;  // dims that index the rows
{% if parallel %}
  #pragma omp parallel for schedule(static) if(rows > 1 && n > (1 << 16))
{% endif %}
  for (int64_t r = 0; r < rows; ++r) {
    int64_t q = r, off = 0;
    for (int j = last - 1; j >= 0; --j) {
      off += (q % g.size[j]) * g.stride[j];
      q /= g.size[j];
    }
    if (rows_form) {
      memcpy(dst + r * inner, src + off, (size_t)inner * sizeof(float));
    } else {
      dst[r] = src[off];
    }
  }
  return 0;
}
"""

CUDA_PERMUTE = GEOMETRY + r"""
// Rows whose source is contiguous: one source offset per row (divisions per row, not per
// element), the row's vectors on x. Sizes in units of VEC floats.
template <int VEC>
__global__ void __launch_bounds__({{ block }})
assay_permute_rows(const float* __restrict__ src, float* __restrict__ dst, AssayGeo g,
                   int64_t rows, int64_t inner) {
  const int64_t stride = (int64_t)gridDim.x * {{ block }};
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    int64_t q = r, off = 0;
    for (int j = g.nd - 2; j >= 0; --j) {
      off += (q % g.size[j]) * g.stride[j];
      q /= g.size[j];
    }
    const float* s = src + off;
    float* d = dst + r * inner * VEC;
    for (int64_t j = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; j < inner; j += stride) {
      float v[VEC];
      assay_load<VEC>(s, j * VEC, v);
      assay_store_out<VEC>(d, j * VEC, v);
    }
  }
}

// The last dim moves: each output element gathers its source element.
__global__ void __launch_bounds__({{ block }})
assay_permute_elems(const float* __restrict__ src, float* __restrict__ dst, AssayGeo g,
                    int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * {{ block }}) {
    int64_t q = i, off = 0;
    for (int j = g.nd - 1; j >= 0; --j) {
      off += (q % g.size[j]) * g.stride[j];
      q /= g.size[j];
    }
    dst[i] = src[off];
  }
}

extern "C" int assay_permute({{ params }}, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t size[assay_pdims] = { {{ sizes }} };
  const int64_t stride[assay_pdims] = { {{ strides }} };
  AssayGeo g = assay_collapse(size, stride);
  int64_t n = 1;
  for (int j = 0; j < g.nd; ++j) n *= g.size[j];
  if (n <= 0) return 0;
  if (g.stride[g.nd - 1] != 1) {
    int64_t blocks = (n + {{ block }} - 1) / {{ block }};
    const int64_t cap = (int64_t)assay_sm_count() * {{ 2048 // block * 4 }};
    if (blocks > cap) blocks = cap;
    assay_permute_elems<<<(unsigned)blocks, {{ block }}, 0, stream>>>(src, dst, g, n);
    return (int)cudaGetLastError();
  }
  const int64_t inner = g.size[g.nd - 1];
  const int64_t rows = n / inner;
  const int64_t v = {{ vec }};
  bool vec = v > 1 && inner % v == 0 && assay_aligned(src, 4 * v) && assay_aligned(dst, 4 * v);
  for (int j = 0; vec && j < g.nd - 1; ++j) vec = g.stride[j] % v == 0;
  const int64_t w = vec ? v : 1;
  int64_t bx = (inner / w + {{ block }} - 1) / {{ block }};
  if (bx > 2147483647) bx = 2147483647;
  const dim3 grid((unsigned)bx, (unsigned)(rows < 65535 ? rows : 65535));
  if (vec) {
    assay_permute_rows<{{ vec }}><<<grid, {{ block }}, 0, stream>>>(src, dst, g, rows, inner / w);
  } else {
    assay_permute_rows<1><<<grid, {{ block }}, 0, stream>>>(src, dst, g, rows, inner);
  }
  return (int)cudaGetLastError();
}
"""


def _geometry_names() -> tuple[list[str], list[str]]:
    return ([f"size{j}" for j in range(PERMUTE_MAX_DIMS)],
            [f"stride{j}" for j in range(PERMUTE_MAX_DIMS)])


def _params(plan: Permute, target: str) -> list[Param]:
    """The view's first element, the output, then the view's sizes and strides (the output's
    dims, in order), leading dims padded with size 1."""
    pad = PERMUTE_MAX_DIMS - plan.ndim
    sizes, strides = _geometry_names()
    size_py = ["1"] * pad + [f"v.shape[{j}]" for j in range(plan.ndim)]
    stride_py = ["0"] * pad + [f"v.stride({j})" for j in range(plan.ndim)]
    geo = [Param("int64_t", name, py, "ctypes.c_int64")
           for name, py in zip(sizes + strides, size_py + stride_py)]
    return ([pointer(target, "src", "v.data_ptr()"),
             pointer(target, "dst", "out.data_ptr()", const=False)] + geo)


def source(plan: Permute, target: str, knobs: dict[str, Any], summary: str,
           label: str = "permute") -> str:
    sizes, strides = _geometry_names()
    return own_kernel_source(CPP_PERMUTE, CUDA_PERMUTE, target, knobs, summary, label,
                             _params(plan, target), sizes=", ".join(sizes),
                             strides=", ".join(strides), nd=PERMUTE_MAX_DIMS)


def forward(plan: Permute, target: str, knobs: dict[str, Any]
            ) -> tuple[list[str], list[Entry]]:
    """ModelNew.forward's body: the source checked, the output allocated in the permuted
    shape, one ``assay_permute`` call."""
    calls, entries = forward_call(_params(plan, target), stream_args(target, "out"),
                                  "assay_permute")
    view = f"src{plan.view}"
    lines = [
        f"src = _tensor({plan.src}, {plan.src!r}, strided=True)",  # its strides are read
        # the view is metadata (its first element's address, sizes and strides): the kernel
        # copies it
        f"v = {view}",
        f"_expect(v.dim() == {plan.ndim}, '{plan.src}{plan.view} does not have {plan.ndim} "
        f"dims')",
        "out = torch.empty(v.shape, dtype=DTYPE, device=src.device)",
        "if out.numel():",
        *(f"    {line}" for line in calls),
        "return out",
    ]
    return lines, entries


FAMILY = standalone_family(
    "permute", Permute, KNOB_SPACES,
    defaults=STREAMING_DEFAULTS, safe=STREAMING_SAFE,
    strategy="vectorize", source=source, forward=forward)  # one op that streams memory
