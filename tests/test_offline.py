"""The offline synthesizer: recognition, declines, candidate correctness (cpu) and CUDA builds.

CPU candidates are compiled with g++, run on random inputs at several shapes (one of them not a
multiple of 4) and compared with the reference; CUDA candidates are only compiled (nvcc, no
GPU needed). Every build goes to a temporary kernel cache.
"""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
import torch

from assay.bench.build import build, nvcc_path
from assay.propose.base import Parent, TaskContext
from assay.propose.offline import KNOB_SPACES, OfflineSynthesizer
from assay.records import Proposal
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task
from conftest import import_file
from helpers import REPO, assert_matches_reference, build_cuda_sources, entry_arities

# ---------------------------------------------------------------------------------------------
# Tiny tasks in KernelBench format. Each takes `dim` as its init input and one (batch, dim)
# input unless it says otherwise; the tests override `batch` and `dim` to try other shapes.

_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
_FOOTER = """
batch = 8
dim = 1030
ASSAY_SIZES = {"small": {"batch": 3, "dim": 7}}


def get_inputs():
    return [%s]


def get_init_inputs():
    return [dim]
"""

TASKS = {
    "relu": ("", "return torch.relu(x)"),
    "gelu_scale": ("", "return F.gelu(x) * 2.5"),
    "tanh_xy": ("", "return torch.tanh(x) * x + y"),
    "act_modules": ("self.act = nn.LeakyReLU(0.2)\nself.ht = nn.Hardtanh(-0.5, 0.7)\n"
                    "self.g = nn.GELU(approximate='tanh')",
                    "return self.act(x) + self.ht(x) * torch.sigmoid(x) - self.g(x) "
                    "+ F.silu(x) + torch.clamp(x, min=-0.2) + x ** 2 / 3.0"),
    "bias_relu": ("self.bias = nn.Parameter(torch.randn(dim))",
                  "return torch.relu(x + self.bias)"),
    "sum_last": ("", "return torch.sum(x, dim=-1)"),
    "mean_keep": ("", "return x.mean(dim=1, keepdim=True)"),
    "max_chain": ("", "return torch.max(torch.exp(x * 0.5), dim=-1)[0]"),
    "softmax": ("", "return torch.softmax(x, dim=1)"),
    # a constant made on the input's device (level 2, 83 and 93)
    "min_tensor_const": ("", "return torch.min(x, torch.tensor(0.25, device=x.device)) * 2.0"),
    "tensor_const_nodevice": ("", "return x * torch.tensor(2.0)"),
    # triangles (KernelBench level 1, 14 and 15): masks from the element's row and column
    "triu_relu": ("", "return torch.relu(torch.triu(x, 1)) - 0.5"),
    "tril_softmax": ("", "return torch.softmax(torch.tril(x, diagonal=-2), dim=1)"),
    "log_softmax": ("", "return F.log_softmax(x, dim=-1)"),
    "layernorm": ("self.ln = nn.LayerNorm(dim)", "return self.ln(x)"),
    "rmsnorm": ("self.eps = 1e-6\nself.weight = nn.Parameter(torch.ones(dim))",
                "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) "
                "* self.weight"),
    # declined (a transposed output, 'ij,jk->ki', is a product and a permutation:
    # tests/test_offline_mamba.py)
    "einsum": ("self.w = nn.Parameter(torch.randn(dim, 16))",
               "return torch.einsum('...j,jk->...k', x, self.w)"),  # an ellipsis
    "half_relu": ("", "return torch.relu(x)"),
    "transpose_add": ("", "return x.T + 1.0"),
    "triu_broadcast": ("self.w = nn.Parameter(torch.randn(1, dim))",
                       "return torch.triu(self.w) + x"),
    "tensor_list": ("", "return x + torch.tensor([0.5], device=x.device)"),
    "tensor_int": ("", "return torch.max(x, torch.tensor(0)) - x"),
    "unknown_op": ("", "return torch.cdist(x, x)"),
}
TWO_INPUTS = {"tanh_xy"}
DECLINED = ("einsum", "half_relu", "transpose_add", "unknown_op", "triu_broadcast",
            "tensor_list", "tensor_int")
SUPPORTED = [name for name in TASKS if name not in DECLINED]
ROW_TASKS = {"sum_last", "mean_keep", "max_chain", "softmax", "log_softmax", "layernorm",
             "tril_softmax",
             "rmsnorm"}
# (batch, dim): dims that are not a multiple of 4 or 2 exercise the scalar paths.
SHAPES = [(3, 7), (5, 1030), (4, 64)]
LOOSE = {"softmax", "log_softmax", "layernorm", "rmsnorm", "sum_last", "mean_keep"}


def _task_source(name: str) -> str:
    init, body = TASKS[name]
    args = "x, y" if name in TWO_INPUTS else "x"
    init_lines = textwrap.indent(init, " " * 8) if init else " " * 8 + "pass"
    inputs = "torch.randn(batch, dim)"
    if name in TWO_INPUTS:
        inputs = "torch.randn(batch, dim), torch.randn(batch, dim)"
    if name == "half_relu":
        inputs = "torch.randn(batch, dim).half()"
    return (_HEADER
            + "class Model(nn.Module):\n"
            + "    def __init__(self, dim):\n"
            + "        super(Model, self).__init__()\n"
            + init_lines + "\n\n"
            + f"    def forward(self, {args}):\n"
            + f"        {body}\n"
            + _FOOTER % inputs)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_task_source(name))
    return root


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(autouse=True)
def _env(monkeypatch, kernel_cache):
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(kernel_cache))
    monkeypatch.setenv("ASSAY_CUDA_ARCH", "sm_90")


def _ctx(task_dir: Path, name: str, target: str = "cpu", size: str = "large") -> TaskContext:
    return TaskContext(Task.from_file(task_dir / f"{name}.py", size=size), target=target)


_import = import_file


def _check_candidate(prop: Proposal, ctx: TaskContext, tmp_path: Path, loose: bool,
                     device: str = "cpu", shapes: list[tuple[int, int]] = SHAPES) -> None:
    """The candidate's ModelNew equals the reference at every shape in ``shapes``."""
    cand = _import(prop.code, tmp_path / f"cand_{prop.id}.py")
    tol = dict(rtol=2e-5, atol=2e-5) if loose else dict(rtol=1e-5, atol=1e-5)
    for batch, dim in shapes:
        mod = ctx.task.module()
        mod.batch, mod.dim = batch, dim  # get_inputs/get_init_inputs read these at call time
        ref = reference_model(mod, seed=0, device=device)
        with seeded(0):
            new = cand.ModelNew(*mod.get_init_inputs())
        new.to(device).eval()
        new.load_state_dict(ref.state_dict())
        for seed, dist in ((1, "native"), (2, "large")):
            inputs = make_inputs(mod, seed=seed, device=device, distribution=dist)
            with torch.no_grad():
                expected, got = ref(*inputs), new(*inputs)
            assert got.shape == expected.shape, (batch, dim)
            assert got.stride() == expected.stride(), (batch, dim)
            assert got.dtype == expected.dtype
            torch.testing.assert_close(got, expected, **tol)


# ---------------------------------------------------------------------------------------------
# cpu target: compiled and compared with the reference


@pytest.mark.parametrize("name", SUPPORTED)
def test_cpu_candidates_match_reference(task_dir, tmp_path, name):
    ctx = _ctx(task_dir, name)
    props = OfflineSynthesizer("cpu").translate(ctx, n=2, rng=random.Random(0))
    assert len(props) == 2
    assert len({p.id for p in props}) == 2  # distinct knobs, distinct code
    for prop in props:
        assert prop.code is not None, prop.declined
        assert prop.operator == "translate" and prop.parents == []
        assert prop.strategy == ("rowreduce" if name in ROW_TASKS else
                                 "vectorize" if name in ("relu", "tensor_const_nodevice")
                                 else "fusion")
        assert set(prop.knobs) == set(KNOB_SPACES[("cpu", "row" if name in ROW_TASKS
                                                   else "elementwise")])
        _check_candidate(prop, ctx, tmp_path, loose=name in LOOSE)


