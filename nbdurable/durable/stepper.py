"""The step runner: plan a ``%%step`` cell, replay its record or execute it, record it.

Plan: the cell's key, its code as Python, what it reads (each input's
fingerprint) and the record and state the store holds for it. A record is
replayed when its code and inputs match and the files it wrote are as it
left them (or it is pinned): its variables are restored and its outputs
shown, nothing runs. Otherwise the body executes (the run's lease is taken
first; a missing or changed output file is said in one line) and what it
bound, mutated or deleted is recorded with its outputs and the files it
read and wrote (:mod:`.fileio`) in one transaction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from .. import config, dbwrites, events, faults, procstate, redact
from .. import why as whys
from ..clients.usage import Tally
from ..errors import CorruptRecord, LeaseLost, NbdurableError, StoreError, UsageProblem
from ..identity import keys, localcode, verdict
from ..identity.analysis import literal_key
from ..store import sharing, spill, values, versions
from ..store.records import StepRecord, StepState
from ..text import clip
from ..text import seconds as seconds_text
from ..text import tokens as tokens_text
from . import envreads, fileio, httpsteps, recording, standins
from .changes import HIDDEN
from .context import StepContext, flush_streams, remade_summary, warn, what_replays
from .host import Capture
from .mutation import attributes, changed_names, dotted_imports, mutated_inputs, untouched
from .plan import (
    Plan,
    fingerprint_or_type,
    input_fingerprint,
    reached,
    read_names,
    version_of,
)

if TYPE_CHECKING:
    from .session import Session


class StepRunner:
    """Runs ``%%step`` cells for one :class:`~nbdurable.durable.session.Session`.

    It remembers, for this kernel, which step produced each variable and the
    object each step recorded or restored (see :meth:`_input_fp`).
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.producers: dict[str, str] = {}  # variable name -> step key that produced it
        # step key -> the `started` of the record this kernel made of it (see _confirm)
        self.recorded_started: dict[str, float] = {}
        # variable name -> (the object a step recorded or restored, its blob sha); see
        # _input_fp. Held weakly: a `del` frees the value as in a plain run.
        self.origins = recording.Origins()
        # step key -> names its previous record could not save (warned when it was recorded)
        self.unsaved_known: dict[str, frozenset[str]] = {}
        # step key -> {name: why} of values its last replay could not load (kept unsaved)
        self.unloadable: dict[str, dict[str, str]] = {}
        # step key -> reasons its previous record's process changes could not be restored
        # (warned when it was recorded; a rerun that finds the same says nothing)
        self.process_known: dict[str, frozenset[str]] = {}
        envreads.install(lambda: session.current)  # environment reads of a running step
        fileio.install(lambda: session.current)  # files a running step reads and writes
        procstate.watch_sqlite()  # writes to in-memory SQLite databases (process state)

    def forget(self) -> None:
        """Forget what this kernel produced (the run changed)."""
        self.producers.clear()
        self.recorded_started.clear()
        self.origins.clear()

    def load_record(self, key: str, label: str) -> StepRecord | None:
        """The step's record, None if absent or unusable (with a warning)."""
        try:
            return self.session.view.record(key)
        except CorruptRecord as exc:
            warn(f"step {label!r}: its record cannot be used ({exc}); the step runs again.")
            return None

    def load_state(self, key: str) -> StepState:
        """The step's pin/failure/stale state (empty if none)."""
        try:
            return self.session.view.state(key)
        except CorruptRecord as exc:
            warn(f"step state for {key!r} is unreadable ({exc}); treating it as unpinned.")
            return StepState()

    def run_step(
        self,
        body: str,
        *,
        name: str | None = None,
        force: bool = False,
        input_patterns: tuple[str, ...] = (),
    ) -> None:
        """Replay the ``%%step`` cell ``body`` if its record is valid; else execute and record.

        The body runs here, through the host (in IPython,
        :func:`nbdurable.ipython.execute.run_body`). A ``%%step`` cell typed in a
        notebook does not come here: IPython runs its body itself between
        :meth:`begin` and :meth:`finish` (see :mod:`nbdurable.ipython.cellstep`).
        """
        __tracebackhide__ = True
        started = self.begin(
            body, name=name, force=force, split=False, input_patterns=input_patterns
        )
        if isinstance(started, Replayed):
            self.finish_replay(started)
            return
        try:
            self.session.host.run_body(started.plan.py, started.plan.analysis.has_await)
        except BaseException as exc:
            self.finish(started, exc)
            raise
        self.finish(started, None)

    def begin(
        self,
        body: str,
        *,
        name: str | None = None,
        force: bool = False,
        split: bool = True,
        input_patterns: tuple[str, ...] = (),
        http: bool = False,
    ) -> Replayed | Running:
        """Decide: replay the step's record (done here) or start executing it.

        On replay the variables are restored and the recorded outputs shown
        (with ``split``, only those before the ``execute_result``: the caller
        shows the result through IPython's display hook from
        :attr:`Replayed.value`, then calls :meth:`finish_replay`). Otherwise the
        run's lease is held, the step context is current and a
        :class:`Capture` records the outputs until :meth:`finish`, which the
        caller must call exactly once. ``input_patterns``: the ``--inputs``
        globs (see :mod:`.fileio`). Raises (UsageProblem, LeaseHeld,
        StoreError) with nothing left open.
        """
        __tracebackhide__ = True
        if self.session.current is not None:
            raise UsageProblem(
                f"%%step cannot run inside step {self.session.current.label!r}; "
                "use step() for calls inside a step"
            )
        py = self.session.host.transform(body)
        key, label, position = self.session.resolve_key(name, body)
        analysis = keys.analyse(py)
        source_fp = keys.source_fingerprint(py)
        ns = self.session.user_ns
        self.origins.prune(ns)
        # A name this very step produced earlier in this kernel is not an input:
        # it did not exist when the step was first recorded, and counting it
        # would make every rerun in the same kernel look like a change.
        fps = {
            n: input_fingerprint(ns[n], f"input {n!r} of step {label!r}")
            for n in sorted(read_names(analysis, ns, self.session.host.hidden()))
            if n in ns and not HIDDEN.match(n) and self.producers.get(n) != key
        }
        raw_fps = {n: fp for n, (fp, _) in fps.items()}
        inputs = {n: self._input_fp(n, ns[n], fp, complete) for n, (fp, complete) in fps.items()}
        declared = fileio.declared(input_patterns)
        rec = self.load_record(key, label)
        state = self.load_state(key)
        version = keys.step_version(source_fp, inputs)
        tried = rec is not None and not state.pinned and version_of(rec) != version
        if tried:
            rec = self._bring_back(key, label, rec, version)
        # Whatever nbdurable printed so far (warnings) reaches the frontend before
        # the step's own outputs: ipykernel buffers stdout and stderr apart.
        flush_streams()
        reason = (
            None
            if rec is None
            else verdict.invalid_reason(
                rec, state, source_fp=source_fp, inputs=inputs, declared=declared
            )
        )
        live = self._live_subs(key) if rec is not None else []
        if live:
            shown = ", ".join(repr(s) for s in live[:3]) + (", ..." if len(live) > 3 else "")
            warn(
                f"step {label!r} runs again: its sub-steps {shown} run live "
                f"(live={list(config.get().live)}); its other sub-steps replay."
            )
        # A record that may answer this run: valid (or pinned), and not forced.
        usable = rec is not None and not force and (reason is None or state.pinned)
        # A body that would write to a database file again (see dbwrites): replayed
        # with stand-ins for its handles, or refused rather than run silently.
        db = dbwrites.decide(rec) if usable and not live else None
        if db is not None and db.action == "refuse":
            raise standins.refuse(db, label)
        if usable and not live:
            replayable = rec.replayable or db is not None or self._reads_standins(rec)
            replayed = self._replay(rec, label, reason, split, db) if replayable else None
            if replayed is not None:
                if reason is None:
                    self._confirm(rec, state)
                return replayed
            if not rec.replayable:
                # Said on every such run, not only when first recorded: a fresh
                # kernel's cell shows why its body ran instead of replaying.
                warn(
                    f"step {label!r} runs again: {_not_replayable(rec)} "
                    f"({what_replays(httpsteps.wanted(http))})."
                )
        if self.session.verifying:
            # Verify mode runs a body only where a record exists but cannot be
            # restored (its sub-steps and HTTP must then all replay, checked at each).
            # With `live` set, what live calls return invalidates their readers: those run,
            # each of their calls still answered from the record or matching `live`.
            follows_live = rec is not None and not force and bool(config.get().live)
            if not usable and not follows_live:
                why = (
                    "has no record"
                    if rec is None
                    else "is forced (--force)"
                    if force
                    else f"is invalidated: {reason}"
                )
                raise self.session.refuse(f"step {label!r} {why}")
        self.session.claim()
        if rec is not None and version_of(rec) != version:
            # The version about to run replaces the current one: keep that one first
            # (and bring back this version's sub-steps, unless that was tried above).
            self._switch(key, label, rec, version, restore=not tried)
        if rec is not None and reason is not None and not force:
            self.session.status[key] = ("invalidated", reason)
            self.session.reasons[key] = reason
            events.emit("step-invalidated", self.session.run_id, key, reason=reason, label=label)
            if reason.startswith(verdict.OUTPUT_REASON):
                # A plain run would have written it: say why the body runs instead of replaying.
                replays = what_replays(httpsteps.wanted(http))
                warn(f"step {label!r} runs again: its {reason} ({replays}).")
        plan = Plan(
            key, label, position, py, source_fp, analysis, inputs, raw_fps, state, reason, declared
        )
        plan.library = frozenset(n for n in inputs if localcode.is_library_name(ns[n]))
        plan.plain = {
            n: lit
            for n in inputs
            if n not in plan.library
            and n not in self.producers
            and (lit := literal_key(ns[n]) or localcode.notebook_function_key(ns[n])) is not None
        }
        # What each input looks like now, for "why" after a later change (nbdurable.why).
        plan.seen = whys.briefs(ns, inputs)
        plan.reached = {
            n: fingerprint_or_type(ns[n], f"{n!r}, which step {label!r} reaches")
            for n in reached(raw_fps, ns)
            if n not in raw_fps and self.producers.get(n) != key
        }
        known = recording.unsaved_names(rec.variables if rec else ())
        self.unsaved_known[key] = known | set(self.unloadable.get(key, ()))  # _replay said it
        self.process_known[key] = frozenset(
            procstate.replayable_reasons(rec.process if rec else None)
        )
        return self._start(plan)

    def _live_subs(self, key: str) -> list[str]:
        """The recorded sub-steps of step ``key`` that the ``live`` setting runs live."""
        if not config.get().live:
            return []
        prefix = self.session.keys.subs_prefix(key)
        ids = [k[len(prefix) :] for k in self.session.store.scan(prefix)]
        return [i for i in ids if config.is_live(i)]

    def _confirm(self, rec: StepRecord, state: StepState) -> None:
        """Note that ``rec`` replayed against the upstream records this kernel made since it.

        A view with no kernel sees only the store: an input whose maker was
        recorded after ``rec`` looks changed (a cascade; see
        :func:`~nbdurable.identity.verdict.invalid_reason`), yet here the
        replay compared the new value and found it equal. Noted in the step's
        state so that ``nbdurable status`` and the cell marks say what the next
        run does (replay), not "input 'plan' changed". Written only in that
        case, so an ordinary replay writes nothing; a store this kernel cannot
        write to (another process holds the run, a read-only store) leaves the
        views at their cautious "changed".
        """
        newer = {
            maker: self.recorded_started[maker]
            for name, maker in rec.input_from.items()
            if name in rec.inputs and self.recorded_started.get(maker, 0.0) > rec.started
        }
        confirmed = state.confirmed
        if not newer or all(confirmed.get(k) == v for k, v in newer.items()):
            return
        new = dataclasses.replace(state, extra={**state.extra, "confirmed": confirmed | newer})
        try:
            self.session.claim()
            self.session.write(puts=[(self.session.keys.state(rec.key), new.to_header(), b"")])
        except NbdurableError:
            pass

    def _bring_back(self, key: str, label: str, rec: StepRecord, version: str) -> StepRecord | None:
        """The step's record of ``version`` made current, if kept (else ``rec``, unchanged).

        Swapping versions writes to the run, so the lease is held first, as
        for an execution (which is what the step would do otherwise).
        """
        view = self.session.view
        if not versions.has(view.store, view.keys, key, version):
            return rec
        self.session.claim()
        if not self._switch(key, label, rec, version):
            return rec
        return self.load_record(key, label)

    def _switch(
        self, key: str, label: str, rec: StepRecord, version: str, restore: bool = True
    ) -> bool:
        """Archive the current version, bring ``version`` back if kept (see store.versions)."""
        view = self.session.view
        keep = config.get().keep_versions
        current = version_of(rec)
        try:
            return versions.switch(
                view.store, view.keys, key, current, version, keep, restore=restore
            )
        except CorruptRecord as exc:
            warn(
                f"step {label!r}: its record of these inputs cannot be used ({exc}); "
                "the step runs again."
            )
            return False

    def _input_fp(self, name: str, value: Any, fp: str, complete: bool = False) -> str:
        """Fingerprint of an input; for a value a step saved, also its saved bytes.

        :func:`keys.fingerprint` sees some objects by type only (instances of
        plain classes, e.g. a model's response object). When the value is the
        very object a step recorded or restored, the sha of its pickle tells
        one recording from another, so a dependant of a re-executed step does
        not replay a result computed from the old value. For the very object
        a step made but could not save (a generator), the version of that
        step stands in for the sha (see :meth:`_record`).

        A ``complete`` fingerprint (nothing seen by type only) is the content
        itself: no sha is mixed in, so a step that runs again and makes an equal
        value leaves its dependants replaying, whatever bytes its pickle takes in
        this process (the Agents SDK's ``@function_tool`` objects pickle otherwise
        in every process). An object of a blob, unchanged since it was recorded or
        restored, counts with its fingerprint when recorded: its restored copy
        may fingerprint otherwise (see Origins.note_fingerprint).
        """
        sha = self.origins.sha_for(name, value)
        if sha is None or localcode.is_library_name(value):
            # A library's class, function or module is what its name and version
            # say, whichever step bound it: the digest of that step's blob (its other
            # variables too) would make `KMeans` "change" when that step reran.
            return fp
        if complete:
            recorded = self.origins.content_at_origin(name)
            if recorded is None or self.origins.fingerprint_at_origin(name) != fp:
                return fp
            return recorded
        if self.origins.fingerprint_at_origin(name) == fp:
            # The object of that blob, unchanged since it was recorded or restored
            # (see Origins.note_fingerprint): the same in both runs.
            return hashlib.sha256(f"origin:{sha}".encode()).hexdigest()[:32]
        return hashlib.sha256(f"{fp}:{sha}".encode()).hexdigest()[:32]

    def _note_origin_fingerprints(self, recorded: Mapping[str, str]) -> None:
        """Note the fingerprint of each name of ``recorded`` that pickle rebuilds from
        its state, with its fingerprint when recorded (``recorded[name]``, "" if unknown).
        """
        ns = self.session.user_ns
        for name, content in recorded.items():
            value = ns.get(name)
            if _by_state(value):
                self.origins.note_fingerprint(name, fingerprint_or_type(value, name), content)

    def current_inputs(self, rec: StepRecord) -> tuple[dict[str, str], frozenset[str]]:
        """The record's inputs as they are in the namespace now, for a prediction.

        Fingerprinted as :meth:`begin` does; names the namespace lacks are
        returned apart (a Run All may restore them first: see
        :func:`nbdurable.identity.verdict.invalid_reason`). Nothing is printed.
        """
        ns = self.session.user_ns
        known: dict[str, str] = {}
        unknown: set[str] = set()
        for name in rec.inputs:
            if self.producers.get(name) == rec.key:
                continue  # begin() does not count it: the step made it in this kernel
            if name not in ns:
                unknown.add(name)
                continue
            value = ns[name]
            # a failing custom hook is not said here: begin() says it when the step runs
            fp, complete = input_fingerprint(value, None)
            known[name] = self._input_fp(name, value, fp, complete)
        return known, frozenset(unknown)

    def brief_now(self, name: str) -> str | None:
        """What ``name`` holds now, as "why" shows it (:func:`nbdurable.why.brief`)."""
        ns = self.session.user_ns
        return whys.brief(ns[name]) if name in ns else None

    def _reads_standins(self, rec: StepRecord) -> bool:
        """Whether all ``rec`` could not save is handles now stand-ins (a reader of them).

        A step that read through a handle a replayed step left as a stand-in records
        the handle as changed (its cursor moved): its body would fail on the stand-in
        where a plain run reads. It replays instead; the stand-in stays.
        """
        ns = self.session.user_ns
        unsaved = [v.name for v in rec.variables if v.kind == "unsaved"]
        return (
            bool(unsaved)
            and not procstate.replayable_reasons(rec.process)
            and all(standins.recorded_fp(ns.get(name)) is not None for name in unsaved)
        )

    def _replay(
        self,
        rec: StepRecord,
        label: str,
        stale: str | None,
        split: bool,
        db: dbwrites.Decision | None = None,
    ) -> Replayed | None:
        """Restore a record into the namespace and show its outputs; None if it cannot be.

        A record replayed with stand-ins (``db``) that cannot be restored refuses
        instead (:class:`RepeatRefused`): its body would write to the files again.
        """
        ns = self.session.user_ns
        # The live objects the plain cells made again, for what the step changed in
        # place (a checkpointer a graph holds); given back their state if abandoned.
        live = sharing.LiveTargets({v.name: ns[v.name] for v in rec.variables if v.name in ns})
        try:
            return self._restore(rec, label, stale, split, live)
        except _Unrestorable as failed:
            live.undo()
            if db is not None:
                raise standins.refuse(
                    dataclasses.replace(db, action="refuse", why=f"this kernel {failed}"), label
                ) from None
            warn(f"step {label!r}: {failed}; the step runs again.")
            return None
        except BaseException:
            live.undo()
            raise

    def _restore(
        self,
        rec: StepRecord,
        label: str,
        stale: str | None,
        split: bool,
        live: sharing.LiveTargets,
    ) -> Replayed:
        """Restore ``rec`` (see :meth:`_replay`); :class:`_Unrestorable` says why it cannot be."""
        ns = self.session.user_ns
        saved = [v for v in rec.variables if v.kind != "unsaved"]
        try:
            restored, pure = recording.load_variables(self.session.store, saved, ns, live)
        except recording.LoadFailed as failed:
            # A damaged blob, a module gone, a failing __setstate__, a shared object changed.
            exc = failed.cause
            if not isinstance(exc, NbdurableError):
                # The value itself does not load (not its blob): record it as unsaved.
                why = f"did not load back on replay ({type(exc).__name__}: {exc})"
                self.unloadable[rec.key] = dict.fromkeys(failed.names, why)
            raise _Unrestorable(f"cannot restore its variables ({exc})") from exc
        try:
            result = self._load_result(rec, restored) if split else None
        except Exception as exc:  # a damaged blob, a failing __setstate__
            raise _Unrestorable(f"cannot restore its result ({exc})") from exc
        try:  # the process state the step left: os.environ, RNGs, options...
            process = procstate.prepare(rec.process)  # resolved and checked, nothing changed yet
            for name in rec.deleted:
                ns.pop(name, None)
            ns.update(restored)
            # Handles a replay cannot restore (none unless dbwrites.decide said so). A live
            # one is kept: made by this step in this kernel (the cell run again in its
            # kernel), or one the step only used, which a plain cell or an earlier step
            # made again in this kernel (a stand-in over it would break the cells after).
            bound = {
                name: standin
                for name, standin in standins.standins(rec, label).items()
                if name not in ns
                or (self.producers.get(name) != rec.key and name not in rec.inputs)
            }
            ns.update(bound)
            # Known by the version of the step that made it, as the handle was when
            # recorded (see _record): its readers compare the same and replay.
            for name, standin in bound.items():
                self.origins[name] = (standin, f"made by {version_of(rec)}")
            for change in process:
                change()
        except Exception as exc:  # a directory or module gone, an option pandas refuses
            raise _Unrestorable(f"cannot restore its process state ({exc})") from exc
        for var in rec.variables:
            self.producers[var.name] = rec.key
            if var.kind == "value":  # (records of format 2)
                self.origins[var.name] = (restored[var.name], var.ref, pure[var.name])
            elif var.kind == "shared":  # as recording.save_variables names it
                digest = spill.digest(var.ref, var.spilled)
                self.origins[var.name] = (restored[var.name], digest, pure[var.name])
        self._note_origin_fingerprints(
            {v.name: v.content for v in rec.variables if v.kind == "shared"}
        )
        outputs = list(rec.outputs)
        cut = next(
            (i for i, o in enumerate(outputs) if o.get("output_type") == "execute_result"), None
        )
        if not split or cut is None:
            cut = len(outputs)
        self.session.host.show(outputs[:cut])
        self.session.count_replayed(
            rec.duration, steps=1, calls=rec.substeps, tokens=Tally.from_json(rec.tokens)
        )
        state = "replayed" if stale is None else "pinned-stale"
        self.session.status[rec.key] = (state, stale or "")
        events.emit(
            "step-replayed", self.session.run_id, rec.key, label=label, record=rec, stale=stale
        )
        shown = outputs[cut] if cut < len(outputs) else None
        if result is None and shown is not None:  # no value recorded: show what it looked like
            result = Shown(shown)
        return Replayed(rec, label, stale, outputs[cut + 1 :], result, shown)

    def _load_result(self, rec: StepRecord, restored: dict[str, Any]) -> Any:
        """The value the step's last expression showed, as recorded (None: none recorded)."""
        saved = rec.result
        if not saved:
            return None
        if "var" in saved:  # the very object one of its variables holds (`x = f(); x`)
            return restored[saved["var"]]
        ns = self.session.user_ns
        if "input" in saved:  # an input's object (`df.head` of a checked `df`: `df`)
            if saved["input"] not in ns:
                raise CorruptRecord(f"its result was {saved['input']!r}, which is not defined")
            return ns[saved["input"]]
        blob = spill.get(self.session.store, saved["ref"], saved.get("spilled", ()))
        if blob is None:
            raise CorruptRecord("the saved value of its result is missing")
        # One pickle, alone or as the only one of a shared blob (see values.dump_values).
        return values.adopt(values.load_values(blob.stream, 1, ns, blob.buffers)[0][0], ns)

    def finish_replay(self, replayed: Replayed) -> None:
        """After the replayed result was shown: the outputs recorded after it, then the note."""
        self.session.host.show(replayed.after)
        if config.get().replay_note:
            self._note(replayed.rec, replayed.label, replayed.stale)

    def _note(self, rec: StepRecord, label: str, stale: str | None) -> None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.started + rec.duration))
        calls = f", {rec.substeps} call{'s' if rec.substeps != 1 else ''}" if rec.substeps else ""
        used = Tally.from_json(rec.tokens).total.total
        if used:
            calls += f", {tokens_text(used)}"
        saved = f"saved {seconds_text(rec.duration)}{calls}"
        text = f"↻ nbdurable: replayed step {label!r} (recorded {when}; {saved})"
        if stale:
            text += f" — pinned, stale: {stale}"
        html = f'<div style="font-size:smaller;opacity:0.6">{escape(text, quote=False)}</div>'
        self.session.host.publish(
            data={"text/plain": text, "text/html": html},
            metadata={"nbdurable": {"note": "replayed", "step": rec.key}},
        )

    def _start(self, plan: Plan) -> Running:
        __tracebackhide__ = True
        ns = self.session.user_ns
        before = recording.Snapshot(ns)  # weak: a value the body drops is freed
        # Process state before the body (os.environ, RNGs, options...); _record
        # compares it with after and records the difference with the step.
        proc = procstate.snapshot(ns, procstate.assigned_attributes(plan.py))
        ctx = StepContext(plan.key, plan.label, keys.step_version(plan.source_fp, plan.inputs))
        ctx.attrs = attributes(plan, ns)
        for paths in (plan.declared or {}).values():  # as they are when the body starts
            for path in paths:
                fileio.note(ctx.file_reads, path)
        cap = self.session.host.capture()
        cap.__enter__()  # left by finish()
        ctx.capture, ctx.thread = cap, threading.get_ident()
        try:
            self.session.status[plan.key] = ("running", "")
            self.session.current = ctx
            events.emit("step-start", self.session.run_id, plan.key, label=plan.label)
        except BaseException:  # nothing is left open when the step does not start
            self.session.current = None
            cap.__exit__(None, None, None)
            raise
        return Running(plan, before, proc, ctx, cap, time.time(), time.perf_counter())

    def finish(self, running: Running, error: BaseException | None, result: Any = None) -> None:
        """End an executing step: stop its capture, record it (or its failure).

        ``result`` is the value IPython's display hook showed for the body's
        last expression (None: nothing shown); it is recorded with the step so
        a replay shows it and sets ``_`` and ``Out`` as a plain run does.
        """
        plan = running.plan
        duration = time.perf_counter() - running.t0
        self.session.current = None
        cap = running.cap
        if error is None:
            cap.__exit__(None, None, None)
        else:
            cap.__exit__(type(error), error, error.__traceback__)
            self._record_failure(plan.key, plan.label, plan.position, plan.state, error)
            return
        rec = self._record(
            plan, running.before, cap.outputs, running.started, duration, running.ctx,
            running.proc, result,
        )  # fmt: skip
        # Outputs a replay cannot show as they looked; moot (and not said) when the
        # step is not replayable: its body runs again and shows them live.
        if cap.unfaithful and rec.replayable:
            warn(
                f"step {plan.label!r}: some outputs cannot be replayed as they looked "
                f"({'; '.join(cap.unfaithful)}); a replay shows their static text or image."
            )

    def _record_failure(
        self, key: str, label: str, position: int | None, state: StepState, exc: BaseException
    ) -> None:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        # Redacted whole, then cut: a secret across the cut must not leave its first part.
        what = clip(redact.redact_keys(redact.redact_text(what)[0])[0], 500)
        self.unloadable.pop(key, None)
        self.session.status[key] = ("failed", what)
        if isinstance(exc, LeaseLost):  # the run is another process's now: nothing to note
            events.emit("step-failed", self.session.run_id, key, label=label, error=what)
            return
        failed = dataclasses.replace(
            state, failed=what, failed_at=time.time(), name=label, position=position
        )
        try:
            self.session.write(puts=[(self.session.keys.state(key), failed.to_header(), b"")])
        except NbdurableError as err:
            warn(f"step {label!r} failed and its failure could not be noted: {err}")
        events.emit("step-failed", self.session.run_id, key, label=label, error=what)

    def _record(
        self,
        plan: Plan,
        before: recording.Snapshot,
        outputs: list[dict[str, Any]],
        started: float,
        duration: float,
        ctx: StepContext,
        proc: procstate.Snapshot,
        result: Any = None,
    ) -> StepRecord:
        ns = self.session.user_ns
        key, label, position, py, state = plan.key, plan.label, plan.position, plan.py, plan.state
        changed = changed_names(before, ns, plan.analysis)
        secrets = redact.secrets_in_env()
        process = procstate.delta(proc, procstate.snapshot(ns, proc.watch), secrets) or None
        # Changed in place: unless the object is a user module's data that the
        # process delta updates in place on replay (`from helpers import REGISTRY`
        # then `helpers.REGISTRY.append(..)`), which keeps the name bound to it.
        kept = procstate.updated_in_place(process)
        in_place = mutated_inputs(plan.raw_fps, before, ns, set(changed))
        # What a helper the step called changed (a history it appended to, a
        # checkpointer inside a compiled graph): the globals it reaches, checked alike.
        in_place += mutated_inputs(plan.reached, before, ns, set(changed) | set(in_place))
        in_place += before.mutated(ns, changed + in_place)  # by helpers, methods: unnamed
        changed += [n for n in in_place if not any(ns[n] is obj for obj in kept)]
        deleted = tuple(sorted(n for n in before if n not in ns and not HIDDEN.match(n)))
        try:
            saved = recording.save_variables(
                self.session.store,
                ns,
                changed,
                dotted_imports(py),
                fingerprint_or_type,
                secrets,
                unloadable=self.unloadable.pop(key, {}),
                others=[n for n in ns if n not in changed and not HIDDEN.match(n)],
                checked=plan.inputs,
                replace=before.class_patches(ns, changed),
                # the very object the step started with: restored into the live one
                in_place=[n for n in changed if n in before and before[n] is ns[n]],
            )
            # A method called on an object that cannot be saved (a model client) is
            # not by itself a change: left out when nothing of it that can be seen changed.
            # Not produced by this step either: it keeps its producer and origin, as on a
            # replay of this record, which does not mention it (else a reader of it
            # compared it one way when recorded and another when replayed).
            dropped = saved.drop_unsaved(untouched(plan, before, ns, ctx.attrs))
            changed = [n for n in changed if n not in dropped]
            shown = _result_record(result, saved, ns, outputs, plan.inputs)
            if shown is None and result is not None and _has_result(outputs):
                extra = recording.save_variables(
                    self.session.store,
                    {_RESULT: result},
                    [_RESULT],
                    set(),
                    fingerprint_or_type,
                    secrets,
                )
                var = extra.variables[0]
                # An unsaved result is replayed as it looked (see Shown).
                shown = {"ref": var.ref} if var.kind in ("value", "shared") else None
                if shown is not None and var.spilled:
                    shown["spilled"] = [list(p) for p in var.spilled]
                saved.pending.update(extra.pending)
        except StoreError as exc:
            raise StoreError(f"step {label!r} ran but was NOT recorded: {exc}") from exc
        outputs, leaked = recording.scrub_outputs(outputs, secrets)
        source, in_source = redact.redact_text(py, secrets)
        source, kinds = redact.redact_keys(source)
        in_source += [f"{kind} key" for kind in kinds]
        # The fingerprint of each saved object pickle rebuilds from its state, kept with
        # its record: its readers compare it, not the fingerprint of a restored copy.
        contents = {n: fingerprint_or_type(ns[n], n) for n in saved.origins if _by_state(ns.get(n))}
        saved.variables = [
            dataclasses.replace(v, content=contents[v.name])
            if v.kind == "shared" and v.name in contents
            else v
            for v in saved.variables
        ]
        input_from = {n: self.producers[n] for n in plan.inputs if n in self.producers}
        fileio.note_imports(ctx.file_reads, py)  # `import helpers` in the step: helpers.py
        # Each file the step wrote, hashed once now; one it also read is its output only.
        written = fileio.outputs(ctx.file_writes)
        files = {p: v for p, v in ctx.file_reads.items() if p not in ctx.file_writes}
        rec = StepRecord(
            run=self.session.run_id,
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
            tokens=ctx.tokens.to_json(),
            process=process,
            result=shown,
            env=envreads.as_recorded(ctx.env_reads),
            files=files,
            written=written,
            declared=dict(plan.declared or {}),
            library=tuple(sorted(plan.library)),
            plain=dict(plan.plain),
            seen=plan.seen,
            made=whys.briefs(ns, [v.name for v in saved.variables], secrets),
        )
        kept = StepState(pinned=state.pinned, name=label, position=position)
        puts = [(self.session.keys.step(key), rec.to_header(), b""), self.session.touch_run()]
        deletes: list[str] = []
        if kept.pinned:
            puts.append((self.session.keys.state(key), kept.to_header(), b""))
        else:
            deletes.append(self.session.keys.state(key))
        try:
            self.session.write(puts=puts, deletes=deletes, blobs=saved.pending)
        except StoreError as exc:
            raise StoreError(f"step {label!r} ran but was NOT recorded: {exc}") from exc
        faults.point("step-written")
        self.recorded_started[key] = rec.started
        for name in changed:
            self.producers[name] = key
            self.origins.pop(name, None)
        self.origins.update(saved.origins)
        for name, content in contents.items():
            self.origins.note_fingerprint(name, content, content)
        # A value that could not be saved is told apart by the step version that
        # made it: a dependant reruns when its maker ran on other code or inputs.
        for var in saved.variables:
            if var.kind == "unsaved" and var.name in ns:
                self.origins[var.name] = (ns[var.name], f"made by {ctx.version}")
        self.session.status[key] = ("recorded", "")
        events.emit("step-recorded", self.session.run_id, key, label=label, record=rec)
        db = dbwrites.decide(rec)
        self._warn_recorded(key, label, saved, sorted(set(leaked) | set(in_source)), ctx, db)
        # calls made again, in one line, not one per call
        for line in remade_summary(ctx, plan.reason):
            warn(line)
        self._warn_process(key, label, procstate.replayable_reasons(process), ctx, db)
        return rec

    def _warn_process(
        self,
        key: str,
        label: str,
        reasons: list[str],
        ctx: StepContext,
        db: dbwrites.Decision | None = None,
    ) -> None:
        """One line when a step's process changes cannot be restored, when first recorded so.

        A later rerun whose previous record had the same reasons does not say it
        again here: its own line, at the start of the rerun, said why it runs.
        """
        known = self.process_known.pop(key, frozenset())
        reasons = [r for r in reasons if r not in known]
        if reasons:
            warn(
                f"step {label!r} was recorded, but its changes to the process cannot be "
                f"restored: {'; '.join(reasons)}. {_on_replay(db, ctx)}"
            )

    def _warn_recorded(
        self,
        key: str,
        label: str,
        saved: recording.Saved,
        leaked: list[str],
        ctx: StepContext,
        db: dbwrites.Decision | None = None,
    ) -> None:
        """One loud warning for each kind of thing a recorded step did not write."""
        # Said once, when first recorded so: rerunning the body is what it announced
        # (and each such rerun says why in one line, see begin).
        known = self.unsaved_known.pop(key, frozenset())
        unsaved = saved.unsaved_beyond(known)
        secrets = [s for s in saved.secrets if s.split(" (", 1)[0] not in known]
        if unsaved:
            then = _on_replay(db, ctx, "this step's body")
            warn(
                f"step {label!r} was recorded, but these variables cannot be saved: "
                f"{'; '.join(unsaved)}. {then}"
            )
        if secrets:
            warn(
                f"step {label!r}: these variables hold a secret and "
                f"were NOT written to the store: {'; '.join(secrets)}. On replay "
                f"this step's body runs again ({what_replays(ctx.http)})."
            )
        if leaked:
            warn(
                f"step {label!r}: its outputs or source showed "
                f"{redact.said(leaked)}; it was recorded as [redacted] instead."
            )
        if saved.large:
            warn(
                f"step {label!r}: large values recorded: {'; '.join(saved.large)} "
                f"(over warn_size_mb={config.get().warn_size_mb:g}). They are stored "
                "once by content; clear old runs with `nbdurable gc` if space runs short."
            )


