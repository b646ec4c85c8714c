"""The offline synthesizer's full reductions (the total family) and losses: recognition,
declines, cpu candidates against torch at several sizes, CUDA sources built with nvcc, and
KernelBench's loss and norm tasks getting a plan.

Like tests/test_offline.py: cpu candidates are compiled with g++ and compared with the
reference; CUDA candidates are only compiled (no GPU needed). Builds go to a temporary cache.
"""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import KNOB_SPACES, OfflineSynthesizer
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
from conftest import import_file
from helpers import KERNELBENCH as KB, build_cuda_sources, task_ctx

pytestmark = pytest.mark.usefixtures("offline_builds")

# Tiny tasks in KernelBench format: `forward(x, y)` over two (batch, dim) inputs unless the
# task gives its own inputs; the tests override `batch` and `dim` to try other shapes.
_TEMPLATE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x, y):
        {body}


batch = 8
dim = 1030


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''
_XY = "torch.randn(batch, dim), torch.randn(batch, dim)"
_SOFTMAXED = "torch.randn(batch, dim).softmax(dim=-1), torch.rand(batch, dim).softmax(dim=-1)"
_SIGNS = "torch.randn(batch, dim), torch.randint(0, 2, (dim,)).float() * 2 - 1"

# name -> (constructor lines, forward body, inputs)
TASKS = {
    "sum_all": ("", "return (x * y).sum()", _XY),
    "mean_relu": ("", "return torch.mean(torch.relu(x) + 0.5 * y)", _XY),
    "max_all": ("", "return torch.max(x * 2.0 - y)", _XY),
    "sum_and_max": ("", "return x.sum() + torch.max(y)", _XY),
    "amin_keep": ("", "return torch.amin(x + y, dim=(0, 1), keepdim=True)", _XY),
    "frobenius": ("", "return x / torch.norm(x, p='fro') + y", _XY),
    "vector_norm": ("", "return torch.linalg.vector_norm(x - y)", _XY),
    "mse": ("", "return F.mse_loss(x, y)", _XY),
    "mse_sum_module": ("self.loss = nn.MSELoss(reduction='sum')", "return self.loss(x, y)", _XY),
    "huber_module": ("self.loss = nn.HuberLoss(delta=0.5)", "return self.loss(x, y)", _XY),
    "smooth_l1": ("", "return F.smooth_l1_loss(x, y, beta=0.7)", _XY),
    "hinge": ("", "return torch.mean(torch.clamp(1 - x * y, min=0))", _SIGNS),
    "kl_batchmean": ("", "return F.kl_div(torch.log(x), y, reduction='batchmean')", _SOFTMAXED),
    "l1_none": ("", "return F.l1_loss(x, y, reduction='none')", _XY),
    # declined
    "triplet_swap": ("self.loss = nn.TripletMarginLoss(swap=True)",
                     "return self.loss(x, y, y * 2.0)", _XY),
    "mse_legacy": ("", "return F.mse_loss(x, y, size_average=False)", _XY),
}
DECLINED = {
    # (without swap it is decomposed into distances and their mean: tests/test_offline_stages;
    # cross_entropy is a kernel of its own: tests/test_offline_xent)
    "triplet_swap": "triplet_margin_loss (per-row distances, then their mean",
    "mse_legacy": "mse_loss with size_average=",
}
SUPPORTED = [name for name in TASKS if name not in DECLINED]
# (batch, dim): odd sizes exercise the scalar tails; 64 x 4099 spans several blocks of the sum.
SHAPES = [(3, 7), (5, 1030), (64, 4099)]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    for name, (init, body, inputs) in TASKS.items():
        init = textwrap.indent(init, " " * 8) if init else ""
        (root / f"{name}.py").write_text(_TEMPLATE.format(init=init, body=body, inputs=inputs))
    return root


