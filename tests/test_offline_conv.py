"""The gemm family's own convolution (template ``conv``, knob ``lib`` = 2, families/gemm_conv.py):
every convolution of ir.CONV_OPS, with or without an epilogue, written under the strict
policy.

CPU candidates are compiled with g++ (one build per task) and compared with torch at two sizes;
CUDA sources are only compiled here (nvcc, no GPU needed): the implicit GEMM's first form and a
covering set of its second (knobs stages, warp_tile, split_k), which the GPU tests compare with
torch; KernelBench's lone convolutions of level 1 must get a plan under strict.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import Parent, TaskContext
from assay.propose.offline import KNOB_SPACES, OfflineSynthesizer
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
import cuda_emulation
from conftest import import_file
from helpers import (KERNELBENCH, assert_matches_reference, build_cuda_sources, entry_arities,
                     task_ctx)

pytestmark = pytest.mark.usefixtures("offline_builds")


# name: (module, forward body, input shape, sizes, other sizes, knobs over the defaults). Each
# task's knobs differ (rows per task, threads), one build each.
TASKS = {
    "conv1d_strided_dilated_gelu": (
        "nn.Conv1d(cin, cout, 3, stride=2, dilation=3, padding=2)",
        "torch.nn.functional.gelu(self.conv(x)) * 0.5", "b, cin, w",
        {"b": 2, "cin": 3, "cout": 5, "w": 23}, {"b": 1, "cin": 2, "cout": 4, "w": 9},
        {"rows": 1}),
    "conv2d_grouped_padded": (
        "nn.Conv2d(cin, cout, (3, 2), padding=(1, 2), groups=2)", "self.conv(x)",
        "b, cin, h, w", {"b": 2, "cin": 4, "cout": 6, "h": 7, "w": 5},
        {"b": 1, "cin": 6, "cout": 4, "h": 3, "w": 11}, {"threads": 2}),
    "depthwise2d_relu": (
        "nn.Conv2d(cin, cin, 3, stride=2, padding=1, groups=cin, bias=False)",
        "torch.relu(self.conv(x) - 0.1)", "b, cin, h, w",
        {"b": 2, "cin": 4, "cout": 4, "h": 9, "w": 8}, {"b": 3, "cin": 3, "cout": 3, "h": 4, "w": 13},
        {"rows": 16}),
    "conv3d_strided": (
        "nn.Conv3d(cin, cout, (2, 3, 1), stride=(1, 2, 2), padding=(1, 0, 1), dilation=(2, 1, 1))",
        "self.conv(x)", "b, cin, d, h, w",
        {"b": 2, "cin": 3, "cout": 4, "d": 4, "h": 6, "w": 5},
        {"b": 1, "cin": 2, "cout": 3, "d": 3, "h": 3, "w": 7}, {"rows": 64}),
    "convt1d_padded_dilated": (
        "nn.ConvTranspose1d(cin, cout, 3, stride=3, padding=2, output_padding=1, dilation=2)",
        "self.conv(x)", "b, cin, w", {"b": 2, "cin": 3, "cout": 4, "w": 7},
        {"b": 1, "cin": 5, "cout": 2, "w": 2}, {"threads": 1}),
    "convt2d_grouped_tanh": (
        "nn.ConvTranspose2d(cin, cout, (3, 4), stride=(2, 3), padding=(1, 2), "
        "output_padding=(1, 0), groups=2)", "torch.tanh(self.conv(x)) * 1.5 - 0.25",
        "b, cin, h, w", {"b": 2, "cin": 4, "cout": 6, "h": 5, "w": 3},
        {"b": 1, "cin": 2, "cout": 4, "h": 2, "w": 6}, {}),
    "convt3d_strided_dilated": (
        "nn.ConvTranspose3d(cin, cout, (2, 3, 2), stride=(2, 1, 3), padding=(0, 1, 1), "
        "output_padding=(1, 0, 2), dilation=(1, 2, 1), bias=False)", "self.conv(x)",
        "b, cin, d, h, w", {"b": 2, "cin": 3, "cout": 2, "d": 3, "h": 4, "w": 3},
        {"b": 1, "cin": 2, "cout": 3, "d": 2, "h": 2, "w": 5}, {"rows": 4}),
    # a row epilogue: the row kernel on the convolution's output
    "conv2d_softmax": (
        "nn.Conv2d(cin, cout, 3)", "torch.softmax(self.conv(x), dim=-1)", "b, cin, h, w",
        {"b": 2, "cin": 3, "cout": 4, "h": 6, "w": 9}, {"b": 1, "cin": 2, "cout": 3, "h": 5, "w": 4},
        {}),
}
LONE = {"conv2d_grouped_padded", "conv3d_strided", "convt1d_padded_dilated",
        "convt3d_strided_dilated"}  # a convolution and at most its own bias

# The first form's stride phases (knob phases 1) on the transposed convolutions: strides 3 (1-D,
# dilated: taps 0, 1, 2 fall in phases 0, 2, 1), (2, 3) with output padding and groups, and
# (2, 1, 3) with dilation, where some phases hold no tap at all.
# The implicit GEMM's first form (the default is the second: double-buffered, warp tiles).
FIRST_FORM = {"stages": 1, "warp_tile": 0}

PHASED_CASES = [
    ("convt1d_padded_dilated", {**FIRST_FORM, "phases": 1}),
    ("convt2d_grouped_tanh", {**FIRST_FORM, "phases": 1, "tile_m": 32, "tile_n": 16,
                              "thread_m": 2, "thread_n": 1, "k_step": 8}),
    ("convt3d_strided_dilated", {**FIRST_FORM, "phases": 1, "depthwise": 0}),
]


def _source(name: str) -> str:
    module, body, shape, sizes, _, _ = TASKS[name]
    args = ", ".join(sizes)
    return ("import torch\nimport torch.nn as nn\n\n"
            + "".join(f"{k} = {v}\n" for k, v in sizes.items())
            + f"\n\nclass Model(nn.Module):\n    def __init__(self, {args}):\n"
            + f"        super().__init__()\n        self.conv = {module}\n\n"
            + f"    def forward(self, x):\n        return {body}\n\n\n"
            + f"def get_inputs():\n    return [torch.randn({shape})]\n\n\n"
            + f"def get_init_inputs():\n    return [{args}]\n")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("conv_tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_source(name))
    return root


def _model_pair(cand, mod, device: str = "cpu"):
    ref = reference_model(mod, seed=0, device=device)
    with seeded(0):
        new = cand.ModelNew(*mod.get_init_inputs())
    new.to(device).eval().load_state_dict(ref.state_dict())
    return ref, new


@pytest.mark.parametrize("name", list(TASKS))
def test_cpu_convolutions_match_torch(task_dir, tmp_path, name):
    _check_conv(task_dir, tmp_path, name, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(TASKS))
def test_cuda_convolutions_match_torch(task_dir, tmp_path, name):
    _check_conv(task_dir, tmp_path, name, "cuda")


def _check_conv(task_dir: Path, tmp_path: Path, name: str, device: str,
                knobs: dict | None = None) -> None:
    """The conv template (lib 2, the task's knobs on cpu, ``knobs`` on cuda) equals torch at
    two sizes, under strict."""
    ctx = task_ctx(task_dir, name, device)
    syn = OfflineSynthesizer(device, policy="strict")
    prop = syn.with_knobs(ctx, {"lib": 2, **(TASKS[name][5] if device == "cpu" else knobs or {})})
    assert prop.strategy == "tiling" and prop.knobs["lib"] == 2
    cand = import_file(prop.code, tmp_path / f"cand_{prop.id}.py")
    assert cand.POLICY == "strict" and cand.TEMPLATE == "conv"
    for override in ({}, TASKS[name][4]):
        mod = ctx.task.module()
        for key, value in override.items():
            setattr(mod, key, value)
        ref, new = _model_pair(cand, mod, device)
        (x,) = make_inputs(mod, seed=1, device=device)
        # true fp32 (cuDNN's default tf32 differs from fp32 by ~1e-3 on some convolutions)
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            expected, got = ref(x), new(x)
        assert got.shape == expected.shape and got.stride() == expected.stride(), override
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", range(len(PHASED_CASES)))
def test_cuda_transposed_convolutions_by_stride_phase_match_torch(task_dir, tmp_path, case):
    """The first form's stride phases (PHASED_CASES: knob phases 1) equal torch at two sizes,
    phases without a tap included."""
    name, knobs = PHASED_CASES[case]
    _check_conv(task_dir, tmp_path, name, "cuda", knobs)


# The driver of the host emulation: a transposed convolution of the geometry its arguments give
# (N Ci Di Hi Wi Co Kd Kh Kw Sd Sh Sw Pd Ph Pw Ld Lh Lw OPd OPh OPw G), computed by the gather
# form's kernel, by the stride phases' and by a direct scatter loop; prints the largest errors.
EMULATION_MAIN = r"""
int main(int argc, char** argv) {
  int64_t a[22];
  for (int i = 0; i < 22; ++i) a[i] = atoll(argv[i + 1]);
  const int64_t Do = (a[2] - 1) * a[9] - 2 * a[12] + a[15] * (a[6] - 1) + a[18] + 1;
  const int64_t Ho = (a[3] - 1) * a[10] - 2 * a[13] + a[16] * (a[7] - 1) + a[19] + 1;
  const int64_t Wo = (a[4] - 1) * a[11] - 2 * a[14] + a[17] * (a[8] - 1) + a[20] + 1;
  const AssayConv cv = {a[0], a[1], a[2], a[3], a[4], a[5], Do, Ho, Wo, a[6], a[7], a[8],
                        a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[21]};
  const int64_t CiG = cv.Ci / cv.G, CoG = cv.Co / cv.G, P = Do * Ho * Wo;
  const int64_t nx = cv.N * cv.Ci * cv.Di * cv.Hi * cv.Wi, nw = cv.Ci * CoG * cv.Kd * cv.Kh * cv.Kw;
  const int64_t no = cv.N * cv.Co * P;
  std::vector<float> x(nx), w(nw), gather(no, NAN), phased(no, NAN), ref(no, 0.0f);
  srand(1);
  for (auto& v : x) v = rand() / (float)RAND_MAX - 0.5f;
  for (auto& v : w) v = rand() / (float)RAND_MAX - 0.5f;
  for (int64_t n = 0; n < cv.N; ++n) for (int64_t ci = 0; ci < cv.Ci; ++ci)
  for (int64_t co = 0; co < CoG; ++co) for (int64_t id = 0; id < cv.Di; ++id)
  for (int64_t ih = 0; ih < cv.Hi; ++ih) for (int64_t iw = 0; iw < cv.Wi; ++iw)
  for (int64_t kd = 0; kd < cv.Kd; ++kd) for (int64_t kh = 0; kh < cv.Kh; ++kh)
  for (int64_t kw = 0; kw < cv.Kw; ++kw) {
    const int64_t od = id * cv.Sd - cv.Pd + kd * cv.Ld, oh = ih * cv.Sh - cv.Ph + kh * cv.Lh;
    const int64_t ow = iw * cv.Sw - cv.Pw + kw * cv.Lw;
    if (od < 0 || od >= Do || oh < 0 || oh >= Ho || ow < 0 || ow >= Wo) continue;
    ref[(((n * cv.Co + ci / CiG * CoG + co) * Do + od) * Ho + oh) * Wo + ow] +=
        x[(((n * cv.Ci + ci) * cv.Di + id) * cv.Hi + ih) * cv.Wi + iw] *
        w[(((ci * CoG + co) * cv.Kd + kd) * cv.Kh + kh) * cv.Kw + kw];
  }
  const float* xp = x.data(); const float* wp = w.data();
  float* gp = gather.data(); float* pp = phased.data();
  assay_emul_launch(dim3((cv.N * P + BM0 - 1) / BM0, (CoG + BN0 - 1) / BN0, cv.G), NT0,
                    [&] { assay_conv_tiles(xp, wp, gp, cv); });
  const int64_t phases = cv.Sd * cv.Sh * cv.Sw;
  const int64_t Pq = (Do + cv.Sd - 1) / cv.Sd * ((Ho + cv.Sh - 1) / cv.Sh)
                     * ((Wo + cv.Sw - 1) / cv.Sw);
  assay_emul_launch(dim3((cv.N * Pq + BM1 - 1) / BM1, (CoG + BN1 - 1) / BN1, cv.G * phases), NT1,
                    [&] { assay_conv_tiles_phased(xp, wp, pp, cv); });
  double eg = 0, ep = 0;
  for (int64_t i = 0; i < no; ++i) {
    eg = gather[i] == gather[i] ? fmax(eg, fabs(gather[i] - ref[i])) : INFINITY;
    ep = phased[i] == phased[i] ? fmax(ep, fabs(phased[i] - ref[i])) : INFINITY;
  }
  printf("%ld %g %g\n", (long)no, eg, ep);
  return 0;
}
"""
# Geometries (as EMULATION_MAIN reads them): strides 2 to 3 in every dim, padding, output
# padding, dilation, groups, K over several slabs, and phases with no tap (Kw 2, Sw 3).
EMULATED = ["2 3 3 4 3 2 2 3 2 2 1 3 0 1 1 1 2 1 1 0 2 1",
            "2 8 3 5 4 6 3 3 3 2 2 2 1 1 1 1 1 1 1 1 1 2",
            "1 20 2 3 3 5 4 4 4 2 2 2 1 1 1 1 1 1 0 0 0 1",
            "1 4 1 6 7 3 1 3 2 1 3 3 0 2 0 1 2 1 0 2 1 1",
            "1 1 3 4 3 1 2 1 2 2 1 3 0 0 0 1 1 1 0 0 0 1"]


# The two forms' knobs as emulated: the first (its default tiles and small ones) and the second
# (double-buffered and warp-tiled, single-buffered with a thread's rows apart).
EMULATED_FORMS = {
    "first": FIRST_FORM,
    "first-small": {**FIRST_FORM, "tile_m": 32, "tile_n": 16, "thread_m": 2, "thread_n": 1,
                    "k_step": 8},
    "pipe": {"stages": 2, "warp_tile": 1, "tile_n": 32, "thread_m": 2, "thread_n": 2},
    "pipe-small": {"stages": 1, "warp_tile": 1, "tile_m": 32, "tile_n": 16, "thread_m": 2,
                   "thread_n": 1, "k_step": 8},
}


def _emulated_kernel(source: str, phases: int) -> str:
    """The device code of one candidate for the emulation: the gather form's whole (its
    kernel named assay_conv_tiles), or the stride phases' helpers and kernel (named
    assay_conv_tiles_phased) without what the gather form's part brings already."""
    pipe = "assay_conv_launch" in source
    part = cuda_emulation.device_code(source, "struct AssayConv", "// The implicit GEMM's launch"
                                      if pipe else "// Depthwise")
    if phases:
        kernel = part.index("// Implicit GEMM: a block")
        helpers = part[part.index("// Stride phases"):part.index("// A slab's vector read")
                       if pipe else kernel]
        part = helpers + part[kernel:].replace("assay_conv_tiles(", "assay_conv_tiles_phased(")
    return cuda_emulation.static_dynamic_shared(part, "assay_conv_smem", str(phases))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
