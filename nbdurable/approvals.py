"""Approvals in the store: a question asked of a person, and the decision they made.

``approve()`` (:mod:`nbdurable.durable.approval`) asks; the widget, ``nbdurable
approve`` / ``nbdurable reject`` and another machine on a team store decide.
Both sides go through this module, so the kernel and the CLI read and write
the same two records (see :mod:`nbdurable.store.layout`):

- **pending**, ``p/<scope>/<id>``: asked and not decided yet. It holds the
  approval's id, its step (scope and label), the summary and details shown
  (redacted as every record is), the fingerprint of what is approved (its
  *parts*, one fingerprint each: the summary and details, or each argument of
  a ``@recorded(approve=True)`` call), when and on which machine it was asked,
  and why it was asked again (``again``), if it was.
- **decision**, the sub-step ``u/<scope>/approval:<id>``: approved or
  rejected, by whom (``user@host``, the host being ``NBDURABLE_HOST`` or the
  machine's name), when, the reason given, and the fingerprint of what was
  decided. A sub-step like any other: clearing the step forgets it (the next
  run asks again), forks and copies carry it, versions archive it.

Deciding writes the decision and deletes the pending record in one
transaction, with the run's ``changed`` mark (panels see it within a second).
A decision applies only to what it decided: when a rerun asks with other
parts (another recipient), the old decision does not apply, and
:func:`why_again` says in one line what changed.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import pprint
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import redact
from .errors import CorruptRecord, NotPending, UnknownApproval, UsageProblem
from .identity.keys import APPROVAL_PREFIX
from .store import RunKeys, Store
from .store.records import FORMAT_VERSION, SubRecord, changed_mark
from .text import clip

#: How much of a summary and of the details a record keeps (the rest is cut, with "…").
SUMMARY_CHARS = 500
DETAILS_CHARS = 20_000


@dataclass(frozen=True)
class Pending:
    """An approval asked and not decided yet (the ``p/<scope>/<id>`` record)."""

    run: str
    scope: str  # the step key, or RUN_SCOPE
    id: str
    step: str  # the step's label ("" outside any step)
    summary: str
    details: str
    args_fp: str
    parts: dict[str, str] = field(default_factory=dict)
    asked: float = 0.0
    asked_on: str = ""  # the machine that asked (NBDURABLE_HOST or its name)
    again: str = ""  # why it was asked again: what changed since the last decision

    def to_header(self) -> dict[str, Any]:
        """The record's header."""
        return {"kind": "approval", **asdict(self)}

    @classmethod
    def from_header(cls, h: dict[str, Any]) -> Pending:
        """Decode a pending record; raises ``KeyError``/``TypeError`` if malformed."""
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in h.items() if k in known})

    @property
    def where(self) -> str:
        """``approval 'send' of step 'email'``."""
        return f"approval {self.id!r}" + (f" of step {self.step!r}" if self.step else "")


@dataclass(frozen=True)
class Decision:
    """What a person decided about an approval."""

    approved: bool
    by: str
    at: float
    reason: str
    args_fp: str
    parts: dict[str, str]
    summary: str = ""

    @property
    def verb(self) -> str:
        """``approved`` or ``rejected``."""
        return "approved" if self.approved else "rejected"

    def said(self) -> str:
        """``approved by ann@box at 2026-12-04 17:20:03`` (with the reason, if any)."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.verb} by {self.by} at {when}{reason}"


def host_name() -> str:
    """The machine's name in a decision: ``NBDURABLE_HOST``, else the host name."""
    return os.environ.get("NBDURABLE_HOST", "").strip() or socket.gethostname()


def decider() -> str:
    """Who decides from this process: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        user = "unknown"
    return f"{user}@{host_name()}"


def shown(value: Any, limit: int) -> str:
    """``value`` as the text a person reads and the record keeps: redacted, then cut."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else pprint.pformat(value, width=88, sort_dicts=False)
    # Redacted whole, then cut: a secret across the cut must not leave its first part.
    text = redact.redact_keys(redact.redact_text(text)[0])[0]
    return clip(text, limit)


