"""``--live PATTERN``: rerun exactly the matching sub-steps live; everything else replays.

A notebook searches (a local function that logs each call) and asks the
local model server (the real OpenAI SDK) for each result, then writes a
report from the answers. After a recorded run, ``nbdurable run --live
'llm:*'`` forks the run and records into the fork: every ``llm:`` sub-step
is sent again (the server counts exactly those), no search is made, the
parent's records are untouched, and ``diff`` compares the two runs.
``verify --live`` allows exactly those calls and nothing else. On both engines.
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest
from kernel_util import make_notebook
from llm_server import LLMServer
from test_fork import records
from test_run_exits import nbd

pytestmark = pytest.mark.kernel

pytest.importorskip("openai")


def cells(base: str) -> list[str]:
    ask = "model='m', messages=[{'role': 'user', 'content': d}]"
    return [
        "%load_ext nbdurable\nimport openai\nfrom nbdurable import step\n"
        f"client = openai.OpenAI(api_key='sk-test', base_url={base!r}, max_retries=0)\n"
        "def search(q):\n"
        "    with open('searches.log', 'a') as f:\n"
        "        f.write(q + '\\n')\n"
        "    return f'doc about {q}'",
        "%%step research\ndocs = [step(f'search:{i}', search, f'q{i}') for i in range(3)]\n"
        "answers = [step(f'llm:{i}', client.chat.completions.create, "
        f"{ask}).choices[0].message.content for i, d in enumerate(docs)]",
        "%%step report\nreport = ' | '.join(answers)\nprint(len(answers))",
    ]


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres)])
def where(request, tmp_path) -> tuple[list[str], dict[str, str], object]:
    """``(--store arguments, extra environment, the store to read)`` of each engine."""
    if request.param == "disk":
        return [], {}, tmp_path / ".nbdurable"
    url = request.getfixturevalue("pg_url")
    return ["--store", url], {"NBDURABLE_KEY": os.environ["NBDURABLE_KEY"]}, url


def test_live_reruns_exactly_the_matching_sub_steps_in_a_fork(tmp_path, where):
    store_args, env, store = where
    nb = tmp_path / "agent.ipynb"

    def cli(*args: object):
        return nbd(*args, *store_args, **env)

    with LLMServer(log=tmp_path / "requests.jsonl", lifetime=600) as server:
        nbformat.write(make_notebook(cells(server.openai_base_url)), nb)
        assert cli("run", "-q", nb).returncode == 0
        assert server.total == 3
        parent = records(store, "agent.ipynb")

        done = cli("run", nb, "--live", "llm:*", "--into", "remodel")
        assert done.returncode == 0, done.stdout + done.stderr
        assert server.total == 6, "exactly the three llm sub-steps were sent again"
        assert (tmp_path / "searches.log").read_text().split() == ["q0", "q1", "q2"]
        assert done.stderr.startswith("forked run 'agent.ipynb' into 'remodel'"), done.stderr
        assert "(run 'remodel'" in done.stdout, done.stdout
        assert records(store, "agent.ipynb") == parent

        doc = json.loads(cli("diff", nb, "agent.ipynb", "remodel", "--json").stdout)
        research = next(s for s in doc["steps"] if s["label"] == "research")
        changed = [ln for ln in research["lines"] if ln.startswith("sub-step")]
        assert changed == [f"sub-step 'llm:{i}': returned another result" for i in range(3)]

        # verify --live: the llm calls may run (three more), nothing else may
        done = cli("verify", "-q", nb, "--run", "remodel", "--live", "llm:*", "--into", "again")
        assert done.returncode == 0, done.stdout + done.stderr
        assert server.total == 9
        assert (tmp_path / "searches.log").read_text().split() == ["q0", "q1", "q2"]


def test_into_without_live_and_a_bad_pattern_are_one_line(tmp_path):
    nb = tmp_path / "agent.ipynb"
    nbformat.write(make_notebook(["1"]), nb)
    for argv, said in (
        (["--into", "x"], "--into names the fork --live records into; give --live PATTERN too"),
        (["--live", "a,b"], "--live takes one non-empty pattern at a time"),
    ):
        done = nbd("run", nb, *argv)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and said in done.stderr, done.stderr
