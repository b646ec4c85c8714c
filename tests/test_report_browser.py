"""The campaign report in a real browser: Debian's chromium, headless (tests/chromium.py).

The report of a CPU test campaign (tests/fake_results.py, with lineage and MLflow links) must
load without console errors, exceptions, CSP violations or any request leaving the file, and
show its plots (inline ``<svg>`` in the live DOM). A full-page screenshot and the page's
problems are saved under ``test-artifacts/`` at the repo root (ignored by git).

CI installs chromium in ``.ci/run`` (``apt-get install chromium``); there is no skip: a machine
without it fails here with the line to install it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from assay.layout import Campaign
from assay.report.html import write_report
from helpers import REPO

try:
    from chromium import HEIGHT, WIDTH, Browser, chromium_binary, problems
    from fake_results import add_declined, make_fake_campaign, write_task
except ImportError:  # tests/ imported as a package
    from tests.chromium import HEIGHT, WIDTH, Browser, chromium_binary, problems
    from tests.fake_results import add_declined, make_fake_campaign, write_task

ARTIFACTS = REPO / "test-artifacts"


PAGE_FACTS = """(() => {
  const q = s => Array.from(document.querySelectorAll(s));
  const ids = new Set(q('[id]').map(e => e.id));
  return {
    title: document.title,
    svgs: q('svg').length,
    charts: q('svg.chart').length,
    roofline_points: q('svg.roofline circle.pt').length,
    lineages: q('svg.lineage').length,
    lineage_nodes: q('svg.lineage g.node').length,
    lineage_edges: q('svg.lineage path[marker-end]').length,
    bars: q('svg.chart rect[fill]').length,
    polylines: q('svg.chart polyline').length,
    leaderboard_rows: q('tr[id^="task-"]').length,
    mlflow_links: q('a[href*="/#/experiments/"]').map(a => a.getAttribute('href')),
    highlighted_spans: q('pre.hl span:not(.ln)').length,
    cuda_keywords: q('pre.hl span.kr').filter(s => s.textContent === '__global__').length,
    broken_anchors: q('a[href^="#"]').map(a => a.getAttribute('href').slice(1))
                      .filter(id => !ids.has(id)),
    duplicate_ids: q('[id]').length - ids.size,
    scripts: q('script').length,
    images: q('img').length,
    width: document.documentElement.scrollWidth,
    height: document.documentElement.scrollHeight,
    svg_sizes: q('svg.chart').map(s => { const r = s.getBoundingClientRect();
                                         return [Math.round(r.width), Math.round(r.height)]; }),
  };
})()"""


def render_in_chromium(html: Path, name: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """Load ``html``; return the page facts, its problems and every requested URL. Saves
    ``test-artifacts/<name>.png`` (full page), ``<name>-viewport.png`` and ``<name>.json``."""
    ARTIFACTS.mkdir(exist_ok=True)
    browser = Browser(chromium_binary(), ARTIFACTS / f"{name}-chromium.log")
    try:
        session = browser.attach_page()
        browser.send("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
        browser.wait_event("Page.loadEventFired")
        browser.drain(0.5)  # late console messages, CSP reports
        facts = browser.evaluate(PAGE_FACTS, session)
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
        (ARTIFACTS / f"{name}-viewport.png").write_bytes(base64.b64decode(shot["data"]))
        full = browser.send("Page.captureScreenshot",
                            {"format": "png", "captureBeyondViewport": True},
                            session=session)
        (ARTIFACTS / f"{name}.png").write_bytes(base64.b64decode(full["data"]))
        browser.drain(0.2)
        urls = [e["params"]["request"]["url"] for e in browser.events
                if e["method"] == "Network.requestWillBeSent"]
        found = problems(browser.events)
    finally:
        browser.close()
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(
        {"facts": facts, "problems": found, "requests": urls}, indent=2))
    return facts, found, urls


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    root = tmp_path_factory.mktemp("results")
    c = make_fake_campaign(root, gens=3, tasks=4, tracked=True)
    write_task(c, 2, 9, "Never_Tried")
    add_declined(c, "offline", write_task(c, 1, 8, "All_Declined"), 0)
    make_fake_campaign(root, name="baseline", llms=("offline",), tasks=3, gens=1)
    return c


def test_report_in_headless_chromium(campaign: Campaign) -> None:
    other = Campaign(campaign.root.parent / "baseline")
    path = write_report(campaign, mlflow_ui="http://mlflow.example:5000/",
                        compare_with=[other])
    facts, found, urls = render_in_chromium(path, "report")

    assert found == [], "the page logged problems:\n" + "\n".join(found)
    # nothing fetched: the page is the only request, and it is the local file
    assert urls == [path.resolve().as_uri()], urls
    assert facts["scripts"] == 0 and facts["images"] == 0
    assert facts["broken_anchors"] == [] and facts["duplicate_ids"] == 0
    assert facts["title"] == "Assay report: test"

    # the plots: speedup histogram, fast_p, roofline, rejections, comparison's fast_p, and one
    # lineage tree per task with an accepted kernel (4 tasks: all solved by one llm or other)
    assert facts["lineages"] == 4
    assert facts["charts"] == 5 + facts["lineages"]
    assert facts["svgs"] == facts["charts"]
    assert all(w > 200 and h > 100 for w, h in facts["svg_sizes"]), facts["svg_sizes"]
    assert facts["bars"] > 0 and facts["polylines"] >= 2
    # 2 llms x 4 tasks x 3 gens accepted "a" candidates, minus fakellm's last task
    assert facts["roofline_points"] == 2 * 4 * 3 - 3
    # each best kernel (gen 2) descends from a, w of gen 1 and a, w of gen 0: 5 boxes,
    # 2 + 2 crossover edges and 1 mutation edge... per tree
    assert facts["lineage_nodes"] == 4 * 5
    assert facts["lineage_edges"] == 4 * 5
    # leaderboard: 4 + 2 tasks; MLflow links carry the configured base and the run ids
    assert facts["leaderboard_rows"] == 6
    assert facts["mlflow_links"], "no MLflow links"
    assert all(h.startswith("http://mlflow.example:5000/#/experiments/7/runs/")
               for h in facts["mlflow_links"])
    # highlighted sources: Python around, CUDA inside the kernel strings
    assert facts["highlighted_spans"] > 100 and facts["cuda_keywords"] > 0
    # laid out at the window's width (nothing overflowing sideways), a long page
    assert facts["width"] <= WIDTH and facts["height"] > 2 * HEIGHT

    png = (ARTIFACTS / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
    assert (ARTIFACTS / "report-viewport.png").stat().st_size > 20_000
