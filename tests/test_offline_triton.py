"""The offline synthesizer's Triton form (target=triton): elementwise, row, GEMM and pooling
candidates run in Triton's interpreter on cpu tensors (TRITON_INTERPRET=1, as the verifier's
sandbox runs them without a GPU) and match the reference at several shapes, ops without an
exact Triton formula and families without a Triton template are declined with a reason, the
evolution operators stay in Triton's knob space, and the verifier accepts a synthesized Triton
kernel.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import random
import sys

import pytest
import torch

# Triton decides at import whether its own library functions (tl.zeros, tl.sum...) are
# interpreted, so the interpreter is set for this process before triton is imported. Only where
# no GPU could run the kernels compiled: there, in-process Triton (torch.compile's) must stay
# compiled, and tests/test_gpu.py runs the same kernels on the device.
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
if torch.cuda.is_available():
    pytest.skip("runs Triton's interpreter in this process: for machines without a GPU",
                allow_module_level=True)
if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton was imported compiled before this module", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"

from assay.propose.base import Parent, TaskContext  # noqa: E402
from assay.propose.offline import KNOB_SPACES, OfflineSynthesizer  # noqa: E402
from assay.tasks.model import Task  # noqa: E402
from test_offline import _HEADER, _NUMBER_TASK, _check_candidate  # noqa: E402
from test_offline import TASKS as ROW_SOURCES  # noqa: E402
from test_offline import _task_source  # noqa: E402

SPACE = KNOB_SPACES[("triton", "elementwise")]
ROW_SPACE = KNOB_SPACES[("triton", "row")]
# test_offline's row tasks: sums, means, max, softmax, log-softmax, LayerNorm, RMSNorm
ROW_TASKS = ("sum_last", "mean_keep", "max_chain", "softmax", "log_softmax", "layernorm",
             "rmsnorm")


def _task(init: str, body: str, args: str = "x", inputs: str = "torch.randn(batch, dim)") -> str:
    init_lines = "\n".join(" " * 8 + ln for ln in init.splitlines()) if init else " " * 8 + "pass"
    return (_HEADER + "class Model(nn.Module):\n    def __init__(self, dim):\n"
            "        super().__init__()\n" + init_lines + "\n\n"
            f"    def forward(self, {args}):\n        {body}\n\n"
            "batch = 8\ndim = 1030\n\n"
            f"def get_inputs():\n    return [{inputs}]\n\n"
            "def get_init_inputs():\n    return [dim]\n")


TASKS = {
    "relu": ("", "return torch.relu(x)"),
    "gelu_scale": ("", "return F.gelu(x) * 2.5"),
    "bias_relu": ("self.bias = nn.Parameter(torch.randn(dim))", "return torch.relu(x + self.bias)"),
    # every op with a Triton formula, NaN-propagating max/min and clamps, IEEE division
    "many_ops": ("self.act = nn.LeakyReLU(0.2)\nself.ht = nn.Hardtanh(-0.5, 0.7)",
                 "return self.act(x) + self.ht(x) * torch.sigmoid(x) + F.silu(x) "
                 "+ torch.clamp(x, min=-0.2) + x ** 2 / 3.0 + F.hardswish(x) "
                 "- F.hardsigmoid(x) + F.softsign(x) + torch.maximum(x, x * 0.5) "
                 "+ torch.sqrt(torch.abs(x) + 1.0) + torch.exp(x * 0.1) "
                 "+ torch.erf(x) + F.relu6(x) + torch.rsqrt(x * x + 1.0) + torch.sin(x)"),
    "two_inputs": ("", "return (x - y) * torch.log(torch.abs(y) + 1.0) + torch.cos(x)"),
    # x (batch, 1, dim) against w (3, dim): two runs of broadcast dims (ir.Leaf's block2)
    "two_runs": ("self.w = nn.Parameter(torch.randn(3, dim))", "return x * self.w + 1.0"),
    # tanh without libdevice (Cephes' tanhf: a polynomial near 0), and tanh-GELU built on it
    "tanh_gelu": ("self.g = nn.GELU(approximate='tanh')",
                  "return torch.tanh(x * 0.3) + self.g(x) + torch.tanh(x * 40.0)"),
}
ARGS = {"two_inputs": ("x, y", "torch.randn(batch, dim), torch.randn(batch, dim)"),
        "two_runs": ("x", "torch.randn(batch, 1, dim)")}
# (batch, dim): sizes under a block, across blocks, and not a multiple of anything
SHAPES = [(3, 7), (5, 1030), (4, 64)]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_tasks")
    for name, (init, body) in TASKS.items():
        args, inputs = ARGS.get(name, ("x", "torch.randn(batch, dim)"))
        (root / f"{name}.py").write_text(_task(init, body, args, inputs))
    (root / "elu.py").write_text(_task("", "return F.elu(x)"))
    (root / "groupnorm.py").write_text(_task(
        "self.gn = nn.GroupNorm(2, 4)", "return self.gn(x)",
        inputs="torch.randn(batch, 4, dim)"))
    for name in ROW_TASKS:
        (root / f"{name}.py").write_text(_task_source(name))
    assert set(ROW_TASKS) <= set(ROW_SOURCES)
    return root


def _ctx(task_dir, name: str) -> TaskContext:
    return TaskContext(Task.from_file(task_dir / f"{name}.py", size="large"), target="triton")


def _kernels(code: str) -> list[str]:
    from assay.verify.policy import triton_kernels

    return sorted(triton_kernels(code))


@pytest.mark.parametrize("name", list(TASKS))
def test_triton_candidates_match_the_reference_in_the_interpreter(task_dir, tmp_path, name):
    ctx = _ctx(task_dir, name)
    props = OfflineSynthesizer("triton", "strict").translate(ctx, n=2, rng=random.Random(0))
    assert len(props) == 2 and len({p.id for p in props}) == 2
    for prop in props:
        assert prop.code is not None, prop.declined
        assert set(prop.knobs) == set(SPACE) and all(prop.knobs[k] in SPACE[k] for k in SPACE)
        assert "import triton" in prop.code and "load_library" not in prop.code
        assert _kernels(prop.code) == ["assay_elementwise"]
        ast.parse(prop.code)
        _check_candidate(prop, ctx, tmp_path, loose=False, shapes=SHAPES)


@pytest.mark.parametrize("name", ROW_TASKS)
def test_triton_row_candidates_match_the_reference_in_the_interpreter(task_dir, tmp_path, name):
    """One program per row, each pass a loop over the columns: blocks smaller than the row
    (several iterations, a masked tail) and larger (one masked iteration) both match."""
    ctx = _ctx(task_dir, name)
    syn = OfflineSynthesizer("triton", "strict")
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    assert len(props) == 2 and all(p.code is not None for p in props), props[0].declined
    props.append(syn.with_knobs(ctx, {"block": 128, "num_stages": 1}))  # 1030 columns: 9 loops
    for prop in props:
        assert set(prop.knobs) == set(ROW_SPACE), prop.knobs
        assert prop.strategy == "rowreduce" and _kernels(prop.code) == ["assay_row"]
        _check_candidate(prop, ctx, tmp_path, loose=True, shapes=SHAPES)


def test_ops_without_an_exact_triton_formula_and_channel_groups_are_declined(task_dir):
    syn = OfflineSynthesizer("triton", "strict")
    (elu,) = syn.translate(_ctx(task_dir, "elu"), n=2, rng=random.Random(0))
    assert elu.code is None and "elu exactly in Triton" in elu.declined, elu.declined
    (groups,) = syn.translate(_ctx(task_dir, "groupnorm"), n=2, rng=random.Random(0))
    assert groups.code is None and "GroupNorm" in groups.declined, groups.declined
    # the cpu and cuda forms of the same task are not affected
    assert OfflineSynthesizer("cpu").translate(_ctx(task_dir, "elu"), 1, random.Random(0))[0].code


def test_evolution_operators_stay_in_tritons_knob_space(task_dir):
    ctx = _ctx(task_dir, "gelu_scale")
    syn = OfflineSynthesizer("triton", "strict")
    rng = random.Random(3)
    (first, second) = syn.translate(ctx, n=2, rng=rng)
    parents = [Parent(id=p.id, code=p.code, verdict={}, meta={"knobs": p.knobs}) for p in (first, second)]
    kids = syn.mutate(ctx, parents[0], n=3, rng=rng) + syn.crossover(ctx, parents, rng=rng)
    kids += syn.repair(ctx, parents[1], rng=rng)
    for kid in kids:
        assert kid.code is not None and set(kid.knobs) == set(SPACE)
        assert all(kid.knobs[k] in SPACE[k] for k in SPACE), kid.knobs
        assert f"BLOCK={kid.knobs['block']}, num_warps={kid.knobs['num_warps']}" in kid.code
    assert all(k.knobs != parents[0].meta["knobs"] for k in kids[:3])


@pytest.mark.parametrize("zoo, knobs, kernel", [
    # the largest block: the interpreter runs one Python iteration per program
    ("level1/1_gelu", {"block": 8192}, "assay_elementwise"),
    ("level1/3_softmax", {"block": 4096}, "assay_row"),
    ("level2/1_gemm_bias_relu", {"block_m": 64, "block_n": 128, "block_k": 64}, "assay_gemm")])
def test_the_verifier_accepts_a_synthesized_triton_kernel(tmp_path, zoo, knobs, kernel):
    """End to end on cpu: the synthesizer's Triton kernels, verified in the sandbox (where the
    worker runs Triton's interpreter), are accepted under strict with their kernel audited."""
    from test_zoo import GENEROUS_PEAKS, prepared, record, zoo_config, zoo_task

    task = zoo_task(zoo)
    ctx = TaskContext(task, target="triton")
    prop = OfflineSynthesizer("triton", "strict").with_knobs(ctx, knobs)
    path = tmp_path / f"{prop.id}.py"
    path.write_text(prop.code)
    meta = {"POLICY": "strict", "CONFIG": {}}
    v = verify_candidate(task, path, zoo_config(meta), record(task), GENEROUS_PEAKS,
                         prepared(task))
    assert v.accepted, (v.reasons, {k: c["detail"][:300] for k, c in v.checks.items()
                                    if not c["passed"]})
    assert f"triton::{kernel}" in v.kernels_launched


