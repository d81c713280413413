"""Whole runs in a store: list them, export one as an audit log, collect garbage, check.

Used by ``nbdurable ls``, ``export``, ``gc`` and ``check``. Everything here reads the
signed JSON headers of records; a value is unpickled only for
``export --values``, and only after the store verified its signature.

A run's *last activity* is the latest of its ``meta`` record's ``last`` and
the end times of its step and sub-step records and failures: ``meta`` is
written with step records only, so a step that crashed after recording
sub-steps would otherwise look older than it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import redact
from ..errors import CorruptRecord, UsageProblem
from ..text import plural
from . import layout
from .base import Store
from .layout import RUN_SCOPE, RunKeys
from .records import BLOB_KINDS, blob_refs
from .versions import KEEP_VERSIONS, excess
from .view import RunView, read_header

#: Version of the export document. Increment on a breaking change of its fields.
EXPORT_FORMAT = 2  # 2: a step's "cell" counts from 1 (was "position", from 0)


@dataclass
class RunInfo:
    """One run of a store, as ``nbdurable ls`` shows it."""

    run: str
    hash: str
    notebook: str | None = None
    steps: int = 0
    substeps: int = 0
    pinned: int = 0
    keys: int = 0
    size: int = 0
    last: float | None = None
    #: the run it was forked from (``nbdurable fork``, ``%step fork``); None: not a fork
    parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self)


@dataclass
class _Run:
    """Everything under ``r/<hash>/``, read once."""

    hash: str
    keys: list[str] = field(default_factory=list)
    meta: dict[str, Any] | None = None
    fork: dict[str, Any] | None = None  # see RunKeys.fork
    steps: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # None: unreadable
    states: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    subs: dict[str, list[str]] = field(default_factory=dict)  # scope -> keys
    #: (step, version) -> an earlier version's record header (None: unreadable)
    versions: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)
    run_id: str | None = None
    last: float | None = None
    unreadable: list[str] = field(default_factory=list)  # keys that failed to verify

    @property
    def base(self) -> str:
        return RunKeys.of_hash(self.hash).base

    def pinned(self) -> set[str]:
        """Pinned steps, and steps whose state is unreadable (kept to be safe)."""
        return {k for k, st in self.states.items() if st is None or st.get("pinned")}


def _later(a: float | None, b: Any) -> float | None:
    if not isinstance(b, (int, float)):
        return a
    return b if a is None or b > a else a


def _read_runs(store: Store) -> dict[str, _Run]:
    runs: dict[str, _Run] = {}
    for key in store.scan(layout.RUNS):
        where = layout.parse(key)
        if where is None:
            continue
        run = runs.setdefault(where.run_hash, _Run(where.run_hash))
        run.keys.append(key)
        h = read_header(store, key)
        if h is None:
            run.unreadable.append(key)
        if where.kind == "fork":
            run.fork = h
        elif where.kind == "meta":
            run.meta = h
            if run.meta:
                run.run_id = run.meta.get("run") or run.run_id
                run.last = _later(run.last, run.meta.get("last"))
        elif where.kind == "step":
            run.steps[where.step] = h
            if h:
                run.run_id = run.run_id or h.get("run")
                run.last = _later(run.last, h.get("started", 0) + h.get("duration", 0))
        elif where.kind == "state":
            run.states[where.step] = h
            if h:
                run.last = _later(run.last, h.get("failed_at"))
        elif where.kind == "version":
            run.versions[(where.step, where.sub)] = h
        elif where.kind == "sub":
            run.subs.setdefault(where.step, []).append(key)
            if h:
                run.run_id = run.run_id or h.get("run")
                run.last = _later(run.last, h.get("started", 0) + h.get("duration", 0))
    return runs


def _blob_refs(header: dict[str, Any]) -> set[str]:
    return set(blob_refs(header))


def list_runs(store: Store) -> list[RunInfo]:
    """Every run in the store, most recently active first."""
    out = []
    for run in _read_runs(store).values():
        n, size = store.stats(run.base)
        refs: set[str] = set()
        for h in [*run.steps.values(), *run.versions.values()]:
            refs |= _blob_refs(h or {})
        size += sum(store.size_of(layout.blob(sha)) for sha in refs)
        out.append(
            RunInfo(
                run=run.run_id or f"(unknown run {run.hash})",
                hash=run.hash,
                notebook=(run.meta or {}).get("notebook"),
                steps=len(run.steps),
                substeps=sum(len(v) for v in run.subs.values()),
                pinned=len(run.pinned()),
                keys=n,
                size=size,
                last=run.last,
                parent=(run.fork or {}).get("parent"),
            )
        )
    return sorted(out, key=lambda r: -(r.last or 0))


def known_run(store: Store, run_id: str) -> bool:
    """True if the store holds any record of ``run_id``."""
    return RunView(store, run_id).known()


def run_names(store: Store) -> list[str]:
    """Ids of the runs in the store (for error messages)."""
    return [r.run for r in list_runs(store)]


# -- export ---------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """``value`` if JSON can represent it, else a stub naming its type."""
    from .values import type_name

    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError, RecursionError):
        # masked whole, then cut (a value written before a key format was known)
        text = redact.scrub(repr(value))[0]
        return {"type": type_name(value), "repr": text if len(text) <= 500 else text[:500] + "…"}


def _load_value(data: bytes | memoryview, type_name: str, buffers: Any = None) -> Any:
    from . import values

    try:
        return _jsonable(values.loads(data, None, buffers))
    except Exception as exc:  # unpickling imports modules; they may be missing here
        return {"type": type_name, "error": f"cannot load here: {type(exc).__name__}: {exc}"}


def export_run(
    store: Store,
    run_id: str,
    rows: Iterable[Any],
    notebook: Path | None = None,
    with_values: bool = False,
) -> dict[str, Any]:
    """The run's log: steps in notebook order, each with its sub-steps in call order.

    ``rows`` are the run's steps as ``nbdurable status`` lists them
    (:func:`nbdurable.status.step_infos`: they know the notebook's order
    and each step's state). Times are seconds since the epoch; fingerprints
    are the ones the engine compares (source, inputs, call arguments) plus a
    SHA-256 of each stored value. With ``with_values``, values JSON can
    represent are included, others as ``{"type", "repr"}``.
    """
    rk = RunKeys(run_id)
    steps = []
    for info in rows:
        rec = None if info.key == RUN_SCOPE else read_header(store, rk.step(info.key))
        step: dict[str, Any] = {
            "key": info.key,
            "label": info.label,
            "state": info.state,
            "detail": info.detail,
            "cell": info.cell,  # from 1, as `status` and frontends number cells
            "pinned": info.pinned,
            "size": info.size,
            "version": info.version,  # the current record's; others kept: "versions"
            "versions": info.versions,
        }
        if rec is not None:
            step.update(
                {
                    "started": rec["started"],
                    "duration": rec["duration"],
                    "source_fp": rec["source_fp"],
                    "inputs": rec["inputs"],
                    "input_from": rec["input_from"],
                    "deleted": rec["deleted"],
                    "substep_calls": rec.get("substeps", 0),
                    "variables": _variables(store, rec["variables"], with_values),
                    "outputs": len(rec["outputs"]),
                }
            )
            if with_values:
                step["source"] = rec["source"]
                step["output_data"] = rec["outputs"]
        step["substeps"] = substep_rows(store, rk.subs_prefix(info.key), with_values)
        steps.append(step)
    meta = read_header(store, rk.meta) or {}
    return {
        "format": EXPORT_FORMAT,
        "run": run_id,
        "notebook": meta.get("notebook") or (str(notebook) if notebook else None),
        "store": str(store.path),
        "exported_at": time.time(),
        "values": with_values,
        "steps": steps,
    }


def _variables(
    store: Store, variables: list[dict[str, Any]], with_values: bool
) -> list[dict[str, Any]]:
    out = [_variable(store, v, with_values) for v in variables]
    if with_values:  # a step's shared variables: one blob, its pickles in the record's order
        joint: dict[str, list[dict[str, Any]]] = {}
        spilled: dict[str, list[Any]] = {}
        for var, row in zip(variables, out, strict=True):
            if var.get("kind") == "shared":
                joint.setdefault(var["ref"], []).append(row)
                spilled.setdefault(var["ref"], []).extend(var.get("spilled") or ())
        for sha, rows in joint.items():
            got = _load_shared(store, sha, spilled[sha], len(rows))
            for row, value in zip(rows, got, strict=True):
                row.update(value)
    return out


def _load_shared(store: Store, sha: str, spilled: list[Any], count: int) -> list[dict[str, Any]]:
    from . import spill, values

    try:
        blob = spill.get(store, sha, spilled)
    except CorruptRecord as exc:
        return [{"error": str(exc)}] * count
    if blob is None:
        return [{"error": "its saved value is missing from the store"}] * count
    try:
        got = values.load_values(blob.stream, count, None, blob.buffers)
    except Exception as exc:  # unpickling imports modules; they may be missing here
        return [{"error": f"cannot load here: {type(exc).__name__}: {exc}"}] * count
    return [{"value": _jsonable(value)} for value, _plain in got]


def _variable(store: Store, var: dict[str, Any], with_values: bool) -> dict[str, Any]:
    out = {k: var.get(k) for k in ("name", "kind", "type", "size", "fp")}
    if var.get("kind") in BLOB_KINDS:
        out["sha256"] = var["ref"]
    if with_values:
        if var.get("kind") == "module":
            out["value"] = {"module": var["ref"]}
        elif var.get("kind") == "value":
            try:
                blob = store.get_blob(var["ref"])
            except CorruptRecord as exc:
                blob, out["error"] = None, str(exc)
            if blob is not None:
                out["value"] = _load_value(blob.stream, var.get("type", ""), blob.buffers)
            elif "error" not in out:
                out["error"] = "its saved value is missing from the store"
    return out


def substep_rows(store: Store, prefix: str, with_values: bool) -> list[dict[str, Any]]:
    """The sub-steps under ``prefix`` in call order: id, function, arguments' fingerprint,
    timings, size, type and the SHA-256 of the recorded result (with its value when
    ``with_values``); one that fails its check is ``{"id", "error"}``.
    """
    subs = []
    for key in store.scan(prefix):
        try:
            got = store.get(key)
        except CorruptRecord as exc:
            subs.append({"id": key[len(prefix) :], "error": str(exc), "started": None})
            continue
        if got is None:
            continue
        header, body = got
        sub = {
            k: header.get(k) for k in ("id", "fn", "args_fp", "started", "duration", "size", "type")
        }
        sub["sha256"] = hashlib.sha256(body).hexdigest()
        if with_values:
            buffers = []
            for sha in header.get("buffers") or ():  # a large bytes result's memory
                blob = store.get_blob(sha) if isinstance(sha, str) else None
                buffers += blob.buffers if blob is not None else []
            sub["value"] = _load_value(body, header.get("type", ""), buffers)
        subs.append(sub)
    # In call order; keys sort as text, so "search:10" would come before "search:2".
    return sorted(subs, key=lambda s: (s["started"] is None, s["started"] or 0))


def export_lines(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The export as JSON lines: a ``run`` line, then each ``step`` and its ``sub`` lines."""
    head = {k: v for k, v in doc.items() if k != "steps"}
    yield {"kind": "run", **head}
    for step in doc["steps"]:
        subs = step["substeps"]
        yield {
            "kind": "step",
            **{k: v for k, v in step.items() if k != "substeps"},
            "substep_count": len(subs),
        }
        for sub in subs:
            yield {"kind": "sub", "step": step["key"], **sub}


# -- gc -------------------------------------------------------------------------------


@dataclass
class GcReport:
    """What ``gc`` removed (or, with ``dry_run``, would remove)."""

    dry_run: bool
    cutoff: float
    removed_runs: list[str] = field(default_factory=list)  # gone entirely
    kept_pinned: dict[str, list[str]] = field(default_factory=dict)  # run -> pinned steps kept
    #: earlier versions of steps removed, beyond ``keep_versions`` per step
    versions: int = 0
    keys: int = 0
    bytes: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self)


