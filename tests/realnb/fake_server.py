"""tests/llm_server.py, extended for the real-notebook corpus.

What ``tests/llm_server.py`` serves, plus what real notebooks need of a model:

- **Tool calls that fit the tool.** Offered tools and a last message from the
  user, the base server calls the first tool with ``{"n": n}``. Here the tool
  is the one whose name's words occur most in the user's text (the first on a
  tie, or the one ``tool_choice`` forces), and its arguments fill the tool's
  JSON schema: a string is the first word of the text holding a digit
  (``C1``, ``1,984,135``), else its last word; an enum its first value; a
  number the first integer of the text, else 2; objects and arrays are filled
  recursively (``$ref`` and ``anyOf`` followed). So a customer-service loop
  looks up ``C1`` and a calculator evaluates a number, as with a real model.
- **Anthropic tool use**, plain and streamed (``tool_use`` blocks,
  ``input_json_delta`` events, ``stop_reason: "tool_use"``), on the same rule.
- **Structured outputs that fit the schema.** A JSON-schema
  ``response_format`` (chat completions) or ``text.format`` (Responses API) is
  answered with a JSON object of every property of the schema: a string
  property (not an enum) says the answer, the others are filled from the
  user's text as tool arguments are (so an ``int`` field of a pydantic
  ``response_format`` parses; the base server fills string fields only).
- **OpenAI Responses API** (``POST /v1/responses``, plain and streamed): a
  ``message`` output item, or a ``function_call`` item when tools are offered
  and the last input item comes from the user; with ``"stream": true`` the
  events ``response.created``, ``response.output_item.added``, the text's
  ``content_part`` and ``output_text.delta`` events (or the call's
  ``function_call_arguments`` events), ``response.output_item.done`` and
  ``response.completed``.
- **OpenAI embeddings** (``POST /v1/embeddings``): 32 numbers per input from
  a hash of its words, deterministic.
- **OpenAI streams send the first two words as one chunk** (chat completions
  and Responses), so a notebook that prints each chunk prints ``answer #n``
  whole, and :func:`mask` masks its number as it does a whole answer's.

Every request is counted and logged as in the base server, and also kept in
:attr:`FakeServer.requests` with a digest of its body in which the parts that
differ between runs (answer numbers, ids) are masked, so a test can tell
"the same request sent again" from a new one across kernels. :meth:`reset`
starts the numbering again (the harness gives each run of a notebook the same
server, so the base URL a notebook reads from the environment never changes,
and resets it between runs). ``kill_at = (n, pid)`` SIGKILLs process ``pid``
when request ``n`` arrives, before answering it: requests ``1..n-1`` had
returned, request ``n`` never does.

Standalone: ``python tests/realnb/fake_server.py --port-file F [--log L]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_server import (  # noqa: E402
    CREATED,
    LLMServer,
    _Handler,
    _input_tokens,
    _last_user_text,
    _text_of,
    _words,
)

#: The parts of a request body that differ between two runs making the same request.
VOLATILE = re.compile(
    r"(answer #|call_|msg_|toolu_|chatcmpl-|resp_|fc_|run-|lc_)\d+"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|\b17000\d{5}\b"
)


def mask(text: str) -> str:
    """`text` with answer numbers, ids and UUIDs masked (see VOLATILE)."""
    return VOLATILE.sub(lambda m: (m.group(1) or "") + "#", text)


def digest(body: dict[str, Any]) -> str:
    """A digest of a request body, the same for the same request in another run."""
    return hashlib.sha256(mask(json.dumps(body, sort_keys=True)).encode()).hexdigest()[:16]


# -- choosing a tool and its arguments ---------------------------------------------------


def _tool_schema(tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, JSON schema) of an OpenAI chat, Responses or Anthropic tool."""
    if "function" in tool:
        fn = tool["function"]
        return fn.get("name", "tool"), fn.get("parameters") or {}
    if "input_schema" in tool:
        return tool.get("name", "tool"), tool.get("input_schema") or {}
    return tool.get("name", "tool"), tool.get("parameters") or {}


def pick_tool(tools: list[dict[str, Any]], text: str, forced: str | None) -> int:
    """Index of the tool to call: `forced`, else the best match of `text`."""
    names = [_tool_schema(t)[0] for t in tools]
    if forced in names:
        return names.index(forced)
    words = set(re.findall(r"[a-z]+", text.lower()))
    scores = [sum(w in words for w in re.split(r"[_\W]+", n.lower()) if w) for n in names]
    return scores.index(max(scores)) if scores else 0


