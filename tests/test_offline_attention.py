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
from assay.propose.offline.tracing import trace
from assay.propose.offline.own_kernels import packed_attention
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
from conftest import import_file
from helpers import (KERNELBENCH as KB, assert_matches_reference,
                     assert_translations_match_reference, build_cuda_candidates,
                     build_cuda_sources, task_ctx)

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
    codes = {}
    for name, knobs in (("causal_softmax", {"s1.rows": 4}), ("causal_relu", {"s1.rows": 1}),
                        ("causal_softmax", {"s1.tile": 1}), ("causal_relu", {"s1.tile": 1})):
        prop = syn.with_knobs(task_ctx(task_dir, name, "cuda"), knobs)
        assert prop.code is not None, prop.declined
        codes[f"{name}_{'_'.join(f'{k}{v}' for k, v in knobs.items())}"] = prop.code
    build_cuda_candidates(codes, tmp_path)


KERNELBENCH = KB / "level3"


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

_STACK = """import torch
import torch.nn as nn

batch_size, tokens, embed_dim = 2, 5, 16


class Model(nn.Module):
    def __init__(self, embed_dim):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=embed_dim, nhead=2,
                                           dim_feedforward=3 * embed_dim, dropout=0.0,
                                           activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, num_layers=3,
                                             norm=nn.LayerNorm(embed_dim))
{init}
    def forward(self, x):
        return self.encoder(src=torch.tanh(x){call}) * 2.0


def get_inputs():
    return [torch.rand(batch_size, tokens, embed_dim)]


def get_init_inputs():
    return [embed_dim]
"""


def _stack(call: str = "", init: str = "") -> str:
    return _STACK.format(call=f", {call}" if call else "", init=init)


# KernelBench's L3_28 (its module and forward as they are) with the sizes edited down: 12 x 12
# images of 4 x 4 patches, 2 layers of width 16. Sequence-first, its attention runs across the
# batch: x[:, 0] (the class token's row) does not depend on the image, a degenerate task that
# the verifier flags; the candidate must compute it all the same.
VIT_SMALL = """import torch
import torch.nn as nn

image_size, patch_size, num_classes, dim, depth, heads, mlp_dim = 12, 4, 10, 16, 2, 4, 24
channels, dropout, emb_dropout, batch_size = 3, 0.0, 0.0, 2


class Model(nn.Module):
    def __init__(self, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 channels=3, dropout=0.1, emb_dropout=0.1):
        super(Model, self).__init__()
        num_patches = (image_size // patch_size) ** 2
        patch_dim = channels * patch_size ** 2
        self.patch_size = patch_size
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.patch_to_embedding = nn.Linear(patch_dim, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model=dim, nhead=heads, dim_feedforward=mlp_dim,
                                       dropout=dropout),
            num_layers=depth
        )
        self.to_cls_token = nn.Identity()
        self.mlp_head = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, num_classes)
        )

    def forward(self, img):
        p = self.patch_size
        x = img.unfold(2, p, p).unfold(3, p, p).reshape(img.shape[0], -1, p*p*img.shape[1])
        x = self.patch_to_embedding(x)
        cls_tokens = self.cls_token.expand(img.shape[0], -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x += self.pos_embedding
        x = self.dropout(x)
        x = self.transformer(x)
        x = self.to_cls_token(x[:, 0])
        return self.mlp_head(x)


def get_inputs():
    return [torch.rand(batch_size, channels, image_size, image_size)]


def get_init_inputs():
    return [image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dropout,
            emb_dropout]
"""
# other batch and image sizes (the patch count follows)
VIT_SIZES = [{}, {"batch_size": 3, "image_size": 8}]


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
    # sequence-first ([S, N, E], attention over dim 0): between transposes, x[:, 0] a view of
    # the contiguous result, as torch's
    "encoder_sequence_first": (_encoder(", dropout=0.0"), ENCODER_SIZES, 1),
    # nn.TransformerEncoder: its layers (sequence-first, transposed once in and once out) and
    # its final norm
    "encoder_stack_sequence_first": (_stack(), ENCODER_SIZES, 1),
    # KernelBench's L3_28 at a small size: patches by unfold, the class token joined, the
    # sequence-first encoder stack, the MLP head
    "vision_transformer": (VIT_SMALL, VIT_SIZES, 1),
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
    "encoder_stack_mask": (_stack("mask=self.mask",
                                  "        self.register_buffer('mask', torch.zeros(batch_size, "
                                  "batch_size))\n"),
                           "nn.TransformerEncoder called with a mask"),
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