#: Builtins that read the namespace by name at run time: a step calling one may

_RESULT = "the result"  # the last expression's value, saved like a variable


def _by_state(value: Any) -> bool:
    """An instance pickle rebuilds from its state (not data, an array, a frame, code)."""
    t = type(value)
    if value is None or isinstance(value, (type, types.FunctionType, types.ModuleType)):
        return False
    return str(getattr(t, "__module__", "")).partition(".")[0] not in _BY_CONTENT


#: Modules whose values come back from a pickle exactly as they were.
_BY_CONTENT = frozenset({"builtins", "numpy", "pandas", "collections", "datetime", "decimal"})


class _Unrestorable(Exception):
    """A record that cannot be restored into this kernel; its message says why.

    Worded to follow a step's label ("step 'x': cannot restore its variables (...)").
    """


def _not_replayable(rec: StepRecord) -> str:
    """Why a record cannot be replayed, in a few words (its variables, its process changes)."""
    parts = []
    unsaved = [v.name for v in rec.variables if v.kind == "unsaved"]
    if unsaved:
        parts.append(f"its variables {', '.join(unsaved)} cannot be restored")
    reasons = procstate.replayable_reasons(rec.process)
    if reasons:
        parts.append(f"its changes to the process cannot be restored ({'; '.join(reasons)})")
    return " and ".join(parts) or "it was recorded not replayable"