def _value_words(text: str, key: str = "") -> tuple[str, int]:
    tokens = [t.strip("?.!,;:'\"()<>") for t in text.split()]
    if "email" in key.lower():
        at = [t for t in tokens if "@" in t]
        if at:
            return at[0], 2
    tokens = [t for t in tokens if t]
    with_digit = [t for t in tokens if any(c.isdigit() for c in t)]
    string = with_digit[0] if with_digit else (tokens[-1] if tokens else "x")
    ints = re.findall(r"\b\d+\b", text.replace(",", ""))
    return string, int(ints[0]) if ints else 2


def fill(
    schema: dict[str, Any],
    text: str,
    root: dict[str, Any] | None = None,
    depth: int = 0,
    key: str = "",
):
    """A value fitting JSON `schema`, taken from the user's `text` where it can be."""
    root = root or schema
    if depth > 8:
        return None
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[-1]
        defs = root.get("$defs") or root.get("definitions") or {}
        return fill(defs.get(ref, {}), text, root, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return fill(options[0], text, root, depth + 1)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    string, number = _value_words(text, key + str(schema.get("format", "")))
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: fill(v, text, root, depth + 1, k) for k, v in props.items()}
    if kind == "array":
        return [fill(schema.get("items") or {"type": "string"}, text, root, depth + 1)]
    if kind == "integer":
        return number
    if kind == "number":
        return float(number)
    if kind == "boolean":
        return True
    return string


def structured(schema: dict[str, Any], text: str, last: str) -> str:
    """The answer as a JSON object fitting `schema` (see the module docstring)."""
    out = {}
    for key, prop in (schema.get("properties") or {}).items():
        if prop.get("type") == "string" and "enum" not in prop:
            out[key] = text
        else:
            out[key] = fill(prop, last, schema, 1, key)
    return json.dumps(out)


