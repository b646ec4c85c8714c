"""Mamba2 (KernelBench's L3_48 returning Y, L3_49 the final state) and what it needed: einops
calls traced (recorded as one node, rewritten into the reshapes, permutations and reductions
einops' recipe applies once shapes are known), ``torch.einsum`` of several operands lowered
into sums, broadcast multiplies and batched products (with torch's output layout), a
``masked_fill`` by a triangle of a bool ones matrix made in the forward, joins with zeros
(``torch.zeros_like`` parts, ``F.pad``) and a ``None`` default argument traced as None.

The rewrites are checked against einops and torch.einsum on the traced graph; small copies of
the KernelBench files (sizes edited down) are synthesized for the CPU, compared with the
reference and accepted by the verifier under strict; the CUDA candidate is compiled with nvcc;
KernelBench's own files get a plan. What the rewrites do not take is declined with its reason.
"""

from __future__ import annotations

import random
import re
import types

import einops
import pytest
import torch
from torch import nn

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.propose.offline.tracing import trace
from assay.propose.offline.ir import Unsupported
from assay.propose.offline.tensor_algebra import EINOPS_FUNCTIONS, EINSUMS
from assay.tasks.model import Task
from helpers import (KERNELBENCH as KB, assert_accepted_on_cpu, assert_matches_reference,
                     assert_translations_match_reference, build_cuda_candidates, small_copy,
                     task_ctx, translations)

pytestmark = pytest.mark.usefixtures("offline_builds")

KERNELBENCH = KB / "level3"
STEMS = {"y": "48_Mamba2ReturnY", "state": "49_Mamba2ReturnFinalState"}
# per copy: the module's sizes (odd where they may be; the sequence a multiple of the block)
SIZES = {
    "a": {"batch_size": 2, "seq_length": 12, "n_heads": 3, "d_head": 5, "d_state": 4,
          "block_len": 4},
    "b": {"batch_size": 3, "seq_length": 10, "n_heads": 2, "d_head": 7, "d_state": 3,
          "block_len": 5},
}
COPIES = {f"{which}_{size}": (STEMS[which], sizes)
          for which in STEMS for size, sizes in SIZES.items()}

needs_kernelbench = pytest.mark.skipif(not KERNELBENCH.is_dir(),
                                       reason="KernelBench checkout not present")


@pytest.fixture(scope="module")
def copies_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mamba")
    if KERNELBENCH.is_dir():
        for name, (stem, sizes) in COPIES.items():
            (root / f"{name}.py").write_text(small_copy(KERNELBENCH / f"{stem}.py", sizes))
    return root


def _module(forward, inputs: list[torch.Tensor]) -> types.SimpleNamespace:
    """A task module whose Model's forward is ``forward`` of the inputs (named x0, x1, ...:
    fx traces no ``*args``)."""
    names = ", ".join(f"x{i}" for i in range(len(inputs)))
    scope = {"forward": forward, "nn": nn}
    exec(f"class Model(nn.Module):\n    def forward(self, {names}):\n"  # noqa: S102
         f"        return forward({names})\n", scope)
    return types.SimpleNamespace(Model=scope["Model"], get_init_inputs=lambda: [],
                                 get_inputs=lambda: inputs)


