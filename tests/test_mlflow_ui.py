"""The README's `mlflow ui` on a campaign's tracking store, in a real browser.

A campaign with two LLM backends is logged to a fresh SQLite store as the track step does
(tests/fake_results.py + assay.track.mlflow_log.log_task), `mlflow ui` serves it on a free
loopback port (bounded wait, always stopped with every process it started), and headless
chromium (tests/chromium.py) opens the report's MLflow links: the comparison of the two
backends' parent runs, a task's comparison of both backends' runs, and the experiment's run
list. Each page must list both backends' runs, with no console error, no uncaught exception and
no failed request (but the one noted in ``EXPECTED_404``); console warnings are MLflow's own
(its bundled AG Grid warns about its deprecated options) and are not counted.

Skips only where chromium is absent (CI installs it in .ci/run).
"""

from __future__ import annotations

import html as htmlmod
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from assay.report.html import write_report
from assay.track.mlflow_log import log_task

try:
    from chromium import Browser, find_chromium, problems
    from fake_results import make_fake_campaign
except ImportError:  # tests/ imported as a package
    from tests.chromium import Browser, find_chromium, problems
    from tests.fake_results import make_fake_campaign

if find_chromium() is None:
    pytest.skip("no chromium (apt-get install -y chromium; CI installs it in .ci/run)",
                allow_module_level=True)

LLMS = ("offline", "fakellm")
TASK = "L1_1_ReLU"
START_TIMEOUT_S = 120.0  # `mlflow ui` imports a lot; 2 shared cores are slow
PAGE_TIMEOUT_S = 45.0
# The UI asks for the signed-in user on every page; only a server with MLflow's basic-auth app
# answers, a plain `mlflow ui` says 404 and the UI carries on without one.
EXPECTED_404 = "/ajax-api/2.0/mlflow/users/current"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the server's whole process group (its uvicorn workers too)."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # any straggler left in the group
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A two-backend campaign logged to a fresh SQLite store; its report links to the UI."""
    root = tmp_path_factory.mktemp("mlflow-ui")
    campaign = make_fake_campaign(root / "results", llms=LLMS, tasks=1, gens=1)
    uri = f"sqlite:///{root}/mlflow.db"
    ids = {lm: log_task(uri, campaign, lm, TASK, {"campaign": campaign.name}) for lm in LLMS}
    return {"root": root, "uri": uri, "campaign": campaign, "ids": ids}


@pytest.fixture(scope="module")
def ui(store: dict[str, Any]) -> Iterator[str]:
    """`mlflow ui` on a free loopback port, stopped (with its children) whatever happens."""
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    log = open(store["root"] / "mlflow-ui.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store["uri"],
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=store["root"], env=env, stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"mlflow ui exited {proc.returncode}:\n"
                            + (store["root"] / "mlflow-ui.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow ui did not answer on {base} in {START_TIMEOUT_S:.0f} s:\n"
                            + (store["root"] / "mlflow-ui.log").read_text()[-3000:])
            time.sleep(0.5)
        yield base
    finally:
        _stop(proc)
        log.close()


def _load(url: str, wanted: list[str]) -> tuple[str, list[str]]:
    """Open ``url``; wait (bounded) until the page's text shows every string of ``wanted``;
    return that text and the page's problems."""
    binary = find_chromium()
    assert binary is not None
    browser = Browser(binary, Path(os.devnull))
    try:
        session = browser.attach_page()
        browser.send("Page.navigate", {"url": url}, session=session)
        browser.wait_event("Page.loadEventFired")
        deadline = time.monotonic() + PAGE_TIMEOUT_S
        text = ""
        while time.monotonic() < deadline:
            browser.drain(0.5)
            text = browser.evaluate("document.body ? document.body.innerText : ''",
                                    session) or ""
            if all(w in text for w in wanted):
                break
        browser.drain(1.0)  # late requests and console messages
        found = [p for p in problems(browser.events, warnings=False)
                 if not (" 404 " in p and EXPECTED_404 in p)]
    finally:
        browser.close()
    return text, found


def _report_links(store: dict[str, Any], base: str) -> list[str]:
    page = write_report(store["campaign"], mlflow_ui=base).read_text()
    return [htmlmod.unescape(u) for u in re.findall(r'<a href="([^"]*#/compare-runs[^"]*)"',
                                                    page)]


def test_mlflow_ui_compares_the_backends(store: dict[str, Any], ui: str) -> None:
    backends, task = _report_links(store, ui)  # the summary's link, then the task's
    assert backends.startswith(f"{ui}/#/compare-runs?")

    parents = [store["ids"][lm]["parent_run_id"] for lm in LLMS]
    text, found = _load(backends, ["Comparing 2 Runs", *LLMS, *parents])
    assert found == [], "the MLflow UI logged problems:\n" + "\n".join(found)
    assert "Comparing 2 Runs" in text
    for lm, run in zip(LLMS, parents):
        assert lm in text and run in text, (lm, run, text[:2000])

    runs = [store["ids"][lm]["run_id"] for lm in LLMS]
    text, found = _load(task, ["Comparing 2 Runs", *runs])
    assert found == [], "the MLflow UI logged problems:\n" + "\n".join(found)
    for run in runs:
        assert run in text
    assert "best_speedup_eager" in text  # the runs' metrics are compared


def test_mlflow_ui_lists_both_backends_runs(store: dict[str, Any], ui: str) -> None:
    exp = store["ids"][LLMS[0]]["experiment_id"]
    text, found = _load(f"{ui}/#/experiments/{exp}/runs", [*LLMS])
    assert found == [], "the MLflow UI logged problems:\n" + "\n".join(found)
    for lm in LLMS:
        assert lm in text, text[:2000]
