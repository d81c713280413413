"""List, clear, pin and unpin in-process, on records written straight into a tmp_path store."""

from __future__ import annotations

import json
import os
import re

import pytest

from nbdurable import commands, status
from nbdurable.errors import UsageProblem
from nbdurable.identity.keys import source_fingerprint
from nbdurable.store import RUN_SCOPE, RunKeys, Store
from nbdurable.store.records import StepRecord, StepState, SubRecord, VarRecord
from nbdurable.text import human_size

RUN = "nb.ipynb"
RK = RunKeys(RUN)


def record(
    store: Store,
    key: str,
    *,
    name: str | None = None,
    source: str = "x = 1",
    position: int | None = None,
    started: float = 1000.0,
    input_from: dict[str, str] | None = None,
    variables: tuple[VarRecord, ...] = (),
    run: str = RUN,
) -> StepRecord:
    rec = StepRecord(
        run=run,
        key=key,
        name=name or key.removeprefix("name:"),
        position=position,
        source=source,
        source_fp=source_fingerprint(source),
        inputs={},
        input_from=input_from or {},
        variables=variables,
        deleted=(),
        outputs=(),
        started=started,
        duration=2.0,
    )
    store.put(RunKeys(run).step(key), rec.to_header())
    return rec


def sub(store: Store, scope: str, sub_id: str, body: bytes = b"value", run: str = RUN) -> int:
    rec = SubRecord(run, scope, sub_id, "m.f", "fp", 1.0, 0.5, len(body), "str")
    return store.put(RunKeys(run).sub(scope, sub_id), rec.to_header(), body)


def state(store: Store, key: str, **fields: object) -> None:
    store.put(RK.state(key), StepState(**fields).to_header())


def states(infos: list[status.StepInfo]) -> dict[str, tuple[str, str]]:
    return {i.label: (i.state, i.detail) for i in infos}


def notebook(tmp_path, cells: list[str]):
    """An nbformat 4.4 notebook file (no cell ids) holding ``cells``."""
    path = tmp_path / "nb.ipynb"
    code = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    nb = {"nbformat": 4, "nbformat_minor": 4, "metadata": {}, "cells": []}
    nb["cells"] = [{**code, "source": source} for source in cells]
    path.write_text(json.dumps(nb))
    return path


# -- listing --------------------------------------------------------------------------------


def test_list_shows_every_state_in_notebook_order(store, tmp_path):
    path = notebook(
        tmp_path,
        [
            "import nbdurable",
            "%%step fresh\nx = 1",
            "%%step edited\ny = 2  # now different",
            "%%step waiting\nz = 3",
            "%%step pinned\np = 4",
            "%%step broken\nq = 5",
            "%%step stale\nr = 6",
            "%%step\nu = 7",
        ],
    )
    record(store, "name:fresh", source="x = 1")
    record(store, "name:edited", source="y = 1")
    record(store, "name:pinned", source="p = 0")  # pinned, and its code changed
    state(store, "name:pinned", pinned=True)
    state(store, "name:broken", failed="ValueError: boom", failed_at=2000.0)
    record(store, "name:stale", source="r = 6")
    state(store, "name:stale", stale="upstream step 'a' was cleared")
    record(store, "pos:7", source="u = 7")
    record(store, "name:gone", source="g = 1")
    infos = status.step_infos(store, RUN, path)

    assert [(i.label, i.position) for i in infos] == [
        ("fresh", 1),
        ("edited", 2),
        ("waiting", 3),
        ("pinned", 4),
        ("broken", 5),
        ("stale", 6),
        ("cell #8", 7),
        ("gone", None),
    ]
    assert states(infos) == {
        "fresh": ("recorded", ""),
        "edited": ("invalidated", "its code changed"),
        "waiting": ("pending", ""),
        "pinned": ("pinned", "its code changed"),
        "broken": ("failed", "ValueError: boom"),
        "stale": ("invalidated", "upstream step 'a' was cleared"),
        "cell #8": ("recorded", ""),
        "gone": ("orphaned", "no longer in the notebook"),
    }
    pinned = next(i for i in infos if i.label == "pinned")
    assert pinned.pinned and pinned.stale


