"""Unit tests of the search state on disk (evolve/state.py) and the budget cap (evolve/budget.py),
on results trees made by hand: no DAG, no torch work."""

from __future__ import annotations

import json

import pytest

from assay.app import compose
from assay.evolve import budget as B
from assay.evolve import state as S
from assay.layout import Campaign, read_json, write_json
from assay.records import Proposal, candidate_id

LLM, TASK = "offline", "L1_1_ReLU"


@pytest.fixture
def c(tmp_path) -> Campaign:
    return Campaign.at(tmp_path / "results", "unit")


def proposal(code: str | None, tokens=(10, 5), cost=0.01, **kw) -> Proposal:
    return Proposal(code=code, tokens_in=tokens[0], tokens_out=tokens[1], cost_usd=cost, **kw)


# -- evolve/state.py ------------------------------------------------------------------------------

def test_write_generation_names_candidates_by_content_and_never_writes_one_twice(c):
    props = [proposal("code A"), proposal("code A"), proposal("code B"),
             proposal(None, declined="no kernel for this op")]
    seen = {candidate_id("code B")}  # verified in an earlier generation
    out = S.write_generation(c, LLM, TASK, 1, props, seen=seen, extra_spend=(7, 0.5))
    assert out["candidates"] == [candidate_id("code A")]
    assert out["declined"] == [{"operator": "translate", "parents": [],
                                "reason": "no kernel for this op"}]
    assert out["tokens"] == 4 * 15 + 7 and out["cost_usd"] == pytest.approx(4 * 0.01 + 0.5)
    assert "stopped" not in out and "budget" not in out
    cid = candidate_id("code A")
    assert c.candidate(LLM, TASK, 1, cid).read_text() == "code A"
    assert read_json(c.proposal_meta(LLM, TASK, 1, cid))["generation"] == 1
    assert read_json(c.proposals(LLM, TASK, 1)) == out
    assert S.known_ids(c, LLM, TASK, 2) == {cid} and S.known_ids(c, LLM, TASK, 1) == set()


def test_write_generation_records_a_stop_and_its_budget(c):
    out = S.write_generation(c, LLM, TASK, 0, [], stopped=B.STOPPED,
                             budget={"cap_tokens": 1}, functional={"accepted": True, "x": 1})
    assert out["stopped"] == "budget" and out["budget"] == {"cap_tokens": 1}
    assert out["functional"]["accepted"] is True and "x" not in out["functional"]


def verdict(c, gen, code, accepted=True, speedup=2.0):
    cid = candidate_id(code)
    S.write_generation(c, LLM, TASK, gen, [proposal(code)])
    write_json(c.verdict(LLM, TASK, gen, cid),
               {"accepted": accepted, "speedup_eager": speedup, "runtime_ms": 1.0})
    return cid


def test_load_members_reads_every_verified_candidate_up_to_a_generation(c):
    a = verdict(c, 0, "code A")
    b = verdict(c, 1, "code B", accepted=False)
    verdict(c, 2, "code C")
    S.write_generation(c, LLM, TASK, 1, [proposal("not verified yet")])
    members = S.load_members(c, LLM, TASK, 1)
    assert [(m.id, m.generation, m.accepted) for m in members] == [(a, 0, True), (b, 1, False)]
    assert members[0].code_len == len("code A") and members[0].speedup == 2.0
    assert members[1].speedup == 0.0  # a rejected candidate has no speed


def test_stepping_stones_are_recorded_and_read_back(c):
    a = verdict(c, 0, "code A")
    assert S.load_stones(c, LLM, "L1_2_Other", 1) is None  # nothing recorded yet
    S.save_stones(c, LLM, "L1_2_Other", 1, [(c.root, LLM, TASK, 0, a),
                                           (c.root, LLM, TASK, 0, "c_missing")])
    stones = S.load_stones(c, LLM, "L1_2_Other", 1)
    assert [s.id for s in stones] == [a]  # a stone whose files are gone is left out
    assert stones[0].code == "code A" and stones[0].meta["task"] == TASK


def test_a_parent_carries_the_profile_of_its_own_candidate_or_the_verifiers_measurement(c):
    a = verdict(c, 0, "code A")
    write_json(c.task_record(TASK), {"id": TASK, "min_bytes": 2e6, "flops": 1e6})
    write_json(c.device(), {"bandwidth_gbs": 4.0, "flops_tflops": 1.0})
    (member,) = S.load_members(c, LLM, TASK, 0)
    parent = S.as_parent(c, LLM, TASK, member)
    assert parent.profile["source"] == "verdict"
    assert "2 GB/s" in parent.profile["summary"] and "50% of the measured copy" in \
        parent.profile["summary"] and "nearest bound: memory" in parent.profile["summary"]
    write_json(c.profile(LLM, TASK), {"candidate": a, "summary": "ncu says hi"})
    assert S.as_parent(c, LLM, TASK, member).profile["summary"] == "ncu says hi"
    write_json(c.profile(LLM, TASK), {"candidate": "c_other", "summary": "not this one"})
    assert S.as_parent(c, LLM, TASK, member).profile["source"] == "verdict"


