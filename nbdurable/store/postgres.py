"""The shared engine: a store in a PostgreSQL database, for a team or many machines.

Selected by a URL (``NBDURABLE_STORE=postgresql://user@host/db``; see
:mod:`.engine`). Everything above the :class:`~.base.Store` interface is the
same as on the embedded engine: the same keys, the same signed records.

Tables, in the PostgreSQL schema named by the URL's ``namespace`` parameter
(default ``nbdurable``; one per team or project, created on first use)::

    schema_version(version)             the table layout; a newer one is refused
    kv(key, value, size, blob)          one row per key; value NULL when chunked
    chunks(blob, n, data)               a large blob's bytes, CHUNK-sized rows

A blob at least :attr:`PgStore.small_blob_max` bytes long is streamed into
``chunks`` rows (``chunk_size``, 8 MB by default) inside one transaction that
ends by inserting its ``kv`` row: a blob is all there or not there, of any
size (PostgreSQL limits one value to 1 GB; chunks lift that). Reading streams
the chunks into an unlinked temporary file, which is hashed and mapped as the
embedded engine maps its value files.

Round trips: a sub-step's record is one prepared statement in autocommit
(one round trip, one commit). A step's record is one transaction that reads
and rewrites its run's manifest under an advisory lock
(:meth:`PgStore._atomically`); it runs in libpq's pipeline mode, so a
statement whose answer is not needed yet goes out with the next one that is:
three round trips (BEGIN + lock + manifest read; records + row count;
manifest + COMMIT) instead of one per statement.

Records are signed with ``NBDURABLE_KEY``, which every member of the team
sets; it is never stored in the database. Without it the store does not
open: an unsigned shared store would let anyone with write access to the
database plant a pickle that every kernel replaying it unpickles.

Faults: a lost connection (server restarted, backend terminated) is retried
on a fresh connection from the pool, for at most :data:`RETRIES` attempts,
each waiting up to ``connect_timeout`` + 5 s for the pool to reconnect (a
server that restarts, or crashes and is started again, within that time
costs a running step nothing but the wait).
Every write is an idempotent upsert of signed bytes under a fixed key, so a
transaction whose COMMIT was lost in flight and is then retried records the
same row once; the lease's compare-and-set (:meth:`PgStore.swap`) runs under
a row-level advisory lock and is re-evaluated on retry. ``connect_timeout``
(10 s) and ``statement_timeout`` (60 s) in the URL bound every wait, so a
slow or hung server becomes a one-line :class:`StoreError`, never a hung
kernel.

The medium cannot be deleted from under an open store as a directory can:
:meth:`replaced` is always False, and a dropped schema surfaces as a
:class:`StoreError` on the next query.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import faults
from ..errors import CorruptRecord, StoreError
from . import blobs, codec, layout
from ._pg import BYTEA, INT8, TEXT, ChunkWriter, Prepared, create_tables, display, parse_url, reason
from .base import Fence, Header, Store

#: Attempts of one operation when the connection is lost.
RETRIES = 4
# Every write of a key replaces the whole row: a retried write lands once.
_UPSERT = (
    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, size = EXCLUDED.size, blob = NULL"
)
#: The condition on every clause of a fenced write (see PgStore.write).
_HELD = "EXISTS (SELECT FROM lease)"


def _row(key: str, value: bytes) -> list[bytes]:
    """The parameters of a one-row upsert (``PgStore._put``), in wire format."""
    return [key.encode("utf-8"), value, str(len(value)).encode()]


def _pipelined(conn: Any) -> bool:
    """True while ``conn`` is in pipeline mode (inside :meth:`PgStore._atomically`)."""
    return conn.pgconn.pipeline_status != 0


def _sent(conn: Any, sql: str, args: Sequence[Any], fence: Fence | None) -> bool:
    """A write in pipeline mode: queued, and waited for only when its answer matters.

    A fenced write waits for its row (the fence's answer). Any other is sent
    with what follows it: its error, if any, is raised by the next statement
    that waits, at the latest by COMMIT, and the whole transaction is rolled
    back as if it had been raised here.
    """
    cur = conn.execute(sql, args)
    if fence is None:
        faults.point("store-write")  # inside the transaction, before its commit
        return True
    row = cur.fetchone()
    faults.point("store-write")
    return row is not None and bool(row[0])  # no row, or FALSE: the fence said no


def _lease(t: str, key: str, marker: str) -> str:
    """The fence's clause: the lease row, if it still names the token, read ``FOR SHARE``."""
    return (
        f"WITH lease AS (SELECT FROM {t}.kv WHERE key = {key} "
        f"AND position({marker} IN value) > 0 FOR SHARE)"
    )


try:
    import psycopg
    import psycopg_pool
except ImportError:  # pragma: no cover - the error is raised on open
    psycopg = None  # type: ignore[assignment]
    psycopg_pool = None  # type: ignore[assignment]
else:
    # The pool warns as it drops a connection the server ended ("discarding
    # closed connection"); with no logging configured, Python prints that to
    # stderr, which is a notebook cell's output. Reconnecting is this module's
    # business and a failure is its one-line StoreError: the warnings go to
    # logging only (a configured root logger still receives them). So does the
    # warning of a pipeline ended by a lost connection (see _atomically), which
    # psycopg logs on its own top logger while the error itself is raised.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())
    _IDLE = psycopg.pq.TransactionStatus.IDLE


class PgStore(Store):
    """The store in a PostgreSQL schema; see the module docstring."""

    small_blob_max = 64 * 1024
    elsewhere = "use another ?namespace= in NBDURABLE_STORE"
    path: str  # type: ignore[assignment]  # the URL, shown without password

    def __init__(self, url: str, *, durability: str = "crash") -> None:
        # ``durability`` is the server's business (synchronous_commit); accepted for
        # the signature every engine shares.
        if psycopg is None:
            raise StoreError(
                "the PostgreSQL store needs psycopg 3: pip install 'nbdurable[postgres]'"
            )
        self.url = url
        self.path = display(url)
        target = parse_url(url)
        self.namespace, self.chunk_size = target.namespace, target.chunk_size
        self._conninfo, self._options = target.conninfo, target.options
        self._connect_timeout = target.connect_timeout
        self._t = t = f'"{self.namespace}"'
        # A sub-step's record; fenced, only while the lease row names our token
        # (see write). RETURNING gives a row only when the row was written.
        self._put_fenced = Prepared(
            f"{_lease(t, '$1', '$2')} INSERT INTO {t}.kv (key, value, size) "
            f"SELECT $3, $4, $5 WHERE {_HELD} {_UPSERT} RETURNING TRUE",
            (TEXT, BYTEA, TEXT, BYTEA, INT8),
        )
        self._put = Prepared(
            f"INSERT INTO {t}.kv (key, value, size) VALUES ($1, $2, $3) {_UPSERT} RETURNING TRUE",
            (TEXT, BYTEA, INT8),
        )
        # The same two statements through psycopg, for a connection in pipeline mode
        # (see _atomically), where a statement sent with libpq's own calls would
        # put its result out of step with psycopg's queue.
        self._put_sql = (
            f"INSERT INTO {t}.kv (key, value, size) VALUES (%s, %b, %s) {_UPSERT} RETURNING TRUE"
        )
        self._put_fenced_sql = (
            f"{_lease(t, '%s', '%b')} INSERT INTO {t}.kv (key, value, size) "
            f"SELECT %s, %b, %s WHERE {_HELD} {_UPSERT} RETURNING TRUE"
        )
        # Advisory locks are per database: the namespace's own lock space.
        self._space = zlib.crc32(self.namespace.encode()) - 2**31
        self._local = threading.local()
        self._pool: Any = None
        self._held: Any = None  # the main thread's connection, see _connection
        self.generation = 0
        self.deletions = 0
        self._open()

    # -- opening ------------------------------------------------------------------------
    def _open(self) -> None:
        secret = os.environ.get("NBDURABLE_KEY", "")
        if len(secret) < 16:
            raise StoreError(
                f"the shared store {self.path} needs NBDURABLE_KEY set to the team's signing "
                "key (at least 16 characters; the same on every machine) before it opens"
            )
        try:
            with psycopg.connect(self._conninfo, **self._options) as conn:
                create_tables(conn, self._t, self._space, self.path)
        except psycopg.OperationalError as exc:
            raise StoreError(
                f"cannot reach the nbdurable store at {self.path}: {reason(exc)}. Nothing was "
                "read or recorded; start the PostgreSQL server or fix NBDURABLE_STORE (--store)."
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot open the nbdurable store at {self.path}: {reason(exc)}; check the "
                "database's permissions, or use another ?namespace="
            ) from exc
        self._pool = psycopg_pool.ConnectionPool(
            self._conninfo,
            min_size=1,
            # One is held by the main thread (see _connection); four for the others.
            max_size=5,
            # Autocommit: a one-statement write commits in one round trip; every
            # other write is an explicit transaction (see _run). No statement
            # prepared by psycopg itself: after a rolled-back transaction it
            # sends DEALLOCATE ALL, which drops _pg's prepared statements too
            # (the next one "does not exist", inside a step record's transaction).
            kwargs={**self._options, "autocommit": True, "prepare_threshold": None},
            timeout=self._connect_timeout + 5,
            open=False,
            name=f"nbdurable-{self.namespace}",
        )
        self._pool.open(wait=False)
        try:
            self._start(secret.encode("utf-8"))
        except BaseException:
            # Refused (another key, a newer format): no pool is left for the garbage
            # collector to close from one of its own threads.
            self.close()
            raise

    # -- running statements ---------------------------------------------------------------
    def _run(self, doing: str, fn: Callable[[Any], Any], tx: bool = True) -> Any:
        """``fn(connection)``, retried on a fresh connection if the connection is lost.

        With ``tx`` it runs in one transaction; without, each statement
        commits on its own (one statement, or ``fn`` opens its own). Inside
        :meth:`transaction` it runs on that transaction's connection, without
        retry (the caller's block cannot be replayed from here).
        """
        pinned = getattr(self._local, "conn", None)
        if pinned is not None:
            if getattr(self._local, "retried", False):
                return fn(pinned)  # inside _atomically: its own _run retries the whole
            return self._guarded(doing, lambda: fn(pinned))
        for attempt in range(RETRIES):
            conn = None
            try:
                with self._connection() as conn:
                    if not tx:
                        return fn(conn)
                    with conn.transaction():
                        return fn(conn)
            except psycopg_pool.PoolTimeout as exc:  # before its base class, OperationalError
                raise self._failure(doing, exc) from exc
            except psycopg.OperationalError as exc:
                # A broken connection is dropped by the pool; the next attempt gets a new one.
                lost = conn is None or conn.broken or conn.closed
                if not lost or attempt == RETRIES - 1:
                    raise self._failure(doing, exc) from exc
                # Its idle siblings died with it (a restarted server): drop them too.
                with contextlib.suppress(Exception):
                    self._pool.check()
                time.sleep(0.05 * 2**attempt)
            except psycopg.Error as exc:
                raise self._failure(doing, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        """A connection from the pool; the main thread's is kept between operations.

        The kernel records every call from its main thread, one statement
        each: taking the connection from the pool and giving it back costs
        10-20 µs a record, so that thread keeps one. Any failure gives it
        back to the pool, which closes it if broken (the next operation takes
        a fresh one); other threads (heartbeats, calls made from threads)
        take theirs from the pool for each operation.
        """
        if threading.current_thread() is not threading.main_thread():
            with self._pool.connection() as conn:
                yield conn
            return
        conn = self._held
        if conn is None:
            conn = self._held = self._pool.getconn()
        try:
            yield conn
        except BaseException:
            self._held = None
            self._pool.putconn(conn)
            raise

    def _guarded(self, doing: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._failure(doing, exc) from exc

    def _failure(self, doing: str, exc: BaseException) -> StoreError:
        advice = "check that the PostgreSQL server is up and reachable (NBDURABLE_STORE)"
        if doing == "write":
            return StoreError(
                f"could not write to the nbdurable store at {self.path}: {reason(exc)}. "
                f"Nothing was recorded for this write; {advice}, then run the cell again."
            )
        return StoreError(
            f"could not {doing} the nbdurable store at {self.path}: {reason(exc)}; {advice}."
        )

    def _one(self, sql: str, args: Sequence[Any], doing: str = "read") -> Any:
        """The first row of one statement (None if none)."""
        return self._run(doing, lambda c: c.execute(sql, args, binary=True).fetchone(), tx=False)

    # -- reading ------------------------------------------------------------------------
    def read(self, key: str) -> bytes | None:
        """The stored bytes of ``key`` (a chunked blob's joined), unverified."""

        def fn(conn: Any) -> bytes | None:
            row = conn.execute(
                f"SELECT value, blob FROM {self._t}.kv WHERE key = %s", (key,), binary=True
            ).fetchone()
            if row is None:
                return None
            if row[1] is None:
                return bytes(row[0])
            rows = conn.execute(
                f"SELECT data FROM {self._t}.chunks WHERE blob = %s ORDER BY n",
                (row[1],),
                binary=True,
            )
            return b"".join(bytes(r[0]) for r in rows)

        return self._run("read", fn, tx=False)

    def read_prefix(self, prefix: str, row_max: int) -> list[tuple[str, bytes | None]]:
        """Keys under ``prefix`` with their bytes if at most ``row_max`` long, in key order."""

        def fn(conn: Any) -> list[tuple[str, bytes | None]]:
            rows = conn.execute(
                f"SELECT key, CASE WHEN blob IS NULL AND size <= %s THEN value END "
                f"FROM {self._t}.kv WHERE key >= %s AND key < %s ORDER BY key",
                (row_max, prefix, layout.upper(prefix)),
                binary=True,
            ).fetchall()
            return [(k, None if v is None else bytes(v)) for k, v in rows]

        return self._run("read", fn, tx=False)

    def scan(self, prefix: str) -> list[str]:
        """All keys that start with ``prefix``, in key order (an index range scan)."""
        return self._run(
            "read",
            lambda c: [
                r[0]
                for r in c.execute(
                    f"SELECT key FROM {self._t}.kv WHERE key >= %s AND key < %s ORDER BY key",
                    (prefix, layout.upper(prefix)),
                )
            ],
            tx=False,
        )

    def stats(self, prefix: str) -> tuple[int, int]:
        """``(count, bytes)`` of the keys under ``prefix``."""
        row = self._one(
            f"SELECT count(*), coalesce(sum(size), 0) FROM {self._t}.kv "
            "WHERE key >= %s AND key < %s",
            (prefix, layout.upper(prefix)),
        )
        return int(row[0]), int(row[1])

    def stats_by_scope(self, prefix: str) -> dict[str, tuple[int, int]]:
        """``(count, bytes)`` of the keys under ``prefix`` by scope (see :class:`Store`)."""
        sql = (
            f"SELECT split_part(substr(key, %s), '/', 1), count(*), coalesce(sum(size), 0) "
            f"FROM {self._t}.kv WHERE key >= %s AND key < %s AND strpos(substr(key, %s), '/') > 0 "
            "GROUP BY 1"
        )
        n = len(prefix) + 1
        args = (n, prefix, layout.upper(prefix), n)
        rows = self._run("read", lambda c: c.execute(sql, args).fetchall(), tx=False)
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    def size_of(self, key: str) -> int:
        """Bytes stored for ``key`` (0 if absent)."""
        row = self._one(f"SELECT size FROM {self._t}.kv WHERE key = %s", (key,))
        return 0 if row is None else int(row[0])

    def has(self, key: str) -> bool:
        """True if ``key`` is present (not verified)."""
        return self._one(f"SELECT 1 FROM {self._t}.kv WHERE key = %s", (key,)) is not None

    # -- writing ------------------------------------------------------------------------
    def write(
        self, values: dict[str, bytes], deletes: Sequence[str] = (), fence: Fence | None = None
    ) -> None:
        """Write and delete in one transaction (upserts: a retried write lands once).

        One statement, sent in one round trip: in autocommit a statement is
        its own transaction, so every row of it commits together or none
        does, with one WAL flush. A sub-step's record, the write made on
        every recorded call, is one upsert prepared on the connection
        (:class:`~._pg.Prepared`). A step's record, its state and its small
        blobs are one ``unnest`` of arrays (one statement whatever their
        number); deletes and the chunks of a rewritten blob go in
        data-modifying ``WITH`` clauses of the same statement.

        With a ``fence`` (see :class:`~.base.Fence`) every clause runs only if
        the lease row, read ``FOR SHARE`` in the same statement, still names
        its token: a takeover (which updates that row) either waits for this
        statement to commit, or has committed and this statement writes nothing
        and raises :class:`LeaseLost`.
        """
        gone = set(deletes)
        keys = [k for k in values if k not in gone]  # put then deleted: deleted, as on disk
        # A key that held a chunked blob gives its chunks up (rare: a rewritten blob).
        chunked = [k for k in keys if k.startswith(layout.BLOBS)] + list(deletes)
        if len(keys) == 1 and not chunked:  # a sub-step's record: one prepared statement
            params = _row(keys[0], values[keys[0]])
            put, sql = self._put, self._put_sql
            if fence is not None:
                put, sql = self._put_fenced, self._put_fenced_sql
                params = [fence.key.encode("utf-8"), fence.marker, *params]

            def fn(conn: Any) -> bool:
                if _pipelined(conn):
                    value = values[keys[0]]
                    args: tuple = (keys[0], value, len(value))
                    if fence is not None:
                        args = (fence.key, fence.marker, *args)
                    return _sent(conn, sql, args, fence)
                res = put.run(conn, params)
                faults.point("store-write")  # inside the transaction, before its commit
                return res.ntuples > 0  # no row: the fence said no
        else:
            sql, args = self._write_sql(keys, chunked, list(deletes), values, fence)

            def fn(conn: Any) -> bool:
                if _pipelined(conn):
                    return _sent(conn, sql, args, fence)
                row = conn.execute(sql, args).fetchone()
                faults.point("store-write")  # inside the transaction, before its commit
                return row is not None and bool(row[0])  # no row, or FALSE: the fence said no

        if deletes:
            self.deletions += 1
        # The fault point needs a client-side transaction to fall inside; the
        # statement alone commits as it ends.
        if not self._run("write", fn, tx=faults.armed("store-write")):
            raise self._lost(fence)  # type: ignore[arg-type]  # only a fence says no
        self._suspect.difference_update(values)

    def _write_sql(
        self,
        keys: list[str],
        chunked: list[str],
        deletes: list[str],
        values: dict[str, bytes],
        fence: Fence | None,
    ) -> tuple[str, tuple]:
        """The general write (see :meth:`write`): one statement of data-modifying clauses."""
        t = self._t
        lease, held, args = "WITH ", "TRUE", ()
        if fence is not None:
            lease, held = _lease(t, "%s", "%b") + ", ", _HELD
            args = (fence.key, fence.marker)
        sql = (
            f"{lease}dropped AS (DELETE FROM {t}.chunks "
            f"WHERE blob IN (SELECT blob FROM {t}.kv WHERE key = ANY(%s) "
            f"AND blob IS NOT NULL) AND {held}), "
            f"removed AS (DELETE FROM {t}.kv WHERE key = ANY(%s) AND {held}), "
            f"put AS (INSERT INTO {t}.kv (key, value, size) "
            f"SELECT * FROM unnest(%s::text[], %b::bytea[], %s::bigint[]) WHERE {held} "
            f"{_UPSERT}) SELECT {held}"
        )
        data = [values[k] for k in keys]
        return sql, (*args, chunked, deletes, keys, data, [len(v) for v in data])

    def _drop_chunks(self, cur: Any, keys: Sequence[str]) -> None:
        cur.execute(
            f"DELETE FROM {self._t}.chunks WHERE blob IN "
            f"(SELECT blob FROM {self._t}.kv WHERE key = ANY(%s) AND blob IS NOT NULL)",
            (list(keys),),
        )

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""

        def fn(conn: Any) -> bool:
            with conn.cursor() as cur:
                self._drop_chunks(cur, [key])
                cur.execute(f"DELETE FROM {self._t}.kv WHERE key = %s", (key,))
                return cur.rowcount > 0

        self.deletions += 1
        return self._run("write", fn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Reads and writes inside it are one transaction, serialized with every other one."""
        if getattr(self._local, "conn", None) is not None:
            yield  # nested: part of the outer transaction
            return
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s, 1)", (self._space,))
                self._local.conn = conn
                try:
                    yield
                finally:
                    self._local.conn = None
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._failure("write", exc) from exc

    def _domain(self, fmt: Header) -> str | None:
        """Records of a team store are bound to its namespace (see :mod:`.codec`)."""
        return f"namespace:{self.namespace}"

    def _atomically(self, lock: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` in one transaction holding ``lock``'s advisory lock; run again whole on a
        lost connection (``fn`` reads what it changes inside, so it can be).
        """
        lock_sql = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
        if getattr(self._local, "conn", None) is not None:
            # Nested (inside transaction(), as commands.decide is): part of the outer
            # transaction, but it takes the lock too, else its reads and writes race
            # another process's _atomically on the same lock (a manifest begun twice).
            # An advisory lock is re-entrant within a transaction: nesting cannot deadlock.
            def nested(conn: Any) -> Any:
                conn.execute(lock_sql, (self._space, lock))
                return fn()

            return self._run("write", nested)

        def body(conn: Any) -> Any:
            # Pipeline mode: BEGIN, the lock and the first read go to the server in
            # one round trip, the last write and COMMIT in another; a statement
            # whose rows are needed (a read, a fenced write) still waits for them,
            # and for every statement queued before it. BEGIN and COMMIT are sent
            # as statements: psycopg's transaction() in pipeline mode waits for the
            # server before and after the block (two more round trips).
            self._local.conn, self._local.retried = conn, True
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    conn.execute(lock_sql, (self._space, lock))
                    got = fn()
                    conn.execute("COMMIT")
                return got
            except BaseException:
                # A write's error may surface only at COMMIT, after fn() changed a
                # manifest in memory: read every one afresh at its next use.
                self._manifests.clear()
                if not conn.closed and conn.info.transaction_status != _IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
            finally:
                self._local.conn, self._local.retried = None, False

        return self._run("write", body, tx=False)

    def swap(self, key: str, update: Callable[[Header | None], Header | None]) -> Header | None:
        """The lease's compare-and-set: read, ``update``, write under the key's own lock.

        One transaction holding an advisory lock on the key (a row lock
        cannot lock a row that does not exist yet), so two machines taking
        the same lease are serialized. On a lost connection the whole of it
        runs again, ``update`` included, on the state then committed.
        """

        def fn(conn: Any) -> Header | None:
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (self._space, key))
            row = conn.execute(
                f"SELECT value FROM {self._t}.kv WHERE key = %s", (key,), binary=True
            ).fetchone()
            current = None
            if row is not None:
                with contextlib.suppress(CorruptRecord):
                    current = codec.decode(self._macs, key, bytes(row[0]))[0]
            new = update(current)
            if new is None:
                if row is not None:
                    conn.execute(f"DELETE FROM {self._t}.kv WHERE key = %s", (key,))
            else:
                self._put.run(conn, _row(key, self._encode(key, new)))
            return current

        return self._run("write", fn)

    # -- blobs (format: see .blobs) -------------------------------------------------------
    def _put_blob_file(
        self, parts: Sequence[blobs.Buffer], total: int, secrets: dict[str, bytes]
    ) -> tuple[str, int]:
        """Stream a large blob into chunk rows, hashing it; its kv row commits with them."""
        written = [0]

        def fn(conn: Any) -> str:
            written[0] = 0
            t = self._t
            with conn.transaction() as txn:
                blob_id = conn.execute(f"SELECT nextval('{t}.blob_ids')").fetchone()[0]
                out = ChunkWriter(
                    conn, f"INSERT INTO {t}.chunks VALUES (%s, %s, %b)", blob_id, self.chunk_size
                )
                sha = blobs.write(out, parts, secrets)
                out.flush()
                key = layout.blob(sha)
                if key in self._suspect:  # found damaged or missing: replace it
                    with conn.cursor() as cur:
                        self._drop_chunks(cur, [key])
                        cur.execute(f"DELETE FROM {t}.kv WHERE key = %s", (key,))
                stored = conn.execute(
                    f"INSERT INTO {t}.kv (key, value, size, blob) VALUES (%s, NULL, %s, %s) "
                    "ON CONFLICT (key) DO NOTHING RETURNING key",
                    (key, total, blob_id),
                ).fetchone()
                if stored is None:  # stored already (maybe by another machine just now):
                    raise psycopg.Rollback(txn)  # its chunks go with the transaction
                written[0] = total
            return sha

        sha = self._run("write", fn, tx=False)
        self._suspect.discard(layout.blob(sha))
        return sha, written[0]

    def get_blob(self, sha: str) -> blobs.Blob | None:
        """The verified blob ``sha``, None if absent (:class:`CorruptRecord` if damaged).

        Chunks are streamed into an unlinked temporary file, then verified and
        mapped like a value file of the embedded engine.
        """
        key = layout.blob(sha)

        def fn(conn: Any) -> blobs.Blob | None:
            row = conn.execute(
                f"SELECT value, blob, size FROM {self._t}.kv WHERE key = %s", (key,), binary=True
            ).fetchone()
            if row is None:
                return None
            value, blob_id, size = row
            if blob_id is None:
                return self._blob_from_bytes(sha, key, bytes(value))
            with tempfile.TemporaryFile(prefix="nbdurable-blob-") as f:
                with conn.cursor(name=f"blob_{blob_id}", binary=True) as cur:
                    cur.itersize = 1  # one chunk in memory at a time
                    cur.execute(
                        f"SELECT data FROM {self._t}.chunks WHERE blob = %s ORDER BY n",
                        (blob_id,),
                    )
                    for (data,) in cur:
                        f.write(data)
                got = f.tell()
                if got != size:
                    raise CorruptRecord(f"blob {sha[:12]} has {got} bytes, not {size} (truncated)")
                f.seek(0)
                return blobs.read_verified(sha, f, size)

        try:
            blob = self._run("read", fn)
        except CorruptRecord:
            self._suspect.add(key)
            raise
        if blob is None:
            self._suspect.add(key)
        return blob

    # -- housekeeping ---------------------------------------------------------
    def check(self, fix: bool = True) -> list[str]:
        """Check chunked blobs; with ``fix``, remove what cannot be whole.

        One line per problem: a blob whose chunks do not add up to its size
        (its record is deleted; the step that saved it runs again), chunks
        that belong to no record (left only by a hand edit: every blob's
        chunks commit with its row).
        """
        t = self._t
        done = "; removed" if fix else ""

        def fn(conn: Any) -> list[str]:
            problems = []
            bad = conn.execute(
                f"SELECT k.key, k.size, coalesce(sum(length(c.data)), 0) FROM {t}.kv k "
                f"LEFT JOIN {t}.chunks c ON c.blob = k.blob WHERE k.blob IS NOT NULL "
                "GROUP BY k.key, k.size HAVING coalesce(sum(length(c.data)), 0) <> k.size"
            ).fetchall()
            for key, size, got in bad:
                problems.append(f"record {key!r} has {got} bytes in its chunks, not {size}{done}")
            orphans = conn.execute(
                f"SELECT DISTINCT blob FROM {t}.chunks c WHERE NOT EXISTS "
                f"(SELECT 1 FROM {t}.kv k WHERE k.blob = c.blob)"
            ).fetchall()
            problems += [f"chunks of blob {b} belong to no record{done}" for (b,) in orphans]
            if fix:
                with conn.cursor() as cur:
                    self._drop_chunks(cur, [k for k, _, _ in bad])
                    cur.execute(
                        f"DELETE FROM {t}.kv WHERE key = ANY(%s)", ([k for k, _, _ in bad],)
                    )
                    cur.execute(
                        f"DELETE FROM {t}.chunks WHERE blob = ANY(%s)", ([b for (b,) in orphans],)
                    )
                if bad:
                    self.deletions += 1
            return problems

        return self._run("check", fn)

    def replaced(self) -> bool:
        """Always False: a database is not swapped under a URL as a directory is."""
        return False

    def check_same(self) -> None:
        """Nothing to check (see :meth:`replaced`)."""

    def reopen(self) -> None:
        """Close the pool and connect again."""
        self.close()
        self.generation += 1
        self._open()

    def close(self) -> None:
        """Close the pool's connections."""
        if self._pool is not None:
            held, self._held = self._held, None
            with contextlib.suppress(Exception):
                if held is not None:
                    self._pool.putconn(held)
                self._pool.close()
            self._pool = None

    def drop(self) -> None:
        """Remove the whole namespace (its schema and every record in it)."""
        self._run(
            "write", lambda c: c.execute(f"DROP SCHEMA IF EXISTS {self._t} CASCADE"), tx=False
        )
        self.close()
