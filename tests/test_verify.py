"""``nbdurable verify``: a recorded notebook replays with no live call, or says what would run.

One notebook is recorded once by ``nbdurable run`` against the local model
server, through the real OpenAI SDK: a step whose calls go through
``step()``, a step that keeps an unsaveable lock (so its body runs again on
every run) whose direct SDK call is recorded at the transport, and a
sub-step in a plain cell. Then the server is stopped (no network, no key
needed) and ``nbdurable verify`` must pass: every step replays and the
server's log gains nothing.

Each kind of live work is then planted by one realistic edit of the same
file, and ``verify`` must stop with exit 6 and one line naming it, with
nothing sent and nothing run: an invalidated step, a new step, a new
sub-step id, a diverged argument, and an HTTP request the record does not
hold. ``configure(mode="verify")`` in a kernel refuses the same way.
"""

from __future__ import annotations

import os

import nbformat
import pytest
from kernel_util import make_notebook, run_notebook, stream_text
from llm_server import LLMServer, read_log
from test_run_exits import nbd

pytestmark = pytest.mark.kernel

pytest.importorskip("openai")


def cells(base: str, *, topic: str = "cats", extra: list[str] | None = None) -> list[str]:
    ask = "model='m', messages=[{'role': 'user', 'content': q}]"
    return [
        "%load_ext nbdurable\nimport threading, openai\nfrom nbdurable import step\n"
        f"client = openai.OpenAI(api_key='sk-test', base_url={base!r}, max_retries=0)",
        f"topic = {topic!r}",
        "%%step ask\nanswers = []\nfor q in [topic, topic + '?']:\n"
        f"    answers.append(step(q, client.chat.completions.create, {ask}))\n"
        "print(len(answers))",
        # `held` cannot be saved: the body runs again each time, its request from the record
        "%%step direct\nheld = threading.Lock()\nq = 'direct ' + topic\n"
        f"d = client.chat.completions.create({ask})\nprint(d.choices[0].message.content)",
        f"q = 'plain'\nplain = step('plain-call', client.chat.completions.create, {ask})",
        *(extra or []),
    ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """``(folder, notebook path, server base URL, request log)``: recorded, server stopped."""
    root = tmp_path_factory.mktemp("verify")
    nb = root / "agent.ipynb"
    log = root / "requests.jsonl"
    with LLMServer(log=log, lifetime=600) as server:
        base = server.openai_base_url
        nbformat.write(make_notebook(cells(base)), nb)
        done = nbd("run", "-q", nb)
        assert done.returncode == 0, done.stderr
        assert server.total == 4, server.total  # two in `ask`, one direct, one plain
    return root, nb, base, log


def test_a_recorded_notebook_verifies_with_the_server_gone(recorded):
    root, nb, _base, log = recorded
    before = nb.read_bytes()
    sent = len(read_log(log))
    done = nbd("verify", nb)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "nbdurable verify: ok: nothing ran live (1 step replayed, 1 body ran again from the "
        "record, 4 calls replayed)"
    ) in done.stdout, done.stdout
    assert len(read_log(log)) == sent
    assert nb.read_bytes() == before, "verify does not write the notebook"


EDITS = {
    # kind: (the edit, what the one line must name)
    "invalidated": ({"topic": "dogs"}, "verify: step 'ask' is invalidated: input 'topic' changed"),
    "new step": (
        {"extra": ["%%step summary\nshort = step('s', len, answers)"]},
        "verify: step 'summary' has no record",
    ),
    "new sub-step": (
        {"extra": ["more = step('plain-call-2', len, 'x')"]},
        "verify: sub-step 'plain-call-2' has no record",
    ),
    "diverged argument": (
        {"extra": ["q = 'other'\nagain = step('plain-call', len, q)"]},
        "verify: sub-step 'plain-call' was called with arguments other than those recorded",
    ),
}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_live_work_stops_verify_with_one_line_naming_it(recorded, kind):
    root, nb, base, log = recorded
    edit, line = EDITS[kind]
    before = nb.read_bytes()
    sent = len(read_log(log))
    try:
        nbformat.write(make_notebook(cells(base, **edit)), nb)
        done = nbd("verify", "-q", nb)
    finally:
        nb.write_bytes(before)
    assert done.returncode == 6, done.stdout + done.stderr
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("nbdurable verify")]
    assert said[0].startswith("nbdurable " + line), said
    assert said[-1].startswith("nbdurable verify: failed: 1 thing would have run live"), said
    assert len(said) == 2, said
    assert len(read_log(log)) == sent, "verify sent a request"