def test_candidate_never_calls_the_replaced_op(task_dir):
    ctx = _ctx(task_dir, "softmax")
    code = OfflineSynthesizer("cpu").translate(ctx, n=1, rng=random.Random(0))[0].code
    # Model.forward is stripped from the copied task code: ModelNew's forward is the only one.
    assert code.count("def forward") == 1
    assert "softmax(" not in code.split("class ModelNew")[1]
    assert "softmax(" not in code.split("SOURCE =")[0]
    for name in ("layernorm", "gelu_scale"):
        code = OfflineSynthesizer("cpu").translate(_ctx(task_dir, name), 1,
                                                   random.Random(0))[0].code
        forward = code.split("class ModelNew")[1]
        assert "self.ln(" not in forward and "gelu(" not in forward
        assert "_lib().assay_forward(" in forward


def test_size_generic_across_task_sizes(task_dir, tmp_path):
    """A candidate written for the large size runs the small size (and vice versa)."""
    large = _ctx(task_dir, "layernorm", size="large")
    small = _ctx(task_dir, "layernorm", size="small")
    syn = OfflineSynthesizer("cpu")
    code_large = syn.translate(large, 1, random.Random(0))[0].code
    cand = _import(code_large, tmp_path / "cand_generic.py")
    mod = small.task.module()
    ref = reference_model(mod, seed=0, device="cpu")
    with seeded(0):
        new = cand.ModelNew(*mod.get_init_inputs())
    new.load_state_dict(ref.state_dict())
    (x,) = make_inputs(mod, seed=5, device="cpu")
    torch.testing.assert_close(new(x), ref(x), rtol=2e-5, atol=2e-5)


