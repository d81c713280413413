"""The team store on a real PostgreSQL server: records, blobs, keys, schema, faults, leases, copy.

Every test works in a namespace (a PostgreSQL schema) of its own, dropped
afterwards (see the ``pg_url`` fixture); the server is NBDURABLE_TEST_PG, and
these tests fail, never skip, when none answers. Faults are real: sessions
are ended with ``pg_terminate_backend`` from another connection.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import asdict

import numpy as np
import psycopg
import pytest
from pg_util import TurnCounter, namespace, pg_sql, terminate

from nbdurable.cli import main
from nbdurable.durable import lease
from nbdurable.errors import (
    CorruptRecord,
    FormatVersionError,
    LeaseHeld,
    LeaseLost,
    StoreError,
)
from nbdurable.store import RunKeys, Store, admin, layout, open_store, values
from nbdurable.store.copy import copy_run
from nbdurable.store.postgres import PgStore, display

pytestmark = pytest.mark.postgres


def _array_blob(store: Store, n: int) -> tuple[str, np.ndarray]:
    arr = np.arange(n, dtype=np.float64)
    stream, bufs = values.dumps_parts(arr)
    sha, written = store.put_blob(stream, bufs)
    assert written > 0
    return sha, arr


def _load(store: Store, sha: str) -> object:
    blob = store.get_blob(sha)
    assert blob is not None
    return values.loads(blob.stream, buffers=blob.buffers)


def _chunks(url: str) -> int:
    return pg_sql(url, f'SELECT count(*) FROM "{namespace(url)}".chunks')[0][0]


# -- selection and records ----------------------------------------------------------


def test_a_url_opens_the_postgres_engine_and_a_directory_the_embedded_one(pg_url, tmp_path):
    with open_store(pg_url) as a, open_store(pg_url) as b, open_store(tmp_path / "d") as c:
        assert type(a) is PgStore and type(b) is PgStore
        assert type(c).__name__ == "DiskStore"
        assert a.path == b.path and a.path.endswith(f"/test?namespace={namespace(pg_url)}")
    with pytest.raises(StoreError, match="unknown store URL mysql://"):
        open_store("mysql://x@y/z")


def test_namespaces_are_apart(pg_url, pg_server):
    other = pg_url.replace("namespace=t_", "namespace=u_")
    try:
        with open_store(pg_url) as a, open_store(other) as b:
            a.put("r/x/meta", {"a": 1})
            assert b.get("r/x/meta") is None
            assert a.get("r/x/meta") == ({"a": 1}, b"")
    finally:
        pg_sql(pg_server, f'DROP SCHEMA IF EXISTS "{namespace(other)}" CASCADE')


# -- blobs ----------------------------------------------------------------------------


def test_a_blob_spanning_many_chunks_streams_both_ways(pg_url):
    url = pg_url + "&chunk_size=65536"
    with open_store(url) as s:
        sha, arr = _array_blob(s, 400_000)  # 3.2 MB: about 49 chunks of 64 KB
        size = s.size_of(layout.blob(sha))
        assert _chunks(url) == -(-size // 65536) > 40
        assert np.array_equal(_load(s, sha), arr)
        # Stored once by content: a second write adds nothing, not even chunks.
        stream, bufs = values.dumps_parts(arr)
        assert s.put_blob(stream, bufs) == (sha, 0)
        assert _chunks(url) == -(-size // 65536)
        assert s.check() == []
    with open_store(url) as fresh:  # another process, another connection
        assert np.array_equal(_load(fresh, sha), arr)


def test_a_damaged_chunk_is_refused_then_rewritten(pg_url):
    url = pg_url + "&chunk_size=65536"
    ns = namespace(url)
    with open_store(url) as s:
        sha, arr = _array_blob(s, 100_000)
        pg_sql(
            url,
            f'UPDATE "{ns}".chunks SET data = set_byte(data, 9, (get_byte(data, 9) + 1) %% 256) '
            "WHERE n = 3",
        )
        with pytest.raises(CorruptRecord, match="SHA-256"):
            s.get_blob(sha)
        stream, bufs = values.dumps_parts(arr)
        assert s.put_blob(stream, bufs)[1] > 0  # suspect: written again
        assert np.array_equal(_load(s, sha), arr)
        assert s.check() == []


def test_check_removes_a_blob_with_lost_chunks(pg_url):
    url = pg_url + "&chunk_size=65536"
    with open_store(url) as s:
        sha, _ = _array_blob(s, 100_000)
        pg_sql(url, f'DELETE FROM "{namespace(url)}".chunks WHERE n = 2')
        problems = s.check(fix=False)
        assert len(problems) == 1 and "not" in problems[0] and "removed" not in problems[0]
        assert "removed" in s.check(fix=True)[0]
        assert s.get_blob(sha) is None and s.check() == []


# -- the key and the schema ------------------------------------------------------------


def test_no_key_no_store(pg_url, monkeypatch):
    monkeypatch.delenv("NBDURABLE_KEY")
    with pytest.raises(StoreError) as info:
        open_store(pg_url)
    message = str(info.value)
    assert "NBDURABLE_KEY" in message and "\n" not in message
    assert (
        pg_sql(pg_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", (namespace(pg_url),)) == []
    ), "nothing was created without a key"


def test_the_key_is_never_stored_and_another_key_is_refused(pg_url, monkeypatch):
    import os

    key = os.environ["NBDURABLE_KEY"]
    with open_store(pg_url) as s:
        s.put("r/x/meta", {"a": 1})
    ns = namespace(pg_url)
    found = pg_sql(
        pg_url,
        f'SELECT count(*) FROM "{ns}".kv WHERE position(%s::bytea in value) > 0',
        (key.encode(),),
    )
    assert found == [(0,)]
    monkeypatch.setenv("NBDURABLE_KEY", "another-team-key-0123456789")
    with pytest.raises(StoreError) as info:
        open_store(pg_url)
    assert "another store key" in str(info.value) and "namespace" in str(info.value)


def test_a_newer_schema_is_refused_in_one_line(pg_url):
    open_store(pg_url).close()
    pg_sql(pg_url, f'UPDATE "{namespace(pg_url)}".schema_version SET version = 99')
    with pytest.raises(FormatVersionError) as info:
        open_store(pg_url)
    assert "layout 99" in str(info.value) and "Upgrade nbdurable" in str(info.value)
    assert "\n" not in str(info.value)


# -- faults across the network ------------------------------------------------------------


def test_a_server_that_is_down_at_startup_is_one_line_naming_the_url(monkeypatch):
    monkeypatch.setenv("NBDURABLE_KEY", "k" * 20)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://alice:s3cret@127.0.0.1:{port}/test?namespace=x"
    with pytest.raises(StoreError) as info:
        open_store(url)
    message = str(info.value)
    assert f"postgresql://alice@127.0.0.1:{port}/test" in message
    assert "s3cret" not in message and "\n" not in message
    assert "start the PostgreSQL server" in message


def test_sessions_killed_between_writes_lose_nothing_and_record_nothing_twice(pg_url):
    with open_store(pg_url) as s:
        rk = RunKeys("r")
        for i in range(40):
            if i % 5 == 0:
                assert terminate(pg_url) >= 1 or i == 0
            s.put(rk.sub("~run", f"c{i}"), {"i": i}, b"v")
        assert [s.get(k)[0]["i"] for k in s.scan(rk.all_subs)] == sorted(range(40), key=str)
        count = pg_sql(
            pg_url, f"SELECT count(*) FROM \"{namespace(pg_url)}\".kv WHERE key LIKE 'r/%%'"
        )
        assert count == [(41,)]  # and the run's manifest


def test_the_main_thread_keeps_its_connection_while_threads_share_the_pool(pg_url):
    """The recording thread keeps one session across records; threads record alongside it."""
    with open_store(pg_url) as s:
        s.put("r/x/first", {}, b"")
        held = s._held
        pid = held.info.backend_pid
        errors: list[BaseException] = []

        def record(t: int) -> None:
            try:
                for i in range(20):
                    s.put(f"r/x/t{t}-{i}", {"t": t}, b"v")
            except BaseException as exc:  # reported below, not lost in the thread
                errors.append(exc)

        threads = [threading.Thread(target=record, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for i in range(20):
            s.put(f"r/x/main-{i}", {}, b"v")
        for th in threads:
            th.join(60)
        assert not errors
        assert s._held is held and held.info.backend_pid == pid, "one session for the main thread"
        assert len(s.scan("r/x/t")) == 160 and len(s.scan("r/x/main-")) == 20
        terminate(pg_url)  # its session too: the next record reconnects
        s.put("r/x/after", {}, b"v")
        assert s._held is not held and s.get("r/x/after") is not None


def test_a_record_the_server_refuses_is_one_line_and_the_next_one_lands(pg_url):
    """A single record goes as a prepared statement: a server error still reads as one line."""
    with open_store(pg_url) as s:
        s.put("r/x/a", {"i": 1}, b"v")  # prepared on this connection
        ns = namespace(pg_url)
        pg_sql(pg_url, f'ALTER TABLE "{ns}".kv ADD CONSTRAINT small CHECK (size < 100)')
        with pytest.raises(StoreError) as info:
            s.put("r/x/b", {"i": 2}, b"v" * 200)
        message = str(info.value)
        assert "small" in message and "Nothing was recorded" in message and "\n" not in message
        pg_sql(pg_url, f'ALTER TABLE "{ns}".kv DROP CONSTRAINT small')
        s.put("r/x/b", {"i": 2}, b"v" * 200)  # the same connection, the same statement
        assert s.get("r/x/b")[0] == {"i": 2} and s.get("r/x/a")[0] == {"i": 1}


def test_a_session_killed_in_the_middle_of_a_blob_write(pg_url, monkeypatch):
    """The write's transaction is lost with its session; the retry writes it whole, once."""
    from nbdurable.store import _pg

    url = pg_url + "&chunk_size=65536"
    real = _pg.ChunkWriter._insert
    killed = []

    def insert(self, chunk):
        if self.n == 10 and not killed:  # half way through the first attempt
            killed.append(terminate(url))
        return real(self, chunk)

    monkeypatch.setattr(_pg.ChunkWriter, "_insert", insert)
    with open_store(url) as s:
        sha, arr = _array_blob(s, 200_000)
        assert killed and killed[0] >= 1, "the session writing the blob was ended"
        assert np.array_equal(_load(s, sha), arr)
        size = s.size_of(layout.blob(sha))
        assert _chunks(url) == -(-size // 65536), "the lost attempt left no chunks behind"
        assert s.check() == []


def test_a_step_record_whose_session_ends_commits_whole_once(pg_url, monkeypatch):
    """apply() is one statement: its session ended, the retry writes every record of it once."""
    import psycopg as pg_mod

    with open_store(pg_url) as s:
        rk = RunKeys("r")
        real = pg_mod.Connection.execute
        sent = []

        def execute(self, query, params=None, **kw):
            if "unnest" in str(query):
                sent.append(query)
                if len(sent) == 1:  # the session ends before the records are sent
                    terminate(pg_url)
            return real(self, query, params, **kw)

        monkeypatch.setattr(pg_mod.Connection, "execute", execute)
        s.apply(puts=[(rk.step(f"k{i}"), {"i": i}, b"") for i in range(10)])
        assert len(sent) == 2, "the write was sent again on a new session"
        assert [s.get(k)[0]["i"] for k in s.scan(rk.steps)] == list(range(10))
        count = pg_sql(
            pg_url, f"SELECT count(*) FROM \"{namespace(pg_url)}\".kv WHERE key LIKE 'r/%%'"
        )
        assert count == [(11,)]  # and the run's manifest, written with them


def test_a_step_record_is_three_round_trips_and_a_sub_step_one(pg_url):
    """The manifest's transaction is pipelined: BEGIN, its lock and the manifest's read go
    together, then the records with the count of the step's rows, then the manifest with
    COMMIT; a sub-step's record stays one prepared statement."""
    relay = TurnCounter(pg_url)
    try:
        with open_store(relay.url) as s:
            rk = RunKeys("r")
            s.apply([(rk.step("first"), {"i": 0}, b"")])  # the run's manifest is made
            s.apply([(rk.sub("first", "warm"), {"i": 0}, b"")])  # the statement is prepared
            relay.turns = 0
            s.apply([(rk.step("second"), {"i": 1}, b"")])
            assert relay.count() == 3
            relay.turns = 0
            s.apply([(rk.sub("second", "call"), {"i": 2}, b"")])
            assert relay.count() == 1
            assert s.get(rk.step("second"))[0]["i"] == 1
            assert s.get(rk.sub("second", "call"))[0]["i"] == 2
    finally:
        relay.close()


def test_a_manifest_refused_at_commit_leaves_neither_it_nor_its_record(pg_url):
    """A write whose error the server gives only with COMMIT's answer (pipeline mode) rolls
    back the whole transaction: no record without its manifest, and the next one lands."""
    ns = namespace(pg_url)
    with open_store(pg_url) as s:
        rk = RunKeys("r")
        s.apply([(rk.step("a"), {"i": 0}, b"")])
        before = pg_sql(pg_url, f'SELECT value FROM "{ns}".kv WHERE key = %s', (rk.manifest,))
        pg_sql(
            pg_url,
            f'CREATE FUNCTION "{ns}".refuse() RETURNS trigger LANGUAGE plpgsql AS '
            "$$ BEGIN IF NEW.key LIKE '%%/manifest' THEN RAISE EXCEPTION 'refused here'; "
            "END IF; RETURN NEW; END $$",
        )
        pg_sql(
            pg_url,
            f'CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON "{ns}".kv '
            f'FOR EACH ROW EXECUTE FUNCTION "{ns}".refuse()',
        )
        with pytest.raises(StoreError, match="refused here"):
            s.apply([(rk.step("b"), {"i": 1}, b"")])
        assert not s.has(rk.step("b"))
        after = pg_sql(pg_url, f'SELECT value FROM "{ns}".kv WHERE key = %s', (rk.manifest,))
        assert after == before
        pg_sql(pg_url, f'DROP TRIGGER refuse ON "{ns}".kv')
        s.apply([(rk.step("b"), {"i": 2}, b"")])
        assert s.get(rk.step("b"))[0]["i"] == 2
        assert s.get(rk.step("a"))[0]["i"] == 0
    with open_store(pg_url) as s:  # a fresh process's view: both records, one manifest
        assert [s.get(k)[0]["i"] for k in s.scan(rk.steps)] == [0, 2]


def test_a_slow_store_answers_within_the_statement_timeout(pg_url):
    url = pg_url + "&statement_timeout=1"
    key = RunKeys("r").lease
    with open_store(url) as s:
        s.put("r/x/meta", {})
        space = s._space
        # Another machine holds the lease row's lock and does not let go.
        with psycopg.connect(pg_server_of(url)) as other:
            other.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (space, key))
            started = time.monotonic()
            with pytest.raises(StoreError) as info:
                s.swap(key, lambda h: {"t": 1})
            assert time.monotonic() - started < 30
        assert "statement timeout" in str(info.value) and "\n" not in str(info.value)
        assert s.swap(key, lambda h: {"t": 1}) is None  # released: it works again


