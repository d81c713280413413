"""Writes to SQLite databases: in memory, state no replay restores; in a file, the file's.

Agent frameworks keep sessions and memories in SQLite databases that live in
the process (``":memory:"``): the OpenAI Agents SDK's ``SQLiteSession``,
LlamaIndex's ``Memory`` (through SQLAlchemy and aiosqlite, on a thread of
its own), LangGraph's ``SqliteSaver`` over ``sqlite3.connect(":memory:")``.
A step that writes there changes no Python attribute nbdurable can see, and
the rows cannot be pickled with the step: replayed as it was recorded, the
step would leave the notebook with an empty session — a difference nobody
is told of. So a step that wrote to an in-memory database still open when
it ends cannot be replayed: its body runs again on replay (its sub-steps and
HTTP requests still replay), with one line saying why, and rebuilds the rows
in the database the plain cells made again.

How writes are seen: from ``%load_ext nbdurable`` on, ``sqlite3.connect`` (and
``sqlite3.dbapi2.connect``, which SQLAlchemy calls) is wrapped, and an in-
memory connection it opens gets a trace callback that counts the statements
which may write (``INSERT``, ``UPDATE``, ``DELETE``, ``REPLACE``, ``CREATE``,
``DROP``, ``ALTER``, a ``WITH`` leading to one; see :func:`is_write`: its
comments and quoted text are left out first, so ``select 'update'`` is a read
and a write after a leading comment a write), once between two snapshots.
:func:`counts` is the per-connection count of the connections still alive;
:func:`written` compares two. Reads are free.
Not seen: connections opened before ``%load_ext nbdurable`` or through a
``connect`` bound before it, and a connection whose trace callback the user's
code replaced. (The audit hook's ``sqlite3.connect/handle`` event comes too
early to set a callback: the connection is not initialized yet.) A database in
a file is the file's: what a step wrote there stays written, and a replay need
not write it. But a body that runs again (a step that bound a connection, an
engine or a session, which cannot be saved) would write it a second time: so
writes to files are counted too, per file (:func:`file_counts`,
:func:`files_written`), and the step runner decides from them (see
:mod:`nbdurable.dbwrites`). nbdurable's own store (diskcache, in
SQLite) is not watched: a connection opened from :mod:`nbdurable.store` is
left alone.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import weakref
from typing import Any

_installed = False


class _Entry:
    """One watched connection: held only by its trace callback, so it dies with it.

    (A ``sqlite3.Connection`` takes no weak reference; its callback is freed
    with it, and this with the callback.)
    """

    __slots__ = ("writes", "database", "counted", "__weakref__")

    def __init__(self, database: str) -> None:
        self.writes = 0
        self.database = database
        self.counted = -1  # the interval its last write was counted in


#: id(entry) -> weak reference to the entry of a connection alive
_entries: dict[int, weakref.ref] = {}

#: file database (absolute path) -> writes so far; never forgotten, so a
#: connection closed (and freed) inside the step still counts
_file_writes: dict[str, int] = {}

#: The snapshot interval now (see :func:`counts`, :func:`file_counts`): a database
#: counted written in it is not parsed again until the next snapshot, so a step
#: inserting row by row pays one comparison per statement, not a parse.
_interval = 0
#: file database -> the interval its last write was counted in
_file_counted: dict[str, int] = {}
#: a count and its interval's mark change together, and a snapshot sees both or neither
_lock = threading.Lock()

# Comments and quoted text (string literals, quoted identifiers) say nothing of what
# a statement does: `select 'update'` reads, `-- a note` may lead an INSERT.
_NOISE = re.compile(
    r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`[^`]*`?|\[[^\]]*\]?|--[^\n]*|/\*.*?(?:\*/|$)""",
    re.DOTALL,
)
_WRITE_WORDS = frozenset({"insert", "update", "delete", "replace", "create", "drop", "alter"})
_FIRST_WORD = re.compile(r"\s*(\w+)")
# In a `WITH`, a write is its final statement's keyword; `replace(` is a function
# (a CTE computing a column), `replace into` a write.
_CTE_WRITE = re.compile(r"\b(?:insert|update|delete|replace)\b(?!\s*\()", re.IGNORECASE)


