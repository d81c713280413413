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
from kernel_util import make_notebook, normalize_outputs, run_notebook

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
