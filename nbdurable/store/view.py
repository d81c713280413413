"""RunView: the one reader of a run's records and states.

The kernel side (is there a record to replay?), the listing (``%step list``,
``nbdurable status``, the panel), clear and pin, the runner (what did this
attempt record?) and the admin commands all read records through here, so
"unreadable" means the same everywhere: a record that fails its signature
or does not decode is never used, and every reader can tell it from an
absent one.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptRecord
from .base import Store
from .layout import RunKeys
from .records import StepRecord, StepState


def read_header(store: Store, key: str) -> dict[str, Any] | None:
    """The verified header of ``key``; None if absent or unreadable."""
    try:
        got = store.get(key)
    except CorruptRecord:
        return None
    return None if got is None else got[0]


class RunView:
    """One run's records as the store holds them now (every call reads the store)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.keys = RunKeys(run_id)

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.keys.run_id

    def header(self, key: str) -> dict[str, Any] | None:
        """The verified header of one of the run's keys; None if absent or unreadable."""
        return read_header(self.store, key)

    def parent(self) -> str | None:
        """The run this one was forked from (``nbdurable fork``); None if it is no fork."""
        parent = (self.header(self.keys.fork) or {}).get("parent")
        return parent if isinstance(parent, str) else None

    def record(self, step: str) -> StepRecord | None:
        """The step's record, None if absent.

        Raises :class:`CorruptRecord` if it is there but cannot be used
        (its signature fails, or its header does not decode).
        """
        got = self.store.get(self.keys.step(step))
        return None if got is None else self._step_record(step, got[0])

    @staticmethod
    def _step_record(step: str, header: dict[str, Any]) -> StepRecord:
        try:
            return StepRecord.from_header(header)
        except (KeyError, TypeError) as exc:
            raise CorruptRecord(f"step record {step!r} is malformed ({exc!r})") from exc

    def state(self, step: str) -> StepState:
        """The step's pin/failure/stale state (empty if none).

        Raises :class:`CorruptRecord` if it is there but unreadable.
        """
        got = self.store.get(self.keys.state(step))
        return StepState() if got is None else StepState.from_header(got[0])

    def records(self) -> dict[str, StepRecord | None]:
        """Every step record of the run by step key; None for one that cannot be used."""
        return {step: rec for step, (rec, _) in self.records_sized().items()}

    def records_sized(self) -> dict[str, tuple[StepRecord | None, int]]:
        """:meth:`records`, each with the bytes its record takes in the store (``size_of``)."""
        out: dict[str, tuple[StepRecord | None, int]] = {}
        prefix = self.keys.steps
        # One range read, the run's manifest read afresh once at its start (not a
        # read per step: a view of thousands of steps); each record verified as get() does.
        with self.store.reading():  # a large record read alone does not read it again
            loaded = self.store.load_prefix(prefix)
            for k in list(loaded):
                step, raw = k[len(prefix) :], loaded.pop(k)
                # A record the range read left out (a large one) is read, and sized, alone.
                size = len(raw) if raw is not None else self.store.size_of(k)
                try:
                    got = self.store.get_loaded(k, raw)
                    rec = None if got is None else self._step_record(step, got[0])
                except CorruptRecord:
                    rec = None
                out[step] = (rec, size)
        return out

    def states(self) -> dict[str, StepState]:
        """Every readable step state of the run by step key."""
        out: dict[str, StepState] = {}
        prefix = self.keys.states
        for k in self.store.scan(prefix):
            try:
                got = self.store.get(k)
            except CorruptRecord:
                continue
            if got:
                out[k[len(prefix) :]] = StepState.from_header(got[0])
        return out

    def calls_since(self, scope: str | None, since: float) -> int:
        """Sub-step records of ``scope`` (None: every scope) started at or after ``since``."""
        prefix = self.keys.all_subs if scope is None else self.keys.subs_prefix(scope)
        n = 0
        for k in self.store.scan(prefix):
            h = self.header(k)
            if h is not None and h.get("started", 0) >= since:
                n += 1
        return n

    def sub_stats(self, scope: str) -> tuple[int, int]:
        """``(count, bytes)`` of the sub-step records of ``scope``."""
        return self.store.stats(self.keys.subs_prefix(scope))

    def all_sub_stats(self) -> dict[str, tuple[int, int]]:
        """:meth:`sub_stats` of every scope that has sub-step records, in one read."""
        return self.store.stats_by_scope(self.keys.all_subs)

    def sub_ids(self, scope: str) -> set[str]:
        """The ids of the sub-step records of ``scope`` (a key scan: no value is read)."""
        prefix = self.keys.subs_prefix(scope)
        return {k[len(prefix) :] for k in self.store.scan(prefix)}

    def known(self) -> bool:
        """True if the store holds any record of this run."""
        return self.store.stats(self.keys.base)[0] > 0
