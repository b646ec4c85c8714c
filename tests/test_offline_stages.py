"""Multi-kernel plans (propose/offline/stages.py, families/pipeline.py): a task one kernel cannot
fuse is cut into stages, each written by its family, run in order by ModelNew.forward.

CPU candidates are compiled with g++ and compared with the reference at two sizes, under both
templates of every stage (own kernels; library product/convolution + fused epilogue).
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
from assay.propose.offline.stages import Pipeline
from assay.records import Proposal
from assay.tasks.instantiate import make_inputs
from assay.tasks.model import Task
from conftest import import_file
from helpers import (KERNELBENCH, assert_calls_as_declared, assert_matches_reference,
                     build_cuda_sources, task_ctx)

pytestmark = pytest.mark.usefixtures("offline_builds")


# BatchNorm in eval mode, as a task may ask (its running statistics: an affine the epilogue
# folds in); KernelBench's tasks leave it in training mode (batch statistics: "bn_training")
_STATS = """
with torch.no_grad():
    for m in self.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1.0, 1.0)
            m.running_var.uniform_(0.5, 2.0)
            m.eval()
"""

# name: (init body, forward body, inputs, sizes, other sizes, kernels)
TASKS = {
    # three GEMMs, each with its bias and activation fused
    "mlp": ("self.net = nn.Sequential(nn.Linear(k, h), nn.ReLU(), nn.Linear(h, h), nn.Tanh(), "
            "nn.Linear(h, n))", "return self.net(x)", "torch.randn(b, k)",
            {"b": 6, "k": 20, "h": 33, "n": 7}, {"b": 3, "k": 5, "h": 9, "n": 130}, 3),
    # a residual block: the identity read again by the second stage
    "residual_block": ("self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)\n"
                       "self.bn1 = nn.BatchNorm2d(c)\nself.relu = nn.ReLU(inplace=True)\n"
                       "self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)\n"
                       "self.bn2 = nn.BatchNorm2d(c)" + _STATS,
                       "out = self.relu(self.bn1(self.conv1(x)))\n"
                       "return self.relu(self.bn2(self.conv2(out)) + x)",
                       "torch.randn(b, c, h, w)", {"b": 2, "c": 4, "h": 6, "w": 5},
                       {"b": 1, "c": 3, "h": 3, "w": 9}, 2),
    # the same block as KernelBench runs it (BatchNorm on the batch's statistics): each
    # BatchNorm the mean over the planes, then over the batch, of the values and of their
    # squared deviations (four reductions), then the normalization with the next stage
    "bn_training": ("self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)\n"
                    "self.bn1 = nn.BatchNorm2d(c)\nself.relu = nn.ReLU(inplace=True)\n"
                    "self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)\n"
                    "self.bn2 = nn.BatchNorm2d(c)",
                    "out = self.relu(self.bn1(self.conv1(x)))\n"
                    "return self.relu(self.bn2(self.conv2(out)) + x)",
                    "torch.randn(b, c, h, w)", {"b": 2, "c": 4, "h": 6, "w": 5},
                    {"b": 3, "c": 3, "h": 3, "w": 9}, 14),
    # DenseNet's head on batch statistics: the view between kernels reads the size of
    # relu(bn(x)), a value fused into a kernel (the normalization's ops keep x's shape)
    "bn_relu_head": ("self.bn = nn.BatchNorm2d(c)\nself.fc = nn.Linear(c, n)",
                     "x = torch.relu(self.bn(x))\n"
                     "x = nn.functional.adaptive_avg_pool2d(x, (1, 1)).view(x.size(0), -1)\n"
                     "return self.fc(x)",
                     "torch.randn(b, c, h, w)", {"b": 3, "c": 4, "h": 5, "w": 6, "n": 7},
                     {"b": 2, "c": 4, "h": 9, "w": 2, "n": 3}, 7),
    # a CNN head: convolution, pooling after it, a view between two kernels, a linear layer
    "cnn_head": ("self.conv = nn.Conv2d(3, c, 3, padding=1)\nself.pool = nn.MaxPool2d(2)\n"
                 "self.fc = nn.Linear(c * (h // 2) * (w // 2), n)",
                 "y = self.pool(torch.relu(self.conv(x)))\n"
                 "return self.fc(y.view(y.size(0), -1))",
                 "torch.randn(b, 3, h, w)", {"b": 2, "c": 4, "h": 6, "w": 8, "n": 5},
                 {"b": 3, "c": 2, "h": 6, "w": 8, "n": 3}, 3),
    # two convolutions in a row (the first alone: the library's call under lib 1), global
    # average pooling, flatten
    "conv_conv_gap": ("self.a = nn.Conv2d(c, c, 1)\nself.b = nn.Conv2d(c, n, 3)\n"
                      "self.gap = nn.AdaptiveAvgPool2d((1, 1))",
                      "return torch.flatten(self.gap(torch.sigmoid(self.b(self.a(x)))), 1)",
                      "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 7, "w": 5, "n": 4},
                      {"b": 1, "c": 2, "h": 4, "w": 9, "n": 6}, 2),
    # a reduction of a reduced value: the second one in a kernel of its own
    "sum_then_logsumexp": ("self.fc = nn.Linear(k, n)",
                           "y = torch.sum(self.fc(x), dim=-1)\n"
                           "return torch.logsumexp(y * 0.5, dim=-1, keepdim=True)",
                           "torch.randn(b, m, k)", {"b": 3, "m": 5, "k": 12, "n": 9},
                           {"b": 2, "m": 17, "k": 3, "n": 40}, 2),
    # a scan, then a reduction over the scanned dim (two axis kernels); a reduction of a
    # reduced value down to one number
    "scan_then_sum": ("pass", "return torch.cumsum(x, dim=1).sum(dim=1)",
                      "torch.randn(b, m, k)", {"b": 3, "m": 5, "k": 7},
                      {"b": 1, "m": 9, "k": 2}, 2),
    "sum_twice": ("pass", "return torch.relu(x).sum(dim=0).sum(dim=0)", "torch.randn(b, k)",
                  {"b": 4, "k": 9}, {"b": 13, "k": 2}, 2),
    # a product, then a sum of all of it (the total family's kernel); a pooling, then a
    # reduction over the pooled rows
    "matmul_then_total": ("self.w = nn.Parameter(torch.randn(k, n))",
                          "return torch.matmul(x, self.w).sum()", "torch.randn(b, k)",
                          {"b": 5, "k": 8, "n": 6}, {"b": 2, "k": 33, "n": 3}, 2),
    "pool_then_sum": ("self.pool = nn.AvgPool2d(2)", "return self.pool(x).sum(dim=-1)",
                      "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 8},
                      {"b": 1, "c": 2, "h": 5, "w": 5}, 2),
    # views between kernels: unsqueeze for a 1-D pooling of a product's rows, squeeze after
    "linear_pool1d_sum": ("self.fc = nn.Linear(k, n)",
                          "y = nn.functional.max_pool1d(self.fc(x).unsqueeze(1), 2)\n"
                          "return y.squeeze(1).sum(dim=1) * 0.5", "torch.randn(b, k)",
                          {"b": 4, "k": 9, "n": 12}, {"b": 3, "k": 5, "n": 7}, 3),
    # views folded into one boundary (squeeze, squeeze), a dropout before the product
    # (identity in eval), the product reading the view of the first kernel's output
    "gap_squeeze_fc": ("self.conv = nn.Conv2d(c, c, 3)\nself.drop = nn.Dropout(0.0)\n"
                       "self.fc = nn.Linear(c, n)",
                       "y = nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1)\n"
                       "return self.fc(self.drop(y.squeeze(-1).squeeze(-1)))",
                       "torch.randn(b, c, h, w)", {"b": 2, "c": 4, "h": 6, "w": 5, "n": 3},
                       {"b": 3, "c": 2, "h": 4, "w": 7, "n": 5}, 2),
    "gap_squeeze": ("self.conv = nn.Conv2d(c, c, 3)",
                    "y = nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1)\n"
                    "return y.squeeze(-1).squeeze(-1)", "torch.randn(b, c, h, w)",
                    {"b": 2, "c": 4, "h": 6, "w": 5}, {"b": 3, "c": 2, "h": 4, "w": 7}, 1),
    # a global average plus a bias of its shape (per row, not per element: a kernel of its
    # own, with the channel reduction after it)
    "gap_bias_lse": ("self.conv = nn.Conv2d(c, c, 3)\n"
                     "self.bias = nn.Parameter(torch.randn(c, 1, 1))",
                     "y = torch.mean(self.conv(x), dim=(2, 3), keepdim=True) + self.bias\n"
                     "return torch.logsumexp(y, dim=1, keepdim=True) * 2.0",
                     "torch.randn(b, c, h, w)", {"b": 2, "c": 4, "h": 6, "w": 5},
                     {"b": 3, "c": 3, "h": 5, "w": 7}, 2),
    # an elementwise prologue before a pooling (the pool kernel reads a stage's output)
    "relu_then_pool": ("self.pool = nn.MaxPool2d(2)", "return self.pool(torch.relu(x)) - 1.0",
                       "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 7},
                       {"b": 1, "c": 2, "h": 5, "w": 4}, 2),
    # the triplet margin loss (KernelBench L1_99): per-row distances, then their mean or sum
    # (decomposed before the cut: rewrites.decompose)
    "triplet_module": ("self.loss = nn.TripletMarginLoss(margin=0.5)",
                       "return self.loss(x, x * 0.5 + 0.1, torch.relu(x))",
                       "torch.randn(b, k)", {"b": 6, "k": 20}, {"b": 3, "k": 130}, 2),
    "triplet_fn_p1_sum": ("pass",
                          "return nn.functional.triplet_margin_loss(x, torch.sin(x), "
                          "torch.cos(x), margin=2.0, p=1, reduction='sum')",
                          "torch.randn(b, k)", {"b": 5, "k": 9}, {"b": 2, "k": 33}, 2),
    # a reduced value plus a parameter that broadcasts it to a larger tensor (KernelBench
    # L2_75): an elementwise kernel of its own over the operands' broadcast shape
    "min_outer_bias": ("self.fc = nn.Linear(k, n)\n"
                       "self.bias = nn.Parameter(torch.randn(1, n, 1, 1))",
                       "y = torch.min(self.fc(x), dim=1, keepdim=True)[0]\n"
                       "return y + self.bias", "torch.randn(b, k)",
                       {"b": 5, "k": 12, "n": 7}, {"b": 33, "k": 3, "n": 130}, 2),
    # branches joined by torch.cat (an Inception module): each branch's kernels one after the
    # other, the join a kernel of its own reading the forward input and three stage outputs
    "inception": ("self.b1 = nn.Conv2d(c, 4, 1)\n"
                  "self.b2 = nn.Sequential(nn.Conv2d(c, 2, 1), nn.Conv2d(2, 5, 3, padding=1))\n"
                  "self.b3 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), "
                  "nn.Conv2d(c, 3, 1))",
                  "return torch.cat([self.b1(x), self.b2(x), x, self.b3(x)], 1)",
                  "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 5},
                  {"b": 1, "c": 2, "h": 5, "w": 7}, 6),
    # a DenseNet block: every layer reads the join of the input and all earlier layers
    "dense_block": ("self.layers = nn.ModuleList([nn.Sequential(nn.BatchNorm2d(c + i * g), "
                    "nn.ReLU(inplace=True), nn.Conv2d(c + i * g, g, 3, padding=1, bias=False),"
                    " nn.Dropout(0.0)) for i in range(3)])" + _STATS,
                    "features = [x]\nfor layer in self.layers:\n    features.append(layer(x))"
                    "\n    x = torch.cat(features, 1)\nreturn x",
                    "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "g": 2, "h": 6, "w": 5},
                    {"b": 1, "c": 2, "g": 3, "h": 4, "w": 7}, 9),
    # a pooling read by the next convolution's normalization and by the join: the pooling
    # ends a kernel of its own where a boundary would carry both
    "pool_then_join": ("self.pool = nn.MaxPool2d(2)\nself.bn = nn.BatchNorm2d(c)\n"
                       "self.conv = nn.Conv2d(c, 2, 3, padding=1)" + _STATS,
                       "p = self.pool(x)\n"
                       "return torch.cat([p, self.conv(torch.relu(self.bn(p)))], 1)",
                       "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 8},
                       {"b": 1, "c": 2, "h": 4, "w": 6}, 4),
    # a join over the last dim, views of it folded into its boundary, two values that one
    # stretch would carry ending a kernel each
    "join_last_view": ("pass", "a = torch.relu(x)\nb = torch.sigmoid(x)\n"
                       "y = torch.cat((a, b * 2.0, x), dim=-1)\n"
                       "return y.view(y.size(0), -1).sum(dim=1)", "torch.randn(b, m, k)",
                       {"b": 3, "m": 4, "k": 5}, {"b": 2, "m": 1, "k": 8}, 4),
    # a channel shuffle (ShuffleNet): views whose sizes are items and quotients of x.size(),
    # a transpose made contiguous as a kernel of its own, a later view reading the sizes of
    # the tensor before the first view (an earlier stage's output, kept by its name)
    "channel_shuffle": ("self.conv1 = nn.Conv2d(c, c, 1, groups=3, bias=False)\n"
                        "self.conv2 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)\n"
                        "self.groups = 3",
                        "y = torch.relu(self.conv1(x))\n"
                        "n, ch, hh, ww = y.size()\n"
                        "y = y.view(n, self.groups, ch // self.groups, hh, ww)\n"
                        "y = y.transpose(1, 2).contiguous().view(n, -1, hh, ww)\n"
                        "return self.conv2(y) + x", "torch.randn(b, c, h, w)",
                        {"b": 2, "c": 6, "h": 5, "w": 4}, {"b": 1, "c": 9, "h": 3, "w": 7}, 3),
    # permutations that move the last dim (each output element gathers its source), the
    # second of the first: one copy
    "permute_last": ("pass", "y = torch.relu(x).transpose(-1, -2)\n"
                     "return y.permute(1, 0, 2).contiguous() * 2.0", "torch.randn(b, m, k)",
                     {"b": 3, "m": 5, "k": 7}, {"b": 2, "m": 1, "k": 4}, 3),
    # a view whose size reads a value fused into the kernel before it: the size of what that
    # value was computed from (DenseNet121's relu(bn(x)).size(0) is x's)
    "fused_size": ("self.pool = nn.MaxPool2d(2)\nself.bn = nn.BatchNorm2d(c)" + _STATS,
                   "p = self.pool(x)\nz = torch.relu(self.bn(p)) * 0.5\n"
                   "return nn.functional.adaptive_avg_pool2d(z, 1).view(z.size(0), -1)",
                   "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 8},
                   {"b": 3, "c": 2, "h": 4, "w": 4}, 2),
    # basic indexing of a computed value (steps, a new axis, a negative index): its view copied
    "index_step_none": ("pass", "y = torch.relu(x)\nreturn y[:, 1::2, None, -1] * 2.0",
                        "torch.randn(b, m, k)", {"b": 3, "m": 7, "k": 5},
                        {"b": 2, "m": 4, "k": 1}, 3),
    # sliding windows (Tensor.unfold): a forward input's patches (a chain of unfolds copied
    # once; the other size drops a trailing row and column), the copy's reshape a view
    "unfold_patches": ("self.fc = nn.Linear(c * 4, n)",
                       "y = x.unfold(2, 2, 2).unfold(3, 2, 2)\n"
                       "return self.fc(y.reshape(x.size(0), -1, x.size(1) * 4))",
                       "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 4, "n": 5},
                       {"b": 1, "c": 2, "h": 5, "w": 7, "n": 3}, 2),
    # overlapping windows of a computed value over a negative dim, reduced
    "unfold_overlap": ("pass", "return torch.relu(x).unfold(-1, 3, 1).sum(-1) * 2.0",
                       "torch.randn(b, m, k)", {"b": 3, "m": 4, "k": 7},
                       {"b": 2, "m": 1, "k": 3}, 3),
    # windows that skip elements (step > size), permuted: one copy of the chain
    "unfold_skip": ("pass", "return x.unfold(1, 2, 3).permute(0, 3, 1, 2).contiguous() * 2.0",
                    "torch.randn(b, m, k)", {"b": 2, "m": 8, "k": 3},
                    {"b": 1, "m": 5, "k": 4}, 2),
    # a view whose size reads an earlier stage's output by its name
    "pool_named_size": ("self.conv = nn.Conv2d(c, n, 3)",
                        "z = torch.relu(self.conv(x))\n"
                        "return nn.functional.max_pool2d(z, 2).view(z.size(0), -1) * 2.0",
                        "torch.randn(b, c, h, w)", {"b": 2, "c": 3, "h": 6, "w": 5, "n": 4},
                        {"b": 3, "c": 2, "h": 4, "w": 7, "n": 2}, 3),
    # an elementwise prologue before a product
    "relu_then_matmul": ("self.w = nn.Parameter(torch.randn(k, n) / k ** 0.5)",
                         "return torch.matmul(torch.relu(x), self.w) * 2.0",
                         "torch.randn(b, k)", {"b": 4, "k": 10, "n": 6},
                         {"b": 9, "k": 33, "n": 2}, 2),
}


def _source(name: str) -> str:
    init, body, inputs, sizes, _, _ = TASKS[name]
    args = ", ".join(sizes)
    return ("import torch\nimport torch.nn as nn\n\n"
            + "".join(f"{k} = {v}\n" for k, v in sizes.items())
            + f"\n\nclass Model(nn.Module):\n    def __init__(self, {args}):\n"
            + "        super().__init__()\n" + textwrap.indent(init.strip(), " " * 8) + "\n\n"
            + "    def forward(self, x):\n" + textwrap.indent(body, " " * 8) + "\n\n\n"
            + f"def get_inputs():\n    return [{inputs}]\n\n\n"
            + f"def get_init_inputs():\n    return [{args}]\n")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stage_tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_source(name))
    return root


def _check(prop: Proposal, ctx: TaskContext, name: str, tmp_path: Path,
           device: str = "cpu") -> None:
    assert_matches_reference(prop.code, tmp_path / f"cand_{prop.id}.py", ctx,
                             [{}, TASKS[name][4]], device)


@pytest.mark.parametrize("name", list(TASKS))
def test_multi_kernel_candidates_match_the_reference(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name)
    syn = OfflineSynthesizer("cpu")
    analysis = syn.analyse(ctx)
    assert isinstance(analysis.plan, Pipeline)
    assert len(analysis.plan.stages) == TASKS[name][5]
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    assert all(p.code is not None for p in props), props[0].declined
    for prop in props:
        assert prop.code.count("    def _stage") == TASKS[name][5]
        _check(prop, ctx, name, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(TASKS))
def test_cuda_multi_kernel_candidates_match_the_reference(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name, "cuda")
    for prop in OfflineSynthesizer("cuda").translate(ctx, n=2, rng=random.Random(0)):
        assert prop.code is not None, prop.declined
        _check(prop, ctx, name, tmp_path, "cuda")


def test_knobs_are_per_stage_and_evolve(task_dir):
    """Each stage's knobs are its own (prefixed s<k>.); a mutation changes some of them, the
    pipeline's lib switches every stage's template at once."""
    ctx = task_ctx(task_dir, "mlp")
    syn = OfflineSynthesizer("cpu")
    analysis = syn.analyse(ctx)
    space = syn.space(analysis)
    assert space["lib"] == (0, 1)
    assert {k.split(".")[0] for k in space if k != "lib"} == {"s0", "s1", "s2"}
    own, library = (syn.defaults(analysis, {"lib": v}) for v in (0, 1))
    assert own != library and own["lib"] == 0 and library["lib"] == 1
    code_own = syn.with_knobs(ctx, own).code
    code_lib = syn.with_knobs(ctx, library).code
    assert 'POLICY = "strict"' in code_own and 'POLICY = "permissive"' in code_lib
    assert "torch.mm(" not in code_own and "torch.mm(" in code_lib
    parent = syn.with_knobs(ctx, own)
    from assay.propose.base import Parent
    kids = syn.mutate(ctx, Parent(parent.id, parent.code, {"knobs": parent.knobs}, {}), 3,
                      random.Random(1))
    assert kids and all(k.knobs != own for k in kids)


def test_identical_stages_share_one_kernel(tmp_path, task_dir):
    """The same plan and knobs in several stages (a ResNet's blocks) are one kernel source,
    built and loaded once; other stages keep their own."""
    src = _source("mlp").replace("nn.Tanh()", "nn.ReLU()").replace(
        "nn.Linear(h, n))", "nn.Linear(h, h), nn.ReLU())")
    (tmp_path / "relu_mlp.py").write_text(src)
    syn = OfflineSynthesizer("cpu")
    same = syn.translate(task_ctx(tmp_path, "relu_mlp"), n=1, rng=random.Random(0))[0]
    cand = import_file(same.code, tmp_path / "cand_same.py")
    assert same.code.count("    def _stage") == 3 and len(cand.SOURCES) == 1
    assert same.code.count("_lib(0).") == 3
    other = syn.translate(task_ctx(task_dir, "mlp"), n=1, rng=random.Random(0))[0]  # relu, tanh, -
    assert len(import_file(other.code, tmp_path / "cand_other.py").SOURCES) == 3


def test_strict_policy_writes_every_convolution_with_its_own_kernel(task_dir):
    """Under strict a lone convolution stage is the conv template's kernel, not the library's
    call (which lib 1 makes it under the permissive policy)."""
    syn = OfflineSynthesizer("cpu", policy="strict")
    ctx = task_ctx(task_dir, "conv_conv_gap")
    props = syn.translate(ctx, n=1, rng=random.Random(0))
    assert 'POLICY = "strict"' in props[0].code
    assert "torch.nn.functional.conv2d(" not in props[0].code
    assert props[0].code.count(".assay_conv(") == 2 and "lib" not in props[0].knobs
    library = OfflineSynthesizer("cpu").with_knobs(ctx, {"lib": 1}).code
    assert 'POLICY = "permissive"' in library and "torch.nn.functional.conv2d(" in library
    # A chain of products is all own kernels under strict.
    props = syn.translate(task_ctx(task_dir, "mlp"), n=1, rng=random.Random(0))
    assert props[0].code is not None and 'POLICY = "strict"' in props[0].code


@pytest.mark.parametrize("body, reason", [
    # two values live across the boundary before the product, computed in one stretch from
    # a third (no kernel can end at the first of them alone)
    ("y = torch.exp(x)\na = torch.relu(y)\nb = torch.sigmoid(y)\n"
     "return torch.matmul(a, self.w) + b.sum()", "would carry 2 values"),
    # a view's size read from a value that one kernel computes inside itself
    ("z = torch.relu(x) + torch.sigmoid(x)\n"
     "return torch.mean(z, dim=1, keepdim=True).view(z.size(0), -1)",
     "a value inside another kernel"),
    # windows whose size the forward computes: unfold's arguments are ints only
    ("return torch.matmul(x.unfold(0, x.size(0), 1).sum(-1), self.w)",
     "Tensor.unfold with a dim, size or step other than an int"),
    # a view of more dims than the permute kernel's geometry
    ("y = torch.relu(x).view(x.size(0), 2, 5, 1, 1)\n"
     "return y.unfold(1, 1, 1).unfold(2, 5, 5).sum() * 2.0", "a view of 7 dims (at most 6)"),
])
def test_boundaries_that_cannot_be_cut_are_declined(tmp_path, body, reason):
    src = _source("relu_then_matmul").replace(
        "        return torch.matmul(torch.relu(x), self.w) * 2.0",
        textwrap.indent(body, " " * 8))
    (tmp_path / "t.py").write_text(src)
    props = OfflineSynthesizer("cpu").translate(task_ctx(tmp_path, "t"), 1, random.Random(0))
    assert props[0].code is None and reason in props[0].declined, props[0].declined


def test_a_view_of_an_input_before_the_first_kernel_is_made_by_the_forward(tmp_path):
    """A view of a forward input as a product's operand (no kernel before it to end): the
    forward makes the view (size-generic) and the one kernel reads it."""
    src = _source("relu_then_matmul").replace(
        "        return torch.matmul(torch.relu(x), self.w) * 2.0",
        "        return torch.relu(torch.matmul(x.view(x.size(0), -1), self.w))")
    (tmp_path / "t.py").write_text(src)
    ctx = task_ctx(tmp_path, "t")
    prop = OfflineSynthesizer("cpu").translate(ctx, 1, random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert "view0 = x.reshape(x.size(0), -1)" in prop.code
    assert_matches_reference(prop.code, tmp_path / "cand.py", ctx,
                             [{}, {"b": 9, "k": 33, "n": 2}])


def test_triton_declines_multi_kernel_plans(task_dir):
    props = OfflineSynthesizer("triton").translate(task_ctx(task_dir, "mlp", "triton"), 1,
                                                   random.Random(0))
    assert props[0].code is None and "pipeline family in Triton" in props[0].declined


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem, kernels", [
    # (a BatchNorm on the batch's statistics, as KernelBench runs it, is four reductions and a
    # normalization that the next kernel takes: ResNetBasicBlock's 3 kernels in eval mode are
    # 21, DenseNet121's 187 are 503)
    ("level3/1_MLP", 3), ("level3/4_LeNet5", 7), ("level3/8_ResNetBasicBlock", 21),
    ("level3/11_VGG16", 21), ("level3/6_GoogleNetInceptionModule", 8),
    ("level3/14_DenseNet121DenseBlock", 48), ("level3/17_SqueezeNetFireModule", 4),
    ("level3/25_ShuffleNetUnit", 29), ("level3/15_DenseNet121", 503),
    ("level2/35_Conv2d_Subtract_HardSwish_MaxPool_Mish", 2),
    ("level2/45_Gemm_Sigmoid_LogSumExp", 2),
])
def test_kernelbench_multi_kernel_tasks_get_a_plan(stem, kernels):
    ctx = TaskContext(Task.from_file(KERNELBENCH / f"{stem}.py"), target="cuda")
    analysis = OfflineSynthesizer("cuda").analyse(ctx)
    assert isinstance(analysis.plan, Pipeline) and len(analysis.plan.stages) == kernels


def test_cuda_multi_kernel_candidates_load_each_kernel_apart(task_dir, tmp_path):
    """The cuda form (compiled by the families' own nvcc tests; imported here, which builds
    nothing): one library per distinct kernel, each stage launching on the current stream."""
    ctx = task_ctx(task_dir, "cnn_head", "cuda")
    for prop in OfflineSynthesizer("cuda").translate(ctx, n=2, rng=random.Random(0)):
        cand = import_file(prop.code, tmp_path / f"cuda_{prop.id}.py")
        assert cand.LANG == "cuda" and len(cand.SOURCES) == len(cand._ARGTYPES) >= 2
        assert all("__global__" in src for src in cand.SOURCES)
        calls = [line for line in prop.code.splitlines() if "_check(_lib(" in line]
        assert calls and all("cuda_stream" in line for line in calls)
        assert {f"_lib({i})" for i in range(len(cand.SOURCES))} <= {
            line.split("_check(")[1].split(".")[0] for line in calls}


def test_views_of_inputs_are_read_in_their_shape(tmp_path):
    """``a.unsqueeze(1) * b`` (KernelBench's diagonal matmul): one kernel reading ``a`` as a
    column; a view can never give the shape the kernel iterates over."""
    src = ("import torch\nimport torch.nn as nn\n\nn, m = 6, 10\n\n\n"
           "class Model(nn.Module):\n    def forward(self, a, b):\n"
           "        return a.unsqueeze(1) * torch.relu(b)\n\n\n"
           "def get_inputs():\n    return [torch.randn(n), torch.randn(n, m)]\n\n\n"
           "def get_init_inputs():\n    return []\n")
    (tmp_path / "diag.py").write_text(src)
    ctx = task_ctx(tmp_path, "diag")
    syn = OfflineSynthesizer("cpu")
    assert not isinstance(syn.analyse(ctx).plan, Pipeline)
    prop = syn.translate(ctx, n=1, rng=random.Random(0))[0]
    cand = import_file(prop.code, tmp_path / "cand_diag.py")
    mod = ctx.task.module()
    inputs = make_inputs(mod, seed=1, device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(cand.ModelNew()(*inputs), mod.Model()(*inputs))
    (tmp_path / "flat.py").write_text(src.replace("a.unsqueeze(1) * torch.relu(b)",
                                                  "torch.relu(b.view(-1))"))
    props = syn.translate(task_ctx(tmp_path, "flat"), n=1, rng=random.Random(0))
    assert props[0].code is None and "no input has" in props[0].declined, props[0].declined


JOINS = ("inception", "dense_block", "pool_then_join", "join_last_view")
PERMUTES = ("channel_shuffle", "permute_last", "index_step_none", "unfold_patches",
            "unfold_overlap", "unfold_skip")


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_joins_and_permutations_call_their_entry_points_as_declared(task_dir, target):
    """Every ``assay_cat_part`` and ``assay_permute`` call passes as many arguments as its
    ctypes argtypes (a mismatch is a TypeError at the first call, on the device only)."""
    syn = OfflineSynthesizer(target)
    for name in JOINS:
        for prop in syn.translate(task_ctx(task_dir, name, target), n=2, rng=random.Random(0)):
            assert_calls_as_declared(prop.code, "assay_cat_part", name)
    for name in PERMUTES:
        for prop in syn.translate(task_ctx(task_dir, name, target), n=2, rng=random.Random(0)):
            assert_calls_as_declared(prop.code, "assay_permute", name)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_join_and_permute_kernels_build(task_dir, tmp_path):
    """The concat and permute families' CUDA sources build with nvcc (vector and scalar
    forms, every block size); the other stages' families build in their own tests."""
    syn = OfflineSynthesizer("cuda")
    sources = {}
    for name, plan, entry in (("inception", "Concat", "assay_cat_part"),
                              ("channel_shuffle", "Permute", "assay_permute")):
        ctx = task_ctx(task_dir, name, "cuda")
        k = next(i for i, st in enumerate(syn.analyse(ctx).plan.stages)
                 if type(st.plan).__name__ == plan)
        # every vector width at one block size, every block size at one width
        for block, vec in {(256, v) for v in (1, 2, 4)} | {(b, 4) for b in (128, 512, 1024)}:
            prop = syn.with_knobs(ctx, {f"s{k}.block": block, f"s{k}.vec": vec})
            cand = import_file(prop.code, tmp_path / f"cuda_{prop.id}.py")
            for src in cand.SOURCES:
                if entry in src:
                    sources.setdefault(src, (name, block, vec))
    assert len(sources) == 12
    build_cuda_sources(sources)