def parse_age(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (a bare number is days)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in units else "d"
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not 0 <= value * units[unit] <= 100 * 366 * 86400:
        raise UsageProblem(
            f"--older-than {text!r} is not an age: expected a number and a unit, "
            "e.g. 30d, 12h, 90m, 45s or 2w"
        )
    return value * units[unit]


def gc(
    store: Store,
    older_than: float,
    dry_run: bool = False,
    now: float | None = None,
    keep_versions: int = KEEP_VERSIONS,
) -> GcReport:
    """Remove runs idle for more than ``older_than`` seconds, except their pinned steps.

    A pinned step keeps its record (every version), its state, its
    sub-steps and its run's ``meta``. In the runs that stay, each step that
    is not pinned keeps at most ``keep_versions`` versions, the current one
    included (see :mod:`.versions`). Then blobs (saved variables) that no remaining step record
    references are removed; if any remaining step record cannot be read, no
    blob is removed, since it might reference any of them. Nothing is written
    with ``dry_run``. All deletions happen in one transaction.
    """
    now = time.time() if now is None else now
    report = GcReport(dry_run, now - older_than)
    runs = _read_runs(store)
    deletes: list[str] = []
    for run in runs.values():
        name = run.run_id or f"(unknown run {run.hash})"
        if run.unreadable:
            # Its age and pins cannot be known: often the records were written with
            # another store key (NBDURABLE_KEY). Never delete what cannot be read.
            report.notes.append(
                f"kept run {name!r}: {len(run.unreadable)} of its records fail their signature "
                "check (written with another NBDURABLE_KEY, or damaged)"
            )
            continue
        keep_steps = run.pinned()
        rk = RunKeys.of_hash(run.hash)
        if run.last is not None and run.last >= report.cutoff:
            for step in {s for s, _ in run.versions} - keep_steps:
                extra = excess(store, rk, step, keep_versions)
                report.versions += sum(k.startswith(rk.versions(step)) for k in extra)
                deletes += extra
            continue
        # A run that keeps a pinned step keeps its manifest: without it the step's
        # record could not be proven current (see .manifest), and would not replay.
        keep = {rk.meta, rk.manifest} if keep_steps else set()
        for step in keep_steps:
            keep |= {rk.step(step), rk.state(step)}
            keep |= set(run.subs.get(step, ()))
            keep |= set(store.scan(rk.versions(step)) + store.scan(rk.version_subs(step)))
        gone = [k for k in run.keys if k not in keep]
        if not gone:
            continue
        deletes += gone
        if keep_steps:
            report.kept_pinned[name] = sorted(keep_steps)
        else:
            report.removed_runs.append(name)
    deleted = set(deletes)
    report.keys = len(deletes)
    report.bytes = sum(store.size_of(k) for k in deletes)

    # Blobs: only after every remaining step record was read.
    refs: set[str] = set()
    unreadable = []
    for run in runs.values():
        rk = RunKeys.of_hash(run.hash)
        records = [(rk.step(step), step, h) for step, h in run.steps.items()]
        records += [(rk.version(s, v), f"{s}@{v}", h) for (s, v), h in run.versions.items()]
        for key, step, header in records:
            if key in deleted:
                continue
            if header is None:
                unreadable.append(f"{run.run_id or run.hash}: {step}")
            else:
                refs |= _blob_refs(header)
        # A sub-step whose result is a large bytes keeps its memory in a blob.
        for prefix in (rk.all_subs, rk.all_version_subs):
            for key, raw in store.load_prefix(prefix).items():
                if key in deleted:
                    continue
                try:
                    got = store.get_loaded(key, raw)
                except CorruptRecord:
                    got = None
                if got is None:
                    unreadable.append(f"{run.run_id or run.hash}: sub-step {key}")
                else:
                    refs |= _blob_refs(got[0])
    if unreadable:
        report.notes.append(
            f"kept every saved variable: {len(unreadable)} step record(s) cannot be read "
            f"({', '.join(unreadable[:3])}), and any of them may use any variable"
        )
    else:
        blobs = [k for k in store.scan(layout.BLOBS) if k[len(layout.BLOBS) :] not in refs]
        report.blobs = len(blobs)
        report.blob_bytes = sum(store.size_of(k) for k in blobs)
        deletes += blobs
    if deletes and not dry_run:
        store.apply(deletes=deletes)
    return report


# -- check ------------------------------------------------------------------------------


#: How the engine marks a problem it repaired (see Store.check).
_REPAIRED = "; removed"


@dataclass
class CheckReport:
    """What ``check`` found in a store, and what it repaired."""

    store: str
    dry_run: bool
    found: list[str] = field(default_factory=list)  # every problem, as the engine words it

    @property
    def repaired(self) -> list[str]:
        """The problems repaired (a record or file removed)."""
        return [p for p in self.found if p.endswith(_REPAIRED)]

    @property
    def left(self) -> list[str]:
        """The problems still there (all of them with ``dry_run``)."""
        return [p for p in self.found if not p.endswith(_REPAIRED)]

    def text(self) -> str:
        """What ``nbdurable check`` prints."""
        if not self.found:
            return f"store {self.store}: sound, nothing to repair"
        lines = [
            f"store {self.store}: {plural(len(self.found), 'problem')} found, "
            f"{len(self.repaired)} repaired"
            + (" (--dry-run: nothing was changed)" if self.dry_run else "")
        ]
        lines += [f"  repaired: {p.removesuffix(_REPAIRED)}" for p in self.repaired]
        lines += [f"  found: {p}" for p in self.left]
        if self.left and not self.dry_run:
            lines.append(
                "  what is left cannot be repaired in place: restore the store from a backup, "
                "or move it aside and run the notebook again"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {
            "store": self.store,
            "dry_run": self.dry_run,
            "sound": not self.found,
            "found": self.found,
            "repaired": self.repaired,
            "left": self.left,
        }


def set_aside(db_file: Path) -> Path:
    """Move a damaged database file (with its journal files) out of the database folder,
    into the store directory above it (diskcache's own check would delete a file it does
    not know in its folder); the copy's path.
    """
    name = f"{db_file.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
    kept = db_file.parent.parent / name
    for suffix in ("", "-wal", "-shm"):
        part = db_file.with_name(db_file.name + suffix)
        if part.exists():
            os.replace(part, kept.with_name(kept.name + suffix))
    return kept


def check(store: Store, fix: bool = True) -> CheckReport:
    """Check the store's medium and records; with ``fix``, repair what can be (see Store.check).

    Then every run's records against its manifest (see :mod:`.currency`).
    """
    from .currency import check_runs

    found = store.check(fix=fix)
    return CheckReport(str(store.path), not fix, found + check_runs(store, fix, _REPAIRED))
