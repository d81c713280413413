"""Reading token usage from real SDK replies (nbdurable/usage.py).

Every reply here is made by the real SDK against tests/llm_server.py, and
the tokens read must equal what the server says it reported.
"""

from __future__ import annotations

import gc
import os
import pickle

import pytest
from llm_server import LLMServer

from nbdurable.clients.usage import Tally, Tokens, check_prices, model_of, price_for, usage_of

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

USER = [{"role": "user", "content": "count these five words"}]


@pytest.fixture(scope="module")
def server():
    with LLMServer(lifetime=300) as s:
        yield s


def _reported(server, before):
    after = server.stats()["usage"]
    return Tokens(
        after["input_tokens"] - before["input_tokens"],
        after["output_tokens"] - before["output_tokens"],
        1,
    )


def test_openai_chat_completion(server):
    client = openai.OpenAI(api_key="sk-test", base_url=server.openai_base_url)
    before = server.stats()["usage"]
    reply = client.chat.completions.create(model="gpt-test", messages=USER)
    assert usage_of(reply) == _reported(server, before)
    assert model_of(reply) == "gpt-test"
    # a pickled and restored reply (what replay hands back) reads the same
    assert usage_of(pickle.loads(pickle.dumps(reply))) == usage_of(reply)
    # and so does its plain-dict form
    assert usage_of(reply.model_dump()) == usage_of(reply)


