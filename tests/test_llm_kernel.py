"""Real model SDKs through ``step()`` in real kernels, killed and resumed.

The notebooks call tests/llm_server.py (a local OpenAI/Anthropic-compatible
server that logs every request) through the real ``openai`` and
``anthropic`` packages. Each scenario runs until the kernel dies at a named
point (``NBDURABLE_FAULT``: just after a sub-step's record, or in the middle
of a stream), resumes in a fresh kernel, then runs once more, and checks:

- every call recorded before the kill is never sent again (the server's log
  holds its question once), and the replayed object is the one the server
  sent (its answer carries the request number the log gave that question);
- async calls (``await step(...)``, ``asyncio.gather``, ``TaskGroup``) replay
  as awaitables, with one async client shared by two ``%%step`` cells;
- streams (OpenAI ``stream=True`` and ``chat.completions.stream``, Anthropic
  ``messages.stream``, sync and async) replay as streams: the text the cell
  printed while streaming is printed again in full; a stream cut by the kill
  or abandoned half way is not recorded, so it is the one request sent again;
- the last run sends nothing it did not send before.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text
from llm_server import LLMServer, read_log
from nbclient.exceptions import DeadKernelError

from nbdurable.store import open_store

pytestmark = pytest.mark.kernel

pytest.importorskip("openai")
pytest.importorskip("anthropic")


@pytest.fixture
def server(tmp_path):
    with LLMServer(log=tmp_path / "requests.jsonl", lifetime=600) as s:
        yield s


def clients_cell(server: LLMServer, *, claude: bool = False) -> str:
    """The OpenAI clients, and with `claude` the Anthropic ones (after ``HEAD_CLAUDE``)."""
    o, a = server.openai_base_url, server.anthropic_base_url
    cell = (
        f"client = openai.OpenAI(api_key='sk-test', base_url={o!r})\n"
        f"aclient = openai.AsyncOpenAI(api_key='sk-test', base_url={o!r})"
    )
    if claude:
        cell += (
            f"\nclaude = anthropic.Anthropic(api_key='sk-ant-test', base_url={a!r})\n"
            f"aclaude = anthropic.AsyncAnthropic(api_key='sk-ant-test', base_url={a!r})"
        )
    return cell


# A notebook imports the SDKs it uses: anthropic alone costs a kernel ~1.9 CPU-seconds.
HEAD = "%load_ext nbdurable\nimport asyncio, openai\nfrom nbdurable import step"
HEAD_CLAUDE = HEAD + "\nimport anthropic"


def ask(q: str) -> str:
    """Keyword arguments of a chat call whose question is ``q`` (the sub-step id too)."""
    return f"model='m', messages=[{{'role': 'user', 'content': {q!r}}}]"


class Scenario:
    """One notebook, run until killed, then to completion, then once more."""

    def __init__(self, root: Path, server: LLMServer, cells: list[str]) -> None:
        self.root, self.server, self.cells = root, server, cells
        self.env = {
            "NBDURABLE_DIR": str(root / "store"),
            "NBDURABLE_NOTEBOOK": str(root / "llm.ipynb"),
        }

    def run(self, fault: str | None = None):
        env = {**self.env, **({"NBDURABLE_FAULT": fault} if fault else {})}
        nb = make_notebook(self.cells)
        try:
            return run_notebook(nb, cwd=self.root, env=env, timeout=180)
        except DeadKernelError:
            return None

    def asked(self) -> Counter:
        """How many times the server was asked each question."""
        assert self.server.log is not None
        return Counter(r["last"] for r in read_log(self.server.log))

    def numbers(self) -> dict[str, int]:
        """The request number that last answered each question (the one recorded)."""
        assert self.server.log is not None
        return {r["last"]: r["n"] for r in read_log(self.server.log)}

    def recorded(self) -> set[str]:
        """The ids of the sub-steps recorded in the store."""
        with open_store(self.root / "store") as store:
            return {store.get(k)[0]["id"] for k in store.scan("r/") if "/u/" in k}


ASYNC_CELLS = [
    "%%step first\n"
    f"one = await step('q0', aclient.chat.completions.create, {ask('q0')})\n"
    "print(type(one).__name__, one.choices[0].message.content)",
    "%%step gathered\n"
    "many = await asyncio.gather(*[\n"
    "    step(f'q{i}', aclient.chat.completions.create, model='m',\n"
    "         messages=[{'role': 'user', 'content': f'q{i}'}]) for i in range(1, 5)])\n"
    "async with asyncio.TaskGroup() as tg:\n"
    "    tasks = [tg.create_task(step(f'q{i}', aclient.chat.completions.create, model='m',\n"
    "             messages=[{'role': 'user', 'content': f'q{i}'}])) for i in range(5, 8)]\n"
    "many += [t.result() for t in tasks]\n"
    "for m in many:\n"
    "    print(m.choices[0].message.content)",
]


def test_async_calls_replay_as_awaitables_after_a_kill(tmp_path, server):
    sc = Scenario(tmp_path, server, [HEAD, clients_cell(server), *ASYNC_CELLS])
    assert sc.run(fault="sub-written:4") is None, "the kernel should die at the 4th record"
    before = sc.recorded()
    assert len(before) >= 4
    nb = sc.run()
    assert nb is not None
    asked, numbers = sc.asked(), sc.numbers()
    for q in before:  # recorded before the kill: never sent again
        assert asked[q] == 1, f"{q} was sent again after it was recorded"
    text = stream_text(outputs_of(nb, 2)) + stream_text(outputs_of(nb, 3))
    # every answer printed is the server's, recorded or made after the resume
    expected = [f"answer #{numbers[f'q{i}']} to: q{i}" for i in range(8)]
    assert text.splitlines() == ["ChatCompletion " + expected[0], *expected[1:]]
    total = server.total
    again = sc.run()
    assert server.total == total, "a completed notebook sent requests again"
    assert stream_text(outputs_of(again, 3)) == stream_text(outputs_of(nb, 3))


def test_one_async_client_across_cells_replays_subcalls_when_the_body_reruns(tmp_path, server):
    # `holder` cannot be saved, so each run executes the bodies again: only
    # their sub-steps replay, on the kernel's loop, with the client of cell 2.
    cells = [
        HEAD,
        clients_cell(server),
        "%%step a\nimport threading\nholder = threading.Lock()\n"
        f"x = await step('x', aclient.chat.completions.create, {ask('x')})\n"
        "print(x.choices[0].message.content)",
        "%%step b\nholder2 = threading.Lock()\n"
        f"y = await step('y', aclient.chat.completions.create, {ask('y')})\n"
        "print(y.choices[0].message.content)",
    ]
    sc = Scenario(tmp_path, server, cells)
    first = sc.run()
    assert first is not None and server.total == 2
    second = sc.run()
    assert server.total == 2
    for i in (2, 3):
        assert stream_text(outputs_of(second, i)) == stream_text(outputs_of(first, i))


STREAM_CELL = (
    "%%step streams\n"
    f"s = step('o-sync', client.chat.completions.create, {ask('o-sync')}, stream=True,\n"
    "         stream_options={'include_usage': True})\n"
    "for ch in s:\n"
    "    print(ch.choices[0].delta.content or '' if ch.choices else '', end='')\n"
    "print()\n"
    f"with step('a-sync', claude.messages.stream, max_tokens=50, {ask('a-sync')}) as st:\n"
    "    for t in st.text_stream:\n"
    "        print(t, end='')\n"
    "print()\n"
    "m1 = st.get_final_message()\n"
    "print(type(m1).__name__, m1.usage.output_tokens)\n"
    f"s = await step('o-async', aclient.chat.completions.create, {ask('o-async')}, stream=True)\n"
    "async for ch in s:\n"
    "    print(ch.choices[0].delta.content or '', end='')\n"
    "print()\n"
    f"async with step('a-async', aclaude.messages.stream, max_tokens=50, {ask('a-async')}) as st:\n"
    "    async for t in st.text_stream:\n"
    "        print(t, end='')\n"
    "print()\n"
    "m2 = await st.get_final_message()\n"
    "print(m2.content[0].text)\n"
    f"with step('o-mgr', client.chat.completions.stream, {ask('o-mgr')}) as st:\n"
    "    for ev in st:\n"
    "        pass\n"
    "print(st.get_final_completion().choices[0].message.content)\n"
    f"s = step('abandon', client.chat.completions.create, {ask('abandon')}, stream=True)\n"
    "for i, ch in enumerate(s):\n"
    "    if i == 2:\n"
    "        break\n"
    "s.close()"
)
STREAMS = ["o-sync", "a-sync", "o-async", "a-async", "o-mgr"]


# Chunks the streams hand over, in order: o-sync 7, a-sync 10, o-async 6, a-async 10,
# o-mgr 6: the 12th is inside the second stream, the 36th inside the fifth.
@pytest.mark.parametrize("kill_at", [12, 36])
def test_streams_replay_as_streams_after_a_kill_mid_stream(tmp_path, server, kill_at):
    sc = Scenario(tmp_path, server, [HEAD_CLAUDE, clients_cell(server, claude=True), STREAM_CELL])
    assert sc.run(fault=f"stream-chunk:{kill_at}") is None
    recorded = sc.recorded()
    cut = [r["last"] for r in read_log(server.log)][-1]  # the stream the kill cut
    assert recorded and cut not in recorded, "a stream cut by a kill must not be recorded"
    nb = sc.run()
    assert nb is not None
    asked, numbers = sc.asked(), sc.numbers()
    for q in recorded:
        assert asked[q] == 1, f"{q} was streamed again after it was recorded"
    assert asked[cut] == 2  # cut by the kill: asked again, once
    answer = {q: f"answer #{numbers[q]} to: {q}" for q in STREAMS}
    assert stream_text(outputs_of(nb, 2)).splitlines() == [
        answer["o-sync"],
        answer["a-sync"],
        f"ParsedMessage {len(answer['a-sync'].split())}",
        answer["o-async"],
        answer["a-async"],
        answer["a-async"],
        answer["o-mgr"],
    ]
    abandoned = asked["abandon"]
    total = server.total
    again = sc.run()
    # the stream abandoned half way is never recorded: it is the only request made again
    assert server.total == total + 1 and sc.asked()["abandon"] == abandoned + 1
    assert stream_text(outputs_of(again, 2)) == stream_text(outputs_of(nb, 2))


def test_litellm_and_langchain_streams_replay(tmp_path, server):
    pytest.importorskip("litellm")
    pytest.importorskip("langchain_openai")
    o = server.openai_base_url
    cells = [
        HEAD + "\nimport os, threading, litellm\nfrom langchain_openai import ChatOpenAI\n"
        "os.environ['LITELLM_LOCAL_MODEL_COST_MAP'] = 'True'",
        f"chat = ChatOpenAI(model='m', base_url={o!r}, api_key='sk-test')",
        "%%step lc\nholder = threading.Lock()\n"
        "for c in step('lc', chat.stream, 'langchain words', stream_usage=True):\n"
        "    print(c.content, end='')\nprint()\n"
        "s = step('lite', litellm.completion, model='openai/m', api_base="
        f"{o!r}, api_key='sk-test',\n"
        "         messages=[{'role': 'user', 'content': 'litellm words'}], stream=True)\n"
        "for c in s:\n"
        "    print(c.choices[0].delta.content or '', end='')\nprint()",
    ]
    sc = Scenario(tmp_path, server, cells)
    first = sc.run()
    assert first is not None and server.total == 2
    numbers = sc.numbers()
    text = stream_text(outputs_of(first, 2))
    assert text.splitlines() == [
        f"answer #{numbers['langchain words']} to: langchain words",
        f"answer #{numbers['litellm words']} to: litellm words",
    ]
    again = sc.run()  # `holder` cannot be saved: the body runs again, its streams replay
    assert server.total == 2
    assert stream_text(outputs_of(again, 2)) == text


def test_a_method_call_on_a_client_is_not_a_change(tmp_path, server):
    # `client` cannot be saved; calling its method used to count as changing it,
    # which made the step not replayable and re-sent the request on every run.
    cells = [
        HEAD_CLAUDE,
        clients_cell(server, claude=True),
        f"%%step direct\nc = client.chat.completions.create({ask('direct')})\n"
        f"m = claude.messages.create(max_tokens=20, {ask('direct claude')})\n"
        "print(c.choices[0].message.content, '|', m.content[0].text)",
        "print(type(c).__name__, type(m).__name__)",
        # a real change of the client: still a change (it cannot be saved, so the body reruns)
        "%%step retarget\nclient.max_retries = 7",
        "import sqlite3\ndb = sqlite3.connect(':memory:')\ndb.execute('create table t (x)');",
        # a connection shows no state of its own: a method call on it stays a change
        "%%step insert\ndb.execute('insert into t values (1)');",
    ]
    sc = Scenario(tmp_path, server, cells)
    first = sc.run()
    assert first is not None and server.total == 2
    assert "cannot be saved" not in stream_text(outputs_of(first, 2), "stderr")
    assert "cannot be saved: client" in stream_text(outputs_of(first, 4), "stderr")
    assert "cannot be saved: db" in stream_text(outputs_of(first, 6), "stderr")
    second = sc.run()
    assert server.total == 2, "the step sent its requests again"
    assert stream_text(outputs_of(second, 2)) == stream_text(outputs_of(first, 2))
    assert stream_text(outputs_of(second, 3)) == "ChatCompletion Message\n"


def divergence_cells(server: LLMServer, prompt: str) -> list[str]:
    o = server.openai_base_url
    return [
        HEAD + "\nimport pydantic\nfrom langchain_openai import ChatOpenAI\n"
        "from langchain_core.messages import HumanMessage",
        clients_cell(server) + f"\nchat = ChatOpenAI(model='m', base_url={o!r}, api_key='sk-test')",
        f"class Task(pydantic.BaseModel):\n    prompt: str\ntask = Task(prompt={prompt!r})",
        # a pydantic input
        "%%step direct\n"
        "r = client.chat.completions.create(model='m',\n"
        "    messages=[{'role': 'user', 'content': 'direct ' + task.prompt}])\n"
        "print(r.choices[0].message.content)",
        # LangChain messages, and an SDK reply object in a history, as sub-step arguments
        "%%step history\n"
        "first = step('first', client.chat.completions.create, model='m',\n"
        "             messages=[{'role': 'user', 'content': 'start'}])\n"
        "reply = first.choices[0].message\n"
        "if task.prompt == 'beta':\n"
        "    reply = reply.model_copy(update={'content': reply.content + ' (edited)'})\n"
        "second = step('second', client.chat.completions.create, model='m', messages=[\n"
        "    {'role': 'user', 'content': 'start'}, reply, {'role': 'user', 'content': 'more'}])\n"
        "lc = step('lc', chat.invoke, [HumanMessage('lc ' + task.prompt)])\n"
        "print(second.choices[0].message.content, '|', lc.content)",
    ]


def test_changed_data_objects_are_divergences_not_stale_answers(tmp_path, server):
    pytest.importorskip("langchain_openai")
    sc = Scenario(tmp_path, server, divergence_cells(server, "alpha"))
    first = sc.run()
    assert first is not None and server.total == 4
    sc.cells = divergence_cells(server, "alpha")
    same = sc.run()
    assert server.total == 4, "nothing changed, yet requests were sent"
    for i in (3, 4):
        assert stream_text(outputs_of(same, i)) == stream_text(outputs_of(first, i))
    sc.cells = divergence_cells(server, "beta")
    changed = sc.run()
    # the pydantic input, the edited SDK reply in the history and the LangChain
    # message are each a new question; the unchanged 'first' call replays
    asked = sc.asked()
    assert server.total == 7 and asked["start"] == 1
    assert asked["direct beta"] == 1 and asked["lc beta"] == 1 and asked["more"] == 2
    numbers = sc.numbers()
    assert (
        stream_text(outputs_of(changed, 3)) == f"answer #{numbers['direct beta']} to: direct beta\n"
    )
    assert stream_text(outputs_of(changed, 4)).startswith(
        f"answer #{numbers['more']} to: more | answer #{numbers['lc beta']} to: lc beta"
    )
    said = " ".join(stream_text(outputs_of(changed, 4), "stderr").split())
    assert "step 'history'" in said and "2 of 3 recorded calls made again" in said, said


HTTP_CELL = (
    "%%step direct --http\n"
    "import threading\n"
    "holder = threading.Lock()  # cannot be saved: the body runs on every run\n"
    "for i in range(3):\n"
    "    r = client.chat.completions.create(model='m',\n"
    "        messages=[{'role': 'user', 'content': f'h{i}'}])\n"
    "    print(r.choices[0].message.content)\n"
    "s = client.chat.completions.create(model='m', stream=True,\n"
    "    messages=[{'role': 'user', 'content': 'h-stream'}])\n"
    "print(''.join(c.choices[0].delta.content or '' for c in s))\n"
    "with claude.messages.stream(model='c', max_tokens=20,\n"
    "        messages=[{'role': 'user', 'content': 'h-claude'}]) as st:\n"
    "    print(''.join(st.text_stream))\n"
    "m = claude.messages.create(model='c', max_tokens=20,\n"
    "    messages=[{'role': 'user', 'content': 'h-last'}])\n"
    "print(type(r).__name__, type(m).__name__, m.content[0].text)"
)


def test_http_mode_replays_direct_sdk_calls_after_a_kill(tmp_path, server):
    sc = Scenario(tmp_path, server, [HEAD_CLAUDE, clients_cell(server, claude=True), HTTP_CELL])
    assert sc.run(fault="http-written:2") is None
    assert sc.recorded() == {"http:1", "http:2"}
    nb = sc.run()
    assert nb is not None
    asked, numbers = sc.asked(), sc.numbers()
    assert asked["h0"] == 1 and asked["h1"] == 1, "a recorded exchange was sent again"
    questions = ["h0", "h1", "h2", "h-stream", "h-claude"]
    text = stream_text(outputs_of(nb, 2))
    assert text.splitlines() == [
        *(f"answer #{numbers[q]} to: {q}" for q in questions),
        f"ChatCompletion Message answer #{numbers['h-last']} to: h-last",
    ]
    total = server.total
    again = sc.run()  # the body runs again: every request is answered from the record
    assert server.total == total
    assert stream_text(outputs_of(again, 2)) == text
    data = b"".join(p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file())
    assert b"sk-test" not in data and b"sk-ant-test" not in data, "a credential was stored"
