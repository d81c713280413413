"""The run in this kernel: replay a ``%%step`` cell or execute and record it.

One :class:`Session` per process holds the run context (store, run id,
notebook), the step now executing (sub-steps scope to it), what happened to
each step in this kernel, and the savings so far. It takes a shell-like
object, so it can be driven without the magic layer.
"""

from __future__ import annotations

import ast
import asyncio
import atexit
import contextlib
import hashlib
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from IPython.core.displayhook import DisplayHook

from .. import config, events, faults, redact
from ..errors import CorruptRecord, LeaseHeld, NbdurableError, StoreError, UsageProblem
from ..identity import keys, locate
from ..store import RunKeys, Store, open_store, values
from ..store import engine as store_engine
from ..store.records import StepRecord, StepState
from . import lease, recording
from .capture import Capture, replay, show_last_expr, underlying

_HIDDEN = re.compile(r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|get_ipython|exit|quit)$")


class NbdurableWarning(UserWarning):
    """Something was not recorded, or a record could not be used."""


def warn(message: str) -> None:
    """Warn loudly; every nbdurable warning goes through here.

    A warning raised while a step runs is about this execution, not part of
    the step's output: it goes past the capture, so it is shown now and not
    replayed with the step's outputs on every later run.
    """
    err = sys.stderr
    real = underlying(err)
    if real is err:
        warnings.warn(message, NbdurableWarning, stacklevel=3)
        return
    sys.stderr = real
    try:
        warnings.warn(message, NbdurableWarning, stacklevel=3)
    finally:
        sys.stderr = err


