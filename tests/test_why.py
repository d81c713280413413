""" "Why" is concrete: each view shows what exactly changed, old and new.

:mod:`nbdurable.why` makes the lines; here they are checked where users read
them: the panel in a real kernel (the kernel's value now), ``nbdurable
status --why`` with no kernel (the value the upstream recorded last, the
literal a saved plain cell binds, the changed lines of code, a file's
sizes), and the store, which must never hold a secret a brief was made of.
"""

from __future__ import annotations

import functools
import json

import nbformat
import numpy as np
import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text

from nbdurable import cli, why

# -- briefs -------------------------------------------------------------------


def test_briefs_of_small_builtin_values_are_their_repr():
    assert why.brief(3) == "3"
    assert why.brief("plain") == "'plain'"
    assert why.brief([1, "a", None]) == "[1, 'a', None]"
    assert why.brief({"k": (1,)}) == "{'k': (1,)}"
    assert why.brief(set()) == "set()"
    assert why.brief(list(range(10))) == "[0, 1, 2, 3, …]"
    assert why.brief(10**5000) == "int of 16610 bits"  # int -> str refuses it


def test_a_long_value_is_cut_and_says_its_length():
    text = why.brief("x" * 1000)
    assert len(text) <= why.LIMIT and text.endswith("(1,000 long)"), text
    assert why.brief(list(range(1000))) == "list of 1000 items"


def test_a_secret_is_redacted_before_the_cut(monkeypatch):
    secret = "Zq8" * 20
    monkeypatch.setenv("MY_API_KEY", secret)
    # The secret starts before the cut and ends after it: no prefix of it may show.
    text = why.brief("p" * 30 + secret)
    assert "Zq8" not in text, text
    assert "[redacte" in text, text  # cut inside the marker, never inside the secret
    assert "Zq8" not in why.brief(["a", secret]), why.brief(["a", secret])
    openai_key = "sk-proj-" + "A1b2C3d4" * 6
    assert "A1b2" not in why.brief({"key": openai_key})


def test_other_objects_say_their_type_and_never_run_their_code():
    touched = []

    class Client:
        @functools.cached_property
        def chat(self):  # an SDK client builds this lazily: a brief must not
            touched.append("chat")
            return object()

        def __repr__(self):
            touched.append("repr")
            return "Client()"

    assert why.brief(Client()) == "Client"
    assert touched == []
    assert why.brief(np.zeros((3, 4))) == "ndarray (3, 4)"


def test_code_diff_shows_the_changed_lines_and_counts_the_rest():
    assert why.code_diff("a = 1\nb = 2\n", "a = 1\n\nb = 3  \n") == ["- b = 2", "+ b = 3"]
    old = "\n".join(f"v{i} = {i}" for i in range(10))
    new = "\n".join(f"v{i} = {i + 1}" for i in range(10))
    lines = why.code_diff(old, new)
    assert len(lines) == why.CODE_LINES
    assert lines[-1] == "… 15 more changed lines", lines


# -- in every view ------------------------------------------------------------

UP = "%%step up\nx = [n, n + 1]"
DOWN = "%%step down\ny = sum(x)\nprint('sum', y)"
READ = "%%step readf\nrows = open('data.txt').read().split()"
PANEL_WHY = (
    "import json, nbdurable\np = nbdurable.panel()\n"
    "print(json.dumps({r.info.label: [r.state, r.info.detail, list(r.info.why)]"
    " for r in p.rows.values()}))"
)


def _why(path, step, capsys) -> dict:
    assert cli.main(["status", str(path), "--why", step, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.kernel
def test_why_names_old_and_new_values_code_and_files(tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    (tmp_path / "data.txt").write_text("a b c\n")
    secret = "s3cr3t-" + "v" * 20
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path), "MY_API_KEY": secret}
    secret_cells = ["import os\ntoken = os.environ['MY_API_KEY']", "%%step uses\nh = len(token)"]
    cells = ["%load_ext nbdurable", "n = 1", UP, DOWN, READ, *secret_cells]
    nbformat.write(make_notebook(cells), path)
    # In the kernel: 'up' runs again on another n; the panel shows down's x then and now.
    nb = make_notebook(
        cells + ["n = 5\nget_ipython().run_cell_magic('step', 'up', 'x = [n, n + 1]')", PANEL_WHY]
    )
    out = run_notebook(nb, cwd=tmp_path, env=env, startup_timeout=180, timeout=300)
    rows = json.loads(stream_text(outputs_of(out, 8)))
    assert rows["down"] == ["invalidated", "input 'x' changed", ["'x': was [1, 2], now [5, 6]"]]
    assert rows["up"][0] == "recorded", rows

    # No kernel: the new value is what 'up' recorded last.
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    row = _why(path, "down", capsys)
    assert row["state"] == "invalidated" and row["why"] == ["'x': was [1, 2], now [5, 6]"], row
    assert cli.main(["status", str(path), "--why", "down"]) == 0
    said = capsys.readouterr().out
    assert said.splitlines() == [
        "step 'down' (cell 4): invalidated: input 'x' changed (step 'up' ran again)",
        "  next run: runs again",
        "  'x': was [1, 2], now [5, 6]",
    ], said

    # A plain cell's literal, the code, a file: each says what changed.
    saved = nbformat.read(path, as_version=4)
    saved.cells[1].source = "n = 7"
    saved.cells[3].source = "%%step down\ny = sum(x) * 2\nprint('sum', y)"
    nbformat.write(saved, path)
    (tmp_path / "data.txt").write_text("a b c d e f\n")
    assert _why(path, "down", capsys)["why"] == ["- y = sum(x)", "+ y = sum(x) * 2"]
    row = _why(path, "readf", capsys)
    assert row["why"] == ["data.txt: was 6 B, now 12 B (content differs)"], row
    # 'up' read n = 5 (set in the kernel); its kept version read n = 1: a Run All of n = 7
    # may bring neither back, and what waits on a kept version has nothing concrete yet.
    assert _why(path, "up", capsys)["state"] == "may run"

    # A secret a step read is never kept in a brief, nor anywhere in the store.
    blob = b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())
    assert secret.encode() not in blob
    assert b"[redacted $MY_API_KEY]" in blob  # the brief of 'token' 'uses' read
