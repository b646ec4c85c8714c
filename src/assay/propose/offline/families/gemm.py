"""The gemm family: one matrix product (torch.matmul/mm/bmm, F.linear/nn.Linear) or convolution
(1-, 2- or 3-D, transposed or not: F.conv*d/nn.Conv*d, F.conv_transpose*d/nn.ConvTranspose*d)
of inputs and parameters, followed by any chain of the elementwise and row
families (bias, activation, scaling, residual, softmax, norms, sums): the epilogue.

Templates, told apart by the knob ``lib``: 0 = a tiled GEMM of this package, fp32
register-blocked SIMT (``gemm``; C++ on the cpu target) or WMMA tensor cores for
float16/bfloat16 (``gemm_tc``); 2 = a convolution of this package (``conv``: an implicit GEMM
on cuda, a direct convolution in C++ on the cpu target; float32); both with an elementwise
epilogue fused into their stores or followed by the row kernel (strict policy); 1 = the
library's GEMM or convolution followed by one fused epilogue kernel (``epilogue``; the
candidate says ``POLICY = "permissive"``: the strict kernel audit refuses it, as it should; not
offered where nothing but the op's own bias follows it). A product's own template comes first
(0 or 2), then the library's. float16/bfloat16 products have only the tensor-core GEMM. No
TF32: the bundled tasks are float32 and the verifier's precision check would refuse it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from assay.propose.offline.families import elementwise, gemm_conv, gemm_tc, gemm_tiled, row
from assay.propose.offline.families import triton_form as tri
from assay.propose.offline.families.family import Entry, Family, Head, Space
from assay.propose.offline.families.shared import (CPP_PREAMBLE, CUDA_COMMON, Param, fused_calls,
                                                   fused_epilogue, head_values, leaf_params,
                                                   leaf_tensor, out_param, pointer, render,
                                                   size_params)
from assay.propose.offline.ir import CONV_OPS, PREFIX, Analysis, Gemm, Plan, conv_args

# The templates of this package's own (knob lib 0: the product's GEMM; 2: the convolution), by
# name (each module holds its knob space, defaults, C++/CUDA template and kernel writer).
_OWN: dict[str, ModuleType] = {"gemm": gemm_tiled, "gemm_tc": gemm_tc, "conv": gemm_conv}

KNOB_SPACES: dict[tuple[str, str], Space] = {
    **gemm_tiled.KNOB_SPACES, **gemm_tc.KNOB_SPACES, **gemm_conv.KNOB_SPACES,
    # Triton (target triton): the output tile (block_m x block_n) of one program, the K slab
    # per tl.dot (block_k), warps per program, software-pipelining depth of the K loop.
    ("triton", "gemm"): tri.GEMM_KNOB_SPACE, ("triton", "gemm_tc"): tri.GEMM_KNOB_SPACE}


def _triton_defaults(plan: Plan) -> dict[str, int]:
    """Triton's matmul tutorial's shapes: 64 x 64 x 32 for IEEE float32 (no tensor cores),
    128 x 128 x 32 with 8 warps for float16/bfloat16; not yet measured here."""
    if plan.dtype == "float32":
        return {"block_m": 64, "block_n": 64, "block_k": 32, "num_warps": 4, "num_stages": 3}
    return {"block_m": 128, "block_n": 128, "block_k": 32, "num_warps": 8, "num_stages": 3}

# ----------------------------------------------------------------------------------------------
# Template epilogue: the library's product, then the elementwise or row family's kernel

# The library convolution's result in channels_last (knob layout), [N][H*W][C] in memory, made
# NCHW for the epilogue kernel through 32 x 32 tiles in shared memory, reads along C and writes
# along H*W both coalesced: torch's generic permute copy ran at ~0.9 TB/s on an H200 (0.156 ms
# for L2_5's 67 MB convolution result).
CUDA_TO_NCHW = r"""
__global__ void __launch_bounds__(256) assay_to_nchw_tiles(const float* __restrict__ src,
    float* __restrict__ dst, int64_t C, int64_t HW) {
  __shared__ float tile[32][33];  // +1: the transposed reads hit 32 different banks
  const int64_t n = blockIdx.z, c0 = (int64_t)blockIdx.y * 32, p0 = (int64_t)blockIdx.x * 32;
  const float* __restrict__ s = src + n * HW * C;
  float* __restrict__ d = dst + n * C * HW;
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int64_t p = p0 + j, c = c0 + threadIdx.x;
    if (p < HW && c < C) tile[j][threadIdx.x] = __ldg(s + p * C + c);
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += 8) {
    const int64_t c = c0 + j, p = p0 + threadIdx.x;
    if (p < HW && c < C) d[c * HW + p] = tile[threadIdx.x][j];
  }
}