class SubIndex:
    """The sub-step records of one scope, read in one range read on the first lookup.

    A step's index lives as long as the step's execution; the run scope's
    (sub-steps called outside any step) as long as one cell, when the
    extension's per-cell hook is installed. It is read again if the store
    was reopened or something was deleted from it since. A value is handed
    out once; after that, and after a sub-step is recorded, the entry says
    "present: read it from the store", so a second lookup of an id still
    finds its record.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._basis: tuple[Any, int, int, str] | None = None
        self._entries: dict[str, bytes | None] = {}

    def find(self, store: Store, prefix: str, key: str) -> tuple[bool, bytes | None]:
        """``(present, stored bytes or None: read it with Store.get)``."""
        with self._lock:
            if self._stale(store, prefix):
                self._read(store, prefix)
            elif key in self._entries:
                store.check_same()  # never replay from a store deleted since the read
                if self._stale(store, prefix):  # it was reopened just now
                    self._read(store, prefix)
            if key not in self._entries:
                return False, None  # (a miss is checked by the write that follows)
            raw = self._entries[key]
            if raw is not None:
                self._entries[key] = None  # the bytes are handed out once
            return True, raw

    def _stale(self, store: Store, prefix: str) -> bool:
        b = self._basis
        return (
            b is None
            or b[0] is not store
            or b[1] != store.generation
            or b[2] != store.deletions
            or b[3] != prefix
        )

    def _read(self, store: Store, prefix: str) -> None:
        self._entries = store.load_prefix(prefix)
        self._basis = (store, store.generation, store.deletions, prefix)

    def recorded(self, key: str) -> None:
        """Note that ``key`` was just recorded (if this index was read)."""
        with self._lock:
            if self._basis is not None:
                self._entries[key] = None


@dataclass
class StepContext:
    """The ``%%step`` executing now; sub-steps called during it scope to it."""

    key: str
    label: str
    seen: set[str] = field(default_factory=set)
    ordinals: dict[str, int] = field(default_factory=dict)
    subs_recorded: int = 0
    subs_replayed: int = 0
    sub_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    sub_index: SubIndex = field(default_factory=lambda: SubIndex())


@dataclass
class Plan:
    """Everything known about a ``%%step`` cell before it runs."""

    key: str
    label: str
    position: int | None
    py: str  # the cell body as Python (IPython syntax transformed)
    source_fp: str
    analysis: keys.CellAnalysis
    inputs: dict[str, str]  # name -> fingerprint compared with the record
    raw_fps: dict[str, str]  # name -> plain content fingerprint, to spot in-place mutation
    state: StepState


@dataclass
class Savings:
    """What replay saved in this kernel."""

    steps: int = 0
    calls: int = 0
    seconds: float = 0.0


class Session:
    """The durable run of this kernel (or script)."""

    def __init__(self, shell: Any = None) -> None:
        self.shell = shell
        self._store: Store | None = None
        self._run_name: str | None = None
        self.notebook: Path | None = None
        self.nbfile: locate.NotebookFile | None = None
        self.current: StepContext | None = None
        self.status: dict[str, tuple[str, str]] = {}  # step key -> (state, detail)
        self.producers: dict[str, str] = {}  # variable name -> step key that produced it
        # variable name -> (the object a step recorded or restored, its blob sha); see _input_fp
        self.origins: dict[str, tuple[Any, str]] = {}
        self.saved = Savings()
        self.cell_ordinals: dict[str, int] = {}  # @recorded outside steps; reset per cell
        self._lock = threading.RLock()
        self._warned_no_notebook = False
        self._warned_unsaved: set[str] = set()
        self._warned_names: set[str] = set()
        self._lease: lease.Lease | None = None
        self._lease_seen = 0.0  # when the store last confirmed we hold it
        self._atexit = False
        self._run_id_for: tuple[tuple[Path | None, Path], str] | None = None
        self._keys: RunKeys | None = None
        #: The run scope's sub-step index for the current cell; None when no
        #: per-cell hook resets it (plain Python), then each call reads its record.
        self.run_index: SubIndex | None = None
        env_run = os.environ.get("NBDURABLE_RUN", "").strip()
        if env_run:  # set by `nbdurable run --run NAME`
            self._run_name = keys.validate_name(env_run, "run name (NBDURABLE_RUN)")

    # -- run context ---------------------------------------------------------
    @property
    def user_ns(self) -> dict[str, Any]:
        """The namespace steps run in (empty without a shell)."""
        return self.shell.user_ns if self.shell is not None else {}

    def _locate(self) -> None:
        if self._store is not None:
            return
        self.notebook = locate.find_notebook(self.user_ns)
        if self.notebook is None and not self._warned_no_notebook:
            self._warned_no_notebook = True
            warn(
                "nbdurable could not tell which notebook this kernel runs (no "
                "JPY_SESSION_NAME, __vsc_ipynb_file__ or NBDURABLE_NOTEBOOK); recording "
                f"to run {locate.DEFAULT_RUN!r} in {locate.store_dir(None)}. "
                "Use `%step run NAME` to name the run."
            )
        if self.notebook is not None:
            self.nbfile = locate.NotebookFile(self.notebook)
        # The store: a directory, or a URL for a shared one (see store.engine). Run ids
        # are relative to the local directory even then, so two machines whose
        # projects lie at different paths share the run of the same notebook.
        local = locate.store_dir(self.notebook)
        target = store_engine.chosen(local)
        self._store = open_store(target, durability=config.get().durability)
        self._anchor = local if store_engine.is_url(target) else self._store.path

    @property
    def store(self) -> Store:
        """The store of this run, opened on first use."""
        self._locate()
        assert self._store is not None
        return self._store

    @property
    def run_id(self) -> str:
        """The run's id: a name set by ``%step run``, else the notebook's (see :mod:`locate`)."""
        self._locate()
        if self._run_name is not None:
            return self._run_name
        assert self._store is not None
        # Read on every sub-step: computed once per (notebook, store), not per call.
        where = (self.notebook, self._anchor)
        if self._run_id_for is None or self._run_id_for[0] != where:
            self._run_id_for = (where, locate.run_id_for(*where))
        return self._run_id_for[1]

    @property
    def keys(self) -> RunKeys:
        """Store keys of this run."""
        run_id = self.run_id
        if self._keys is None or self._keys.run_id != run_id:
            self._keys = RunKeys(run_id)
        return self._keys

    def set_run(self, name: str | None) -> str:
        """Switch to a named run (None: back to the notebook's run)."""
        self.release()
        self._run_name = name
        self.status.clear()
        self.producers.clear()
        self.origins.clear()
        events.emit("run-changed", self.run_id)
        return self.run_id

    def claim(self, *, takeover: bool = False, verify: bool = True) -> lease.Holder | None:
        """Hold this run's lease before executing anything in it (see :mod:`lease`).

        Raises :class:`LeaseHeld` when another live process holds it; with
        ``takeover`` (or ``NBDURABLE_TAKEOVER=1``) takes it anyway. Returns
        the previous holder when one was replaced.
        """
        run = self.run_id
        held = self._lease
        if held is not None and held.generation != self.store.generation:
            # The store was deleted or replaced and reopened: its lease went with it.
            held._stop.set()
            self._lease = held = None
            warn(
                f"the store at {self.store.path} was deleted or replaced while this kernel "
                "ran; recording into a new store there."
            )
        if held is not None and held.run_id == run and not takeover:
            # Sub-steps outside any step call this on every call (verify=False):
            # they look at the store at most once a second; a step always looks.
            now = time.monotonic()
            if not verify and now - self._lease_seen < 1.0:
                return None
            if held.holds():
                self._lease_seen = now
                return None
            self._lease = None
            who = lease.read(self.store, run)
            raise LeaseHeld(
                f"run {run!r} was taken over by "
                f"{who.describe() if who else 'another process'}; this kernel stopped "
                "recording into it. Run `%step takeover` to take it back."
            )
        if held is not None:
            held.release()
            self._lease = None
        mine = lease.Lease(self.store, run, _holder_description(self.shell))
        previous = mine.acquire(takeover=takeover or os.environ.get("NBDURABLE_TAKEOVER") == "1")
        mine.generation = self.store.generation
        self._lease = mine
        self._lease_seen = time.monotonic()
        if not self._atexit:
            self._atexit = True
            atexit.register(self.release)
        return previous

    def release(self) -> None:
        """Give back the run's lease, if held."""
        if self._lease is not None:
            # A deleted store is not recreated just to give its lease back.
            if self._store is not None and not self._store.replaced():
                self._lease.release()
            self._lease._stop.set()
            self._lease = None

    def set_store(self, store: Store, run_id: str | None = None) -> None:
        """Use an already-open store (tests, the CLI)."""
        self._store = store
        self._anchor = store.path if isinstance(store.path, Path) else locate.store_dir(None)
        self._run_name = run_id

    def _touch_run(self) -> tuple[str, dict[str, Any], bytes]:
        now = time.time()
        meta = {"kind": "run", "run": self.run_id, "last": now}
        meta["notebook"] = str(self.notebook) if self.notebook else None
        return (self.keys.meta, meta, b"")

    # -- identity --------------------------------------------------------------
    def resolve_key(self, name: str | None, body: str) -> tuple[str, str, int | None]:
        """``(key, label, position)`` of the cell being executed (see :mod:`nbdurable.keys`)."""
        cell_id, position = self._frontend_cell()
        self._locate()
        if self.nbfile is not None and self.nbfile.refresh():
            if cell_id is not None and not self.nbfile.ids_persist:
                # nbformat 4.4 on disk: the frontend invents a new id on every load.
                cell_id = None
            saved = self.nbfile.find(body, position)
            if saved is not None:
                position = saved.index
                # nbclient and nbconvert send no cell id; the saved one is the id
                # JupyterLab would send, and the one `%step list` reads.
                cell_id = cell_id or saved.cell_id
            if name is not None:
                self._warn_shared_name(name, [c.index for c in self.nbfile.cells if c.name == name])
        if name is not None:
            key, label = keys.step_key(name, None, None, body)
        else:
            key, label = keys.step_key(None, cell_id, position, body)
        return key, label, position

    def _warn_shared_name(self, name: str, indexes: list[int]) -> None:
        if len(indexes) < 2 or name in self._warned_names:
            return
        self._warned_names.add(name)
        cells = ", ".join(f"#{i + 1}" for i in indexes)
        warn(
            f"step name {name!r} is used by {len(indexes)} cells of {self.notebook} (cells "
            f"{cells}); they share one record and keep invalidating each other. Give each "
            "%%step its own name."
        )

    def _frontend_cell(self) -> tuple[str | None, int | None]:
        kernel = getattr(self.shell, "kernel", None)
        if kernel is None:
            return None, None
        try:
            md = kernel.get_parent("shell").get("metadata", {}) or {}
        except Exception:  # not in an execute request (e.g. driven from a test)
            return None, None
        cid = md.get("cellId")
        pos = (md.get("nbdurable") or {}).get("position")
        return (cid if isinstance(cid, str) and cid else None), (
            pos if isinstance(pos, int) else None
        )

    # -- records -----------------------------------------------------------------
    def load_record(self, key: str, label: str) -> StepRecord | None:
        """The step's record, None if absent or unusable (with a warning)."""
        try:
            got = self.store.get(self.keys.step(key))
            return None if got is None else StepRecord.from_header(got[0])
        except (CorruptRecord, KeyError, TypeError) as exc:
            warn(f"step {label!r}: its record cannot be used ({exc}); the step runs again.")
            return None

    def load_state(self, key: str) -> StepState:
        """The step's pin/failure/stale state (empty if none)."""
        try:
            got = self.store.get(self.keys.state(key))
        except CorruptRecord as exc:
            warn(f"step state for {key!r} is unreadable ({exc}); treating it as unpinned.")
            return StepState()
        return StepState() if got is None else StepState.from_header(got[0])

    # -- the %%step cell -------------------------------------------------------------
    def run_step(self, body: str, *, name: str | None = None, force: bool = False) -> None:
        """Replay the ``%%step`` cell ``body`` if its record is valid; else execute and record."""
        __tracebackhide__ = True
        if self.current is not None:
            raise UsageProblem(
                f"%%step cannot run inside step {self.current.label!r}; "
                "use step() for calls inside a step"
            )
        py = self.shell.transform_cell(body)
        key, label, position = self.resolve_key(name, body)
        analysis = keys.analyse(py)
        source_fp = keys.source_fingerprint(py)
        ns = self.user_ns
        self.origins = {n: o for n, o in self.origins.items() if ns.get(n) is o[0]}
        # A name this very step produced earlier in this kernel is not an input:
        # it did not exist when the step was first recorded, and counting it
        # would make every rerun in the same kernel look like a change.
        raw_fps = {
            n: _fingerprint(ns[n], f"input {n!r} of step {label!r}")
            for n in sorted(analysis.reads)
            if n in ns and not _HIDDEN.match(n) and self.producers.get(n) != key
        }
        inputs = {n: self._input_fp(n, ns[n], fp) for n, fp in raw_fps.items()}
        rec = self.load_record(key, label)
        # Whatever nbdurable printed so far (warnings) reaches the frontend before
        # the step's own outputs: ipykernel buffers stdout and stderr apart.
        _flush_streams()
        state = self.load_state(key)
        reason = None if rec is None else _invalid_reason(rec, source_fp, inputs, state)
        if rec is not None and not force and (reason is None or state.pinned):
            if rec.replayable and self._replay(rec, label, reason):
                return
        self.claim()
        if rec is not None and reason is not None and not force:
            self.status[key] = ("invalidated", reason)
            events.emit("step-invalidated", self.run_id, key, reason=reason, label=label)
        plan = Plan(key, label, position, py, source_fp, analysis, inputs, raw_fps, state)
        self._execute(plan)

    def _input_fp(self, name: str, value: Any, fp: str) -> str:
        """Fingerprint of an input; for a value a step saved, also its saved bytes.

        :func:`keys.fingerprint` sees some objects by type only (instances of
        plain classes, e.g. a model's response object). When the value is the
        very object a step recorded or restored, the sha of its pickle tells
        one recording from another, so a dependant of a re-executed step does
        not replay a result computed from the old value.
        """
        origin = self.origins.get(name)
        if origin is None or origin[0] is not value:
            return fp
        return hashlib.sha256(f"{fp}:{origin[1]}".encode()).hexdigest()[:32]

    def _replay(self, rec: StepRecord, label: str, stale: str | None) -> bool:
        """Restore a record into the namespace and show its outputs; False if it cannot be."""
        restored: dict[str, Any] = {}
        ns = self.user_ns
        try:
            for var in rec.variables:
                faults.point("replay")
                if var.kind == "module":
                    restored[var.name] = values.import_module(var.ref)
                    continue
                blob = self.store.get_blob(var.ref)
                if blob is None:
                    raise CorruptRecord(f"the saved value of {var.name!r} is missing")
                value = values.loads(blob.stream, ns, blob.buffers)
                restored[var.name] = values.adopt(value, ns)
        except Exception as exc:  # a damaged blob, a module gone, a failing __setstate__
            warn(f"step {label!r}: cannot restore its variables ({exc}); the step runs again.")
            return False
        for name in rec.deleted:
            ns.pop(name, None)
        ns.update(restored)
        for var in rec.variables:
            self.producers[var.name] = rec.key
            if var.kind == "value":
                self.origins[var.name] = (restored[var.name], var.ref)
        replay(self.shell, list(rec.outputs))
        with self._lock:
            self.saved.steps += 1
            self.saved.calls += rec.substeps
            self.saved.seconds += rec.duration
        state = "replayed" if stale is None else "pinned-stale"
        self.status[rec.key] = (state, stale or "")
        events.emit("step-replayed", self.run_id, rec.key, label=label, record=rec, stale=stale)
        if config.get().replay_note:
            self._note(rec, label, stale)
        return True

    def _note(self, rec: StepRecord, label: str, stale: str | None) -> None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.started + rec.duration))
        calls = f", {rec.substeps} call{'s' if rec.substeps != 1 else ''}" if rec.substeps else ""
        saved = f"saved {rec.duration:.1f} s{calls}"
        text = f"↻ nbdurable: replayed step {label!r} (recorded {when}; {saved})"
        if stale:
            text += f" — pinned, stale: {stale}"
        html = f'<div style="font-size:smaller;opacity:0.6">{_escape(text)}</div>'
        self.shell.display_pub.publish(
            data={"text/plain": text, "text/html": html},
            metadata={"nbdurable": {"note": "replayed", "step": rec.key}},
        )

    def _execute(self, plan: Plan) -> None:
        __tracebackhide__ = True
        before = dict(self.user_ns)
        ctx = StepContext(plan.key, plan.label)
        self.status[plan.key] = ("running", "")
        events.emit("step-start", self.run_id, plan.key, label=plan.label)
        started = time.time()
        t0 = time.perf_counter()
        self.current = ctx
        try:
            with Capture(self.shell) as cap:
                _run_body(self.shell, plan.py, plan.analysis.has_await)
        except BaseException as exc:
            self.current = None
            self._record_failure(plan.key, plan.label, plan.position, plan.state, exc)
            raise
        self.current = None
        self._record(plan, before, cap.outputs, started, time.perf_counter() - t0, ctx)

    def _record_failure(
        self, key: str, label: str, position: int | None, state: StepState, exc: BaseException
    ) -> None:
        what = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:500]
        what = redact.redact_text(what)[0]
        self.status[key] = ("failed", what)
        failed = StepState(state.pinned, what, time.time(), state.stale, label, position)
        try:
            self.store.apply(puts=[(self.keys.state(key), failed.to_header(), b"")])
        except NbdurableError as err:
            warn(f"step {label!r} failed and its failure could not be noted: {err}")
        events.emit("step-failed", self.run_id, key, label=label, error=what)

    def _record(
        self,
        plan: Plan,
        before: dict[str, Any],
        outputs: list[dict[str, Any]],
        started: float,
        duration: float,
        ctx: StepContext,
    ) -> None:
        ns = self.user_ns
        key, label, position, py, state = plan.key, plan.label, plan.position, plan.py, plan.state
        changed = _changed_names(before, ns, plan.analysis)
        changed += _mutated_inputs(plan.raw_fps, before, ns, set(changed))
        deleted = tuple(sorted(n for n in before if n not in ns and not _HIDDEN.match(n)))
        secrets = redact.secrets_in_env()
        try:
            saved = recording.save_variables(
                self.store, ns, changed, _dotted_imports(py), _fingerprint, secrets
            )
        except StoreError as exc:
            raise StoreError(f"step {label!r} ran but was NOT recorded: {exc}") from exc
        outputs, leaked = recording.scrub_outputs(outputs, secrets)
        source, in_source = redact.redact_text(py, secrets)
        input_from = {n: self.producers[n] for n in plan.inputs if n in self.producers}
        rec = StepRecord(
            run=self.run_id,
            key=key,
            name=label,
            position=position,
            source=source,
            source_fp=plan.source_fp,
            inputs=plan.inputs,
            input_from=input_from,
            variables=tuple(saved.variables),
            deleted=deleted,
            outputs=tuple(outputs),
            started=started,
            duration=duration,
            substeps=ctx.subs_recorded + ctx.subs_replayed,
            substep_seconds=ctx.sub_seconds,
        )
        kept = StepState(pinned=state.pinned, name=label, position=position)
        puts = [(self.keys.step(key), rec.to_header(), b""), self._touch_run()]
        deletes: list[str] = []
        if kept.pinned:
            puts.append((self.keys.state(key), kept.to_header(), b""))
        else:
            deletes.append(self.keys.state(key))
        try:
            self.store.apply(puts=puts, deletes=deletes, blobs=saved.pending)
        except StoreError as exc:
            raise StoreError(f"step {label!r} ran but was NOT recorded: {exc}") from exc
        faults.point("step-written")
        for name in changed:
            self.producers[name] = key
            self.origins.pop(name, None)
        self.origins.update(saved.origins)
        self.status[key] = ("recorded", "")
        events.emit("step-recorded", self.run_id, key, label=label, record=rec)
        self._warn_recorded(key, label, saved, sorted(set(leaked) | set(in_source)))

    def _warn_recorded(
        self, key: str, label: str, saved: recording.Saved, leaked: list[str]
    ) -> None:
        """One loud warning for each kind of thing a recorded step did not write."""
        if saved.unsaved and key not in self._warned_unsaved:
            self._warned_unsaved.add(key)
            warn(
                f"step {label!r} was recorded, but these variables cannot be saved: "
                f"{'; '.join(saved.unsaved)}. On replay this step's body runs again (its "
                "sub-steps still replay, so no recorded call repeats)."
            )
        if saved.secrets:
            warn(
                f"step {label!r}: these variables hold a secret from the environment and "
                f"were NOT written to the store: {'; '.join(saved.secrets)}. On replay "
                "this step's body runs again (its sub-steps still replay)."
            )
        if leaked:
            warn(
                f"step {label!r}: its outputs or source showed the value of "
                f"${', $'.join(leaked)}; it was recorded as [redacted] instead."
            )
        if saved.large:
            warn(
                f"step {label!r}: large values recorded: {'; '.join(saved.large)} "
                f"(over warn_size_mb={config.get().warn_size_mb:g}). They are stored "
                "once by content; clear old runs with `nbdurable gc` if space runs short."
            )


