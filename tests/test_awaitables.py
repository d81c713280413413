"""An async SDK call replays as an awaitable (nbdurable/clients/awaitables.py), real AsyncOpenAI."""

from __future__ import annotations

import asyncio
import inspect
import pickle

import pytest
from llm_server import LLMServer

from nbdurable.clients.awaitables import (
    record_async_iter,
    replay_async_iter,
    replay_awaitable,
    result_kind,
)

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server():
    with LLMServer(lifetime=300) as s:
        yield s


def returns_awaitable(result) -> bool:
    return result_kind(result) in ("awaitable", "both")


async def record_awaitable(awaitable, on_result):
    """What a sub-step does with an awaitable: await it, record its value, return it."""
    value = await awaitable
    on_result(value)
    return value


class Recorder:
    """The smallest step(): record a call the first time, replay it after (pickled)."""

    def __init__(self):
        self.records: dict[str, tuple[bool, bytes]] = {}

    def step(self, key, fn, *args, **kwargs):
        if key in self.records:
            awaited, body = self.records[key]
            value = pickle.loads(body)
            return replay_awaitable(value) if awaited else value
        result = fn(*args, **kwargs)
        if returns_awaitable(result):

            def save(value):
                self.records[key] = (True, pickle.dumps(value))

            return record_awaitable(result, save)
        self.records[key] = (False, pickle.dumps(result))
        return result


def _ask(aclient, i):
    return aclient.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"question {i}"}]
    )


def test_the_sdk_hides_that_it_is_async(server):
    aclient = openai.AsyncOpenAI(api_key="sk-test", base_url=server.openai_base_url)
    # the premise: asking the function is the wrong question
    assert not inspect.iscoroutinefunction(aclient.chat.completions.create)
    result = _ask(aclient, 0)
    assert returns_awaitable(result) and result_kind(result) == "awaitable"
    result.close()  # never sent: the request starts only when awaited
    assert not returns_awaitable("text") and result_kind("text") == "plain"


def test_await_gather_and_taskgroup_replay_without_requests(server):
    rec = Recorder()

    async def run():
        aclient = openai.AsyncOpenAI(api_key="sk-test", base_url=server.openai_base_url)
        one = await rec.step("one", _ask, aclient, 1)
        many = await asyncio.gather(*[rec.step(f"g{i}", _ask, aclient, i) for i in range(4)])
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(rec.step(f"t{i}", _ask, aclient, i)) for i in range(3)]
        await aclient.close()
        return [one, *many, *[t.result() for t in tasks]]

    before = server.total
    first = asyncio.run(run())
    assert server.total - before == 8
    assert len({r.id for r in first}) == 8, "each request was answered anew"
    second = asyncio.run(run())  # a new loop, as after a kernel restart
    assert server.total - before == 8, "replay sent no request"
    assert second == first
    assert all(type(r) is openai.types.chat.ChatCompletion for r in second)


def test_a_failed_await_records_nothing(server):
    rec = Recorder()

    async def bad():
        raise ConnectionError("down")

    async def run():
        with pytest.raises(ConnectionError):
            await rec.step("x", bad)

    asyncio.run(run())
    assert rec.records == {}


def test_async_stream_records_only_when_consumed(server):
    aclient = openai.AsyncOpenAI(api_key="sk-test", base_url=server.openai_base_url)
    saved = []

    async def consume(limit=None):
        stream = await aclient.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "stream it"}], stream=True
        )
        assert result_kind(stream) == "async_iter"
        got = []
        wrapped = record_async_iter(stream, saved.append)
        async for chunk in wrapped:
            got.append(chunk)
            if limit and len(got) == limit:
                break
        await wrapped.aclose()
        await stream.close()
        return got

    async def run():
        partial = await consume(limit=2)
        assert saved == [] and len(partial) == 2
        full = await consume()
        assert saved == [full]
        replayed = [c async for c in replay_async_iter(pickle.loads(pickle.dumps(full)))]
        assert replayed == full
        await aclient.close()

    asyncio.run(run())


def test_a_paginator_is_both_and_is_said_so(server):
    aclient = openai.AsyncOpenAI(api_key="sk-test", base_url=server.openai_base_url)
    before = server.total
    page = aclient.models.list()  # lazy: nothing is sent until awaited or iterated
    assert result_kind(page) == "both"
    assert server.total == before
    asyncio.run(aclient.close())
