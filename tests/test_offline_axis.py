"""The offline synthesizer's axis family: reductions over non-trailing dims, argmax/argmin,
normalizations over channels, and scans (cumsum, cumprod, reversed, masked, exclusive).

CPU candidates are compiled with g++ and compared with the reference at several shapes (odd
sizes, a size-1 dim); a few CUDA sources are compiled with nvcc (nothing runs here); declines
say why; the KernelBench tasks of this family get a plan.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
from conftest import import_file
from helpers import KERNELBENCH as KB, build_cuda_sources, task_ctx

pytestmark = pytest.mark.usefixtures("offline_builds")

# Tiny tasks in KernelBench format: one input of shape `shape` (and a bool mask of the same
# shape where the forward takes one); the tests override `shape`.
_TEMPLATE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        return {body}


shape = (4, 6, 5)


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
"""

_X = "torch.randn(*shape)"
_MASK = "torch.randint(0, 2, shape).bool()"
TASKS = {
    "sum_keep": "torch.sum(x, dim=1, keepdim=True)",
    "mean_mid": "x.mean(dim=1)",
    "max_values": "torch.max(x, dim=1)[0]",
    "min_chain": "torch.amin(torch.exp(x * 0.5), dim=1) + 1.0",
    "prod_mid": "torch.prod(x, dim=1)",
    "sum_lead_dims": "x.sum(dim=(0, 1))",
    "argmax_mid": "torch.argmax(x, dim=1)",
    "argmin_keep": "torch.argmin(x, dim=0, keepdim=True)",
    "max_indices": "torch.max(x, 1)[1]",
    "argmax_last": "torch.argmax(x, dim=-1)",
    "rms_channels": "x / torch.sqrt(torch.mean(x ** 2, dim=1, keepdim=True) + 1e-5)",
    "cumsum_mid": "torch.cumsum(x, dim=1)",
    "cumprod_last": "torch.cumprod(x, dim=-1)",
    "cumsum_reverse": "torch.cumsum(x.flip(1), dim=1).flip(1)",
    "masked_cumsum": "torch.cumsum(x * mask, dim=2)",
    "scan_chain": "torch.relu(torch.cumsum(torch.sigmoid(x), dim=0)) * x",
    # exclusive scans as tasks write them (KernelBench's L1_92): the inclusive one of all but
    # the last element, after the identity
    "cumsum_exclusive": "torch.cat((torch.zeros_like(x.select(1, 0).unsqueeze(1)), "
                        "torch.cumsum(x.narrow(dim=1, start=0, length=x.size(1) - 1), dim=1)), "
                        "dim=1)",
    "cumprod_exclusive_last": "torch.cat([torch.ones_like(x[..., :1]), torch.narrow(x, -1, 0, "
                              "x.shape[-1] - 1).cumprod(-1)], -1)",
    "cumsum_exclusive_reverse": "torch.cat((torch.zeros_like(x[:, :1]), torch.cumsum("
                                "x.flip(1).narrow(1, 0, x.size(1) - 1), dim=1)), dim=1).flip(1)",
    # declined
    "flip_alone": "x.flip(1) * 2.0",
    "sum_split_dims": "x.sum(dim=(0, 2))",
    "argmax_plus": "torch.argmax(x, dim=1) + 1",
    "mask_elementwise": "x * mask",
    # not an exclusive scan: the sums of the elements after the first
    "cumsum_shifted_start": "torch.cat((torch.zeros_like(x[:, :1]), torch.cumsum(x.narrow(1, "
                            "1, x.size(1) - 1), dim=1)), dim=1)",
}
MASKED = {"masked_cumsum", "mask_elementwise"}
DECLINED = {
    "flip_alone": "a flip along dims [1]",
    "sum_split_dims": "contiguous block of dims",
    "argmax_plus": "arithmetic on argmax/argmin indices",
    "mask_elementwise": "the bool tensor 'mask'",
    # the zeros joined are the concat kernel's (rewrites.zero_joins); the narrow by a size is not
    "cumsum_shifted_start": "Tensor.size",
}
SUPPORTED = [name for name in TASKS if name not in DECLINED]
# Odd sizes, a size-1 reduced or scanned dim, a single outer index.
SHAPES = [(3, 5, 7), (2, 1, 9), (1, 33, 4)]


