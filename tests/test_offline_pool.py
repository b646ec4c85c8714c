"""The offline synthesizer's pooling template: max/avg pool1d/2d/3d (+ an elementwise epilogue).

CPU candidates are built with g++ and compared exactly with torch (the same window bounds,
divisor and summation order); CUDA candidates are compiled with nvcc here and compared on the
device by the tests marked ``gpu``, and so are the Triton candidates (which
tests/test_offline_triton.py runs in Triton's interpreter where there is no GPU).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import Parent, TaskContext
from assay.propose.offline import KNOB_SPACES, OfflineSynthesizer
from assay.propose.offline.analysis import analyze_task
from assay.propose.offline.ir import Unsupported
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task

from conftest import import_file
from helpers import KERNELBENCH, REPO, build_cuda_sources


# name: (init lines, forward body, input shape expression)
POOLS = {
    "max_3s2p1": ("self.pool = nn.MaxPool2d(3, stride=2, padding=1)", "return self.pool(x)",
                  "batch, 3, h, w"),
    "avg_3s2p1": ("self.pool = nn.AvgPool2d(3, stride=2, padding=1)", "return self.pool(x)",
                  "batch, 3, h, w"),
    "max_ceil_dil": ("self.pool = nn.MaxPool2d(3, stride=2, padding=1, dilation=2, "
                     "ceil_mode=True)", "return self.pool(x)", "batch, 2, h, w"),
    "avg_ceil_nopad": ("self.pool = nn.AvgPool2d((3, 2), stride=(2, 3), padding=(1, 1), "
                       "ceil_mode=True, count_include_pad=False)", "return self.pool(x)",
                       "batch, 2, h, w"),
    # ceil_mode's last window overhangs the padded input (h or w even): a divisor of 2 rows
    "avg_ceil_pad": ("self.pool = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)",
                     "return self.pool(x)", "batch, 2, h, w"),
    "avg_divisor_fn": ("", "return F.avg_pool2d(x, 2, divisor_override=3)", "batch, 2, h, w"),
    "max_fn_epilogue": ("self.scale = nn.Parameter(torch.randn(4, 1, 1))",
                        "return torch.relu(F.max_pool2d(x, 2)) * self.scale + 0.5",
                        "batch, 4, h, w"),
    "max_chw": ("self.pool = nn.MaxPool2d(2)", "return torch.tanh(self.pool(x))", "3, h, w"),
    # 1-D pooling of (N, C, L): the 2-D kernel with windows of height 1
    "max1d_dil_ceil": ("self.pool = nn.MaxPool1d(3, stride=2, padding=1, dilation=2, "
                       "ceil_mode=True)", "return self.pool(x) * 2.0", "batch, h, w"),
    "avg1d_fn": ("", "return F.avg_pool1d(x, 4, stride=3, padding=2, count_include_pad=False)",
                 "batch, h, w"),
    # 3-D pooling of (N, C, D, H, W) and (C, D, H, W); depth h - 2: 7, 14, 3
    "max3d_dil_ceil": ("self.pool = nn.MaxPool3d(3, stride=(2, 2, 1), padding=1, "
                       "dilation=(2, 1, 2), ceil_mode=True)", "return self.pool(x)",
                       "batch, 2, h - 2, h, w"),
    "max3d_fn_epilogue": ("self.scale = nn.Parameter(torch.randn(3, 1, 1, 1))",
                          "return torch.relu(F.max_pool3d(x, (2, 3, 2), stride=(1, 2, 2))) "
                          "* self.scale + 0.5", "batch, 3, h - 2, h, w"),
    "avg3d_ceil_nopad": ("self.pool = nn.AvgPool3d((3, 2, 3), stride=(2, 3, 2), padding=1, "
                         "ceil_mode=True, count_include_pad=False)", "return self.pool(x)",
                         "batch, 2, h - 2, h, w"),
    "avg3d_ceil_cdhw": ("self.pool = nn.AvgPool3d(3, stride=2, padding=1, ceil_mode=True)",
                        "return self.pool(x)", "2, h - 2, h, w"),
    "avg3d_divisor_fn": ("", "return F.avg_pool3d(x, 2, stride=(1, 2, 1), divisor_override=5)",
                         "batch, 2, h - 2, h, w"),
}
DECLINED = {
    "return_indices": ("self.pool = nn.MaxPool2d(2, return_indices=True)",
                       "return self.pool(x)[0]", "batch, 3, h, w"),
}
# (batch, h, w): odd sizes, a width not a multiple of 4, a plane wider than a strip.
SHAPES = [(2, 9, 11), (1, 16, 20), (3, 5, 6)]


def _source(init: str, body: str, shape: str) -> str:
    init = init or "pass"
    return f"""import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, x):
        {body}