def pg_server_of(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url)._replace(query="").geturl()


# -- leases across machines ------------------------------------------------------------------


def test_swap_is_a_compare_and_set_across_stores(pg_url):
    stores = [open_store(pg_url) for _ in range(2)]
    key = "r/x/counter"

    def bump(s):
        for _ in range(25):
            s.swap(key, lambda h: {"n": (h or {"n": 0})["n"] + 1})

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stores[0].get(key)[0] == {"n": 100}
    for s in stores:
        s.close()


def test_a_lease_names_its_host_and_expires_across_machines(pg_url, monkeypatch):
    monkeypatch.setenv("NBDURABLE_LEASE_EXPIRY", "2")
    a_store, b_store = open_store(pg_url), open_store(pg_url)
    monkeypatch.setenv("NBDURABLE_HOST", "machine-a")
    a = lease.Lease(a_store, "shared.ipynb")
    a.acquire()
    a._stop.set()  # machine A goes silent: no more heartbeats
    monkeypatch.setenv("NBDURABLE_HOST", "machine-b")
    b = lease.Lease(b_store, "shared.ipynb")
    with pytest.raises(LeaseHeld, match="on machine-a"):
        b.acquire()
    deadline = time.monotonic() + 30
    while True:
        try:
            previous = b.acquire()
            break
        except LeaseHeld:
            assert time.monotonic() < deadline, "the silent holder never expired"
            time.sleep(0.2)
    assert previous is not None and previous.host == "machine-a"
    assert b.holds() and not a.holds()
    b.release()
    a_store.close()
    b_store.close()


