"""The PostgreSQL engine's plumbing: its URL, its tables, its chunk writer (see .postgres)."""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import FormatVersionError, StoreError
from ..text import one_line
from . import blobs

try:
    from psycopg import errors as pg_errors
    from psycopg import generators, pq
except ImportError:  # pragma: no cover - PgStore says what to install
    pass

#: The table layout; increment on a breaking change (an older nbdurable then refuses it).
SCHEMA_VERSION = 1
#: Rows of a chunked blob hold this many bytes (the URL's ``chunk_size`` overrides it).
CHUNK_SIZE = 8 * 1024 * 1024
DEFAULT_NAMESPACE = "nbdurable"
_NAMESPACE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
# URL parameters read here; every other one goes to libpq as given.
_OURS = ("namespace", "chunk_size", "statement_timeout")


@dataclass(frozen=True)
class Target:
    """What a store URL says: where to connect, and nbdurable's own parameters."""

    conninfo: str  # the URL without nbdurable's parameters, for libpq
    options: dict[str, str]  # connection keywords: statement timeout, application name
    namespace: str
    chunk_size: int
    connect_timeout: float


def parse_url(url: str) -> Target:
    """Split a store URL; one-line :class:`StoreError` for a bad parameter."""
    where = display(url)
    query = parse_qsl(urlsplit(url).query)
    params = dict(query)
    namespace = params.get("namespace", DEFAULT_NAMESPACE)
    if not _NAMESPACE.fullmatch(namespace):
        raise StoreError(
            f"namespace {namespace!r} in {where} is not a plain lower-case name "
            "(letters, digits, _; at most 63): fix the URL's ?namespace="
        )
    chunk_size = _positive(params, "chunk_size", CHUNK_SIZE, where)
    timeout = _positive(params, "statement_timeout", 60, where)
    rest = [(k, v) for k, v in query if k not in _OURS]
    if "connect_timeout" not in params:
        rest.append(("connect_timeout", "10"))
    else:  # libpq's own parameter, which nbdurable also waits by: a whole number of seconds
        _positive(params, "connect_timeout", 10, where)
    options = {"options": f"-c statement_timeout={int(timeout * 1000)}"}
    if "client_encoding" not in params:
        # What Prepared sends text parameters in and reads errors back in.
        options["client_encoding"] = "UTF8"
    if "application_name" not in params:
        # How an operator (or a test) tells this store's sessions in pg_stat_activity.
        options["application_name"] = f"nbdurable-{namespace}"
    return Target(
        urlunsplit(urlsplit(url)._replace(query=urlencode(rest))),
        options,
        namespace,
        chunk_size,
        float(dict(rest)["connect_timeout"]),
    )


