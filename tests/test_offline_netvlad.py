"""NetVLAD (KernelBench's L3_46 with ghost clusters, L3_47 without): a forward with a device
guard (``if x.device != self.clusters.device: raise ...``), decided while tracing, then planned
as kernels: the product with the clusters, BatchNorm and softmax in one; the ghost clusters
sliced off; the assignments' sum over the features, times the visual words (a (B, 1, K) value
broadcast against (1, D, K): two runs of broadcast dims); the batched product of the
assignments with the features; the residuals' L2 norms over D, then over the flattened rows.

Small copies of the KernelBench files (sizes edited down) are synthesized for the CPU, compared
with the reference at two sizes and accepted by the verifier under strict; the CUDA candidate
is compiled with nvcc, and on a GPU compared with the reference (``gpu``). Any other branch on
a traced value is still declined, with its reason.
"""

from __future__ import annotations

import random

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.tasks.model import Task
from helpers import (KERNELBENCH as KB, assert_accepted_on_cpu, assert_matches_reference,
                     assert_translations_match_reference, build_cuda_candidates, small_copy,
                     task_ctx, translations)

pytestmark = pytest.mark.usefixtures("offline_builds")

KERNELBENCH = KB / "level3"
STEMS = {"ghost": "46_NetVladWithGhostClusters", "no_ghost": "47_NetVladNoGhostClusters"}
# per copy: the module's sizes (odd, not multiples of anything), and the other sizes of the
# forward's input checked with the same candidate (the clusters' sizes are the constructor's)
COPIES = {
    "ghost": ({"batch_size": 3, "num_features": 7, "num_clusters": 5, "feature_size": 12,
               "ghost_clusters": 3}, {"batch_size": 2, "num_features": 13}),
    "ghost_wide": ({"batch_size": 2, "num_features": 9, "num_clusters": 8, "feature_size": 33,
                    "ghost_clusters": 1}, {"batch_size": 5, "num_features": 4}),
    "no_ghost": ({"batch_size": 3, "num_features": 7, "num_clusters": 5, "feature_size": 12,
                  "ghost_clusters": 0}, {"batch_size": 2, "num_features": 13}),
    "no_ghost_wide": ({"batch_size": 2, "num_features": 9, "num_clusters": 8,
                       "feature_size": 33, "ghost_clusters": 0},
                      {"batch_size": 5, "num_features": 4}),
}

needs_kernelbench = pytest.mark.skipif(not KERNELBENCH.is_dir(),
                                       reason="KernelBench checkout not present")


@pytest.fixture(scope="module")
def copies_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("netvlad")
    if KERNELBENCH.is_dir():
        for name, (sizes, _) in COPIES.items():
            stem = STEMS["no_ghost" if name.startswith("no_ghost") else "ghost"]
            (root / f"{name}.py").write_text(small_copy(KERNELBENCH / f"{stem}.py", sizes))
    (root / "branch_on_value.py").write_text(_BRANCH_ON_VALUE)
    (root / "guards.py").write_text(_GUARDS)
    (root / "fixed_device.py").write_text(_FIXED_DEVICE)
    return root


_BRANCH_ON_VALUE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n))

    def forward(self, x):
        if x.device != self.w.device:  # decided while tracing
            raise ValueError("devices differ")
        if x.sum() > 0:  # a branch on the data: not
            return x * self.w
        return x - self.w


def get_inputs():
    return [torch.randn(4, 6)]


def get_init_inputs():
    return [6]
"""


# guards of devices and dtypes, decided while tracing: the branches not taken are not traced
_GUARDS = _BRANCH_ON_VALUE.replace(
    """        if x.sum() > 0:  # a branch on the data: not
            return x * self.w
        return x - self.w""",
    """        if x.dtype != self.w.dtype or x.dtype != torch.float32:
            x = x.double()
        assert (x * 2).device == self.w.device
        return x - self.w""")


# a device guard against a value made on a fixed device: not decided while tracing
_FIXED_DEVICE = _BRANCH_ON_VALUE.replace(
    """        if x.sum() > 0:  # a branch on the data: not
            return x * self.w""",
    """        if torch.zeros(x.size(0), device="cpu").device != x.device:
            return x * self.w""")


def test_device_and_dtype_guards_are_decided_while_tracing(copies_dir, tmp_path):
    ctx = task_ctx(copies_dir, "guards")
    prop = OfflineSynthesizer("cpu").translate(ctx, 1, random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert "double" not in prop.code
    assert_matches_reference(prop.code, tmp_path / "cand_guards.py", ctx, [{}])


@needs_kernelbench
@pytest.mark.parametrize("name", sorted(COPIES))
def test_cpu_candidate_matches_reference_and_the_verifier_accepts_it(
        copies_dir, tmp_path, name):
    ctx = task_ctx(copies_dir, name)
    syn = OfflineSynthesizer("cpu", policy="strict")
    analysis = syn.analyse(ctx)
    kinds = [type(s.plan).__name__ for s in analysis.plan.stages]
    # the ghost clusters' slice (all of the clusters without them), the assignments'
    # transpose and the product's: copies of their own
    assert kinds.count("Permute") == 3, kinds
    assert "bmm" in analysis.ops and "normalize" in analysis.ops, analysis.ops
    prop = syn.translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert 'POLICY = "strict"' in prop.code
    sizes, other = COPIES[name]
    assert_matches_reference(prop.code, tmp_path / f"cand_{name}.py", ctx, [{}, other],
                             seeds=(1, 2))
    assert_accepted_on_cpu(ctx, prop.code, tmp_path / f"verified_{name}.py")


@pytest.mark.parametrize("name, branch", [("branch_on_value", "gt(sum(x), 0)"),
                                          ("fixed_device",
                                           "ne(zeros(size(x, 0)).device, x.device)")])
def test_a_branch_on_a_traced_value_is_declined_with_its_reason(copies_dir, name, branch):
    """The device guard against the module's tensor is decided; the branch on ``x.sum() > 0``
    is not, nor a device guard against a value made on a fixed device (``torch.zeros(n,
    device="cpu")``: on the GPU the branch goes the other way), and the decline names it."""
    prop = OfflineSynthesizer("cpu").translate(task_ctx(copies_dir, name), 1,
                                               random.Random(0))[0]
    assert prop.code is None
    assert f"control flow on a traced value ({branch})" in prop.declined, prop.declined


@needs_kernelbench
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_sources_compile(copies_dir, tmp_path):
    build_cuda_candidates(translations(copies_dir, ("ghost", "no_ghost")), tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@needs_kernelbench
@pytest.mark.parametrize("name", sorted(COPIES))
def test_cuda_candidates_match_reference(copies_dir, tmp_path, name):
    """On a GPU: the CUDA candidates (the strict one and the permissive) equal the reference
    at the copy's sizes and at the other input sizes."""
    ctx = task_ctx(copies_dir, name, "cuda")
    _, other = COPIES[name]
    assert_translations_match_reference(ctx, [{}, other], tmp_path)


@needs_kernelbench
@pytest.mark.parametrize("stem", sorted(STEMS.values()))
def test_kernelbench_netvlad_tasks_get_a_plan(stem):
    analysis = OfflineSynthesizer("cuda").analyse(
        TaskContext(Task.from_file(KERNELBENCH / f"{stem}.py"), "cuda"))
    assert "bmm" in analysis.ops and "normalize" in analysis.ops, analysis.summary
