"""What the broadcast leaves alone compute, once per vector (families.shared.vector_uniform).

BatchNorm in eval mode (a task that asks for it: its running statistics) is
``(x - mean) * rsqrt(var + eps) * w + b`` per channel: the square root and the division depend
on the channel only. A vectorized CUDA kernel computes them once per vector of a plane, where
its broadcast leaves' flags hold (a plane a multiple of the vector), and per element otherwise;
both must equal the reference.
"""

from __future__ import annotations

import random

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.offline import OfflineSynthesizer
from assay.propose.offline.analysis import analyze_task
from assay.propose.offline.families.shared import Schedule, elem_closure, leaf_kind, vector_uniform
from helpers import assert_matches_reference, build_cuda_sources, task_ctx

TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1.0, 1.0)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 2.0)
            self.bn.bias.uniform_(-0.5, 0.5)
        self.bn.eval()

    def forward(self, x):
        return torch.sigmoid(self.bn(x)) * 2.0


n, c, h, w = 2, 3, 8, 8


def get_inputs():
    return [torch.randn(n, c, h, w)]


def get_init_inputs():
    return [c]
'''

# planes a multiple of the vector (the once-per-vector path), and not (per element)
SIZES = [{}, {"h": 3, "w": 5}, {"h": 1, "w": 2}]


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "bn_sigmoid.py").write_text(TASK)
    return task_ctx(tmp_path, "bn_sigmoid", "cuda")


def test_the_channel_only_values_are_found_and_computed_before_the_lanes(ctx):
    plan = analyze_task(ctx.task).plan
    kinds = [leaf_kind(plan, k) for k in range(len(plan.leaves))]
    sched = Schedule(plan, kinds)
    nodes, leaves = vector_uniform(plan, sched, elem_closure(plan, sched, [plan.output]))
    ops = {plan.nodes[j].op for j in nodes}
    assert "rsqrt" in ops and len(leaves) == 4, (ops, leaves)  # mean, var, weight, bias
    assert not {"sub", "sigmoid"} & ops  # what reads x stays per element
    (prop,) = OfflineSynthesizer("cuda").translate(ctx, n=1, rng=random.Random(0))
    source = prop.code.split('SOURCE = r"""')[1]
    at = source.index("computed once, not per element")
    fast = source[at:source.index("} else {", at)]
    lanes = fast.index("for (int u = 0; u < VEC; ++u)")
    assert "sqrtf" in fast[:lanes] and "sqrtf" not in fast[lanes:], fast
    assert "assay_sigmoid" in fast[lanes:]


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_the_once_per_vector_path_compiles(ctx):
    syn = OfflineSynthesizer("cuda")
    sources = {}
    for knobs in ({}, {"vec": 2, "unroll": 1}):
        prop = syn.with_knobs(ctx, knobs)
        sources[prop.code.split('SOURCE = r"""')[1].split('"""')[0]] = ("bn_sigmoid", knobs)
    build_cuda_sources(sources)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_once_per_vector_path_matches_the_reference(ctx, tmp_path):
    syn = OfflineSynthesizer("cuda")
    for knobs in ({}, {"vec": 2, "unroll": 1}, {"vec": 1}):
        prop = syn.with_knobs(ctx, knobs)
        assert_matches_reference(prop.code, tmp_path / f"bn_{prop.id}.py", ctx, SIZES,
                                 device="cuda", seeds=(1, 2))
