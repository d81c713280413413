"""Every use of diskcache, public and private, fenced in one module.

diskcache has no prefix scan, no insert-if-new and no way to point a key at
a value file written elsewhere; the store needs all three, so :class:`Rows`
runs SQL on diskcache's own ``Cache`` table and calls its private helpers
(``_sql``, ``_disk``, ``_row_insert``, ``_row_update``). They are used here
and nowhere else, so a diskcache upgrade that changes them breaks one file.
The table (diskcache 5.x): ``Cache(rowid, key, raw, store_time, expire_time,
access_time, access_count, tag, size, mode, filename, value)`` with a unique
index on ``(key, raw)``.

diskcache is given a :class:`SafeDisk` that refuses to unpickle keys or
values, so a planted pickle in the directory never runs (CVE-2025-69872).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from contextlib import AbstractContextManager
from typing import Any

import diskcache

from ..errors import CorruptRecord

DBNAME = diskcache.core.DBNAME
#: Values shorter than this are kept in the database row (diskcache's min_file_size).
INLINE_MAX = diskcache.core.DEFAULT_SETTINGS["disk_min_file_size"]
MODE_RAW = diskcache.core.MODE_RAW
MODE_BINARY = diskcache.core.MODE_BINARY
# The only value-file names diskcache makes (Disk.filename): "ab/cd/<28 hex>.val".
VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")

_SELECT_PREFIX = (
    "SELECT key, CASE WHEN filename IS NULL AND typeof(value) = 'blob' AND length(value) <= ?"
    " THEN value END"
    " FROM Cache WHERE raw = 1 AND key >= ? AND key < ? ORDER BY key"
)
_SELECT_VALUE = "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
_INSERT_INLINE = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
    " tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, ?, NULL, ?)"
)

Row = tuple[int, "str | None", Any]  # (mode, filename, value) of one key


#: Every file of the store is its owner's alone (its directory is 0700 too).
FILE_MODE = 0o600


class SafeDisk(diskcache.Disk):
    """A diskcache ``Disk`` that only stores and loads bytes, never pickles."""

    def put(self, key: Any) -> tuple[Any, bool]:
        """Keys are plain str (stored raw, never pickled)."""
        if not isinstance(key, str):
            raise TypeError(f"nbdurable store keys are str, got {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        """Refuse a pickled key."""
        if not raw:
            raise CorruptRecord("refusing to unpickle a key planted in the store")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        """Values are bytes (stored raw, never pickled)."""
        if not isinstance(value, bytes):
            raise TypeError(f"nbdurable store values are bytes, got {type(value).__name__}")
        if len(value) >= self.min_file_size:
            # diskcache writes bytes through io.BytesIO, i.e. line by line: a
            # 100 MB binary pickle became ~300,000 write() calls. One write.
            filename, full_path = self.filename(key, value)
            self._write(full_path, (value,), "xb")
            os.chmod(full_path, FILE_MODE)
            return len(value), diskcache.core.MODE_BINARY, filename, None
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        """Refuse any value diskcache would unpickle (or decode as text)."""
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY):
            raise CorruptRecord(f"refusing a store value of diskcache mode {mode} (not bytes)")
        if filename is not None and not VALUE_FILE.fullmatch(filename):
            raise CorruptRecord(f"refusing a store value kept outside the store ({filename!r})")
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path: str) -> None:
        """Remove a value file, never a file a planted row names outside the store."""
        if VALUE_FILE.fullmatch(file_path):
            super().remove(file_path)


class Rows:
    """One diskcache directory as the store engine sees it: rows of bytes and value files."""

    def __init__(self, directory: str, durability: str) -> None:
        self.cache = diskcache.Cache(
            directory,
            disk=SafeDisk,
            # A durable log must never evict (diskcache evicts past 1 GB by default).
            eviction_policy="none",
            cull_limit=0,
            statistics=0,
            timeout=60,
            sqlite_synchronous=2 if durability == "power" else 1,
        )
        # SQLite gives its -wal and -shm files the database file's mode.
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(os.path.join(directory, diskcache.core.DBNAME + suffix), FILE_MODE)

    def close(self) -> None:
        """Close the connections."""
        self.cache.close()

    # -- reading -------------------------------------------------------------------------
    def row(self, key: str) -> Row | None:
        """``key``'s ``(mode, filename, value)``; one SELECT, as ``Cache.get`` does without
        its per-call Python layers (no expiry, no statistics, no eviction here).
        """
        rows = self.cache._sql(_SELECT_VALUE, (key,)).fetchall()
        return rows[0] if rows else None

    def value(self, row: Row) -> Any:
        """A row's stored value.

        A value file is read by :class:`SafeDisk` (which refuses anything but
        bytes, and files outside the store); one that vanished reads as
        absent, as in ``Cache.get``.
        """
        mode, filename, value = row
        if filename is None and mode == MODE_RAW:
            return value  # not bytes (a planted number or text): the codec refuses it
        try:
            return self.cache._disk.fetch(mode, filename, value, False)
        except FileNotFoundError:
            return None

    def prefix(self, prefix: str, upper: str, row_max: int) -> list[tuple[str, bytes | None]]:
        """Keys in ``[prefix, upper)`` with their inline bytes if at most ``row_max`` long."""
        return self.cache._sql(_SELECT_PREFIX, (row_max, prefix, upper)).fetchall()

    def keys(self, prefix: str, upper: str) -> list[str]:
        """Plain-text keys in ``[prefix, upper)``, in order (an index range scan).

        A row whose key diskcache pickled (``raw = 0``, planted by plain
        diskcache) is never read, let alone unpickled.
        """
        # The Cache table has a unique index on (key, raw): O(log n + matches).
        rows = self.cache._sql(
            "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? ORDER BY key",
            (prefix, upper),
        ).fetchall()
        return [r[0] for r in rows]

    def stats(self, prefix: str, upper: str) -> tuple[int, int]:
        """``(count, bytes)`` of the keys in ``[prefix, upper)``."""
        row = self.cache._sql(
            "SELECT COUNT(*), COALESCE(SUM(size + COALESCE(LENGTH(value), 0)), 0) "
            "FROM Cache WHERE raw = 1 AND key >= ? AND key < ?",
            (prefix, upper),
        ).fetchone()
        return int(row[0]), int(row[1])

    def stats_by_scope(self, prefix: str, upper: str) -> dict[str, tuple[int, int]]:
        """:meth:`stats` of each ``prefix + scope + "/"`` under ``[prefix, upper)``, in one
        statement.

        The scopes are found by skipping through the key index: the first key holding a
        ``/`` after ``prefix`` names a scope, whose keys all lie in ``[prefix + scope +
        "/", prefix + scope + "0")`` ("0" follows "/"), and the next scope is the first
        key from there. Each scope is then counted over its own range, as :meth:`stats`
        does. Grouping the rows instead (``GROUP BY`` a part of the key) sorts them all:
        ten times slower on a run of 100,000 sub-steps.
        """
        n = len(prefix) + 1
        rows = self.cache._sql(
            "WITH RECURSIVE scopes(scope) AS ("
            " SELECT (SELECT substr(key, :n, instr(substr(key, :n), '/') - 1) FROM Cache"
            "  WHERE raw = 1 AND key >= :lo AND key < :hi AND instr(substr(key, :n), '/') > 0"
            "  ORDER BY key LIMIT 1)"
            " UNION ALL"
            " SELECT (SELECT substr(key, :n, instr(substr(key, :n), '/') - 1) FROM Cache"
            "  WHERE raw = 1 AND key >= :lo || scope || '0' AND key < :hi"
            "  AND instr(substr(key, :n), '/') > 0 ORDER BY key LIMIT 1)"
            " FROM scopes WHERE scope IS NOT NULL)"
            " SELECT scope, (SELECT COUNT(*) || ' ' || COALESCE(SUM(size + "
            "  COALESCE(LENGTH(value), 0)), 0) FROM Cache WHERE raw = 1"
            "  AND key >= :lo || scope || '/' AND key < :lo || scope || '0')"
            " FROM scopes WHERE scope IS NOT NULL",
            {"n": n, "lo": prefix, "hi": upper},
        ).fetchall()
        out = {}
        for scope, counted in rows:
            count, size = counted.split()
            out[scope] = (int(count), int(size))
        return out

    def size_of(self, key: str) -> int:
        """Bytes stored for ``key`` (0 if absent)."""
        row = self.cache._sql(
            "SELECT size + COALESCE(LENGTH(value), 0) FROM Cache WHERE raw = 1 AND key = ?",
            (key,),
        ).fetchone()
        return int(row[0]) if row else 0

    def has(self, key: str) -> bool:
        """True if ``key`` is present."""
        return key in self.cache

    # -- writing -------------------------------------------------------------------------
    def transact(self) -> AbstractContextManager[Any]:
        """One SQLite transaction (retried while the database is locked)."""
        return self.cache.transact(retry=True)

    def set(self, key: str, value: bytes, retry: bool = True) -> None:
        """``Cache.set``: replaces a row, and removes a value file the old row had."""
        self.cache.set(key, value, retry=retry)

    def delete(self, key: str, retry: bool = True) -> bool:
        """Delete one key; True if it existed."""
        return bool(self.cache.delete(key, retry=retry))

    def insert_new(self, key: str, value: bytes) -> bool:
        """Write a new small record with one INSERT (its own transaction, or the one open);
        False if it exists.

        ``Cache.set`` spends four statements (BEGIN IMMEDIATE, SELECT, INSERT,
        COMMIT) because a cache key is usually already there; a record's key is
        usually new. The row is the one ``Cache.set`` writes for bytes stored
        inline, and diskcache's triggers keep its count and size. A key that
        exists (IntegrityError on its unique index) goes through ``Cache.set``,
        which also removes a value file the old row had; so does any other
        SQLite refusal (``Cache.set`` retries a lock held past the busy timeout).
        """
        now = time.time()
        try:
            self.cache._sql(_INSERT_INLINE, (key, now, now, MODE_RAW, sqlite3.Binary(value)))
        except sqlite3.IntegrityError:
            return False
        except sqlite3.OperationalError:  # e.g. locked past the busy timeout: Cache.set retries
            return False
        return True

    # -- value files written by the engine itself -------------------------------------------
    def new_value_file(self) -> tuple[str, str]:
        """``(filename, full path)`` of a new value file (its directory is not made)."""
        return self.cache._disk.filename()

    def names(self, key: str, filename: str) -> bool:
        """True if ``key``'s row points at value file ``filename``."""
        try:
            rows = self.cache._sql(
                "SELECT 1 FROM Cache WHERE key = ? AND raw = 1 AND filename = ?", (key, filename)
            ).fetchall()
        except sqlite3.Error:
            return False
        return bool(rows)

    def point_at(self, key: str, filename: str, size: int) -> None:
        """Point ``key`` at a value file just written (the row ``Cache.set`` would write)."""
        now = time.time()
        columns = (None, None, size, MODE_BINARY, filename, None)
        old = None
        with self.cache.transact(retry=True):
            rows = self.cache._sql(
                "SELECT rowid, filename FROM Cache WHERE key = ? AND raw = 1", (key,)
            )
            found = rows.fetchall()
            if found:
                ((rowid, old),) = found
                self.cache._row_update(rowid, now, columns)
            else:
                self.cache._row_insert(key, 1, now, columns)
        if old and old != filename:
            self.cache._disk.remove(old)  # diskcache's remove ignores a file already gone

    # -- checking ----------------------------------------------------------------------------
    def integrity(self) -> list[str]:
        """SQLite's integrity check: empty when the database is sound."""
        rows = self.cache._sql("PRAGMA integrity_check").fetchall()
        return [] if rows == [("ok",)] else [m for (m,) in rows]

    def file_rows(self) -> list[tuple[int, Any, int, str]]:
        """``(rowid, key, size, filename)`` of every row kept in a value file."""
        return self.cache._sql(
            "SELECT rowid, key, size, filename FROM Cache WHERE filename IS NOT NULL"
        ).fetchall()

    def delete_row(self, rowid: int) -> None:
        """Delete one row by rowid (its value file is the caller's to remove)."""
        self.cache._sql("DELETE FROM Cache WHERE rowid = ?", (rowid,))
