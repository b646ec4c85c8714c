"""compare (fast_p, geomean, ranking) and the static HTML report."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from assay.collect import collect, spend
from assay.layout import Campaign
from assay.report.compare import COMPARE_SCHEMA, compare_table, fast_p, render_compare
from assay.report.html import write_report

try:
    from fake_results import add_candidate, add_declined, make_fake_campaign, write_task
except ImportError:  # tests/ imported as a package
    from tests.fake_results import (add_candidate, add_declined, make_fake_campaign,
                                    write_task)


def crafted(root: Path, name: str = "crafted") -> Campaign:
    """Five llms on three tasks, with hand-computable metrics:

    llm  task1         task2         task3                 fast_1  geomean(accepted)
    A    2.0 (+1.5)    0.5           rejected (10.0 timed)  1/3     sqrt(2*0.5) = 1
    B    4.0           1.0           not tried              1/2     sqrt(4*1)   = 2
    C    3.0           1.5           1.2                    3/3     (3*1.5*1.2)^(1/3)
    D    9.0           1.0           -                      1/2     sqrt(9*1)   = 3
    E    declined      -             -                      0/1     null

    A also has a declined proposal on task2 (tokens 300 + 20, $0.002).
    """
    c = Campaign(root / name)
    t1 = write_task(c, 1, 1, "ReLU", eager_ms=2.0, compile_ms=1.0)
    t2 = write_task(c, 1, 2, "GELU", eager_ms=3.0, compile_ms=None)
    t3 = write_task(c, 2, 1, "Gemm_Scale", eager_ms=4.0, compile_ms=2.0)
    add = add_candidate
    add(c, "A", t1, 0, accepted=True, speedup=1.5, tag="a", tokens=(100, 10), cost=0.5)
    add(c, "A", t1, 1, accepted=True, speedup=2.0, tag="b", tokens=(100, 10), cost=0.5)
    add(c, "A", t2, 0, accepted=True, speedup=0.5, tag="a", tokens=(100, 10), cost=0.5)
    add(c, "A", t3, 0, accepted=False, speedup=10.0, reasons=["no_fallback"], tag="a",
        tokens=(100, 10), cost=0.5)  # fast but rejected: must not count
    add(c, "A", t3, 0, accepted=False, reasons=["correctness"], tag="b", tokens=(100, 10),
        cost=0.5)
    add(c, "B", t1, 0, accepted=True, speedup=4.0, tag="a", tokens=(50, 50), cost=1.0)
    add(c, "B", t2, 0, accepted=True, speedup=1.0, tag="a", tokens=(50, 50), cost=1.0)
    add(c, "B", t2, 0, accepted=False, reasons=["compiles"], error="nvcc failed", tag="b",
        tokens=(50, 50), cost=1.0)
    add(c, "C", t1, 0, accepted=True, speedup=3.0, tag="a", tokens=(1, 1), cost=0.0)
    add(c, "C", t2, 0, accepted=True, speedup=1.5, tag="a", tokens=(1, 1), cost=0.0)
    add(c, "C", t3, 0, accepted=True, speedup=1.2, tag="a", tokens=(1, 1), cost=0.0)
    add(c, "D", t1, 0, accepted=True, speedup=9.0, tag="a", tokens=(0, 7), cost=0.25)
    add(c, "D", t2, 0, accepted=True, speedup=1.0, tag="a", tokens=(0, 7), cost=0.25)
    add_declined(c, "A", t2, 0)
    add_declined(c, "E", t1, 0, tokens=(40, 2), cost=0.001)
    return c


def test_compare_ranks_and_exact_values(tmp_path: Path) -> None:
    t = compare_table([crafted(tmp_path)])
    assert dict(t.schema) == COMPARE_SCHEMA
    assert t["llm"].to_list() == ["C", "D", "B", "A", "E"]
    rows = {r["llm"]: r for r in t.iter_rows(named=True)}
    assert rows["A"]["tasks_tried"] == 3 and rows["A"]["accepted"] == 2
    assert rows["A"]["fast_1"] == pytest.approx(1 / 3)
    assert rows["A"]["geomean_speedup_accepted"] == pytest.approx(1.0)
    assert rows["A"]["tokens"] == 5 * 110 + 320
    assert rows["A"]["cost_usd"] == pytest.approx(2.502)
    assert rows["B"]["tasks_tried"] == 2 and rows["B"]["accepted"] == 2
    assert rows["B"]["fast_1"] == pytest.approx(0.5)  # speedup 1.0 is not > 1
    assert rows["B"]["geomean_speedup_accepted"] == pytest.approx(2.0)
    assert rows["B"]["tokens"] == 300 and rows["B"]["cost_usd"] == pytest.approx(3.0)
    assert rows["C"]["fast_1"] == pytest.approx(1.0)
    assert rows["C"]["geomean_speedup_accepted"] == pytest.approx((3 * 1.5 * 1.2) ** (1 / 3))
    assert rows["D"]["fast_1"] == pytest.approx(0.5)
    assert rows["D"]["geomean_speedup_accepted"] == pytest.approx(3.0)
    # E declined everything: tried, failed, and what it spent is counted
    assert rows["E"]["tasks_tried"] == 1 and rows["E"]["accepted"] == 0
    assert rows["E"]["fast_1"] == 0.0 and rows["E"]["geomean_speedup_accepted"] is None
    assert rows["E"]["tokens"] == 42 and rows["E"]["cost_usd"] == pytest.approx(0.001)
    assert set(t["campaign"]) == {"crafted"}


def test_fast_p_helper(tmp_path: Path) -> None:
    c = crafted(tmp_path)
    df = collect(c)
    a = df.filter(pl.col("llm") == "A")
    assert fast_p(a, 0) == pytest.approx(2 / 3)
    assert fast_p(a, 1) == pytest.approx(1 / 3)
    assert fast_p(a, 2) == 0.0  # strictly greater
    assert fast_p(a, 1.99) == pytest.approx(1 / 3)
    # over all llms: 10 (llm, task) tried; 9 accepted; > 1: A1 B1 C1 C2 C3 D1
    assert fast_p(df, 0) == pytest.approx(9 / 10)
    assert fast_p(df, 1) == pytest.approx(6 / 10)
    # with the spend, E's all-declined task counts as tried
    assert fast_p(df, 0, spend(c)) == pytest.approx(9 / 11)
    assert fast_p(df, 1, spend(c)) == pytest.approx(6 / 11)
    assert fast_p(df.head(0), 1) == 0.0


def test_compare_several_campaigns_and_render(tmp_path: Path) -> None:
    c1 = crafted(tmp_path, "one")
    c2 = make_fake_campaign(tmp_path, name="two")
    t = compare_table([c1, c2])
    assert t.height == 7
    assert set(zip(t["campaign"], t["llm"])) >= {("one", "A"), ("two", "offline")}
    fast = t["fast_1"].to_list()
    assert fast == sorted(fast, reverse=True)
    text = render_compare(t)
    assert "33.3%" in text and "1.000x" in text and "offline" in text
    assert "\x1b[" not in text  # no colour codes
    assert compare_table([]).is_empty()


def test_report_renders(tmp_path: Path) -> None:
    c = make_fake_campaign(tmp_path)
    write_task(c, 2, 9, "Never_Tried")
    add_declined(c, "offline", write_task(c, 1, 8, "All_Declined"), 0)
    path = write_report(c)
    assert path == c.report()
    html = path.read_text()
    for task in ("L1_1_ReLU", "L1_2_GELU", "L2_1_Conv2d_ReLU_BiasAdd", "L2_9_Never_Tried"):
        assert task in html
    assert html.count("<svg") >= 3
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "Level 1" in html and "Level 2" in html
    # candidate source is HTML-escaped inside <pre><code>
    assert "&lt;stand-in for the compiled op &amp; friends&gt;" in html
    assert "<stand-in" not in html
    assert re.search(r"<pre><code>import torch", html)
    # every best kernel's id is shown; rejections grouped by reason
    df = collect(c)
    best = df.filter(pl.col("accepted")).sort("speedup_eager", descending=True)
    assert best["candidate"][0] in html
    for reason in ("correctness", "compiles", "timing"):
        assert f"<code>{reason}</code>" in html
    assert "not verified yet" in html  # the task with no candidates
    assert "no candidate; 1 proposal(s) declined" in html


def test_report_roofline_and_escaping(tmp_path: Path) -> None:
    c = Campaign(tmp_path / "esc")
    t = write_task(c, 1, 1, "Relu", eager_ms=2.0)
    add_candidate(c, "llm<b>", t, 0, accepted=True, speedup=4.0, roofline_ms=0.125, tag="x")
    html = write_report(c).read_text()
    assert "llm&lt;b&gt;" in html and "llm<b>" not in html
    # runtime 2.0 / 4.0 = 0.5 ms; roofline 0.125 ms -> 25.0%
    assert "25.0%" in html and "4.00x" in html


def test_report_on_empty_campaign(tmp_path: Path) -> None:
    c = Campaign(tmp_path / "empty")
    write_task(c, 1, 1, "ReLU")
    html = write_report(c).read_text()
    assert "L1_1_ReLU" in html and "No verified candidates yet" in html