def _check(code: str, ctx: TaskContext, tmp_path: Path, tag: str, device: str = "cpu") -> None:
    """The candidate equals torch at every shape: same shape, strides and dtype (a 0-d tensor
    for a full reduction), values within float rounding of torch's own sums."""
    cand = import_file(code, tmp_path / f"cand_{tag}.py")
    for batch, dim in SHAPES:
        mod = ctx.task.module()
        mod.batch, mod.dim = batch, dim
        ref = reference_model(mod, seed=0, device=device)
        with seeded(0):
            new = cand.ModelNew(*mod.get_init_inputs())
        new.to(device).eval()
        for seed, dist in ((1, "native"), (2, "large")):
            inputs = make_inputs(mod, seed=seed, device=device, distribution=dist)
            with torch.no_grad():
                expected, got = ref(*inputs), new(*inputs)
            assert got.shape == expected.shape and got.stride() == expected.stride()
            assert got.dtype == expected.dtype
            # A sum of many terms: torch's float rounding grows with the terms' magnitude.
            scale = float(expected.abs().max()) if expected.numel() else 1.0
            torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-6 * max(scale, 1.0))


@pytest.mark.parametrize("name", SUPPORTED)
def test_cpu_candidates_match_torch(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name)
    # The defaults, then other knobs (serial, other blocks and simd lengths) for a few.
    n = 2 if name in ("sum_all", "max_all", "frobenius", "kl_batchmean") else 1
    props = OfflineSynthesizer("cpu").translate(ctx, n=n, rng=random.Random(1))
    assert len(props) == n
    family = "elementwise" if name == "l1_none" else "total"
    for prop in props:
        assert prop.code is not None, prop.declined
        assert set(prop.knobs) == set(KNOB_SPACES[("cpu", family)])
        if family == "total":
            assert prop.strategy == "totalreduce"
        _check(prop.code, ctx, tmp_path, prop.id)


def test_full_reduction_output_is_zero_dim(task_dir):
    analysis = OfflineSynthesizer("cpu").analyse(task_ctx(task_dir, "mse"))
    plan = analysis.plan
    assert plan.kind == "row" and plan.k == plan.ndim and plan.out_is_row and not plan.keepdim


@pytest.mark.filterwarnings("ignore:size_average and reduce args")
@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declines_name_the_op(task_dir, name):
    prop = OfflineSynthesizer("cpu").translate(task_ctx(task_dir, name), n=1,
                                               rng=random.Random(0))[0]
    assert prop.code is None
    assert DECLINED[name] in prop.declined, prop.declined


def test_triton_target_declines_full_reductions(task_dir):
    prop = OfflineSynthesizer("triton").translate(task_ctx(task_dir, "mse", "triton"), n=1,
                                                  rng=random.Random(0))[0]
    assert prop.code is None and "total family in Triton" in prop.declined


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_sources_compile(task_dir):
    """Two reductions to one value in one pass (a sum and a max), a value broadcast back over
    the tensor (two passes) and an operand broadcast along the rows (hinge: vector flags in
    the pass kernels, none in the finish kernel), each with its default knobs."""
    synth = OfflineSynthesizer("cuda")
    sources = {}
    for name in ("sum_and_max", "frobenius", "hinge"):
        prop = synth.translate(task_ctx(task_dir, name, "cuda"), n=1, rng=random.Random(0))[0]
        assert prop.code is not None, prop.declined
        assert "ws = torch.empty(" in prop.code
        sources[prop.code.split('SOURCE = r"""', 1)[1].split('"""', 1)[0]] = name
    assert len(sources) == 3
    build_cuda_sources(sources)


# KernelBench's level-1 losses and norms (read-only), where this checkout has them.
KERNELBENCH = KB / "level1"
KB_TASKS = ["94_MSELoss", "100_HingeLoss", "37_FrobeniusNorm_", "96_HuberLoss",
            "98_KLDivLoss"]


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench is not in ../shared")
@pytest.mark.parametrize("stem", KB_TASKS)
def test_kernelbench_losses_get_a_plan(stem):
    task = Task.from_file(KERNELBENCH / f"{stem}.py")
    analysis = OfflineSynthesizer("cuda").analyse(TaskContext(task, "cuda"))
    assert analysis.plan.k == analysis.plan.ndim


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SUPPORTED)
def test_cuda_candidates_match_torch(task_dir, tmp_path, name):
    """The cuda form on the GPU (per-block partials combined in a fixed order): the same
    values twice, and torch's within rounding."""
    ctx = task_ctx(task_dir, name, "cuda")
    for prop in OfflineSynthesizer("cuda").translate(ctx, n=2, rng=random.Random(1)):
        assert prop.code is not None, prop.declined
        _check(prop.code, ctx, tmp_path, prop.id, "cuda")