def _invalid_reason(
    rec: StepRecord, source_fp: str, inputs: dict[str, str], state: StepState
) -> str | None:
    """Why a record cannot be replayed, or None if it can."""
    if rec.source_fp != source_fp:
        return "its code changed"
    if state.stale:
        return state.stale
    changed = sorted(n for n in set(rec.inputs) | set(inputs) if rec.inputs.get(n) != inputs.get(n))
    if changed:
        listed = ", ".join(repr(n) for n in changed[:5])
        return f"input{'s' if len(changed) > 1 else ''} {listed} changed"
    return None


def _changed_names(
    before: dict[str, Any], after: dict[str, Any], analysis: keys.CellAnalysis
) -> list[str]:
    """Names the step bound, rebound or (by its syntax) may have mutated."""
    out = set()
    for name, value in after.items():
        if _HIDDEN.match(name):
            continue
        if name not in before or before[name] is not value:
            out.add(name)
    for name in analysis.binds | analysis.mutates:
        if name in after and not _HIDDEN.match(name):
            # `time.sleep(1)` looks like a method call on `time`; a module the
            # step did not rebind is not something it produced.
            if name not in analysis.binds and values.is_module(after[name]):
                continue
            out.add(name)
    return sorted(out)


def _mutated_inputs(
    raw_fps: dict[str, str], before: dict[str, Any], after: dict[str, Any], known: set[str]
) -> list[str]:
    """Inputs changed in place by calls the syntax cannot see (``random.shuffle(xs)``).

    Each input still bound to the same object is fingerprinted again; a
    different fingerprint means the step mutated it, so it is recorded too.
    """
    out = []
    for name, fp in raw_fps.items():
        if name in known or name not in after or after[name] is not before.get(name):
            continue
        value = after[name]
        if values.is_module(value) or callable(value):
            continue
        if _fingerprint(value, name) != fp:
            out.append(name)
    return sorted(out)