def test_an_unrecorded_request_in_a_body_that_runs_again_stops_verify(tmp_path):
    """A body that runs again sends a request with a new body: refused at the transport."""
    nb = tmp_path / "agent.ipynb"
    with LLMServer(log=tmp_path / "requests.jsonl", lifetime=600) as server:
        base = server.openai_base_url
        first = cells(base)
        first[3] = first[3].replace(
            "q = 'direct ' + topic", "import random\nq = str(random.random())"
        )
        nbformat.write(make_notebook(first), nb)
        assert nbd("run", "-q", nb).returncode == 0
        sent = server.total
        done = nbd("verify", "-q", nb)
        assert server.total == sent, "verify sent a request"
    assert done.returncode == 6, done.stdout + done.stderr
    said = [ln for ln in done.stderr.splitlines() if ln.startswith("nbdurable verify")]
    assert said[0].startswith("nbdurable verify: step 'direct': POST "), said
    assert "/chat/completions (body " in said[0] and "was not recorded" in said[0], said


def test_verify_mode_in_a_kernel_refuses_in_one_line(tmp_path):
    setup = "%load_ext nbdurable\nimport nbdurable\nfrom nbdurable import step"
    store = {"NBDURABLE_DIR": str(tmp_path / "store")}
    run_notebook(make_notebook([setup, "x = step('one', len, 'abc')"]), cwd=tmp_path, env=store)
    nb = run_notebook(
        make_notebook(
            [
                setup + "\nnbdurable.configure(mode='verify')",
                "x = step('one', len, 'abc')\nprint(x)",
                "y = step('two', len, 'abcd')",
                "%%step fresh\nz = 1",
            ]
        ),
        cwd=tmp_path,
        env=store,
        allow_errors=True,
    )
    assert stream_text(nb.cells[1].outputs) == "3\n"
    for index, what in ((2, "sub-step 'two' has no record"), (3, "step 'fresh' has no record")):
        # IPython shows a UsageError as one line on stderr, and the cell fails
        assert stream_text(nb.cells[index].outputs, "stderr") == (
            f"UsageError: verify: {what}; nothing was run live\n"
        )


@pytest.mark.postgres
def test_verify_on_the_team_store(tmp_path, pg_url):
    """The same on PostgreSQL: verify passes with the server gone, and names an edit."""
    nb = tmp_path / "agent.ipynb"
    key = {"NBDURABLE_KEY": os.environ["NBDURABLE_KEY"]}
    with LLMServer(log=tmp_path / "requests.jsonl", lifetime=600) as server:
        base = server.openai_base_url
        nbformat.write(make_notebook(cells(base)), nb)
        assert nbd("run", "-q", nb, "--store", pg_url, **key).returncode == 0
        sent = server.total
    done = nbd("verify", "-q", nb, "--store", pg_url, **key)
    assert done.returncode == 0, done.stdout + done.stderr
    nbformat.write(make_notebook(cells(base, topic="dogs")), nb)
    done = nbd("verify", "-q", nb, "--store", pg_url, **key)
    assert done.returncode == 6, done.stdout + done.stderr
    assert "verify: step 'ask' is invalidated: input 'topic' changed" in done.stderr
    assert server.total == sent
