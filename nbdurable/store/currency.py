"""``nbdurable check``'s look at every run's manifest: records that are no longer current.

A record its run's manifest refuses (written before its step was cleared,
an earlier step record rolled back in place, or stamped under a manifest
that is now missing or unreadable; see :mod:`.manifest`) can never be used:
its step runs again. ``check`` names each one; with ``fix`` it deletes them
and, for a run whose manifest was missing, starts a new one, so the store
is sound again. No value is unpickled.
"""

from __future__ import annotations

import functools
import warnings

from ..errors import CorruptRecord, NbdurableWarning, StaleRecord
from . import layout
from .base import Store

#: The kinds of keys a manifest speaks for (see :func:`layout.parse`).
_GUARDED = ("step", "sub", "version", "vsub")


def check_runs(store: Store, fix: bool, done: str) -> list[str]:
    """One line per record no longer current (``done`` ends a line of one repaired)."""
    problems: list[str] = []
    stale: list[str] = []
    unproven: set[str] = set()  # runs whose manifest is missing
    with store.reading():  # each run's manifest read once, not once per step record
        for key in store.scan(layout.RUNS):
            where = layout.parse(key)
            if where is None or where.kind not in _GUARDED:
                continue
            try:
                store.get(key)
            except StaleRecord as exc:
                stale.append(key)
                problems.append(f"{exc}".removesuffix("; it is ignored") + (done if fix else ""))
                if exc.reason == "unproven":
                    unproven.add(where.run_hash)
            except CorruptRecord:
                # A record failing its signature is the signature check's to name; a
                # StoreError (the store cannot be read) goes up: the store is not "sound".
                continue
    if fix and stale:
        store.apply(deletes=stale)
        with warnings.catch_warnings():
            # check says it here, once per run, rather than as a warning
            warnings.simplefilter("ignore", NbdurableWarning)
            for run in sorted(unproven):
                store._manifest_for_write(run)  # noqa: SLF001 - starts the run's new manifest
    problems += [
        f"run {run}: its manifest is missing or unreadable"
        + ("; a new one was started" + done if fix else "")
        for run in sorted(unproven)
    ]
    return problems + _lost_rows(store, fix, done)


def _lost_rows(store: Store, fix: bool, done: str) -> list[str]:
    """Steps with fewer sub-step rows than when their record was written.

    A lost row cannot be brought back: the step's record still replays, and
    its body, if it runs again, makes that call again. The repair notes the
    count there is now, so the loss is said once.
    """
    problems = []
    for mkey in store.scan(layout.RUNS):
        where = layout.parse(mkey)
        if where is None or where.kind != "manifest":
            continue
        m = store._read_manifest(where.run_hash)  # noqa: SLF001 - the store's own bookkeeping
        if m is None:
            continue
        rk = layout.RunKeys.of_hash(where.run_hash)
        for scope, (_gen, sig, rows) in sorted(m.steps.items()):
            if not sig or not store.has(rk.step(scope)):
                continue
            now = store.stats(rk.subs_prefix(scope))[0]
            if now < rows:
                problems.append(
                    f"step {scope!r} of run {where.run_hash} has lost {rows - now} of its {rows} "
                    "sub-step rows (its calls are made again if its body runs again)"
                    + (f"; noted{done}" if fix else "")
                )
                if fix:
                    note = functools.partial(_note, store, rk, scope, now)
                    store._atomically(mkey, note)  # noqa: SLF001
    return problems


def _note(store: Store, rk: layout.RunKeys, scope: str, rows: int) -> None:
    """Write the run's manifest with ``rows`` as the step's count (inside a transaction)."""
    m = store._read_manifest(rk.base[2:-1])  # noqa: SLF001
    if m is not None and scope in m.steps:
        m.steps[scope][2] = rows
        m.seq += 1
        store.write({rk.manifest: store._encode(rk.manifest, m.to_header())})  # noqa: SLF001