def _source(name: str) -> str:
    masked = name in MASKED
    return _TEMPLATE.format(args="x, mask" if masked else "x", body=TASKS[name],
                            inputs=f"{_X}, {_MASK}" if masked else _X)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("axis_tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_source(name))
    (root / "rms4d.py").write_text(_source("rms_channels").replace("(4, 6, 5)", "(2, 6, 3, 5)"))
    return root


def _check(code: str, ctx: TaskContext, path: Path, shapes: list[tuple[int, ...]],
           device: str = "cpu") -> None:
    """The candidate's ModelNew equals the reference (values, shape, dtype) at ``shapes``."""
    cand = import_file(code, path)
    for shape in shapes:
        mod = ctx.task.module()
        mod.shape = shape  # get_inputs reads it at call time
        ref = reference_model(mod, seed=0, device=device)
        with seeded(0):
            new = cand.ModelNew().to(device).eval()
        inputs = make_inputs(mod, seed=1, device=device)
        with torch.no_grad():
            expected, got = ref(*inputs), new(*inputs)
        assert got.shape == expected.shape and got.dtype == expected.dtype, shape
        torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", SUPPORTED)
def test_cpu_candidates_match_reference(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name)
    syn = OfflineSynthesizer("cpu")
    prop = syn.translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert prop.strategy == ("scan" if "cum" in TASKS[name] else "axisreduce")
    _check(prop.code, ctx, tmp_path / "cand_default.py", SHAPES)
    # one position a step, serial: the tile's remainder paths and the plain loop
    other = syn.with_knobs(ctx, {"tile": 8, "threads": 1, "unroll": 1})
    _check(other.code, ctx, tmp_path / "cand_tile8.py", SHAPES[:1])


def test_rmsnorm_over_channels_of_4d(task_dir, tmp_path):
    ctx = task_ctx(task_dir, "rms4d")
    prop = OfflineSynthesizer("cpu").translate(ctx, n=1, rng=random.Random(0))[0]
    _check(prop.code, ctx, tmp_path / "cand_rms4d.py", [(2, 6, 3, 5), (3, 1, 1, 7)])


def test_argmax_ties_take_the_first_index(task_dir, tmp_path):
    cands = {}
    for name in ("argmax_mid", "argmin_keep"):
        code = OfflineSynthesizer("cpu").translate(task_ctx(task_dir, name), 1,
                                                   random.Random(0))[0].code
        cands[name] = import_file(code, tmp_path / f"cand_{name}.py").ModelNew()
    x = torch.randint(0, 3, (3, 40, 5)).float()  # many equal values along every dim
    x[0, 7, 2] = float("nan")  # NaN is the largest and the smallest, as in torch
    assert torch.equal(cands["argmax_mid"](x), torch.argmax(x, dim=1))
    assert torch.equal(cands["argmin_keep"](x), torch.argmin(x, dim=0, keepdim=True))


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_unsupported_tasks_are_declined(task_dir, name):
    prop = OfflineSynthesizer("cpu").translate(task_ctx(task_dir, name), 1, random.Random(0))[0]
    assert prop.code is None
    assert prop.declined.startswith("offline synthesizer v1 cannot express")
    assert DECLINED[name] in prop.declined


def test_triton_target_declines_the_family(task_dir):
    prop = OfflineSynthesizer("triton").translate(task_ctx(task_dir, "cumsum_mid", "triton"), 1,
                                                  random.Random(0))[0]
    assert prop.code is None and "axis family in Triton" in prop.declined


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_sources_compile(task_dir, tmp_path):
    """Shared-memory combines of split positions (argmax's pairs, RMSNorm's two passes) and
    both scan forms (a thread per line, a block per line of a reversed masked scan)."""
    syn = OfflineSynthesizer("cuda")
    sources = {
        "argmax": syn.with_knobs(task_ctx(task_dir, "argmax_mid", "cuda"), {"split": 4}),
        "rms": syn.with_knobs(task_ctx(task_dir, "rms_channels", "cuda"), {"split": 2}),
        "scan": syn.with_knobs(task_ctx(task_dir, "masked_cumsum", "cuda"), {"form": 0}),
        "exclusive_lines": syn.with_knobs(task_ctx(task_dir, "cumsum_exclusive", "cuda"),
                                          {"form": 1}),
        "exclusive_block": syn.with_knobs(task_ctx(task_dir, "cumprod_exclusive_last", "cuda"),
                                          {"form": 2, "items": 4}),
    }
    built = {}
    for name, prop in sources.items():
        assert prop.code is not None, prop.declined
        cand = import_file(prop.code, tmp_path / f"cuda_{name}.py")
        assert "cudaGetLastError" in cand.SOURCE and "cuda_stream" in prop.code
        built[cand.SOURCE] = name
    assert len(built) == len(sources)
    build_cuda_sources(built)


KERNELBENCH = KB / "level1"
KB_TASKS = ["36_RMSNorm_", "47_Sum_reduction_over_a_dimension",
            "48_Mean_reduction_over_a_dimension", "49_Max_reduction_over_a_dimension",
            "51_Argmax_over_a_dimension", "52_Argmin_over_a_dimension",
            "53_Min_reduction_over_a_dimension", "89_cumsum", "90_cumprod",
            "91_cumsum_reverse", "92_cumsum_exclusive", "93_masked_cumsum"]


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
def test_kernelbench_tasks_get_a_plan():
    syn = OfflineSynthesizer("cuda")
    for stem in KB_TASKS:
        analysis = syn.analyse(TaskContext(Task.from_file(KERNELBENCH / f"{stem}.py"), "cuda"))
        assert analysis.plan.kind == "axis", stem
        scans = [n for n in analysis.plan.nodes if n.op.startswith("scan_")]
        assert [n.attr("exclusive", False) for n in scans] == \
            ([True] if "exclusive" in stem else [False] * len(scans)), stem


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SUPPORTED)
def test_cuda_candidates_match_reference(task_dir, tmp_path, name):
    """The cuda form on the GPU: the defaults and a split reduction or a block-per-line scan."""
    ctx = task_ctx(task_dir, name, "cuda")
    syn = OfflineSynthesizer("cuda")
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    for prop in props:
        assert prop.code is not None, prop.declined
        _check(prop.code, ctx, tmp_path / f"cuda_{prop.id}.py", SHAPES, "cuda")


def test_exclusive_scan_means_what_the_tasks_write():
    """The node the exclusive forms become computes what they did (its function is their
    meaning), sum and product, along an inner dim, a size-1 dim included."""
    from assay.propose.offline.graph import exclusive_scan

    x = torch.randn(3, 5, 4)
    for dim in (1, 2):
        n = x.size(dim)
        want = torch.cat((torch.zeros_like(x.narrow(dim, 0, 1)),
                          torch.cumsum(x.narrow(dim, 0, n - 1), dim)), dim)
        torch.testing.assert_close(exclusive_scan(x, dim, "sum"), want)
        want = torch.cat((torch.ones_like(x.narrow(dim, 0, 1)),
                          torch.cumprod(x.narrow(dim, 0, n - 1), dim)), dim)
        torch.testing.assert_close(exclusive_scan(x, dim, "prod"), want)
    one = torch.randn(2, 1, 3)
    assert torch.equal(exclusive_scan(one, 1, "sum"), torch.zeros_like(one))