def test_non_contiguous_input_is_handled(task_dir, tmp_path):
    ctx = _ctx(task_dir, "tanh_xy")
    prop = OfflineSynthesizer("cpu").translate(ctx, 1, random.Random(0))[0]
    cand = _import(prop.code, tmp_path / "cand_strided.py")
    new = cand.ModelNew(9)
    x = torch.randn(9, 6).t()  # (6, 9), not contiguous
    y = torch.randn(6, 9)
    torch.testing.assert_close(new(x, y), torch.tanh(x) * x + y, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shape mismatch"):
        new(torch.randn(6, 9), torch.randn(6, 8))


# ---------------------------------------------------------------------------------------------
# declines


@pytest.mark.parametrize("name, reason", [
    ("einsum", "an ellipsis ('...'; write the subscripts out)"),
    ("half_relu", "float16"),
    ("transpose_add", ".T other than as a matmul's operand"),
    ("triu_broadcast", "triu/tril of a tensor broadcast against others"),
    ("tensor_list", "torch.tensor of list data"),
    ("tensor_int", "a tensor constant made in forward (shape [], int64)"),
])
def test_unsupported_tasks_are_declined(task_dir, name, reason):
    syn = OfflineSynthesizer("cpu")
    ctx = _ctx(task_dir, name)
    props = syn.translate(ctx, n=3, rng=random.Random(0))
    assert len(props) == 1
    assert props[0].code is None and props[0].id is None
    assert reason in props[0].declined
    assert props[0].declined.startswith("offline synthesizer v1 cannot express")
    parent = Parent("c000000000000", "x = 1", {}, {})
    for got in (syn.mutate(ctx, parent, 2, random.Random(0)),
                syn.crossover(ctx, [parent, parent], random.Random(0)),
                syn.repair(ctx, parent, random.Random(0))):
        assert got[0].code is None and reason in got[0].declined


def test_unknown_op_decline_names_the_op(task_dir):
    prop = OfflineSynthesizer("cuda").translate(_ctx(task_dir, "unknown_op", "cuda"), 1,
                                                random.Random(0))[0]
    assert prop.declined == ("offline synthesizer v1 cannot express torch.functional.cdist "
                             "(op not in the v1 table)")


# ---------------------------------------------------------------------------------------------
# the evolution operators


def _parent(prop: Proposal, with_meta: bool = True) -> Parent:
    meta = {"knobs": prop.knobs} if with_meta else {}
    return Parent(prop.id, prop.code, {"accepted": True}, meta)


def test_translate_is_deterministic_and_defaults_first(task_dir):
    ctx = _ctx(task_dir, "softmax")
    a = OfflineSynthesizer("cpu").translate(ctx, 4, random.Random(7))
    b = OfflineSynthesizer("cpu").translate(ctx, 4, random.Random(7))
    assert [p.code for p in a] == [p.code for p in b]
    assert len({p.id for p in a}) == 4
    repaired = OfflineSynthesizer("cpu").repair(ctx, _parent(a[1]), random.Random(0))[0]
    assert repaired.knobs == a[0].knobs  # repair returns the default form


def test_mutate_crossover_repair(task_dir, tmp_path):
    ctx = _ctx(task_dir, "gelu_scale")
    syn = OfflineSynthesizer("cpu")
    base, other = syn.translate(ctx, 2, random.Random(3))
    space = KNOB_SPACES[("cpu", "elementwise")]

    children = syn.mutate(ctx, _parent(base), 3, random.Random(1))
    assert len(children) == 3
    ids = {c.id for c in children}
    assert len(ids) == 3 and base.id not in ids
    for child in children:
        assert child.operator == "mutate" and child.parents == [base.id]
        changed = [k for k in space if child.knobs[k] != base.knobs[k]]
        assert 1 <= len(changed) <= 2
    # A parent without knobs in its record: they are read back from its KNOBS line.
    again = syn.mutate(ctx, _parent(base, with_meta=False), 3, random.Random(1))
    assert [c.id for c in again] == [c.id for c in children]

    (child,) = syn.crossover(ctx, [_parent(base), _parent(other)], random.Random(5))
    assert child.operator == "crossover" and child.parents == [base.id, other.id]
    assert all(child.knobs[k] in (base.knobs[k], other.knobs[k]) for k in space)
    assert child.id not in (base.id, other.id)

    (fixed,) = syn.repair(ctx, _parent(other), random.Random(0))
    assert fixed.operator == "repair" and fixed.parents == [other.id]
    assert fixed.knobs == base.knobs  # translate's first candidate has the default knobs
    (safest,) = syn.repair(ctx, _parent(base), random.Random(0))
    assert safest.knobs != base.knobs and safest.knobs["threads"] == 1

    for prop in children[:1] + [child, safest]:
        _check_candidate(prop, ctx, tmp_path, loose=False)


def test_crossover_of_identical_parents_still_moves(task_dir):
    ctx = _ctx(task_dir, "relu")
    syn = OfflineSynthesizer("cpu")
    (base,) = syn.translate(ctx, 1, random.Random(0))
    (child,) = syn.crossover(ctx, [_parent(base), _parent(base)], random.Random(0))
    assert child.code is not None and child.id != base.id
    assert child.parents == [base.id, base.id]


def test_target_is_validated():
    with pytest.raises(ValueError):
        OfflineSynthesizer("tpu")


# ---------------------------------------------------------------------------------------------
# cuda target: generated for the same tasks and compiled with nvcc (nothing runs here)

_HAS_NVCC = nvcc_path() is not None


@pytest.mark.skipif(not _HAS_NVCC, reason="nvcc is not installed")
def test_cuda_candidates_compile(task_dir, tmp_path):
    syn = OfflineSynthesizer("cuda")
    sources = {}
    for name in SUPPORTED:
        # Two candidates at the large size (1030 columns: a block per row by default), the
        # default at the small size (7 columns: a warp per row).
        # Plus the repair of the default: the safest form (scalar loads, persistent grid).
        ctx = _ctx(task_dir, name, "cuda")
        props = syn.translate(ctx, n=2, rng=random.Random(0))
        props += syn.translate(_ctx(task_dir, name, "cuda", "small"), n=1, rng=random.Random(0))
        props += syn.repair(ctx, _parent(props[0]), random.Random(0))
        for prop in props:
            assert prop.code is not None, (name, prop.declined)
            cand = _import(prop.code, tmp_path / f"cuda_{prop.id}.py")  # import builds nothing
            assert cand.LANG == "cuda" and cand.KNOBS == prop.knobs
            assert "__shfl_xor_sync" in cand.SOURCE or name not in ROW_TASKS
            # launch errors are returned (row kernels launch through cudaLaunchKernelEx)
            assert ("cudaGetLastError" in cand.SOURCE
                    or "return (int)cudaLaunchKernelEx" in cand.SOURCE)
            assert "cuda_stream" in prop.code
            sources.setdefault(cand.SOURCE, (name, tuple(sorted(prop.knobs.items()))))
        if name in ROW_TASKS:  # a cluster of blocks per row; rows in registers
            for knobs in ({"warp_per_row": 0, "split": 4}, {"warp_per_row": 0, "regs": 4}):
                prop = syn.with_knobs(ctx, knobs)
                sources.setdefault(_import(prop.code, tmp_path / f"cuda_{prop.id}.py").SOURCE,
                                   (name, tuple(sorted(prop.knobs.items()))))
    # Both row layouts (a warp per row, a block per row) and every vector width get built.
    row = [k for k in sources.values() if k[0] in ROW_TASKS]
    assert {dict(k[1])["warp_per_row"] for k in row} == {0, 1}
    assert {dict(k[1])["cache_row"] for k in row} == {0, 1}
    assert len({dict(k[1])["split"] for k in row}) > 1  # one block per row, and clusters
    assert len({dict(k[1])["regs"] for k in row}) > 1  # strided loops, and rows in registers
    assert {dict(k[1])["vec"] for k in sources.values()} >= {1, 4}
    assert {dict(k[1])["persistent"] for k in sources.values()
            if k[0] not in ROW_TASKS} == {0, 1}

    build_cuda_sources(sources)


def test_with_knobs_refuses_knobs_outside_the_space(task_dir):
    syn = OfflineSynthesizer("cuda")
    ctx = _ctx(task_dir, "layernorm", "cuda")
    assert syn.with_knobs(ctx, {"split": 2}).knobs["split"] == 2
    with pytest.raises(ValueError, match=r"split=3 \(allowed: 1, 2, 4, 8\)"):
        syn.with_knobs(ctx, {"split": 3})
    with pytest.raises(ValueError, match="tile_m=64 .allowed: none"):  # a GEMM knob, row task
        syn.with_knobs(ctx, {"tile_m": 64})


def test_probe_sweeps_name_knobs_inside_the_space():
    """benchmarks/probe_gpu.py's sweep and ncu knob sets are all in their templates' spaces:
    checked here, not found out on the GPU lease."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("probe_gpu", REPO / "benchmarks" / "probe_gpu.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    syn = OfflineSynthesizer("cuda")
    sets = [(path, k) for sweep in probe.SWEEPS.values() for path, ks in sweep.items()
            for k in ks] + list(probe.NCU.items())
    for path, knobs in sets:
        ctx = TaskContext(Task.from_file(REPO / path, size="large"), target="cuda")
        assert syn.with_knobs(ctx, knobs).code is not None, (path, knobs)
    assert len(sets) > 60


def test_cuda_mutation_changes_the_source(task_dir):
    ctx = _ctx(task_dir, "layernorm", "cuda")
    syn = OfflineSynthesizer("cuda")
    (base,) = syn.translate(ctx, 1, random.Random(0))
    assert base.knobs == {"block": 256, "vec": 4, "warp_per_row": 0, "cache_row": 1,
                          "split": 1, "regs": 0}  # 1030 cols: 2 vectors a thread
    small = syn.translate(_ctx(task_dir, "layernorm", "cuda", size="small"), 1,
                          random.Random(0))[0]
    assert small.knobs["warp_per_row"] == 1  # 7 columns: a warp per row
    children = syn.mutate(ctx, _parent(base), 4, random.Random(0))
    sources = {c.code.split("SOURCE = ")[1] for c in children + [base]}
    assert len(sources) == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SUPPORTED)
def test_cuda_candidates_match_reference(task_dir, tmp_path, name):
    """On a GPU: translate, mutate and repair candidates all equal the reference."""
    ctx = _ctx(task_dir, name, "cuda")
    syn = OfflineSynthesizer("cuda")
    props = syn.translate(ctx, n=3, rng=random.Random(0))
    props += syn.mutate(ctx, _parent(props[0]), 2, random.Random(1))
    props += syn.repair(ctx, _parent(props[0]), random.Random(2))  # the safest form
    if name in ROW_TASKS:  # clusters of 2 and 8 blocks per row, with and without the row cache
        for split, cache, vec in ((2, 1, 4), (8, 0, 1), (8, 1, 2)):
            props.append(syn.with_knobs(ctx, {"warp_per_row": 0, "split": split,
                                              "cache_row": cache, "vec": vec}))
        # Rows in registers: 33 x 4096 fits 4 vectors of 256 threads, 2 x 20000 does not (the
        # strided form runs); a warp per row of 16 vectors; clusters, scalar vectors.
        for knobs in ({"warp_per_row": 0, "regs": 4, "block": 256, "vec": 4},
                      {"warp_per_row": 1, "regs": 16, "vec": 4},
                      {"warp_per_row": 0, "regs": 8, "split": 2, "vec": 1}):
            props.append(syn.with_knobs(ctx, knobs))
    shapes = SHAPES + [(33, 4096), (2, 20000), (1024, 32)]
    for prop in props:
        _check_candidate(prop, ctx, tmp_path, loose=name in LOOSE, device="cuda",
                         shapes=shapes)


# ---------------------------------------------------------------------------------------------
# Products: the tiled GEMM or the convolution kernel with a fused epilogue (strict), the library
# GEMM or convolution plus one epilogue kernel (permissive), the tensor-core GEMM
# (float16/bfloat16, cuda only).
# Each task reads its sizes from module globals; the tests try several (tile edges, K slabs,
# sizes that rule out vector loads).

# BatchNorm in eval mode, as a task may ask (KernelBench's stay in training mode: batch
# statistics, tests/test_offline_stages.py "bn_training"): its running statistics, an affine
_RANDOM_STATS = ("with torch.no_grad():\n    {m}.running_mean.uniform_(-1.0, 1.0)\n"
                 "    {m}.running_var.uniform_(0.5, 2.0)\n    {m}.weight.uniform_(0.5, 2.0)\n"
                 "    {m}.bias.uniform_(-0.5, 0.5)\n{m}.eval()")

_GEMM_FOOTER = """

def get_inputs():
    return [%s]


def get_init_inputs():
    return [%s]
"""

GEMM_TASKS = {
    # name: (init args, init body, forward args, forward body, inputs, sizes)
    "linear_relu": ("k, n", "self.linear = nn.Linear(k, n)", "x",
                    "return torch.relu(self.linear(x))", "torch.randn(m, k)",
                    {"m": 40, "k": 72, "n": 48}),
    "linear3d_gelu": ("k, n", "self.fc = nn.Linear(k, n)", "x",
                      "return F.gelu(self.fc(x), approximate='tanh') * 1.5",
                      "torch.randn(b, m, k)", {"b": 2, "m": 9, "k": 20, "n": 12}),
    "matmul_bias_sigmoid": ("k, n", "self.w = nn.Parameter(torch.randn(k, n) / k ** 0.5)\n"
                            "self.b = nn.Parameter(torch.randn(n))", "x",
                            "return torch.sigmoid(x @ self.w + self.b)", "torch.randn(m, k)",
                            {"m": 33, "k": 64, "n": 96}),
    "bmm_scale": ("", "pass", "a, c", "return torch.bmm(a, c) * 0.5 + 1.0",
                  "torch.randn(b, m, k), torch.randn(b, k, n)",
                  {"b": 3, "m": 17, "k": 40, "n": 24}),
    # attention's scores: a batch of products over two leading dims, k read with its last two
    # dims swapped (in place: no copy of k.transpose(-2, -1))
    "scores_bt_relu": ("", "pass", "q, c", "return torch.relu(q @ c.transpose(-2, -1) * 0.25)",
                       "torch.randn(b, h, m, k), torch.randn(b, h, n, k)",
                       {"b": 2, "h": 3, "m": 9, "k": 20, "n": 12}),
    "linear_softmax": ("k, n", "self.linear = nn.Linear(k, n)", "x",
                       "return torch.softmax(self.linear(x), dim=-1)", "torch.randn(m, k)",
                       {"m": 24, "k": 50, "n": 130}),
    "linear_residual_ln": ("k, n", "self.linear = nn.Linear(k, k)\nself.ln = nn.LayerNorm(k)",
                           "x", "return self.ln(x + self.linear(x))", "torch.randn(m, k)",
                           {"m": 20, "k": 36, "n": 36}),
    "matmul_sigmoid_sum": ("k, n", "self.w = nn.Parameter(torch.randn(k, n) / k ** 0.5)", "x",
                           "return torch.sigmoid(torch.matmul(x, self.w)).sum(dim=1)",
                           "torch.randn(m, k)", {"m": 30, "k": 64, "n": 70}),
    # KernelBench keeps a residual as `x.clone().detach()` (level 2, 40): the same values
    "linear_scale_residual": ("k, n", "self.linear = nn.Linear(k, n)", "x",
                              "y = self.linear(x); r = y.clone().detach(); return y * 0.5 + r",
                              "torch.randn(m, k)", {"m": 21, "k": 40, "n": 33}),
    "matvec": ("", "pass", "a, v", "return torch.matmul(a, v)",
               "torch.randn(m, k), torch.randn(k, 1)", {"m": 31, "k": 77, "n": 1}),
    "conv_relu_bias": ("cin, cout", "self.conv = nn.Conv2d(cin, cout, 3, padding=1)\n"
                       "self.bias = nn.Parameter(torch.randn(cout, 1, 1))", "x",
                       "return torch.relu(self.conv(x)) + self.bias",
                       "torch.randn(b, cin, h, w)",
                       {"b": 2, "cin": 3, "cout": 8, "h": 9, "w": 7}),
    "conv_gn_tanh": ("cin, cout", "self.conv = nn.Conv2d(cin, cout, 3, padding=1)\n"
                     "self.norm = nn.GroupNorm(2, cout)", "x",
                     "return torch.tanh(self.norm(self.conv(x)))",
                     "torch.randn(b, cin, h, w)",
                     {"b": 2, "cin": 3, "cout": 8, "h": 6, "w": 5}),
    # GroupNorm of a (rows, features) product: a row is one group, the bias and the affine
    # vary along it (indexed by the element, not the column)
    "linear_gn_swish": ("k, n", "self.fc = nn.Linear(k, n)\nself.gn = nn.GroupNorm(4, n)\n"
                        "with torch.no_grad():\n    self.gn.weight.uniform_(0.5, 2.0)\n"
                        "    self.gn.bias.uniform_(-0.5, 0.5)", "x",
                        "y = self.gn(self.fc(x)); return y * torch.sigmoid(y)",
                        "torch.randn(m, k)", {"m": 6, "k": 20, "n": 32}),
    # convolutions of other ranks and transposed ones, their arguments read from the module at
    # run time
    "conv1d_strided_relu": ("cin, cout", "self.conv = nn.Conv1d(cin, cout, 3, stride=2, "
                            "padding=1, dilation=2)", "x", "return torch.relu(self.conv(x))",
                            "torch.randn(b, cin, w)", {"b": 2, "cin": 3, "cout": 5, "w": 17}),
    "convt2d_grouped_tanh": ("cin, cout", "self.conv = nn.ConvTranspose2d(cin, cout, 3, "
                             "stride=2, padding=1, output_padding=1, groups=2)", "x",
                             "return torch.tanh(self.conv(x) - 0.25)",
                             "torch.randn(b, cin, h, w)",
                             {"b": 2, "cin": 4, "cout": 6, "h": 5, "w": 3}),
    # BatchNorm in eval mode (its task asks; running statistics): statistics made
    # non-trivial so that a kernel ignoring them fails
    "conv3d_bn_relu": ("cin, cout", "self.conv = nn.Conv3d(cin, cout, 2)\n"
                       "self.bn = nn.BatchNorm3d(cout)\n" + _RANDOM_STATS.format(m="self.bn"),
                       "x", "return torch.relu(self.bn(self.conv(x)))",
                       "torch.randn(b, cin, d, h, w)",
                       {"b": 2, "cin": 3, "cout": 4, "d": 3, "h": 4, "w": 5}),
    "linear_bn_gelu": ("k, n", "self.fc = nn.Linear(k, n)\nself.bn = nn.BatchNorm1d(n)\n"
                       + _RANDOM_STATS.format(m="self.bn"), "x",
                       "return F.gelu(self.bn(self.fc(x)))", "torch.randn(m, k)",
                       {"m": 12, "k": 40, "n": 24}),
    "conv_instance_norm": ("cin, cout", "self.conv = nn.Conv2d(cin, cout, 3)\n"
                           "self.norm = nn.InstanceNorm2d(cout, affine=True)\n"
                           "with torch.no_grad():\n    self.norm.weight.uniform_(0.5, 2.0)",
                           "x", "return self.norm(self.conv(x)) / 2.0",
                           "torch.randn(b, cin, h, w)",
                           {"b": 2, "cin": 3, "cout": 5, "h": 7, "w": 6}),
    # A @ B.T (KernelBench level 1, 17; level 2, 14 on its weight): F.linear's product
    "matmul_wt_relu": ("k, n", "self.w = nn.Parameter(torch.randn(n, k) / k ** 0.5)", "x",
                       "return torch.relu(torch.matmul(x, self.w.T))", "torch.randn(m, k)",
                       {"m": 33, "k": 40, "n": 20}),
    "inputs_bt_scale": ("", "pass", "a, c", "return a @ c.T * 2.0",
                        "torch.randn(m, k), torch.randn(n, k)", {"m": 17, "k": 30, "n": 24}),
    # triangles of a product (level 1, 14 and 15), batched too
    "matmul_triu": ("", "pass", "a, c", "return torch.triu(torch.matmul(a, c))",
                    "torch.randn(m, k), torch.randn(k, n)", {"m": 37, "k": 20, "n": 30}),
    "bmm_tril_scale": ("", "pass", "a, c",
                       "return torch.tril(torch.bmm(a, c), diagonal=2) * 3.0",
                       "torch.randn(b, m, k), torch.randn(b, k, n)",
                       {"b": 2, "m": 19, "k": 12, "n": 24}),
    # reductions over a dim a keepdim sum left of size 1 (level 2, 18): the value itself
    "linear_sum_chain": ("k, n", "self.fc = nn.Linear(k, n)", "x",
                         "y = torch.sum(self.fc(x), dim=1, keepdim=True); "
                         "y = torch.max(y, dim=1, keepdim=True)[0]; "
                         "y = torch.mean(y, dim=1, keepdim=True); "
                         "return torch.logsumexp(torch.logsumexp(y, dim=1, keepdim=True), "
                         "dim=1, keepdim=True)", "torch.randn(m, k)",
                         {"m": 12, "k": 20, "n": 36}),
    # einsum's forms of the products (level 1, 11: 'bijl,lk->bijk')
    "einsum_mm4d": ("", "pass", "a, c", "return torch.einsum('bijl,lk->bijk', a, c) * 0.5",
                    "torch.randn(b, i, j, k), torch.randn(k, n)",
                    {"b": 2, "i": 3, "j": 5, "k": 24, "n": 20}),
    "einsum_bmm_relu": ("", "pass", "a, c",
                        "return torch.relu(torch.einsum('bic,bck->bik', a, c))",
                        "torch.randn(b, m, k), torch.randn(b, k, n)",
                        {"b": 3, "m": 9, "k": 21, "n": 14}),
    "einsum_linear": ("k, n", "self.w = nn.Parameter(torch.randn(n, k))", "x",
                      "return torch.einsum('nc,kc->nk', x, self.w) - 1.0", "torch.randn(m, k)",
                      {"m": 10, "k": 16, "n": 12}),
    # A.T @ B and A.T @ B.T (level 1, 16 and 18): A read column-wise, [K, M] in memory
    "at_b_relu": ("", "pass", "a, c", "return torch.relu(a.T @ c)",
                  "torch.randn(k, m), torch.randn(k, n)", {"m": 36, "k": 45, "n": 28}),
    "at_bt_shift": ("", "pass", "a, c", "return torch.matmul(a.T, c.T) + 1.0",
                    "torch.randn(k, m), torch.randn(n, k)", {"m": 19, "k": 33, "n": 40}),
}
# Sizes tried on each task, over its defaults: tile edges, several K slabs, odd sizes.
GEMM_SIZES = {
    "matmul_wt_relu": [{}, {"m": 5, "k": 3, "n": 9}],
    "inputs_bt_scale": [{}, {"m": 130, "k": 66, "n": 7}],
    "at_b_relu": [{}, {"m": 7, "k": 3, "n": 5}, {"m": 132, "k": 300, "n": 136}],
    "einsum_mm4d": [{}, {"b": 1, "i": 1, "j": 7, "k": 5, "n": 3}],
    "linear_sum_chain": [{}, {"m": 3, "k": 7, "n": 130}],
    "matmul_triu": [{}, {"m": 130, "k": 5, "n": 66}],
    "bmm_tril_scale": [{}, {"b": 1, "m": 3, "k": 7, "n": 2}],
    "einsum_bmm_relu": [{}],
    "einsum_linear": [{}, {"m": 3, "k": 130, "n": 5}],
    "at_bt_shift": [{}, {"m": 64, "k": 260, "n": 6}],
    "linear_relu": [{}, {"m": 7, "k": 3, "n": 5}, {"m": 130, "k": 300, "n": 140}],
    "linear3d_gelu": [{}, {"b": 3, "m": 5, "k": 131, "n": 67}],
    "matmul_bias_sigmoid": [{}, {"m": 1, "k": 5, "n": 7}, {"m": 70, "k": 257, "n": 129}],
    "bmm_scale": [{}, {"b": 2, "m": 65, "k": 130, "n": 66}],
    "scores_bt_relu": [{}, {"b": 1, "h": 2, "m": 65, "k": 131, "n": 66}],
    "linear_softmax": [{}, {"m": 3, "k": 7, "n": 9}],
    "linear_residual_ln": [{}, {"m": 5, "k": 130, "n": 130}],
    "matmul_sigmoid_sum": [{}, {"m": 9, "k": 300, "n": 5}],
    "linear_scale_residual": [{}, {"m": 3, "k": 130, "n": 7}],
    "matvec": [{}, {"m": 4, "k": 1000}],
    "conv_relu_bias": [{}, {"b": 1, "cin": 2, "cout": 4, "h": 3, "w": 11}],
    "conv_gn_tanh": [{}, {"b": 3, "cin": 4, "cout": 6, "h": 4, "w": 4},
                     {"b": 2, "cin": 3, "cout": 16, "h": 12, "w": 20}],  # vectors: 240 pixels
    "linear_gn_swish": [{}, {"m": 3, "k": 7, "n": 12}],
    "conv1d_strided_relu": [{}, {"b": 1, "cin": 2, "cout": 3, "w": 6}],
    "convt2d_grouped_tanh": [{}, {"b": 1, "cin": 2, "cout": 2, "h": 1, "w": 4}],
    "conv3d_bn_relu": [{}, {"b": 1, "cin": 2, "cout": 3, "d": 2, "h": 5, "w": 2}],
    "linear_bn_gelu": [{}, {"m": 3, "k": 7, "n": 5}],
    "conv_instance_norm": [{}, {"b": 3, "cin": 2, "cout": 4, "h": 3, "w": 9}],
}
# Convolutions: the conv template (lib 2) and the library form (lib 1); more of them in
# tests/test_offline_conv.py.
CONVOLUTIONS = {"conv_relu_bias", "conv_gn_tanh", "conv1d_strided_relu", "convt2d_grouped_tanh",
                "conv3d_bn_relu", "conv_instance_norm"}
# Row-kernel forms after a channels_last convolution (knob layout 1, the result transposed by
# the candidate's own kernel): clusters of 4 and 2 blocks, no row cache, a warp per row, the
# rows in registers.
CHANNELS_LAST_VARIANTS = ({"split": 4, "block": 128}, {"split": 2, "vec": 1}, {"cache_row": 0},
                          {"warp_per_row": 1}, {"regs": 8})
NO_PRODUCT = {"matvec"}  # a matrix-vector product is a row reduction: no GEMM, no library


def _gemm_source(name: str, dtype: str = "") -> str:
    args, init, fargs, body, inputs, sizes = GEMM_TASKS[name]
    if dtype:
        inputs = f"*[t.to(torch.{dtype}) for t in ({inputs},)]"
        init += f"\nself.to(torch.{dtype})"
    init_args = ", ".join(a.strip() for a in args.split(",") if a.strip())
    head = "".join(f"{k} = {v}\n" for k, v in sizes.items())
    return (_HEADER + head + "\n\nclass Model(nn.Module):\n"
            + f"    def __init__(self{', ' + init_args if init_args else ''}):\n"
            + "        super().__init__()\n" + textwrap.indent(init, " " * 8) + "\n\n"
            + f"    def forward(self, {fargs}):\n        {body}\n"
            + _GEMM_FOOTER % (inputs, init_args))


@pytest.fixture(scope="module")
def gemm_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gemm_tasks")
    for name in GEMM_TASKS:
        (root / f"{name}.py").write_text(_gemm_source(name))
    for name in ("linear3d_gelu", "bmm_scale"):
        for dtype in ("float16", "bfloat16"):
            (root / f"{name}_{dtype}.py").write_text(_gemm_source(name, dtype))
    return root


def _gctx(gemm_dir: Path, name: str, target: str = "cpu") -> TaskContext:
    return TaskContext(Task.from_file(gemm_dir / f"{name}.py"), target=target)


def _check_gemm(prop: Proposal, ctx: TaskContext, name: str, tmp_path: Path,
                device: str = "cpu") -> None:
    """The candidate equals the reference at every size of GEMM_SIZES[name], two input seeds."""
    assert_matches_reference(prop.code, tmp_path / f"cand_{prop.id}.py", ctx,
                             GEMM_SIZES[name.split("_float")[0].split("_bfloat")[0]], device,
                             seeds=(1, 2))


@pytest.mark.parametrize("name", list(GEMM_TASKS))
def test_gemm_cpu_candidates_match_reference(gemm_dir, tmp_path, name):
    """Both forms on the cpu target (own tiled GEMM or convolution, library + epilogue),
    defaults first."""
    ctx = _gctx(gemm_dir, name)
    syn = OfflineSynthesizer("cpu")
    props = syn.translate(ctx, n=3, rng=random.Random(0))
    assert len(props) == 3 and len({p.id for p in props}) == 3
    strategies = [p.strategy for p in props]
    if name in NO_PRODUCT:
        assert strategies == ["rowreduce"] * 3
    elif name in CONVOLUTIONS:
        assert strategies[:2] == ["tiling", "epilogue"]
        assert [p.knobs["lib"] for p in props[:2]] == [2, 1]
    else:
        assert strategies[:2] == ["tiling", "epilogue"]  # the default of each template
        assert set(props[0].knobs) >= set(KNOB_SPACES[("cpu", "gemm")])
    for prop in props:
        assert prop.code is not None, prop.declined
        policy = "permissive" if prop.strategy == "epilogue" else "strict"
        assert f"POLICY = {policy!r}".replace("'", '"') in prop.code
        _check_gemm(prop, ctx, name, tmp_path)


def test_batch_norm_kernels_refuse_training_mode(gemm_dir, tmp_path):
    """A kernel computing BatchNorm from the running statistics (a task that put it in eval
    mode) is right in eval mode only; in training mode torch would use batch statistics, so the
    candidate refuses."""
    ctx = _gctx(gemm_dir, "linear_bn_gelu")
    prop = OfflineSynthesizer("cpu").translate(ctx, n=1, rng=random.Random(0))[0]
    cand = _import(prop.code, tmp_path / "cand_bn.py")
    mod = ctx.task.module()
    with seeded(0):
        new = cand.ModelNew(*mod.get_init_inputs())
    x = make_inputs(mod, seed=1, device="cpu")
    with torch.no_grad():
        assert new.eval()(*x).shape == (mod.m, mod.n)
        with pytest.raises(RuntimeError, match="eval-mode"):
            new.train()(*x)


def test_group_norm_defaults_count_its_rows(tmp_path):
    """GroupNorm's rows are (sample, group) pairs: with 2 groups over 8 x 10 x 25 the defaults
    see rows of 1000 columns (a warp per row), not rows of 2000 (a block per row)."""
    source = _gemm_source("conv_gn_tanh").replace("h = 6\n", "h = 10\n").replace("w = 5\n",
                                                                                  "w = 25\n")
    (tmp_path / "gn.py").write_text(source)
    syn = OfflineSynthesizer("cuda")
    analysis = syn.analyse(TaskContext(Task.from_file(tmp_path / "gn.py"), target="cuda"))
    assert analysis.row_groups == 2 and analysis.shape[1:] == (8, 10, 25)
    assert syn.defaults(analysis, {"lib": 1})["warp_per_row"] == 1


def test_gemm_knobs_evolve_across_templates(gemm_dir, tmp_path):
    ctx = _gctx(gemm_dir, "linear_relu")
    syn = OfflineSynthesizer("cpu")
    own, lib = syn.translate(ctx, n=2, rng=random.Random(0))
    assert own.knobs["lib"] == 0 and lib.knobs["lib"] == 1
    # Mutation moves in the template's space, switching templates now and then.
    kids = syn.mutate(ctx, _parent(own), 12, random.Random(3))
    assert len({k.id for k in kids}) == 12
    for kid in kids:
        space = dict(KNOB_SPACES[("cpu", "gemm" if kid.knobs["lib"] == 0 else "elementwise")])
        assert set(kid.knobs) == set(space) | {"lib"}
        assert all(kid.knobs[k] in space[k] for k in space)
    assert {k.knobs["lib"] for k in kids} == {0, 1}
    # Crossover of the two templates: a valid knob set of one of them.
    for seed in range(6):
        (child,) = syn.crossover(ctx, [_parent(own), _parent(lib)], random.Random(seed))
        base = own if child.knobs["lib"] == 0 else lib
        assert set(child.knobs) == set(base.knobs)
    # Repair: defaults of the parent's template, then its safest form.
    (fixed,) = syn.repair(ctx, _parent(own), random.Random(0))
    assert fixed.knobs["lib"] == 0 and fixed.knobs["threads"] == 1 and fixed.knobs["unroll"] == 1
    _check_gemm(fixed, ctx, "linear_relu", tmp_path)
    _check_gemm(kids[0], ctx, "linear_relu", tmp_path)


def test_policy_strict_proposes_own_kernels_only(gemm_dir):
    syn = OfflineSynthesizer("cpu", policy="strict")
    props = syn.translate(_gctx(gemm_dir, "linear_softmax"), n=4, rng=random.Random(0))
    assert [p.strategy for p in props] == ["tiling"] * 4
    assert all(p.knobs["lib"] == 0 for p in props)
    props = syn.translate(_gctx(gemm_dir, "conv_relu_bias"), n=2, rng=random.Random(0))
    assert all(p.knobs["lib"] == 2 and 'POLICY = "strict"' in p.code for p in props)
    with pytest.raises(ValueError):
        OfflineSynthesizer("cpu", policy="lenient")


def test_low_precision_gemm_is_cuda_only(gemm_dir):
    for dtype in ("float16", "bfloat16"):
        ctx = _gctx(gemm_dir, f"linear3d_gelu_{dtype}")
        (cpu,) = OfflineSynthesizer("cpu").translate(ctx, 2, random.Random(0))
        assert cpu.code is None and f"{dtype} on the cpu target" in cpu.declined
        props = OfflineSynthesizer("cuda").translate(_gctx(gemm_dir, f"linear3d_gelu_{dtype}",
                                                           "cuda"), 2, random.Random(0))
        assert [p.strategy for p in props] == ["tensor_cores"] * 2  # no library form
        assert all(p.knobs["lib"] == 0 and "warp_m" in p.knobs for p in props)


# The bundled suite: what the synthesizer writes for each task.
# Products and convolutions (L3_4, L3_5: multi-kernel plans, tests/test_offline_stages.py); the
# lone ones of level 1 have no library form.
BUNDLED_PRODUCTS = {"L1_14_Square_Matmul", "L1_15_Batched_Matmul", "L1_17_Conv2d",
                    "L2_4_Conv2d_ReLU_BiasAdd", "L2_5_Conv2d_GroupNorm_Tanh",
                    "L3_4_ResNet_BasicBlock", "L3_5_Small_CNN_Head",
                    "L2_1_Linear_Bias_ReLU", "L2_2_Linear_GELU_Scale", "L2_3_Matmul_Sigmoid_Sum",
                    "L2_6_Linear_Softmax", "L2_7_Linear_Residual_LayerNorm",
                    "L2_10_Linear_LayerNorm_Mean_Degenerate", "L3_1_MLP"}
# Attention written out (L3_2, L3_3): multi-kernel plans whose first kernel is a lone product
# (no library form of its own): both candidates tile it.
BUNDLED_ATTENTION = {"L3_2_MultiHead_SelfAttention", "L3_3_Transformer_Block"}


def _bundled(target: str = "cpu") -> dict[str, TaskContext]:
    out = {}
    for path in sorted((REPO / "data" / "tasks").glob("level*/*.py")):
        task = Task.from_file(path, size="small")
        out[task.id] = TaskContext(task, target=target)
    return out


def test_bundled_suite_coverage():
    """Every bundled task has a plan, its forms what its ops call for."""
    syn = OfflineSynthesizer("cpu")
    for tid, ctx in _bundled().items():
        props = syn.translate(ctx, n=2, rng=random.Random(0))
        assert all(p.code is not None for p in props), (tid, props[0].declined)
        kinds = {p.strategy for p in props}
        if tid in BUNDLED_PRODUCTS:
            assert kinds == {"tiling", "epilogue"} or tid.startswith("L1_1"), (tid, kinds)
        elif tid in BUNDLED_ATTENTION:  # the scores' and the weighted sum's batched products
            assert kinds == {"tiling"} and "bmm" in syn.analyse(ctx).ops, (tid, kinds)
        else:
            assert kinds <= {"vectorize", "fusion", "rowreduce", "pooling"}, (tid, kinds)


def test_verifier_accepts_bundled_products_on_cpu(tmp_path):
    """End to end through the verifier on the small sizes: the own GEMM and convolution under
    strict, the library + epilogue forms under permissive (and refused under strict, by the
    audit)."""
    from assay.verify.harness import verify
    from assay.verify.settings import VerifyConfig

    ctxs = _bundled()
    syn = OfflineSynthesizer("cpu")
    cases = [("L1_14_Square_Matmul", 0, "strict", True),
             ("L1_16_Matrix_Vector", 0, "strict", True),
             ("L2_7_Linear_Residual_LayerNorm", 0, "strict", True),
             ("L2_2_Linear_GELU_Scale", 1, "permissive", True),
             ("L2_2_Linear_GELU_Scale", 1, "strict", False),
             ("L1_17_Conv2d", 0, "strict", True),
             ("L2_5_Conv2d_GroupNorm_Tanh", 1, "permissive", True)]
    for tid, which, policy, accepted in cases:
        ctx = ctxs[tid]
        prop = syn.translate(ctx, n=2, rng=random.Random(0))[which]
        path = tmp_path / f"{tid}_{which}.py"
        path.write_text(prop.code)
        cfg = VerifyConfig(policy=policy, budget_s=0.05, min_runs=3, max_runs=10,
                           max_library_time_frac=1.0 if policy == "permissive" else 0.0)
        v = verify(ctx.task, path, "cpu", cfg)
        assert v.accepted == accepted, (tid, policy, v.reasons,
                                         {r: v.checks[r]["detail"][:300] for r in v.reasons})
        if not accepted:
            assert v.reasons == ["kernel_audit"]
            assert "aten::mm" in v.checks["kernel_audit"]["detail"]
        elif policy == "permissive":
            assert v.library_time_frac and v.library_time_frac > 0


def test_kernel_names_are_not_taken_for_library_kernels(gemm_dir, task_dir, tmp_path):
    """The audit tells library kernels (cuBLAS, CUTLASS, "gemm" in the name...) from custom
    ones by name: every kernel the synthesizer writes must read as custom."""
    import re

    from assay.verify.policy import LIBRARY_KERNEL

    syn = OfflineSynthesizer("cuda")
    names = set()
    ctxs = [_gctx(gemm_dir, n, "cuda") for n in ("linear_relu", "linear_softmax",
                                                  "bmm_scale_float16")]
    ctxs += [_ctx(task_dir, n, "cuda") for n in ("relu", "softmax")]
    for ctx in ctxs:
        for prop in syn.translate(ctx, n=2, rng=random.Random(0)):
            cand = _import(prop.code, tmp_path / f"names_{prop.id}.py")
            names |= set(re.findall(r"__global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\(",
                                    cand.SOURCE))
    assert names == {"assay_matmul_tiles", "assay_matmul_parts_sum", "assay_elementwise",
                     "assay_rows"}
    assert not [n for n in names if LIBRARY_KERNEL.search(f"void {n}<4>(float const*, long)")]


@pytest.mark.skipif(not _HAS_NVCC, reason="nvcc is not installed")
def test_cuda_gemm_candidates_compile(gemm_dir, tmp_path):
    """Every GEMM form builds with nvcc: SIMT fused (NN, NT, batched), SIMT + row kernel,
    library + epilogue (elementwise, row, grouped row), tensor cores in both dtypes and both
    B layouts, the safest forms; with and without vector loads and double buffering."""
    syn = OfflineSynthesizer("cuda")
    sources: dict[str, tuple] = {}
    names = ["linear_relu", "bmm_scale", "matmul_bias_sigmoid", "linear_softmax",
             "conv_gn_tanh", "conv_relu_bias", "linear3d_gelu_float16", "bmm_scale_bfloat16"]
    for name in names:
        ctx = _gctx(gemm_dir, name, "cuda")
        props = syn.translate(ctx, n=2, rng=random.Random(1))
        props += syn.repair(ctx, _parent(props[0]), random.Random(0))
        for prop in props:
            assert prop.code is not None, (name, prop.declined)
            if prop.knobs["lib"] == 2:  # the conv template: tests/test_offline_conv.py builds it
                continue
            cand = _import(prop.code, tmp_path / f"cuda_{prop.id}.py")
            assert cand.LANG == "cuda" and cand.KNOBS == prop.knobs
            if prop.strategy == "epilogue":
                assert cand.POLICY == "permissive" and "assay_gemm" not in cand.SOURCE
            else:
                assert cand.POLICY == "strict"
            if prop.strategy == "tensor_cores":
                assert "wmma::mma_sync" in cand.SOURCE
            sources.setdefault(cand.SOURCE, (name, tuple(sorted(prop.knobs.items()))))
    ctx = _gctx(gemm_dir, "conv_gn_tanh", "cuda")
    for overrides in CHANNELS_LAST_VARIANTS:  # the transpose before each row layout
        prop = _gemm_corner(syn, ctx, {"lib": 1, "layout": 1, **overrides})
        sources.setdefault(_import(prop.code, tmp_path / f"cuda_{prop.id}.py").SOURCE,
                           ("conv_gn_tanh", tuple(sorted(prop.knobs.items()))))
    gemm = [dict(k[1]) for k in sources.values() if dict(k[1]).get("lib") == 0]
    assert {k["load_vec"] for k in gemm} >= {1, 4, 8} and {k["stages"] for k in gemm} >= {1, 2}

    build_cuda_sources(sources)


# Corners of the fp32 GEMM space that translate may never draw: 32 threads whose slab rows are
# wider than the block (NT < COLS / VEC), 1024 threads of 4 x 4, 8 x 4 warp lanes, the old
# contiguous layout with 16-wide thread tiles, scalar loads, deep slabs, single buffering;
# 256-row tiles (256 threads of 8 x 16; of 4 x 4 threads, 8 x 4 instead of 2048 threads);
# cp.async rings of 3 and 4 slabs (fewer vectors than threads, so some copy none; 4-byte
# copies into deep slabs) and cp.async double buffering.
GEMM_CORNERS = [
    {"tile_m": 64, "tile_n": 64, "thread_m": 8, "thread_n": 16, "k_step": 32, "load_vec": 1},
    {"tile_m": 128, "tile_n": 128, "thread_m": 4, "thread_n": 4, "k_step": 32, "load_vec": 4,
     "min_blocks": 1},
    {"tile_m": 64, "tile_n": 128, "thread_m": 4, "thread_n": 16, "k_step": 16, "stages": 1,
     "warp_tile": 0, "load_vec": 1},
    {"tile_m": 256, "min_blocks": 1},
    {"tile_m": 256, "thread_m": 4, "thread_n": 4, "stages": 3, "min_blocks": 1},
    {"tile_m": 256, "k_step": 16, "stages": 3, "min_blocks": 1},
    {"tile_m": 64, "tile_n": 64, "thread_m": 8, "thread_n": 16, "k_step": 32, "load_vec": 1,
     "stages": 4, "warp_tile": 0},
    {"cp_async": 1, "stages": 1, "thread_n": 8},
]


def _gemm_corner(syn: OfflineSynthesizer, ctx: TaskContext, overrides: dict) -> Proposal:
    """The candidate of the defaults (own GEMM unless ``lib`` says) overridden by
    ``overrides``."""
    return syn.with_knobs(ctx, {"lib": 0, **overrides})


@pytest.mark.skipif(not _HAS_NVCC, reason="nvcc is not installed")
def test_cuda_gemm_corners_compile(gemm_dir, tmp_path):
    """The corners of the knob space build (static_asserts on the thread and warp layouts),
    with B^T (linear) and B (batched matmul) operands."""
    syn = OfflineSynthesizer("cuda")
    sources = {}
    for name in ("linear_relu", "bmm_scale"):
        ctx = _gctx(gemm_dir, name, "cuda")
        for overrides in GEMM_CORNERS:
            prop = _gemm_corner(syn, ctx, overrides)
            cand = _import(prop.code, tmp_path / f"corner_{prop.id}.py")
            sources[cand.SOURCE] = (name, tuple(sorted(overrides.items())))
    build_cuda_sources(sources)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(GEMM_TASKS) + ["linear3d_gelu_float16",
                                                     "bmm_scale_float16", "bmm_scale_bfloat16"])
def test_cuda_gemm_candidates_match_reference(gemm_dir, tmp_path, name):
    ctx = _gctx(gemm_dir, name, "cuda")
    syn = OfflineSynthesizer("cuda")
    props = syn.translate(ctx, n=4, rng=random.Random(0))
    props += syn.mutate(ctx, _parent(props[0]), 3, random.Random(1))
    props += syn.repair(ctx, _parent(props[0]), random.Random(2))
    if name in ("linear_relu", "bmm_scale", "linear_softmax"):
        props += [_gemm_corner(syn, ctx, overrides) for overrides in GEMM_CORNERS]
    if name == "conv_gn_tanh":  # the channels_last result transposed, then each row layout
        props += [_gemm_corner(syn, ctx, {"lib": 1, "layout": 1, **overrides})
                  for overrides in CHANNELS_LAST_VARIANTS]
    if name == "matvec":  # rows in registers: 77 columns fit a warp's 4 vectors, 1000 do not
        props.append(syn.with_knobs(ctx, {"regs": 4}))
    for prop in props:
        _check_gemm(prop, ctx, name, tmp_path, device="cuda")


_NUMBER_TASK = _HEADER + """
class Model(nn.Module):
    def forward(self, A, s, c):
        return torch.relu(A * s) + c * A.sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(33, 65), 3.5, 2]