def verify_candidate(task, path, cfg, rec, peaks, prep):
    from assay.verify.harness import verify

    return verify(task, path, "cpu", cfg, record=rec, peaks=peaks, prepared=prep)


# --- the gemm family's Triton form -------------------------------------------------------------

from test_offline import GEMM_TASKS, _check_gemm, _gemm_source  # noqa: E402

TRITON_GEMM = ("linear_relu", "linear3d_gelu", "matmul_bias_sigmoid", "bmm_scale",
               "scores_bt_relu",
               "linear_softmax",
               "linear_residual_ln", "matmul_sigmoid_sum", "bmm_scale_float16",
               "bmm_scale_bfloat16")
GEMM_DECLINED = {"conv_relu_bias": "in Triton yet (a convolution)",
                 "conv_gn_tanh": "in Triton yet (a convolution)"}


@pytest.fixture(scope="module")
def gemm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_gemm")
    for name in GEMM_TASKS:
        (root / f"{name}.py").write_text(_gemm_source(name))
    for dtype in ("float16", "bfloat16"):
        (root / f"bmm_scale_{dtype}.py").write_text(_gemm_source("bmm_scale", dtype))
    return root


@pytest.mark.parametrize("name", TRITON_GEMM)
def test_triton_gemm_candidates_match_the_reference_in_the_interpreter(gemm_dir, tmp_path,
                                                                       name):
    """A tile of the output per program, tl.dot over K slabs (IEEE float32; float32
    accumulation for float16/bfloat16), the elementwise epilogue fused into the store, or the
    product stored for the row kernel that follows (softmax, LayerNorm, a sum); odd sizes
    and several K slabs (test_offline's GEMM_SIZES)."""
    ctx = TaskContext(Task.from_file(gemm_dir / f"{name}.py"), target="triton")
    syn = OfflineSynthesizer("triton", "strict")
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    assert len(props) == 2 and all(p.code is not None for p in props), props[0].declined
    if name.endswith("bfloat16"):
        # Triton 3.9's interpreter multiplies bfloat16 tiles wrongly (tl.dot of two 16 x 16
        # randn tiles off by 1e10; bfloat16 loads and stores are right): written here, checked
        # on the GPU (benchmarks/synth_suite.py's bfloat16 probe tasks)
        assert all("tl.dot(a, b)" in p.code for p in props)
        pytest.skip("bfloat16 tl.dot is wrong in Triton's interpreter; checked on the GPU")
    props.append(syn.with_knobs(ctx, {"block_m": 32, "block_n": 32, "block_k": 16}))
    # a Linear's weight (or a batched B^T) as [BN, BK] tiles in its own row order, then
    # tl.trans (knob b_rows, a knob of such products only: another has no transposed operand)
    rows = {"block_m": 32, "block_n": 64, "block_k": 16, "b_rows": 1}
    if name.startswith(("linear", "scores_bt")):
        props.append(syn.with_knobs(ctx, rows))
        assert "tl.trans(bt)" in props[-1].code
    else:
        with pytest.raises(ValueError, match="b_rows"):
            syn.with_knobs(ctx, rows)
    for prop in props:
        assert prop.knobs["lib"] == 0 and "POLICY = \"strict\"" in prop.code
        want = ["assay_gemm"] + (["assay_row"] if "softmax" in name or "_ln" in name
                                 or "sum" in name else [])
        assert _kernels(prop.code) == sorted(want), _kernels(prop.code)
        assert ('input_precision="ieee"' in prop.code) == ("float" not in name.split("_")[-1])
        _check_gemm(prop, ctx, name, tmp_path)


