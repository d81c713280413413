"""The cell marks' server side without a browser: the path check and the data with no store."""

from __future__ import annotations

import nbformat
import pytest
from kernel_util import make_notebook

from nbdurable.server import notebook_path
from nbdurable.server.marks import step_marks
from nbdurable.store import open_store


def test_notebook_path_stays_under_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)
    assert notebook_path(root, "sub/a.ipynb") == root / "sub" / "a.ipynb"
    assert notebook_path(root, "/sub/a.ipynb") == root / "sub" / "a.ipynb"
    for bad, why in (
        ("../a.ipynb", "not a notebook path"),
        ("sub/../../a.ipynb", "not a notebook path"),
        ("", "not a notebook path"),
        ("sub//a.ipynb", "not a notebook path"),
        ("link/a.ipynb", "outside the server root"),  # a symlink out of the root
    ):
        with pytest.raises(ValueError, match=why):
            notebook_path(root, bad)


def test_every_step_is_pending_before_a_store_exists(tmp_path, monkeypatch):
    monkeypatch.delenv("NBDURABLE_DIR", raising=False)
    nb = make_notebook(["%load_ext nbdurable", "%%step plan\nx = 1", "%%step\ny = 2", "z = 3"])
    nbformat.write(nb, tmp_path / "a.ipynb")
    data = step_marks(tmp_path / "a.ipynb")
    assert data["run"] == "a.ipynb"
    assert data["store"] == str(tmp_path / ".nbdurable")
    assert data["store_exists"] is False
    assert not (tmp_path / ".nbdurable").exists()  # reading never creates a store
    cells = data["cells"]
    assert [(c["key"], c["state"], c["index"]) for c in cells] == [
        ("name:plan", "pending", 1),
        (f"id:{nb.cells[2].id}", "pending", 2),
    ]
    assert [c["body"] for c in cells] == ["x = 1", "y = 2"]
    assert [c["cell_id"] for c in cells] == [nb.cells[1].id, nb.cells[2].id]
    assert data["others"] == []


def test_an_empty_store_reads_like_no_store(tmp_path):
    nb = make_notebook(["%%step plan\nx = 1"])
    nbformat.write(nb, tmp_path / "a.ipynb")
    open_store(tmp_path / "store").close()
    data = step_marks(tmp_path / "a.ipynb", tmp_path / "store")
    assert data["store_exists"] is True
    assert [(c["key"], c["state"]) for c in data["cells"]] == [("name:plan", "pending")]
