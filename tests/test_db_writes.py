"""A step that wrote rows into a SQLite file and bound handles that cannot be saved.

Before, such a step (an engine, a session, a connection in its variables) ran its
body again on replay and inserted its rows a second time: a plain run has them
once. Each case here runs the notebook plain (the oracle: no extension, no
``%%step``), durable, durable again in a fresh kernel, and again after the
kernel was killed, and compares the rows in the file.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text
from nbclient.exceptions import DeadKernelError

from nbdurable import status
from nbdurable.ipython.rows import row_html
from nbdurable.store import open_store

pytestmark = pytest.mark.kernel

HEAD = "%load_ext nbdurable"

CASES = {
    "orm": (
        "import sqlalchemy as sa\n"
        "from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column\n"
        "class Base(DeclarativeBase):\n    pass\n"
        "class Item(Base):\n    __tablename__ = 'items'\n"
        "    id: Mapped[int] = mapped_column(primary_key=True)\n    text: Mapped[str]",
        "%%step write\nengine = sa.create_engine('sqlite:///shop.db')\n"
        "Base.metadata.create_all(engine)\nsession = Session(engine)\n"
        "session.add_all([Item(text='a'), Item(text='b')])\nsession.commit()\nprint('written')",
        "session",
    ),
    "to_sql": (
        "import sqlite3\nimport pandas as pd",
        "%%step write\ncon = sqlite3.connect('shop.db')\n"
        "pd.DataFrame({'text': ['a', 'b']}).to_sql('items', con, if_exists='append', index=False)\n"
        "print('written')",
        "con",
    ),
    "sqlite3": (
        "import sqlite3",
        "%%step write\ncon = sqlite3.connect('shop.db')\ncur = con.cursor()\n"
        "cur.execute('create table if not exists items (text)')\n"
        "cur.executemany('insert into items values (?)', [('a',), ('b',)])\n"
        "con.commit()\nprint('written')",
        "cur",
    ),
}

COUNT = (
    "import sqlite3 as _s\n"
    "print(_s.connect('shop.db').execute('select count(*) from items').fetchone()[0])"
)


def durable(root: Path, setup: str, write: str, *more: str, allow_errors: bool = False):
    nb = make_notebook([HEAD, setup, write, COUNT, *more])
    nbformat.write(nb, root / "db.ipynb")  # what `nbdurable status` reads
    env = {"NBDURABLE_DIR": str(root / "store"), "NBDURABLE_NOTEBOOK": str(root / "db.ipynb")}
    return run_notebook(nb, cwd=root, env=env, timeout=180, allow_errors=allow_errors)


def plain_rows(root: Path, setup: str, write: str) -> int:
    """Rows after a plain run of the same cells (no extension, no %%step line)."""
    root.mkdir()
    body = write.split("\n", 1)[1]
    run_notebook(make_notebook([setup, body]), cwd=root, timeout=180)
    return rows(root)


def rows(root: Path) -> int:
    with sqlite3.connect(root / "shop.db") as con:
        return con.execute("select count(*) from items").fetchone()[0]


def said(nb, index: int) -> str:
    return " ".join(stream_text(outputs_of(nb, index), "stderr").split())


def replayed(nb, index: int) -> bool:
    return any(
        o.get("metadata", {}).get("nbdurable", {}).get("note") == "replayed"
        for o in outputs_of(nb, index)
    )


def errors(nb, index: int) -> str:
    return " ".join(
        f"{o.get('ename')}: {o.get('evalue')}"
        for o in outputs_of(nb, index)
        if o.get("output_type") == "error"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_step_that_wrote_to_a_database_file_replays_with_stand_ins(tmp_path, case):
    setup, write, handle = CASES[case]
    expected = plain_rows(tmp_path / "plain", setup, write)
    assert expected == 2
    root = tmp_path / "durable"
    root.mkdir()
    first = durable(root, setup, write)
    assert rows(root) == expected
    assert "stand-ins" in said(first, 2), said(first, 2)

    # A fresh kernel: the step replays and the rows are not written again.
    again = durable(root, setup, write, f"{handle}.execute", allow_errors=True)
    assert replayed(again, 2), said(again, 2)
    assert stream_text(outputs_of(again, 2)) == "written\n"
    assert stream_text(outputs_of(again, 3)) == f"{expected}\n"
    assert rows(root) == expected
    # The handle was not restored: using it says so in one line, naming it.
    error = errors(again, 4)
    assert error.startswith(f"NotRestored: {handle!r}"), error

    # Killed after the step: the next kernel replays it, and nothing is written twice.
    kill = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(DeadKernelError):
        durable(root, setup, write, kill)
    resumed = durable(root, setup, write)
    assert replayed(resumed, 2), said(resumed, 2)
    assert rows(root) == expected

    said_status = cli(root, "status", "--why", "write")
    # (The ORM case reads classes of plain cells, which only a kernel can compare.)
    assert "next run: replays" in said_status, said_status
    assert "stand-ins" in said_status, said_status
    if case != "orm":
        assert "come back as stand-ins" in panel_row(root), panel_row(root)


def test_a_step_that_wrote_to_a_file_and_cannot_be_replayed_refuses_to_write_again(tmp_path):
    # Besides its connection the step keeps a generator: the body would have to
    # run again on replay, and insert its rows a second time. It refuses, in one
    # line naming the file and --force; with --force it writes again, as asked.
    setup = "import sqlite3"
    write = (
        "%%step write\ncon = sqlite3.connect('shop.db')\n"
        "con.execute('create table if not exists items (text)')\n"
        "con.execute(\"insert into items values ('a')\")\ncon.commit()\n"
        "rest = (i for i in range(3))"
    )
    durable(tmp_path, setup, write)
    assert rows(tmp_path) == 1
    said_status = cli(tmp_path, "status", "--why", "write")
    assert "refuses to run its body again" in said_status, said_status
    assert "shop.db" in said_status and "--force" in said_status, said_status
    row = panel_row(tmp_path)
    assert "would write to shop.db again" in row and "runs again" not in row, row

    again = durable(tmp_path, setup, write, allow_errors=True)
    error = said(again, 2)  # IPython shows a UsageError as one line on stderr
    assert error.startswith("UsageError: step 'write' would write to shop.db again"), error
    assert "%%step --force" in error and "rest cannot be saved" in error, error
    assert stream_text(outputs_of(again, 3)) == "1\n"
    assert rows(tmp_path) == 1

    forced = write.replace("%%step write", "%%step write --force")
    durable(tmp_path, setup, forced)
    assert rows(tmp_path) == 2


def test_reading_a_database_file_is_not_a_write(tmp_path):
    # A step that only reads (a CTE included) and keeps its connection takes the
    # ordinary branch: its body runs again, and it reads nothing twice.
    with sqlite3.connect(tmp_path / "shop.db") as con:
        con.execute("create table items (text)")
        con.execute("insert into items values ('a')")
    setup = "import sqlite3"
    read = (
        "%%step read\ncon = sqlite3.connect('shop.db')\n"
        "n = con.execute('with t as (select * from items) select count(*) from t').fetchone()[0]\n"
        "print(n)"
    )
    durable(tmp_path, setup, read)
    again = durable(tmp_path, setup, read)
    assert not replayed(again, 2)
    assert "runs again" in said(again, 2), said(again, 2)
    assert stream_text(outputs_of(again, 2)) == "1\n"


def panel_row(root: Path) -> str:
    """The panel's row of step 'write', as the panel draws it from the store."""
    with open_store(root / "store") as store:
        infos = {i.label: i for i in status.step_infos(store, "db.ipynb", root / "db.ipynb")}
    return " ".join(row_html(infos["write"]).split())


