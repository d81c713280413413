"""Every view says what the next run does, through a sequence of real events.

One kernel stays up while a user edits and saves the notebook, runs it,
pins, unpins and clears steps from the CLI and clears the whole run from the
kernel. After each event, four views are read: the step panel and ``%step
list`` in that kernel, ``nbdurable status`` (no kernel) and the server's
reply the cell marks and the side panel draw (``step_marks``, no kernel).
They must agree on every step's state, and the next Run All in the kernel
must do what they said: a step shown recorded, replayed or pinned replays
(its body does not run), one shown invalidated or pending runs. What ran is
read from the log the bodies and the paid call append to (helpers of a plain
cell: the views with no kernel know them from the saved cell, as a record does).
"""

from __future__ import annotations

import json
from collections import Counter

import nbformat
import pytest
from kernel_util import make_notebook
from test_lease import Kernel
from test_prediction import _listed

from nbdurable import cli
from nbdurable.server.marks import step_marks

pytestmark = pytest.mark.kernel

HELPERS = (
    "from nbdurable import step\n"
    "LOG = 'ran.log'\n"
    "def note(what):\n    with open(LOG, 'a') as f:\n        f.write(what + '\\n')\n"
    "def body(name):\n    note(f'body:{name}')\n"
    "def ask(q):\n    note(f'call:{q}')\n    return q.upper()"
)
CONFIG = "%%step config\nbody('config')\nSTYLE = 'plain'\nN_QUESTIONS = 2"
PLAN = (
    "%%step plan\nbody('plan')\nquestions = [f'q{i}' for i in range(N_QUESTIONS)]\n"
    "answers = [step(f'ask:{q}', ask, q) for q in questions]"
)
WRITE = "%%step write\nbody('write')\ntext = STYLE + ': ' + ', '.join(answers)\nprint(text)"
CELLS = ["%load_ext nbdurable", HELPERS, CONFIG, PLAN, WRITE]
PANEL = (
    "import json as _j, nbdurable as _n\n"
    "_p = _n.panel()\nprint(_j.dumps({r.info.label: r.state for r in _p.rows.values()}))\n"
    "_p.close()"
)
#: A step replayed in the kernel is recorded for a view without one; the panel names a
#: stale pin apart (the others say it in the detail).
SAME = {"replayed": "recorded", "pinned-stale": "pinned"}


@pytest.fixture
def setup(tmp_path, monkeypatch):
    store, path = tmp_path / "store", tmp_path / "nb.ipynb"
    nbformat.write(make_notebook(CELLS), path)
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path), "JPY_SESSION_NAME": ""}
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    kernel = Kernel(tmp_path, env)
    try:
        yield tmp_path, path, store, kernel
    finally:
        kernel.close()


def _run(kernel: Kernel, code: str) -> str:
    """What ``code`` printed in ``kernel``; it must succeed."""
    reply = kernel.run(code, timeout=300)
    assert reply["status"] == "ok", (code, reply)
    return reply["stdout"]


def test_every_view_says_what_the_next_run_does(setup, capsys):
    tmp, path, store, kernel = setup

    def saved_cells() -> list[str]:
        return [c.source for c in nbformat.read(path, as_version=4).cells]

    def edit(index: int, old: str, new: str) -> None:
        nb = nbformat.read(path, as_version=4)
        assert old in nb.cells[index].source
        nb.cells[index].source = nb.cells[index].source.replace(old, new)
        nbformat.write(nb, path)

    def cli_run(*args: str) -> str:
        assert cli.main([*args]) == 0
        return capsys.readouterr().out

    def views() -> dict[str, dict[str, str]]:
        status = json.loads(cli_run("status", str(path), "--json"))["steps"]
        listed = _listed(_run(kernel, "%step list"))
        return {
            "panel": {k: SAME.get(v, v) for k, v in json.loads(_run(kernel, PANEL)).items()},
            "%step list": {k: SAME.get(v[0], v[0]) for k, v in listed.items()},
            "nbdurable status": {s["label"]: s["state"] for s in status},
            "cell marks / side panel": {
                c["label"]: c["state"] for c in step_marks(path, store)["cells"]
            },
        }

    def ran() -> Counter:
        log = tmp / "ran.log"
        return Counter(log.read_text().split()) if log.exists() else Counter()

    def run_all() -> Counter:
        before = ran()
        for source in saved_cells():
            said = _run(kernel, source)
            assert "taken over" not in said, said
        return ran() - before

    def check(event: str, expected: dict[str, str], calls: int = 0) -> None:
        seen = views()
        for view, states in seen.items():
            assert states == expected, (event, view, seen)
        what = run_all()
        for name, state in expected.items():
            executed = what[f"body:{name}"] > 0
            if state in ("recorded", "pinned"):
                assert not executed, (event, name, state, what)
            elif state in ("invalidated", "pending"):
                assert executed, (event, name, state, what)
        paid = sum(n for k, n in what.items() if k.startswith("call:"))
        assert paid == calls, (event, "calls made", what)

    all_pending = dict.fromkeys(("config", "plan", "write"), "pending")
    all_recorded = dict.fromkeys(("config", "plan", "write"), "recorded")
    _run(kernel, CELLS[0])
    check("nothing recorded yet", all_pending, calls=2)
    check("a Run All again", all_recorded)

    # config's STYLE changes, its N_QUESTIONS does not: plan replays, write runs.
    edit(2, "'plain'", "'bold'")
    check("config's STYLE edited", {"config": "invalidated", "plan": "recorded",
                                     "write": "invalidated"})  # fmt: skip
    check("after that run", all_recorded)

    # A pin from the CLI: the edited step replays anyway; unpinned, it runs.
    cli_run("pin", str(path), "write")
    edit(4, "STYLE +", "STYLE.upper() +")
    check("write pinned, then edited", {**all_recorded, "write": "pinned"})
    cli_run("unpin", str(path), "write")
    check("write unpinned", {**all_recorded, "write": "invalidated"})

    # A clear from the CLI: plan runs and pays its calls again; write, which read its
    # answers, is marked stale by the clear and runs too.
    cli_run("clear", str(path), "plan")
    check("plan cleared", {"config": "recorded", "plan": "pending", "write": "invalidated"}, 2)

    # Clear all in the kernel itself: the next run records, with the kernel's lease.
    _run(kernel, "%step clear --all")
    check("everything cleared in the kernel", all_pending, calls=2)
    check("the last Run All", all_recorded)
