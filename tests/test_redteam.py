"""The red-team generator (issue #19): generation is pure, seeded and large enough on both
targets, and a seeded sample of the cpu variants (every method and every harmless change) goes
through the real verifier: each exploit rejected for one of its method's reasons, each honest
variant accepted. The whole set runs with benchmarks/redteam.py (cpu here, cuda on a GPU)."""

from __future__ import annotations

import ast
import re

import pytest

from assay.verify import policy
from helpers import assert_forked
from redteam.check import run
from redteam.generate import FAULTS, METHODS, TRIGGERS, generate, sample, write
from test_zoo_cuda import _GLOBAL

# One variant of each group (22 verifications, ~60 s of CI's two cores fewer than two of each):
# every method and every harmless change still meets the verifier on every run
PER_GROUP = 1
CI_SAMPLE = sample(generate("cpu", seed=0), per_group=PER_GROUP, seed=19)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_generation_is_pure_and_large_enough(target):
    a, b = generate(target, seed=3), generate(target, seed=3)
    assert [(v.id, v.source) for v in a] == [(v.id, v.source) for v in b]
    assert len({v.id for v in a}) == len(a)
    kinds = [v.kind for v in a]
    assert kinds.count("exploit") >= 200 and kinds.count("honest") >= 50, kinds
    methods = {v.method for v in a if v.kind == "exploit"}
    assert methods == {m for m, d in METHODS.items() if target in d.get("targets", {target})}
    assert {v.trigger for v in a if v.kind == "exploit"} == set(TRIGGERS)
    for v in a:
        ast.parse(v.source, v.id)
        assert v.kind == "honest" or (set(v.reasons) and not set(v.reasons) & FAULTS), v.id
        # A kernel named like a library's would be audited as one.
        assert not any(policy.LIBRARY_KERNEL.search(k) for k in _GLOBAL.findall(v.source)), v.id
    other = generate(target, seed=4)
    assert {v.id for v in other if v.kind == "exploit"} == \
        {v.id for v in a if v.kind == "exploit"}  # the seed picks honest pairs only


def test_sample_covers_every_group():
    groups = {v.method or v.mods[0] for v in CI_SAMPLE}
    every = {v.method or v.mods[0] for v in generate("cpu")}
    assert groups == every
    assert [v.id for v in CI_SAMPLE] == [v.id for v in sample(generate("cpu"), PER_GROUP, 19)]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write(CI_SAMPLE, tmp_path_factory.mktemp("redteam"))


@pytest.mark.parametrize("variant", [pytest.param(v, id=v.id) for v in CI_SAMPLE])
def test_redteam_variant(variant, written, forked_workers):
    """Workers forked from the zygote (the default), as in benchmarks/redteam.py's whole cpu
    set."""
    times: dict = {}
    row = run(variant, written[variant.id], times=times)
    assert row["outcome"] == "ok", (row["outcome"], row["got"], row["failed"], row["error"])
    assert "import_s" in times, times  # every variant's worker runs (none is a crash case)
    assert_forked(times)


def test_judge_refuses_a_fault_as_a_rejection():
    from redteam.generate import judge

    ex = next(v for v in CI_SAMPLE if v.kind == "exploit")
    assert judge(ex, False, ["runs"]) == "wrong_reason"
    assert judge(ex, False, [ex.reasons[0], "crash"]) == "wrong_reason"
    assert judge(ex, False, [ex.reasons[0]]) == "ok"
    assert judge(ex, True, []) == "accepted"
    ho = next(v for v in CI_SAMPLE if v.kind == "honest")
    assert judge(ho, False, ["precision"]) == "rejected" and judge(ho, True, []) == "ok"
    assert re.fullmatch(r"[\w]+", ex.id)
