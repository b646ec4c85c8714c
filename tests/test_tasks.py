"""Task loading, discovery and analysis (FLOPs, bytes, degeneracy)."""

from __future__ import annotations

import pytest

from assay.tasks.analyze import cost, degeneracy
from assay.tasks.model import Task, TaskError
from assay.tasks.suite import discover
from helpers import REPO

MATMUL = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, a, b):
        return a @ b
M, K, N = 64, 32, 48
ASSAY_SIZES = {"small": {"M": 8, "K": 4, "N": 6}}
def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]
def get_init_inputs():
    return []
"""


def test_sizes_override_module_globals(write_file):
    path = write_file("level1/3_Mm.py", MATMUL)
    large = Task.from_file(path)
    small = Task.from_file(path, size="small")
    assert (large.id, large.level, large.number, large.name) == ("L1_3_Mm", 1, 3, "Mm")
    a, b = small.module().get_inputs()
    assert a.shape == (8, 4) and b.shape == (4, 6)
    assert large.module().get_inputs()[0].shape == (64, 32)


def test_cost_counts_matmul_flops_and_bytes(write_file):
    rec = cost(Task.from_file(write_file("level1/3_Mm.py", MATMUL)))
    assert rec["flops"] == 2 * 64 * 32 * 48
    assert rec["min_bytes"] == 4 * (64 * 32 + 32 * 48 + 64 * 48)
    assert rec["analyzed_on"] == "meta"


@pytest.mark.parametrize("text,problem", [
    ("def get_inputs(:\n", "syntax error"),
    ("import torch\ndef get_inputs():\n    return []\n", "missing Model, get_init_inputs"),
])
def test_bad_files_give_one_clear_line(write_file, text, problem):
    path = write_file("level1/1_Bad.py", text)
    with pytest.raises(TaskError) as e:
        Task.from_file(path)
    assert str(path) in str(e.value) and problem in str(e.value)
    assert "\n" not in str(e.value)


def test_discover_filters_and_reports_bad_files(write_file, tmp_path):
    write_file("tasks/level1/1_Mm.py", MATMUL)
    write_file("tasks/level1/2_Broken.py", "class Model(:\n")
    write_file("tasks/level2/1_Mm2.py", MATMUL)
    refs, errors = discover(tmp_path / "tasks")
    assert [r.id for r in refs] == ["L1_1_Mm", "L2_1_Mm2"]
    assert len(errors) == 1 and "2_Broken.py" in errors[0]
    refs, _ = discover(tmp_path / "tasks", levels=[2])
    assert [r.id for r in refs] == ["L2_1_Mm2"]
    refs, _ = discover(tmp_path / "tasks", include=["L1_*"])
    assert [r.id for r in refs] == ["L1_1_Mm"]
    # A single KernelBench-style level folder loads as it is.
    refs, _ = discover(tmp_path / "tasks" / "level1")
    assert [r.id for r in refs] == ["L1_1_Mm"]


def test_bundled_suite_discovers_three_levels():
    refs, errors = discover(REPO / "data" / "tasks")
    assert not errors
    assert {r.level for r in refs} == {1, 2, 3} and len(refs) >= 24


def test_degeneracy_flags_the_degenerate_bundled_task():
    path = next((REPO / "data" / "tasks" / "level2").glob("*Degenerate*.py"))
    rep = degeneracy(Task.from_file(path, size="small"))
    assert rep["degenerate"] and "inputs change" in rep["why"]
    ok = degeneracy(Task.from_file(REPO / "data/tasks/level1/1_ReLU.py", size="small"))
    assert not ok["degenerate"] and ok["input_sensitivity"] > 0.1


WIDE_SOFTMAX = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1) + {offset}
def get_inputs():
    return [torch.randn(4, 65536)]
def get_init_inputs():
    return []
"""


def test_nearly_constant_is_relative_to_the_outputs_size(write_file):
    """A softmax over a wide row has a tiny spread (about 1e-5 here; KernelBench's L1_23 at
    393,216 values: 7e-7) and is not constant; the same plus 1000 is (its mean, as a constant,
    passes float32's rtol), though its spread is the same."""
    wide = degeneracy(Task.from_file(write_file("level1/1_WideSoftmax.py",
                                                WIDE_SOFTMAX.format(offset=0.0))))
    assert wide["output_spread"] < 1e-4 and wide["relative_spread"] > 0.1
    assert not wide["degenerate"], wide["why"]
    lifted = degeneracy(Task.from_file(write_file("level1/2_LiftedSoftmax.py",
                                                  WIDE_SOFTMAX.format(offset=1000.0))))
    assert lifted["degenerate"] and "nearly constant" in lifted["why"], lifted
    assert lifted["relative_spread"] < 1e-7


