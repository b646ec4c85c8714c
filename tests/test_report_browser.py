"""The campaign report in a real browser: Debian's chromium, headless, driven over the DevTools
protocol through a pipe (``--remote-debugging-pipe``: no port, no websocket library).

The report of a CPU test campaign (tests/fake_results.py, with lineage and MLflow links) must
load without console errors, exceptions, CSP violations or any request leaving the file, and
show its plots (inline ``<svg>`` in the live DOM). A full-page screenshot and the page's
problems are saved under ``test-artifacts/`` at the repo root (ignored by git).

Chromium: ``$ASSAY_CHROMIUM``, else ``/usr/lib/chromium/chromium`` (Debian's binary, without
its launcher script), else ``chromium`` / ``chromium-browser`` / ``google-chrome`` on PATH.
CI installs it in ``.ci/run`` (``apt-get install chromium``); there is no skip: a machine
without it fails here with the line to install it.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from assay.layout import Campaign
from assay.report.html import write_report

try:
    from fake_results import add_declined, make_fake_campaign, write_task
except ImportError:  # tests/ imported as a package
    from tests.fake_results import add_declined, make_fake_campaign, write_task

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
WIDTH, HEIGHT = 1280, 900
TIMEOUT_S = 60.0


def chromium_binary() -> str:
    env = os.environ.get("ASSAY_CHROMIUM")
    if env:
        return env
    if os.access("/usr/lib/chromium/chromium", os.X_OK):
        return "/usr/lib/chromium/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no chromium: install Debian's package (as root: apt-get install -y "
                "--no-install-recommends chromium; CI does it in .ci/run) or set ASSAY_CHROMIUM",
                pytrace=False)


class Browser:
    """Headless chromium over ``--remote-debugging-pipe``: JSON messages separated by NUL, the
    browser reads commands on its fd 3 and writes replies and events on its fd 4."""

    def __init__(self, binary: str, log_path: Path) -> None:
        self.profile = tempfile.mkdtemp(prefix="assay-chromium-")
        # Pipe ends moved to fds >= 10 (close-on-exec), so the child can dup2 its two onto 3
        # and 4 without clobbering either; everything else closes when chromium starts.
        ends = []
        for fd in os.pipe() + os.pipe():
            ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
            os.close(fd)
        cmd_r, self._to_child, self._from_child, reply_w = ends

        def wire_fds() -> None:  # in the child, before exec: fd 3 = commands, fd 4 = replies
            os.dup2(cmd_r, 3)
            os.dup2(reply_w, 4)

        args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={self.profile}", f"--window-size={WIDTH},{HEIGHT}",
                "--remote-debugging-pipe", "about:blank"]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, preexec_fn=wire_fds,
                                     close_fds=False)
        os.close(cmd_r)
        os.close(reply_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium closed its pipe (exit {self.proc.poll()})")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        for e in self.events:
            if e["method"] == method:
                return e
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_message(deadline)
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg

    def drain(self, seconds: float) -> None:
        """Collect the events that arrive within ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                msg = self._read_message(deadline)
                if "method" in msg:
                    self.events.append(msg)
        except TimeoutError:
            pass

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors and warnings, uncaught exceptions, browser log errors (CSP violations,
    failed loads) and failed requests."""
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
            out.append(f"console.{p['type']}: "
                       + " ".join(str(a.get("value", a.get("description", "")))
                                  for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"exception: {d.get('text')} "
                       f"{d.get('exception', {}).get('description', '')}")
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
            entry = p["entry"]
            out.append(f"log {entry.get('source')}/{entry.get('level')}: {entry.get('text')} "
                       f"{entry.get('url', '')}")
        elif m == "Network.loadingFailed":
            out.append(f"request failed: {p.get('errorText')} {p.get('blockedReason', '')}")
    return out


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
        targets = browser.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = browser.send("Target.attachToTarget",
                               {"targetId": page["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1,
                      "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": html.resolve().as_uri()}, session=session)
        browser.wait_event("Page.loadEventFired")
        browser.drain(0.5)  # late console messages, CSP reports
        facts = browser.send("Runtime.evaluate", {"expression": PAGE_FACTS,
                                                  "returnByValue": True},
                             session=session)["result"]["value"]
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