batch, h, w = 2, 33, 40
ASSAY_SIZES = {{"small": {{"batch": 2, "h": 9, "w": 11}}}}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pool_tasks")
    for name, spec in {**POOLS, **DECLINED}.items():
        (root / f"{name}.py").write_text(_source(*spec))
    return root


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernels"))
    monkeypatch.setenv("ASSAY_CUDA_ARCH", "sm_90")


def _ctx(path: Path, target: str, size: str = "large") -> TaskContext:
    return TaskContext(Task.from_file(path, size=size), target=target)


_import = import_file


def _check(code: str, task_path: Path, tmp_path: Path, device: str,
           shapes: list[tuple[int, int, int]] = SHAPES) -> None:
    """ModelNew equals Model at every shape, exactly up to float rounding, NaN included."""
    cand = _import(code, tmp_path / f"cand_{abs(hash(code))}.py")
    for batch, h, w in shapes:
        mod = Task.from_file(task_path, size="large").module()
        mod.batch, mod.h, mod.w = batch, h, w
        ref = reference_model(mod, seed=0, device=device)
        with seeded(0):
            new = cand.ModelNew()
        new.to(device).eval()
        new.load_state_dict(ref.state_dict())
        for seed, dist in ((1, "native"), (2, "large")):
            (x,) = make_inputs(mod, seed=seed, device=device, distribution=dist)
            if seed == 2:  # NaN propagates through max and sums as torch's does
                x.view(-1)[::7] = float("nan")
            with torch.no_grad():
                want, got = ref(x), new(x)
            assert got.shape == want.shape and got.stride() == want.stride(), (batch, h, w)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_bundled_pooling_tasks_are_recognized():
    for name, op in (("18_MaxPool2d", "max"), ("19_AvgPool2d", "avg")):
        a = analyze_task(Task.from_file(REPO / "data" / "tasks" / "level1" / f"{name}.py"))
        assert a.plan.pool is not None and a.plan.pool.op == op
        assert (a.plan.pool.kernel, a.plan.pool.stride, a.plan.pool.padding) == \
            ((3, 3), (2, 2), (1, 1))
        assert a.shape == (32, 64, 64, 64)  # the pooled output is the iteration shape


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem, op", [("level1/43_Max_Pooling_3D", "max"),
                                      ("level1/46_Average_Pooling_3D", "avg")])
def test_kernelbench_3d_pooling_gets_a_plan(stem, op):
    a = analyze_task(Task.from_file(KERNELBENCH / f"{stem}.py"))
    pool = a.plan.pool
    assert pool is not None and pool.op == op and pool.spatial == 3
    dilation = 3 if op == "max" else 1
    assert pool.depth == (3, 2, 1, dilation)
    assert (pool.kernel, pool.stride, pool.padding, pool.dilation) == \
        ((3, 3), (2, 2), (1, 1), (dilation, dilation))


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_what_pooling_cannot_express_is_declined(pool_dir, name):
    with pytest.raises(Unsupported) as e:
        analyze_task(Task.from_file(pool_dir / f"{name}.py"))
    assert str(e.value).startswith("offline synthesizer v1 cannot express")
    props = OfflineSynthesizer("cpu").translate(_ctx(pool_dir / f"{name}.py", "cpu"), 2,
                                                random.Random(0))
    assert len(props) == 1 and props[0].code is None and props[0].declined


