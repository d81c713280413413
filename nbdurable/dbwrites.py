"""A step that wrote to a database file: replayed with stand-ins, or never run again silently.

A step that writes rows into a SQLite file (a SQLAlchemy session's commit,
pandas' ``to_sql``, ``cursor.execute("insert ...")``) usually binds the
handle it wrote through: an engine, a session, a connection, a cursor. These
cannot be saved, and a record with an unsaved variable is replayed by
running its body again — which would insert the rows a second time (a plain
run has them once). The file keeps what the step wrote, so:

* when everything the record could not save is such a handle (and nothing of
  the process is unreplayable), the step **replays**: each handle it made is
  bound to a stand-in (:mod:`nbdurable.durable.standins`), which raises
  :class:`~nbdurable.errors.NotRestored` naming the variable when it is used
  (the data is in the file already; make a new connection to read it). A
  handle it only used, which a plain cell or an earlier step made again in
  this kernel, stays live. Should the replay fail (a damaged blob, a value
  that will not load), the step refuses, as below;
* otherwise (a generator, a thread, an in-memory database beside the file)
  the body would run and write again: the step **refuses** with
  :class:`~nbdurable.errors.RepeatRefused`, one line naming the file and how
  to run it anyway (``%%step --force``).

This module decides and words the decision (the step runner and ``status``
both ask it: every line about it is built here); the step runner acts on it.
The files a step wrote are in its record's process delta (``"dbfiles"``, see
:mod:`nbdurable.procstate.sqlite`). A handle is known by its type's module
and name (:data:`HANDLES`); other database libraries' handles are not known
and take the refusing branch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .store.records import StepRecord

#: (top-level package, class name) of handles to a database: what they did is in
#: the file, and nothing else of them is the notebook's data.
HANDLES = frozenset(
    {
        ("sqlite3", "Connection"),
        ("sqlite3", "Cursor"),
        ("aiosqlite", "Connection"),
        ("aiosqlite", "Cursor"),
        ("sqlalchemy", "Engine"),
        ("sqlalchemy", "AsyncEngine"),
        ("sqlalchemy", "Connection"),
        ("sqlalchemy", "AsyncConnection"),
        ("sqlalchemy", "Session"),
        ("sqlalchemy", "AsyncSession"),
        ("sqlalchemy", "sessionmaker"),
        ("sqlalchemy", "async_sessionmaker"),
        ("sqlalchemy", "scoped_session"),
        ("sqlalchemy", "CursorResult"),
    }
)


def is_handle(type_name: str) -> bool:
    """Whether a recorded type name (``"sqlalchemy.engine.base.Engine"``) is a handle."""
    top = type_name.partition(".")[0]
    return (top, type_name.rpartition(".")[2]) in HANDLES


def files(rec: StepRecord) -> list[str]:
    """The database files the step wrote to, as recorded ([] when none)."""
    return list((rec.process or {}).get("dbfiles", ()))


@dataclass(frozen=True)
class Decision:
    """What a run does with a recorded step that wrote to database files."""

    action: str  # "standins": replay, handles bound to stand-ins; "refuse"
    files: tuple[str, ...]
    handles: tuple[str, ...] = ()  # for "standins": the variables bound to stand-ins
    why: str = ""  # for "refuse": why the body would run

    def on_replay(self) -> str:
        """What a replay does, the clause each line below is built from."""
        if self.action == "standins":
            return (
                f"{', '.join(self.handles)} come back as stand-ins that raise NotRestored if used"
            )
        return (
            f"it refuses to run its body again, which would write to {shown(self.files)} "
            "a second time; `%%step --force` runs it"
        )

    def next_run(self) -> str:
        """What the next run does, for ``nbdurable status --why``."""
        if self.action == "standins":
            return f"replays: {shown(self.files)} keeps what it wrote; {self.on_replay()}"
        return self.on_replay().removeprefix("it ")

    def detail(self) -> str:
        """The short reason a status row and the panel show."""
        if self.action == "standins":
            return f"wrote to {shown(self.files)}; {', '.join(self.handles)} come back as stand-ins"
        return (
            f"would write to {shown(self.files)} again ({self.why}): refused, "
            "`%%step --force` runs it"
        )

    def when_recorded(self) -> str:
        """How the line said when the step is recorded ends."""
        return (
            f"It wrote to {shown(self.files)}, which keeps the rows: on replay {self.on_replay()}."
        )

    def refusal(self, label: str) -> str:
        """The one line of :class:`~nbdurable.errors.RepeatRefused`."""
        return (
            f"{label} would write to {shown(self.files)} again: its body runs on replay "
            f"because {self.why}. Run it with `%%step --force` to write again, or clear it."
        )


def decide(rec: StepRecord | None) -> Decision | None:
    """The decision for ``rec`` (None: it wrote to no file, or it replays as it is)."""
    if rec is None or rec.replayable:
        return None
    written = tuple(files(rec))
    if not written:
        return None
    unsaved = [v for v in rec.variables if v.kind == "unsaved"]
    others = [v.name for v in unsaved if not is_handle(v.type)]
    reasons = list((rec.process or {}).get("unreplayable", ()))
    if not others and not reasons:
        return Decision("standins", written, tuple(v.name for v in unsaved))
    parts = []
    if others:
        parts.append(f"{', '.join(others)} cannot be saved")
    parts += reasons
    return Decision("refuse", written, why="; ".join(parts))


def shown(paths: tuple[str, ...]) -> str:
    """The files' names, for a line (the first three)."""
    names = [os.path.basename(p) or p for p in paths[:3]]
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return ", ".join(names) + more