CONV_THEN_LINEAR = """
import torch
from torch import nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose2d(4, 4, 3)
        self.fc = nn.Linear(4 * 10 * 10, 3)
        # Swin's drop-path schedule: .item() in a constructor (no meta build can run it)
        self.rate = [x.item() for x in torch.linspace(0, 0.1, 2)]
    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))
def get_inputs():
    return [torch.randn(2, 4, 8, 8)]
def get_init_inputs():
    return []
"""


def test_floor_flops_leave_convolutions_out_and_degeneracy_builds_real_models(write_file):
    """A convolution's direct-form FLOPs are no floor (Winograd and FFT algorithms do less:
    cuDNN beat the fp32 rate on KernelBench's ConvTranspose2d), a GEMM's are; and a model
    whose constructor calls .item() still gets its degeneracy numbers (KernelBench's Swin
    tasks were errors in the H200 self-check)."""
    task = Task.from_file(write_file("level2/1_ConvLinear.py", CONV_THEN_LINEAR))
    rec = cost(task)
    conv = 2 * 2 * 4 * 4 * 9 * 8 * 8  # batch, cin, cout, kernel, input pixels
    linear = 2 * 2 * 400 * 3
    assert rec["flops"] == conv + linear and rec["floor_flops"] == linear
    rep = degeneracy(task)
    assert not rep["degenerate"] and rep["weight_sensitivity"] is not None


def test_off_grid_data_keeps_its_values_and_defeats_narrow_rounding(monkeypatch):
    """``off_grid``: every float32 value moves by under 0.45% of itself, to where rounding it to
    bfloat16 or float16 (nearest or toward zero) shrinks it, all the same way; layout and
    other dtypes are kept, and chunking changes nothing."""
    import torch

    from assay.tasks import instantiate
    from assay.tasks.instantiate import off_grid

    x = torch.randn(100_003) * 3
    y = off_grid(x)
    assert ((y - x).abs() <= 0.0045 * x.abs()).all() and torch.equal(off_grid(y), y)
    grid = x.to(torch.bfloat16).float()
    assert torch.equal(y.to(torch.bfloat16).float(), grid)
    normal = grid.abs() > 1e-4  # float16's normal range: its grid holds bf16's there
    assert torch.equal(y.half().float()[normal], grid[normal])
    assert (y.abs() > grid.abs())[grid != 0].all() and (y[grid == 0] == 0).all()
    # rounding errors all of one sign: a mean of them does not average out
    assert float(((y.to(torch.bfloat16).float() - y) / y)[normal].max()) < -2 ** -13
    t = torch.randn(64, 48).t()
    assert off_grid(t).stride() == t.stride() and torch.equal(off_grid(t), off_grid(t.contiguous()))
    for other in (torch.randn(8, dtype=torch.float64), torch.randn(8).half(), torch.arange(8)):
        assert off_grid(other) is other
    monkeypatch.setattr(instantiate, "_OFF_GRID_CHUNK", 1000)
    assert torch.equal(off_grid(x), y)


LINEAR = """
import torch
from torch import nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)
    def forward(self, x):
        return torch.relu(self.fc(x))
def get_inputs():
    return [torch.randn(16, 64)]
def get_init_inputs():
    return []
"""


def test_the_extract_checks_the_forward_once_and_says_where_its_seconds_went(
        write_file, monkeypatch, tmp_path):
    """The extract child's checked forward (the reference model and its outputs on the first
    input set) is degeneracy's base run: the same numbers as a degeneracy that makes its own,
    with two models built instead of three and three forwards instead of four (each one seconds
    of a held GPU at KernelBench's sizes); the record says how long each stage took. Its work
    on the meta device (sizes, FLOPs) comes before it waits for the GPU: on an H200 those stages
    took 3-9 s of a held device per KernelBench task."""
    from assay import gpu
    from assay.tasks import analyze, instantiate, record

    task = Task.from_file(write_file("level2/1_Linear.py", LINEAR))  # FLOPs counted on meta
    import gc
    import weakref

    built, forwards, alive_at_seed_4 = [], [], []
    base_model: list = []
    real_reference_model = instantiate.reference_model

    def counting_reference_model(module, seed, device):
        built.append(seed)
        if seed == 4:  # the base model is gone before the other weights' model is built
            gc.collect()
            alive_at_seed_4.append(base_model[-1]() is not None)
        model = real_reference_model(module, seed, device)
        if seed == 1:
            base_model.append(weakref.ref(model))
        model.register_forward_hook(lambda *a: forwards.append(seed))
        return model

    monkeypatch.setattr(analyze, "reference_model", counting_reference_model)
    monkeypatch.setattr(instantiate, "reference_model", counting_reference_model)
    alone = analyze.degeneracy(task)
    assert sorted(built) == [1, 4] and len(forwards) == 3  # base, other inputs, other weights
    built.clear(), forwards.clear()

    spec = {"path": str(task.path), "level": 2, "size": "large", "target": "cpu",
            "stage": str(write_file("stage", "")), "max_bytes": None,
            "device_lock": str(tmp_path / "gpu.lock")}
    held = len(gpu._device_held)

    def second_meta_pass(*a):
        raise AssertionError("sized on the meta device again: cost's pass says it all")

    monkeypatch.setattr(record, "_size_on_meta", second_meta_pass)
    try:
        rec = record.analyze(spec)
    finally:  # the child holds the lock until it exits: this test is no child
        while len(gpu._device_held) > held:
            gpu._unlock(gpu._device_held.pop())
    assert sorted(built) == [1, 4] and len(forwards) == 3, (built, forwards)
    assert rec["degeneracy"] == alone
    assert alive_at_seed_4 == [False, False], alive_at_seed_4  # alone, then the extract's
    stages = rec["analysis_s"]
    assert list(stages)[:2] == ["reading the file", "executing the file"], stages
    assert {"running forward", "analyzing degeneracy"} <= set(stages), stages
    order = list(stages)
    assert order.index("sizing the task and counting its FLOPs on the meta device") \
        < order.index(record.WAITING) < order.index("constructing Model(*get_init_inputs())")
    assert rec["analyzed_on"] == "meta" and rec["flops"] > 0
    assert rec["weight_bytes"] == (64 * 32 + 32) * 4  # the Linear's weight and bias
    assert all(isinstance(s, float) and s >= 0 for s in stages.values())


