"""A ``%%step`` cell executes exactly like a plain cell, in real kernels.

Its body is run by IPython itself: a top-level ``await`` runs on the kernel's
own event loop and thread, so the ``decimal`` context, context variables,
``sqlite3`` connections and asyncio primitives made by earlier cells behave as
in a plain cell; the last expression is shown by IPython's display hook, so
``_``, ``__``, ``Out`` and ``_N`` are as after a plain run (replayed too), and
a trailing ``;`` hides it. Each notebook runs plain (no nbdurable, no
``%%step`` lines), then recorded, then replayed in a fresh kernel; the outputs
of every run must equal the plain run's (execution counts aside).
"""

from __future__ import annotations

import re
import textwrap

import pytest
from kernel_util import make_notebook, normalize_outputs, run_notebook, stream_text

pytestmark = pytest.mark.kernel

#: Plain cells (str) and steps ((name, body)); the same in every run but for the headers.
CELLS: list[str | tuple[str, str]] = [
    "import asyncio, contextvars, decimal, sqlite3\nfrom nbdurable import step",
    "decimal.getcontext().prec = 5",
    ("dec", "await asyncio.sleep(0)\nthird = decimal.Decimal(1) / 3\nprint(third)"),
    "var = contextvars.ContextVar('var', default='default')\nvar.set('set earlier');",
    ("ctx", "await asyncio.sleep(0)\nseen = var.get()\nprint(seen)"),
    "db = sqlite3.connect(':memory:')\ndb.execute('create table t (x)');",
    (
        "sql",
        "await asyncio.sleep(0)\ndb.execute('insert into t values (7)')\n"
        "rows = db.execute('select x from t').fetchall()\nprint(rows)",
    ),
    "sem = asyncio.Semaphore(1)",
    ("sem1", "async with sem:\n    await asyncio.sleep(0)\nfirst = 'one'\nprint(first)"),
    ("sem2", "async with sem:\n    await asyncio.sleep(0)\nsecond = 'two'\nprint(second)"),
    (
        "gathered",
        "async def ask(i):\n    await asyncio.sleep(0)\n    return i * i\n"
        "squares = await asyncio.gather(*(step(f'q{i}', ask, i) for i in range(3)))\n"
        "squares",
    ),
    ("answer", "x = 41\nx + 1"),
    "print(_ + 1, _12)",
    ("quiet", "'hidden';"),
    ("word", "'word'"),
    "print(repr(__), repr(_), sorted(map(repr, Out.values())))",
    "data = [1, 2]",
    ("input", "data"),
    "print(_ is data)",
    ("bound", "made = [3]\nmade"),
    "print(_ is made, Out[max(Out)] is made)",
    "print(third, seen, rows, first, second, squares)",
]


def cells(durable: bool) -> list[str]:
    out = []
    for c in CELLS:
        if isinstance(c, tuple):
            name, body = c
            out.append(f"%%step {name}\n{body}" if durable else body)
        else:
            out.append(c)
    if durable:  # in the first cell: execution counts (and _N) stay the plain run's
        out[0] = "%load_ext nbdurable\n" + out[0]
    return out


def shown(nb) -> list[list[dict]]:
    """Each cell's outputs, execution counts and the "replayed" note aside."""
    return [
        [
            o
            for o in normalize_outputs(c.get("outputs", []), execution_count=False)
            if not (o.get("metadata") or {}).get("nbdurable")
            and "NbdurableWarning" not in o.get("text", "")  # e.g. "cannot be saved"
        ]
        for c in nb.cells
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stepcell")
    env = {
        "NBDURABLE_DIR": str(tmp / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp / "nb.ipynb"),
        "JPY_SESSION_NAME": "",
    }
    kw = {"cwd": tmp, "env": env, "allow_errors": True}
    plain = run_notebook(make_notebook(cells(False)), **kw)
    recorded = run_notebook(make_notebook(cells(True)), **kw)
    replayed = run_notebook(make_notebook(cells(True)), **kw)
    return plain, recorded, replayed


def test_plain_run_is_the_expected_oracle(runs):
    plain = shown(runs[0])
    assert plain[-1] == [
        {
            "output_type": "stream",
            "name": "stdout",
            "text": "0.33333 set earlier [(7,)] one two [0, 1, 4]\n",
        }
    ]


@pytest.mark.parametrize("which", ["recorded", "replayed"])
def test_step_cells_show_what_plain_cells_show(runs, which):
    plain, recorded, replayed = runs
    nb = recorded if which == "recorded" else replayed
    expected = shown(plain)
    got = shown(nb)
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"cell {i}: {textwrap.shorten(str(CELLS[i]), 60)}"


def test_the_second_run_replayed_every_step(runs):
    replayed = runs[2]
    notes = [
        i
        for i, c in enumerate(replayed.cells)
        if any((o.get("metadata") or {}).get("nbdurable") for o in c.get("outputs", []))
    ]
    # A ContextVar and a sqlite3 connection cannot be saved: those steps run
    # again (on the kernel's loop, as the comparison above checks).
    rerun = {"ctx", "sql"}
    steps = [i for i, c in enumerate(CELLS) if isinstance(c, tuple) and c[0] not in rerun]
    assert notes == steps


def test_a_traceback_shows_the_cells_own_lines(tmp_path):
    env = {"NBDURABLE_DIR": str(tmp_path / "store"), "JPY_SESSION_NAME": ""}
    nb = make_notebook(["%load_ext nbdurable\n%step run t", "%%step boom\nx = 1\n1 / 0"])
    nb = run_notebook(nb, cwd=tmp_path, env=env, allow_errors=True)
    (err,) = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    text = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(err.traceback))
    assert "%%step boom" in text and "----> 3" in text, text
    assert "__nbdurable_step__" not in text, text


def test_in_holds_the_cell_as_ipython_makes_it(tmp_path):
    """``In[n]`` of a ``%%step`` cell is IPython's own text of it, not nbdurable's rewrite."""
    env = {"NBDURABLE_DIR": str(tmp_path / "store"), "JPY_SESSION_NAME": ""}
    cells = ["%load_ext nbdurable\n%step run t", "%%step w\nx = 1", "print(repr(In[2]))"]
    nb = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    want = repr("get_ipython().run_cell_magic('step', 'w', 'x = 1\\n')")
    assert nb.cells[2].outputs[0]["text"] == want + "\n"


def test_step_called_from_code_and_from_a_silent_cell(tmp_path):
    """``run_cell_magic("step", ...)`` from code runs its body itself; a silent cell's step ends."""
    env = {"NBDURABLE_DIR": str(tmp_path / "store"), "JPY_SESSION_NAME": ""}
    cells = [
        "%load_ext nbdurable\n%step run t",
        "z = 0\nget_ipython().run_cell_magic('step', 'viacall', 'y = 2\\nprint(y)')",
        "get_ipython().run_cell('%%step hushed\\nq = 3', silent=True);",
        "print(y, q)",
        "%step list",
    ]
    for run in ("records", "replays"):
        nb = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
        assert stream_text(nb.cells[1].outputs) == "2\n", run
        assert stream_text(nb.cells[3].outputs) == "2 3\n", run
        table = stream_text(nb.cells[4].outputs)
        state = "recorded" if run == "records" else "replayed"
        for name in ("viacall", "hushed"):
            (row,) = [line for line in table.splitlines() if name in line]
            assert state in row, (run, table)
