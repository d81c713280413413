"""HTTP recorded at the transport and replayed with the server gone (nbdurable/http_record.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import requests
from llm_server import LLMServer

from nbdurable.clients.http_record import Exchange, HTTPSession, ReplayMiss, safe_url
from nbdurable.clients.usage import Tally, reply_of_http_body
from nbdurable.store import values

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MESSAGES = [{"role": "user", "content": "what is durable execution"}]


def _calls(base_openai, base_anthropic):
    """Direct SDK calls, as a step body would make them; returns everything they gave."""
    client = openai.OpenAI(api_key="sk-live-secret-0001", base_url=base_openai, max_retries=0)
    claude = anthropic.Anthropic(
        api_key="sk-ant-live-secret-0002", base_url=base_anthropic, max_retries=0
    )
    out = {}
    out["completion"] = client.chat.completions.create(model="gpt-t", messages=MESSAGES)
    out["again"] = client.chat.completions.create(model="gpt-t", messages=MESSAGES)
    out["chunks"] = list(
        client.chat.completions.create(
            model="gpt-t", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    with client.chat.completions.stream(model="gpt-t", messages=MESSAGES) as s:
        out["events"] = list(s)
        out["final"] = s.get_final_completion()
    out["message"] = claude.messages.create(model="c", max_tokens=20, messages=MESSAGES)
    with claude.messages.stream(model="c", max_tokens=20, messages=MESSAGES) as s:
        out["text"] = list(s.text_stream)
        out["final_message"] = s.get_final_message()
    return out


def test_sdk_calls_recorded_then_replayed_with_the_server_stopped():
    recorded: list[Exchange] = []
    with LLMServer(lifetime=120) as server:
        urls = (server.openai_base_url, server.anthropic_base_url)
        with HTTPSession(on_record=recorded.append) as session:
            first = _calls(*urls)
        requests_made = server.total
    assert requests_made == 6 and session.sent == 6 and len(recorded) == 6
    # the tokens the recorded bodies report are the ones the server counted
    tally = Tally()
    for ex in recorded:
        tally.add(reply_of_http_body(ex.body, dict(ex.headers)["Content-Type"]))
    assert tally.total.replies == 5, "all but the stream not asked for its usage"
    assert (tally.total.input, tally.total.output) == (
        server.usage["input_tokens"],
        server.usage["output_tokens"],
    )
    assert first["completion"] != first["again"], "two identical questions, two answers"
    stored = values.dumps(recorded)  # the store's own serializer
    assert b"sk-live-secret" not in stored and b"sk-ant-live-secret" not in stored
    assert all("authorization" not in dict(ex.headers) for ex in recorded)

    # the server is gone: any request that went out would fail
    with HTTPSession(values.loads(stored), on_miss="raise") as replay:
        again = _calls(*urls)
    assert replay.served == 6 and replay.sent == 0
    assert again == first
    assert type(again["completion"]) is type(first["completion"])
    assert again["completion"].id != again["again"].id, "same key, answers in their order"


def test_async_gather_replays_in_any_order():
    recorded: list[Exchange] = []

    async def ask_all(base):
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=base, max_retries=0)
        replies = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"q{i}"}]
                )
                for i in range(5)
            ]
        )
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        chunks = [c async for c in stream]
        await client.close()
        return replies, chunks

    with LLMServer(lifetime=120) as server:
        base = server.openai_base_url
        with HTTPSession(on_record=recorded.append):
            first = asyncio.run(ask_all(base))
    # replay from the exchanges in reverse: matching is by key, not position
    with HTTPSession(list(reversed(recorded)), on_miss="raise") as replay:
        again = asyncio.run(ask_all(base))
    assert replay.served == 6 and again == first


def test_a_changed_request_is_a_miss():
    recorded: list[Exchange] = []
    with LLMServer(lifetime=120) as server:
        client = openai.OpenAI(api_key="sk-t", base_url=server.openai_base_url, max_retries=0)
        with HTTPSession(on_record=recorded.append):
            client.chat.completions.create(model="m", messages=MESSAGES)
        with HTTPSession(recorded, on_miss="raise"):
            with pytest.raises(ReplayMiss, match="was not recorded"):
                client.chat.completions.create(model="other-model", messages=MESSAGES)
        # "live": the changed request goes out and is recorded; the known one is served
        more: list[Exchange] = []
        before = server.total
        with HTTPSession(recorded, on_record=more.append) as session:
            client.chat.completions.create(model="m", messages=MESSAGES)
            client.chat.completions.create(model="other-model", messages=MESSAGES)
        assert server.total - before == 1 and session.served == 1 and len(more) == 1
        assert json.loads(more[0].body)["model"] == "other-model"
        # the session's full set (served and new, in its own order) is the next record
        assert [e.ordinal for e in session.exchanges] == [1, 2]
        assert session.exchanges[0].body == recorded[0].body and session.exchanges[1] == more[0]


def test_an_abandoned_stream_is_not_recorded():
    # events arrive slowly, so closing after the first leaves the body unfinished
    # (a body that had fully arrived is a whole response, and is recorded)
    recorded: list[Exchange] = []
    with LLMServer(lifetime=120, chunk_delay=0.2) as server:
        client = openai.OpenAI(api_key="sk-t", base_url=server.openai_base_url)
        with HTTPSession(on_record=recorded.append):
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            next(iter(stream))
            stream.close()
    assert recorded == []


def test_plain_httpx_and_requests_too():
    originals = (httpx.HTTPTransport.handle_request, requests.adapters.HTTPAdapter.send)
    recorded: list[Exchange] = []
    body = {"model": "m", "messages": MESSAGES}
    with LLMServer(lifetime=120) as server:
        url = server.openai_base_url + "/chat/completions"
        with HTTPSession(on_record=recorded.append):
            a = httpx.post(url, json=body).json()
            b = requests.post(url, json=body, headers={"Authorization": "Bearer x"}).json()
            with requests.post(url, json={**body, "stream": True}, stream=True) as r:
                lines = [line for line in r.iter_lines() if line]
        assert server.total == 3
    with HTTPSession(recorded, on_miss="raise") as replay:
        assert httpx.post(url, json=body).json() == a
        assert requests.post(url, json=body).json() == b
        with requests.post(url, json={**body, "stream": True}, stream=True) as r:
            assert [line for line in r.iter_lines() if line] == lines
    assert replay.served == 3
    # outside a session nothing is patched any more
    assert (httpx.HTTPTransport.handle_request, requests.adapters.HTTPAdapter.send) == originals
    with pytest.raises(httpx.ConnectError):
        httpx.post(url, json=body)


class _Delegating(httpx.BaseTransport):
    """A transport of its own, as libraries make them: it sends through another one."""

    def __init__(self) -> None:
        self.inner, self.sent = httpx.HTTPTransport(), 0

    def handle_request(self, request):
        self.sent += 1
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class _ADelegating(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request):
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Retrying(httpx.HTTPTransport):
    """A subclass whose own method calls the patched one: its request is recorded once."""

    def handle_request(self, request):
        return super().handle_request(request)


def test_clients_with_transports_of_their_own():
    recorded: list[Exchange] = []
    body = {"model": "m", "messages": MESSAGES}
    delegating = _Delegating()

    def ask(base):
        out = []
        for transport in (delegating, _Retrying()):
            with httpx.Client(transport=transport) as c:
                out.append(c.post(base + "/chat/completions", json=body).json())
        client = openai.AsyncOpenAI(
            api_key="sk-t",
            base_url=base,
            max_retries=0,
            http_client=httpx.AsyncClient(transport=_ADelegating()),
        )

        async def go():
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            chunks = [c async for c in stream]
            await client.close()
            return reply, chunks

        out.append(asyncio.run(go()))
        return out

    with LLMServer(lifetime=120) as server:
        base = server.openai_base_url
        with HTTPSession(on_record=recorded.append) as session:
            first = ask(base)
        assert server.total == 4 and session.sent == 4 and len(recorded) == 4
    assert delegating.sent == 1
    # the server is gone: every answer comes from the record, none goes through a transport
    with HTTPSession(recorded, on_miss="raise") as replay:
        again = ask(base)
    assert replay.served == 4 and again == first
    assert delegating.sent == 1


def test_litellm_over_aiohttp_is_recorded(monkeypatch):
    # litellm sends its async calls through an httpx transport of its own, over aiohttp
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price table fetch on import
    transport = pytest.importorskip("litellm.llms.custom_httpx.aiohttp_transport")
    import aiohttp

    recorded: list[Exchange] = []

    async def ask(base):
        litellm = transport.LiteLLMAiohttpTransport(client=aiohttp.ClientSession)
        async with httpx.AsyncClient(transport=litellm) as c:
            r = await c.post(base + "/chat/completions", json={"model": "m", "messages": MESSAGES})
            return r.json()

    with LLMServer(lifetime=120) as server:
        base = server.openai_base_url
        with HTTPSession(on_record=recorded.append):
            first = asyncio.run(ask(base))
        assert server.total == 1 and len(recorded) == 1
    with HTTPSession(recorded, on_miss="raise") as replay:
        assert asyncio.run(ask(base)) == first
    assert replay.served == 1


def test_urls_lose_their_credentials():
    url = "https://u:p@example.com/v1/x?key=AIza" + "SyA-1234567890abcdefghijklmnopqrstu&alt=json"
    safe = safe_url(url)
    assert "AIza" not in safe and "u:p" not in safe and "alt=json" in safe
    assert safe_url("http://h/p?q=1") == "http://h/p?q=1"


def test_a_key_in_a_response_body_is_masked(monkeypatch):
    secret = "env-secret-value-12345"
    monkeypatch.setenv("SERVICE_TOKEN", secret)
    key = "sk-" + "proj-" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4"
    recorded: list[Exchange] = []
    with LLMServer(lifetime=120) as server:
        client = openai.OpenAI(api_key="sk-t", base_url=server.openai_base_url)
        ask = [{"role": "user", "content": f"echo {key} and {secret}"}]
        with HTTPSession(on_record=recorded.append):
            client.chat.completions.create(model="m", messages=ask)
            list(client.chat.completions.create(model="m", messages=ask, stream=True))
    assert len(recorded) == 2
    for ex in recorded:
        assert key.encode() not in ex.body and secret.encode() not in ex.body
        assert ex.redacted == ("openai", "$SERVICE_TOKEN")
    # still a valid response: replay parses it
    with HTTPSession(recorded, on_miss="raise"):
        reply = client.chat.completions.create(model="m", messages=ask)
        chunks = list(client.chat.completions.create(model="m", messages=ask, stream=True))
    assert "[redacted openai key]" in reply.choices[0].message.content
    assert len(chunks) > 2


def test_a_key_a_server_echoes_in_a_response_header_is_masked(monkeypatch):
    """A server that echoes the request's credentials in a header of its own."""
    import http.server
    import threading

    key = "sk-" + "proj-" + "Z9x8C7v6B5n4M3l2K1j0H9g8F7d6"
    secret = "env-secret-value-67890"
    monkeypatch.setenv("SERVICE_TOKEN", secret)

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("X-Echo-Auth", self.headers.get("Authorization", ""))
            self.send_header("X-Echo-Token", secret)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    recorded: list[Exchange] = []
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/whoami"
        with HTTPSession(on_record=recorded.append):
            got = httpx.get(url, headers={"Authorization": f"Bearer {key}"})
        assert got.headers["X-Echo-Auth"] == f"Bearer {key}"  # the live response, as sent
    finally:
        server.shutdown()
        server.server_close()
    (ex,) = recorded
    kept = dict(ex.headers)
    assert key not in kept["X-Echo-Auth"] and secret not in kept["X-Echo-Token"], kept
    assert set(ex.redacted) == {"openai", "$SERVICE_TOKEN"}, ex.redacted