def digest(parts: dict[str, str]) -> str:
    """The fingerprint of what an approval decides, over its parts' fingerprints."""
    h = hashlib.sha256(b"nbdurable-approval-1\0")
    for label in sorted(parts):
        h.update(f"{label}\0{parts[label]}\0".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def why_again(old: Decision, parts: dict[str, str]) -> str:
    """One line: why ``old`` does not apply to an approval asked with ``parts``."""
    changed = [k for k in parts if old.parts.get(k) != parts[k]]
    changed += [k for k in old.parts if k not in parts]
    named = ", ".join(_part_name(k) for k in changed) or "what it approves"
    return f"{named} changed since it was {old.said()}"


def _part_name(label: str) -> str:
    if label.startswith("#"):
        return f"argument {label[1:]}"
    if label in ("summary", "details"):
        return f"its {label}"
    return f"argument {label!r}"


# -- reading -------------------------------------------------------------------------------


def read_pending(store: Store, rk: RunKeys, scope: str, approval_id: str) -> Pending | None:
    """The pending record of one approval; None if absent or unreadable."""
    try:
        got = store.get(rk.pending(scope, approval_id))
    except CorruptRecord:
        return None
    if got is None:
        return None
    try:
        return Pending.from_header(got[0])
    except (KeyError, TypeError):
        return None


def read_decision(
    store: Store, rk: RunKeys, scope: str, approval_id: str, strict: bool = False
) -> Decision | None:
    """The decision recorded for one approval; None if absent or unreadable (asked again).

    With ``strict``, a record that fails its check (or is no longer current: see
    :mod:`nbdurable.store.manifest`) raises :class:`CorruptRecord`, for the asker to say.
    """
    try:
        got = store.get(rk.sub(scope, APPROVAL_PREFIX + approval_id))
    except CorruptRecord:
        if strict:
            raise
        return None
    if got is None:
        return None
    d = got[0].get("approval")
    if not isinstance(d, dict):
        return None
    try:
        return Decision(
            approved=bool(d["approved"]),
            by=str(d["by"]),
            at=float(d["at"]),
            reason=str(d.get("reason") or ""),
            args_fp=str(got[0]["args_fp"]),
            parts=dict(d.get("parts") or {}),
            summary=str(d.get("summary") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def pending(store: Store, run_id: str) -> list[Pending]:
    """Every approval of the run waiting for a decision, the longest waiting first."""
    rk = RunKeys(run_id)
    out = []
    for key in store.scan(rk.all_pending):
        try:
            got = store.get(key)
            if got is not None:
                out.append(Pending.from_header(got[0]))
        except (CorruptRecord, KeyError, TypeError):
            continue  # an unreadable question is asked again by the run that reaches it
    return sorted(out, key=lambda p: p.asked)


def waiting_line(p: Pending, notebook: str) -> str:
    """What a view says of a step waiting for ``p``: which approval, and how to decide it."""
    return (
        f"{p.where} waits for a decision: {p.summary}. Approve or Reject it in the cell or "
        f"the Steps side panel, or `nbdurable approve {notebook} {p.id}` / "
        f"`nbdurable reject {notebook} {p.id} --reason ...`"
    )


# -- writing -------------------------------------------------------------------------------


def asked(p: Pending) -> tuple[str, dict[str, Any], bytes]:
    """The pending record of ``p``, to write."""
    return (RunKeys(p.run).pending(p.scope, p.id), p.to_header(), b"")


def decided(
    p: Pending, approved: bool, by: str, reason: str = "", at: float | None = None
) -> tuple[list[tuple[str, dict[str, Any], bytes]], list[str], Decision]:
    """``(puts, deletes, decision)``: the decision of ``p`` recorded, its pending record gone.

    The decision is a sub-step record (see the module docstring); its body is
    the pickle of ``approved``, so every reader of sub-steps can load it.
    """
    from .store import values

    at = time.time() if at is None else at
    reason = shown(reason, SUMMARY_CHARS)
    body = values.dumps(approved)
    header = SubRecord(
        run=p.run,
        scope=p.scope,
        id=APPROVAL_PREFIX + p.id,
        fn="nbdurable.approve",
        args_fp=p.args_fp,
        started=p.asked,
        duration=0.0,
        size=len(body),
        type="bool",
        format=FORMAT_VERSION,
        returns="approval",
    ).to_header()
    header["approval"] = {
        "approved": approved,
        "by": by,
        "at": at,
        "reason": reason,
        "parts": p.parts,
        "summary": p.summary,
    }
    rk = RunKeys(p.run)
    decision = Decision(approved, by, at, reason, p.args_fp, dict(p.parts), p.summary)
    puts = [(rk.sub(p.scope, APPROVAL_PREFIX + p.id), header, body), changed_mark(rk, "decide")]
    return puts, [rk.pending(p.scope, p.id)], decision


def find(store: Store, run_id: str, name: str) -> Pending:
    """The pending approval ``name`` names: its id, or ``STEP/ID`` when ids repeat."""
    waiting = pending(store, run_id)
    match = [p for p in waiting if name in (p.id, f"{p.step}/{p.id}", f"{p.scope}/{p.id}")]
    if len(match) == 1:
        return match[0]
    if len(match) > 1:
        said = ", ".join(f"{p.step or p.scope}/{p.id}" for p in match)
        raise UsageProblem(f"{len(match)} pending approvals are named {name!r}: give one of {said}")
    for where, done in decisions(store, run_id):
        if name in (done[0], f"{where[0]}/{done[0]}", f"{where[1]}/{done[0]}"):
            raise NotPending(
                f"approval {name!r} was already {done[1].said()}: the first decision stands"
            )
    known = ", ".join(repr(p.id) for p in waiting) or "none"
    raise UnknownApproval(f"no pending approval {name!r} in run {run_id!r} (pending: {known})")


def decisions(store: Store, run_id: str) -> list[tuple[tuple[str, str], tuple[str, Decision]]]:
    """Every decision recorded in the run: ``((step label, scope), (approval id, decision))``."""
    rk = RunKeys(run_id)
    out = []
    for key in store.scan(rk.all_subs):
        scope, _, sub = key[len(rk.all_subs) :].partition("/")
        if not sub.startswith(APPROVAL_PREFIX):
            continue
        aid = sub[len(APPROVAL_PREFIX) :]
        got = read_decision(store, rk, scope, aid)
        if got is None:
            continue
        # A named step's label is its name; an unnamed one is known by its scope.
        out.append(((scope.removeprefix("name:"), scope), (aid, got)))
    return out
