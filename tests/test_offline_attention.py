"""The offline synthesizer's attention family: multi-head self-attention written out as minGPT
does (a packed projection split into q, k, v; the heads split, scored, masked by a buffer,
softmax or ReLU, weighted, put back side by side) becomes one kernel between the projections.

CPU candidates are compiled and compared with the reference at odd sizes (a sequence shorter
than the mask, a head size not a multiple of anything); the CUDA source is compiled with nvcc
(nothing runs here; the gpu test runs it); what is not the pattern is not taken for it;
KernelBench's L3_43, 44 and 50 get a plan.

``F.scaled_dot_product_attention`` (no mask, no dropout, not causal) is planned as what it
computes: the scores' product with k read in place (its last two dims swapped) and the softmax in
one kernel, then the product with v, for heads of any width (KernelBench's L1_97: 1024).
``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` become the attention kernel between
their projections (KernelBench's L3_31 and L3_32).
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
from helpers import REPO, assert_matches_reference, build_cuda_sources, task_ctx

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
    for name, knobs in (("causal_softmax", {"s1.rows": 4}), ("causal_relu", {"s1.rows": 1}),
                        ("causal_softmax", {"s1.tile": 1}), ("causal_relu", {"s1.tile": 1})):
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
@pytest.mark.parametrize("knobs", [{"s1.rows": 1}, {"s1.rows": 2}, {"s1.rows": 4},
                                   {"s1.tile": 1}], ids=["rows1", "rows2", "rows4", "tiles"])
def test_cuda_candidates_match_reference(task_dir, tmp_path, name, knobs):
    """Both forms; 70 tokens: two blocks of query rows and of keys in the tiled form, the
    second partial, a key tile of the first block all masked."""
    ctx = task_ctx(task_dir, name, "cuda")
    prop = OfflineSynthesizer("cuda").with_knobs(ctx, knobs)
    assert prop.code is not None, prop.declined
    _check(prop.code, ctx, tmp_path / f"cuda_{name}.py", "cuda")


# ---------------------------------------------------------------------------------------------
# Attention as torch's function and modules write it: F.scaled_dot_product_attention (two
# kernels), nn.MultiheadAttention and nn.TransformerEncoderLayer (the attention kernel between
# the projections). One table of tasks: each checked against torch at two sizes on the CPU
# (and on the GPU), the declined ones declined, KernelBench's planned.

_SDPA = """import torch
import torch.nn as nn
import torch.nn.functional as F

b, h, l, s, e, ev = 2, 3, 9, 13, 24, 20


class Model(nn.Module):
    def forward(self, q, k, v):
        return {call}


def get_inputs():
    return [torch.randn({lead}l, e), torch.randn({lead}s, e), torch.randn({lead}s, ev)]


def get_init_inputs():
    return []
"""
# other sizes of every dim but e (the default scale is 1 / sqrt(e) at the analysed size)
SDPA_SIZES = [{}, {"b": 1, "h": 2, "l": 65, "s": 70, "ev": 33}]

_MHA = """import torch
import torch.nn as nn

embed_dim, num_heads, batch_size, image_height, image_width = 16, 4, 2, 3, 5


class Model(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads{kwargs})
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x{extra}):
{body}


def get_inputs():
    return [torch.rand(batch_size, embed_dim, image_height, image_width){extra_input}]


def get_init_inputs():
    return [embed_dim, num_heads]
"""
_VIT_BODY = """        B, C, H, W = x.shape
        x = x.view(B, C, H * W).permute(2, 0, 1)
        attn_output, _ = self.attn(x, x, x)
        x = self.norm(attn_output + x)
        return x.permute(1, 2, 0).view(B, C, H, W)"""
_TOKENS_BODY = """        t = x.flatten(2).permute(2, 0, 1).contiguous()
        y = self.attn(t, t, t, need_weights=False)[0]
        return torch.relu(y + t)"""
_CROSS_BODY = """        B, C, H, W = x.shape
        x = x.view(B, C, H * W).permute(2, 0, 1)
        m = y.view(B, C, H * W).permute(2, 0, 1)
        return self.attn(x, m, m)[0]"""
MHA_SIZES = [{}, {"batch_size": 3, "image_height": 7, "image_width": 9}]

_ENCODER = """import torch
import torch.nn as nn

batch_size, tokens, embed_dim = 2, 5, 16


class Model(nn.Module):
    def __init__(self, embed_dim):
        super().__init__()
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim))
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(
            d_model=embed_dim, nhead=4, dim_feedforward=2 * embed_dim{kwargs})
            for _ in range(2)])
{init}
    def forward(self, x):
        B = x.size(0)
        x = torch.cat((self.cls_token.expand(B, -1, -1), self.proj(x)), dim=1)
        for layer in self.layers:
            x = layer(x{call})
        return x[:, 0]