def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_number_arguments_are_read_at_each_call(tmp_path, target):
    """Forward arguments that get_inputs() gives as numbers (KernelBench L1_5's scalar): 0-d
    tensors made from them at each call, so other values than the example's are computed; a
    non-number is refused."""
    (tmp_path / "number.py").write_text(_NUMBER_TASK)
    ctx = TaskContext(Task.from_file(tmp_path / "number.py"), target=target)
    prop = OfflineSynthesizer(target).translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert "_scalar(s, 's', " in prop.code and "_scalar(c, 'c', " in prop.code
    cand = _import(prop.code, tmp_path / f"number_{prop.id}.py")
    if target == "cuda" and not torch.cuda.is_available():
        if not _HAS_NVCC:
            pytest.skip("nvcc is not installed")
        build_cuda_sources([cand.SOURCE])  # built here, run on the GPU
        return
    new = cand.ModelNew().to(target).eval()
    a = torch.randn(7, 130, device=target)
    for s, c in ((3.5, 2), (-1.25, 0.5), (0, -3)):
        with torch.no_grad():
            got = new(a, s, c)
        expected = torch.relu(a * s) + c * a.sum(dim=1, keepdim=True)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="expected a number"):
        new(a, True, 1)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_entry_point_calls_match_their_argtypes(gemm_dir, task_dir, target):
    """Every entry point a candidate calls is declared, with as many ctypes argtypes as the
    call passes (a mismatch is a TypeError at the first call, on the device only)."""
    syn = OfflineSynthesizer(target)
    ctxs = [_gctx(gemm_dir, n, target) for n in GEMM_TASKS]
    ctxs += [_ctx(task_dir, n, target) for n in ("relu", "softmax", "layernorm")]
    seen = set()
    for ctx in ctxs:
        for prop in syn.translate(ctx, n=3, rng=random.Random(0)):
            if prop.code is None:
                continue
            for name, passed, declared in entry_arities(prop.code):
                if name == "assay_error_string":  # declared by _lib itself
                    continue
                assert passed == declared, (ctx.task.name, prop.knobs, name, passed, declared)
                seen.add(name)
    assert {"assay_gemm", "assay_forward"} <= seen
    if target == "cuda":
        assert "assay_gemm_parts" in seen