@pytest.mark.parametrize("name", sorted(GEMM_DECLINED))
def test_triton_gemm_declines_what_it_cannot_write_exactly(gemm_dir, name):
    ctx = TaskContext(Task.from_file(gemm_dir / f"{name}.py"), target="triton")
    (prop,) = OfflineSynthesizer("triton", "strict").translate(ctx, 2, random.Random(0))
    assert prop.code is None and GEMM_DECLINED[name] in prop.declined, prop.declined


def test_number_arguments_in_the_interpreter(tmp_path):
    """Numbers given to the forward (KernelBench L1_5's scalar) are read at each call by the
    Triton form too."""
    (tmp_path / "number.py").write_text(_NUMBER_TASK)
    ctx = TaskContext(Task.from_file(tmp_path / "number.py"), target="triton")
    prop = OfflineSynthesizer("triton").translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    path = tmp_path / f"number_{prop.id}.py"
    path.write_text(prop.code)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    cand = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cand)
    new = cand.ModelNew().eval()
    a = torch.randn(5, 70)
    for s, c in ((3.5, 2), (-1.25, 0.5)):
        with torch.no_grad():
            got = new(a, s, c)
        expected = torch.relu(a * s) + c * a.sum(dim=1, keepdim=True)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# --- the pool family's Triton form -------------------------------------------------------------

