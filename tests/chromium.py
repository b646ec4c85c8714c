"""Headless Chromium for the browser tests: Debian's chromium driven over the DevTools
protocol through a pipe (``--remote-debugging-pipe``: no port, no websocket library).

Chromium: ``$ASSAY_CHROMIUM``, else ``/usr/lib/chromium/chromium`` (Debian's binary, without
its launcher script), else ``chromium`` / ``chromium-browser`` / ``google-chrome`` on PATH.
CI installs it in ``.ci/run`` (``make chromium``).
"""

from __future__ import annotations

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

WIDTH, HEIGHT = 1280, 900
TIMEOUT_S = 60.0
INSTALL = ("install Debian's package (as root: apt-get install -y --no-install-recommends "
           "chromium; CI does it in .ci/run) or set ASSAY_CHROMIUM")


def find_chromium() -> str | None:
    """The chromium binary to drive, or None where there is none."""
    env = os.environ.get("ASSAY_CHROMIUM")
    if env:
        return env
    if os.access("/usr/lib/chromium/chromium", os.X_OK):
        return "/usr/lib/chromium/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium_binary() -> str:
    """The chromium binary; the test fails (not skips) without one."""
    path = find_chromium()
    if path is None:
        pytest.fail(f"no chromium: {INSTALL}", pytrace=False)
    return path


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

    def attach_page(self) -> str:
        """Attach to the browser's page with the Page, Runtime, Log and Network events on and
        the window's size set; returns the session id for ``send``."""
        targets = self.send("Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        session = self.send("Target.attachToTarget",
                            {"targetId": page["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
                  session=session)
        return session

    def evaluate(self, expression: str, session: str) -> Any:
        """The value of a JavaScript expression in the page."""
        return self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                         session=session)["result"].get("value")

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


def problems(events: list[dict[str, Any]], warnings: bool = True) -> list[str]:
    """Console errors and warnings, uncaught exceptions, browser log errors (CSP violations,
    failed loads) and failed requests; ``warnings=False``: errors only (for pages that are not
    ours, whose bundled libraries warn about their own deprecations)."""
    levels = ("error", "warning", "assert") if warnings else ("error", "assert")
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in levels:
            out.append(f"console.{p['type']}: "
                       + " ".join(str(a.get("value", a.get("description", "")))
                                  for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"exception: {d.get('text')} "
                       f"{d.get('exception', {}).get('description', '')}")
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") in levels:
            entry = p["entry"]
            out.append(f"log {entry.get('source')}/{entry.get('level')}: {entry.get('text')} "
                       f"{entry.get('url', '')}")
        elif m == "Network.loadingFailed":
            out.append(f"request failed: {p.get('errorText')} {p.get('blockedReason', '')}")
    return out
