"""What a replayed step that wrote to a database file binds, or raises, instead of its handles.

:func:`nbdurable.dbwrites.decide` says what a run does with such a step; this
is the engine's half of it. A handle the record could not save is bound to a
:class:`StandIn`: any use raises :class:`~nbdurable.errors.NotRestored` naming
the variable, and it fingerprints as the handle did when recorded
(:func:`recorded_fp`), so the steps that read it compare the same and replay.
A step that would write again raises :class:`~nbdurable.errors.RepeatRefused`
(:func:`refuse`).
"""

from __future__ import annotations

from typing import Any

from ..dbwrites import Decision
from ..errors import NotRestored, RepeatRefused
from ..store.records import StepRecord


def refuse(decision: Decision, label: str) -> RepeatRefused:
    """The error a run raises instead of writing ``decision.files`` again."""
    return RepeatRefused(decision.refusal(f"step {label!r}"))


def standins(rec: StepRecord, label: str) -> dict[str, StandIn]:
    """A stand-in for each handle of ``rec`` (its unsaved variables)."""
    return {
        v.name: StandIn(v.name, v.type, label, v.fp) for v in rec.variables if v.kind == "unsaved"
    }


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
