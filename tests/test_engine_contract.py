"""The engine contract: every engine behaves the same under the Store interface.

One suite, run on the embedded engine (a diskcache directory), the team
engine (PostgreSQL) and a dict-backed engine that implements only the
abstract primitives (``tests/memory_store.py``): records round-trip and are
signed under their key, blobs are stored once by content, ranges cover
exactly their prefix, ``apply`` writes and deletes together, the lease's
compare-and-set holds, and RunView, the listing and clear/pin work on top
unchanged. What only one engine has (diskcache's files, PostgreSQL's chunks,
namespaces and sessions) is tested in tests/test_store.py and
tests/test_postgres.py.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import pytest
from memory_store import MemoryStore
from test_ops import RK, RUN, record, sub

from nbdurable import commands, status
from nbdurable.durable import lease
from nbdurable.errors import CorruptRecord, LeaseHeld
from nbdurable.store import RunKeys, RunView, layout, open_store, values


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres), "memory"])
def engine(request, tmp_path):
    """A fresh store of each engine."""
    if request.param == "memory":
        yield MemoryStore()
        return
    target = tmp_path / "store" if request.param == "disk" else request.getfixturevalue("pg_url")
    store = open_store(target)
    yield store
    store.close()


def _tamper(store, key: str, at: int = -1) -> None:
    raw = bytearray(store.read(key))
    raw[at] ^= 1
    store.write({key: bytes(raw)})


def test_round_trip_and_absent_keys(engine):
    size = engine.put("r/x/s/a", {"n": 1, "text": "é"}, b"\x00body")
    assert engine.get("r/x/s/a") == ({"n": 1, "text": "é"}, b"\x00body")
    assert size == engine.size_of("r/x/s/a") > len(b"\x00body")
    assert engine.get("r/x/s/missing") is None and engine.size_of("r/x/s/missing") == 0
    assert engine.has("r/x/s/a") and not engine.has("r/x/s/missing")
    assert engine.delete("r/x/s/a") and engine.get("r/x/s/a") is None
    assert not engine.delete("r/x/s/a")


def test_records_are_signed_under_their_key(engine):
    assert engine.get(layout.FORMAT_KEY)[0]["format"] == 3, "the format record is written on open"
    engine.put("r/x/s/a", {"n": 1}, b"body")
    engine.put("r/x/s/c", {"n": 2}, b"body")
    engine.write({"r/x/s/b": engine.read("r/x/s/a")})  # a record copied under another key
    with pytest.raises(CorruptRecord):
        engine.get("r/x/s/b")
    _tamper(engine, "r/x/s/a")
    with pytest.raises(CorruptRecord, match="signature"):
        engine.get("r/x/s/a")
    assert engine.get("r/x/s/c") == ({"n": 2}, b"body"), "the other records still verify"


def test_blobs_are_stored_once_by_content_small_and_large(engine):
    for value in (["small"], list(range(10_000))):
        stream, buffers = values.dumps_parts(value)
        sha, written = engine.put_blob(stream, buffers)
        assert written > 0 and engine.put_blob(stream, buffers) == (sha, 0), "once by content"
        blob = engine.get_blob(sha)
        assert values.loads(blob.stream, None, blob.buffers) == value
    sha, _ = engine.put_blob(b"value")
    assert bytes(engine.get_blob(sha).stream) == b"value" and engine.get_blob(sha).buffers == []
    assert engine.get_blob("0" * 64) is None


def test_ranges_cover_exactly_their_prefix(engine):
    sizes = {
        key: engine.put(key, {"k": key}, body)
        for key, body in [
            ("r/x/s/a", b"1"),
            ("r/x/s/b", b"x" * 50_000),  # large: diskcache keeps it in a file
            ("r/x/s0", b"2"),
            ("r/x/sa", b"3"),
            ("r/x/t/a", b"4"),
            ("r/y/s/a", b"5"),
        ]
    }
    assert engine.scan("r/x/s/") == ["r/x/s/a", "r/x/s/b"]
    assert engine.stats("r/x/s/") == (2, sizes["r/x/s/a"] + sizes["r/x/s/b"])
    assert engine.stats("r/x/") == (5, sum(v for k, v in sizes.items() if k.startswith("r/x/")))
    assert engine.scan("r/z/") == [] and engine.stats("r/z/") == (0, 0)
    assert engine.size_of("r/x/s/b") == sizes["r/x/s/b"] > 50_000


def test_apply_writes_and_deletes_in_one_call_and_load_prefix_reads_a_range(engine):
    rk = RunKeys("nb.ipynb")
    engine.put(rk.meta, {"run": "nb.ipynb", "last": 1.0})
    engine.apply(puts=[(rk.step(f"k{i}"), {"i": i}, b"x" * i) for i in range(5)])
    header, body = engine.get(rk.step("k3"))
    # stamped with its step's generation (see nbdurable.store.manifest)
    assert header == {"i": 3, "gen": header["gen"]} and isinstance(header["gen"], int)
    assert body == b"xxx"
    assert engine.scan(rk.steps) == [rk.step(f"k{i}") for i in range(5)]
    loaded = engine.load_prefix(rk.steps)
    assert [engine.get_loaded(k, v)[0]["i"] for k, v in loaded.items()] == [0, 1, 2, 3, 4]
    written = engine.apply(puts=[(rk.step("k9"), {"i": 9}, b"")], deletes=[rk.step("k0")])
    assert written == engine.size_of(rk.step("k9"))
    assert not engine.has(rk.step("k0")) and engine.has(rk.step("k9"))


def test_swap_is_the_leases_compare_and_set(engine):
    assert engine.swap("r/x/lease", lambda cur: {"who": "a"}) is None
    with pytest.raises(RuntimeError):
        engine.swap("r/x/lease", lambda cur: (_ for _ in ()).throw(RuntimeError("held")))
    assert engine.get("r/x/lease")[0] == {"who": "a"}, "a refused swap leaves the record"
    assert engine.swap("r/x/lease", lambda cur: None) == {"who": "a"}
    assert not engine.has("r/x/lease")

    first = lease.Lease(engine, RUN, "first")
    first.acquire()
    assert lease.read(engine, RUN).token == first.token
    first.release()
    assert lease.read(engine, RUN) is None
    # A live holder on this host (our parent process) refuses the lease, and keeps it.
    now = time.time()
    holder = lease.Holder(socket.gethostname(), os.getppid(), "", "someone", now, now, "other")
    engine.put(RK.lease, dataclasses.asdict(holder))
    with pytest.raises(LeaseHeld, match="is being recorded by"):
        lease.Lease(engine, RUN, "second").acquire()
    assert lease.read(engine, RUN) == holder


def test_runview_listing_and_commands_work_unchanged(engine):
    record(engine, "name:a")
    record(engine, "name:b", input_from={"x": "name:a"})
    sub(engine, "name:a", "call")
    view = RunView(engine, RUN)
    assert set(view.records()) == {"name:a", "name:b"} and view.sub_stats("name:a")[0] == 1
    done = commands.clear_steps(engine, RUN, ["a"])
    assert done.message == "cleared: a; invalidated dependants: b"
    rows = {i.label: i.state for i in status.step_infos(engine, RUN)}
    assert rows == {"b": "invalidated"} and view.sub_stats("name:a")[0] == 0
    assert commands.pin_steps(engine, RUN, ["b"]).message == "pinned: b"
    assert view.state("name:b").pinned