def is_write(statement: str) -> bool:
    """Whether a SQL statement may write (a read, a ``PRAGMA``, a ``BEGIN``: False)."""
    text = _NOISE.sub(" ", statement)
    first = _FIRST_WORD.match(text)
    word = first.group(1).lower() if first else ""
    if word in _WRITE_WORDS:
        return True
    # A `WITH` counts only when it leads to a write: a common table expression in a
    # SELECT is a read (and a read of a file must not make a step look like a writer).
    return word == "with" and _CTE_WRITE.search(text) is not None


def install() -> None:
    """Watch SQLite connections opened from now on (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    import sqlite3
    import sqlite3.dbapi2

    original = sqlite3.dbapi2.connect

    @functools.wraps(original)
    def connect(database: Any, *args: Any, **kwargs: Any) -> Any:
        conn = original(database, *args, **kwargs)
        if _in_memory(database):
            _watch(conn, database)
        elif not _ours():
            path = _file_path(database)
            if path is not None:
                _watch_file(conn, path)
        return conn

    connect.__nbdurable_original__ = original  # type: ignore[attr-defined]
    # Both names: SQLAlchemy's driver calls `sqlite3.dbapi2.connect`, aiosqlite and
    # most libraries `sqlite3.connect` (a name bound by `from sqlite3 import
    # connect` before the extension loaded is not seen).
    sqlite3.connect = sqlite3.dbapi2.connect = connect


def _in_memory(database: Any) -> bool:
    if isinstance(database, bytes):
        database = database.decode("utf-8", "replace")
    if not isinstance(database, str):
        return False
    return database in ("", ":memory:") or (
        database.startswith("file:") and ("mode=memory" in database or ":memory:" in database)
    )


def _file_path(database: Any) -> str | None:
    """The absolute path of a file database (None: not one this can name)."""
    try:
        database = os.fsdecode(database)
    except TypeError:
        return None
    if database.startswith("file:"):
        database = database[5:].partition("?")[0]
        if database.startswith("//"):  # file:///abs/path
            database = database[2:]
    return os.path.abspath(database) if database else None


def _ours() -> bool:
    """Whether the connection is being opened by nbdurable's own store."""
    frame = sys._getframe(2)
    for _ in range(12):  # diskcache's Cache._con under nbdurable.store's engine
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith("nbdurable.store"):
            return True
        frame = frame.f_back
    return False


def _watch_file(conn: Any, path: str) -> None:
    def traced(statement: str) -> None:
        if _file_counted.get(path) == _interval:  # known written since the last snapshot
            return
        if is_write(statement):
            with _lock:
                _file_writes[path] = _file_writes.get(path, 0) + 1
                _file_counted[path] = _interval

    try:
        conn.set_trace_callback(traced)
    except Exception:  # a connection that refuses it: not seen
        return


def file_counts() -> dict[str, int]:
    """Writes so far, per database file; a write counts once between two snapshots.

    Each call starts a new interval: the first write to a file after it counts.
    """
    global _interval
    with _lock:
        out = dict(_file_writes)
        _interval += 1
    return out


def files_written(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The database files written to between two :func:`file_counts`, sorted."""
    return sorted(p for p, n in after.items() if n > before.get(p, 0))


def _watch(conn: Any, database: Any) -> None:
    entry = _Entry(str(database) or ":memory:")
    key = id(entry)

    def traced(statement: str) -> None:
        if entry.counted == _interval:  # known written since the last snapshot
            return
        if is_write(statement):
            with _lock:
                entry.writes += 1
                entry.counted = _interval

    try:
        conn.set_trace_callback(traced)
    except Exception:  # a connection that refuses it: not seen, as before
        return
    _entries[key] = weakref.ref(entry, lambda _ref, key=key: _entries.pop(key, None))


def counts() -> dict[int, int]:
    """Writes so far, per in-memory connection still alive (once between two snapshots).

    Each call starts a new interval, as :func:`file_counts` does.
    """
    global _interval
    out = {}
    with _lock:
        for key, ref in list(_entries.items()):
            entry = ref()
            if entry is not None:
                out[key] = entry.writes
        _interval += 1
    return out


def written(before: dict[int, int], after: dict[int, int]) -> list[str]:
    """The databases of connections alive at ``after`` written to since ``before``."""
    out = []
    for key, n in after.items():
        if n > before.get(key, 0):
            entry = _entries.get(key)
            found = entry() if entry is not None else None
            out.append(found.database if found is not None else ":memory:")
    return out
