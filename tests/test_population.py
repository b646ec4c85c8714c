"""Evolution's pure functions: ranking, niches, planning."""

from __future__ import annotations

import random

from assay.evolve.population import Member, best, fitness, plan, rank, survivors


def m(cid, accepted=True, speedup=1.0, rel=1e-6, strategy="a", gen=0, reasons=(), n=100):
    v = {"accepted": accepted, "speedup_eager": speedup, "rel_err": rel, "reasons": list(reasons)}
    return Member(cid, gen, v, {"strategy": strategy}, n)


def test_rank_by_speedup_then_margin_then_simplicity():
    a, b = m("a", speedup=2.0), m("b", speedup=3.0)
    c = m("c", speedup=3.0, rel=1e-3)  # same speedup, worse margin
    d = m("d", speedup=3.0, n=50)  # same speedup and margin as b, simpler
    rejected = m("r", accepted=False, speedup=100.0)
    assert [x.id for x in rank([a, b, c, d, rejected])] == ["d", "b", "c", "a", "r"]
    assert best([rejected]) is None
    assert fitness(rejected) < fitness(a)  # a rejected member's speedup counts for nothing


def test_survivors_keep_each_niche():
    pop = [m("a1", speedup=5, strategy="a"), m("a2", speedup=4, strategy="a"),
           m("b1", speedup=1.1, strategy="b")]
    assert [x.id for x in survivors(pop, 2)] == ["a1", "b1"]


def test_plan_makes_children_with_repairs_and_crossovers():
    pop = [m(f"p{i}", speedup=1 + i, strategy=s) for i, s in enumerate("abcd")]
    pop.append(m("bad", accepted=False, gen=1, reasons=["compiles"]))
    ops = plan(pop, latest_gen=1, children=6, population=4, crossover_rate=0.5,
               crossover_parents=2, repair=True, rng=random.Random(1))
    assert len(ops) == 6
    assert ops[0].operator == "repair" and ops[0].parents[0].id == "bad"
    kinds = {o.operator for o in ops}
    assert {"mutate", "crossover"} <= kinds
    for o in ops:
        if o.operator == "crossover":
            assert len({p.id for p in o.parents}) == 2
    again = plan(pop, 1, 6, 4, 0.5, 2, True, random.Random(1))
    assert [(o.operator, [p.id for p in o.parents]) for o in again] == \
        [(o.operator, [p.id for p in o.parents]) for o in ops]  # reproducible from the seed


def test_plan_without_accepted_parents_only_repairs():
    pop = [m("x", accepted=False, gen=0, reasons=["correctness"])]
    ops = plan(pop, 0, 3, 4, 0.3, 2, True, random.Random(0))
    assert [o.operator for o in ops] == ["repair"]
