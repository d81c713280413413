"""The step runner: plan a ``%%step`` cell, replay its record or execute it, record it.

Plan: the cell's key, its code as Python, what it reads (each input's
fingerprint) and the record and state the store holds for it. A record is
replayed when its code and inputs match (or it is pinned): its variables are
restored and its outputs shown, nothing runs. Otherwise the body executes
(the run's lease is taken first) and what it bound, mutated or deleted is
recorded with its outputs in one transaction.
"""

from __future__ import annotations

import ast
import hashlib
import re
import time
import warnings
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from .. import config, events, faults, procstate, redact
from ..errors import CorruptRecord, NbdurableError, StoreError, UsageProblem
from ..identity import keys
from ..store import values
from ..store.records import StepRecord, StepState
from . import recording
from .capture import Capture, replay
from .context import StepContext, warn
from .execute import flush_streams, run_body

if TYPE_CHECKING:
    from .session import Session

_HIDDEN = re.compile(r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|get_ipython|exit|quit)$")


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


class StepRunner:
    """Runs ``%%step`` cells for one :class:`~nbdurable.kernel.session.Session`.

    It remembers, for this kernel, which step produced each variable and the
    object each step recorded or restored (see :meth:`_input_fp`).
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.producers: dict[str, str] = {}  # variable name -> step key that produced it
        # variable name -> (the object a step recorded or restored, its blob sha); see
        # _input_fp. Held weakly: a `del` frees the value as in a plain run.
        self.origins = recording.Origins()
        # step key -> names its previous record could not save (warned when it was recorded)
        self.unsaved_known: dict[str, frozenset[str]] = {}
        # step key -> {name: why} of values its last replay could not load (kept unsaved)
        self.unloadable: dict[str, dict[str, str]] = {}
        self.warned_process: set[str] = set()  # steps whose process changes were said unrestorable

    def forget(self) -> None:
        """Forget what this kernel produced (the run changed)."""
        self.producers.clear()
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

    def run_step(self, body: str, *, name: str | None = None, force: bool = False) -> None:
        """Replay the ``%%step`` cell ``body`` if its record is valid; else execute and record."""
        __tracebackhide__ = True
        if self.session.current is not None:
            raise UsageProblem(
                f"%%step cannot run inside step {self.session.current.label!r}; "
                "use step() for calls inside a step"
            )
        py = self.session.shell.transform_cell(body)
        key, label, position = self.session.resolve_key(name, body)
        analysis = keys.analyse(py)
        source_fp = keys.source_fingerprint(py)
        ns = self.session.user_ns
        self.origins.prune(ns)
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
        flush_streams()
        state = self.load_state(key)
        reason = None if rec is None else _invalid_reason(rec, source_fp, inputs, state)
        if rec is not None and not force and (reason is None or state.pinned):
            if rec.replayable and self._replay(rec, label, reason):
                return
        self.session.claim()
        if rec is not None and reason is not None and not force:
            self.session.status[key] = ("invalidated", reason)
            events.emit("step-invalidated", self.session.run_id, key, reason=reason, label=label)
        plan = Plan(key, label, position, py, source_fp, analysis, inputs, raw_fps, state)
        known = recording.unsaved_names(rec.variables if rec else ())
        self.unsaved_known[key] = known | set(self.unloadable.get(key, ()))  # _replay said it
        self._execute(plan)

    def _input_fp(self, name: str, value: Any, fp: str) -> str:
        """Fingerprint of an input; for a value a step saved, also its saved bytes.

        :func:`keys.fingerprint` sees some objects by type only (instances of
        plain classes, e.g. a model's response object). When the value is the
        very object a step recorded or restored, the sha of its pickle tells
        one recording from another, so a dependant of a re-executed step does
        not replay a result computed from the old value.
        """
        sha = self.origins.sha_for(name, value)
        if sha is None:
            return fp
        return hashlib.sha256(f"{fp}:{sha}".encode()).hexdigest()[:32]

    def _replay(self, rec: StepRecord, label: str, stale: str | None) -> bool:
        """Restore a record into the namespace and show its outputs; False if it cannot be."""
        ns = self.session.user_ns
        try:
            restored, pure = recording.load_variables(self.session.store, rec.variables, ns)
        except recording.LoadFailed as failed:
            # A damaged blob, a module gone, a failing __setstate__, a shared object changed.
            exc = failed.cause
            if not isinstance(exc, NbdurableError):
                # The value itself does not load (not its blob): record it as unsaved.
                why = f"did not load back on replay ({type(exc).__name__}: {exc})"
                self.unloadable[rec.key] = dict.fromkeys(failed.names, why)
            warn(f"step {label!r}: cannot restore its variables ({exc}); the step runs again.")
            return False
        try:  # the process state the step left: os.environ, RNGs, options...
            process = procstate.prepare(rec.process)  # resolved and checked, nothing changed yet
            for name in rec.deleted:
                ns.pop(name, None)
            ns.update(restored)
            for change in process:
                change()
        except Exception as exc:  # a directory or module gone, an option pandas refuses
            warn(f"step {label!r}: cannot restore its process state ({exc}); the step runs again.")
            return False
        for var in rec.variables:
            self.producers[var.name] = rec.key
            if var.kind in ("value", "shared"):
                self.origins[var.name] = (restored[var.name], var.ref, pure[var.name])
        replay(self.session.shell, list(rec.outputs))
        self.session.count_replayed(rec.duration, steps=1, calls=rec.substeps)
        state = "replayed" if stale is None else "pinned-stale"
        self.session.status[rec.key] = (state, stale or "")
        events.emit(
            "step-replayed", self.session.run_id, rec.key, label=label, record=rec, stale=stale
        )
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
        html = f'<div style="font-size:smaller;opacity:0.6">{escape(text, quote=False)}</div>'
        self.session.shell.display_pub.publish(
            data={"text/plain": text, "text/html": html},
            metadata={"nbdurable": {"note": "replayed", "step": rec.key}},
        )

    def _execute(self, plan: Plan) -> None:
        __tracebackhide__ = True
        before = recording.Snapshot(self.session.user_ns)  # weak: a value the body drops is freed
        # Process state before the body (os.environ, RNGs, options...); _record
        # compares it with after and records the difference with the step.
        proc = procstate.snapshot(self.session.user_ns, procstate.assigned_attributes(plan.py))
        ctx = StepContext(plan.key, plan.label)
        self.session.status[plan.key] = ("running", "")
        events.emit("step-start", self.session.run_id, plan.key, label=plan.label)
        started = time.time()
        t0 = time.perf_counter()
        self.session.current = ctx
        try:
            with Capture(self.session.shell) as cap:
                run_body(self.session.shell, plan.py, plan.analysis.has_await)
        except BaseException as exc:
            self.session.current = None
            self._record_failure(plan.key, plan.label, plan.position, plan.state, exc)
            raise
        self.session.current = None
        self._record(plan, before, cap.outputs, started, time.perf_counter() - t0, ctx, proc)
        if cap.unfaithful:  # outputs a replay cannot show as they looked
            warn(
                f"step {plan.label!r}: some outputs cannot be replayed as they looked "
                f"({'; '.join(cap.unfaithful)}); a replay shows their static text or image."
            )

    def _record_failure(
        self, key: str, label: str, position: int | None, state: StepState, exc: BaseException
    ) -> None:
        what = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:500]
        what = redact.redact_text(what)[0]
        self.unloadable.pop(key, None)
        self.session.status[key] = ("failed", what)
        failed = StepState(state.pinned, what, time.time(), state.stale, label, position)
        try:
            self.session.store.apply(puts=[(self.session.keys.state(key), failed.to_header(), b"")])
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
    ) -> None:
        ns = self.session.user_ns
        key, label, position, py, state = plan.key, plan.label, plan.position, plan.py, plan.state
        changed = _changed_names(before, ns, plan.analysis)
        changed += _mutated_inputs(plan.raw_fps, before, ns, set(changed))
        changed += before.mutated(ns, changed)  # by helpers, methods, closures: unnamed
        deleted = tuple(sorted(n for n in before if n not in ns and not _HIDDEN.match(n)))
        secrets = redact.secrets_in_env()
        process = procstate.delta(proc, procstate.snapshot(ns, proc.watch), secrets) or None
        try:
            saved = recording.save_variables(
                self.session.store,
                ns,
                changed,
                _dotted_imports(py),
                _fingerprint,
                secrets,
                unloadable=self.unloadable.pop(key, {}),
                others=[n for n in ns if n not in changed and not _HIDDEN.match(n)],
                checked=plan.inputs,
                replace=before.class_patches(ns, changed),
            )
        except StoreError as exc:
            raise StoreError(f"step {label!r} ran but was NOT recorded: {exc}") from exc
        outputs, leaked = recording.scrub_outputs(outputs, secrets)
        source, in_source = redact.redact_text(py, secrets)
        input_from = {n: self.producers[n] for n in plan.inputs if n in self.producers}
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
            process=process,
        )
        kept = StepState(pinned=state.pinned, name=label, position=position)
        puts = [(self.session.keys.step(key), rec.to_header(), b""), self.session.touch_run()]
        deletes: list[str] = []
        if kept.pinned:
            puts.append((self.session.keys.state(key), kept.to_header(), b""))
        else:
            deletes.append(self.session.keys.state(key))
        try:
            self.session.store.apply(puts=puts, deletes=deletes, blobs=saved.pending)
        except StoreError as exc:
            raise StoreError(f"step {label!r} ran but was NOT recorded: {exc}") from exc
        faults.point("step-written")
        for name in changed:
            self.producers[name] = key
            self.origins.pop(name, None)
        self.origins.update(saved.origins)
        self.session.status[key] = ("recorded", "")
        events.emit("step-recorded", self.session.run_id, key, label=label, record=rec)
        self._warn_recorded(key, label, saved, sorted(set(leaked) | set(in_source)))
        self._warn_process(key, label, procstate.replayable_reasons(process))

    def _warn_process(self, key: str, label: str, reasons: list[str]) -> None:
        """One line, once per step in this kernel, when its process changes cannot be restored."""
        if reasons and key not in self.warned_process:
            self.warned_process.add(key)
            warn(
                f"step {label!r} was recorded, but its changes to the process cannot be "
                f"restored: {'; '.join(reasons)}. On replay its body runs again (its "
                "sub-steps still replay)."
            )

    def _warn_recorded(
        self, key: str, label: str, saved: recording.Saved, leaked: list[str]
    ) -> None:
        """One loud warning for each kind of thing a recorded step did not write."""
        # Said once, when first recorded so: rerunning the body is what it announced.
        unsaved = saved.unsaved_beyond(self.unsaved_known.pop(key, frozenset()))
        if unsaved:
            warn(
                f"step {label!r} was recorded, but these variables cannot be saved: "
                f"{'; '.join(unsaved)}. On replay this step's body runs again (its "
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