def test_a_parents_measured_profile_uses_the_peaks_of_the_gpu_that_timed_it(c):
    """A campaign resumed on another GPU: device.json holds the first GPU's peaks, the verdict
    the ones it was judged against (steps/verify.py's this_gpu)."""
    a = verdict(c, 0, "code A")
    write_json(c.task_record(TASK), {"id": TASK, "min_bytes": 2e6, "flops": 1e6})
    write_json(c.device(), {"name": "GPU one", "bandwidth_gbs": 4.0, "flops_tflops": 1.0})
    path = c.verdict(LLM, TASK, 0, a)
    write_json(path, {**read_json(path), "device_peaks": {
        "name": "GPU two", "bandwidth_gbs": 8.0, "flops_tflops": 1.0}})
    (member,) = S.load_members(c, LLM, TASK, 0)
    summary = S.as_parent(c, LLM, TASK, member).profile["summary"]
    assert "25% of the measured copy bandwidth (8 GB/s)" in summary, summary


def test_measured_profile_only_for_accepted_candidates():
    assert S.measured_profile({"accepted": False, "runtime_ms": 1.0}, {}, {}) is None
    assert S.measured_profile({"accepted": True, "runtime_ms": 1.0}, {}, {}) is None
    p = S.measured_profile({"accepted": True, "runtime_ms": 2.0, "runtime_iqr_ms": 0.1,
                            "kernels_launched": ["relu_kernel"]}, {"flops": 4e9}, {})
    assert "2e+03 GFLOP/s" in p["summary"] and "IQR 0.1 ms" in p["summary"]
    assert "relu_kernel" in p["summary"] and "nearest bound" not in p["summary"]


def test_task_record_says_when_there_is_none(c):
    assert S.task_record(c, TASK)["error"] == "no task record"
    write_json(c.task_record(TASK), {"id": TASK, "error": None})
    assert S.task_record(c, TASK)["error"] is None


# -- evolve/budget.py -----------------------------------------------------------------------------

def test_spent_sums_every_task_and_generation_but_the_one_being_made(c):
    S.write_generation(c, LLM, TASK, 0, [proposal("a", tokens=(100, 0), cost=1.0)])
    S.write_generation(c, LLM, TASK, 1, [proposal("b", tokens=(10, 0), cost=0.1)])
    S.write_generation(c, LLM, "L1_2_Other", 0, [proposal("c", tokens=(1, 0), cost=0.01)])
    S.write_generation(c, "openai", TASK, 0, [proposal("d", tokens=(1000, 0), cost=10.0)])
    assert B.spent(c, LLM) == (111, pytest.approx(1.11))
    assert B.spent(c, LLM, exclude=(TASK, 1)) == (101, pytest.approx(1.01))
    assert B.spent(c, "nobody") == (0, 0.0)
    c.proposals(LLM, "L1_3_Torn", 0).parent.mkdir(parents=True)
    c.proposals(LLM, "L1_3_Torn", 0).write_text("{not json")  # not ours: not counted
    assert B.spent(c, LLM)[0] == 111


def test_budget_for_step_reads_the_cap_from_the_config_and_the_spend_from_disk(c):
    S.write_generation(c, LLM, TASK, 0, [proposal("a", tokens=(60, 0), cost=0.6)])
    assert not B.Budget.for_step(compose([]), c, LLM, TASK, 1).capped  # no cap: null
    cfg = compose(["llm.budget_tokens=100", "llm.budget_usd=1.0"])
    b = B.Budget.for_step(cfg, c, LLM, TASK, 1)
    assert b.capped and (b.cap_tokens, b.cap_usd) == (100, 1.0)
    assert (b.spent_tokens, b.before_tokens) == (60, 60) and not b.exhausted()
    b.charge([proposal("x", tokens=(30, 5), cost=0.1)])
    assert b.spent_tokens == 95 and not b.exhausted()
    b.charge_raw(5, 0.0)
    assert b.exhausted()  # 100 tokens: at the cap is over it
    note = b.note()
    assert note["spent_before_tokens"] == 60 and note["spent_after_tokens"] == 100
    # A rerun of generation 0 does not count its own earlier spend.
    assert B.Budget.for_step(cfg, c, LLM, TASK, 0).spent_tokens == 0


def test_the_usd_cap_alone_stops_too(c):
    b = B.Budget(cap_usd=0.5)
    assert b.capped and not b.exhausted()
    b.charge_raw(0, 0.5)
    assert b.exhausted() and json.dumps(b.note())
    assert B.Budget().note() is None
