"""The gemm family's own convolution (template ``conv``, knob ``lib`` = 2, families/gemm_conv.py):
every convolution of ir.CONV_OPS, with or without an epilogue, written under the strict
policy.

CPU candidates are compiled with g++ (one build per task) and compared with torch at two sizes;
two CUDA sources are only compiled (nvcc, no GPU needed); KernelBench's lone convolutions of
level 1 must get a plan under strict.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch

from assay.bench.build import build, nvcc_path
from assay.propose.base import Parent, TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
from conftest import import_file
from helpers import REPO, task_ctx

pytestmark = pytest.mark.usefixtures("offline_builds")

KERNELBENCH = REPO.parent / "shared" / "kernelbench"

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


def _check_conv(task_dir: Path, tmp_path: Path, name: str, device: str) -> None:
    """The conv template (lib 2, the task's knobs) equals torch at two sizes, under strict."""
    ctx = task_ctx(task_dir, name, device)
    syn = OfflineSynthesizer(device, policy="strict")
    prop = syn.with_knobs(ctx, {"lib": 2, **(TASKS[name][5] if device == "cpu" else {})})
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


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_convolutions_compile(task_dir, tmp_path):
    """nvcc builds the implicit GEMM with a fused epilogue and its depthwise kernel (a grouped
    2-D convolution), and the gather form of a transposed 3-D one with the largest tiles."""
    syn = OfflineSynthesizer("cuda", policy="strict")
    cases = [("depthwise2d_relu", {}),
             ("convt3d_strided_dilated", {"tile_m": 128, "tile_n": 64, "thread_m": 2,
                                          "thread_n": 1, "k_step": 32, "depthwise": 0})]
    for name, knobs in cases:
        prop = syn.with_knobs(task_ctx(task_dir, name, "cuda"), {"lib": 2, **knobs})
        cand = import_file(prop.code, tmp_path / f"cuda_{prop.id}.py")
        assert cand.POLICY == "strict" and "assay_conv_tiles" in cand.SOURCE
        assert build(cand.SOURCE, lang="cuda").exists(), name


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

    prop = OfflineSynthesizer("cuda").with_knobs(task_ctx(task_dir, "conv2d_softmax", "cuda"),
                                                 {"lib": 2})
    source = import_file(prop.code, tmp_path / "names.py").SOURCE
    names = set(re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(",
                           source))
    assert names == {"assay_conv_tiles", "assay_conv_direct", "assay_rows"}
    assert not [n for n in names if LIBRARY_KERNEL.search(f"void {n}(float const*, long)")]
