"""A scripted OpenAI-compatible chat completions server on 127.0.0.1, for tests.

It is a real HTTP server (``http.server`` in a background thread, port chosen by the OS), so
the code under test goes through litellm, the openai SDK and httpx exactly as in production.
Its answers come from a *script*: a list of steps, consumed one per request, or a callable
that takes the request's JSON body and returns a step. A step is one of

- ``"text"``: answer with this text (HTTP 200, a complete ``chat.completion`` object);
- ``{"answer": "text", "usage": {...}, "finish_reason": "stop"}``: the same, with overrides;
- ``{"status": 429}`` (or any status >= 400, optional ``"message"``): an OpenAI-style error body;
- ``{"sleep": seconds}`` then an answer: wait first. The answer is the step's own ``"answer"``
  or, when it has none, the next step of the script (consumed by the same request);
- ``{"garbage": True}``: HTTP 200 with a body that is not JSON;
- ``{"malformed": True}``: HTTP 200 with JSON that lacks ``choices``.

When a list script runs out, the server answers HTTP 400 "script exhausted" (a client error,
so a well-behaved client does not retry and the test fails loudly). Every request is recorded
in ``server.requests`` (path, headers, JSON body) for asserts.

    with ScriptedLLMServer(["Strategy: fusion\\n```python\\n...```"]) as server:
        litellm.completion(model="openai/scripted", api_base=server.url, api_key="sk-test", ...)
        assert len(server.requests) == 1
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Step = Any  # str | dict


def _count_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: whitespace-separated words, at least 1."""
    return max(1, len(text.split()))


def completion_body(answer: str, model: str, request: dict | None = None,
                    usage: dict | None = None, finish_reason: str = "stop") -> dict:
    prompt = ""
    for msg in (request or {}).get("messages", []) or []:
        content = msg.get("content")
        prompt += content if isinstance(content, str) else json.dumps(content)
    prompt_tokens = _count_tokens(prompt)
    completion_tokens = _count_tokens(answer)
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
         "total_tokens": prompt_tokens + completion_tokens}
    if usage:
        u.update(usage)
        u["total_tokens"] = usage.get("total_tokens",
                                      u["prompt_tokens"] + u["completion_tokens"])
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": answer},
                     "finish_reason": finish_reason}],
        "usage": u,
    }


class ScriptedLLMServer:
    """Context manager: ``with ScriptedLLMServer(script) as s: ... s.url ... s.requests``."""

    def __init__(self, script: "list[Step] | Callable[[dict], Step]" = (),
                 model: str | None = None):
        self._script = script if callable(script) else list(script)
        self._pos = 0
        self.model = model  # echoed in answers; None echoes the request's model
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "ScriptedLLMServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_GET(self):  # noqa: N802 - http.server's naming
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [
                        {"id": server.model or "scripted", "object": "model", "created": 0,
                         "owned_by": "assay-tests"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}",
                                               "type": "invalid_request_error"}})

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_raw": raw.decode(errors="replace")}
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "json": body, "time": time.time()})
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}",
                                               "type": "invalid_request_error"}})
                    return
                try:
                    server._respond(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (e.g. its timeout expired while we slept)

            def _send(self, status: int, payload: Any, raw: bytes | None = None):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        httpd.block_on_close = False
        self._httpd = httpd
        self._port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="scripted-llm-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes handlers that are sleeping
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "ScriptedLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- public helpers ------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port (still known after close, for asserts on cache keys)."""
        assert self._port is not None, "server not started"
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["path"].rstrip("/").endswith("/chat/completions")]

    def extend(self, steps: list[Step]) -> None:
        """Append steps to a list script (e.g. between two phases of a test)."""
        assert isinstance(self._script, list), "extend() needs a list script"
        with self._lock:
            self._script.extend(steps)

    @property
    def remaining(self) -> int:
        return len(self._script) - self._pos if isinstance(self._script, list) else -1

    # -- the script ----------------------------------------------------------------------------
    def _next_step(self, request: dict) -> tuple[bool, Step]:
        if callable(self._script):
            return True, self._script(request)
        with self._lock:
            if self._pos >= len(self._script):
                return False, None
            step = self._script[self._pos]
            self._pos += 1
            return True, step

    def _respond(self, handler, request: dict) -> None:
        ok, step = self._next_step(request)
        if not ok:
            handler._send(400, {"error": {"message": "scripted server: script exhausted",
                                          "type": "invalid_request_error", "code": None}})
            return
        model = self.model or request.get("model") or "scripted"
        if isinstance(step, dict) and "sleep" in step:
            if self._closing.wait(float(step["sleep"])):
                return
            if "answer" in step:
                step = {k: v for k, v in step.items() if k != "sleep"}
            else:
                ok, step = self._next_step(request)
                if not ok:
                    handler._send(400, {"error": {"message": "scripted server: script "
                                                  "exhausted after sleep",
                                                  "type": "invalid_request_error"}})
                    return
        if isinstance(step, str):
            handler._send(200, completion_body(step, model, request))
        elif isinstance(step, dict) and "status" in step:
            status = int(step["status"])
            message = step.get("message") or f"scripted error {status}"
            etype = {429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(status, "server_error"
                                                                            if status >= 500 else
                                                                            "invalid_request_error")
            handler._send(status, {"error": {"message": message, "type": etype, "code": None}})
        elif isinstance(step, dict) and step.get("garbage"):
            handler._send(200, None, raw=b"<html>this is not json {{{")
        elif isinstance(step, dict) and step.get("malformed"):
            handler._send(200, {"id": "chatcmpl-malformed", "object": "chat.completion",
                                "created": int(time.time()), "model": model})
        elif isinstance(step, dict) and "answer" in step:
            handler._send(200, completion_body(step["answer"], model, request,
                                               usage=step.get("usage"),
                                               finish_reason=step.get("finish_reason", "stop")))
        else:
            handler._send(500, {"error": {"message": f"scripted server: bad step {step!r}",
                                          "type": "server_error"}})