# -- copy between engines and the admin commands -------------------------------------------------


def _run_with_blob(store: Store, run_id: str) -> tuple[str, np.ndarray]:
    rk = RunKeys(run_id)
    sha, arr = _array_blob(store, 50_000)
    var = {"name": "a", "kind": "value", "ref": sha, "fp": "", "size": 1, "type": "ndarray"}
    store.apply(
        puts=[
            (rk.meta, {"kind": "run", "run": run_id, "last": time.time()}, b""),
            (rk.step("s1"), {"run": run_id, "key": "s1", "variables": [var]}, b""),
            (rk.sub("s1", "call:0"), {"run": run_id}, b"pickled"),
        ]
    )
    return sha, arr


def test_copy_a_run_to_postgres_and_back(pg_url, tmp_path):
    src = open_store(tmp_path / "disk")
    sha, arr = _run_with_blob(src, "nb.ipynb")
    with open_store(pg_url) as pg:
        report = copy_run(src, pg, "nb.ipynb")
        assert (report.records, report.blobs) == (3, 1)
        assert np.array_equal(_load(pg, sha), arr)
        back = open_store(tmp_path / "back")
        copy_run(pg, back, "nb.ipynb")
        rk = RunKeys("nb.ipynb")
        assert sorted(back.scan(rk.base)) == sorted(src.scan(rk.base))
        # the same record, stamped with the generation of the store it is in (store.manifest)
        got, want = back.get(rk.sub("s1", "call:0")), src.get(rk.sub("s1", "call:0"))
        assert got[1] == want[1] and {**got[0], "gen": 0} == {**want[0], "gen": 0}
        assert np.array_equal(_load(back, sha), arr)
        with pytest.raises(Exception, match="already has records"):
            copy_run(src, pg, "nb.ipynb")