# Split K (gemm_tiled knob split_k): few output tiles and a long K. linear (B^T, float4 loads
# and stores), matmul + bias with N % 4 != 0 (scalar form), a batched product, and the row
# kernel after the product (the parts' sum stores the product itself).
SPLIT_K = {"linear_relu": {"m": 40, "k": 4100, "n": 48},
           "matmul_bias_sigmoid": {"m": 33, "k": 2051, "n": 98},
           "bmm_scale": {"b": 3, "m": 17, "k": 3001, "n": 24},
           "linear_softmax": {"m": 24, "k": 5000, "n": 130}}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(SPLIT_K))
def test_cuda_split_k_matches_reference(gemm_dir, tmp_path, name):
    """K cut into parts (the kernel says how many: more than one here), their sums added in a
    fixed order: torch's values, the same bits on every call."""
    ctx = _gctx(gemm_dir, name, "cuda")
    syn = OfflineSynthesizer("cuda")
    for knobs in ({}, {"load_vec": 1, "cp_async": 1, "stages": 3, "tile_m": 64}):
        prop = _gemm_corner(syn, ctx, {"split_k": 1, **knobs})
        cand = _import(prop.code, tmp_path / f"split_{prop.id}.py")
        mod = ctx.task.module()
        for key, value in SPLIT_K[name].items():
            setattr(mod, key, value)
        b, m, k, n = (getattr(mod, v, 1) for v in ("b", "m", "k", "n"))
        assert cand._lib().assay_gemm_parts(m, n, k, b, None) > 1
        ref = reference_model(mod, seed=0, device="cuda")
        with seeded(0):
            new = cand.ModelNew(*mod.get_init_inputs())
        new.to("cuda").eval().load_state_dict(ref.state_dict())
        inputs = make_inputs(mod, seed=1, device="cuda")
        with torch.no_grad():
            expected, got, again = ref(*inputs), new(*inputs), new(*inputs)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(got, again)


