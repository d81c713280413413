"""A saved cell's Python without a kernel: the same text as IPython's transformer, made faster.

See :mod:`nbdurable.identity.cellpython`: the token passes are skipped only
where none could find anything, so every answer must be IPython's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

from nbdurable.identity import cellpython

ROOT = Path(__file__).resolve().parent.parent

#: Cells where IPython's syntax hides, or where a screen might miss it.
TRICKY = [
    "x = 1",
    "x = 1\n",
    "\n\n  x = 1\n  y = 2\n",
    "%time x = 1",
    "x = 1\n%time y = 2",
    "a = %who_ls",
    "a =  %who_ls",
    "a = \\\n  %who_ls",
    "a = !ls",
    "a = ! ls",
    "!ls",
    "  !ls",
    "files = !ls -la\nprint(files)",
    "x?",
    "x??",
    "?x",
    "len?\n",
    "if x != 1:\n    y = 2",
    "x = 5 % 2\ny = '%s' % x",
    "print('hi?')",
    "# what?\nx = 1",
    ",f a b",
    ";f a b",
    "/f a b",
    "x = 1\n/f a",
    "def f():\n    return 1\n  %time f()",
    ">>> x = 1\n>>> y = 2",
    ">>> x = 1\n... y = 2",
    "In [1]: x = 1\n   ...: y = 2",
    "x = 1\n...\n",
    "...: x",
    "%%time\nx = 1",
    "%%capture out\nprint(1)",
    "x = (1,\n/2)",
    "x = '''\n%time inside a string\n'''",
    "x = 1\ry = 2",
    "x = 1\r%time y",
    "x = 1\x0c%time y",
    "x = 1\u2028%time y",
    "if True:\n        x = 1\n    y = 2",  # an unindent matching no outer level
    "x = (",
    "x = '''",
    "def f(:\n    pass",
    "await g()",
    "async with a as b:\n    pass",
    "x = [i for i in range(3)]\nx",
    "x = 1;",
    "lambda: (yield)",
    "\t x = 1\n\t y = 2",
    "x = 1\n\n\n   \n",
    "",
    "   ",
    "\n",
    "s = '''\n   \nkeeps its blank line?'''",
    "s = '''\n   \nkeeps its blank line'''",
    "x = 1 if a else b\n# comment with % and ; and /",
    "f(a=%x)",
    "x = y = %pwd",
    "print(f'{x!r}')",
    "print(f'{x!r:>10}')",
]


def _notebook_cells() -> list[str]:
    out: list[str] = []
    for nb in sorted(ROOT.rglob("*.ipynb")):
        if ".git" in nb.parts or "node_modules" in nb.parts:
            continue
        try:
            cells = json.loads(nb.read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            continue
        for c in cells:
            if c.get("cell_type") == "code":
                src = c.get("source", "")
                out.append("".join(src) if isinstance(src, list) else src)
    return out


def _source_chunks() -> list[str]:
    """Runs of lines of this project's own Python: code of every shape, valid or cut anywhere."""
    out: list[str] = []
    for path in sorted((ROOT / "nbdurable").rglob("*.py"))[:40]:
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        out += ["".join(lines[i : i + 12]) for i in range(0, len(lines), 12)]
    return out


def test_the_corpus_holds_both_kinds_of_cell() -> None:
    """The comparisons below cover cells the screen lets through and cells it sends on."""
    cells = TRICKY + _notebook_cells()
    flagged = [c for c in cells if cellpython._may_hold_ipython(c)]
    assert len(_notebook_cells()) > 100
    assert 20 < len(flagged) < len(cells) - 100


@pytest.mark.parametrize("body", TRICKY)
def test_tricky_cells_come_out_as_ipython_makes_them(body: str) -> None:
    assert cellpython._transform_or_none(body) == cellpython.ipython_python_of(body)


def test_saved_notebook_cells_come_out_as_ipython_makes_them() -> None:
    for body in _notebook_cells():
        assert cellpython._transform_or_none(body) == cellpython.ipython_python_of(body), body


def test_cut_source_comes_out_as_ipython_makes_it() -> None:
    for body in _source_chunks():
        assert cellpython._transform_or_none(body) == cellpython.ipython_python_of(body), body


def test_a_plain_cell_is_not_tokenized(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token passes (most of the manager's time) do not run on a cell with no
    IPython syntax; they do on one with it."""
    calls: list[int] = []
    real = TransformerManager.do_token_transforms

    def counted(self: TransformerManager, lines: list[str]) -> list[str]:
        calls.append(1)
        return real(self, lines)

    monkeypatch.setattr(TransformerManager, "do_token_transforms", counted)
    cellpython.python_of.cache_clear()
    assert cellpython.python_of("y = x + 1\nz = [y] * 2") == "y = x + 1\nz = [y] * 2\n"
    assert calls == []
    assert (
        cellpython.python_of("%time y = x + 1")
        == "get_ipython().run_line_magic('time', 'y = x + 1')\n"
    )
    assert calls == [1]


def test_answers_are_cached_by_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view reading the notebook again transforms only the cells that changed."""
    seen: list[str] = []
    real = cellpython._transform

    def counted(body: str) -> str:
        seen.append(body)
        return real(body)

    monkeypatch.setattr(cellpython, "_transform", counted)
    cellpython.python_of.cache_clear()
    for _ in range(3):
        cellpython.python_of("a = 1")
        cellpython.python_of("b = 2")
    assert seen == ["a = 1", "b = 2"]


def test_a_very_long_cell_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell of megabytes (data pasted in) is transformed on each look, not held."""
    seen: list[int] = []
    real = cellpython._transform
    monkeypatch.setattr(cellpython, "_transform", lambda b: seen.append(len(b)) or real(b))
    cellpython.python_of.cache_clear()
    big = "x = " + "1" * cellpython.CACHED_CHARS
    for _ in range(2):
        cellpython.python_of(big)
    assert seen == [len(big)] * 2
