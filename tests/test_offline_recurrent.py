"""The offline synthesizer's recurrent family (ir.Recurrent, families/recurrent.py): nn.GRU and
nn.LSTM, every layer and direction, as a kernel of its own.

CPU candidates are built with g++ and compared with torch at two sizes (the sizes, layers,
directions and layout read at run time); CUDA sources are compiled with nvcc here and compared
on the device by the tests marked ``gpu``.
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
from assay.propose.offline.ir import Recurrent
from assay.propose.offline.stages import Pipeline
from assay.tasks.instantiate import make_inputs
from assay.tasks.model import Task
from conftest import import_file
from helpers import (KERNELBENCH, assert_calls_as_declared, assert_matches_reference,
                     build_cuda_sources, task_ctx)

pytestmark = pytest.mark.usefixtures("offline_builds")


# name: (init body, forward signature, forward body, inputs, sizes, other sizes, kernels)
TASKS = {
    # the output sequence of a 3-layer bidirectional batch-first GRU
    "gru_bi_bf": ("self.rnn = nn.GRU(i, h, 3, batch_first=True, bidirectional=True)", "x, h0",
                  "out, hn = self.rnn(x, h0)\nreturn out",
                  "torch.randn(b, t, i), torch.randn(6, b, h)",
                  {"b": 3, "t": 5, "i": 4, "h": 6}, {"b": 2, "t": 9, "i": 3, "h": 33}, 1),
    # the final hidden state of a one-layer GRU without biases, no initial state given
    "gru_hn_nobias": ("self.rnn = nn.GRU(i, h, bias=False)", "x",
                      "_, hn = self.rnn(x)\nreturn hn", "torch.randn(t, b, i)",
                      {"b": 2, "t": 4, "i": 5, "h": 7}, {"b": 11, "t": 1, "i": 2, "h": 3}, 1),
    # an LSTM's cell state, with a linear layer on its output that nothing reads (KernelBench
    # L3_37: the unread work is dropped)
    "lstm_cn_dead_fc": ("self.rnn = nn.LSTM(i, h, 2)\nself.fc = nn.Linear(h, 3)",
                        "x, h0, c0",
                        "out, state = self.rnn(x, (h0, c0))\nout = self.fc(out[:, -1, :])\n"
                        "return state[1]",
                        "torch.randn(t, b, i), torch.randn(2, b, h), torch.randn(2, b, h)",
                        {"b": 3, "t": 5, "i": 4, "h": 6}, {"b": 1, "t": 7, "i": 9, "h": 2}, 1),
    # a bidirectional batch-first LSTM's hidden state, then more work on it (two kernels)
    "lstm_bi_hn_then_relu": ("self.rnn = nn.LSTM(i, h, 2, batch_first=True, "
                             "bidirectional=True)", "x, h0, c0",
                             "_, (hn, cn) = self.rnn(x, (h0, c0))\nreturn torch.relu(hn) * 2.0",
                             "torch.randn(b, t, i), torch.randn(4, b, h), "
                             "torch.randn(4, b, h)",
                             {"b": 2, "t": 6, "i": 3, "h": 5}, {"b": 4, "t": 2, "i": 8, "h": 9},
                             2),
    # KernelBench L3_38's form: the last step of a bidirectional batch-first LSTM's output (a
    # transposed view, as torch returns it, whose slice is copied by its strides), then a
    # linear layer
    "lstm_bi_last_step_fc": ("self.rnn = nn.LSTM(i, h, 2, batch_first=True, "
                             "bidirectional=True)\nself.fc = nn.Linear(2 * h, 3)", "x, h0, c0",
                             "out, hn = self.rnn(x, (h0, c0))\nreturn self.fc(out[:, -1, :])",
                             "torch.randn(b, t, i), torch.randn(4, b, h), "
                             "torch.randn(4, b, h)",
                             {"b": 2, "t": 6, "i": 3, "h": 5}, {"b": 4, "t": 2, "i": 8, "h": 9},
                             3),
}


def _source(name: str) -> str:
    init, sig, body, inputs, sizes, _, _ = TASKS[name]
    return ("import torch\nimport torch.nn as nn\n\n"
            + "".join(f"{k} = {v}\n" for k, v in sizes.items())
            + "\n\nclass Model(nn.Module):\n    def __init__(self, i, h):\n"
            + "        super().__init__()\n" + textwrap.indent(init, " " * 8) + "\n\n"
            + f"    def forward(self, {sig}):\n" + textwrap.indent(body, " " * 8) + "\n\n\n"
            + f"def get_inputs():\n    return [{inputs}]\n\n\n"
            + "def get_init_inputs():\n    return [i, h]\n")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recurrent_tasks")
    for name in TASKS:
        (root / f"{name}.py").write_text(_source(name))
    return root


def _check(code: str, ctx: TaskContext, name: str, tmp_path: Path, device: str = "cpu") -> None:
    assert_matches_reference(code, tmp_path / f"cand_{name}_{abs(hash(code))}.py", ctx,
                             [{}, TASKS[name][5]], device, atol=1e-5)


@pytest.mark.parametrize("name", list(TASKS))
def test_recurrent_candidates_match_torch(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name)
    syn = OfflineSynthesizer("cpu")
    plan = syn.analyse(ctx).plan
    kernels = TASKS[name][6]
    stages = plan.stages if isinstance(plan, Pipeline) else [syn.analyse(ctx)]
    assert len(stages) == kernels and isinstance(stages[0].plan, Recurrent)
    props = syn.translate(ctx, n=2, rng=random.Random(0))
    assert len({p.id for p in props}) == 2  # both OpenMP forms
    for prop in props:
        assert prop.code is not None, prop.declined
        assert 'POLICY = "strict"' in prop.code
        _check(prop.code, ctx, name, tmp_path)


def test_training_mode_with_dropout_is_refused(task_dir, tmp_path):
    """Dropout between layers is eval-mode only here: in training mode the candidate says so
    rather than computing another function."""
    src = _source("gru_bi_bf").replace("bidirectional=True)", "bidirectional=True, dropout=0.5)")
    (tmp_path / "drop.py").write_text(src)
    ctx = task_ctx(tmp_path, "drop")
    prop = OfflineSynthesizer("cpu").translate(ctx, n=1, rng=random.Random(0))[0]
    cand = import_file(prop.code, tmp_path / "cand_drop.py")
    mod = ctx.task.module()
    model = cand.ModelNew(*mod.get_init_inputs())
    with pytest.raises(RuntimeError, match="eval-mode"):
        model.train()(*make_inputs(mod, seed=1, device="cpu"))


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_entry_point_is_called_as_declared(task_dir, target):
    syn = OfflineSynthesizer(target)
    for name in TASKS:
        for prop in syn.translate(task_ctx(task_dir, name, target), n=2, rng=random.Random(0)):
            assert_calls_as_declared(prop.code, "assay_rnn", name)


@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_cuda_recurrent_kernels_build(task_dir, tmp_path):
    """Both cells build with nvcc, every warp count and batch-rows value among them."""
    syn = OfflineSynthesizer("cuda")
    sources = {}
    for name in ("gru_bi_bf", "lstm_cn_dead_fc"):
        ctx = task_ctx(task_dir, name, "cuda")
        # every batch-rows value at one warp count, every warp count at the most rows
        for warps, bt in {(4, b) for b in (2, 4, 8)} | {(w, 8) for w in (2, 8)}:
            prop = syn.with_knobs(ctx, {"warps": warps, "bt": bt})
            cand = import_file(prop.code, tmp_path / f"cuda_{prop.id}.py")
            assert "cuda_stream" in prop.code
            sources.setdefault(cand.SOURCE, (name, warps, bt))
    assert len(sources) == 10
    build_cuda_sources(sources)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(TASKS))
def test_cuda_recurrent_candidates_match_torch(task_dir, tmp_path, name):
    ctx = task_ctx(task_dir, name, "cuda")
    syn = OfflineSynthesizer("cuda")
    plan = syn.analyse(ctx).plan
    # a pipeline's knobs are its stages' (s<k>.warps): the recurrent stage's
    at = next(f"s{k}." for k, st in enumerate(plan.stages) if isinstance(st.plan, Recurrent)) \
        if isinstance(plan, Pipeline) else ""
    for knobs in ({}, {at + "warps": 2, at + "bt": 2}):
        code = syn.with_knobs(ctx, knobs).code if knobs else \
            syn.translate(ctx, n=1, rng=random.Random(0))[0].code
        _check(code, ctx, name, tmp_path, "cuda")


@pytest.mark.skipif(not KERNELBENCH.is_dir(), reason="KernelBench checkout not present")
@pytest.mark.parametrize("stem, result", [
    ("level3/39_GRU", "output"), ("level3/40_GRUHidden", "h_n"),
    ("level3/42_GRUBidirectionalHidden", "h_n"), ("level3/36_LSTMHn", "h_n"),
    ("level3/37_LSTMCn", "c_n"), ("level3/38_LSTMBidirectional", "output"),
])
def test_kernelbench_recurrent_tasks_get_a_plan(stem, result):
    ctx = TaskContext(Task.from_file(KERNELBENCH / f"{stem}.py"), target="cuda")
    plan = OfflineSynthesizer("cuda").analyse(ctx).plan
    plan = plan.stages[0].plan if isinstance(plan, Pipeline) else plan
    assert isinstance(plan, Recurrent) and plan.result == result
