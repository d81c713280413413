"""A local OpenAI- and Anthropic-compatible model server for tests.

Serves, on 127.0.0.1 and an ephemeral port:

- ``POST /v1/chat/completions``: a ``chat.completion`` JSON object, or with
  ``"stream": true`` server-sent ``chat.completion.chunk`` events ending in
  ``data: [DONE]``; with ``stream_options.include_usage`` a last chunk with
  empty ``choices`` carries the usage, as OpenAI does. A request that offers
  ``tools`` and ends with a user message is answered with a call to the first
  tool (so tool-calling loops can be tested); one with a JSON-schema
  ``response_format`` is answered with a JSON object whose string fields
  hold the answer (so ``parse``/``response_format=Model`` work).
- ``POST /v1/messages``: an Anthropic ``message`` JSON object, or with
  ``"stream": true`` the events ``message_start``, ``content_block_start``,
  ``ping``, ``content_block_delta``..., ``content_block_stop``,
  ``message_delta`` (with the output usage) and ``message_stop``.
- ``GET /_stats``: the counts below, as JSON (a kernel in another process can
  ask); it is not counted itself.

Answers are deterministic but distinct: answer number *n* says
``"answer #n to: <last user text>"``, so a replayed object (which still says
the old *n*) can be told from a new one. Token counts are words: input tokens
are the words of all messages, output tokens the words of the answer. Every
model request is counted per path, and the usage the server reported is
summed; with ``log`` set, each request is also appended to that file as one
JSON line, so a test can assert "zero repeated requests" across processes.

A streamed request whose last user message contains ``FAIL_MID_STREAM`` gets
an error event after two events (``data: {"error": ...}`` for OpenAI,
``event: error`` for Anthropic), as a provider sends when it fails mid-way.

The server is bounded: after ``max_requests`` model requests it answers 503,
and after ``lifetime`` seconds it stops itself. ``chunk_delay`` sleeps between
stream events, so a test can kill a kernel in the middle of a stream.

Run standalone with ``python tests/llm_server.py --port-file F [--log L]``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

CREATED = 1_700_000_000


def _text_of(content: Any) -> str:
    """The text of an OpenAI or Anthropic message ``content`` (a string or parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _words(text: str) -> int:
    return len(text.split())


class LLMServer:
    """The server; use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(
        self,
        *,
        log: str | Path | None = None,
        max_requests: int = 1000,
        lifetime: float = 600.0,
        chunk_delay: float = 0.0,
    ) -> None:
        self.log = Path(log) if log else None
        self.max_requests = max_requests
        self.lifetime = lifetime
        self.chunk_delay = chunk_delay
        self.counts: dict[str, int] = {}
        self.usage = {"input_tokens": 0, "output_tokens": 0}
        self.n = 0
        self.saw_credentials = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None

    # -- lifecycle -----------------------------------------------------------
    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no path)."""
        assert self._httpd is not None, "the server is not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def total(self) -> int:
        """Model requests served so far (all paths)."""
        with self._lock:
            return sum(self.counts.values())

    def start(self) -> LLMServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.counts),
                "total": sum(self.counts.values()),
                "usage": dict(self.usage),
            }

    # -- bookkeeping ---------------------------------------------------------
    def _count(self, path: str, body: dict[str, Any], credentials: bool) -> int | None:
        """The request's number, or None when the server is over its bound."""
        with self._lock:
            if sum(self.counts.values()) >= self.max_requests:
                return None
            self.counts[path] = self.counts.get(path, 0) + 1
            self.n += 1
            self.saw_credentials += credentials
            n = self.n
            if self.log is not None:
                line = {"n": n, "path": path, "stream": bool(body.get("stream"))}
                line["last"] = _last_user_text(body)[:200]
                with self.log.open("a") as f:
                    f.write(json.dumps(line) + "\n")
            return n

    def _add_usage(self, input_tokens: int, output_tokens: int) -> None:
        with self._lock:
            self.usage["input_tokens"] += input_tokens
            self.usage["output_tokens"] += output_tokens


def _last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _input_tokens(body: dict[str, Any]) -> int:
    words = _words(_text_of(body.get("system")))
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            words += _words(_text_of(message.get("content")))
    return max(words, 1)