def test_a_sequence_first_stack_is_transposed_once_in_and_once_out(forms_dir):
    """nn.TransformerEncoder's three sequence-first layers run batch-first: one transpose
    (a copy) before the first, one after the final norm; none between the layers."""
    pipe = OfflineSynthesizer("cpu").analyse(task_ctx(forms_dir,
                                                      "encoder_stack_sequence_first")).plan
    kinds = [type(s.plan).__name__ for s in pipe.stages]
    assert kinds.count("Attention") == 3 and kinds.count("Permute") == 2, kinds
    assert kinds[1] == "Permute" and kinds[-2] == "Permute", kinds
    assert "layer_norm" in pipe.stages[-3].ops  # the encoder's norm, before the transpose


def test_vision_transformer_patches_are_one_copy_of_the_unfolded_view(forms_dir):
    """L3_28's patches: the two unfolds of the image one strided view, copied by one kernel,
    its reshape a view of the copy; the class token expanded by the forward for the join."""
    pipe = OfflineSynthesizer("cpu").analyse(task_ctx(forms_dir, "vision_transformer")).plan
    first = pipe.stages[0]
    assert type(first.plan).__name__ == "Permute" and first.ops == ("unfold",)
    assert first.plan.view == ".unfold(2, 4, 4).unfold(3, 4, 4)"
    assert pipe.views[0] == "{t}.reshape(img.size(0), -1, (16 * img.size(1)))", pipe.views
    assert pipe.prelude == ("view0 = _attr(self, 'cls_token').expand(img.size(0), -1, -1)",)
    assert [type(s.plan).__name__ for s in pipe.stages].count("Attention") == 2


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


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_vision_transformer_cuda_sources_compile(forms_dir, tmp_path):
    """Every kernel of the small L3_28's CUDA candidate (the unfolded patches' copy, the
    transposes, attention, GEMMs, norms, the join) builds with nvcc."""
    prop = OfflineSynthesizer("cuda").translate(task_ctx(forms_dir, "vision_transformer",
                                                         "cuda"), 1, random.Random(0))[0]
    assert prop.code is not None, prop.declined
    cand = import_file(prop.code, tmp_path / "cuda_vit.py")
    build_cuda_sources({source: "vision_transformer" for source in cand.SOURCES})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", sorted(FORMS))
def test_written_attention_cuda_candidates_match_reference(forms_dir, tmp_path, name):
    _, sizes, forms = FORMS[name]
    assert_translations_match_reference(task_ctx(forms_dir, name, "cuda"), sizes, tmp_path,
                                        n=forms)


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("level, stem, op", [
    ("level1", "97_ScaledDotProductAttention", "softmax"),
    ("level3", "31_VisionAttention", "attention"),
    ("level3", "32_ConvolutionalVisionTransformer", "attention"),
    ("level3", "28_VisionTransformer", "unfold")])
def test_kernelbench_written_attention_gets_a_plan(level, stem, op):
    path = KERNELBENCH.parent / level / f"{stem}.py"
    analysis = OfflineSynthesizer("cuda").analyse(TaskContext(Task.from_file(path), "cuda"))
    assert op in analysis.ops and len(analysis.plan.stages) > 1, analysis.summary
