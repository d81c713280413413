"""Clear, pin, unpin and take over: one implementation for the magic, the panel and the CLI.

Each command is one transaction on the store and returns a :class:`Done`:
the one line to show the user (steps named by their labels, as
``%step list`` shows them) and the steps it changed, so that a kernel can
update what it shows (see ``Session.changed``). Nothing here imports
IPython: the CLI runs these without a kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import approvals
from .errors import UsageProblem
from .identity.keys import _shown
from .status import StepInfo, step_infos
from .store import RUN_SCOPE, RunKeys, RunView, Store
from .store.records import StepState, changed_mark


@dataclass(frozen=True)
class Done:
    """What a command did: ``message`` for the user; ``keys``, the steps it changed."""

    action: str  # clear | clear-all | pin | unpin | takeover | fork | approve | reject
    message: str
    keys: tuple[str, ...] = ()


# -- the commands, as the user gives them ----------------------------------------------


def clear_steps(store: Store, run_id: str, names: list[str], notebook: Path | None = None) -> Done:
    """``clear NAME ...``: forget the steps and their sub-steps; mark dependants stale."""
    infos = step_infos(store, run_id, notebook)
    found = resolve(store, run_id, names, notebook, infos)
    stale = clear(store, run_id, found)
    label = _labels(infos)
    message = f"cleared: {', '.join(label(k) for k in found)}"
    if stale:
        message += f"; invalidated dependants: {', '.join(label(k) for k in stale)}"
    return Done("clear", message, tuple(found))


def clear_run(store: Store, run_id: str) -> Done:
    """``clear --all``: forget everything recorded for the run, pins included."""
    n = clear_all(store, run_id)
    return Done("clear-all", f"cleared run {run_id!r} ({n} records)")


def pin_steps(
    store: Store, run_id: str, names: list[str], notebook: Path | None = None, pinned: bool = True
) -> Done:
    """``pin NAME ...`` / ``unpin NAME ...``."""
    infos = step_infos(store, run_id, notebook)
    found = resolve(store, run_id, names, notebook, infos)
    action = "pin" if pinned else "unpin"
    label = _labels(infos)
    view = RunView(store, run_id)
    # Pinning twice is harmless; unpinning a step that is not pinned is a mistake
    # (a wrong name, or the wrong run) and must not say "unpinned".
    loose = [] if pinned else [k for k in found if not view.state(k).pinned]
    if loose:
        raise UsageProblem(
            f"{', '.join(label(k) for k in loose)}: not pinned in run {run_id!r}, nothing "
            "to unpin (`status` shows which steps are pinned)"
        )
    for key in found:
        set_pin(store, run_id, key, pinned)
    return Done(action, f"{action}ned: {', '.join(label(k) for k in found)}", tuple(found))


def fork(
    store: Store,
    run_id: str,
    new_run: str,
    notebook: Path | None = None,
    from_step: str | None = None,
) -> Done:
    """A new run ``new_run`` that shares ``run_id``'s records of the steps before ``from_step``.

    Those steps replay in the fork; ``from_step`` and every step after it (in
    the notebook's order) have no record there, so the fork executes from it
    on (see :func:`nbdurable.store.copy.fork_run`). ``from_step`` None: every
    step is shared. The parent is never written.
    """
    from .identity.keys import validate_name
    from .store.copy import fork_run

    validate_name(new_run, "run name")
    if new_run == run_id:
        raise UsageProblem(f"run {run_id!r} cannot be forked into itself; give a new name")
    infos = [i for i in step_infos(store, run_id, notebook) if i.key != RUN_SCOPE]
    keep: set[str] | None = None
    where = ""
    if from_step is not None:
        (key,) = resolve(store, run_id, [from_step], notebook, infos)
        at = next(i for i in infos if i.key == key)
        if at.position is None:
            raise UsageProblem(
                f"step {at.label!r} is in no cell of the notebook, so nothing comes before it; "
                "fork without --from, or name a step of the notebook"
            )
        keep = {i.key for i in infos if i.position is not None and i.position < at.position}
        where = f" from step {at.label!r}"
    shared = [i.label for i in infos if (keep is None or i.key in keep) and i.recorded_at]
    report = fork_run(store, run_id, new_run, keep)
    said = ", ".join(repr(s) for s in shared) or "none"
    return Done(
        "fork",
        f"forked run {run_id!r} into {new_run!r}{where}: the records of {len(shared)} "
        f"step{'' if len(shared) == 1 else 's'} shared ({said}; {report.records} records, saved "
        f"variables shared, not copied); the parent is unchanged",
        tuple(sorted(keep or ())),
    )


def take_over(session: Any) -> Done:
    """``%step takeover``: hold the run's lease even if another live process does.

    ``session`` is the kernel's run context (``claim(takeover=True)`` and ``run_id``).
    """
    previous = session.claim(takeover=True)
    who = f" from {previous.describe()}" if previous else ""
    return Done("takeover", f"this kernel now holds run {session.run_id!r}{who}")


def _labels(infos: list[StepInfo]) -> Any:
    known = {i.key: i.label for i in infos}
    return lambda key: known.get(key, key)


# -- the operations on the store --------------------------------------------------------


def resolve(
    store: Store,
    run_id: str,
    names: list[str],
    notebook: Path | None = None,
    infos: list[StepInfo] | None = None,
) -> list[str]:
    """Step keys for user-given names (a step name, label or key); unknown names raise.

    A key the store holds anything under (a step that failed in a cell not
    yet saved has sub-steps, and nothing else) is a step too.
    """
    if infos is None:
        infos = step_infos(store, run_id, notebook)
    view = RunView(store, run_id)
    out = []
    for name in names:
        match = [i.key for i in infos if name in (i.key, i.label) or i.key == f"name:{name}"]
        if not match and _held(view, name):
            match = [name]
        if not match:
            known = ", ".join(i.label for i in infos if i.key != RUN_SCOPE) or "none yet"
            raise UsageProblem(f"no step {_shown(name)} in run {run_id!r} (known steps: {known})")
        out.append(match[0])
    return out


def _held(view: RunView, key: str) -> bool:
    rk = view.keys
    return bool(
        view.store.has(rk.step(key)) or view.store.has(rk.state(key)) or view.sub_stats(key)[0]
    )


def clear(store: Store, run_id: str, step_keys: list[str]) -> list[str]:
    """Delete the steps' records (every version), states and sub-steps; mark dependants stale.

    Returns the keys of the dependants that were marked stale.
    """
    view = RunView(store, run_id)
    rk = view.keys
    records = view.records()
    states = view.states()
    cleared = set(step_keys)
    stale: dict[str, str] = {}
    # (step, the cleared step it depends on): a dependant's dependants name the cleared one.
    frontier = [(key, key) for key in step_keys]
    while frontier:
        upstream, root = frontier.pop()
        for key, rec in records.items():
            if rec is None or key in cleared or key in stale:
                continue
            if upstream in rec.input_from.values():
                up = records.get(root)
                stale[key] = f"upstream step {(up.name if up else root)!r} was cleared"
                frontier.append((key, root))
    deletes = []
    for key in step_keys:
        deletes += [rk.step(key), rk.state(key)]
        deletes += store.scan(rk.subs_prefix(key))  # an approval's decision too: asked again
        deletes += store.scan(rk.pending_prefix(key))
        deletes += store.scan(rk.versions(key)) + store.scan(rk.version_subs(key))
    puts = []
    for key, why in stale.items():
        st = states.get(key, StepState())
        puts.append(
            (
                rk.state(key),
                dataclasses.replace(st, stale=why).to_header(),
                b"",
            )
        )
    # The manifest gives the cleared steps a new generation in the same transaction:
    # a cleared record written back later is refused (see store.manifest).
    store.apply(
        puts=[*puts, changed_mark(rk, "clear")], deletes=deletes, cleared=(run_id, step_keys)
    )
    return sorted(stale)


def clear_all(store: Store, run_id: str) -> int:
    """Delete everything recorded for the run, pins included; returns the number of keys.

    The lease stays: it says who records into the run, not what was recorded. Deleted,
    the kernel holding it found its next record refused as if another process had
    taken the run over, and stopped recording until restarted.
    """
    rk = RunKeys(run_id)
    # The manifest stays, with a new epoch: every record cleared is refused if written back.
    keys = [k for k in store.scan(rk.base) if k not in (rk.lease, rk.changed, rk.manifest)]
    store.apply(puts=[changed_mark(rk, "clear-all")], deletes=keys, cleared=(run_id, None))
    return len(keys)


def set_pin(store: Store, run_id: str, key: str, pinned: bool) -> None:
    """Pin or unpin one step."""
    view = RunView(store, run_id)
    rk = view.keys
    if pinned and not store.has(rk.step(key)):
        raise UsageProblem(f"step {key!r} has no record to pin yet; run it first")
    st = view.state(key)
    new = dataclasses.replace(st, pinned=pinned)
    mark = changed_mark(rk, "pin" if pinned else "unpin")
    if new.empty:
        store.apply(puts=[mark], deletes=[rk.state(key)])
    else:
        store.apply(puts=[(rk.state(key), new.to_header(), b""), mark])


def decide(
    store: Store, run_id: str, name: str, approved: bool, reason: str = "", by: str | None = None
) -> Done:
    """``nbdurable approve`` / ``reject``: decide a pending approval, in one transaction.

    The one way a decision is made outside the waiting kernel: the CLI and the
    side panel's buttons (:func:`nbdurable.server.marks.act`) call it. Raises
    :class:`~nbdurable.errors.UnknownApproval` when nothing is named ``name``,
    :class:`~nbdurable.errors.NotPending` when it was decided already.
    """
    # One transaction from the look to the write: of two people deciding at once
    # (the side panel, a terminal, a waiting kernel's widget), the second finds the
    # first decision and is refused; the two never both act.
    with store.transaction():
        p = approvals.find(store, run_id, name)
        puts, deletes, decision = approvals.decided(p, approved, by or approvals.decider(), reason)
        store.apply(puts=puts, deletes=deletes)
    return Done(
        "approve" if approved else "reject",
        f"{p.where}: {decision.said()}; a kernel waiting for it goes on now, "
        "else the next run continues from it",
        (p.scope,) if p.scope != RUN_SCOPE else (),
    )