def _on_replay(db: dbwrites.Decision | None, ctx: StepContext, body: str = "its body") -> str:
    """What a replay of a step recorded not replayable does, as its warning ends."""
    if db is None:
        return f"On replay {body} runs again ({what_replays(ctx.http)})."
    return db.when_recorded()


def _has_result(outputs: list[dict[str, Any]]) -> bool:
    return any(o.get("output_type") == "execute_result" for o in outputs)


def _result_record(
    result: Any,
    saved: recording.Saved,
    ns: dict[str, Any],
    outputs: list[dict[str, Any]],
    inputs: dict[str, str],
) -> dict[str, str] | None:
    """The result as the very object a variable holds, so ``_ is x`` stays true; else None.

    ``{"var": name}``: a variable the step saved. ``{"input": name}``: an input
    of the step (its fingerprint is checked before a replay, so on replay
    the name holds the same value).
    """
    if result is None or not _has_result(outputs):
        return None
    for var in saved.variables:
        if var.kind in ("value", "shared") and ns.get(var.name) is result:
            return {"var": var.name}
    for name in inputs:
        if ns.get(name) is result:
            return {"input": name}
    return None


@dataclass
class Running:
    """A step whose body is executing (see :meth:`StepRunner.begin`)."""

    plan: Plan
    before: recording.Snapshot
    proc: procstate.Snapshot
    ctx: StepContext
    cap: Capture
    started: float
    t0: float


@dataclass
class Replayed:
    """A step replayed up to its result (see :meth:`StepRunner.begin`)."""

    rec: StepRecord
    label: str
    stale: str | None
    after: list[dict[str, Any]]  # outputs recorded after the execute_result
    value: Any  # the result to show (None: none)
    shown: dict[str, Any] | None = None  # its recorded execute_result


class Shown:
    """A recorded result whose value could not be saved: shown as it looked."""

    def __init__(self, output: dict[str, Any]) -> None:
        self._output = output

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> tuple[dict, dict]:
        return dict(self._output.get("data", {})), dict(self._output.get("metadata", {}))

    def __repr__(self) -> str:
        return str(self._output.get("data", {}).get("text/plain", ""))
