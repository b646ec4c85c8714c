"""Module state in a traced forward (``rewrites.one_node_per_attribute``, ``module_state``,
``device_moves``): a module tensor that the forward writes (in place, or by setting the
attribute, as KernelBench's L3_33 sets ``self.hidden``) is state kept between calls, which no
plan holds. Where the forward overwrites it whole before reading it (``self.hidden.copy_(h0)``)
its output depends on this call's inputs alone, and it is planned: the reads after the copy read
its source. Where it reads the value the previous call left, it is declined, saying so.

``v.to(t.device)`` of two values on the verifier's device moves nothing; a plain tensor
attribute (``self.t = torch.ones(...)``: ``Module.to`` moves parameters and buffers only) is not
on it, so a device guard against one is not decided while tracing.
"""

from __future__ import annotations

import random

import pytest
import torch

from assay.bench.build import nvcc_path
from assay.propose.base import TaskContext
from assay.propose.offline import OfflineSynthesizer
from assay.tasks.model import Task
from helpers import (KERNELBENCH as KB, assert_accepted_on_cpu, assert_matches_reference,
                     assert_translations_match_reference, build_cuda_candidates, small_copy,
                     task_ctx, translations)

pytestmark = pytest.mark.usefixtures("offline_builds")

VANILLA_RNN = KB / "level3" / "33_VanillaRNN.py"
# the module's sizes (odd), and other sizes checked with the same candidate
SIZES = {"batch_size": 3, "input_size": 7, "hidden_size": 5, "output_size": 4}
OTHER = {"batch_size": 6, "input_size": 9, "hidden_size": 11, "output_size": 2}

needs_kernelbench = pytest.mark.skipif(not VANILLA_RNN.is_file(),
                                       reason="KernelBench checkout not present")

_HEAD = """import torch
import torch.nn as nn

rows, n = 4, 6


class Model(nn.Module):
    def __init__(self, rows, n):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n))
"""

_TAIL = """

def get_inputs():
    return [torch.randn(rows, n), torch.randn(rows, n)]


def get_init_inputs():
    return [rows, n]
"""

# name: (the rest of __init__ and the forward, what a decline must say or None: planned)
FORMS = {
    # a buffer overwritten whole, then read twice (fx records a node per read)
    "copied_buffer": ("""        self.register_buffer("state", torch.zeros(rows, n))

    def forward(self, x, h):
        self.state.copy_(h)
        return torch.tanh(x * self.w + self.state) + self.state
""", None),
    # L3_33's form: a plain attribute overwritten, moved to the input's device, set again
    "reassigned_attribute": ("""        self.hidden = torch.randn(rows, n)

    def forward(self, x, h):
        self.hidden.copy_(h)
        self.hidden = self.hidden.to(x.device)
        self.hidden = torch.tanh(x + self.hidden)
        return self.hidden * self.w
""", None),
    # set by the forward, its old value read by nothing the output needs (dropped)
    "reassigned_unread": ("""        self.hidden = torch.zeros(rows, n)

    def forward(self, x, h):
        unused = self.hidden * x
        self.hidden = torch.tanh(x + h)
        return self.hidden * self.w
""", None),
    # the value the previous call left, read
    "carried_attribute": ("""        self.hidden = torch.zeros(rows, n)

    def forward(self, x, h):
        self.hidden = torch.tanh(x + h + self.hidden)
        return self.hidden * self.w
""", "state kept on the module between calls (self.hidden"),
    "accumulated_buffer": ("""        self.register_buffer("total", torch.zeros(n))

    def forward(self, x, h):
        self.total.add_(x.sum(0))
        return h * self.total + self.w
""", "state kept on the module between calls (self.total"),
    # written whole, but read before the write
    "read_then_copied": ("""        self.register_buffer("state", torch.zeros(rows, n))

    def forward(self, x, h):
        y = x * self.state
        self.state.copy_(h)
        return y + self.state * self.w
""", "state kept on the module between calls (self.state"),
    # a value computed from a plain attribute is where the attribute was made: the guard goes
    # either way (on a GPU the attribute stays on the CPU)
    "plain_attribute_guard": ("""        self.t = torch.ones(n)

    def forward(self, x, h):
        if (self.t * x).device != x.device:
            x = x + 1
        return x * self.w + h
""", "control flow on a traced value (ne(mul(t, x).device, x.device))"),
    # a move to a fixed device is a move
    "fixed_device_move": ("""
    def forward(self, x, h):
        return (x * self.w).to("cpu") + h
""", "Tensor.to"),
}


@pytest.fixture(scope="module")
def forms_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    for name, (body, _) in FORMS.items():
        (root / f"{name}.py").write_text(_HEAD + body + _TAIL)
    if VANILLA_RNN.is_file():
        (root / "vanilla_rnn.py").write_text(small_copy(VANILLA_RNN, SIZES))
    return root


@pytest.mark.parametrize("name", [n for n, (_, why) in FORMS.items() if why is None])
def test_a_forward_that_reads_no_state_of_a_previous_call_is_planned(forms_dir, tmp_path, name):
    ctx = task_ctx(forms_dir, name)
    prop = OfflineSynthesizer("cpu").translate(ctx, 1, random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert "copy_" not in prop.code and ".to(" not in prop.code
    assert_matches_reference(prop.code, tmp_path / f"cand_{name}.py", ctx,
                             [{}, {"rows": 3, "n": 9}], seeds=(1, 2))


@pytest.mark.parametrize("name", [n for n, (_, why) in FORMS.items() if why is not None])
def test_state_from_the_previous_call_is_declined_saying_so(forms_dir, name):
    prop = OfflineSynthesizer("cpu").translate(task_ctx(forms_dir, name), 1,
                                               random.Random(0))[0]
    assert prop.code is None
    assert FORMS[name][1] in prop.declined, prop.declined


@needs_kernelbench
def test_vanilla_rnn_cpu_candidate_matches_reference_and_the_verifier_accepts_it(forms_dir,
                                                                                 tmp_path):
    """L3_33 (small copy): the hidden state copied from the forward's argument, then the
    input-to-hidden product of the joined input and state, tanh, the hidden-to-output
    product; equal to the reference at two sizes, accepted by the verifier under strict."""
    ctx = task_ctx(forms_dir, "vanilla_rnn")
    prop = OfflineSynthesizer("cpu", policy="strict").translate(ctx, 1, random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert_matches_reference(prop.code, tmp_path / "cand_rnn.py", ctx, [{}, OTHER],
                             seeds=(1, 2))
    assert_accepted_on_cpu(ctx, prop.code, tmp_path / "verified_rnn.py")


@needs_kernelbench
def test_kernelbench_vanilla_rnn_gets_a_plan():
    analysis = OfflineSynthesizer("cuda").analyse(
        TaskContext(Task.from_file(VANILLA_RNN), "cuda"))
    assert analysis.plan is not None, analysis.summary


@needs_kernelbench
@pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
def test_vanilla_rnn_cuda_sources_compile(forms_dir, tmp_path):
    build_cuda_candidates(translations(forms_dir, ("vanilla_rnn",)), tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@needs_kernelbench
def test_vanilla_rnn_cuda_candidates_match_reference(forms_dir, tmp_path):
    """On a GPU: the CUDA candidates (strict, permissive) equal the reference at the copy's
    sizes and at the other sizes; the reference's hidden state is a plain attribute that
    ``Module.to`` leaves on the CPU, which its forward moves (``.to(x.device)``)."""
    assert_translations_match_reference(task_ctx(forms_dir, "vanilla_rnn", "cuda"),
                                        [{}, OTHER], tmp_path)