from test_offline_pool import POOLS  # noqa: E402
from test_offline_pool import _check as _check_pool  # noqa: E402
from test_offline_pool import _source as _pool_source  # noqa: E402

POOL_SPACE = KNOB_SPACES[("triton", "pool")]
# (batch, h, w): two sizes per case, odd and even (ceil_mode's last window overhangs the
# padded input at one of them); 3-D tasks pool a depth of h - 2
POOL_SHAPES = [(2, 9, 11), (1, 16, 20)]
POOL_TASKS = {
    # 81 taps: more than UNROLL_TAPS, run-time window loops by default
    "avg_9x9": ("", "return F.avg_pool2d(x, 9, stride=1, padding=4, count_include_pad=False)",
                "batch, 2, h, w"),
    "max_elu": ("", "return F.elu(F.max_pool2d(x, 2))", "batch, 2, h, w"),
}


@pytest.fixture(scope="module")
def pool_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton_pool")
    for name, spec in {**POOLS, **POOL_TASKS}.items():
        (root / f"{name}.py").write_text(_pool_source(*spec))
    return root


def _pool_ctx(pool_dir, name: str) -> TaskContext:
    return TaskContext(Task.from_file(pool_dir / f"{name}.py", size="large"), target="triton")


@pytest.mark.parametrize("name", sorted(POOLS) + ["avg_9x9"])
def test_triton_pool_candidates_match_torch_in_the_interpreter(pool_dir, tmp_path, name):
    """Max and average pooling, 1-, 2- and 3-D, with stride, padding, dilation, ceil_mode,
    count_include_pad=False, divisor_override and a fused epilogue: one program per block of
    outputs, each window tap a masked load; the window unrolled and in run-time loops; equal
    to torch up to float rounding, NaN included (test_offline_pool._check)."""
    ctx = _pool_ctx(pool_dir, name)
    syn = OfflineSynthesizer("triton", "strict")
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    assert len(props) == 2 and all(p.code is not None for p in props), props[0].declined
    first = props[0].knobs
    assert first["unroll"] == (0 if name == "avg_9x9" else 1), first  # the defaults
    props.append(syn.with_knobs(ctx, {"block": 64, "num_warps": 1, "unroll": 1 - first["unroll"]}))
    for prop in props:
        assert set(prop.knobs) == set(POOL_SPACE), prop.knobs
        assert all(prop.knobs[k] in POOL_SPACE[k] for k in POOL_SPACE), prop.knobs
        assert prop.strategy == "pooling" and _kernels(prop.code) == ["assay_pool"]
        forward = prop.code.split("class ModelNew")[1]
        assert "load_library" not in prop.code  # no library pooling either:
        assert not any(f"_pool{d}d(" in forward for d in (1, 2, 3)), forward
        loop = "tl.static_range(KW)" if prop.knobs["unroll"] else "range(KW)"
        assert f"for kw in {loop}:" in prop.code
        _check_pool(prop.code, pool_dir / f"{name}.py", tmp_path, "cpu", POOL_SHAPES)