def _schema_of(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a chat or Responses request asks its answer to fit, if any."""
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema") or {}
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        return fmt.get("schema") or {}
    return None


def _stream_words(text: str) -> list[str]:
    """The pieces an OpenAI stream sends `text` in: its words, the first two together."""
    words = text.split(" ")
    return [" ".join(words[:2]), *words[2:]] if len(words) > 1 else words


def _openai_forced(body: dict[str, Any]) -> str | None | bool:
    """The tool name `tool_choice` forces, True for "required", False for "none"."""
    choice = body.get("tool_choice")
    if choice == "none":
        return False
    if choice == "required":
        return True
    if isinstance(choice, dict):
        return (choice.get("function") or {}).get("name") or choice.get("name") or True
    return None


class _FakeHandler(_Handler):
    owner: FakeServer

    def do_POST(self) -> None:  # noqa: N802 - stdlib's name
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "the body is not JSON"}})
            return
        path = self.path.split("?")[0]
        known = ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/embeddings")
        if path not in known:
            self._json(404, {"error": {"message": f"no such path {path}"}})
            return
        creds = bool(self.headers.get("Authorization") or self.headers.get("x-api-key"))
        n = self.owner._count(path, body, creds)
        if n is None:
            self._json(503, {"error": {"message": "test server: max_requests reached"}})
            return
        if self.owner._note(n, path, body):
            self.close_connection = True
            return  # the kernel was killed: this request is never answered
        try:
            self._answer(n, path, body)
        finally:
            self.owner._answered(n)

    def _answer(self, n: int, path: str, body: dict[str, Any]) -> None:
        if path == "/v1/embeddings":
            self._embeddings(body)
            return
        if path == "/v1/responses":
            self._responses(n, body)
            return
        last = _last_user_text(body)
        self._fail_mid_stream = "FAIL_MID_STREAM" in last
        text = f"answer #{n} to: {last[:80]}"
        inp, out = _input_tokens(body), _words(text)
        self.owner._add_usage(inp, out)
        if path == "/v1/chat/completions":
            self._chat(n, body, text, inp, out)
        else:
            self._messages(n, body, text, inp, out)

    # -- OpenAI chat completions --------------------------------------------------------
    def _chat(self, n: int, body: dict[str, Any], text: str, inp: int, out: int) -> None:
        tools = body.get("tools") or []
        messages = body.get("messages") or [{}]
        forced = _openai_forced(body)
        wants = tools and forced is not False
        if wants and (forced or messages[-1].get("role") == "user"):
            last = _last_user_text(body)
            i = pick_tool(tools, last, forced if isinstance(forced, str) else None)
            name, schema = _tool_schema(tools[i])
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(fill(schema, last))},
            }
            self._chat_reply(n, body, None, call, inp, out)
            return
        self._chat_reply(n, body, text, None, inp, out)

    def _chat_reply(self, n, body, text, call, inp, out) -> None:
        model = body.get("model", "test-model")
        usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
        head = {"id": f"chatcmpl-{n}", "created": CREATED + n, "model": model}
        schema = _schema_of(body)
        if text is not None and schema is not None:
            text = structured(schema, text, _last_user_text(body))
        if not body.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if call:
                message["tool_calls"] = [call]
            choice = {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if call else "stop",
                "logprobs": None,
            }
            self._json(
                200, {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**head, "object": "chat.completion.chunk", "choices": [choice]}

        events = [chunk({"role": "assistant", "content": ""})]
        if call:
            events.append(chunk({"tool_calls": [{"index": 0, **call}]}))
        else:
            words = _stream_words(text)
            events += [chunk({"content": w if i == 0 else " " + w}) for i, w in enumerate(words)]
        events.append(chunk({}, "tool_calls" if call else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            last = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            events.append(last)
        self._sse([(None, e) for e in events] + [(None, "[DONE]")])

    # -- Anthropic messages -------------------------------------------------------------
    def _messages(self, n: int, body: dict[str, Any], text: str, inp: int, out: int) -> None:
        tools = [t for t in body.get("tools") or [] if "input_schema" in t]
        messages = body.get("messages") or [{}]
        choice = body.get("tool_choice") or {}
        forced = choice.get("name") if choice.get("type") == "tool" else None
        must = choice.get("type") in ("tool", "any")
        last_msg = messages[-1] if messages else {}
        content = last_msg.get("content")
        from_user = last_msg.get("role") == "user" and not (
            isinstance(content, list)
            and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        )
        if tools and choice.get("type") != "none" and (must or from_user):
            last = _last_user_text(body)
            i = pick_tool(tools, last, forced)
            name, schema = _tool_schema(tools[i])
            block = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}
            block["input"] = fill(schema, last)
            self._anthropic_reply(n, body, [block], "tool_use", inp, out)
            return
        self._anthropic_reply(n, body, [{"type": "text", "text": text}], "end_turn", inp, out)

    def _anthropic_reply(self, n, body, blocks, stop, inp, out) -> None:
        message = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "test-model"),
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": inp, "output_tokens": out},
        }
        if not body.get("stream"):
            self._json(200, message)
            return
        start = {**message, "content": [], "stop_reason": None}
        start["usage"] = {"input_tokens": inp, "output_tokens": 1}
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": start}),
        ]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                empty = {"type": "text", "text": ""}
                deltas = [
                    {"type": "text_delta", "text": w if i == 0 else " " + w}
                    for i, w in enumerate(block["text"].split(" "))
                ]
            else:
                empty = {**block, "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": empty},
                )
            )
            if index == 0:
                events.append(("ping", {"type": "ping"}))
            for delta in deltas:
                events.append(
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index, "delta": delta},
                    )
                )
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events += [
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": out},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        self._sse(events)

    # -- OpenAI Responses and embeddings -----------------------------------------------
    def _responses(self, n: int, body: dict[str, Any]) -> None:
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        items = items or []
        last_user = ""
        for item in reversed(items):
            if isinstance(item, dict) and item.get("role") == "user":
                last_user = _text_of(item.get("content"))
                break
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        last = items[-1] if items else {}
        from_user = isinstance(last, dict) and last.get("role") == "user"
        text = f"answer #{n} to: {last_user[:80]}"
        inp, out = max(_words(last_user), 1), _words(text)
        self.owner._add_usage(inp, out)
        if tools and from_user:
            i = pick_tool(tools, last_user, None)
            name, schema = _tool_schema(tools[i])
            output = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": name,
                "arguments": json.dumps(fill(schema, last_user)),
                "status": "completed",
            }
        else:
            schema = _schema_of(body)
            if schema is not None:
                text = structured(schema, text, last_user)
            output = {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": CREATED + n,
            "model": body.get("model", "test-model"),
            "status": "completed",
            "output": [output],
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": inp,
                "output_tokens": out,
                "total_tokens": inp + out,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        if not body.get("stream"):
            self._json(200, response)
            return
        self._responses_stream(response, output)

    def _responses_stream(self, response: dict[str, Any], output: dict[str, Any]) -> None:
        """`response` as the Responses API streams it (see the module docstring)."""
        events: list[dict[str, Any]] = []

        def event(kind: str, **data: Any) -> None:
            events.append({"type": kind, "sequence_number": len(events), **data})

        item_id = output["id"]
        at = {"output_index": 0}
        event("response.created", response={**response, "status": "in_progress", "output": []})
        if output["type"] == "message":
            text = output["content"][0]["text"]
            event(
                "response.output_item.added",
                item={**output, "status": "in_progress", "content": []},
                **at,
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item_id, **at, "content_index": 0}
            event("response.content_part.added", part=part, **where)
            for i, word in enumerate(_stream_words(text)):
                delta = word if i == 0 else " " + word
                event("response.output_text.delta", delta=delta, logprobs=[], **where)
            event("response.output_text.done", text=text, logprobs=[], **where)
            event("response.content_part.done", part={**part, "text": text}, **where)
        else:
            event(
                "response.output_item.added",
                item={**output, "status": "in_progress", "arguments": ""},
                **at,
            )
            args = output["arguments"]
            event("response.function_call_arguments.delta", item_id=item_id, delta=args, **at)
            event("response.function_call_arguments.done", item_id=item_id, arguments=args, **at)
        event("response.output_item.done", item=output, **at)
        event("response.completed", response=response)
        self._sse([(e["type"], e) for e in events])

    def _embeddings(self, body: dict[str, Any]) -> None:
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        data = []
        for i, text in enumerate(inputs or []):
            vec = [0.0] * 32
            for word in str(text).lower().split():
                h = int(hashlib.md5(word.encode()).hexdigest(), 16)
                vec[h % 32] += 1.0
            norm = sum(v * v for v in vec) ** 0.5 or 1.0
            data.append({"object": "embedding", "index": i, "embedding": [v / norm for v in vec]})
        words = sum(_words(str(t)) for t in inputs or [])
        self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "test-embedding"),
                "usage": {"prompt_tokens": words, "total_tokens": words},
            },
        )


class FakeServer(LLMServer):
    """LLMServer with the endpoints above, request digests, :meth:`reset` and ``kill_at``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: list[dict[str, Any]] = []
        self.kill_at: tuple[int, int] | None = None
        self.killed = False
        self.killed_at: float | None = None  # when the kernel was killed (monotonic)

    def start(self) -> FakeServer:
        server = self

        class Handler(_FakeHandler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def reset(self) -> None:
        """Forget every request: the next one is number 1 again."""
        with self._lock:
            self.counts.clear()
            self.usage = {"input_tokens": 0, "output_tokens": 0}
            self.n = 0
            self.requests = []
            self.kill_at = None
            self.killed = False
            self.killed_at = None

    def _answered(self, n: int) -> None:
        """Request `n`'s answer is written whole (``answered``: the monotonic time)."""
        with self._lock:
            for r in reversed(self.requests):
                if r["n"] == n:
                    r["answered"] = time.monotonic()
                    break

    def _note(self, n: int, path: str, body: dict[str, Any]) -> bool:
        """Keep request `n`; True if it is the one to kill the kernel at (then it is)."""
        with self._lock:
            self.requests.append(
                {"n": n, "path": path, "digest": digest(body), "last": _last_user_text(body)[:120]}
            )
            if self.kill_at is not None and n >= self.kill_at[0] and not self.killed:
                self.killed = True
                self.killed_at = time.monotonic()
                try:
                    os.kill(self.kill_at[1], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return True
            return self.killed


def main(argv: list[str] | None = None) -> None:
    """Serve until ``--lifetime`` runs out; write the port to ``--port-file``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log")
    parser.add_argument("--lifetime", type=float, default=600.0)
    args = parser.parse_args(argv)
    server = FakeServer(log=args.log, lifetime=args.lifetime).start()
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(server.url.rsplit(":", 1)[1])
    tmp.replace(args.port_file)
    while server._httpd is not None:
        time.sleep(0.2)


if __name__ == "__main__":
    main()