def test_list_counts_substeps_and_sizes(store):
    rec = record(store, "name:a", variables=(VarRecord("x", "value", "sha", "fp", 300, "int"),))
    sizes = [sub(store, "name:a", f"s{i}") for i in range(3)]
    sub(store, "name:ab", "other")  # a step whose key extends "name:a"
    outside = [sub(store, RUN_SCOPE, "top", b"x" * 10)]
    infos = {i.label: i for i in status.step_infos(store, RUN)}
    a = infos["a"]
    assert a.substeps == 3
    assert a.size == sum(sizes) + store.size_of(RK.step("name:a")) + 300
    assert a.recorded_at == rec.started + rec.duration and a.duration == 2.0
    row = infos["(outside steps)"]
    assert (row.key, row.substeps, row.size) == (RUN_SCOPE, 1, outside[0])


def test_list_without_a_notebook_follows_position_then_recording_order(store):
    record(store, "name:z-first", started=1.0)
    record(store, "name:a-second", started=2.0)
    record(store, "name:at-3", position=3, started=9.0)
    record(store, "name:at-0", position=0, started=8.0)
    state(store, "name:never", failed="boom", failed_at=3.0, name="never")
    labels = [i.label for i in status.step_infos(store, RUN)]
    assert labels == ["at-0", "at-3", "z-first", "a-second", "never"]


def test_live_state_of_a_pinned_stale_replay(store):
    record(store, "name:a")
    state(store, "name:a", pinned=True)
    live = {"name:a": ("pinned-stale", "input 'x' changed")}
    (info,) = status.step_infos(store, RUN, live=live)
    assert (info.state, info.detail, info.stale) == ("pinned", "input 'x' changed", True)
    assert "pinned (stale)" in status.format_table([info])

    commands.set_pin(store, RUN, "name:a", False)  # unpinned: the next run executes it
    (info,) = status.step_infos(store, RUN, live=live)
    assert (info.state, info.detail, info.stale) == ("invalidated", "input 'x' changed", False)


def test_live_states_override_what_the_store_says(store):
    record(store, "name:a")
    record(store, "name:b")
    record(store, "name:c")
    live = {
        "name:a": ("running", ""),
        "name:b": ("replayed", ""),
        "name:c": ("invalidated", "input 'topic' changed"),
    }
    assert states(status.step_infos(store, RUN, live=live)) == {
        "a": ("running", ""),
        "b": ("replayed", ""),
        "c": ("invalidated", "input 'topic' changed"),
    }


def test_a_step_that_cannot_be_replayed_says_why(store):
    unsaved = VarRecord("client", "unsaved", "cannot pickle", "fp", 0, "Client")
    record(store, "name:a", variables=(unsaved,))
    ((label, (st, detail)),) = states(status.step_infos(store, RUN)).items()
    assert st == "not replayable" and "cannot save client" in detail


def test_format_table(store):
    record(store, "name:plan", position=1)
    sub(store, "name:plan", "s", os.urandom(2000))  # stored as it is: it does not deflate
    text = status.format_table(status.step_infos(store, RUN))
    head, row = text.splitlines()
    assert re.split(r"\s{2,}", head) == [
        "#",
        "step",
        "state",
        "recorded",
        "version",
        "sub-steps",
        "size",
        "detail",
    ]
    cols = re.split(r"\s{2,}", row)
    assert cols[:3] == ["2", "plan", "recorded"] and cols[5] == "1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cols[3])
    assert re.fullmatch(r"[0-9a-f]{8}", cols[4])
    assert re.fullmatch(r"\d\.\d KB", cols[6])
    assert human_size(512) == "512 B" and human_size(3 * 1024**2) == "3.0 MB"