def _fingerprint(value: Any, what: str) -> str:
    """:func:`keys.fingerprint`, falling back to the type when a custom hook fails."""
    try:
        return keys.fingerprint(value)
    except Exception as exc:  # a user's __nbdurable_fingerprint__ may raise
        warn(f"{what}: cannot fingerprint it ({exc!r}); comparing it by type only.")
        return "type:" + values.type_name(value)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _dotted_imports(py: str) -> set[str]:
    """``a.b.c`` for each ``import a.b.c`` (without ``as``) of the cell, outside functions."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = compile(py, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.asname is None and "." in a.name}
        elif not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no stream, or a closed one
            pass


def _run_body(shell: Any, py: str, has_await: bool) -> None:
    """Execute the cell body in the user namespace; show a trailing expression."""
    __tracebackhide__ = True
    filename = shell.compile.cache(py, shell.execution_count)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if has_await else 0
    tree = compile(py, filename, "exec", ast.PyCF_ONLY_AST | flags)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    glb, loc = shell.user_global_ns, shell.user_ns
    code = compile(tree, filename, "exec", flags)
    _exec(code, glb, loc, has_await)
    if last is not None:
        value = _exec(compile(last, filename, "eval", flags), glb, loc, has_await, evaluate=True)
        # The displayhook's own ';' check reads the outer cell's history entry
        # (the magic call), so the trailing-semicolon rule is applied here.
        if not DisplayHook.semicolon_at_end_of_expression(py):
            show_last_expr(shell, value)


def _exec(code: Any, glb: dict, loc: dict, has_await: bool, evaluate: bool = False) -> Any:
    __tracebackhide__ = True
    result = eval(code, glb, loc)  # noqa: S307 - this is the user's own cell
    if has_await and asyncio.iscoroutine(result):
        result = _run_coroutine(result)
    return result if evaluate else None


def _run_coroutine(coro: Any) -> Any:
    """Run a top-level-await body to completion.

    The kernel's own event loop is busy running this very cell, so the body
    runs on a fresh loop in a helper thread while this thread waits. An
    interrupt (KeyboardInterrupt) cancels the body and waits for it to stop,
    so no sub-step keeps calling a model in the background after the cell
    has failed; a second interrupt stops waiting.
    """
    __tracebackhide__ = True
    box: dict[str, Any] = {}

    async def main() -> Any:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        if box.get("cancelled"):  # interrupted before the body started
            coro.close()
            raise asyncio.CancelledError
        return await coro

    def runner() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=runner, name="nbdurable-step", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.1)
    except KeyboardInterrupt:
        box["cancelled"] = True
        loop, task = box.get("loop"), box.get("task")
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has just finished
                pass
        with contextlib.suppress(KeyboardInterrupt):  # a second interrupt stops waiting
            while t.is_alive():
                t.join(0.1)
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _holder_description(shell: Any) -> str:
    """What holds a lease, for the message a second runner sees."""
    runner = os.environ.get("NBDURABLE_HOLDER")
    if runner:
        return runner
    if getattr(shell, "kernel", None) is not None:
        try:
            from ipykernel.connect import get_connection_file

            return "kernel " + Path(get_connection_file()).stem.removeprefix("kernel-")
        except Exception:  # not started from a connection file
            return "kernel"
    return "python " + " ".join(sys.argv[:1])


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_session: Session | None = None
_session_lock = threading.Lock()


def get_session(shell: Any = None) -> Session:
    """The process-wide session, created on first use."""
    global _session
    with _session_lock:
        if _session is None:
            if shell is None:
                try:
                    from IPython import get_ipython

                    shell = get_ipython()
                except ImportError:  # pragma: no cover - IPython is a dependency
                    shell = None
            _session = Session(shell)
        elif shell is not None and _session.shell is None:
            _session.shell = shell
        return _session


def reset_session() -> None:
    """Forget the process-wide session (tests; ``%reload_ext``)."""
    global _session
    with _session_lock:
        if _session is not None:
            _session.release()
        if _session is not None and _session._store is not None:
            _session._store.close()
        _session = None


def stderr(message: str) -> None:
    """Print a one-line notice to the cell's stderr."""
    print(message, file=sys.stderr)