def get_inputs():
    return [torch.rand(batch_size, tokens, embed_dim)]


def get_init_inputs():
    return [embed_dim]
"""
ENCODER_SIZES = [{}, {"batch_size": 3, "tokens": 9}]


def _sdpa(call: str, lead: str = "b, h, ") -> str:
    return _SDPA.format(call=call, lead=lead)


def _mha(kwargs: str, body: str, extra: str = "", extra_input: str = "") -> str:
    return _MHA.format(kwargs=kwargs, body=body, extra=extra, extra_input=extra_input)


def _encoder(kwargs: str, call: str = "", init: str = "") -> str:
    return _ENCODER.format(kwargs=kwargs, call=call, init=init)


FORMS = {  # name: (task source, sizes checked, candidates checked: the forms translate makes)
    "sdpa": (_sdpa("F.scaled_dot_product_attention(q, k, v)"), SDPA_SIZES, 2),
    "sdpa_scale_3d": (_sdpa("F.scaled_dot_product_attention(q, k, v, scale=0.3) * 2.0", "b, "),
                      SDPA_SIZES, 2),
    "mha_vit": (_mha("", _VIT_BODY), MHA_SIZES, 1),
    "mha_no_bias": (_mha(", bias=False", _TOKENS_BODY), MHA_SIZES, 1),
    "encoder_post_norm_relu": (_encoder(", dropout=0.0, batch_first=True"), ENCODER_SIZES, 1),
    "encoder_pre_norm_gelu": (_encoder(", dropout=0.0, batch_first=True, norm_first=True, "
                                       "activation='gelu'"), ENCODER_SIZES, 1),
}
DECLINED_FORMS = {  # name: (task source, what the decline says)
    "sdpa_causal": (_sdpa("F.scaled_dot_product_attention(q, k, v, is_causal=True)"),
                    "scaled_dot_product_attention"),
    "sdpa_dropout": (_sdpa("F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)"),
                     "scaled_dot_product_attention"),
    # not self-attention with its weights unread, or not what the kernel computes: the
    # decline says which
    "mha_weights_read": (_mha("", _VIT_BODY.replace("attn_output, _ =", "attn_output, w =")
                              .replace("attn_output + x)", "attn_output + x) + w.mean()")),
                         "nn.MultiheadAttention with its attention weights read"),
    "mha_cross": (_mha("", _CROSS_BODY, ", y",
                       ", torch.rand(batch_size, embed_dim, image_height, image_width)"),
                  "nn.MultiheadAttention as cross-attention"),
    "mha_dropout": (_mha(", dropout=0.1", _VIT_BODY),
                    "nn.MultiheadAttention with attention dropout"),
    # torch returns a transposed view here, whose strides what follows keeps
    "mha_batch_first": (_mha(", batch_first=True",
                             _TOKENS_BODY.replace("permute(2, 0, 1)", "transpose(1, 2)")),
                        "nn.MultiheadAttention with batch_first=True"),
    "encoder_sequence_first": (_encoder(", dropout=0.0"),
                               "nn.TransformerEncoderLayer sequence-first"),
    "encoder_dropout": (_encoder(", dropout=0.1, batch_first=True"),
                        "nn.TransformerEncoderLayer with dropout"),
    "encoder_mask": (_encoder(", dropout=0.0, batch_first=True", ", src_mask=self.mask",
                              "        self.register_buffer('mask', torch.zeros(tokens + 1, "
                              "tokens + 1))\n"),
                     "nn.TransformerEncoderLayer called with a mask"),
    "encoder_tanh_gelu": (_encoder(", dropout=0.0, batch_first=True, "
                                   "activation=nn.GELU(approximate='tanh')"),
                          "nn.TransformerEncoderLayer with an activation other than"),
}


@pytest.fixture(scope="module")
def forms_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("attention_forms")
    for name, (source, *_) in {**FORMS, **DECLINED_FORMS}.items():
        (root / f"{name}.py").write_text(source)
    return root


def test_sdpa_is_the_scores_product_and_softmax_then_the_product_with_v(forms_dir):
    """Two kernels, k never copied: its transpose is the first product's B read in place."""
    analysis = OfflineSynthesizer("cpu").analyse(task_ctx(forms_dir, "sdpa"))
    first, second = (s.plan for s in analysis.plan.stages)
    assert first.kind == "row" and first.gemm.op == "bmm" and first.gemm.trans_b
    assert first.gemm.a_ndim == 4 and (first.gemm.a.name, first.gemm.b.name) == ("q", "k")
    assert second.gemm.op == "bmm" and not second.gemm.trans_b and second.gemm.b.name == "v"


