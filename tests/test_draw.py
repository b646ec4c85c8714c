"""The transfer ``draw``: the harness and the worker each draw the input sets from their seeds
(no set copied between them or held whole), checked bit for bit by digests; a task whose sets
do not draw the same twice, or a worker that draws other sets, falls back to copying them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from assay.tasks.instantiate import DrawnSets, InputsDiffer, digest, draws_alike, make_inputs
from assay.tasks.model import Task
from assay.verify.harness import verify
from assay.verify.reference import prepare
from assay.verify.settings import Transfer, VerifyConfig

TASK = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x, y):
        return torch.relu(x) * y
def get_inputs():
    return [torch.randn(16, 999), torch.rand(16, 999)]
def get_init_inputs():
    return []
"""
# a get_inputs that reads an unseeded generator: two draws under one seed differ
UNSEEDED = TASK.replace("torch.rand(16, 999)]",
                        "torch.rand(16, 999, generator=torch.Generator().manual_seed("
                        "__import__('secrets').randbits(31)))]")

HONEST = """
import torch
from torch import nn
class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.relu(x) * y
"""
# Changes the task's get_inputs in its own process (the worker draws with it) to zeros, where a
# constant answers every call; the draws no longer match the harness's digests.
REPLACES_THE_DRAW = """
import sys, torch
from torch import nn
for name, mod in list(sys.modules.items()):
    if name.startswith("assay_task_"):
        mod.get_inputs = lambda: [torch.zeros(16, 999), torch.zeros(16, 999)]
class ModelNew(nn.Module):
    def forward(self, x, y):
        return torch.zeros_like(x)
"""
# (the candidates run the reference's own ops: permissive, and no reference_fallback check)
CFG = VerifyConfig(policy="permissive", reject_reference_ops=False, budget_s=0.1, min_runs=10,
                   max_runs=20)


def _task(tmp_path, text: str = TASK) -> Task:
    path = tmp_path / "level1" / "1_ReluMul.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return Task.from_file(path)


def test_digest_is_the_bits_and_their_places():
    x = torch.randn(1001)
    swapped, flipped = x.clone(), x.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    flipped.view(torch.int32)[7] ^= 1
    assert digest(x) == digest(x.clone()) and digest(x) != digest(swapped) != digest(flipped)
    assert digest(x) != digest(flipped)
    grid = torch.randn(30, 40)
    assert digest(grid.t()) == digest(grid.t().contiguous())  # the values, whatever the strides
    assert digest(torch.ones(3, dtype=torch.bool)) != digest(torch.zeros(3, dtype=torch.bool))
    assert digest(torch.empty(0)) == (0, 0) and digest(3) is None


def test_drawn_sets_are_the_seeds_draws_checked(tmp_path):
    module = _task(tmp_path).module()
    want = make_inputs(module, 11, "cpu", "large")
    sets = DrawnSets(module, [11], ["large"], "cpu", [[digest(x) for x in want]])
    got = sets[0]
    assert len(sets) == 1 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0] is not sets[0][0]  # a fresh set every time
    other = DrawnSets(module, [12], ["large"], "cpu", [[digest(x) for x in want]])
    with pytest.raises(InputsDiffer, match="input set 0 drawn again"):
        other[0]
    assert draws_alike(module, "cpu")
    assert not draws_alike(_task(tmp_path, UNSEEDED).module(), "cpu")


def test_an_honest_kernel_is_verified_on_drawn_sets(tmp_path):
    task = _task(tmp_path)
    cand = tmp_path / "honest.py"
    cand.write_text(HONEST)
    times: dict = {}
    v = verify(task, cand, "cpu", CFG, times=times)
    assert v.accepted, v.reasons
    assert times["transfer"] == "draw" and "transfer_fallback" not in times, times
    prep = prepare(task, "cpu", CFG)
    assert isinstance(prep.sets, DrawnSets) and len(prep.seeds) == len(prep.distributions)


def test_a_task_whose_sets_draw_differently_keeps_and_copies_them(tmp_path):
    task = _task(tmp_path, UNSEEDED)
    prep = prepare(task, "cpu", CFG)
    assert prep.transfer == "host" and isinstance(prep.sets, list)
    cand = tmp_path / "honest.py"
    cand.write_text(HONEST)
    times: dict = {}
    v = verify(task, cand, "cpu", CFG, prepared=prep, times=times)
    assert v.accepted, v.reasons
    assert times["transfer"] == "host", times


