"""A step that wrote to a database file: replayed with stand-ins, or never run again silently.

A step that writes rows into a SQLite file (a SQLAlchemy session's commit,
pandas' ``to_sql``, ``cursor.execute("insert ...")``) usually binds the
handle it wrote through: an engine, a session, a connection, a cursor. These
cannot be saved, and a record with an unsaved variable is replayed by
running its body again — which would insert the rows a second time (a plain
run has them once). The file keeps what the step wrote, so:

* when everything the record could not save is such a handle (and nothing of
  the process is unreplayable), the step **replays** and each handle is bound
  to a :class:`StandIn`, which raises :class:`~nbdurable.errors.NotRestored`
  naming the variable when it is used (the data is in the file already; make
  a new connection to read it);
* otherwise (a generator, a thread, an in-memory database beside the file)
  the body would run and write again: the step **refuses** with
  :class:`~nbdurable.errors.RepeatRefused`, one line naming the file and how
  to run it anyway (``%%step --force``).

The files a step wrote are in its record's process delta (``"dbfiles"``, see
:mod:`nbdurable.procstate.sqlite`). A handle is known by its type's module
and name (:data:`HANDLES`); other database libraries' handles are not known
and take the refusing branch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .errors import NotRestored, RepeatRefused
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

    def next_run(self) -> str:
        """What the next run does, for ``nbdurable status --why``."""
        if self.action == "standins":
            return (
                f"replays: {shown(self.files)} keeps what it wrote; {', '.join(self.handles)} "
                "come back as stand-ins that raise NotRestored if used"
            )
        return (
            f"refuses to run its body again, which would write to {shown(self.files)} "
            "a second time; `%%step --force` runs it"
        )

    def detail(self) -> str:
        """The short reason a status row and the panel show."""
        if self.action == "standins":
            return f"wrote to {shown(self.files)}; {', '.join(self.handles)} come back as stand-ins"
        return (
            f"would write to {shown(self.files)} again ({self.why}): refused, "
            "`%%step --force` runs it"
        )

    def refusal(self, label: str) -> str:
        """The one line of :class:`RepeatRefused`."""
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


def refuse(decision: Decision, label: str) -> RepeatRefused:
    """The error a run raises instead of writing ``decision.files`` again."""
    return RepeatRefused(decision.refusal(f"step {label!r}"))


def standins(rec: StepRecord, label: str) -> dict[str, StandIn]:
    """A stand-in for each handle of ``rec`` (its unsaved variables)."""
    return {
        v.name: StandIn(v.name, v.type, label, v.fp) for v in rec.variables if v.kind == "unsaved"
    }


def shown(paths: tuple[str, ...]) -> str:
    """The files' names, for a line (the first three)."""
    names = [os.path.basename(p) or p for p in paths[:3]]
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return ", ".join(names) + more


class StandIn:
    """What a replayed handle is bound to: any use raises :class:`NotRestored`."""

    __slots__ = ("_name", "_type", "_step", "_fp")

    def __init__(self, name: str, type_name: str, step: str, fp: str = "") -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_type", type_name)
        object.__setattr__(self, "_step", step)
        # The handle's fingerprint when recorded: a step reading the stand-in compares
        # this, as it compared the handle, and replays (see recorded_fp).
        object.__setattr__(self, "_fp", fp)

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise NotRestored(
            f"{object.__getattribute__(self, '_name')!r} "
            f"({object.__getattribute__(self, '_type')}) was not restored: step "
            f"{object.__getattribute__(self, '_step')!r} replayed, and what it wrote is in "
            "the database file; open a new connection to read it, or rerun the step "
            "with `%%step --force`"
        )

    def __getattr__(self, attr: str) -> Any:
        # Protocol probes (`getattr(x, "__array__", None)`, by nbdurable's own scans of
        # the namespace, by IPython's display) find nothing, as on any plain object.
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        self._refuse()

    def __setattr__(self, attr: str, value: Any) -> None:
        self._refuse()

    __call__ = __enter__ = __getitem__ = _refuse

    def __exit__(self, *exc: Any) -> None:
        self._refuse()

    def __repr__(self) -> str:
        return (
            f"<not restored: {object.__getattribute__(self, '_name')} "
            f"({object.__getattribute__(self, '_type')})>"
        )

    def __nbdurable_fingerprint__(self) -> str:
        return object.__getattribute__(self, "_fp")

    def __reduce__(self) -> Any:
        return (
            StandIn,
            (
                object.__getattribute__(self, "_name"),
                object.__getattribute__(self, "_type"),
                object.__getattribute__(self, "_step"),
                object.__getattribute__(self, "_fp"),
            ),
        )


def recorded_fp(value: Any) -> str | None:
    """The recorded fingerprint of the handle ``value`` stands in for (None: not a stand-in)."""
    if type(value) is not StandIn:
        return None
    return object.__getattribute__(value, "_fp")