def test_multihead_attention_is_the_projections_around_the_attention_kernel(forms_dir):
    """ViT's block: the input's view made by the forward, permuted to tokens, to batch-first,
    the packed projection, the attention kernel, back to sequence-first, the output projection
    with the residual and LayerNorm fused, and the task's own permuted view of that returned
    (no copy: the reference returns a view with those strides)."""
    pipe = OfflineSynthesizer("cpu").analyse(task_ctx(forms_dir, "mha_vit")).plan
    assert pipe.prelude == ("view0 = x.reshape(x.size(0), x.size(1), (x.size(2) * x.size(3)))",)
    kinds = [type(s.plan).__name__ for s in pipe.stages]
    assert kinds == ["Permute", "Permute", "Plan", "Attention", "Permute", "Plan"], kinds
    assert pipe.views[-1].startswith("{t}.permute(1, 2, 0).reshape("), pipe.views
    att = pipe.stages[3].plan
    assert (att.split, att.heads, att.act) == (16, 4, "softmax")
    assert att.scale == pytest.approx(0.5)


@pytest.mark.parametrize("name", ["encoder_post_norm_relu", "encoder_pre_norm_gelu"])
def test_encoder_layers_are_attention_feed_forward_and_norms(forms_dir, name):
    """Each layer's attention kernel between its projections; the class token expanded by
    the forward (``Pipeline.prelude``) for the concat kernel; the returned ``x[:, 0]`` a view
    of the last kernel's output, as the reference's is."""
    pipe = OfflineSynthesizer("cpu").analyse(task_ctx(forms_dir, name)).plan
    assert pipe.prelude == ("view0 = _attr(self, 'cls_token').expand(x.size(0), -1, -1)",)
    assert [type(s.plan).__name__ for s in pipe.stages].count("Attention") == 2
    assert pipe.views[-1] == "{t}[:, 0]"


@pytest.mark.parametrize("name", sorted(FORMS))
def test_written_attention_cpu_candidates_match_reference(forms_dir, tmp_path, name):
    """Every form translate makes (SDPA: its own GEMMs, and the library's under permissive)
    at two sizes; the reference of an encoder layer in eval mode is torch's fused path."""
    source, sizes, forms = FORMS[name]
    ctx = task_ctx(forms_dir, name)
    props = OfflineSynthesizer("cpu").translate(ctx, n=forms, rng=random.Random(0))
    assert len(props) == forms and all(p.code is not None for p in props), props[0].declined
    if name.startswith("sdpa"):
        assert [p.strategy for p in props] == ["tiling", "epilogue"]
    else:
        assert "assay_attention" in props[0].code
    for prop in props:
        assert_matches_reference(prop.code, tmp_path / f"cand_{prop.id}.py", ctx, sizes,
                                 seeds=(1, 2))


@pytest.mark.parametrize("name", sorted(DECLINED_FORMS))
def test_what_the_attention_kernels_do_not_compute_is_declined(forms_dir, name):
    prop = OfflineSynthesizer("cpu").translate(task_ctx(forms_dir, name), 1,
                                               random.Random(0))[0]
    assert prop.code is None and DECLINED_FORMS[name][1] in prop.declined, prop.declined


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_sdpa_cuda_source_compiles(forms_dir, tmp_path):
    prop = OfflineSynthesizer("cuda").translate(task_ctx(forms_dir, "sdpa", "cuda"), 1,
                                                random.Random(0))[0]
    assert prop.code is not None, prop.declined
    cand = import_file(prop.code, tmp_path / "cuda_sdpa.py")
    build_cuda_sources({source: "sdpa" for source in cand.SOURCES})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(FORMS))
def test_written_attention_cuda_candidates_match_reference(forms_dir, tmp_path, name):
    source, sizes, forms = FORMS[name]
    ctx = task_ctx(forms_dir, name, "cuda")
    for prop in OfflineSynthesizer("cuda").translate(ctx, n=forms, rng=random.Random(0)):
        assert prop.code is not None, prop.declined
        assert_matches_reference(prop.code, tmp_path / f"cuda_{prop.id}.py", ctx, sizes,
                                 "cuda", seeds=(1, 2))


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("level, stem, op", [
    ("level1", "97_ScaledDotProductAttention", "softmax"),
    ("level3", "31_VisionAttention", "attention"),
    ("level3", "32_ConvolutionalVisionTransformer", "attention")])
def test_kernelbench_written_attention_gets_a_plan(level, stem, op):
    path = KERNELBENCH.parent / level / f"{stem}.py"
    analysis = OfflineSynthesizer("cuda").analyse(TaskContext(Task.from_file(path), "cuda"))
    assert op in analysis.ops and len(analysis.plan.stages) > 1, analysis.summary