def cli(root: Path, *args: str) -> str:
    env = {
        **os.environ,
        "NBDURABLE_DIR": str(root / "store"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "nbdurable", *args, str(root / "db.ipynb")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr


def test_a_step_run_again_in_its_own_kernel_keeps_its_live_handle(tmp_path):
    # The cell run a second time in the kernel that recorded it replays (the rows are
    # not written twice) and leaves the connection that kernel made in place.
    setup, write, handle = CASES["sqlite3"]
    again = f"get_ipython().run_cell({write!r})\nprint({handle}.execute('select 1').fetchone())"
    nb = durable(tmp_path, setup, write, again)
    assert replayed(nb, 4), said(nb, 4)
    assert stream_text(outputs_of(nb, 4)).endswith("(1,)\n"), outputs_of(nb, 4)
    assert rows(tmp_path) == 2


def test_a_step_whose_stand_in_replay_fails_refuses_to_write_again(tmp_path):
    # Its handles would come back as stand-ins, but a value it saved does not load
    # in the fresh kernel: the body would run and insert the rows again. It refuses,
    # in one line, as a step that cannot replay at all does.
    setup = (
        "import sqlite3, os\n"
        "class Box:\n"
        "    def __getstate__(self):\n        return {'n': 1}\n"
        "    def __setstate__(self, state):\n"
        "        if os.path.exists('broken'):\n            raise ValueError('box is broken')\n"
        "        self.__dict__.update(state)"
    )
    write = (
        "%%step write\ncon = sqlite3.connect('shop.db')\n"
        "con.execute('create table if not exists items (text)')\n"
        "con.execute(\"insert into items values ('a')\")\ncon.commit()\nbox = Box()"
    )
    first = durable(tmp_path, setup, write)
    assert "stand-ins" in said(first, 2), said(first, 2)
    assert rows(tmp_path) == 1
    (tmp_path / "broken").touch()
    again = durable(tmp_path, setup, write, allow_errors=True)
    error = said(again, 2)
    assert error.startswith("UsageError: step 'write' would write to shop.db again"), error
    assert "box is broken" in error and "%%step --force" in error, error
    assert "runs again" not in error, error
    assert rows(tmp_path) == 1


def test_a_handle_a_plain_cell_made_stays_live_after_a_replay(tmp_path):
    # The connection comes from a plain cell, which makes it again in a fresh kernel:
    # the step replays (its rows are not written twice) and leaves that live
    # connection in place, so the cells after it work as in a plain run.
    setup = "import sqlite3\ncon = sqlite3.connect('shop.db')"
    write = (
        "%%step write\ncon.execute('create table if not exists items (text)')\n"
        "con.execute(\"insert into items values ('a'), ('b')\")\ncon.commit()\n"
        "cur = con.cursor()"
    )
    use = "print(con.execute('select count(*) from items').fetchone()[0])"
    durable(tmp_path, setup, write, use)
    again = durable(tmp_path, setup, write, use, "cur.execute('select 1')", allow_errors=True)
    assert replayed(again, 2), said(again, 2)
    assert rows(tmp_path) == 2
    assert stream_text(outputs_of(again, 4)) == "2\n", outputs_of(again, 4)
    # What the step itself made (its cursor) is a stand-in all the same.
    assert errors(again, 5).startswith("NotRestored: 'cur'"), errors(again, 5)


def test_a_step_reading_a_stand_in_replays(tmp_path):
    # A later step read the handle: with the handle a stand-in, what it read
    # fingerprints as it did when recorded, so it replays (it does not run and fail
    # on the stand-in, which a plain run would not).
    setup, write, handle = CASES["sqlite3"]
    read = "%%step read\nn = con.execute('select count(*) from items').fetchone()[0]\nprint(n)"
    durable(tmp_path, setup, write, read)
    again = durable(tmp_path, setup, write, read, allow_errors=True)
    assert replayed(again, 2), said(again, 2)
    assert replayed(again, 4), said(again, 4) + errors(again, 4)
    assert stream_text(outputs_of(again, 4)) == "2\n", outputs_of(again, 4)