@pytest.mark.parametrize("form", list(EMULATED_FORMS))
def test_transposed_convolutions_by_stride_phase_in_a_host_emulation(task_dir, tmp_path, form):
    """The CUDA kernels of the gather form and of the stride phases, in either form of the
    implicit GEMM (cuda_emulation: a thread per CUDA thread, real barriers, no GPU), equal a
    direct transposed convolution on EMULATED's geometries, every output written: the
    template's index arithmetic and barriers, checked where no GPU is (the GPU tests compare
    the same with torch)."""
    syn = OfflineSynthesizer("cuda", policy="strict")
    ctx = task_ctx(task_dir, "convt3d_strided_dilated", "cuda")
    code, sizes = "", {}
    for phases in (0, 1):
        prop = syn.with_knobs(ctx, {"lib": 2, "depthwise": 0, "phases": phases,
                                    **EMULATED_FORMS[form]})
        source = import_file(prop.code, tmp_path / f"emul_{prop.id}.py").SOURCE
        assert ("assay_conv_launch" in source) == form.startswith("pipe"), form
        code += _emulated_kernel(source, phases)
        sizes.update({f"NT{phases}": cuda_emulation.launch_bounds(source, "assay_conv_tiles"),
                      f"BM{phases}": int(re.search(r"BM = (\d+)", source).group(1)),
                      f"BN{phases}": int(re.search(r"BN = (\d+)", source).group(1))})
    defines = "".join(f"#define {k} {v}\n" for k, v in sizes.items())
    exe = cuda_emulation.build(defines + code + EMULATION_MAIN, tmp_path / "convt_emulated")
    for geometry in EMULATED:
        r = subprocess.run([str(exe), *geometry.split()], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        outputs, gather_err, phased_err = r.stdout.split()
        assert int(outputs) > 0 and float(gather_err) < 1e-4 and float(phased_err) < 1e-4, \
            (geometry, r.stdout)


def test_arguments_are_read_at_run_time(task_dir, tmp_path):
    """Nothing is specialised: the module's stride, padding and dilation changed after the
    candidate was written are the ones computed; a padding the kernel cannot take raises."""
    ctx = task_ctx(task_dir, "conv2d_grouped_padded")
    prop = OfflineSynthesizer("cpu", policy="strict").with_knobs(ctx, {"lib": 2, "threads": 2})
    cand = import_file(prop.code, tmp_path / "cand_runtime.py")  # the same source: one build
    ref, new = _model_pair(cand, ctx.task.module())
    (x,) = make_inputs(ctx.task.module(), seed=2, device="cpu")
    for m in (ref.conv, new.conv):
        m.stride, m.padding, m.dilation = (2, 1), (0, 3), (1, 2)
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), rtol=1e-4, atol=1e-4)
        new.conv.padding = "same"
        with pytest.raises(ValueError, match="non-negative integer padding"):
            new(x)