def test_a_tampered_record_aborts_the_copy_with_nothing_copied(pg_url, tmp_path):
    src = open_store(tmp_path / "disk")
    _run_with_blob(src, "nb.ipynb")
    rk = RunKeys("nb.ipynb")
    raw = bytearray(src.read(rk.sub("s1", "call:0")))
    raw[-1] ^= 1
    src.write({rk.sub("s1", "call:0"): bytes(raw)})
    with open_store(pg_url) as pg:
        with pytest.raises(StoreError) as info:
            copy_run(src, pg, "nb.ipynb")
        assert "nothing was copied" in str(info.value) and "\n" not in str(info.value)
        assert pg.scan("r/") == [] and pg.scan("b/") == []


def test_cli_ls_gc_check_and_copy_with_a_url(pg_url, tmp_path, capsys):
    src = open_store(tmp_path / "disk")
    _run_with_blob(src, "nb.ipynb")
    src.close()
    assert main(["copy", "nb.ipynb", "--from", str(tmp_path / "disk"), "--to", pg_url]) == 0
    out = capsys.readouterr().out
    assert "copied run 'nb.ipynb': 3 records and 1 saved variables" in out
    assert f"to {display(pg_url)}" in out
    assert main(["ls", "--store", pg_url, "--json"]) == 0
    import json

    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run"] for r in runs] == ["nb.ipynb"]
    assert main(["check", "--store", pg_url]) == 0
    assert "sound" in capsys.readouterr().out
    # ... and back to a directory, verified on the way.
    assert main(["copy", "nb.ipynb", "--from", pg_url, "--to", str(tmp_path / "back")]) == 0
    assert "copied run 'nb.ipynb': 3 records and 1 saved variables" in capsys.readouterr().out
    with open_store(tmp_path / "back") as back, open_store(tmp_path / "disk") as disk:
        rk = RunKeys("nb.ipynb")
        assert back.scan(rk.base) == disk.scan(rk.base)
    assert main(["check", "--store", str(tmp_path / "disk")]) == 0
    assert "sound" in capsys.readouterr().out
    assert main(["gc", "--store", pg_url, "--older-than", "0s"]) == 0
    assert "removed run 'nb.ipynb'" in capsys.readouterr().out
    with open_store(pg_url) as pg:
        assert admin.list_runs(pg) == [] and pg.scan("b/") == []
    assert main(["copy", "nb.ipynb", "--from", pg_url, "--to", str(tmp_path / "x")]) == 2
    assert "no run 'nb.ipynb'" in capsys.readouterr().err


