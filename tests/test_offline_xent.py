"""The offline synthesizer's xent family (ir.CrossEntropy, families/xent.py): the cross-entropy
loss of [N, C] logits and int64 class indices as a kernel of its own, alone or after other work.

CPU candidates are built with g++ and compared with torch at two sizes (rows ignored, every
reduction, the module's settings read at run time); CUDA sources are compiled with nvcc here and
compared on the device by the tests marked ``gpu``.
"""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.propose.offline.ir import CrossEntropy
from assay.propose.offline.stages import Pipeline
from assay.tasks.model import Task
from conftest import import_file
from helpers import (KERNELBENCH, assert_calls_as_declared, assert_matches_reference,
                     build_cuda_sources, task_ctx)

pytestmark = pytest.mark.usefixtures("offline_builds")


# Class indices with about a third of the rows set to ``ignore``.
TARGETS = ("torch.where(torch.rand(n) < 0.3, torch.full((n,), {ignore}), "
           "torch.randint(0, c, (n,)))")

# name: (init body, forward body, extra inputs, sizes, other sizes, kernels)
TASKS = {
    # KernelBench L1_95's form, with ignored rows: the mean over the rows not ignored
    "mean": ("", "return F.cross_entropy(x, t)", TARGETS.format(ignore=-100),
             {"n": 9, "c": 12}, {"n": 33, "c": 7}, 1),
    # the module, its settings read at run time: a sum, another ignore_index
    "module_sum": ("self.loss = nn.CrossEntropyLoss(reduction='sum', ignore_index=2)",
                   "return self.loss(x, t)", TARGETS.format(ignore=2),
                   {"n": 5, "c": 16}, {"n": 17, "c": 3}, 1),
    # every row's loss (0 where ignored)
    "none": ("", "return F.cross_entropy(x, t, reduction='none', ignore_index=-1)",
             TARGETS.format(ignore=-1), {"n": 6, "c": 8}, {"n": 40, "c": 5}, 1),
    # a classifier's logits, then the loss: two kernels
    "linear_then_mean": ("self.fc = nn.Linear(c, c)", "return F.cross_entropy(self.fc(x), t)",
                         TARGETS.format(ignore=-100), {"n": 7, "c": 10}, {"n": 3, "c": 21}, 2),
}


def _source(name: str) -> str:
    init, body, targets, sizes, _, _ = TASKS[name]
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
            + "".join(f"{k} = {v}\n" for k, v in sizes.items())
            + "\n\nclass Model(nn.Module):\n    def __init__(self, c):\n"
            + "        super().__init__()\n" + textwrap.indent(init or "pass", " " * 8)
            + "\n\n    def forward(self, x, t):\n" + textwrap.indent(body, " " * 8) + "\n\n\n"
            + f"def get_inputs():\n    return [torch.randn(n, c) * 3, {targets}]\n\n\n"
            + "def get_init_inputs():\n    return [c]\n")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("xent_tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_source(name))
    return root


def _check(code: str, ctx: TaskContext, name: str, tmp_path: Path, device: str = "cpu") -> None:
    assert_matches_reference(code, tmp_path / f"cand_{name}_{abs(hash(code))}.py", ctx,
                             [{}, TASKS[name][4]], device, atol=1e-5)


@pytest.mark.parametrize("name", list(TASKS))
def test_xent_candidates_match_torch(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name)
    syn = OfflineSynthesizer("cpu")
    plan = syn.analyse(ctx).plan
    stages = plan.stages if isinstance(plan, Pipeline) else [syn.analyse(ctx)]
    assert len(stages) == TASKS[name][5] and isinstance(stages[-1].plan, CrossEntropy)
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    assert props and all(p.code is not None for p in props), [p.declined for p in props]
    for prop in props:
        assert 'POLICY = "strict"' in prop.code
        _check(prop.code, ctx, name, tmp_path)


def test_every_row_ignored_gives_nan_as_torch(task_dir, tmp_path):
    ctx = task_ctx(task_dir, "mean")
    prop = OfflineSynthesizer("cpu").translate(ctx, n=1, rng=random.Random(0))[0]
    cand = import_file(prop.code, tmp_path / "cand_all_ignored.py")
    x, t = torch.randn(4, 6), torch.full((4,), -100)
    got = cand.ModelNew(6)(x, t)
    assert torch.isnan(got) and torch.isnan(torch.nn.functional.cross_entropy(x, t))


@pytest.mark.parametrize("init, call, why", [
    ("pass", "F.cross_entropy(x, t, label_smoothing=0.1)", "label smoothing"),
    ("self.loss = nn.CrossEntropyLoss(weight=torch.ones(c))", "self.loss(x, t)",
     "class weights"),
])
def test_what_the_kernel_does_not_compute_is_declined(tmp_path, init, call, why):
    src = _source("mean").replace("return F.cross_entropy(x, t)", f"return {call}") \
        .replace("        pass\n", f"        {init}\n")
    (tmp_path / "declined.py").write_text(src)
    prop = OfflineSynthesizer("cpu").translate(task_ctx(tmp_path, "declined"), n=1,
                                               rng=random.Random(0))[0]
    assert prop.code is None and why in prop.declined, prop.declined


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_entry_point_is_called_as_declared(task_dir, target):
    syn = OfflineSynthesizer(target)
    for name in TASKS:
        for prop in syn.translate(task_ctx(task_dir, name, target), n=2, rng=random.Random(0)):
            assert_calls_as_declared(prop.code, "assay_xent", name)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_xent_kernels_build(task_dir, tmp_path):
    """Every block size and vector width builds with nvcc."""
    syn = OfflineSynthesizer("cuda")
    ctx = task_ctx(task_dir, "mean", "cuda")
    sources = {}
    for block in (128, 256, 512, 1024):
        for vec in (1, 2, 4):
            cand = import_file(syn.with_knobs(ctx, {"block": block, "vec": vec}).code,
                               tmp_path / f"cuda_{block}_{vec}.py")
            sources.setdefault(cand.SOURCE, (block, vec))
    assert len(sources) == 12
    build_cuda_sources(sources)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(TASKS))
def test_cuda_xent_candidates_match_torch(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name, "cuda")
    syn = OfflineSynthesizer("cuda")
    plan = syn.analyse(ctx).plan
    # a pipeline's knobs are its stages' (s<k>.block): the loss is the last stage
    at = f"s{len(plan.stages) - 1}." if isinstance(plan, Pipeline) else ""
    for knobs in ({}, {at + "block": 128, at + "vec": 1}, {at + "block": 1024, at + "vec": 4}):
        code = syn.with_knobs(ctx, knobs).code if knobs else \
            syn.translate(ctx, n=1, rng=random.Random(0))[0].code
        _check(code, ctx, name, tmp_path, "cuda")


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
def test_kernelbench_cross_entropy_gets_a_plan():
    ctx = TaskContext(Task.from_file(KERNELBENCH / "level1" / "95_CrossEntropyLoss.py"),
                      target="cuda")
    plan = OfflineSynthesizer("cuda").analyse(ctx).plan
    assert isinstance(plan, CrossEntropy) and plan.reduction == "mean"
