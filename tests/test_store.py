"""The store in-process: signing, refusal of planted pickles, format version, no eviction,
private directory, atomic writes, prefix scans. Fast: tmp_path stores, no kernel."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import diskcache
import pytest

from nbdurable.durable.context import StepContext
from nbdurable.durable.session import Session
from nbdurable.errors import (
    CorruptRecord,
    FormatVersionError,
    NbdurableWarning,
    StoreError,
    UsageProblem,
)
from nbdurable.identity import locate
from nbdurable.store import RUN_SCOPE, RunKeys, Store, codec, open_store
from nbdurable.store.records import FORMAT_VERSION, RECORD_FORMAT, STORE_FORMAT


class Planted:
    """Unpickling this creates ``path``: how a planted pickle would run code."""

    def __init__(self, path: Path, padding: int = 0) -> None:
        self.code = f"open({str(path)!r}, 'w').close()  # {'x' * padding}"

    def __reduce__(self):
        return (exec, (self.code,))


def plant(store: Store, key: str, value: object) -> None:
    """Write a row the way plain diskcache would (MODE_PICKLE), bypassing nbdurable."""
    with diskcache.Cache(str(store.cache_dir)) as raw:
        raw.set(key, value)


# -- basics -------------------------------------------------------------------------------


def test_store_directory_is_private(tmp_path):
    with open_store(tmp_path / "deep" / "store") as s:
        assert stat.S_IMODE(s.path.stat().st_mode) == 0o700
        assert stat.S_IMODE((s.path / "key").stat().st_mode) == 0o600


def test_store_location(tmp_path, monkeypatch):
    monkeypatch.delenv("NBDURABLE_DIR", raising=False)
    nb = tmp_path / "work" / "story.ipynb"
    assert locate.store_dir(nb) == tmp_path / "work" / ".nbdurable"
    monkeypatch.chdir(tmp_path)
    assert locate.store_dir(None) == tmp_path / ".nbdurable"
    monkeypatch.setenv("NBDURABLE_DIR", str(tmp_path / "elsewhere"))
    assert locate.store_dir(nb) == tmp_path / "elsewhere"
    assert locate.run_id_for(nb, tmp_path / "work" / ".nbdurable") == "story.ipynb"


def test_a_damaged_key_file_is_a_clear_error(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "key").write_bytes(b"short")
    with pytest.raises(StoreError, match="shorter than 16 bytes.*delete the store directory"):
        open_store(tmp_path / "store")


# -- signing and planted pickles -----------------------------------------------------------


def test_a_tampered_record_fails_its_signature(store):
    store.put("r/x/s/a", {"n": 1}, b"body")
    raw = store._rows.cache.get("r/x/s/a")
    store._rows.cache.set("r/x/s/a", raw[:-1] + b"B")
    with pytest.raises(CorruptRecord, match="failed its signature check"):
        store.get("r/x/s/a")


def test_a_record_moved_to_another_key_fails_its_signature(store):
    store.put("r/x/s/a", {"n": 1}, b"body")
    store._rows.cache.set("r/x/s/b", store._rows.cache.get("r/x/s/a"))
    with pytest.raises(CorruptRecord, match="'r/x/s/b' failed its signature"):
        store.get("r/x/s/b")


def test_a_record_signed_with_another_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDURABLE_KEY", "the first key, long enough")
    with open_store(tmp_path / "store") as s:
        s.put("r/x/s/a", {"n": 1})
    monkeypatch.setenv("NBDURABLE_KEY", "another key, long enough too")
    # On open, a store that does not verify is a StoreError (one line in the magic),
    # not one unusable record: no step may run unrecorded against it.
    with pytest.raises(StoreError, match="cannot be verified.*another store key"):
        open_store(tmp_path / "store")


@pytest.mark.parametrize("padding", [0, 100_000], ids=["inline", "in-a-file"])
def test_a_planted_pickle_is_refused_without_unpickling(store, tmp_path, padding):
    target = tmp_path / "pwned"
    key = RunKeys("nb.ipynb").step("name:plan")
    plant(store, key, Planted(target, padding))
    plant(store, "b/" + "0" * 64, Planted(target, padding))
    with diskcache.Cache(str(store.cache_dir)) as raw:  # the row really is a pickle
        (mode,) = raw._sql("SELECT mode FROM Cache WHERE key = ?", (key,)).fetchone()
    assert mode == diskcache.core.MODE_PICKLE
    assert not target.exists()

    with pytest.raises(CorruptRecord, match="refusing a store value"):
        store.get(key)
    with pytest.raises(CorruptRecord):
        store.get_blob("0" * 64)
    assert not target.exists(), "the planted pickle ran"


def test_the_engine_ignores_a_planted_record_with_a_warning(store, tmp_path):
    target = tmp_path / "pwned"
    session = Session(None)
    session.set_store(store, "nb.ipynb")
    plant(store, session.keys.step("name:plan"), Planted(target))
    with pytest.warns(NbdurableWarning, match="step 'plan': its record cannot be used"):
        assert session.steps.load_record("name:plan", "plan") is None
    assert not target.exists()


# -- format version ------------------------------------------------------------------------


def test_format_version_is_written_and_checked_on_open(tmp_path):
    path = tmp_path / "store"
    with open_store(path) as s:
        assert s.get("meta/format")[0]["format"] == STORE_FORMAT == 3
        s.put("meta/format", {"format": STORE_FORMAT + 1})
    with pytest.raises(FormatVersionError) as err:
        open_store(path)
    message = str(err.value)
    assert str(path) in message
    assert f"format {STORE_FORMAT + 1}" in message and f"format {STORE_FORMAT}." in message
    assert "Upgrade nbdurable, or set NBDURABLE_DIR" in message
    assert isinstance(err.value, StoreError) and isinstance(err.value, OSError)


@pytest.mark.parametrize("bad", [0, "2", None])
def test_a_format_this_version_does_not_read_is_refused(tmp_path, bad):
    path = tmp_path / "store"
    with open_store(path) as s:
        s.put("meta/format", {"format": bad, "store": "0" * 32})
    with pytest.raises(FormatVersionError, match=f"has format {bad};"):
        open_store(path)


def test_a_store_of_the_first_format_is_upgraded_so_an_earlier_version_refuses_it(tmp_path):
    """nbdurable 0.1 opens only format 1: a store holding records of the second signing
    scheme (which it would find foreign, and its check delete) says format 2.
    """
    path = tmp_path / "store"
    with open_store(path) as s:
        old = codec.encode(s._macs.v1, "r/x/s/a", {"n": 1}, b"", magic=codec.MAGIC)
        s.write({"r/x/s/a": old})
        s.put("meta/format", {"format": FORMAT_VERSION, "created": 5.0})  # as 0.1 made it
    with open_store(path) as s:
        fmt = s.get("meta/format")[0]
        assert fmt["format"] == 2 and fmt["created"] == 5.0 and len(fmt["store"]) == 32
        assert s.get("r/x/s/a")[0] == {"n": 1}  # its records still verify


def test_a_record_of_a_newer_format_is_refused(store):
    store.put("r/x/s/b", {"format": RECORD_FORMAT})
    assert store.get("r/x/s/b")[0]["format"] == RECORD_FORMAT
    store.put("r/x/s/a", {"format": RECORD_FORMAT + 1})
    with pytest.raises(CorruptRecord, match="newer than this nbdurable reads"):
        store.get("r/x/s/a")


# -- never evicts ----------------------------------------------------------------------------


def test_eviction_policy_is_none_and_stays_none(store):
    assert store._rows.cache.eviction_policy == "none"
    assert store._rows.cache.cull_limit == 0
    with diskcache.Cache(str(store.cache_dir)) as plain:  # opened with diskcache's defaults
        assert plain.eviction_policy == "none"


def test_nothing_is_evicted_past_the_size_limit(store):
    store._rows.cache.reset("size_limit", 4096)
    for i in range(300):
        store.put(f"r/x/u/s/{i:03d}", {"i": i}, os.urandom(1000))
    assert store.stats("r/x/u/s/")[0] == 300
    assert store.get("r/x/u/s/000") is not None


# -- atomic writes and prefix scans ----------------------------------------------------------


def test_apply_is_all_or_nothing(store, monkeypatch):
    store.put("r/x/s/old", {"n": 0})

    def disk_full(key, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store._rows.cache, "delete", disk_full)
    with pytest.raises(StoreError, match="Nothing was recorded"):
        store.apply(
            puts=[("r/x/s/a", {"n": 1}, b""), ("r/x/s/b", {"n": 2}, b"")],
            deletes=["r/x/s/old"],
        )
    monkeypatch.undo()
    assert store.get("r/x/s/a") is None and store.get("r/x/s/b") is None
    assert store.get("r/x/s/old") == ({"n": 0}, b"")

    written = store.apply(puts=[("r/x/s/a", {"n": 1}, b"")], deletes=["r/x/s/old"])
    assert written == store.size_of("r/x/s/a")
    assert store.scan("r/x/s/") == ["r/x/s/a"]


def test_scans_are_index_range_searches(store):
    """Per-step cost stays constant: listing one step never walks the whole store."""
    issued: list[str] = []
    store._rows.cache._con.set_trace_callback(issued.append)
    try:
        store.scan("r/x/s/")
        store.stats("r/x/u/")
        store.size_of("r/x/s/a")
    finally:
        store._rows.cache._con.set_trace_callback(None)
    assert len(issued) == 3, issued
    for sql in issued:
        plan = " ".join(row[-1] for row in store._rows.cache._sql("EXPLAIN QUERY PLAN " + sql))
        assert plan.startswith("SEARCH Cache USING") and "INDEX" in plan, (sql, plan)


def test_finding_a_saved_cell_fingerprints_each_cell_once_per_read(tmp_path, monkeypatch):
    """Per-step cost stays constant: locating a step does not re-hash the whole notebook."""
    cells = [{"cell_type": "code", "source": f"%%step s{i}\nx = {i}"} for i in range(200)]
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 4, "cells": cells}))
    hashed = []
    real = locate.source_fingerprint
    monkeypatch.setattr(locate, "source_fingerprint", lambda src: hashed.append(src) or real(src))
    nbf = locate.NotebookFile(path)
    for i in range(100):
        assert nbf.refresh()
        assert nbf.find(f"x = {i}").index == i
    assert len(hashed) == 200 + 100


def test_a_recorded_sub_step_header_is_a_sub_record(store, monkeypatch):
    # The sub-step hot path builds SubRecord's header by hand: it must stay that schema.
    from nbdurable.durable import session as engine
    from nbdurable.durable import substeps
    from nbdurable.store.records import SubRecord

    monkeypatch.setattr(engine, "_session", None)
    session = engine.get_session()
    session.set_store(store, "nb.ipynb")
    session.current = StepContext("name:s", "s")
    try:
        assert substeps.step("call", _shout, "abc") == "ABC"
        header, body = store.get(session.keys.sub("name:s", "call"))
    finally:
        session.current = None
    rec = SubRecord.from_header(header)
    assert (rec.run, rec.scope, rec.id) == ("nb.ipynb", "name:s", "call")
    assert rec.fn == f"{__name__}._shout"
    assert rec.size == len(body) and rec.type == "str" and rec.format == FORMAT_VERSION
    assert rec.to_header() == header


def _shout(text: str) -> str:
    return text.upper()


def _in_step(store: Store, monkeypatch: pytest.MonkeyPatch) -> object:
    """A fresh session on ``store`` whose current step is ``name:s`` (as a restart gives)."""
    from nbdurable.durable import session as engine

    monkeypatch.setattr(engine, "_session", None)
    session = engine.get_session()
    session.set_store(store, "nb.ipynb")
    session.current = StepContext("name:s", "s")
    return session


@pytest.mark.parametrize("total_max", [32 * 1024 * 1024, 1_000], ids=["in-memory", "over-cap"])
def test_a_steps_sub_steps_replay_from_one_read(store, monkeypatch, total_max):
    from nbdurable.durable import substeps
    from nbdurable.store import base as store_mod

    monkeypatch.setattr(store_mod, "LOAD_TOTAL_MAX", total_max)
    values = {f"call:{i}": ("v" * (i * 5_000)) + str(i) for i in range(12)}  # 0 B to 55 KB
    made = []

    def call(v: str) -> str:  # the same function replays (an edited one is called again)
        made.append(v)
        return v

    _in_step(store, monkeypatch)
    for sid, v in values.items():
        assert substeps.step(sid, call, v) == v
    session = _in_step(store, monkeypatch)
    reads = []
    real = Store.load_prefix
    monkeypatch.setattr(Store, "load_prefix", lambda s, p: reads.append(p) or real(s, p))
    assert len(made) == len(values)
    for sid, v in values.items():
        assert substeps.step(sid, call, v) == v
    assert len(made) == len(values), "a recorded sub-step was called again"
    assert reads == [session.keys.subs_prefix("name:s")]  # one range read for the step
    assert set(session.current.sub_index._entries.values()) == {None}  # bytes handed out once
    assert substeps.step("call:new", lambda: "fresh") == "fresh"  # a miss needs no read
    assert reads == [session.keys.subs_prefix("name:s")]


def test_a_tampered_sub_step_in_the_step_read_is_called_again(store, monkeypatch):
    from nbdurable.durable import substeps

    session = _in_step(store, monkeypatch)
    substeps.step("call", lambda: "recorded")
    key = session.keys.sub("name:s", "call")
    raw = bytearray(store.read(key))
    raw[-1] ^= 1
    store._rows.cache.set(key, bytes(raw))
    _in_step(store, monkeypatch)
    with pytest.warns(NbdurableWarning, match="'call' of step 's': its record cannot be used"):
        assert substeps.step("call", lambda: "called again") == "called again"


def test_the_run_scope_index_lives_one_cell_and_never_calls_twice(store, monkeypatch):
    from nbdurable.durable import session as engine
    from nbdurable.durable import substeps
    from nbdurable.ipython.magic import _pre_run_cell

    monkeypatch.setattr(engine, "_session", None)
    session = engine.get_session()
    session.set_store(store, "nb.ipynb")
    calls = []

    def fetch(q: str) -> str:
        calls.append(q)
        return q.upper()

    _pre_run_cell()  # a cell starts: the run scope gets a fresh index
    assert substeps.step("q", fetch, "a") == "A"
    assert substeps.step("q", fetch, "a") == "A"  # same cell, same id: replayed, not re-run
    assert calls == ["a"]
    _pre_run_cell()
    reads = []
    real = Store.load_prefix
    monkeypatch.setattr(Store, "load_prefix", lambda s, p: reads.append(p) or real(s, p))
    assert [substeps.step(f"q{i}", fetch, str(i)) for i in range(3)] == ["0", "1", "2"]
    assert substeps.step("q", fetch, "a") == "A" and substeps.step("q", fetch, "a") == "A"
    assert calls == ["a", "0", "1", "2"] and len(reads) == 1
    # A delete in this process (e.g. %step clear in the same cell) makes it read again.
    store.delete(session.keys.sub(RUN_SCOPE, "q"))
    assert substeps.step("q", fetch, "a") == "A" and calls[-1] == "a" and len(reads) == 2


@pytest.mark.parametrize("planted", ["text", 1.5, -3, 2**62, 10**9], ids=repr)
def test_a_planted_non_bytes_row_is_a_corrupt_record(store, monkeypatch, planted):
    from nbdurable.durable import substeps

    session = _in_step(store, monkeypatch)
    key = session.keys.sub("name:s", "call")
    with diskcache.Cache(str(store.cache_dir)) as raw:  # diskcache keeps numbers raw
        raw.set(key, planted)
    with pytest.raises(CorruptRecord):
        store.get(key)
    with pytest.warns(NbdurableWarning, match="its record cannot be used"):
        assert substeps.step("call", lambda: "called") == "called"  # through the step read


def test_a_store_deleted_during_a_step_is_not_replayed_from(store, monkeypatch):
    import shutil

    from nbdurable.durable import substeps

    made = []

    def call(i: int) -> str:
        made.append(i)
        return f"recorded {i}"

    _in_step(store, monkeypatch)
    for i in range(2):
        substeps.step(f"c{i}", call, i)
    _in_step(store, monkeypatch)
    assert substeps.step("c0", call, 0) == "recorded 0"  # the step's records are read
    assert made == [0, 1]
    shutil.rmtree(store.path)
    with pytest.raises(StoreError, match="deleted or replaced while in use"):
        substeps.step("c1", call, 1)
    assert substeps.step("c1", lambda: "new store") == "new store"  # reopened, empty


def test_a_failed_sub_step_can_be_retried_with_the_same_id(store, monkeypatch):
    from nbdurable.durable import substeps

    _in_step(store, monkeypatch)
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise TimeoutError("rate limited")
        return "answer"

    for _ in range(3):  # a retry loop inside one step
        try:
            assert substeps.step("ask", flaky) == "answer"
            break
        except TimeoutError:
            continue
    assert len(attempts) == 3
    with pytest.raises(UsageProblem, match="already used in this step"):
        substeps.step("ask", flaky)  # a second *successful* use is still refused


def test_stats_by_scope_is_stats_of_each_scope_in_one_read(any_store):
    """A view of many steps reads every scope's (count, bytes) in one statement; each
    is what stats() says of that scope alone, on every engine."""
    from nbdurable.store.base import Store

    prefix = "r/0123456789abcdef/u/"
    # random bytes: a small sub-step record is stored deflated where that is shorter
    any_store.put(prefix + "name:a/1", {"kind": "sub"}, os.urandom(10))
    any_store.put(prefix + "name:a/2", {"kind": "sub"}, os.urandom(300))
    any_store.put(prefix + "name:a.b/1", {"kind": "sub"}, b"y")
    any_store.put(prefix + "~run/k/with/slashes", {"kind": "sub"}, b"z" * 7)
    any_store.put(prefix + "loose", {"kind": "sub"}, b"")  # no "/" after the scope
    any_store.put(prefix + "name:a-", {"kind": "sub"}, b"")  # sorts between scopes
    any_store.put(prefix + "name:a-/1", {"kind": "sub"}, b"w")
    any_store.put("r/0123456789abcdef/s/name:a", {"kind": "step"}, b"")  # not under prefix
    got = any_store.stats_by_scope(prefix)
    assert set(got) == {"name:a", "name:a.b", "name:a-", "~run"}  # "loose": no "/", no scope
    for scope in ("name:a", "name:a.b", "name:a-", "~run"):
        assert got[scope] == any_store.stats(f"{prefix}{scope}/")
    assert got["name:a"][0] == 2 and got["name:a"][1] > 310
    assert Store.stats_by_scope(any_store, prefix) == got  # the default agrees with the engine
    assert any_store.stats_by_scope("r/fedcba9876543210/u/") == {}