def _structured(body: dict[str, Any], text: str) -> str:
    """With a JSON-schema ``response_format``, the answer as JSON: each string field says it."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") != "json_schema":
        return text
    props = (fmt.get("json_schema") or {}).get("schema", {}).get("properties", {})
    return json.dumps({k: text for k, v in props.items() if v.get("type") == "string"})


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The requests a server logged to ``path`` (empty when there were none)."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


class _Handler(BaseHTTPRequestHandler):
    owner: LLMServer
    _fail_mid_stream = False
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass  # quiet: tests read the counts, not the access log

    def do_GET(self) -> None:  # noqa: N802 - stdlib's name
        if self.path.split("?")[0] == "/_stats":
            self._json(200, self.owner.stats())
        else:
            self._json(404, {"error": {"message": f"no such path {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib's name
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "the body is not JSON"}})
            return
        path = self.path.split("?")[0]
        if path not in ("/v1/chat/completions", "/v1/messages"):
            self._json(404, {"error": {"message": f"no such path {path}"}})
            return
        creds = bool(self.headers.get("Authorization") or self.headers.get("x-api-key"))
        n = self.owner._count(path, body, creds)
        if n is None:
            self._json(503, {"error": {"message": "test server: max_requests reached"}})
            return
        self._fail_mid_stream = "FAIL_MID_STREAM" in _last_user_text(body)
        text = f"answer #{n} to: {_last_user_text(body)[:80]}"
        inp, out = _input_tokens(body), _words(text)
        # only usage the reply reports is summed: an OpenAI stream reports it
        # only when asked to (stream_options.include_usage)
        reported = not (
            path == "/v1/chat/completions"
            and body.get("stream")
            and not (body.get("stream_options") or {}).get("include_usage")
        )
        if reported:
            self.owner._add_usage(inp, out)
        if path == "/v1/chat/completions":
            self._openai(n, body, text, inp, out)
        else:
            self._anthropic(n, body, text, inp, out)

    # -- OpenAI --------------------------------------------------------------
    def _openai(self, n: int, body: dict[str, Any], text: str, inp: int, out: int) -> None:
        model = body.get("model", "test-model")
        usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
        tools = body.get("tools") or []
        messages = body.get("messages") or [{}]
        call = None
        if tools and messages[-1].get("role") == "user":
            name = tools[0].get("function", {}).get("name", "tool")
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps({"n": n})},
            }
        text = _structured(body, text)
        head = {"id": f"chatcmpl-{n}", "created": CREATED + n, "model": model}
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": None if call else text}
            if call:
                message["tool_calls"] = [call]
            choice = {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if call else "stop",
                "logprobs": None,
            }
            obj = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            self._json(200, obj)
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**head, "object": "chat.completion.chunk", "choices": [choice]}

        events = [chunk({"role": "assistant", "content": ""})]
        if call:
            events.append(chunk({"tool_calls": [{"index": 0, **call}]}))
        else:
            words = text.split(" ")
            events += [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
        events.append(chunk({}, "tool_calls" if call else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            last = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            events.append(last)
        self._sse([(None, e) for e in events] + [(None, "[DONE]")])

    # -- Anthropic -----------------------------------------------------------
    def _anthropic(self, n: int, body: dict[str, Any], text: str, inp: int, out: int) -> None:
        model = body.get("model", "test-model")
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": inp, "output_tokens": out},
        }
        if not body.get("stream"):
            self._json(200, message)
            return
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": inp, "output_tokens": 1}
        words = text.split(" ")
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": start}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            ("ping", {"type": "ping"}),
        ]
        for i, w in enumerate(words):
            delta = {"type": "text_delta", "text": w if i == 0 else " " + w}
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                )
            )
        events += [
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": out},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        self._sse(events)

    # -- writing -------------------------------------------------------------
    def _json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[tuple[str | None, Any]]) -> None:
        if self._fail_mid_stream:
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "boom"}}
            events = [*events[:2], ("error" if events[0][0] else None, error)]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for name, data in events:
                payload = data if isinstance(data, str) else json.dumps(data)
                frame = (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
                self.wfile.write(frame.encode())
                self.wfile.flush()
                if self.owner.chunk_delay:
                    time.sleep(self.owner.chunk_delay)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away mid-stream (a killed kernel): nothing to finish


def main(argv: list[str] | None = None) -> None:
    """Serve until ``--lifetime`` runs out; write the port to ``--port-file``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log")
    parser.add_argument("--lifetime", type=float, default=600.0)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    parser.add_argument("--max-requests", type=int, default=1000)
    args = parser.parse_args(argv)
    server = LLMServer(
        log=args.log,
        lifetime=args.lifetime,
        chunk_delay=args.chunk_delay,
        max_requests=args.max_requests,
    ).start()
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(server.url.rsplit(":", 1)[1])
    tmp.replace(args.port_file)
    while server._httpd is not None:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