def test_the_store_is_configured_else_nbdurable_store_else_the_directory(tmp_path, monkeypatch):
    import nbdurable
    from nbdurable import config
    from nbdurable.errors import UsageProblem

    url = "postgresql://team@db/runs?namespace=team1"
    monkeypatch.delenv("NBDURABLE_STORE", raising=False)
    assert config.chosen_store(tmp_path) == tmp_path
    monkeypatch.setenv("NBDURABLE_STORE", str(tmp_path / "elsewhere"))
    assert config.chosen_store(tmp_path) == tmp_path / "elsewhere"
    monkeypatch.setenv("NBDURABLE_STORE", url)
    assert config.chosen_store(tmp_path) == url
    try:
        nbdurable.configure(store=str(tmp_path / "configured"))
        assert config.chosen_store(tmp_path) == tmp_path / "configured"
    finally:
        nbdurable.configure(store=None)
    with pytest.raises(UsageProblem, match="postgresql:// URL"):
        nbdurable.configure(store=42)


# -- writes under a lease (fences) -------------------------------------------------------------


@pytest.fixture(params=["postgres", "disk"])
def two_machines(request, tmp_path, monkeypatch):
    """Machine A's lease lapsed (its heartbeats stalled) and machine B took the run over."""
    monkeypatch.setenv("NBDURABLE_LEASE_EXPIRY", "1")
    target = request.getfixturevalue("pg_url") if request.param == "postgres" else tmp_path
    a_store, b_store = open_store(target), open_store(target)
    monkeypatch.setenv("NBDURABLE_HOST", "machine-a")
    a = lease.Lease(a_store, "shared.ipynb")
    a.acquire()
    a._stop.set()  # A's heartbeat thread stalls
    a_store.apply(puts=[("r/x/mine", {"by": "a"}, b"")], fence=a.fence)
    monkeypatch.setenv("NBDURABLE_HOST", "machine-b")
    b = lease.Lease(b_store, "shared.ipynb")
    deadline = time.monotonic() + 30
    while True:
        try:
            b.acquire()
            break
        except LeaseHeld:
            assert time.monotonic() < deadline, "A's lease never lapsed"
            time.sleep(0.1)
    yield a_store, a, b_store, b
    b.release()
    a_store.close()
    b_store.close()