ITEM = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x):
        return x * x.abs().max().item()  # .item(): no meta kernel
def get_inputs():
    return [torch.randn(16, 64)]
def get_init_inputs():
    return []
"""


def test_a_forward_without_a_meta_kernel_is_sized_from_its_inputs_and_counted_on_the_cpu(
        write_file, tmp_path):
    """Where the meta pass cannot run the forward, the inputs and weights are sized on the meta
    device all the same (an absurd size is said before anything runs for real), and FLOPs are
    counted on the CPU only after the size check."""
    from assay.tasks import record

    path = write_file("level1/1_Item.py", ITEM)
    spec = {"path": str(path), "level": 1, "size": "large", "target": "cpu",
            "stage": str(write_file("stage", "")), "max_bytes": None}
    rec = record.analyze(spec)
    order = list(rec["analysis_s"])
    assert rec["analyzed_on"] == "cpu", rec
    assert order.index("running forward") < order.index("measuring FLOPs and bytes on the CPU")
    with pytest.raises(record.TaskError) as e:
        record.analyze({**spec, "max_bytes": 1000})
    line = str(e.value)
    assert "absurd size: inputs (16, 64) need" in line and "outputs" not in line, line


MODES = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)
        self.kept = nn.BatchNorm2d(3)
        self.kept.eval()     # a task that asks for its running statistics
        self.drop = nn.Dropout(0.5)
        self.rnn = nn.GRU(4, 4, num_layers=2, dropout=0.5)

    def forward(self, x):
        return self.drop(self.kept(self.bn(x)))

def get_inputs():
    return [torch.randn(2, 3, 4, 4)]

def get_init_inputs():
    return []
"""


def test_tasks_run_as_kernelbench_runs_them_without_its_randomness(write_file):
    """instantiate.task_mode: KernelBench never calls .eval(), so a BatchNorm normalizes with
    the batch's statistics (a CNN's output then moves with its input, where eval mode's default
    running statistics made it a constant); one its task put in eval mode keeps its running
    statistics; dropout and recurrent dropout are identity (a random output cannot be
    checked). The reference and the baselines get it from build_model, the worker for the
    candidate from task_mode itself."""
    import torch

    from assay.tasks.instantiate import make_inputs, reference_model
    from assay.tasks.model import Task

    task = Task.from_file(write_file("level1/5_Modes.py", MODES))
    model = reference_model(task.module(), 0, "cpu")
    assert model.bn.training and not model.kept.training
    assert not any(m.training for m in (model, model.drop, model.rnn))
    x, = make_inputs(task.module(), 1, "cpu")
    with torch.no_grad():
        y, again = model(x), model(x)
    assert torch.equal(y, again)  # no dropout drawn
    mu = x.mean(dim=(0, 2, 3), keepdim=True)
    var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    bn = (x - mu) / torch.sqrt(var + 1e-5)  # the batch's statistics (weight 1, bias 0 kept)
    w, b = model.bn.weight.view(1, -1, 1, 1), model.bn.bias.view(1, -1, 1, 1)
    kept = model.kept
    expected = ((bn * w + b) - kept.running_mean.view(1, -1, 1, 1)) / torch.sqrt(
        kept.running_var.view(1, -1, 1, 1) + 1e-5) * kept.weight.view(1, -1, 1, 1) \
        + kept.bias.view(1, -1, 1, 1)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