def _traced_equals_eager(forward, *shapes: tuple[int, ...]) -> list:
    """Trace ``forward`` of random tensors of ``shapes``; the graph has no einops or einsum
    call left and computes what eager does, in values, shape and strides. Its nodes' targets."""
    torch.manual_seed(0)
    inputs = [torch.randn(*s) for s in shapes]
    gm = trace(_module(forward, inputs), real=True)
    targets = [n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert not [t for t in targets if t in EINSUMS or t in EINOPS_FUNCTIONS], targets
    got, want = gm(*inputs), forward(*inputs)
    assert got.shape == want.shape and got.stride() == want.stride(), (got.stride(),
                                                                       want.stride())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    return targets


EINSUMS_CHECKED = [
    # Mamba2's four, at other sizes
    ("bclhn,bcshn,bhcls,bcshp->bclhp",
     [(2, 3, 4, 5, 6), (2, 3, 4, 5, 6), (2, 5, 3, 4, 4), (2, 3, 4, 5, 7)]),
    ("bclhn,bhcl,bclhp->bchpn", [(2, 3, 4, 5, 6), (2, 5, 3, 4), (2, 3, 4, 5, 7)]),
    ("bhzc,bchpn->bzhpn", [(2, 3, 4, 5), (2, 5, 3, 6, 7)]),
    ("bclhn,bchpn,bhcl->bclhp", [(1, 2, 3, 4, 5), (1, 2, 4, 6, 5), (1, 4, 2, 3)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output
    ("ij,ij->i", [(3, 4), (3, 4)]),  # a dot product per row
    ("ij,kl->ijkl", [(3, 4), (2, 5)]),  # an outer product
    ("ijk->kj", [(3, 4, 5)]),  # one operand: a sum and a permutation
    ("bnk,bmk->bnm", [(2, 3, 4), (2, 5, 4)]),  # the second operand read transposed
    ("abc,cd,de->ae", [(2, 3, 4), (4, 5), (5, 6)]),  # a chain, b summed alone
    ("i,i->", [(7,), (7,)]),  # to a 0-d tensor
]


@pytest.mark.parametrize("equation,shapes", EINSUMS_CHECKED, ids=[e for e, _ in EINSUMS_CHECKED])
def test_einsum_is_lowered_into_products_as_torch_computes_it(equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    forward = eval(f"lambda {', '.join(names)}: torch.einsum({equation!r}, "  # noqa: S307
                   f"{', '.join(names)})", {"torch": torch})
    _traced_equals_eager(forward, *shapes)


def test_an_einsum_that_is_one_product_is_left_to_the_gemm_family():
    gm = trace(_module(lambda x, w: torch.einsum("bij,bjk->bik", x, w),
                       [torch.randn(2, 3, 4), torch.randn(2, 4, 5)]), real=True)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [torch.einsum]


REARRANGES = [
    (lambda x: einops.rearrange(x, "b (c l) h -> b h c l", l=3), (2, 6, 4)),
    (lambda x: einops.rearrange(x, "b (c l) ... -> b c l ...", l=3), (2, 6, 4, 5)),
    (lambda x: einops.rearrange(x, "b c l h p -> b (c l) h p"), (2, 3, 4, 5, 6)),
    (lambda x: einops.rearrange(x, "b c h w -> b (w h) c"), (2, 3, 4, 5)),
    (lambda x: einops.reduce(x, "b c (h h2) -> b h c", "max", h2=2), (2, 3, 8)),
    (lambda x: einops.reduce(x, "b c h -> b h", "mean"), (2, 6, 4)),
    (lambda x: einops.repeat(x, "b h -> b h r", r=3), (2, 6)),
    (lambda x: einops.rearrange(x, "b h -> b h"), (2, 6)),  # nothing to do
    # einops through its module, of einops' result
    (lambda x: einops.rearrange(einops.rearrange(x, "a (b c) -> c a b", c=2), "c a b -> a b c"),
     (3, 4)),
]


@pytest.mark.parametrize("k", range(len(REARRANGES)))
def test_einops_calls_are_traced_as_the_ops_einops_applies(k):
    forward, shape = REARRANGES[k]
    _traced_equals_eager(forward, shape)


@pytest.mark.parametrize("forward,shapes,reason", [
    (lambda x: torch.einsum("ii->i", x), [(3, 3)], "a subscript repeated within one operand"),
    (lambda x, y: torch.einsum("...ij,...jk->...ik", x, y), [(2, 3, 4), (2, 4, 5)],
     "an ellipsis"),
    (lambda x, y, z: torch.einsum("ij,jk,k->i", x, y, z), [(3, 1), (4, 5), (5,)],
     "subscript 'j' has sizes"),
    (lambda x: einops.reduce(x, "b c -> b", "any"), [(3, 4)], "with reduction 'any'"),
    # a callable reduction is no argument fx can record
    (lambda x: einops.reduce(x, "b c -> b", torch.logsumexp), [(3, 4)], "cannot trace"),
    (lambda x: einops.rearrange(x, "b (c l) -> b c l", l=5), [(2, 6)],
     "an einops call: Error while processing rearrange-reduction pattern"),
], ids=["diagonal", "ellipsis", "broadcast", "any_reduction", "callable_reduction",
        "indivisible"])
def test_what_the_rewrites_do_not_take_is_declined_with_its_reason(forward, shapes, reason):
    with pytest.raises(Unsupported, match=re.escape(reason)):
        trace(_module(forward, [torch.randn(*s) for s in shapes]), real=True)


def test_triangle_masks_zero_joins_and_none_defaults_trace_into_plain_ops():
    """masked_fill by the four triangle masks, a zeros_like part joined, F.pad of two dims, an
    ``is None`` branch on an argument get_inputs does not give."""
    class Model(nn.Module):
        def forward(self, x, state=None):
            n = x.size(-1)
            ones = torch.ones(n, n, device=x.device, dtype=bool)
            y = (x.masked_fill(~torch.tril(ones), -torch.inf)
                 + x.masked_fill(torch.tril(ones, diagonal=-1), 2.0)
                 + x.masked_fill(~torch.triu(ones, 1), 0.5)
                 + x.masked_fill(ones.triu(), -1.0))
            if state is None:
                state = torch.zeros_like(y[:, :1])
            return torch.nn.functional.pad(torch.cat([state, y], dim=1), (1, 2, 0, 1))

    inputs = [torch.randn(2, 3, 4, 4)]
    mod = types.SimpleNamespace(Model=Model, get_init_inputs=lambda: [],
                                get_inputs=lambda: inputs)
    gm = trace(mod, real=True)
    names = [str(getattr(n.target, "__name__", n.target)) for n in gm.graph.nodes]
    assert "masked_fill" not in names and "ones" not in names and "pad" not in names, names
    assert names.count("triangle_fill") == 4 and "zero_padded_cat" in names, names
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == 1
    with torch.no_grad():
        torch.testing.assert_close(gm(*inputs), Model()(*inputs))


_EINSUM_TASK = """import torch
import torch.nn as nn
from einops import rearrange


class Model(nn.Module):
    def __init__(self, block, dim):
        super().__init__()
        self.block = block
        self.w = nn.Parameter(torch.randn(dim, 5))

    def forward(self, x, v):
        xb = rearrange(x, "b (c l) h -> b c l h", l=self.block)
        y = torch.einsum("bclh,bhc,hp->bclp", xb, v, self.w)
        return rearrange(y, "b c l p -> b (c l) p")


def get_inputs():
    return [torch.randn(2, 12, 3), torch.randn(2, 3, 4)]


def get_init_inputs():
    return [3, 3]
"""

_TRANSPOSED_PRODUCT = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, 16))

    def forward(self, x):
        return torch.einsum("ij,jk->ki", x, self.w)


batch = 5


def get_inputs():
    return [torch.randn(batch, 7)]


def get_init_inputs():
    return [7]
"""


@pytest.mark.parametrize("name,source,others", [
    ("einsum_task", _EINSUM_TASK, []),
    # no reshape: a candidate for every batch
    ("transposed_product", _TRANSPOSED_PRODUCT, [{"batch": 3}]),
])
def test_einsum_and_einops_tasks_are_accepted_by_the_cpu_verifier(tmp_path, name, source,
                                                                  others):
    (tmp_path / f"{name}.py").write_text(source)
    ctx = task_ctx(tmp_path, name)
    prop = OfflineSynthesizer("cpu", policy="strict").translate(ctx, n=1,
                                                                rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert "einsum" not in prop.code.split("class ModelNew")[1]
    assert_matches_reference(prop.code, tmp_path / f"cand_{name}.py", ctx, [{}] + others)
    assert_accepted_on_cpu(ctx, prop.code, tmp_path / f"verified_{name}.py")


def test_a_random_state_drawn_for_a_none_argument_is_declined():
    """L3_35's form: the state a forward draws when it is not given one is random."""
    class Model(nn.Module):
        def forward(self, x, h0=None):
            if h0 is None:
                h0 = torch.randn(x.size(0), x.size(1), device=x.device)
            return x + h0

    inputs = [torch.randn(2, 3)]
    mod = types.SimpleNamespace(Model=Model, get_init_inputs=lambda: [],
                                get_inputs=lambda: inputs)
    with pytest.raises(Unsupported, match=re.escape("a random tensor made in the forward "
                                                    "(torch.randn")):
        trace(mod, real=True)


@needs_kernelbench
@pytest.mark.parametrize("name", sorted(COPIES))
def test_cpu_candidate_matches_reference_and_the_verifier_accepts_it(
        copies_dir, tmp_path, name):
    ctx = task_ctx(copies_dir, name)
    syn = OfflineSynthesizer("cpu", policy="strict")
    analysis = syn.analyse(ctx)
    kinds = {type(s.plan).__name__ for s in analysis.plan.stages}
    assert {"Permute", "Concat"} <= kinds, kinds  # einsum's layouts, the zeros joined
    assert {"bmm", "cumsum", "triangle_fill", "cat"} <= set(analysis.ops), analysis.ops
    prop = syn.translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert 'POLICY = "strict"' in prop.code
    assert_matches_reference(prop.code, tmp_path / f"cand_{name}.py", ctx, [{}], seeds=(1, 2))
    assert_accepted_on_cpu(ctx, prop.code, tmp_path / f"verified_{name}.py")


@needs_kernelbench
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_sources_compile(copies_dir, tmp_path):
    build_cuda_candidates(translations(copies_dir, ("y_a", "state_a")), tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@needs_kernelbench
@pytest.mark.parametrize("name", sorted(COPIES))
def test_cuda_candidates_match_reference(copies_dir, tmp_path, name):
    """On a GPU: the CUDA candidates (strict and permissive) equal the reference."""
    ctx = task_ctx(copies_dir, name, "cuda")
    assert_translations_match_reference(ctx, [{}], tmp_path)


@needs_kernelbench
@pytest.mark.parametrize("stem", sorted(STEMS.values()))
def test_kernelbench_mamba_tasks_get_a_plan(stem):
    analysis = OfflineSynthesizer("cuda").analyse(
        TaskContext(Task.from_file(KERNELBENCH / f"{stem}.py"), "cuda"))
    assert {"bmm", "cumsum", "triangle_fill", "cat"} <= set(analysis.ops), analysis.summary