def test_templates_offered_per_policy(task_dir):
    """The conv template first under every policy; the library form too where an epilogue
    follows and the policy allows it; a lone convolution has no library form."""
    for name in TASKS:
        analysis = OfflineSynthesizer("cpu").analyse(task_ctx(task_dir, name))
        libs = OfflineSynthesizer("cpu").space(analysis)["lib"]
        assert libs == ((2,) if name in LONE else (2, 1)), name
        strict = OfflineSynthesizer("cpu", policy="strict")
        assert strict.space(strict.analyse(task_ctx(task_dir, name)))["lib"] == (2,)
    props = OfflineSynthesizer("cpu").translate(task_ctx(task_dir, "convt2d_grouped_tanh"), n=2,
                                                rng=random.Random(0))
    assert [(p.knobs["lib"], p.strategy) for p in props] == [(2, "tiling"), (1, "epilogue")]
    # repair of a parent with the defaults: the safest form of the template
    (safe,) = OfflineSynthesizer("cuda").repair(task_ctx(task_dir, "conv3d_strided", "cuda"),
                                                Parent("p", None, {}, {"knobs": {"lib": 2}}),
                                                random.Random(0))
    assert safe.knobs["lib"] == 2 and safe.knobs["tile_m"] == 32


# The implicit GEMM's second form (knobs stages 2, warp_tile 1 or split_k 1; gemm_conv's
# CUDA_CONV_PIPE), a covering set rather than the product: every rank, transposed and grouped
# ones, a fused epilogue and the row kernel after it, with double and single buffering, warp
# tiles (8 x 4 and 4 x 8 lanes of 4 x 4, 4 x 1 and 2 x 2 sub-tiles; a block of 16 threads,
# too few for a warp's grid) and the rows-apart layout, slabs of 8 to 32, 2 pixels a thread
# (128 x 16 tiles of 64 threads), more threads than a slab has elements (32 x 8 slabs of A,
# 1024 threads), the largest double-buffered slabs (dynamic shared memory past 48 KB), a
# depthwise convolution through the implicit GEMM; split K where the sizes allow it; transposed
# ones by stride phase (1-D, 2-D grouped, 3-D dilated).
PIPE_CASES = [
    ("conv2d_grouped_padded", {"stages": 2, "warp_tile": 1, "split_k": 1}),
    ("conv3d_strided", {"stages": 2, "warp_tile": 1, "split_k": 1, "tile_m": 128,
                        "tile_n": 64, "thread_m": 8, "thread_n": 4, "k_step": 32}),
    ("convt3d_strided_dilated", {"stages": 2, "warp_tile": 0, "split_k": 1, "tile_m": 32,
                                 "tile_n": 64, "thread_m": 2, "thread_n": 1, "k_step": 8}),
    ("convt2d_grouped_tanh", {"stages": 1, "warp_tile": 1, "split_k": 1, "tile_m": 32,
                              "tile_n": 64, "thread_m": 8, "thread_n": 1}),
    ("conv1d_strided_dilated_gelu", {"stages": 2, "warp_tile": 1, "tile_m": 128,
                                     "tile_n": 16, "thread_m": 8, "thread_n": 4,
                                     "k_step": 8}),
    ("conv2d_softmax", {"stages": 2, "warp_tile": 0, "split_k": 1, "tile_n": 32,
                        "thread_m": 2, "thread_n": 2}),
    ("depthwise2d_relu", {"depthwise": 0, "stages": 2, "warp_tile": 1, "tile_n": 16,
                          "thread_m": 2, "thread_n": 2}),
    ("conv2d_grouped_padded", {"stages": 1, "warp_tile": 1, "tile_m": 32, "tile_n": 16,
                               "thread_m": 8, "thread_n": 4, "k_step": 8}),
    # by stride phase (transposed, no split K)
    ("convt3d_strided_dilated", {"stages": 2, "warp_tile": 1, "phases": 1, "depthwise": 0,
                                 "tile_n": 32, "thread_m": 2, "thread_n": 2}),
    ("convt1d_padded_dilated", {"stages": 2, "warp_tile": 0, "phases": 1}),
    ("convt2d_grouped_tanh", {"stages": 1, "warp_tile": 1, "phases": 1, "tile_m": 32,
                              "tile_n": 16, "thread_m": 2, "thread_n": 1, "k_step": 8}),
    ("convt1d_padded_dilated", {"stages": 2, "warp_tile": 1, "split_k": 1, "k_step": 8}),
]
# Per task, sizes of a long K (input channels of a group x taps: 900 to 2100, no multiple of
# the slab) and an output of a few tiles, where split K cuts K into parts on any device of
# more than a few SMs (a depthwise convolution's K is its taps: none).
LONG_K = {
    "conv1d_strided_dilated_gelu": {"b": 1, "cin": 700, "cout": 20, "w": 40},
    "conv2d_grouped_padded": {"b": 1, "cin": 300, "cout": 34, "h": 6, "w": 5},
    "conv3d_strided": {"b": 1, "cin": 205, "cout": 24, "d": 3, "h": 5, "w": 4},
    "convt1d_padded_dilated": {"b": 1, "cin": 601, "cout": 5, "w": 6},
    "convt2d_grouped_tanh": {"b": 1, "cin": 162, "cout": 6, "h": 3, "w": 2},
    "convt3d_strided_dilated": {"b": 1, "cin": 101, "cout": 3, "d": 2, "h": 2, "w": 2},
    "conv2d_softmax": {"b": 1, "cin": 201, "cout": 7, "h": 6, "w": 5},
}


