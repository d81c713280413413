"""``approve()``: a durable question to a person, and ``@recorded(approve=True)``.

``approve(id, summary, details=None)`` asks a person to approve what the
summary and details say, and returns ``True`` or ``False`` once they decide
(``raises=True``: a rejection raises :class:`~nbdurable.errors.Rejected`).
The decision is recorded like a sub-step (see :mod:`nbdurable.approvals`), so:

- **replay**: a decision recorded for the same question is returned at once,
  never asked again, in this kernel, after a restart, headless or on another
  machine sharing the store; clearing the step forgets it (asked again);
- **what is approved**: the decision holds the fingerprint of the summary and
  details (for ``@recorded(approve=True)``, of each argument of the call). A
  rerun that asks with other ones (another recipient) gets no answer from
  the old decision: it is asked again, and one line says what changed;
- **pending**: the question is recorded before anyone is asked, so a kernel
  that restarts while waiting, a second machine and ``nbdurable approvals``
  all see the same pending approval (asked again with the same parts, the
  record is kept as it was, its time included).

Who waits depends on the run. Headless (``nbdurable run`` sets
``NBDURABLE_HEADLESS=1`` in its kernels) nothing waits: the question is
recorded and :class:`~nbdurable.errors.ApprovalPending` stops the run, which
exits with code 7; ``nbdurable approve`` decides, and the next run replays
everything before the question and goes on. Otherwise the host waits
(:meth:`~nbdurable.durable.host.Host.wait_approval`): in a kernel, a widget with
Approve and Reject buttons, the wait ending on a click or on a decision made
elsewhere (the store is read every half second); in a script, the store only.
Asking needs the run's lease, as every write does: one runner at a time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .. import approvals, events
from ..approvals import Decision, Pending
from ..errors import ApprovalPending, BadArgument, CorruptRecord, Rejected, UsageProblem
from ..identity import keys
from ..store.layout import RUN_SCOPE
from .context import warn
from .session import Session, get_session

#: Set to ``1`` by ``nbdurable run`` in the kernels it starts: nobody is there to click.
HEADLESS_ENV = "NBDURABLE_HEADLESS"


def approve(approval_id: str, summary: str, details: Any = None, *, raises: bool = False) -> bool:
    """Ask a person to approve; ``True`` once approved, ``False`` once rejected.

    ``approval_id`` names the question within its step (the id ``nbdurable
    approve NOTEBOOK ID`` takes); ``summary`` is one line saying what is
    approved, ``details`` anything more (text, or a value shown as Python
    shows it). Both are what is approved: a rerun asking with other ones is
    asked again. ``raises=True``: a rejection raises
    :class:`~nbdurable.errors.Rejected` instead of returning ``False``.
    """
    __tracebackhide__ = True
    aid = keys.validate_sub_id(approval_id)
    if not isinstance(summary, str):
        raise BadArgument(
            f"approve({aid!r}, summary, ...): summary must be str, got {type(summary).__name__}"
        )
    parts = {"summary": _fp(summary), "details": _fp(details)}
    decision = ask(get_session(), aid, summary, details, parts)
    if not decision.approved and raises:
        raise rejected(aid, decision)
    return decision.approved


def rejected(aid: str, decision: Decision) -> Rejected:
    """The :class:`Rejected` error of a rejected approval."""
    return Rejected(f"approval {aid!r} was {decision.said()}", aid, decision.by, decision.reason)


def ask(session: Session, aid: str, summary: str, details: Any, parts: dict[str, str]) -> Decision:
    """The decision about approval ``aid``: replayed if recorded for these parts, else asked.

    Each approval of a step needs its own id, as each sub-step does: the id
    is claimed within the running step, and given back if no decision came
    (the run stopped, the wait was interrupted), so a retry may ask again.
    """
    __tracebackhide__ = True
    ctx = session.current
    if ctx is None:
        return _ask(session, aid, summary, details, parts)
    claim = keys.APPROVAL_PREFIX + aid
    with ctx.lock:
        if claim in ctx.seen:
            raise UsageProblem(
                f"approval {aid!r} of step {ctx.label!r} was already asked in this step; give "
                "each approval its own id, e.g. approve(f'send:{to}', ...)"
            )
        ctx.seen.add(claim)
    try:
        return _ask(session, aid, summary, details, parts)
    except BaseException:
        with ctx.lock:
            ctx.seen.discard(claim)
        raise


def _ask(session: Session, aid: str, summary: str, details: Any, parts: dict[str, str]) -> Decision:
    __tracebackhide__ = True
    ctx = session.current
    scope = ctx.key if ctx is not None else RUN_SCOPE
    store, rk = session.store, session.keys
    fp = approvals.digest(parts)
    where = f"approval {aid!r}" + (f" of step {ctx.label!r}" if ctx is not None else "")
    try:
        old = approvals.read_decision(store, rk, scope, aid, strict=True)
    except CorruptRecord as exc:
        # Never the old decision, never in silence: it is asked again, and why is said.
        warn(f"{where}: its recorded decision cannot be used ({exc}); asking again.")
        old = None
    again = ""
    if old is not None and old.args_fp == fp:
        if ctx is not None:
            with ctx.lock:
                ctx.subs_replayed += 1
        session.count_replayed(0.0)
        events.emit("sub-replayed", session.run_id, scope, id=keys.APPROVAL_PREFIX + aid)
        return old
    if old is not None:
        again = approvals.why_again(old, parts)
        warn(f"{where}: asking again: {again}")
    if session.verifying:
        raise session.refuse(f"{where} has no decision recorded")
    session.claim(verify=ctx is not None)
    p = approvals.read_pending(store, rk, scope, aid)
    if p is None or p.args_fp != fp:
        p = Pending(
            run=session.run_id,
            scope=scope,
            id=aid,
            step=ctx.label if ctx is not None else "",
            summary=approvals.shown(summary, approvals.SUMMARY_CHARS),
            details=approvals.shown(details, approvals.DETAILS_CHARS),
            args_fp=fp,
            parts=parts,
            asked=time.time(),
            asked_on=approvals.host_name(),
            again=again,
        )
        session.write(puts=[approvals.asked(p)])
        events.emit("store-changed", session.run_id, scope, action="ask")
    if os.environ.get(HEADLESS_ENV) == "1":
        raise ApprovalPending(headline(session, p))
    decision = session.host.wait_approval(p, _elsewhere(session, p), _decide(session, p))
    if ctx is not None:
        with ctx.lock:
            ctx.subs_recorded += 1
    return decision


def headline(session: Session, p: Pending) -> str:
    """The one line a run that stops at ``p`` says: what waits, and how to decide it."""
    nb = session.notebook.name if session.notebook is not None else "NOTEBOOK.ipynb"
    return (
        f"{p.where} is waiting for a decision: {p.summary}. Decide with "
        f"`nbdurable approve {nb} {p.id}` or `nbdurable reject {nb} {p.id} --reason ...`, "
        "then run again"
    )


def _elsewhere(session: Session, p: Pending) -> Callable[[], Decision | None]:
    """Polled while waiting: a decision about ``p`` made elsewhere (the CLI, another machine).

    A question that vanished undecided (the step was cleared meanwhile) is
    asked again: this kernel still waits for its answer, so it must stay
    listed. Deciding writes the decision and deletes the question in one
    transaction, so "no question" is only believed after a second look
    finds no decision either.
    """
    rk, store = session.keys, session.store

    def decision() -> Decision | None:
        got = approvals.read_decision(store, rk, p.scope, p.id)
        return got if got is not None and got.args_fp == p.args_fp else None

    def poll() -> Decision | None:
        got = decision()
        if got is not None or store.has(rk.pending(p.scope, p.id)):
            return got
        got = decision()
        if got is None:
            session.write(puts=[approvals.asked(p)])
        return got

    return poll


def _decide(session: Session, p: Pending) -> Callable[[bool, str], Decision]:
    """Called by the host when the person decides here: the decision, recorded."""

    def decide(approved: bool, reason: str = "") -> Decision:
        # One transaction from the look to the write, as commands.decide does: a
        # decision made elsewhere at the same moment is either seen here or waits.
        with session.store.transaction():
            got = approvals.read_decision(session.store, session.keys, p.scope, p.id)
            earlier = got if got is not None and got.args_fp == p.args_fp else None
            if earlier is not None:  # decided elsewhere meanwhile: the first decision stands
                return earlier
            puts, deletes, decision = approvals.decided(p, approved, approvals.decider(), reason)
            session.write(puts=puts, deletes=deletes)
        events.emit("store-changed", session.run_id, p.scope, action="decide")
        return decision

    return decide


def _fp(value: Any) -> str:
    try:
        return keys.fingerprint(value)
    except Exception as exc:  # a value that cannot be fingerprinted is compared by its text
        return "repr:" + approvals.digest({"repr": repr(value)[:10_000], "error": repr(exc)})
