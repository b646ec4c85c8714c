"""The offline synthesizer's attention family: multi-head self-attention written out as minGPT
does (a packed projection split into q, k, v; the heads split, scored, masked by a buffer,
softmax or ReLU, weighted, put back side by side) becomes one kernel between the projections.

CPU candidates are compiled and compared with the reference at odd sizes (a sequence shorter
than the mask, a head size not a multiple of anything); the CUDA source is compiled with nvcc
(nothing runs here; the gpu test runs it); what is not the pattern is not taken for it;
KernelBench's L3_43, 44 and 50 get a plan.
"""

from __future__ import annotations

import random

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.propose.offline.graph import trace
from assay.propose.offline.own_kernels import packed_attention
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
from conftest import import_file
from helpers import REPO, build_cuda_sources, task_ctx

pytestmark = pytest.mark.usefixtures("offline_builds")

_TASK = """import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.drop = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(max_seqlen, max_seqlen))
                             .view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
{mask}        att = {act}
        att = self.drop(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return {out}


batch_size, seq_len = 2, 7


def get_inputs():
    return [torch.rand(batch_size, seq_len, 12)]


def get_init_inputs():
    return [12, 3, 80]
"""
_MASK = "        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))\n"
TASKS = {  # name: (mask line, activation, output)
    "causal_softmax": (_MASK, "F.softmax(att, dim=-1)", "self.c_proj(y)"),
    "causal_relu": (_MASK, "F.relu(att)", "y"),
    "softmax_unmasked": ("", "att.softmax(dim=-1)", "self.c_proj(y) + x"),
    # not attention's pattern: the scores' softmax over the queries; a mask of one row for all
    "softmax_over_queries": (_MASK, "F.softmax(att, dim=-2)", "y"),
    "mask_one_row": (_MASK.replace(":, :T, :T]", ":, :1, :T]"), "F.softmax(att, dim=-1)", "y"),
}
# (batch, sequence): odd, one token, and long enough that a causal mask zeroes whole tiles of
# keys for a block of query rows (the CUDA kernel skips them); the mask is 80 x 80
SHAPES = [(2, 7), (1, 1), (2, 70)]


def _source(name: str) -> str:
    mask, act, out = TASKS[name]
    return _TASK.format(mask=mask, act=act, out=out)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention_tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_source(name))
    return root


def _check(code: str, ctx: TaskContext, path, device: str = "cpu") -> None:
    cand = import_file(code, path)
    for b, t in SHAPES:
        mod = ctx.task.module()
        mod.batch_size, mod.seq_len = b, t
        ref = reference_model(mod, seed=0, device=device)
        with seeded(0):
            new = cand.ModelNew(*mod.get_init_inputs()).to(device).eval()
        new.load_state_dict(ref.state_dict())
        inputs = make_inputs(mod, seed=1, device=device)
        with torch.no_grad():
            expected, got = ref(*inputs), new(*inputs)
        assert got.shape == expected.shape and got.dtype == expected.dtype, (b, t)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_pattern_is_one_node_with_its_meaning(task_dir):
    """After the trace the block is one ``packed_attention`` node (split, views, transposes,
    scores, mask, softmax and weighted sum gone), and that function computes what the block
    did."""
    gm = trace(Task.from_file(task_dir / "causal_softmax.py").module())
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [packed_attention], [n.target for n in calls]
    (node,) = calls
    assert node.args[2:] == (12, 3, pytest.approx(0.5), "softmax")
    torch.manual_seed(0)
    mod = Task.from_file(task_dir / "causal_softmax.py").module()
    model = mod.Model(*mod.get_init_inputs()).eval()
    x = torch.rand(2, 7, 12)
    with torch.no_grad():
        got = model.c_proj(packed_attention(model.c_attn(x), model.bias, 12, 3, 0.5, "softmax"))
        assert torch.allclose(got, model(x), atol=1e-6)


@pytest.mark.parametrize("name", ["causal_softmax", "causal_relu", "softmax_unmasked"])
def test_cpu_candidates_match_reference(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name)
    syn = OfflineSynthesizer("cpu")
    prop = syn.translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert "assay_attention" in prop.code
    _check(prop.code, ctx, tmp_path / "cand_default.py")
    serial = syn.with_knobs(ctx, {"s1.threads": 1})  # (stage 1: the attention)
    _check(serial.code, ctx, tmp_path / "cand_serial.py")


@pytest.mark.parametrize("name", ["softmax_over_queries", "mask_one_row"])
def test_what_is_not_the_pattern_is_not_taken_for_it(task_dir, name):
    prop = OfflineSynthesizer("cpu").translate(task_ctx(task_dir, name), 1,
                                               random.Random(0))[0]
    assert prop.code is None or "assay_attention" not in prop.code, prop.declined


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_sources_compile(task_dir, tmp_path):
    syn = OfflineSynthesizer("cuda")
    built = {}
    for name, knobs in (("causal_softmax", {"s1.rows": 4}), ("causal_relu", {"s1.rows": 1})):
        prop = syn.with_knobs(task_ctx(task_dir, name, "cuda"), knobs)
        assert prop.code is not None, prop.declined
        cand = import_file(prop.code, tmp_path / f"cuda_{name}.py")
        for source in cand.SOURCES:
            built[source] = name
    build_cuda_sources(built)


KERNELBENCH = REPO.parent / "shared" / "kernelbench" / "level3"


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem", ["43_MinGPTCausalAttention", "44_MiniGPTBlock",
                                  "50_ReLUSelfAttention"])
def test_kernelbench_attention_tasks_get_a_plan(stem):
    analysis = OfflineSynthesizer("cuda").analyse(
        TaskContext(Task.from_file(KERNELBENCH / f"{stem}.py"), "cuda"))
    assert "attention" in analysis.ops, analysis.summary


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["causal_softmax", "causal_relu", "softmax_unmasked"])
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_cuda_candidates_match_reference(task_dir, tmp_path, name, rows):
    ctx = task_ctx(task_dir, name, "cuda")
    prop = OfflineSynthesizer("cuda").with_knobs(ctx, {"s1.rows": rows})
    assert prop.code is not None, prop.declined
    _check(prop.code, ctx, tmp_path / f"cuda_{name}_{rows}.py", "cuda")
