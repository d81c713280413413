"""Views of a large run: what they read does not grow with its steps.

``nbdurable status``, the side panel and the widget panel read a run of
thousands of steps (``python -m bench.views`` times them). Each used to ask
the store once or more per step (its record, its size, its sub-steps' count,
its kept versions) and to analyse every saved cell again on every look;
these tests pin down that a view's reads of the store are a fixed number,
whatever the steps, and that a second look analyses no cell again.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from bench import views
from nbdurable import status
from nbdurable.identity import cellpython, locate
from nbdurable.store import RunView, open_store
from nbdurable.store.base import Store

#: The store's reads, each counted (the engine's primitives and the record reads on them).
READS = ("read", "read_prefix", "scan", "stats", "stats_by_scope", "size_of", "has", "get")


def _counted(store: Store, monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    calls: collections.Counter[str] = collections.Counter()
    for name in READS:
        real = getattr(store, name, None)
        if real is None:
            continue

        def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(store, name, counted)
    return calls


def _reads(nb: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[collections.Counter[str], list]:
    directory = locate.store_dir(nb)
    with open_store(directory) as store, monkeypatch.context() as m:
        calls = _counted(store, m)
        rows = status.step_infos(store, locate.run_id_for(nb, directory), nb)
    return calls, rows


def test_a_views_reads_do_not_grow_with_the_steps(tmp_path, monkeypatch):
    small, s1 = views.many_steps(tmp_path / "small", 3)
    s1.store.close()
    large, s2 = views.many_steps(tmp_path / "large", 9)
    s2.store.close()
    few, rows_few = _reads(small, monkeypatch)
    many, rows_many = _reads(large, monkeypatch)
    assert [r.state for r in rows_many] == ["recorded"] * 9
    assert len(rows_few) == 3
    assert all(r.size > 0 for r in rows_many)
    assert many == few, f"reads grew with the steps: {dict(few)} -> {dict(many)}"


def test_sizes_and_counts_read_at_once_are_those_read_one_by_one(tmp_path):
    """Each row's size (its record, its variables, its sub-steps) and sub-step count, read
    for all rows in one go, are what the store says of that step alone."""
    nb, session, _, _ = views.many_substeps(tmp_path, 60, 3)
    session.store.close()
    directory = locate.store_dir(nb)
    with open_store(directory) as store:
        view = RunView(store, locate.run_id_for(nb, directory))
        rows = status.step_infos(store, view.run_id, nb)
        assert [r.substeps for r in rows] == [20, 20, 20]
        for r in rows:
            rec = view.record(r.key)
            assert rec is not None
            subs, sub_bytes = view.sub_stats(r.key)
            alone = store.size_of(view.keys.step(r.key)) + sum(v.size for v in rec.variables)
            assert (r.substeps, r.size) == (subs, sub_bytes + alone)


def test_a_second_look_analyses_no_cell_again(tmp_path, monkeypatch):
    """The side panel polls and the widget panel refreshes: a cell already seen, in a
    notebook file that did not change, is neither parsed nor transformed again."""
    nb, session = views.many_steps(tmp_path, 4)
    session.store.close()
    _reads(nb, monkeypatch)
    transformed: list[str] = []
    real = cellpython._transform
    monkeypatch.setattr(cellpython, "_transform", lambda b: transformed.append(b) or real(b))
    parsed: list[int] = []
    real_cells = locate.step_cells
    monkeypatch.setattr(locate, "step_cells", lambda *a: parsed.append(1) or real_cells(*a))
    _, rows = _reads(nb, monkeypatch)
    assert len(rows) == 4
    assert transformed == [] and parsed == []
    # An edit is seen: that cell alone is analysed.
    text = nb.read_text().replace("v3 = v2 + 1", "v3 = v2 + 2")
    nb.write_text(text)
    _, rows = _reads(nb, monkeypatch)
    assert parsed == [1] and transformed == ["v3 = v2 + 2"]
    assert [r.state for r in rows] == ["recorded"] * 3 + ["invalidated"]
