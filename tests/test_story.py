"""The user's story, end to end in real kernels: crash inside the loop, rerun, rerun again.

The simulated model and search (nbdurable.demo.sim) append every real call to a
ledger file outside the store and return different text on every call; the
kernel is killed for real (``os._exit``) inside the 41st answer call.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from kernel_util import make_notebook, outputs_of, run_notebook
from nbclient.exceptions import DeadKernelError

from nbdurable.demo.sim import digest, ledger_calls

pytestmark = pytest.mark.kernel

CELLS = [
    "%load_ext nbdurable\n"
    "from nbdurable import step\n"
    "from nbdurable.demo.sim import llm_plan, search_web, llm_answer, llm_synthesize\n"
    "topic = 'durable notebooks'",
    '%%step plan\nplan = llm_plan(topic)\nprint(plan["title"])',
    "%%step research\n"
    "findings = []\n"
    'for i, q in enumerate(plan["subquestions"]):            # 60 subquestions\n'
    '    docs = step(f"search:{i}", search_web, q)\n'
    '    findings.append(step(f"answer:{i}", llm_answer, q, docs))',
    "%%step synthesize\nreport = llm_synthesize(topic, findings)\nreport",
    "import json, hashlib\n"
    "print(json.dumps([hashlib.sha256(f.encode()).hexdigest()[:12] for f in findings]))\n"
    "print(json.dumps(report))",
]


def _visible(outputs: list[dict]) -> list[dict]:
    """Outputs without the replay note and without execution counts."""
    out = []
    for o in outputs:
        if (o.get("metadata") or {}).get("nbdurable", {}).get("note"):
            continue
        o = dict(o)
        o.pop("execution_count", None)
        out.append(o)
    return out


def _notes(outputs: list[dict]) -> list[str]:
    return [
        o["data"]["text/plain"]
        for o in outputs
        if (o.get("metadata") or {}).get("nbdurable", {}).get("note")
    ]


@pytest.fixture
def story(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "story.ipynb"),
        "NBDURABLE_SIM_LEDGER": str(ledger),
        "NBDURABLE_SIM_LATENCY": "0",
        "NBDURABLE_SIM_CRASH_AT": "41",
    }
    return tmp_path, ledger, env


def test_crash_in_the_loop_then_resume_then_replay_everything(story):
    tmp_path, ledger, env = story

    # Attempt 1: the kernel dies inside the 41st answer call (subquestion 40).
    first = make_notebook(CELLS)
    with pytest.raises(DeadKernelError):
        run_notebook(first, cwd=tmp_path, env=env)
    before = ledger_calls(ledger)
    kinds = Counter(c["kind"] for c in before)
    assert kinds == {"plan": 1, "search": 41, "answer": 41}, kinds
    crashed = before[-1]
    assert crashed["kind"] == "answer" and crashed["arg"].startswith("Q41:")
    returned = before[:-1]  # every call whose step() returned before the kill

    # Attempt 2: a new kernel, run all. Only the unfinished work calls the model.
    second = run_notebook(make_notebook(CELLS), cwd=tmp_path, env=env)
    after = ledger_calls(ledger)
    made_again = Counter((c["kind"], c["arg"]) for c in after[len(before) :])
    for c in returned:
        assert (c["kind"], c["arg"]) not in made_again, f"repeated a recorded call: {c}"
    assert Counter(c["kind"] for c in after[len(before) :]) == {
        "answer": 20,  # 40 (the one that crashed, never recorded) .. 59
        "search": 19,  # 41 .. 59 (search 40 had returned before the crash)
        "synthesize": 1,
    }

    # The plan cell was replayed: same printed title as the first attempt.
    assert _visible(outputs_of(second, 1)) == _visible(outputs_of(first, 1))
    assert _notes(outputs_of(second, 1)), "the replayed step shows its note"
    # findings 0..39 are exactly the values the first attempt's calls returned.
    printed = outputs_of(second, 4)[0]["text"].splitlines()
    hashes = json.loads(printed[0])
    first_answers = [c["out"] for c in returned if c["kind"] == "answer"]
    assert hashes[:40] == first_answers
    resumed_answers = [c["out"] for c in after[len(before) :] if c["kind"] == "answer"]
    assert hashes[40:] == resumed_answers
    synth = [c for c in after if c["kind"] == "synthesize"]
    assert digest(json.loads(printed[1]).split(": ", 1)[1]) == synth[0]["out"]

    # Attempt 3: run all once more. Nothing is called at all; same outputs, same order.
    third = run_notebook(make_notebook(CELLS), cwd=tmp_path, env=env)
    assert ledger_calls(ledger) == after
    for i in range(len(CELLS)):
        assert _visible(outputs_of(third, i)) == _visible(outputs_of(second, i)), i
    result = [o for o in outputs_of(third, 3) if o["output_type"] == "execute_result"]
    assert len(result) == 1, "the report stays an execute_result on replay"
    assert all(_notes(outputs_of(third, i)) for i in (1, 2, 3))