def test_openai_stream_chunks(server):
    client = openai.OpenAI(api_key="sk-test", base_url=server.openai_base_url)
    before = server.stats()["usage"]
    chunks = list(
        client.chat.completions.create(
            model="gpt-test", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert usage_of(chunks) == _reported(server, before)
    assert model_of(chunks) == "gpt-test"
    # without include_usage, OpenAI reports nothing: say so, do not guess
    bare = list(client.chat.completions.create(model="gpt-test", messages=USER, stream=True))
    assert usage_of(bare) is None


def test_anthropic_message_and_stream(server):
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url=server.anthropic_base_url)
    before = server.stats()["usage"]
    msg = client.messages.create(model="claude-test", max_tokens=50, messages=USER)
    assert usage_of(msg) == _reported(server, before)
    assert model_of(msg) == "claude-test"

    before = server.stats()["usage"]
    events = list(
        client.messages.create(model="claude-test", max_tokens=50, messages=USER, stream=True)
    )
    # message_start says output_tokens=1, message_delta the running total: not 1 + total
    assert usage_of(events) == _reported(server, before)
    assert model_of(events) == "claude-test"
    assert usage_of([e.model_dump() for e in events]) == usage_of(events)

    before = server.stats()["usage"]
    with client.messages.stream(model="claude-test", max_tokens=50, messages=USER) as stream:
        final = stream.get_final_message()
    assert usage_of(final) == _reported(server, before)


def test_anthropic_cache_tokens_count_as_input():
    reply = {
        "usage": {
            "input_tokens": 10,
            "output_tokens": 3,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 1000,
        }
    }
    assert usage_of(reply) == Tokens(1110, 3, 1)


def test_responses_api_shapes():
    # the Responses API is not served by the test server; its documented shapes
    response = {"model": "gpt-r", "usage": {"input_tokens": 7, "output_tokens": 2}}
    assert usage_of(response) == Tokens(7, 2, 1)
    event = {"type": "response.completed", "response": response}
    assert usage_of(event) == Tokens(7, 2, 1)
    assert usage_of([{"type": "response.output_text.delta", "delta": "x"}, event]) == Tokens(
        7, 2, 1
    )
    assert model_of(event) == "gpt-r"


@pytest.fixture(scope="module")
def litellm():
    # (imported lazily: it takes seconds, and only this test needs it)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price table fetch
    return pytest.importorskip("litellm")


# litellm's own pydantic models trip pydantic warnings (on import, and in its
# stream handler, where the warning made an error would cut the stream); not ours.
@pytest.mark.filterwarnings("ignore:Item.* `ReadOnly` qualifier:UserWarning")
# litellm leaves an event loop of its own behind when a second call replaces
# its cached client; it is collected below, inside this test, so the warning
# is seen here (and ignored: not ours) instead of failing the whole session.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_.*' attribute on the instance:DeprecationWarning"
)
def test_litellm_model_response(server, litellm):
    before = server.stats()["usage"]
    reply = litellm.completion(
        model="openai/gpt-test", api_base=server.openai_base_url, api_key="sk-test", messages=USER
    )
    assert usage_of(reply) == _reported(server, before)
    before = server.stats()["usage"]
    chunks = list(
        litellm.completion(
            model="openai/gpt-test",
            api_base=server.openai_base_url,
            api_key="sk-test",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert usage_of(chunks) == _reported(server, before)
    gc.collect()


def test_langchain_ai_message(server):
    lc = pytest.importorskip("langchain_openai")
    chat = lc.ChatOpenAI(model="gpt-test", base_url=server.openai_base_url, api_key="sk-test")
    before = server.stats()["usage"]
    message = chat.invoke(USER[0]["content"])
    assert usage_of(message) == _reported(server, before)
    assert model_of(message) == "gpt-test"
    before = server.stats()["usage"]
    chunks = list(chat.stream(USER[0]["content"], stream_usage=True))
    assert usage_of(chunks) == _reported(server, before)


def test_no_usage_is_none_not_zero():
    for thing in (None, "text", 42, {"a": 1}, [], {"usage": None}, {"usage": {"x": 1}}):
        assert usage_of(thing) is None, thing
    # a bool is not a count
    assert usage_of({"usage": {"prompt_tokens": True}}) is None


def test_tally_per_step_and_run_and_cost(server):
    client = openai.OpenAI(api_key="sk-test", base_url=server.openai_base_url)
    claude = anthropic.Anthropic(api_key="sk-ant-test", base_url=server.anthropic_base_url)
    before = server.stats()["usage"]
    step1, step2 = Tally(), Tally()
    step1.add(client.chat.completions.create(model="gpt-4o-2024-08-06", messages=USER))
    step1.add(client.chat.completions.create(model="gpt-4o-2024-08-06", messages=USER))
    step2.add(claude.messages.create(model="claude-x", max_tokens=9, messages=USER))
    assert step2.add("no usage here") is None
    run = step1 + step2
    reported = _reported(server, before)
    assert (run.total.input, run.total.output, run.total.replies) == (
        reported.input,
        reported.output,
        3,
    )
    prices = check_prices({"gpt-4o": (2.5, 10.0), "claude-x": (3, 15)})
    money, unpriced = run.cost(prices)
    g, c = run.by_model["gpt-4o-2024-08-06"], run.by_model["claude-x"]
    expected = (
        g.input * 2.5 / 1000 + g.output * 10 / 1000 + c.input * 3 / 1000 + c.output * 15 / 1000
    )
    assert money == pytest.approx(expected) and money > 0
    assert unpriced == []
    assert run.cost({"gpt-4o": (1, 1)})[1] == ["claude-x"]
    assert Tally.from_json(run.to_json()) == run


def test_price_matching_and_bad_prices():
    prices = {"gpt-4o": (1.0, 2.0), "gpt-4o-mini": (0.1, 0.2)}
    assert price_for("gpt-4o-mini-2024-07-18", prices) == (0.1, 0.2)
    assert price_for("gpt-4o-2024-08-06", prices) == (1.0, 2.0)
    assert price_for("gpt-3.5", prices) is None
    assert price_for(None, prices) is None
    for bad in ([("m", 1)], {"m": 1}, {"m": (1,)}, {"m": (-1, 1)}, {"m": ("1", 2)}, {"": (1, 1)}):
        with pytest.raises(ValueError, match="prices"):
            check_prices(bad)


def test_from_json_skips_bad_rows():
    assert Tally.from_json([["m", 1, 2, 1], ["x", "1", 2, 1], "junk", [None, 3, 4, 1]]) == Tally(
        {"m": Tokens(1, 2, 1), None: Tokens(3, 4, 1)}
    )
    assert Tally.from_json({"not": "a list"}) == Tally()


def test_reply_of_http_body_shapes():
    from nbdurable.clients.usage import reply_of_http_body

    assert reply_of_http_body(b"<html>", "text/html") is None
    assert reply_of_http_body(b'{"usage": {"input_tokens": 2}}') == {"usage": {"input_tokens": 2}}
    sse = b'event: a\ndata: {"x": 1}\n\ndata: not json\n\ndata: [DONE]\n\n'
    assert reply_of_http_body(sse, "text/event-stream") == [{"x": 1}]