# -- resolve, clear, pin ------------------------------------------------------------------------


def test_resolve_by_name_label_or_key(store):
    record(store, "name:plan")
    record(store, "pos:4", name="cell #5", source="y = 2")
    assert commands.resolve(store, RUN, ["plan", "name:plan", "cell #5", "pos:4"]) == [
        "name:plan",
        "name:plan",
        "pos:4",
        "pos:4",
    ]
    with pytest.raises(UsageProblem) as err:
        commands.resolve(store, RUN, ["plan", "nope"])
    assert str(err.value) == "no step 'nope' in run 'nb.ipynb' (known steps: plan, cell #5)"


def test_clear_removes_the_step_and_its_substeps_and_invalidates_dependants(store):
    record(store, "name:a")
    record(store, "name:b", input_from={"x": "name:a"})
    record(store, "name:c", input_from={"y": "name:b"})  # through b
    record(store, "name:d", input_from={"w": "name:other"})
    record(store, "name:other")
    state(store, "name:c", pinned=True)
    state(store, "name:a", pinned=True)
    sub(store, "name:a", "s1")
    sub(store, "name:a", "s2")
    sub(store, "name:b", "s1")

    assert commands.clear(store, RUN, ["name:a"]) == ["name:b", "name:c"]
    assert store.get(RK.step("name:a")) is None and store.get(RK.state("name:a")) is None
    assert store.scan(RK.subs_prefix("name:a")) == []
    assert store.scan(RK.subs_prefix("name:b")) == [RK.sub("name:b", "s1")], "kept"
    got = states(status.step_infos(store, RUN))
    assert "a" not in got
    assert got["b"] == ("invalidated", "upstream step 'a' was cleared")
    assert got["c"] == ("pinned", "upstream step 'a' was cleared"), "still pinned, now stale"
    assert got["d"] == got["other"] == ("recorded", "")


def test_clear_all_forgets_one_run_and_nothing_else(store):
    record(store, "name:a")
    state(store, "name:a", pinned=True)
    sub(store, "name:a", "s")
    sub(store, RUN_SCOPE, "top")
    record(store, "name:a", run="other.ipynb")
    assert commands.clear_all(store, RUN) == 4
    assert status.step_infos(store, RUN) == []
    assert [i.label for i in status.step_infos(store, "other.ipynb")] == ["a"]


def test_pin_and_unpin(store):
    record(store, "name:a")
    commands.set_pin(store, RUN, "name:a", True)
    assert StepState.from_header(store.get(RK.state("name:a"))[0]).pinned
    commands.set_pin(store, RUN, "name:a", False)
    assert store.get(RK.state("name:a")) is None, "an empty state is not kept"

    state(store, "name:a", stale="upstream step 'z' was cleared")
    commands.set_pin(store, RUN, "name:a", True)
    commands.set_pin(store, RUN, "name:a", False)
    kept = StepState.from_header(store.get(RK.state("name:a"))[0])
    assert not kept.pinned and kept.stale == "upstream step 'z' was cleared"

    with pytest.raises(UsageProblem, match="has no record to pin yet; run it first"):
        commands.set_pin(store, RUN, "name:never", True)


def test_cells_the_magic_refuses_do_not_break_the_listing(store, tmp_path):
    refused = ['%%step "a b"\nx = 1', "%%step x --nope\nx = 1", "%%step x y\nx = 1"]
    refused += ["%%step list\nx = 1", "%%step 'unclosed\nx = 1"]
    path = notebook(tmp_path, [*refused, "%%step ok --force\nx = 1", "%%step -f\nx = 2"])
    record(store, "name:ok")
    infos = status.step_infos(store, RUN, path)
    assert [(i.label, i.state, i.position) for i in infos] == [
        ("ok", "recorded", 5),
        ("cell #7", "pending", 6),
    ]
    assert commands.resolve(store, RUN, ["ok"], path) == ["name:ok"]