def test_a_worker_that_draws_other_sets_falls_back_to_copies(tmp_path):
    """The worker checks every set it draws against the harness's digests before the candidate
    loads: a mismatch (here the job's digests changed) is not the candidate's fault; the run
    is repeated with the sets copied, and the preparation keeps that for its next candidates."""
    task = _task(tmp_path)
    prep = prepare(task, "cpu", CFG)
    prep.digests = [[(0, 0) for _ in d] for d in prep.digests]  # the job's, not the harness's
    cand = tmp_path / "honest.py"
    cand.write_text(HONEST)
    times: dict = {}
    v = verify(task, cand, "cpu", CFG, prepared=prep, times=times)
    assert v.accepted, v.reasons
    assert times["transfer"] == "host" and "differs" in times["transfer_fallback"], times
    assert prep.transfer == "host"


def test_a_candidate_that_replaces_the_draw_is_rejected(tmp_path):
    task = _task(tmp_path)
    cand = tmp_path / "replaces_the_draw.py"
    cand.write_text(REPLACES_THE_DRAW)
    times: dict = {}
    v = verify(task, cand, "cpu", dataclasses.replace(CFG, transfer=Transfer.draw), times=times)
    assert v.reasons == ["runs"], (v.reasons, v.error)
    assert "drawn again from its seed differs" in v.checks["runs"]["detail"]
    # a failed worker's report keeps where it failed and its seconds so far
    assert times["worker.failed_in"] == "correctness" and "worker.load_s" in times, times


def test_the_offset_draw_makes_no_float64_copy_of_an_input(monkeypatch):
    """The offset distribution's RMS is accumulated in float64 a chunk at a time: whole,
    vector_norm(dtype=float64) copied the input at twice its size (a 16 GiB input drew at three
    times its size on an H200, and the worker's timing ran out of memory)."""
    from torch.profiler import ProfilerActivity, profile

    from assay.tasks import instantiate

    monkeypatch.setattr(instantiate, "_OFF_GRID_CHUNK", 1 << 12)
    x = torch.rand(40_000) * 3
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        rms = instantiate._rms(x)
    assert rms == pytest.approx(float(torch.linalg.vector_norm(x, dtype=torch.float64))
                                / x.numel() ** 0.5, rel=1e-12)
    biggest = max(e.cpu_memory_usage for e in p.events())
    assert 0 < biggest <= (1 << 12) * 8, biggest  # one chunk in float64, never the input
    assert instantiate._rms(x.view(200, 200).t()) == pytest.approx(rms, rel=1e-12)


VIEW_OUT = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x):
        return (x * 2.0)[:, 0]
def get_inputs():
    return [torch.rand(64, 512)]
def get_init_inputs():
    return []
"""


def test_kept_references_own_storage_of_their_size(tmp_path):
    """A reference output that views a larger buffer is kept as a copy of its own size (the
    float64 mean of KernelBench's L1_96 viewed its 8 GiB elementwise loss: eight of them kept
    64 GiB in the harness while its worker ran out of memory)."""
    prep = prepare(_task(tmp_path, VIEW_OUT), "cpu", CFG)
    kept = [t for refs in (prep.refs, prep.refs64) for ts in refs if ts for t in ts
            if t is not None]
    assert kept and any(t.dtype == torch.float64 for t in kept)
    for t in kept:
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), (t.dtype, t.shape)


def test_bits_equal_goes_a_chunk_at_a_time_and_sees_every_chunk(monkeypatch):
    """The worker's pristine-input and settled-output checks compare bits a chunk at a time
    (whole, torch.equal on cuda made a byte-sized temporary per byte compared); a difference in
    any chunk, the last partial one included, still shows, and NaN payloads count."""
    from assay.verify import worker

    monkeypatch.setattr(worker, "_EQUAL_CHUNK", 64)
    x = torch.randn(1000)  # 4000 bytes: 62 whole chunks and a partial one
    assert worker.bits_equal(x, x.clone())
    for at in (0, 500, 999):
        y = x.clone()
        y.view(torch.int32)[at] ^= 1
        assert not worker.bits_equal(x, y), at
    nan_a = torch.full((5,), float("nan"))
    nan_b = nan_a.clone()
    nan_b.view(torch.int32)[4] ^= 1  # another NaN payload
    assert not worker.bits_equal(nan_a, nan_b) and worker.bits_equal(nan_a, nan_a.clone())


def test_an_arena_without_room_is_too_large_not_a_crash(tmp_path, monkeypatch):
    """A landing arena its file system cannot hold was a SIGBUS in the worker (an honest
    candidate's crash: KernelBench's L1_87 on an H200, 72 GB of landing beside the input
    arena); every file arena now takes its pages when made, and no room is ``too_large``."""
    import errno
    import os as _os

    from assay.verify import arenas

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, _os.strerror(errno.ENOSPC))

    monkeypatch.setattr(arenas.os, "posix_fallocate", no_room)
    task = _task(tmp_path)
    cand = tmp_path / "honest.py"
    cand.write_text(HONEST)
    v = verify(task, cand, "cpu", CFG)
    assert not v.accepted and v.reasons == ["too_large"], v.reasons
    assert "no room for a" in v.checks["too_large"]["detail"]