extern "C" int assay_to_nchw(const float* src, float* dst, int64_t N, int64_t C, int64_t HW,
                             void* stream_ptr) {
  if (N <= 0 || C <= 0 || HW <= 0) return 0;
  const int64_t gx = (HW + 31) / 32, gy = (C + 31) / 32;
  if (gx > 2147483647 || gy > 65535 || N > 65535) return (int)cudaErrorInvalidConfiguration;
  assay_to_nchw_tiles<<<dim3((unsigned)gx, (unsigned)gy, (unsigned)N), dim3(32, 8), 0,
                        static_cast<cudaStream_t>(stream_ptr)>>>(src, dst, C, HW);
  return (int)cudaGetLastError();
}
"""


# ----------------------------------------------------------------------------------------------
# Which template, which knobs


def _chain(plan: Plan) -> ModuleType:
    """The family of what follows the product (its epilogue kernel, when there is one)."""
    return row if plan.kind == "row" else elementwise


def matches(plan: Plan) -> bool:
    return plan.gemm is not None


def libs(target: str, analysis: Analysis, policy: str = "any") -> tuple[int, ...]:
    """The values knob ``lib`` may take for this plan (empty: no template can write it)."""
    g = analysis.plan.gemm
    if g is None:
        return ()
    if target == "triton":  # its own GEMM only (a library product: no Triton form yet)
        return (0,) if g.matmul and not g.trans_a else ()
    # A transposed first operand: the fp32 tiled GEMM reads it (not the tensor-core one)
    custom = g.matmul and (analysis.plan.dtype == "float32"
                           or (target == "cuda" and not g.trans_a))
    conv = g.is_conv and analysis.plan.dtype == "float32"
    library = not g.trivial and analysis.plan.dtype == "float32" and policy != "strict"
    return tuple(v for v, ok in ((0, custom), (2, conv), (1, library)) if ok)


def declines(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    """Why no template can write this plan on ``target`` under ``policy``, or None."""
    g = analysis.plan.gemm
    if target == "triton" and g is not None:
        if not g.matmul:
            return f"{PREFIX} {g.what} in Triton yet (a convolution)"
        if g.trans_a:
            return f"{PREFIX} a transposed first operand in Triton yet (matmul)"
        if analysis.plan.groups:
            return f"{PREFIX} rows of channel groups (GroupNorm) in Triton yet"
        return tri.why_not(analysis.plan)
    if g is None or libs(target, analysis, policy):
        return None
    # never: a matmul always has lib 0, a (float32: graph's check) convolution lib 2
    return f"{PREFIX} this task ({g.what})"  # pragma: no cover


def _conv_layouts(target: str, analysis: Analysis) -> bool:
    """Whether knob ``layout`` applies: a library convolution on cuda, run on the tensors as
    given (0, NCHW) or converted to channels_last (1), whose cuDNN kernels differ. Measured on
    an H200 (2026-11-23, benchmarks/probe_gpu.py): 0.59 ms against 2.36 ms NCHW (an FFT
    algorithm) for L2_5's 64->128 channel conv, but 1.05 against 0.97 ms for L2_4's."""
    g = analysis.plan.gemm
    return target == "cuda" and g is not None and g.op == "conv2d"


def template(plan: Plan, knobs: dict[str, Any]) -> str:
    """``gemm`` (the tiled fp32 GEMM; a row epilogue follows as a second kernel), ``gemm_tc``
    (tensor cores, float16/bfloat16), ``conv`` (the convolution's own kernel, knob ``lib`` = 2)
    or ``epilogue`` (the library computes the product, one fused kernel the rest; ``lib`` =
    1)."""
    lib = int(knobs.get("lib", 0))
    if lib:
        return "epilogue" if lib == 1 else "conv"
    return "gemm" if plan.dtype == "float32" else "gemm_tc"


def strategy(plan: Plan, knobs: dict[str, Any]) -> str:
    """A product or convolution tiles (tiling), uses tensor cores (tensor_cores) or leaves the
    product to the library and fuses the rest (epilogue)."""
    return {"epilogue": "epilogue", "gemm_tc": "tensor_cores"}.get(template(plan, knobs),
                                                                    "tiling")


def space(target: str, analysis: Analysis, lib: int | None = None, policy: str = "any") -> Space:
    """The knob space of the template that ``lib`` selects (None: the plan's first)."""
    plan = analysis.plan
    values = libs(target, analysis, policy)
    if lib not in values:
        lib = values[0]
    out: Space = {"lib": values}
    if lib == 1:
        out.update(_chain(plan).space(target, analysis))
        if _conv_layouts(target, analysis):
            out["layout"] = (0, 1)
        return out
    out.update(KNOB_SPACES[(target, template(plan, {"lib": lib}))])
    if "phases" in out and not plan.gemm.op.startswith("conv_transpose"):
        out["phases"] = (0,)  # stride phases are a transposed convolution's: no variant here
    if target == "triton" and plan.gemm is not None and plan.gemm.b_rows:
        out.update(tri.LINEAR_KNOB_SPACE)
    if plan.kind == "row":  # the row kernel after the GEMM has its own knobs
        out.update(row.space(target, analysis))
    return out


def defaults(target: str, analysis: Analysis, lib: int | None = None,
             policy: str = "any") -> dict[str, int]:
    """Those of the template ``lib`` selects (None: the plan's first)."""
    plan = analysis.plan
    values = libs(target, analysis, policy)
    lib = lib if lib in values else values[0]
    if lib == 1:
        knobs = {"lib": 1, **_chain(plan).defaults(target, analysis)}
        if _conv_layouts(target, analysis):
            knobs["layout"] = 0
        return knobs
    knobs = {"lib": lib, **(_triton_defaults(plan) if target == "triton"
                            else _OWN[template(plan, {"lib": lib})].defaults(target))}
    if knobs.get("phases") == 0 and plan.gemm.op.startswith("conv_transpose"):
        # a transposed convolution by stride phase: 2.1-4.2x faster than every tap for every
        # pixel on KernelBench's stride-2 ones (docs/evidence/2026-12-07-h100-phases-ab.md)
        knobs["phases"] = 1
    if plan.kind == "row":
        knobs.update(row.defaults(target, analysis))
    return knobs


def safe(target: str, plan: Plan, knobs: dict[str, Any]) -> dict[str, int]:
    """The most conservative form of the template ``knobs`` selects: small tiles, no vector
    accesses, no pipelining, serial on the host; the epilogue kernel's own after a library
    call."""
    name = template(plan, knobs)
    if name == "epilogue":
        return _chain(plan).safe(target)
    out = ({"block_m": 32, "block_n": 32, "block_k": 16, "num_warps": 4, "num_stages": 1}
           if target == "triton" else _OWN[name].safe(target))
    if plan.kind == "row":
        out.update(row.safe(target))
    return out


# ----------------------------------------------------------------------------------------------
# The kernel file


def _gemm_params(plan: Plan, target: str, fused: bool, split: bool = False) -> list[Param]:
    """assay_gemm's (assay_conv's) parameters: operands, the epilogue's leaves (when fused), the
    output (the product itself, ``g``, when a row kernel follows), sizes and batch strides (the
    convolution's geometry, ``cg``), leaf geometry; ``split``: the split-K workspace and its
    number of parts (_splits)."""
    assert plan.gemm is not None
    elt = "float" if plan.dtype == "float32" else "assay_elt"
    conv = plan.gemm.is_conv
    ps = [pointer(target, name, f"l{op}.data_ptr()", elt)
          for name, op in zip(("x", "w") if conv else ("A", "B"), ("A", "B"))]
    ptrs, geometry = leaf_params(plan, target, plan.gemm_leaf, elt) if fused else ([], [])
    out = out_param(target, "out.data_ptr()" if fused else "g.data_ptr()", elt)
    sizes = ([Param("int64_t", v, f"cg[{j}]", "ctypes.c_int64")
              for j, v in enumerate(gemm_conv.SIZES)] if conv
             else size_params("M", "N", "K", "batch", "sA", "sB", "sC"))
    ws = [pointer(target, "ws", "ws.data_ptr() if ws is not None else 0", "float",
                  const=False), *size_params("parts")] if split else []
    return ps + ptrs + [out] + sizes + geometry + ws


def _splits(plan: Plan, target: str, knobs: dict[str, Any]) -> bool:
    """Whether the product is the tiled GEMM or the convolution that may split K
    (gemm_tiled.uses_split, gemm_conv.uses_split)."""
    name = template(plan, knobs)
    return ((name == "gemm" and gemm_tiled.uses_split(target, knobs))
            or (name == "conv" and gemm_conv.uses_split(target, knobs)))


def _product_source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The tiled GEMM (cpu, cuda fp32), tensor-core GEMM (cuda float16/bfloat16) or convolution
    with the elementwise epilogue fused into its stores, or storing the product for the row
    kernel that follows (whose source comes first in the file)."""
    assert plan.gemm is not None
    name = template(plan, knobs)
    fused = plan.kind == "elementwise"
    prologue, body, out_expr = (fused_epilogue(plan, name == "gemm_tc") if fused
                                else ([], [], "acc_v"))
    params = _gemm_params(plan, target, fused, _splits(plan, target, knobs))
    common = head_values(name, knobs, summary)
    if name == "conv":
        gemm = gemm_conv.kernel(dict(common, prologue=prologue, epi_body=body, epi_out=out_expr),
                                params, target, knobs, plan)
    else:
        kparams = ", ".join(f"{p.ctype} {p.name}" for p in params)
        values = dict(common, prologue=prologue, epi_body=body, epi_out=out_expr,
                      bm=int(knobs["tile_m"]), bn=int(knobs["tile_n"]),
                      bk=int(knobs["k_step"]), trans_b=plan.gemm.b_rows,
                      trans_a=plan.gemm.trans_a,
                      kparams=kparams, kargs=", ".join(p.name for p in params),
                      params=kparams if target == "cpu" else kparams + ", void* stream_ptr")
        gemm = _OWN[name].kernel(values, target, knobs, plan)
    if fused:
        return render(CPP_PREAMBLE if target == "cpu" else CUDA_COMMON, **common) + gemm
    return row.source(plan, target, knobs, summary, label=name) + gemm


def source(plan: Plan, target: str, knobs: dict[str, Any], summary: str) -> str:
    """The tiled or tensor-core GEMM or the convolution with its epilogue, or (template
    ``epilogue``) the epilogue kernel that follows the library call, and the channels_last
    transpose when it needs one."""
    if target == "triton":  # the product's own Triton GEMM (libs: no library form)
        fused = plan.kind == "elementwise"
        name = template(plan, knobs)
        gemm = tri.gemm_kernel(plan, knobs, summary, name, fused)
        return gemm if fused else row.source(plan, target, knobs, summary, label=name) + gemm
    if template(plan, knobs) != "epilogue":
        return _product_source(plan, target, knobs, summary)
    text = _chain(plan).source(plan, target, knobs, summary, label="epilogue")
    if _to_nchw(plan, target, int(knobs.get("layout", 0))):
        text += CUDA_TO_NCHW
    return text


# ----------------------------------------------------------------------------------------------
# ModelNew.forward

_LIBRARY = {"mm": "torch.mm", "linear": "torch.mm", "bmm": "torch.bmm",
            **{op: f"torch.nn.functional.{op}" for op in CONV_OPS}}


def library_of(plan: Plan, target: str) -> str:
    """What the library computes in the ``epilogue`` template, for the docstring."""
    assert plan.gemm is not None
    lib = ("cuDNN" if plan.gemm.is_conv else "cuBLAS") if target == "cuda" else "ATen"
    return f"the {plan.gemm.what} ({_LIBRARY[plan.gemm.op]}, {lib})"


def _gemm_lines(plan: Plan, target: str, template: str, layout: int = 0) -> list[str]:
    """The product's operands and sizes (lA, lB, M, N, K, batch, sA, sB, sC, gshape; a
    convolution's geometry ``cg`` in the conv template); in the epilogue template also the
    library call, whose result is leaf ``l<gemm_leaf>``.
    ``layout`` 1: the convolution runs on channels_last copies of its operands (its result,
    channels_last too, becomes contiguous NCHW again for the epilogue kernel: on cuda through
    the file's own transpose, assay_to_nchw)."""
    g = plan.gemm
    assert g is not None
    lines = [f"lA = {leaf_tensor(g.a)}", f"lB = {leaf_tensor(g.b)}"]
    gk = plan.gemm_leaf
    if g.is_conv:
        nd = CONV_OPS[g.op] + 2
        lines.append(f"_expect(lA.dim() == {nd} and lB.dim() == {nd}, "
                     f"'{g.op} operands do not have {nd} dims')")
        lines += _conv_args(g)
        if template == "conv":
            return lines + _conv_geometry(g)
        fn = f"torch.nn.functional.{g.op}"
        if layout:  # conv2d only (see _conv_layouts)
            lines.append("cl = torch.channels_last")
            call = (f"g = {fn}(lA.contiguous(memory_format=cl), "
                    "lB.contiguous(memory_format=cl), None, *cargs)")
        else:
            call = f"g = {fn}(lA, lB, None, *cargs)"
        if target == "cuda":
            lines += ["with _ieee_fp32():", f"    {call}"]
        else:
            lines.append(call)
        if _to_nchw(plan, target, layout):
            lines += ["if g.dtype == DTYPE and g.dim() == 4 and not g.is_contiguous() and "
                      "g.is_contiguous(memory_format=cl) and g.shape[0] <= 65535:",
                      f"    l{gk} = torch.empty(g.shape, dtype=DTYPE, device=g.device)",
                      f"    _check(_lib().assay_to_nchw(g.data_ptr(), l{gk}.data_ptr(), "
                      "g.shape[0], g.shape[1], g.shape[2] * g.shape[3], "
                      "torch.cuda.current_stream(g.device).cuda_stream))",
                      "else:",
                      f"    l{gk} = _tensor(g, 'the {g.op} result')"]
        else:
            lines.append(f"l{gk} = _tensor(g, 'the {g.op} result')")
        lines.append("gshape = tuple(g.shape)")
        return lines
    if g.trans_a and g.op in ("mm", "linear"):  # A given as A.T: [K, M], read column-wise
        k_of_b = "lB.shape[0]" if g.op == "mm" else "lB.shape[1]"
        lines += [f"_expect(lA.dim() == 2 and lB.dim() == 2 and lA.shape[0] == {k_of_b}, "
                  f"'matmul operand shapes')",
                  "K, N = lB.shape" if g.op == "mm" else "N, K = lB.shape",
                  "M = lA.shape[1]", "batch, sA, sB = 1, 0, 0", "gshape = (M, N)"]
        lib = f"torch.mm(lA.t(), {'lB' if g.op == 'mm' else 'lB.t()'})"
    elif g.op == "mm":
        lines += [f"_expect(lA.dim() == {g.a_ndim} and lB.dim() == 2 and lA.shape[-1] == "
                  f"lB.shape[0], 'matmul operand shapes')",
                  "K, N = lB.shape", "M = math.prod(lA.shape[:-1])", "batch, sA, sB = 1, 0, 0",
                  "gshape = tuple(lA.shape[:-1]) + (N,)"]
        lib = "torch.mm(lA.reshape(M, K), lB).view(gshape)"
    elif g.op == "linear":
        lines += [f"_expect(lA.dim() == {g.a_ndim} and lB.dim() == 2 and lA.shape[-1] == "
                  f"lB.shape[1], 'linear operand shapes')",
                  "N, K = lB.shape", "M = math.prod(lA.shape[:-1])", "batch, sA, sB = 1, 0, 0",
                  "gshape = tuple(lA.shape[:-1]) + (N,)"]
        lib = "torch.mm(lA.reshape(M, K), lB.t()).view(gshape)"
    else:  # bmm: a batch of products over the same leading dims (B [..., N, K]: trans_b)
        nd, (kb, nb) = g.a_ndim, ((-1, -2) if g.trans_b else (-2, -1))
        lines += [f"_expect(lA.dim() == {nd} and lB.dim() == {nd} and lA.shape[:-2] == "
                  f"lB.shape[:-2] and lA.shape[-1] == lB.shape[{kb}], 'bmm operand shapes')",
                  "M, K = lA.shape[-2:]", f"N = lB.shape[{nb}]",
                  "batch, sA, sB = math.prod(lA.shape[:-2]), M * K, K * N",
                  "gshape = tuple(lA.shape[:-2]) + (M, N)"]
        lib = f"torch.matmul(lA, lB{'.transpose(-2, -1)' if g.trans_b else ''})"
    lines.append("sC = M * N")
    if template == "epilogue":
        lines.append(f"l{gk} = {lib}")
    return lines


def _conv_args(g: Gemm) -> list[str]:
    """``cargs``: the convolution's arguments after the bias, read from its module at run time
    (or the functional call's constants)."""
    if g.conv[0] == "module":
        names = ", ".join(f"conv.{k}" for k, _ in conv_args(g.op))
        return [f"conv = _attr(self, {g.conv[1]!r})", f"cargs = ({names})"]
    return [f"cargs = {tuple(g.conv[1:])!r}"]


def _conv_geometry(g: Gemm) -> list[str]:
    """The conv template's geometry ``cg`` (gemm_conv.SIZES: 3-D, the missing leading spatial
    dims of size 1) and the output's shape ``gshape``, from the operands and ``cargs`` at run
    time, as torch computes them; arguments the kernel cannot take (padding='same', a negative
    padding) raise."""
    sp = CONV_OPS[g.op]
    names = [f"c_{k}" for k, _ in conv_args(g.op)]
    dims = [k for k in names if k != "c_groups"]  # stride, padding, [output_padding,] dilation
    dim_list = ", ".join(dims)
    ones, zeros = "1, " * (3 - sp), "0, " * (3 - sp)
    lines = [f"{', '.join(names)} = cargs",
             f"{dim_list} = (tuple(v) if isinstance(v, (tuple, list)) else (v,) * {sp} "
             f"for v in ({dim_list},))",
             f"if not (type(c_groups) is int and c_groups > 0 and all(len(v) == {sp} and "
             f"all(type(u) is int for u in v) for v in ({dim_list},)) and "
             "min(c_stride + c_dilation) > 0 and min(c_padding) >= 0):",
             f"    raise ValueError('{g.op}: this kernel takes positive integer strides, "
             "dilations and groups and non-negative integer padding, not ' + repr(cargs))",
             "xs, ks = tuple(lA.shape[2:]), tuple(lB.shape[2:])"]
    if g.op.startswith("conv_transpose"):
        lines += ["Co = lB.shape[1] * c_groups",
                  f"_expect(lA.shape[1] == lB.shape[0] and lB.shape[0] % c_groups == 0, "
                  f"'{g.op} input channels do not match the weight and groups')",
                  "_expect(all(o < s or o < d for o, s, d in zip(c_output_padding, c_stride, "
                  "c_dilation)), 'output_padding must be smaller than stride or dilation')",
                  "ys = tuple((i - 1) * s - 2 * p + d * (k - 1) + o + 1 for i, k, s, p, d, o in "
                  "zip(xs, ks, c_stride, c_padding, c_dilation, c_output_padding))"]
    else:
        lines += ["Co = lB.shape[0]",
                  f"_expect(lA.shape[1] == lB.shape[1] * c_groups and Co % c_groups == 0, "
                  f"'{g.op} input channels do not match the weight and groups')",
                  "ys = tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in "
                  "zip(xs, ks, c_stride, c_padding, c_dilation))"]
    return lines + [
        f"_expect(min(ys) > 0, '{g.op} output size is not positive')",
        "gshape = (lA.shape[0], Co) + ys",
        f"cg = (lA.shape[0], lA.shape[1], {ones}*xs, Co, {ones}*ys, {ones}*ks, "
        f"{ones}*c_stride, {zeros}*c_padding, {ones}*c_dilation, c_groups)",
        f"_expect(max(cg) < 2 ** 31, '{g.op} sizes past 2^31 (32-bit coordinates)')"]


def library_lines(plan: Plan, target: str) -> list[str]:
    """The body of a kernel-less stage of a multi-kernel plan: a library convolution and at
    most its own bias (``Gemm.trivial``), one call."""
    g = plan.gemm
    assert g is not None and g.is_conv and g.trivial
    bias = [lf for j, lf in enumerate(plan.leaves) if j != plan.gemm_leaf]
    lines = [f"lA = {leaf_tensor(g.a)}", f"lB = {leaf_tensor(g.b)}",
             f"lC = {leaf_tensor(bias[0])}.reshape(-1)" if bias else "lC = None"]
    lines += _conv_args(g)
    call = f"return torch.nn.functional.{g.op}(lA, lB, lC, *cargs)"
    return lines + (["with _ieee_fp32():", f"    {call}"] if target == "cuda" else [call])


def _to_nchw(plan: Plan, target: str, layout: int) -> bool:
    """Whether the file carries assay_to_nchw: a library convolution run channels_last."""
    return bool(layout) and target == "cuda" and plan.gemm is not None and plan.gemm.op == "conv2d"


def head(plan: Plan, target: str, knobs: dict[str, Any]) -> Head:
    lines = _gemm_lines(plan, target, template(plan, knobs), int(knobs.get("layout", 0)))
    return Head(lines, device="lA", what="the product")


def calls(plan: Plan, target: str, knobs: dict[str, Any], stream: list[str]
          ) -> tuple[list[str], list[Entry]]:
    """The GEMM's or convolution's call (its result ``g`` allocated first when a row kernel
    follows), the transpose's entry point (called from the head's lines) and the epilogue
    kernel's call."""
    custom = template(plan, knobs) in _OWN
    fused = custom and plan.kind == "elementwise"
    lines: list[str] = []
    entries: list[Entry] = []
    if target == "triton":  # launches of the file's own kernels, no entry points
        if not fused:
            lines.append("g = torch.empty(gshape, dtype=DTYPE, device=lA.device)")
        lines.append(tri.gemm_launch(plan, knobs, fused))
        if not fused:
            lines.append(f"l{plan.gemm_leaf} = g")
            lines += row.calls(plan, target, knobs, stream)[0]
        return lines, entries
    if custom:
        split = _splits(plan, target, knobs)
        gp = _gemm_params(plan, target, fused, split)
        entry = "assay_conv" if template(plan, knobs) == "conv" else "assay_gemm"
        entries.append((entry, gp))
        if split:  # the parts K is cut into, the kernel's choice; their sums' workspace (none,
            # and no allocation in the call, where K is not cut)
            conv = entry == "assay_conv"
            pp = ([p for p in gp if p.name in gemm_conv.SIZES] if conv
                  else size_params("M", "N", "K", "batch"))
            size = "math.prod(gshape)" if conv else "batch * M * N"
            entries.append((f"{entry}_parts", pp))
            lines += [f"parts = _lib().{entry}_parts({', '.join([p.py for p in pp] + stream)})",
                      f"ws = (torch.empty(parts * {size}, dtype=torch.float32, "
                      "device=lA.device) if parts > 1 else None)"]
        if not fused:
            lines.append("g = torch.empty(gshape, dtype=DTYPE, device=lA.device)")
        lines.append(f"_check(_lib().{entry}({', '.join([p.py for p in gp] + stream)}))")
        if not fused:
            lines.append(f"l{plan.gemm_leaf} = g")
    if _to_nchw(plan, target, int(knobs.get("layout", 0))):
        ptr, i64 = "ctypes.c_void_p", "ctypes.c_int64"
        entries.append(("assay_to_nchw", [Param("", "src", "", ptr), Param("", "dst", "", ptr)]
                        + [Param("", v, "", i64) for v in ("N", "C", "HW")]))
    if not fused:
        more_lines, more_entries = fused_calls(plan, target, knobs, stream)
        lines += more_lines
        entries += more_entries
    return lines, entries


def library(plan: Plan, target: str, knobs: dict[str, Any]) -> str:
    return library_of(plan, target) if template(plan, knobs) == "epilogue" else ""


FAMILY = Family(name="gemm", matches=matches, knob_spaces=KNOB_SPACES, space=space,
                defaults=defaults, safe=safe, template=template, strategy=strategy,
                source=source, calls=calls, libs=libs, declines=declines, head=head,
                library=library)