def _pipe_candidate(task_dir: Path, tmp_path: Path, name: str, knobs: dict):
    prop = OfflineSynthesizer("cuda", policy="strict").with_knobs(
        task_ctx(task_dir, name, "cuda"), {"lib": 2, **knobs})
    return prop, import_file(prop.code, tmp_path / f"pipe_{prop.id}.py")


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_convolutions_compile(task_dir, tmp_path):
    """nvcc builds the implicit GEMM's first form with a fused epilogue and its depthwise
    kernel (a grouped 2-D convolution), the gather form of a transposed 3-D one with the
    largest tiles, and the second form's covering set (PIPE_CASES)."""
    syn = OfflineSynthesizer("cuda", policy="strict")
    cases = [("depthwise2d_relu", FIRST_FORM),
             ("convt3d_strided_dilated", {**FIRST_FORM, "tile_m": 128, "tile_n": 64,
                                          "thread_m": 2, "thread_n": 1, "k_step": 32,
                                          "depthwise": 0, "phases": 0}),
             *PHASED_CASES]
    sources: dict[str, tuple] = {}
    for name, knobs in cases:
        prop = syn.with_knobs(task_ctx(task_dir, name, "cuda"), {"lib": 2, **knobs})
        cand = import_file(prop.code, tmp_path / f"cuda_{prop.id}.py")
        assert cand.POLICY == "strict" and "assay_conv_tiles" in cand.SOURCE
        assert "assay_conv_launch" not in cand.SOURCE  # the first form, as it was measured
        assert ("assay_phase_tap" in cand.SOURCE) == bool(knobs.get("phases")), name
        sources[cand.SOURCE] = (name, knobs)
    for name, knobs in PIPE_CASES:
        _, cand = _pipe_candidate(task_dir, tmp_path, name, knobs)
        assert cand.POLICY == "strict" and "assay_conv_launch" in cand.SOURCE, (name, knobs)
        assert ("assay_conv_parts_sum" in cand.SOURCE) == bool(knobs.get("split_k")), name
        assert ("assay_phase_tap" in cand.SOURCE) == bool(knobs.get("phases")), name
        sources[cand.SOURCE] = (name, knobs)
    assert len(sources) == len(cases) + len(PIPE_CASES)
    build_cuda_sources(sources)


