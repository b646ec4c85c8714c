"""Canaries around the candidate's inputs (issue #19, pygpubench's defense): the worker places
every input tensor between two pads of a secret NaN word and checks them after each verified
call, so a write outside an input's own elements is a ``writes_in_bounds`` rejection
(tests/zoo*/candidates/exploit_write_past_input_end.py is the verdict-level case)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import torch

from assay.verify.memory import CANARY_PAD_B, Protocol, TaskShapes, plan_for
from assay.verify.worker import Canaries

CPU = torch.device("cpu")


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """The whole of ``x``'s storage as bytes (pads included)."""
    return torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage())


@pytest.mark.parametrize("src", [
    torch.randn(64, 33),
    torch.randn(33, 64).t(),                      # strided: the candidate sees the same strides
    torch.randn(7, dtype=torch.float64),
    torch.arange(5, dtype=torch.float16),         # 10 bytes: the tail starts inside a word
    torch.tensor([True, False, True]),            # 3 bytes
    torch.randint(0, 9, (3, 4), dtype=torch.int64)[:, 1:],  # a view with an offset
    torch.empty(0, 5),
], ids=["dense", "transposed", "float64", "odd_half", "bool", "offset_view", "empty"])
def test_placed_inputs_keep_their_values_and_strides_between_intact_pads(src):
    c = Canaries(CPU)
    x = c.place(src)
    assert x.shape == src.shape and x.stride() == src.stride() and x.dtype == src.dtype
    assert torch.equal(x, src)
    assert x.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
    assert x.storage_offset() * x.element_size() == CANARY_PAD_B  # data aligned as the buffer
    assert c.broken(x) == ""


def test_a_write_one_element_past_the_end_or_before_the_start_is_seen():
    c = Canaries(CPU)
    for where, index in (("past its last element", CANARY_PAD_B + 10),  # right after the data
                         ("past its last element", -1),                  # the pad's far end
                         ("before its first element", CANARY_PAD_B - 1),
                         ("before its first element", 0)):
        x = c.place(torch.arange(5, dtype=torch.float16))  # 10 bytes of data
        whole = _bytes(x)
        whole[index] ^= 1
        assert c.broken(x) == f"written {where}", index
    x = c.place(torch.arange(5, dtype=torch.float16))
    x.add_(1)  # the input's own elements are inputs_unchanged's business, not this check's
    assert c.broken(x) == ""


def test_the_word_is_a_quiet_nan_with_a_payload_drawn_per_worker():
    words = {Canaries(CPU).word for _ in range(8)}
    assert len(words) > 1
    for w in words:
        value = struct.unpack("<f", struct.pack("<I", w))[0]
        assert value != value and 0 < w < 2 ** 31  # NaN, and an int32 torch.full takes
    x = Canaries(CPU).place(torch.zeros(3))
    pad = _bytes(x)[:CANARY_PAD_B].view(torch.float32)
    assert torch.isnan(pad).all()  # a kernel reading past an input reads NaN


def test_an_input_whose_storage_the_candidate_swapped_is_seen():
    c = Canaries(CPU)
    x = c.place(torch.randn(4, 4))
    x.set_(torch.randn(4, 4))
    assert c.broken(x) == "its storage was replaced"


def test_what_was_not_placed_is_never_reported():
    c = Canaries(CPU)
    assert c.broken(torch.randn(3)) == "" and c.broken(3) == "" and c.place(3) == 3
    expanded = torch.randn(1, 4).expand(3, 4)  # overlapping elements: copied, not padded
    x = c.place(expanded)
    assert torch.equal(x, expanded) and c.broken(x) == ""
    y = c.place(torch.randn(3))
    key = id(y)
    del y  # a dead tensor's entry goes with it: a new tensor at its id is not mistaken for it
    assert key not in c._guarded


def test_the_memory_plan_counts_the_pads_of_every_input_tensor():
    proto = Protocol(check_sets=3, timing_sets=4, swap_sets=2)
    one = TaskShapes(1 << 20, 2 << 20, 1 << 20, 2 << 20, 1 << 18, 0, 0, 1 << 20, 2 << 20)
    three = dataclasses.replace(one, input_tensors=3)
    a = plan_for(one, proto, "cpu", "host", None, None).parts["worker"]
    b = plan_for(three, proto, "cpu", "host", None, None).parts["worker"]
    assert b - a == 2 * 4 * 2 * CANARY_PAD_B  # two more tensors, in the 4 sets held at once
