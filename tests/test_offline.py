"""The offline synthesizer: recognition, declines, candidate correctness (cpu) and CUDA builds.

CPU candidates are compiled with g++, run on random inputs at several shapes (one of them not a
multiple of 4) and compared with the reference; CUDA candidates are only compiled (nvcc, no
GPU needed). Every build goes to a temporary kernel cache.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from assay.bench.build import build
from assay.propose.base import Parent, TaskContext
from assay.propose.offline import KNOB_SPACES, OfflineSynthesizer
from assay.records import Proposal
from assay.tasks.instantiate import make_inputs, reference_model, seeded
from assay.tasks.model import Task

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
    "log_softmax": ("", "return F.log_softmax(x, dim=-1)"),
    "layernorm": ("self.ln = nn.LayerNorm(dim)", "return self.ln(x)"),
    "rmsnorm": ("self.eps = 1e-6\nself.weight = nn.Parameter(torch.ones(dim))",
                "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) "
                "* self.weight"),
    # declined
    "matmul": ("self.w = nn.Parameter(torch.randn(dim, 16))", "return torch.matmul(x, self.w)"),
    "sum_dim0": ("", "return x.sum(dim=0)"),
    "half_relu": ("", "return torch.relu(x)"),
}
TWO_INPUTS = {"tanh_xy"}
SUPPORTED = [name for name in TASKS if name not in ("matmul", "sum_dim0", "half_relu")]
ROW_TASKS = {"sum_last", "mean_keep", "max_chain", "softmax", "log_softmax", "layernorm",
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


def _import(code: str, path: Path):
    path.write_text(code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
                                 "vectorize" if name == "relu" else "fusion")
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
    ("matmul", "matmul"),
    ("sum_dim0", "trailing dims"),
    ("half_relu", "float16"),
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


def test_matmul_decline_names_the_op(task_dir):
    prop = OfflineSynthesizer("cuda").translate(_ctx(task_dir, "matmul", "cuda"), 1,
                                                random.Random(0))[0]
    assert prop.declined == "offline synthesizer v1 cannot express torch.matmul (matmul)"


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

_HAS_NVCC = bool(os.environ.get("NVCC") or shutil.which("nvcc"))


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
            assert "cudaGetLastError" in cand.SOURCE
            assert "cuda_stream" in prop.code
            sources.setdefault(cand.SOURCE, (name, tuple(sorted(prop.knobs.items()))))
    # Both row layouts (a warp per row, a block per row) and every vector width get built.
    row = [k for k in sources.values() if k[0] in ROW_TASKS]
    assert {dict(k[1])["warp_per_row"] for k in row} == {0, 1}
    assert {dict(k[1])["cache_row"] for k in row} == {0, 1}
    assert {dict(k[1])["vec"] for k in sources.values()} >= {1, 4}
    assert {dict(k[1])["persistent"] for k in sources.values()
            if k[0] not in ROW_TASKS} == {0, 1}

    def compile_one(item):
        source, key = item
        return key, build(source, lang="cuda")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for key, lib in pool.map(compile_one, sources.items()):
            assert lib.exists(), key


def test_cuda_mutation_changes_the_source(task_dir):
    ctx = _ctx(task_dir, "layernorm", "cuda")
    syn = OfflineSynthesizer("cuda")
    (base,) = syn.translate(ctx, 1, random.Random(0))
    assert base.knobs == {"block": 256, "vec": 4, "warp_per_row": 0, "cache_row": 1}  # 1030 cols
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
    shapes = SHAPES + [(33, 4096), (2, 20000), (1024, 32)]
    for prop in props:
        _check_candidate(prop, ctx, tmp_path, loose=name in LOOSE, device="cuda",
                         shapes=shapes)
