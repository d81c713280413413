"""Every Python example in the README and docs/ runs, in a real kernel, as pasted.

The ```` ```python ```` blocks of ``README.md`` and of every page in ``docs/`` are
read from the files themselves, so an edited example is the one tested. Each
block must have a row in :data:`EXAMPLES`: a new example without one fails
:func:`test_every_example_is_covered`, which is how an untested example is kept
out of the documentation.

Blocks that are complete on their own (the opening research agent) run as
written. Blocks marked ``# fragment:`` in the README use names from the reader's
own notebook; they run after a setup cell that defines exactly those names, and
nothing else is added to them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kernel_util import REPO_ROOT, make_notebook, run_notebook, stream_text

README = REPO_ROOT / "README.md"
#: Where examples are: the README, then the reference pages.
SOURCES = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return [
        m.group(1) for path in SOURCES for m in BLOCK.finditer(path.read_text(encoding="utf-8"))
    ]


def block(first_line: str) -> str:
    """The block whose first line is `first_line` (exactly one must match, in all files)."""
    found = [b for b in python_blocks() if b.splitlines()[0] == first_line]
    assert len(found) == 1, (
        f"README and docs/: {len(found)} python blocks start with {first_line!r}"
    )
    return found[0]


#: Each python block of the README and docs/, by its first line: the test that runs it.
EXAMPLES = {
    "%load_ext nbdurable": "test_opening_example_runs_as_written",
    "%%step plan": "test_opening_example_runs_as_written",
    "%%step research": "test_opening_example_runs_as_written",
    "# fragment: `search_web`, `q`, `i` and `client` come from your notebook": (
        "test_substep_fragment"
    ),
    "%%step notify": "test_idempotency_fragment",
    "# the email agent: a model drafts, a person approves, the mail goes out once": (
        "test_approval_example_headless"
    ),
    "%%step email": "test_approval_example_headless",
}


def test_every_example_is_covered():
    firsts = [b.splitlines()[0] for b in python_blocks()]
    assert firsts, "no python block found in the README"
    missing = [f for f in firsts if f not in EXAMPLES]
    assert not missing, f"python blocks with no test in {__name__}.EXAMPLES: {missing}"
    stale = [f for f in EXAMPLES if f not in firsts]
    assert not stale, f"EXAMPLES rows for blocks no longer in the README or docs/: {stale}"


def calls(ledger: Path) -> list[dict]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines()]


@pytest.mark.kernel
def test_opening_example_runs_as_written(tmp_path):
    """The three opening blocks, pasted into three cells: run, then rerun replays everything."""
    cells = [block("%load_ext nbdurable"), block("%%step plan"), block("%%step research")]
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_SIM_LEDGER": str(ledger),
        "NBDURABLE_SIM_LATENCY": "0",
    }
    first = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    made = calls(ledger)
    assert len(made) == 1 + 60 + 60, len(made)  # plan, then a search and an answer each
    title = stream_text(first.cells[1].outputs)
    assert title.startswith("durable execution: "), title

    again = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    assert len(calls(ledger)) == len(made), "the rerun made calls instead of replaying"
    assert stream_text(again.cells[1].outputs) == title


@pytest.mark.kernel
def test_substep_fragment(tmp_path):
    setup = (
        "%load_ext nbdurable\n"
        "from types import SimpleNamespace\n"
        "from nbdurable.demo.sim import search_web\n"
        "i, q = 0, 'what is durable execution?'\n"
        "answered = []\n"
        "def create(model, input):\n"
        "    answered.append(input)\n"
        "    return SimpleNamespace(output_text=input.upper())\n"
        "client = SimpleNamespace(responses=SimpleNamespace(create=create))"
    )
    fragment = block(next(f for f in EXAMPLES if f.startswith("# fragment")))
    use = "print(ask('hello'), len(docs), len(answered))"
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_SIM_LEDGER": str(ledger),
        "NBDURABLE_SIM_LATENCY": "0",
    }
    first = run_notebook(make_notebook([setup, fragment, use]), cwd=tmp_path, env=env)
    assert stream_text(first.cells[2].outputs) == "HELLO 3 1\n"
    # After a restart both calls replay: no search is made, and the model
    # stand-in is not called (its list stays empty in the new kernel).
    again = run_notebook(make_notebook([setup, fragment, use]), cwd=tmp_path, env=env)
    assert stream_text(again.cells[2].outputs) == "HELLO 3 0\n"
    assert [c["kind"] for c in calls(ledger)] == ["search"]


@pytest.mark.kernel
def test_idempotency_fragment(tmp_path):
    mailbox = tmp_path / "mailbox.sqlite"
    setup = (
        "%load_ext nbdurable\n"
        "from nbdurable import step, idempotency_key\n"
        "from nbdurable.demo.sim import MailProvider\n"
        f"mail = MailProvider({str(mailbox)!r})\n"
        "user, report = 'reader@example.com', 'the report'"
    )
    cells = [setup, block("%%step notify"), "print(receipt['duplicate'], mail.delivered())"]
    env = {"NBDURABLE_DIR": str(tmp_path / "store")}
    first = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    assert stream_text(first.cells[2].outputs) == "False 1\n"
    again = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    assert stream_text(again.cells[2].outputs) == "False 1\n"  # replayed: the first receipt


@pytest.mark.kernel
def test_approval_example_headless(tmp_path):
    """docs/approvals.md's agent through `nbdurable run`: exit 7, approve, one mail, once."""
    import nbformat
    from test_run_exits import nbd

    from nbdurable.demo.sim import MailProvider

    cells = [
        block("# the email agent: a model drafts, a person approves, the mail goes out once"),
        block("%%step email"),
    ]
    nb = tmp_path / "agent.ipynb"
    nbformat.write(make_notebook(cells), nb)
    ledger = {"NBDURABLE_SIM_LEDGER": str(tmp_path / "ledger.jsonl"), "NBDURABLE_SIM_LATENCY": "0"}
    stopped = nbd("run", nb, **ledger)
    assert stopped.returncode == 7, stopped.stdout + stopped.stderr
    assert "stopped at approval 'send' of step 'email'" in stopped.stderr
    mail = MailProvider(tmp_path / "mailbox.sqlite")
    assert mail.attempts() == 0
    drafted = calls(tmp_path / "ledger.jsonl")
    assert [c["kind"] for c in drafted] == ["answer"]
    assert nbd("approve", nb, "send").returncode == 0
    for _ in range(2):  # resumed, then replayed
        done = nbd("run", nb, **ledger)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (mail.delivered(), mail.attempts()) == (1, 1)
    assert calls(tmp_path / "ledger.jsonl") == drafted, "the draft was paid for twice"
    out = nbformat.read(nb, as_version=4)
    assert stream_text(out.cells[1].outputs).startswith("sent: msg-")