def test_broadcast_index_divider_matches_integer_division(tmp_path):
    """assay_bidx / assay_bmod (multiply-high dividers below 2^31) against plain 64-bit
    division, on edge and random values, built with g++ from the kernels' own helpers."""
    import ctypes

    from assay.propose.offline.families import shared

    source = ("#include <stdint.h>\n#include <math.h>\n#define ASSAY_FN static inline\n"
              + shared.HELPERS + textwrap.dedent("""
        extern "C" int64_t check(const int64_t* cases, int64_t n) {
          int64_t bad = 0;
          for (int64_t k = 0; k < n; ++k) {
            const int64_t i = cases[3 * k], inner = cases[3 * k + 1], mid = cases[3 * k + 2];
            const AssayBcast b = assay_bcast(inner, mid);
            bad += assay_bidx(i, inner, mid, b) != (i / inner) % mid;
            bad += assay_bmod(i, mid, b) != i % mid;
          }
          return bad;
        }"""))
    lib = ctypes.CDLL(str(build(source, lang="cpp")))
    lib.check.restype = ctypes.c_int64
    rng = random.Random(0)
    edges = [1, 2, 3, 7, 64, 4095, 4096, 4097, 65536, 2**30 - 1, 2**30 + 1, 2**31 - 1]
    cases = [(i, inner, mid) for i in (0, 1, 4095, 4096, 2**31 - 2, 2**31 - 1, 2**31, 2**40)
             for inner in edges for mid in edges]
    cases += [(rng.randrange(2**31), rng.choice(edges + [rng.randrange(1, 2**31)]),
               rng.randrange(1, 5000)) for _ in range(200_000)]
    flat = (ctypes.c_int64 * (3 * len(cases)))(*[v for c in cases for v in c])
    assert lib.check(flat, len(cases)) == 0


BUFFERS = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.rand(64))
        self.register_buffer("mask", torch.tril(torch.ones(32, 32)))

    def forward(self, x):
        n = x.size(0)
        return torch.relu(x * self.scale) + self.mask[:n, :n].sum()


def get_inputs():
    return [torch.rand(16, 64)]


def get_init_inputs():
    return []
"""


def test_buffers_are_graph_values_and_a_traced_size_may_slice_one(tmp_path):
    """The tracer takes the module's buffers as graph values (``get_attr`` of their names, as
    parameters are), not as constants frozen at trace time: a candidate reads the module's own
    (the verifier loads the reference's state into it), and a forward that slices one by a
    traced size traces."""
    from assay.propose.offline.tracing import trace

    path = tmp_path / "buffers.py"
    path.write_text(BUFFERS)
    gm = trace(Task.from_file(path).module(), real=True)
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    assert {"scale", "mask"} <= targets, targets