def test_a_holder_whose_lease_was_taken_over_cannot_write(two_machines):
    a_store, a, b_store, b = two_machines
    b_store.apply(puts=[("r/x/theirs", {"by": "b"}, b"")], fence=b.fence)
    # A's next records, whole transactions, single puts and deletes alike: refused.
    with pytest.raises(LeaseLost) as info:
        a_store.apply(
            puts=[("r/x/theirs", {"by": "a"}, b""), ("r/x/more", {}, b"")],
            deletes=["r/x/mine"],
            fence=a.fence,
        )
    assert "\n" not in str(info.value)
    with pytest.raises(LeaseLost):
        a_store.put("r/x/alone", {"by": "a"}, fence=a.fence)
    assert b_store.get("r/x/theirs")[0] == {"by": "b"}, "B's record intact"
    assert b_store.get("r/x/mine")[0] == {"by": "a"}, "A's delete did not happen"
    assert not b_store.has("r/x/more") and not b_store.has("r/x/alone")
    # B goes on writing; a write without a fence (an admin command) is not checked.
    b_store.put("r/x/alone", {"by": "b"}, fence=b.fence)
    a_store.put("r/x/admin", {})
    assert b_store.has("r/x/admin")


def test_a_step_record_under_a_taken_lease_is_refused_with_its_manifest(two_machines):
    """A step's record, alone or with its state, is written with its run's manifest in one
    transaction (pipelined on PostgreSQL): the fence's answer still refuses all of it."""
    a_store, a, b_store, b = two_machines
    rk = RunKeys("shared.ipynb")
    b_store.apply([(rk.step("s1"), {"by": "b"}, b"")], fence=b.fence)
    manifest = b_store.read(rk.manifest)
    for puts in (
        [(rk.step("s2"), {"by": "a"}, b"")],
        [(rk.step("s2"), {"by": "a"}, b""), (rk.state("s2"), {"by": "a"}, b"")],
    ):
        with pytest.raises(LeaseLost):
            a_store.apply(puts, fence=a.fence)
        assert not b_store.has(rk.step("s2")) and not b_store.has(rk.state("s2"))
        assert b_store.read(rk.manifest) == manifest
    b_store.apply([(rk.step("s2"), {"by": "b"}, b"")], fence=b.fence)
    assert b_store.get(rk.step("s2"))[0]["by"] == "b"
    assert a_store.get(rk.step("s1"))[0]["by"] == "b"