def test_conv_knobs_evolve_within_the_space(task_dir):
    """Mutation and crossover of the CUDA conv template stay within its knob space and reach
    the second form's knobs; a parent without them (written before they were) reads as the
    first form; every entry point call (assay_conv_parts too) matches its argtypes."""
    ctx = task_ctx(task_dir, "conv2d_grouped_padded", "cuda")
    syn = OfflineSynthesizer("cuda", policy="strict")
    space = dict(KNOB_SPACES[("cuda", "conv")], lib=(2,))
    assert {"stages", "warp_tile", "split_k", "phases"} <= set(space)
    (base,) = syn.translate(ctx, n=1, rng=random.Random(0))
    # the second form by default (docs/evidence/2026-12-07-h200-kb-dag-tenth.md)
    assert (base.knobs["stages"], base.knobs["warp_tile"], base.knobs["split_k"]) == (2, 1, 0)
    old = {k: v for k, v in base.knobs.items()
           if k not in ("stages", "warp_tile", "split_k", "phases")}
    kids = syn.mutate(ctx, Parent("p", None, {}, {"knobs": old}), 24, random.Random(1))
    other = syn.translate(ctx, n=4, rng=random.Random(2))
    for seed in range(8):
        kids += syn.crossover(ctx, [Parent("a", None, {}, {"knobs": kids[seed].knobs}),
                                    Parent("b", None, {}, {"knobs": other[-1].knobs})],
                              random.Random(seed))
    seen: dict[str, set] = {k: set() for k in space}
    for kid in kids + other:
        assert set(kid.knobs) == set(space), kid.knobs
        assert all(kid.knobs[k] in space[k] for k in space), kid.knobs
        for k in space:
            seen[k].add(kid.knobs[k])
        for name, passed, declared in entry_arities(kid.code):
            if name != "assay_error_string":
                assert passed == declared, (kid.knobs, name, passed, declared)
    assert all(seen[k] == set(space[k]) for k in ("stages", "warp_tile", "split_k")), seen
    assert seen["phases"] == {0}, seen  # a transposed convolution's knob: no variant here
    ctx_t = task_ctx(task_dir, "convt2d_grouped_tanh", "cuda")
    (base_t,) = syn.translate(ctx_t, n=1, rng=random.Random(0))
    kids_t = syn.mutate(ctx_t, Parent("p", None, {}, {"knobs": base_t.knobs}), 40,
                        random.Random(3))
    # by stride phase by default (measured faster), the evolution free to try without
    assert base_t.knobs["phases"] == 1 and {k.knobs["phases"] for k in kids_t} == {0, 1}
    (base_c,) = syn.translate(ctx, n=1, rng=random.Random(0))
    assert base_c.knobs["phases"] == 0  # not a transposed convolution
    split = syn.with_knobs(ctx, {"lib": 2, "split_k": 1})
    assert {n for n, _, _ in entry_arities(split.code)} >= {"assay_conv", "assay_conv_parts"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", range(len(PIPE_CASES)))
def test_cuda_conv_pipeline_matches_torch(task_dir, tmp_path, case):
    """The second form (PIPE_CASES) equals torch in true fp32 at the task's size (K within a
    few slabs: never split) and at LONG_K's (few output tiles: K split into parts where the
    knob allows it, the parts' sum the same bits on every call)."""
    name, knobs = PIPE_CASES[case]
    prop, cand = _pipe_candidate(task_dir, tmp_path, name, knobs)
    ctx = task_ctx(task_dir, name, "cuda")
    sizes = [{}, LONG_K[name]] if name in LONG_K else [{}, TASKS[name][4]]
    assert_matches_reference(prop.code, tmp_path / f"pipe_ref_{prop.id}.py", ctx, sizes,
                             device="cuda")
    if not knobs.get("split_k"):
        return
    lib = cand._lib()
    chosen: list[int] = []  # the parts of each call (the candidate's own _lib())
    parts = lib.assay_conv_parts
    lib.assay_conv_parts = lambda *args: chosen.append(parts(*args)) or chosen[-1]
    for override in sizes:
        mod = ctx.task.module()
        for key, value in override.items():
            setattr(mod, key, value)
        ref, new = _model_pair(cand, mod, "cuda")
        (x,) = make_inputs(mod, seed=1, device="cuda")
        with torch.no_grad():
            got, again = new(x), new(x)
        assert torch.equal(got, again), override
    assert chosen[0] == 1 and chosen[-1] > 1, chosen  # the task's size: whole; LONG_K: split


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
def test_kernelbench_lone_convolutions_get_a_plan_under_strict():
    """Every convolution task of level 1 (conv 1-D/2-D/3-D, transposed, depthwise, pointwise,
    depthwise-separable: two kernels) is written by the conv template under strict."""
    paths = sorted((KERNELBENCH / "level1").glob("*_conv_*.py"))
    assert len(paths) >= 35
    syn = OfflineSynthesizer("cuda", policy="strict")
    for path in paths:
        analysis = syn.analyse(TaskContext(Task.from_file(path), target="cuda"))
        plans = [s.plan for s in getattr(analysis.plan, "stages", ())] or [analysis.plan]
        assert all(p.gemm is not None and p.gemm.is_conv for p in plans), path.name
        assert syn.defaults(analysis).get("lib", 2) == 2, path.name


def test_source_names_no_library_kernel(task_dir, tmp_path):
    """The audit tells library kernels by name (cuDNN's, any "gemm"): the conv template's must
    read as custom."""
    from assay.verify.policy import LIBRARY_KERNEL

    for knobs, more in (({}, set()), ({"stages": 2, "split_k": 1}, {"assay_conv_parts_sum"})):
        prop = OfflineSynthesizer("cuda").with_knobs(
            task_ctx(task_dir, "conv2d_softmax", "cuda"), {"lib": 2, **knobs})
        source = import_file(prop.code, tmp_path / f"names_{prop.id}.py").SOURCE
        names = set(re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(",
                               source))
        assert names == {"assay_conv_tiles", "assay_conv_direct", "assay_rows"} | more
        assert not [n for n in names if LIBRARY_KERNEL.search(f"void {n}(float const*, long)")]