@pytest.mark.parametrize("name", sorted(POOLS))
def test_cpu_pool_candidates_match_torch(pool_dir, tmp_path, name):
    path = pool_dir / f"{name}.py"
    syn = OfflineSynthesizer("cpu")
    props = syn.translate(_ctx(path, "cpu"), n=2, rng=random.Random(0))
    assert len(props) == 2 and all(p.code for p in props)
    for p in props:
        assert p.strategy == "pooling" and set(p.knobs) == set(KNOB_SPACES[("cpu", "pool")])
        library = ("_pool3d(", "_pool2d(", "_pool1d(")  # no library pooling call
        assert not any(c in p.code.split("class ModelNew")[1] for c in library)
        _check(p.code, path, tmp_path, "cpu")


def test_pool_evolution_operators_stay_in_the_space(pool_dir):
    path = pool_dir / "max_3s2p1.py"
    ctx = _ctx(path, "cuda")
    syn = OfflineSynthesizer("cuda")
    base = syn.translate(ctx, 1, random.Random(0))[0]
    assert base.knobs == {"block": 256, "cols": 4, "vec": 1}
    space = KNOB_SPACES[("cuda", "pool")]
    parent = Parent(base.id, base.code, {}, {"knobs": base.knobs})
    kids = syn.mutate(ctx, parent, 4, random.Random(1))
    assert kids and all(k.knobs != base.knobs for k in kids)
    other = syn.mutate(ctx, parent, 1, random.Random(7))[0]
    cross = syn.crossover(ctx, [parent, Parent(other.id, other.code, {}, {"knobs": other.knobs})],
                          random.Random(2))[0]
    repaired = syn.repair(ctx, parent, random.Random(3))[0]
    for p in kids + [cross, repaired]:
        assert all(p.knobs[k] in space[k] for k in space), p.knobs
    assert repaired.knobs == {"block": 128, "cols": 1, "vec": 0}  # defaults -> the safe form


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_pool_candidates_compile(pool_dir, tmp_path):
    sources = set()
    for name, forms in (("max_ceil_dil", ((1, 0), (4, 1))), ("avg_ceil_nopad", ((1, 0), (4, 1))),
                        ("max_fn_epilogue", ((1, 0), (4, 1))), ("avg3d_ceil_nopad", ((4, 1),))):
        for cols, vec in forms:
            knobs = {"block": 128, "cols": cols, "vec": vec}
            ctx = _ctx(pool_dir / f"{name}.py", "cuda")
            prop = OfflineSynthesizer("cuda").with_knobs(ctx, knobs)
            sources.add(_import(prop.code, tmp_path / f"cuda_{prop.id}.py").SOURCE)
    assert len(sources) == 7
    assert sum("constexpr int KD = 3" in src for src in sources) == 1  # the 3-D one
    build_cuda_sources(sorted(sources))


# ---------------------------------------------------------------------------------------------
# On the device


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(POOLS))
def test_cuda_pool_candidates_match_torch(pool_dir, tmp_path, name):
    path = pool_dir / f"{name}.py"
    ctx = _ctx(path, "cuda")
    syn = OfflineSynthesizer("cuda")
    shapes = SHAPES + [(2, 130, 260)]  # a row wider than a block's outputs
    for knobs in ({"block": 256, "cols": 2, "vec": 1}, {"block": 128, "cols": 1, "vec": 0},
                  {"block": 512, "cols": 4, "vec": 1}, {"block": 128, "cols": 2, "vec": 0}):
        prop = syn.with_knobs(ctx, knobs)
        _check(prop.code, path, tmp_path, "cuda", shapes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(POOLS))
def test_triton_pool_candidates_match_torch(pool_dir, tmp_path, name):
    """The Triton form compiled by Triton on the device: the defaults, run-time window loops,
    the smallest and the largest programs."""
    pytest.importorskip("triton")
    path = pool_dir / f"{name}.py"
    ctx = _ctx(path, "triton")
    syn = OfflineSynthesizer("triton", "strict")
    shapes = SHAPES + [(2, 130, 260)]
    for knobs in ({}, {"block": 128, "num_warps": 4, "unroll": 0},
                  {"block": 64, "num_warps": 1, "unroll": 1},
                  {"block": 1024, "num_warps": 8, "unroll": 1}):
        prop = syn.with_knobs(ctx, knobs)
        assert prop.code is not None and "@triton.jit" in prop.code, prop.declined
        _check(prop.code, path, tmp_path, "cuda", shapes)
