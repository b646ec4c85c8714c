"""compare (fast_p, geomean, ranking) and the static HTML report."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from assay.cli import main as assay_main
from assay.collect import collect, spend
from assay.layout import Campaign, read_json, write_json
from assay.report.compare import COMPARE_SCHEMA, compare_table, fast_p, render_compare
from assay.report.highlight import highlight_code
from assay.report.html import DEFAULT_MLFLOW_UI, mlflow_run_url, render_report, write_report

try:
    from fake_results import (add_candidate, add_declined, add_tracked, make_fake_campaign,
                              write_task)
except ImportError:  # tests/ imported as a package
    from tests.fake_results import (add_candidate, add_declined, add_tracked,
                                    make_fake_campaign, write_task)


def assert_self_contained(html: str) -> None:
    """Nothing in the page is fetched: no scripts, stylesheets, images, frames, fonts or
    url(...) references; the only tags with an absolute URL are links (<a href>), and a CSP
    forbids loading anything anyway."""
    assert "<script" not in html and "<link" not in html and "<img" not in html
    assert "<iframe" not in html and "url(http" not in html and "@import" not in html
    assert not re.search(r"\ssrc=", html)
    assert "default-src 'none'" in html
    for m in re.finditer(r"<[^>]*https?://[^>]*>", html):
        assert re.match(r'<a href="https?://[^"]*"( target="_blank" rel="noopener")?>$',
                        m.group()), m.group()


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
    add(c, "A", t3, 0, accepted=False, speedup=10.0, reasons=["reference_fallback"], tag="a",
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
    assert html.count("<svg") >= 4
    assert_self_contained(html)
    assert "http://" not in html and "https://" not in html  # no tracked.json: no links
    assert "Level 1" in html and "Level 2" in html
    # candidate source is highlighted and HTML-escaped inside <pre class="hl"><code>
    assert "&lt;stand-in for the compiled op &amp; friends&gt;" in html
    assert "<stand-in" not in html
    assert re.search(r'<pre class="hl"><code><span class="ln"> 1</span>'
                     r'<span class="kn">import</span>', html)
    # every best kernel's id is shown; rejections grouped by reason
    df = collect(c)
    best = df.filter(pl.col("accepted")).sort("speedup_eager", descending=True)
    assert best["candidate"][0] in html
    for reason in ("correctness", "compiles", "roofline"):
        assert f"<code>{reason}</code>" in html
    assert "not verified yet" in html  # the task with no candidates
    assert "no candidate: the LLM declined 1 proposal</td>" in html  # no "(0/0)" after it
    assert "(0/0" not in html


def test_report_roofline_and_escaping(tmp_path: Path) -> None:
    c = Campaign(tmp_path / "esc")
    t = write_task(c, 1, 1, "Relu", eager_ms=2.0)
    add_candidate(c, "llm<b>", t, 0, accepted=True, speedup=4.0, roofline_ms=0.125, tag="x")
    html = write_report(c).read_text()
    assert "llm&lt;b&gt;" in html and "llm<b>" not in html
    # runtime 2.0 / 4.0 = 0.5 ms; roofline 0.125 ms -> 25.0%
    assert "25.0%" in html and "4.00x" in html


def test_a_campaign_resumed_on_another_gpu_names_the_gpus_its_verdicts_were_timed_on(
        tmp_path: Path) -> None:
    """device.json is the first GPU's; a verdict judged on another names its own peaks
    (steps/verify.py's device_peaks): the report says which GPUs timed the verdicts."""
    c = make_fake_campaign(tmp_path, tasks=1, gens=1)
    assert "verdicts timed on" not in write_report(c).read_text()  # one device: nothing to say
    df = collect(c)
    row = df.row(0, named=True)
    path = c.verdict(row["llm"], row["task"], row["generation"], row["candidate"])
    write_json(path, {**read_json(path), "device_peaks": {
        "name": "NVIDIA H100 80GB HBM3", "bandwidth_gbs": 3000.0, "flops_tflops": 50.0}})
    assert collect(c).row(0, named=True)["device_name"] == "NVIDIA H100 80GB HBM3"
    html = " ".join(write_report(c).read_text().split())
    assert "verdicts timed on (each with its own peaks)<b>NVIDIA H100 80GB HBM3</b>" in html


def test_report_on_empty_campaign(tmp_path: Path) -> None:
    c = Campaign(tmp_path / "empty")
    write_task(c, 1, 1, "ReLU")
    html = write_report(c).read_text()
    assert "L1_1_ReLU" in html and "No verified candidates yet" in html


def test_report_lineage_links_and_highlighting(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ASSAY_MLFLOW_UI", raising=False)
    c = make_fake_campaign(tmp_path, gens=3, tracked=True)
    html = write_report(c).read_text()
    assert_self_contained(html)
    df = collect(c)
    rows = {r["candidate"]: r for r in df.iter_rows(named=True)}
    # one lineage tree per task with an accepted kernel (3 tasks)
    assert html.count('<svg class="chart lineage"') == 3
    assert html.count('<svg class="chart roofline"') == 1
    # the best kernel of L1_1_ReLU: fakellm's gen-2 crossover; its ancestry is in the tree
    best = (df.filter(pl.col("accepted") & (pl.col("task") == "L1_1_ReLU"))
              .sort("speedup_eager", descending=True).row(0, named=True))
    assert best["llm"] == "fakellm" and best["generation"] == 2
    assert best["operator"] == "crossover" and len(best["parents"]) == 2
    tree = html[html.index('id="kernel-L1_1_ReLU"'):]
    tree = tree[:tree.index("</svg>")]
    for parent in best["parents"]:
        assert parent in tree
        for grand in rows[parent]["parents"]:
            assert grand in tree
    assert 'marker-end="url(#arr-L1_1_ReLU-crossover)"' in tree
    assert 'marker-end="url(#arr-L1_1_ReLU-mutate)"' in tree
    assert tree.count("<g class=") == 5 and 'class="node accepted best"' in tree
    # each lineage box links to a source block that exists
    for anchor in re.findall(r'<a href="#(src-[^"]+)">', tree):
        assert f'id="{anchor}"' in html
    # MLflow links: the default UI, the run of the best kernel's (llm, task)
    run = read_json(c.tracked("fakellm", "L1_1_ReLU"))
    url = f"{DEFAULT_MLFLOW_UI}/#/experiments/7/runs/{run['run_id']}"
    row = html[html.index('id="task-L1_1_ReLU"'):]
    assert f'<a href="{url}" target="_blank" rel="noopener">run</a>' in row[:row.index("</tr>")]
    # CUDA inside the kernel strings, Python around
    assert '<span class="kr">__global__</span>' in html
    assert '<span class="k">class</span>' in html
    # rejected candidates grouped by reason, with their check's detail
    assert 'id="reason-correctness"' in html and "correctness failed" in html


def test_report_mlflow_base_url(tmp_path: Path, monkeypatch) -> None:
    c = make_fake_campaign(tmp_path, tasks=1, gens=1, llms=("offline",), tracked=True)
    rid = read_json(c.tracked("offline", "L1_1_ReLU"))["run_id"]
    monkeypatch.setenv("ASSAY_MLFLOW_UI", "http://mlflow.lab:8080/")
    assert f"http://mlflow.lab:8080/#/experiments/7/runs/{rid}" in render_report(c)
    explicit = render_report(c, mlflow_ui="https://ml.example.org/mlflow")
    assert f"https://ml.example.org/mlflow/#/experiments/7/runs/{rid}" in explicit
    # a tracking server is its own UI
    tracked = {"tracking_uri": "http://tracker:5000", "experiment_id": "3", "run_id": "abc"}
    assert mlflow_run_url(tracked, "http://x") == "http://tracker:5000/#/experiments/3/runs/abc"
    assert mlflow_run_url({"tracking_uri": "sqlite:///m.db"}, "http://x") is None


def test_report_roofline_without_device_and_unknown_parent(tmp_path: Path) -> None:
    c = Campaign(tmp_path / "odd")
    t = write_task(c, 1, 1, "Relu", eager_ms=2.0, flops=0.0, min_bytes=0.0)  # no counts
    add_candidate(c, "x", t, 1, accepted=True, speedup=2.0, parents=["cmissing00000"],
                  operator="mutate", tag="a")
    html = write_report(c).read_text()
    assert "no <code>device.json</code> peaks" in html
    assert "1 kernel(s) of tasks without a byte count are not drawn" in " ".join(html.split())
    assert "No accepted, timed kernel to draw" in html
    assert "cmissing00000" in html and "not verified" in html  # the parent never verified


def _circles(html: str, cls: str) -> list[str]:
    chart = html[html.index(f'<svg class="chart {cls}"'):]
    return re.findall(r'<circle class="pt"[^>]*>', chart[:chart.index("</svg>")])


def test_report_memory_bound_kernels_on_the_bandwidth_roof(tmp_path: Path) -> None:
    """A task with bytes but no FLOPs (an activation) is drawn on the bandwidth chart at its
    attained GB/s, not left out; a task with FLOPs stays on the roofline."""
    c = Campaign(tmp_path / "mem")
    write_json(c.root / "device.json", {"name": "fake", "bandwidth_gbs": 10.0,
                                        "flops_tflops": 1.0})
    relu = write_task(c, 1, 1, "ReLU", eager_ms=2.0, flops=0.0, min_bytes=1e6)
    gemm = write_task(c, 1, 2, "Matmul", eager_ms=2.0, flops=1e9, min_bytes=1e6)
    add_candidate(c, "a", relu, 0, accepted=True, speedup=4.0, tag="r")  # 0.5 ms
    add_candidate(c, "a", gemm, 0, accepted=True, speedup=2.0, tag="g")  # 1.0 ms
    html = write_report(c).read_text()
    assert_self_contained(html)
    assert "without a byte count" not in html
    assert len(_circles(html, "roofline")) == 1 and len(_circles(html, "bandwidth")) == 1
    assert "Memory-bound: tasks that count no FLOPs (1)" in html
    assert "Compute: tasks that count FLOPs (1)" in html
    # 1e6 bytes in 0.5 ms = 2 GB/s; 1e9 FLOP in 1 ms = 1000 GFLOP/s at 1000 FLOP/byte
    assert "2 GB/s" in html and "977 KiB moved at least" in html
    assert "1e+03 FLOP/byte, 1e+03 GFLOP/s" in html
    assert "roof: 10 GB/s measured bandwidth" in html


def test_report_badges_and_cpu_kernel_lists(tmp_path: Path) -> None:
    """A slowdown never wears the green badge; on a cpu card the harness's allocations are not
    listed as the kernel's work, ATen compute ops are."""
    c = Campaign(tmp_path / "badges")
    slow = write_task(c, 1, 1, "ReLU", eager_ms=2.0)
    fast = write_task(c, 1, 2, "GELU", eager_ms=2.0)
    add_candidate(c, "a", slow, 0, accepted=True, speedup=0.25, tag="s")
    cid = add_candidate(c, "a", fast, 0, accepted=True, speedup=2.0, tag="f")
    path = c.verdict("a", fast, 0, cid)
    v = read_json(path)
    v["kernels_launched"] = ["aten::empty", "aten::gelu", "aten::copy_"]
    write_json(path, v)
    html = write_report(c).read_text()
    card_slow = html[html.index(f'id="kernel-{slow}"'):html.index(f'id="kernel-{fast}"')]
    card_fast = html[html.index(f'id="kernel-{fast}"'):]
    assert '<span class="tag slower-tag">0.25x over eager</span>' in card_slow
    assert "faster-tag" not in card_slow and "accepted-tag" not in card_slow
    assert '<span class="tag faster-tag">2.00x over eager</span>' in card_fast
    # fake verdicts list the candidate's own kernel name; the cpu card lists only compute ops
    assert "aten::empty" not in html and "aten::copy_" not in html
    assert "Ops it ran:\n<code>aten::gelu</code>." in card_fast
    assert "No compute op ran" not in card_fast
    v["kernels_launched"] = ["aten::empty", "aten::empty_like"]
    write_json(path, v)
    card_fast = write_report(c).read_text().split(f'id="kernel-{fast}"')[1]
    assert "No compute op ran: the work was its own compiled code" in card_fast
    assert "aten::empty" not in card_fast


def test_report_compares_campaigns(tmp_path: Path) -> None:
    c1 = make_fake_campaign(tmp_path, name="one", tasks=2, gens=1)
    c2 = crafted(tmp_path, "two")
    html = write_report(c1, compare_with=[c2, c1]).read_text()
    part = html[html.index('id="comparison"'):html.index('id="leaderboard"')]
    assert "<td>two</td>" in part and "<td>one</td>" in part and "<svg" in part
    assert "two/A" in part and "one/offline" in part
    assert 'id="comparison"' not in write_report(c1).read_text()


def test_highlight_code() -> None:
    src = 'import torch\nk = r"""\n__global__ void f(float* x) { x[0] = 1.f; }\n"""\n'
    h = str(highlight_code(src))
    assert '<span class="kr">__global__</span>' in h and h.count('<span class="ln">') == 4
    # text survives: strip the tags, unescape, and it is the source with line numbers
    text = re.sub(r'<span class="ln">\s*\d+</span>', "", h)
    text = re.sub(r"<[^>]+>", "", text).replace("&#34;", '"').replace("&lt;", "<")
    assert text.replace("&gt;", ">").replace("&amp;", "&") == src.rstrip("\n")
    broken = str(highlight_code("def f(:\n  <x> & y"))
    assert "&lt;x&gt; &amp; y" in re.sub(r"<[^>]+>", "", broken)
    assert str(highlight_code("")) == ""


def test_cli_report_compare_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_fake_campaign(tmp_path, name="one", tasks=1, gens=1, tracked=True)
    crafted(tmp_path, "two")
    results = str(tmp_path)
    assert assay_main(["compare", "one", "two", "--results", results]) == 0
    out = capsys.readouterr().out
    assert "one" in out and "two" in out and "offline" in out
    assert assay_main(["report", "one", "--results", results, "--mlflow-ui", "http://m:1",
                       "--compare-with", "two"]) == 0
    html = (tmp_path / "one" / "report.html").read_text()
    assert "http://m:1/#/experiments/7/runs/" in html and 'id="comparison"' in html
    assert assay_main(["export", "one", "two", "--results", results]) == 0
    assert (tmp_path / "two" / "archive" / "level_2.parquet").exists()
    with pytest.raises(SystemExit, match="no such campaign"):
        assay_main(["report", "one", "--results", results, "--compare-with", "nope"])


def test_report_step(tmp_path: Path) -> None:
    """The DAG's report step (Hydra): optional +mlflow.ui_url and +report.compare_with."""
    import subprocess
    import sys

    make_fake_campaign(tmp_path, name="main", tasks=1, gens=1, tracked=True)
    make_fake_campaign(tmp_path, name="other", tasks=1, gens=1, llms=("offline",))
    cmd = [sys.executable, "-m", "assay.steps.report", f"results_dir={tmp_path}", "campaign=main"]
    done = subprocess.run(cmd + ["mlflow.ui_url=http://ui:9", "report.compare_with=[other]"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "other" in done.stdout and "main" in done.stdout
    html = (tmp_path / "main" / "report.html").read_text()
    assert "http://ui:9/#/experiments/7/runs/" in html and 'id="comparison"' in html
    bad = subprocess.run(cmd + ["report.compare_with=[nope]"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "no such campaign folder" in bad.stderr


def test_report_links_compare_backends_in_mlflow(tmp_path: Path, monkeypatch) -> None:
    """Two tracked backends: each task's row links to MLflow's run comparison of both
    backends' runs of that task, and the summary to the comparison of their parent runs."""
    from urllib.parse import parse_qs, unquote, urlsplit
    import html as htmlmod
    import json

    monkeypatch.delenv("ASSAY_MLFLOW_UI", raising=False)
    c = make_fake_campaign(tmp_path, tasks=2, gens=1, tracked=True)
    html = write_report(c).read_text()
    assert_self_contained(html)
    urls = [htmlmod.unescape(u) for u in
            re.findall(r'<a href="([^"]*#/compare-runs[^"]*)"', html)]
    assert len(urls) == 1 + 2  # the backends, then one per task
    for url, key, task in [(urls[0], "parent_run_id", "L1_1_ReLU"),
                           (urls[1], "run_id", "L1_1_ReLU"),
                           (urls[2], "run_id", "L2_1_Conv2d_ReLU_BiasAdd")]:
        assert url.startswith(f"{DEFAULT_MLFLOW_UI}/#/compare-runs?")
        query = parse_qs(urlsplit(unquote(url.split("#", 1)[1])).query)
        want = [read_json(c.tracked(lm, task))[key] for lm in ("fakellm", "offline")]
        assert sorted(json.loads(query["runs"][0])) == sorted(want)
        assert json.loads(query["experiments"][0]) == ["7"]
    # one backend: nothing to compare
    one = make_fake_campaign(tmp_path, name="one", tasks=1, gens=1, llms=("offline",),
                             tracked=True)
    assert "compare-runs" not in write_report(one).read_text()


def test_a_triton_campaign_beside_a_cuda_one_is_labelled_with_its_kernels(tmp_path: Path) -> None:
    """target=triton: the header says what the kernels are written in, and the comparison with
    a cuda campaign of the same task names each campaign's target (issue #20: the CUDA and the
    Triton form of a task side by side)."""
    forms = {}
    for name, target, kernels in (("kb-cuda", "cuda", "cuda"), ("kb-triton", "cuda", "triton")):
        c = Campaign(tmp_path / name)
        tid = write_task(c, 1, 1, "ReLU", target=target, device="fake-gpu")
        base = read_json(c.baseline(tid))
        write_json(c.baseline(tid), {**base, "kernels": kernels})
        add_candidate(c, "offline", tid, 0, accepted=True, speedup=1.5, device="fake-gpu")
        forms[name] = c
    html = write_report(forms["kb-triton"], compare_with=[forms["kb-cuda"]]).read_text()
    assert "target: cuda, Triton kernels;" in html
    part = html[html.index('id="comparison"'):html.index('id="leaderboard"')]
    assert "<td>kb-triton (cuda, Triton kernels)</td>" in part
    assert "<td>kb-cuda (cuda)</td>" in part
    assert "target: cuda;" in write_report(forms["kb-cuda"]).read_text()


def test_the_leaderboard_shows_the_speedup_over_tf32_eager_where_it_was_timed(
        tmp_path: Path) -> None:
    """A baseline timed under PyTorch's default numerics too (cuDNN in TF32: conv tasks on a
    GPU) puts the best kernel's speedup over that eager beneath its fp32 one; no other row."""
    from assay.layout import read_json, write_json

    c = make_fake_campaign(tmp_path, tasks=2, gens=1, llms=("offline",))
    conv = next(t for t in sorted(p.stem for p in (c.root / "tasks").glob("*.json"))
                if t.startswith("L2_"))
    base = read_json(c.baseline(conv))
    write_json(c.baseline(conv), {**base, "eager_default_ms": base["eager_ms"] / 2})
    html = write_report(c).read_text()
    assert html.count("TF32 eager</small>") == 1, html.count("TF32 eager</small>")
    row = html.split('id="task-')[1:]
    assert any(conv in r.split("</tr>")[0] and "TF32 eager</small>" in r.split("</tr>")[0]
               for r in row)
