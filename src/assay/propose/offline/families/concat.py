"""The concat family: ``torch.cat`` as a kernel of its own (ir.Concat), the join of branches
in a multi-kernel plan (an Inception module's four, a DenseNet block's growing list). The output
is seen as ``[outer, C, inner]`` with C the joined dim; each part ``[outer, c_i, inner]`` is
copied into its slice ``[:, offset_i:offset_i + c_i, :]`` by one launch of the entry point
``assay_cat_part``; a part of zeros (``own_kernels.zero_padded_cat``: ``F.pad``, a
``torch.zeros_like`` joined) is written by the same launch with no source (a null ``src``).
C++: a memcpy (a memset) per outer row (OpenMP over rows); CUDA: outer rows on the
grid's y (strided past 65535), each row's vectors of VEC floats on x, no index division.
"""

from __future__ import annotations

from typing import Any

from assay.propose.offline.families.family import (STREAMING_DEFAULTS, STREAMING_SAFE,
                                                   Entry, Space, standalone_family)
from assay.propose.offline.families.shared import (CPP_PREAMBLE, Param, forward_call,
                                                   own_kernel_source, pointer, size_params,
                                                   stream_args)
from assay.propose.offline.ir import Concat

KNOB_SPACES: dict[tuple[str, str], Space] = {
    # threads: 0 = OpenMP's default over the outer rows, 1 = serial
    ("cpu", "concat"): {"threads": (0, 1)},
    # block: threads per block; vec: floats per load and store (used where the part's row,
    # the output's row and the offset are multiples of it and both pointers aligned)
    ("cuda", "concat"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4)},
}

CPP_CONCAT = CPP_PREAMBLE + r"""
#include <string.h>

// One part of the join: outer rows of ``part`` floats from src (zeros where src is null),
// each to dst + o * row + offset.
extern "C" int assay_cat_part({{ params }}) {
  if (outer <= 0 || part <= 0) return 0;
{% if parallel %}
  #pragma omp parallel for schedule(static) if(outer > 1 && outer * part > (1 << 16))
{% endif %}
  for (int64_t o = 0; o < outer; ++o) {
    if (src) {
      memcpy(dst + o * row + offset, src + o * part, (size_t)part * sizeof(float));
    } else {
      memset(dst + o * row + offset, 0, (size_t)part * sizeof(float));
    }
  }
  return 0;
}
"""

CUDA_CONCAT = r"""
// Sizes in units of VEC floats. Rows on y (grid-strided: gridDim.y is at most 65535), a row's
// vectors on x: no division per element.
template <int VEC>
__global__ void __launch_bounds__({{ block }})
assay_cat_part_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t outer,
                      int64_t part, int64_t row, int64_t offset) {
  const int64_t stride = (int64_t)gridDim.x * {{ block }};
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const float* s = src ? src + o * part * VEC : src;
    float* d = dst + (o * row + offset) * VEC;
    for (int64_t j = (int64_t)blockIdx.x * {{ block }} + threadIdx.x; j < part; j += stride) {
      float v[VEC];
      if (src) {
        assay_load<VEC>(s, j * VEC, v);
      } else {  // a part of zeros
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = 0.0f;
      }
      assay_store_out<VEC>(d, j * VEC, v);
    }
  }
}

extern "C" int assay_cat_part({{ params }}, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (outer <= 0 || part <= 0) return 0;
  const int64_t v = {{ vec }};
  const bool vec = v > 1 && part % v == 0 && row % v == 0 && offset % v == 0
                   && assay_aligned(src, 4 * v) && assay_aligned(dst, 4 * v);
  const int64_t w = vec ? v : 1;
  int64_t bx = (part / w + {{ block }} - 1) / {{ block }};
  if (bx > 2147483647) bx = 2147483647;
  const int64_t by = outer < 65535 ? outer : 65535;
  const dim3 grid((unsigned)bx, (unsigned)by);
  if (vec) {
    assay_cat_part_kernel<{{ vec }}><<<grid, {{ block }}, 0, stream>>>(
        src, dst, outer, part / w, row / w, offset / w);
  } else {
    assay_cat_part_kernel<1><<<grid, {{ block }}, 0, stream>>>(src, dst, outer, part, row,
                                                               offset);
  }
  return (int)cudaGetLastError();
}
"""


def _params(target: str) -> list[Param]:
    """``assay_cat_part``'s parameters, their Python values those of forward's loop."""
    return ([pointer(target, "src", "src"),
             pointer(target, "dst", "out.data_ptr()", const=False)]
            + size_params("outer", "part", "row", "offset"))


def source(plan: Concat, target: str, knobs: dict[str, Any], summary: str,
           label: str = "concat") -> str:
    return own_kernel_source(CPP_CONCAT, CUDA_CONCAT, target, knobs, summary, label,
                             _params(target))


def forward(plan: Concat, target: str, knobs: dict[str, Any]
            ) -> tuple[list[str], list[Entry]]:
    """ModelNew.forward's body: the parts checked against each other, the output allocated,
    one ``assay_cat_part`` call per part."""
    d, nd = plan.dim, plan.ndim
    # a part of zeros is its int count of slices
    parts = ", ".join(str(name) if isinstance(name, int) else f"_tensor({name}, {name!r})"
                      for name in plan.parts)
    calls, entries = forward_call(_params(target), stream_args(target, "out"), "assay_cat_part")
    lines = [
        f"parts = ({parts},)",
        "tensors = [p for p in parts if not isinstance(p, int)]",
        "ref = tensors[0]",
        f"_expect(all(p.dim() == {nd} for p in tensors), 'the joined tensors do not have {nd} "
        f"dims')",
        f"_expect(all(p.shape[:{d}] == ref.shape[:{d}] and p.shape[{d + 1}:] == "
        f"ref.shape[{d + 1}:] for p in tensors), 'the joined tensors differ outside dim {d}')",
        f"shape = tuple(ref.shape[:{d}]) + (sum(p if isinstance(p, int) else p.shape[{d}] "
        f"for p in parts),) + tuple(ref.shape[{d + 1}:])",
        "out = torch.empty(shape, dtype=DTYPE, device=ref.device)",
        f"outer = math.prod(shape[:{d}])",
        f"inner = math.prod(shape[{d + 1}:])",
        f"row = shape[{d}] * inner",
        "offset = 0",
        "for p in parts:",
        f"    part = (p if isinstance(p, int) else p.shape[{d}]) * inner",
        "    src = 0 if isinstance(p, int) else p.data_ptr()",
        "    if outer and part:",
        *(f"        {line}" for line in calls),
        "    offset += part",
        "return out",
    ]
    return lines, entries


FAMILY = standalone_family(
    "concat", Concat, KNOB_SPACES,
    defaults=STREAMING_DEFAULTS, safe=STREAMING_SAFE,
    strategy="vectorize", source=source, forward=forward)  # one op that streams memory