def test_triton_pool_declines_an_epilogue_without_an_exact_triton_formula(pool_dir):
    (prop,) = OfflineSynthesizer("triton", "strict").translate(_pool_ctx(pool_dir, "max_elu"), 2,
                                                               random.Random(0))
    assert prop.code is None and "elu exactly in Triton" in prop.declined, prop.declined


def test_triton_pool_evolution_operators_stay_in_tritons_knob_space(pool_dir):
    ctx = _pool_ctx(pool_dir, "max_3s2p1")
    syn = OfflineSynthesizer("triton", "strict")
    base = syn.translate(ctx, 1, random.Random(0))[0]
    assert base.knobs == {"block": 256, "num_warps": 4, "unroll": 1}
    parent = Parent(base.id, base.code, {}, {"knobs": base.knobs})
    kids = syn.mutate(ctx, parent, 4, random.Random(1))
    assert kids and all(k.knobs != base.knobs for k in kids)
    other = kids[0]
    kids += syn.crossover(ctx, [parent, Parent(other.id, other.code, {}, {"knobs": other.knobs})],
                          random.Random(2))
    repaired = syn.repair(ctx, parent, random.Random(3))[0]
    for kid in kids + [repaired]:
        assert kid.code is not None and set(kid.knobs) == set(POOL_SPACE)
        assert all(kid.knobs[k] in POOL_SPACE[k] for k in POOL_SPACE), kid.knobs
        assert f"BLOCK={kid.knobs['block']}, num_warps={kid.knobs['num_warps']})" in kid.code
    assert repaired.knobs == {"block": 128, "num_warps": 4, "unroll": 0}  # the safe form


def test_the_verifier_accepts_a_synthesized_triton_pool_kernel(pool_dir, tmp_path):
    """End to end on cpu, as for the other families: average pooling with ceil_mode and
    count_include_pad=False, verified in the sandbox under strict, its kernel audited."""
    from test_zoo import GENEROUS_PEAKS, prepared, record, zoo_config

    task = Task.from_file(pool_dir / "avg_ceil_nopad.py")
    prop = OfflineSynthesizer("triton", "strict").with_knobs(
        TaskContext(task, target="triton"), {"block": 1024})
    path = tmp_path / f"{prop.id}.py"
    path.write_text(prop.code)
    v = verify_candidate(task, path, zoo_config({"POLICY": "strict", "CONFIG": {}}),
                         record(task), GENEROUS_PEAKS, prepared(task))
    assert v.accepted, (v.reasons, {k: c["detail"][:300] for k, c in v.checks.items()
                                    if not c["passed"]})
    assert "triton::assay_pool" in v.kernels_launched