@pytest.mark.parametrize("takeover", ["commits", "rolls back"])
def test_a_record_racing_a_slow_takeover_lands_before_it_or_not_at_all(pg_url, takeover):
    """A takeover holds the lease row (a slow store, a slow machine); A's record waits for it."""
    a_store = open_store(pg_url)
    a = lease.Lease(a_store, "shared.ipynb")
    a.acquire()
    a._stop.set()
    key, ns = lease.lease_key("shared.ipynb"), namespace(pg_url)
    theirs = a_store._encode(key, {**asdict(lease.read(a_store, "shared.ipynb")), "token": "b"})
    outcome: list[object] = []
    with psycopg.connect(pg_server_of(pg_url)) as other:
        other.execute(f'SELECT 1 FROM "{ns}".kv WHERE key = %s FOR UPDATE', (key,))
        other.execute(f'UPDATE "{ns}".kv SET value = %s WHERE key = %s', (theirs, key))

        def record() -> None:
            try:
                a_store.put("r/x/step", {"by": "a"}, fence=a.fence)
                outcome.append("written")
            except LeaseLost as exc:
                outcome.append(exc)

        writer = threading.Thread(target=record)
        writer.start()
        deadline = time.monotonic() + 30
        waiting = (
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            f"AND application_name = 'nbdurable-{ns}'"
        )
        while not pg_sql(pg_url, waiting):  # A's record waits on the lease row
            assert time.monotonic() < deadline and writer.is_alive(), outcome
            time.sleep(0.02)
        assert not outcome, "the record did not wait for the takeover"
        other.commit() if takeover == "commits" else other.rollback()
        writer.join(30)
    if takeover == "commits":
        assert isinstance(outcome[0], LeaseLost) and not a_store.has("r/x/step")
    else:
        assert outcome == ["written"] and a_store.get("r/x/step")[0] == {"by": "a"}
    a_store.close()


@pytest.mark.parametrize(
    "query", ["connect_timeout=abc", "connect_timeout=0", "chunk_size=-1", "namespace=Bad-Name"]
)
def test_a_bad_url_parameter_is_one_line(query):
    """Refused before any connection is tried, naming the parameter, never a traceback."""
    from nbdurable.store._pg import parse_url

    with pytest.raises(StoreError) as err:
        parse_url(f"postgresql://me:s3cret@127.0.0.1:1/test?{query}")
    said = str(err.value)
    assert query.split("=")[0] in said and "\n" not in said and "s3cret" not in said, said


def test_atomically_inside_a_transaction_still_takes_its_lock(pg_url, pg_server):
    """``commands.decide`` begins a manifest inside ``transaction()``: that must hold the
    manifest's lock as well, so another process's recording into the run waits for it.
    """
    lock = RunKeys("nb.ipynb").manifest
    with open_store(pg_url) as store, psycopg.connect(pg_server) as other:

        def free() -> bool:  # may another session take the lock now?
            with other.transaction():
                sql = "SELECT pg_try_advisory_xact_lock(%s, hashtext(%s))"
                return other.execute(sql, (store._space, lock)).fetchone()[0]

        assert free()
        with store.transaction():
            seen = store._atomically(lock, free)
            assert not free()  # held to the end of the outer transaction
        assert seen is False and free()