def display(url: str) -> str:
    """``url`` without its password and parameters but the namespace: safe to print."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    namespace = dict(parse_qsl(parts.query)).get("namespace")
    query = f"namespace={namespace}" if namespace else ""
    return urlunsplit((parts.scheme, user + host, parts.path, query, ""))


def reason(exc: BaseException) -> str:
    """The server's or libpq's own words, first line only (libpq adds hints below it)."""
    text = str(exc).strip().splitlines()
    return one_line(text[0]) if text else type(exc).__name__


def create_tables(conn: Any, t: str, space: int, where: str) -> None:
    """Create the namespace ``t`` (quoted) and its tables if missing; refuse a newer layout."""
    # An existing namespace is only read: opening it takes no lock and needs no
    # right to create (a team member may only read and write rows).
    if conn.execute("SELECT to_regclass(%s)", (f"{t}.schema_version",)).fetchone()[0]:
        found = conn.execute(f"SELECT max(version) FROM {t}.schema_version").fetchone()[0]
        if found == SCHEMA_VERSION:
            return
        _refuse_newer(found, where)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (space,))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {t}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {t}.schema_version (version int NOT NULL)")
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS {t}.kv (key text COLLATE "C" PRIMARY KEY, '
            "value bytea, size bigint NOT NULL, blob bigint)"
        )
        # Only chunked blobs are looked up by blob id: a partial index spares every
        # other row (each record) an index entry and its WAL.
        conn.execute(f"CREATE INDEX IF NOT EXISTS kv_blob ON {t}.kv (blob) WHERE blob IS NOT NULL")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {t}.chunks (blob bigint NOT NULL, n int NOT NULL, "
            "data bytea NOT NULL, PRIMARY KEY (blob, n))"
        )
        # Chunks are pickles and array bytes: compressing them costs more than it saves.
        conn.execute(f"ALTER TABLE {t}.chunks ALTER data SET STORAGE EXTERNAL")
        conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {t}.blob_ids")
        found = conn.execute(f"SELECT max(version) FROM {t}.schema_version").fetchone()[0]
        if found is None:
            conn.execute(f"INSERT INTO {t}.schema_version VALUES (%s)", (SCHEMA_VERSION,))
        _refuse_newer(found, where)


def _refuse_newer(found: int | None, where: str) -> None:
    if found is not None and found > SCHEMA_VERSION:
        raise FormatVersionError(
            f"the store at {where} has table layout {found}; this nbdurable reads layout "
            f"{SCHEMA_VERSION}. Upgrade nbdurable, or use another ?namespace="
        )


#: Type OIDs of the parameters a :class:`Prepared` statement takes.
TEXT, BYTEA, INT8 = 25, 17, 20


class Prepared:
    """One statement, prepared once on each connection that runs it, sent with libpq's calls.

    A sub-step's record is one small statement on the path of every recorded
    call. Through a psycopg cursor it costs about 25 µs of Python besides the
    round trip (converting the query, adapting each parameter, a cursor and
    its result objects); prepared under a fixed name and sent with its
    parameters already in wire format (text as UTF-8, see ``client_encoding``
    in :func:`parse_url`; ``bytea`` in binary), a few. Waiting goes through
    ``Connection.wait``, as a cursor's does, so an interrupted kernel cancels
    the statement on the server the same way, and a lost connection raises
    the same ``OperationalError``. A prepared statement is a connection's
    own: a new connection (after a reconnect) prepares it again.
    """

    def __init__(self, sql: str, types: Sequence[int]) -> None:
        self.sql = sql.encode("utf-8")
        self.types = list(types)
        self.formats = [1 if t == BYTEA else 0 for t in types]
        self.name = b"nbdurable_" + hashlib.sha256(self.sql).hexdigest()[:20].encode()

    def run(self, conn: Any, params: Sequence[bytes]) -> Any:
        """The statement's result on ``conn`` (a psycopg ``Connection``); raises its error."""
        pg = conn.pgconn
        with conn.lock:
            names = _PREPARED.get(conn)
            if names is None:
                names = _PREPARED[conn] = set()
            if self.name not in names:
                pg.send_prepare(self.name, self.sql, self.types)
                _result(conn.wait(generators.execute(pg)))
                names.add(self.name)
            pg.send_query_prepared(self.name, params, self.formats)
            return _result(conn.wait(generators.execute(pg)))


# Which statements each live connection has prepared (it forgets them when it closes).
_PREPARED: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()


def _result(results: list[Any]) -> Any:
    res = results[-1]
    if res.status == pq.ExecStatus.FATAL_ERROR:
        raise pg_errors.error_from_result(res, encoding="utf-8")
    return res


class ChunkWriter:
    """A write-only file that inserts ``size``-byte rows as it fills (see blobs.write)."""

    def __init__(self, conn: Any, sql: str, blob_id: int, size: int) -> None:
        self.conn, self.sql, self.blob_id, self.size = conn, sql, blob_id, size
        self.buf = bytearray()
        self.n = 0

    def write(self, data: blobs.Buffer) -> int:
        view = memoryview(data).cast("B")
        self.buf += view
        while len(self.buf) >= self.size:
            self._insert(bytes(self.buf[: self.size]))
            del self.buf[: self.size]
        return view.nbytes

    def flush(self) -> None:
        if self.buf or self.n == 0:
            self._insert(bytes(self.buf))
            self.buf = bytearray()

    def _insert(self, chunk: bytes) -> None:
        self.conn.execute(self.sql, (self.blob_id, self.n, chunk))
        self.n += 1


def _positive(params: dict[str, str], name: str, default: float, where: str) -> Any:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
        if value <= 0:
            raise ValueError
    except ValueError:
        raise StoreError(
            f"{name}={raw!r} in {where} must be a positive whole number: fix the URL"
        ) from None
    return value
