"""Copying one run between stores, of any engines (``nbdurable copy``).

Every record of the run is read and verified against the source's key
before anything is written; then the saved variables its steps refer to
are read (each verified against its SHA-256) and stored by content in the
destination; then every record is re-signed with the destination's key (and
bound to the destination store, see :mod:`.codec`) and written in ONE
transaction, with a manifest of the destination's own (see :mod:`.manifest`).
A record that fails its check stops the copy before any record is written;
a damaged saved variable stops it before the records are written
(variables already copied are unreferenced, and ``nbdurable gc`` removes
them). The run's lease is not copied: whoever
records into the copy takes its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptRecord, StoreError, UsageProblem
from . import layout
from .base import Store
from .layout import RunKeys
from .records import blob_refs


@dataclass
class CopyReport:
    """What :func:`copy_run` copied."""

    run: str
    records: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    #: Saved variables missing from the source: their steps run again after the copy too.
    missing: list[str] = field(default_factory=list)


def copy_run(src: Store, dst: Store, run_id: str) -> CopyReport:
    """Copy run ``run_id`` from ``src`` to ``dst`` (see the module docstring).

    Raises with one line, writing no record, if a record or a saved variable
    fails its check or ``dst`` already holds the run.
    """
    rk = RunKeys(run_id)
    # The manifest is the source store's: the destination writes its own with the records.
    own = (rk.lease, rk.manifest)
    keys = [k for k in src.scan(rk.base) if k not in own]
    if not keys:
        raise UsageProblem(f"no run {run_id!r} in {src.path}: see `nbdurable ls`")
    if any(k not in own for k in dst.scan(rk.base)):
        raise UsageProblem(
            f"run {run_id!r} already has records in {dst.path}; nothing was copied. "
            f"Clear it there first (nbdurable clear --all --run NAME --store ...)"
        )
    report = CopyReport(run_id)
    puts: list[tuple[str, dict[str, Any], bytes]] = []
    refs: dict[str, None] = {}  # ordered, once each
    with src.reading():  # the run's manifest read once, not once per step
        for key in keys:
            try:
                got = src.get(key)
            except CorruptRecord as exc:
                raise StoreError(
                    f"record {key!r} of run {run_id!r} in {src.path} fails its check ({exc}); "
                    "nothing was copied"
                ) from exc
            if got is None:  # deleted while we read: not part of the run any more
                continue
            header, body = got
            puts.append((key, header, bytes(body)))
            where = layout.parse(key)
            if where is not None and where.kind in ("step", "version"):
                refs.update(dict.fromkeys(blob_refs(header)))
    for sha in refs:
        try:
            blob = src.get_blob(sha)
        except CorruptRecord as exc:
            raise StoreError(
                f"a saved variable of run {run_id!r} in {src.path} fails its check ({exc}); "
                "no record was copied"
            ) from exc
        if blob is None:
            report.missing.append(sha)
            continue
        got_sha, written = dst.put_blob(bytes(blob.stream), blob.buffers)
        if got_sha != sha:  # cannot happen for a verified blob: refuse rather than guess
            raise StoreError(
                f"saved variable {sha[:12]} of run {run_id!r} changed on its way to "
                f"{dst.path}; no record was copied"
            )
        report.blobs += 1
        report.blob_bytes += written
    dst.apply(puts=puts)
    report.records = len(puts)
    return report


def fork_run(store: Store, run_id: str, new_run: str, steps: set[str] | None) -> CopyReport:
    """A new run ``new_run`` holding ``run_id``'s records of ``steps`` (None: of every step).

    Within one store: each record of those steps (its versions, sub-steps
    and state), the run's sub-steps called outside any step and its meta are
    read, verified and written anew under the fork's keys, with the fork's
    lineage (``RunKeys.fork``: ``parent``, ``forked_at``; a key no kernel
    rewrites), in ONE transaction. Saved variables are stored
    once by content, so the fork's records point at the same ones: forking
    a run that holds a 1 GB array writes no second GB, only the records. The
    parent is only read; ``gc`` keeps a variable while any run refers to it,
    so clearing or deleting the parent keeps what the fork shares.
    """
    src, dst = RunKeys(run_id), RunKeys(new_run)
    if any(k not in (dst.lease, dst.manifest) for k in store.scan(dst.base)):
        raise UsageProblem(
            f"run {new_run!r} already has records; nothing was forked. Choose another name, "
            f"or clear it first (nbdurable clear --all --run {new_run})"
        )
    report = CopyReport(new_run)
    puts: list[tuple[str, dict[str, Any], bytes]] = []
    with store.reading():  # the run's manifest read once, not once per step
        for key in store.scan(src.base):
            where = layout.parse(key)
            # A pending approval is the parent's question: a fork that reaches it asks again.
            # The manifest is the source run's own: the fork's records get the fork's.
            if where is None or where.kind in ("lease", "changed", "fork", "pending", "manifest"):
                continue
            if steps is not None and where.kind in ("step", "state", "version", "vsub", "sub"):
                if where.step not in steps and where.step != layout.RUN_SCOPE:
                    continue
            try:
                got = store.get(key)
            except CorruptRecord as exc:
                raise StoreError(
                    f"record {key!r} of run {run_id!r} fails its check ({exc}); nothing was forked"
                ) from exc
            if got is None:
                continue
            header, body = dict(got[0]), bytes(got[1])
            if "run" in header:
                header["run"] = new_run
            if where.kind == "meta":
                header["run"] = new_run
            puts.append((dst.base + key[len(src.base) :], header, body))
    if not puts:
        raise UsageProblem(f"no run {run_id!r} in {store.path}: see `nbdurable ls`")
    lineage = {"kind": "fork", "run": new_run, "parent": run_id, "forked_at": time.time()}
    store.apply(puts=[*puts, (dst.fork, lineage, b"")])
    report.records = len(puts)
    return report
