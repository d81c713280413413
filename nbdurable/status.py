"""The state of every step of a run: the rows of ``%step list``, ``nbdurable status`` and the panel.

Reads the store (through :class:`~nbdurable.store.RunView`) and the notebook
file when known, and never starts a kernel. A kernel adds what only it
knows (``live``: running, replayed, invalidated in this kernel; ``current``:
the inputs as its namespace holds them now). Whether a record replays is
decided by :func:`nbdurable.identity.verdict.invalid_reason`, the function the step
runner acts on, so a row says what running the step would do.

Rows are judged in notebook order, and each passes on what it predicts: a
step the next run executes (or may execute) is in the ``will_run`` of the
steps after it, so a step that read one of its values shows "may run"
(its replay depends on that value coming out the same), never "recorded"
or "replayed" (see :func:`~nbdurable.identity.verdict.will_run_entry`).
Which step writes each name is known from the record (``input_from``) and,
for a step renamed or added since, from the saved cells: the names each
one binds (:func:`nbdurable.identity.keys.analyse`) and those its record
saved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import dbwrites, procstate, why
from .clients.usage import Tally
from .identity import cellpython, locate, verdict
from .identity.analysis import (
    binds_unknown,
    constant_bindings,
    constant_values,
    def_key,
    function_defs,
    library_imports,
    literal_key,
)
from .identity.keys import analyse, source_fingerprint, step_version
from .store import RUN_SCOPE, RunView, Store, versions
from .store.records import StepRecord, StepState
from .text import human_size

_NONE = object()


@dataclass(frozen=True)
class StepInfo:
    """One row of ``%step list`` / ``nbdurable status`` / the panel."""

    key: str
    label: str
    state: str
    detail: str = ""
    position: int | None = None
    recorded_at: float | None = None
    duration: float = 0.0
    substeps: int = 0
    size: int = 0
    pinned: bool = False
    stale: bool = False
    replayable: bool = True
    calls: int = 0
    #: tokens the step's model replies reported (input + output): what its replay saves
    tokens: int = 0
    #: the current record's version (8 hex of its code and inputs' digest; "" if none)
    version: str = ""
    #: how many other versions of the step keep their records (see store.versions)
    versions: int = 0
    #: what exactly changed, a few short lines under ``detail`` (see :mod:`nbdurable.why`)
    why: tuple[str, ...] = ()
    #: what the next run does when the state alone does not say it ("" : as the state
    #: says); a step that wrote to a database file (see nbdurable.dbwrites)
    next_run: str = ""

    @property
    def cell(self) -> int | None:
        """The step's cell as frontends number cells: from 1 (None: not known)."""
        return None if self.position is None else self.position + 1

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of this row; its cell numbered from 1 (``cell``), as shown."""
        d = dict(self.__dict__)
        del d["position"]
        d["cell"] = self.cell
        return d


@cellpython.by_text
def _python_source_fp(body: str) -> str:
    py = cellpython.python_of(body)
    # A cell IPython cannot transform: compare raw text.
    return source_fingerprint(body if py is None else py)


@cellpython.by_text
def _written(body: str) -> frozenset[str]:
    """The names a ``%%step`` cell body binds at top level.

    Not the names it may change in place: the analysis counts every method
    call (``time.sleep(1)``) as one, which would make every step reading a
    module wait on any step that calls it. A step's record names what it
    really changed.
    """
    py = cellpython.python_of(body)
    # A cell IPython cannot transform: what its record saved must do.
    return frozenset() if py is None else analyse(py).binds


def _outcomes(recorded_source: str, body: str) -> dict[str, bool]:
    """What a step about to run again makes of the names its code binds to a literal,
    before and after an edit: name -> True (the same value), False (another one).

    ``recorded_source``: its record's code (Python); ``body``: the saved cell's.
    See :func:`nbdurable.identity.analysis.constant_bindings`.
    """
    before = constant_bindings(recorded_source)
    after = constant_bindings(_python(body))
    # A record's code has its secrets redacted ("[redacted $OPENAI_API_KEY]"): such a
    # literal is not known to differ from the one in the cell.
    return {
        n: before[n] == v
        for n, v in after.items()
        if n in before and (before[n] == v or "[redacted " not in before[n])
    }


def _python(body: str) -> str:
    """The cell's Python ("": a cell IPython cannot transform, of which nothing is known)."""
    return cellpython.python_of(body) or ""


def step_infos(
    store: Store,
    run_id: str,
    notebook: Path | None = None,
    live: dict[str, tuple[str, str]] | None = None,
    current: Callable[[StepRecord], tuple[dict[str, str], frozenset[str]]] | None = None,
    values: Callable[[str], str | None] | None = None,
) -> list[StepInfo]:
    """Every step of the run in notebook order, then steps no longer in the notebook.

    ``current``: in a kernel, a record's inputs as the namespace holds them
    (known fingerprints, names it lacks); see :func:`nbdurable.identity.verdict.invalid_reason`.
    ``values``: in a kernel, what a name holds now as "why" shows it
    (:func:`nbdurable.why.brief`); without one, the value the step that makes
    it recorded last, or the literal a saved plain cell binds.
    """
    # Imported here: nbdurable.approvals uses nbdurable.commands, which uses this module.
    from . import approvals

    judge = _Judge(records_of=None, current=current, view=None, values=values)
    judge.local_dir = notebook.parent if notebook is not None else None
    nb_name = notebook.name if notebook is not None else "NOTEBOOK.ipynb"
    for p in approvals.pending(store, run_id):
        judge.asked.setdefault(p.scope, approvals.waiting_line(p, nb_name))
    view = RunView(store, run_id)
    sized = view.records_sized()
    records = {step: rec for step, (rec, _) in sized.items()}
    states, live = view.states(), live or {}
    judge.records_of, judge.view = records, view
    # Read once for every row (a query per step each was most of a large run's view).
    judge.kept = versions.kept_by_step(store, view.keys)
    judge.subs, judge.sizes = view.all_sub_stats(), {k: size for k, (_, size) in sized.items()}
    cells: list[locate.StepCell] = []
    plain: list[tuple[int, str]] = []
    if notebook is not None:
        nbf = locate.NotebookFile(notebook)
        if nbf.refresh():
            cells, plain = nbf.cells, nbf.plain
    rows: list[StepInfo] = []
    seen: set[str] = set()
    for cell in cells:
        while plain and plain[0][0] < cell.index:  # what a Run All runs before it
            judge.ran_plain(plain.pop(0)[1])
        key = cell.key
        if key in seen:
            continue
        seen.add(key)
        info = _info(
            key,
            cell.label,
            cell.index,
            records.get(key),
            states.get(key),
            live.get(key),
            cell.body,
            True,
            judge,
        )
        judge.passed(info, _written(cell.body), records.get(key), cell.body)
        rows.append(info)

    def order(key: str) -> tuple[bool, int, float, str]:
        # By position where known, else in the order the steps were recorded.
        rec, st = records.get(key), states.get(key)
        pos = rec.position if rec else (st.position if st else None)
        return (pos is None, pos or 0, rec.started if rec else float("inf"), key)

    extra = sorted((set(records) | set(states)) - seen, key=order)
    for key in extra:
        rec, st = records.get(key), states.get(key)
        label = (rec.name if rec else None) or (st.name if st else None) or key
        pos = rec.position if rec else (st.position if st else None)
        info = _info(
            key,
            label,
            pos,
            rec,
            st,
            live.get(key),
            None,
            # A step this kernel ran is in the notebook, even if not saved yet.
            notebook is None or not cells or key in live,
            judge,
        )
        judge.passed(info, frozenset(), rec)
        rows.append(info)
    n, size = judge.subs.get(RUN_SCOPE, (0, 0))
    if n:
        rows.append(
            StepInfo(RUN_SCOPE, "(outside steps)", "recorded", substeps=n, size=size, calls=n)
        )
    return rows


def pending_infos(notebook: Path) -> list[StepInfo]:
    """Status rows when no store exists yet: every saved ``%%step`` cell is pending."""
    nbf = locate.NotebookFile(notebook)
    nbf.refresh()
    return [StepInfo(c.key, c.label, "pending", position=c.index) for c in nbf.cells]


def _info(
    key: str,
    label: str,
    position: int | None,
    rec: StepRecord | None,
    st: StepState | None,
    live: tuple[str, str] | None,
    body: str | None,
    in_notebook: bool,
    judge: _Judge,
) -> StepInfo:
    st = st or StepState()
    subs, sub_bytes = judge.subs.get(key, (0, 0))
    size = sub_bytes + (judge.sizes.get(key, 0) if rec else 0)
    if rec is not None:
        size += sum(v.size for v in rec.variables)
    db = dbwrites.decide(rec)  # once per row: its state and its next run both follow it
    state, detail = _state_of(rec, st, live, body, in_notebook, judge, key, db)
    lines: tuple[str, ...] = ()
    if rec is not None and detail and state in ("invalidated", "pinned"):
        code_now = None if body is None else _python(body)
        lines = why.explain(rec, detail, code_now=code_now, now=judge.now_of(rec))
    return StepInfo(
        key=key,
        label=label,
        state=state,
        detail=detail,
        position=position,
        recorded_at=(rec.started + rec.duration) if rec else None,
        duration=rec.duration if rec else 0.0,
        substeps=subs,
        size=size,
        pinned=st.pinned,
        stale=state == "pinned" and bool(detail),
        replayable=rec.replayable if rec else True,
        calls=rec.substeps if rec else subs,
        tokens=Tally.from_json(rec.tokens).total.total if rec else 0,
        next_run=_db_next(db, state),
        version=step_version(rec.source_fp, rec.inputs)[:8] if rec else "",
        versions=len(judge.kept.get(key, ())),
        why=lines,
    )


@dataclass
class _Judge:
    """What a view knows to predict each record's fate (see :mod:`nbdurable.identity.verdict`)."""

    records_of: dict[str, StepRecord] | None
    current: Callable[[StepRecord], tuple[dict[str, str], frozenset[str]]] | None
    view: RunView | None
    #: the steps judged so far that the next run executes (or may): key -> (label, certain)
    will_run: dict[str, tuple[str, bool]] = field(default_factory=dict)
    #: each name -> the step judged so far that writes it last, as the saved cells say
    writers: dict[str, str] = field(default_factory=dict)
    #: for steps in ``will_run``: name -> whether the rerun makes it the same, where
    #: known before it runs (see :func:`_outcomes`)
    outcomes: dict[str, dict[str, bool]] = field(default_factory=dict)
    #: for steps in ``will_run``: name -> the brief of the literal their saved code
    #: binds it to, what the rerun makes of it (the value "why" shows as new)
    upcoming: dict[str, dict[str, str]] = field(default_factory=dict)
    #: each name the saved plain cells judged so far bind last -> the literal key of
    #: the value they bind it to (None: not a literal); see :meth:`ran_plain`
    plain_now: dict[str, str | None] = field(default_factory=dict)
    #: a plain cell may have bound names its syntax does not spell: none is known
    wild: bool = False
    #: in a kernel, a name's brief now (see step_infos); the saved plain cells' literals'
    values: Callable[[str], str | None] | None = None
    plain_brief: dict[str, str] = field(default_factory=dict)
    #: the functions the saved plain cells judged so far define last, and the names
    #: they bind to a library's import; where the notebook lies (its local modules)
    plain_defs: dict[str, Any] = field(default_factory=dict)
    plain_libs: set[str] = field(default_factory=set)
    local_dir: Path | None = None
    #: each step with an approval waiting for a decision -> the line that says which, and how
    asked: dict[str, str] = field(default_factory=dict)
    #: each step's earlier versions its archive keeps (see store.versions), read once
    kept: dict[str, list[str]] = field(default_factory=dict)
    #: ``(count, bytes)`` of each scope's sub-step records, and each step record's bytes
    subs: dict[str, tuple[int, int]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    def now_of(self, rec: StepRecord) -> Callable[[str], str | None]:
        """What each input of ``rec`` is now, as "why" shows it, where known."""
        if self.values is not None:
            return self.values

        def now(name: str) -> str | None:
            if name in self.plain_brief:
                return self.plain_brief[name]
            for key in (self.writers.get(name), rec.input_from.get(name)):
                if key in (None, rec.key):
                    continue
                coming = self.upcoming.get(key, {}) if key in self.will_run else {}
                if name in coming:  # it runs first: what its saved code binds
                    return coming[name]
                if key in self.will_run and self.will_run[key][1]:
                    return None  # it runs first, and what it makes is not known yet
                maker = (self.records_of or {}).get(key)
                if maker is not None and name in maker.made:
                    return maker.made[name]
            return None

        return now

    def ran_plain(self, source: str) -> None:
        """Note what a saved plain cell binds, as a Run All runs it before the next step."""
        if self.wild:
            return
        py = _python(source)
        if not py.strip():
            return
        if binds_unknown(py):
            self.wild = True
            self.plain_now.clear()
            self.plain_brief.clear()
            return
        consts = constant_values(py)
        defs = function_defs(py)
        libs = library_imports(py, self.local_dir)
        for name in analyse(py).binds:
            value = consts.get(name, _NONE)
            self.plain_now[name] = None if value is _NONE else literal_key(value)
            self.plain_brief.pop(name, None)
            self.plain_defs.pop(name, None)
            self.plain_libs.discard(name)
            if value is not _NONE:
                self.plain_brief[name] = why.brief(value)
            elif name in defs:
                self.plain_defs[name] = defs[name]
                self.plain_brief[name] = "function"
            elif name in libs:
                self.plain_libs.add(name)

    def _plain_now(self, names: Any) -> dict[str, str | None]:
        """``plain_now`` with the functions among ``names`` that the saved plain cells
        define: each one's :func:`~nbdurable.identity.analysis.def_key`, from what the
        names it reads are now (as a record keeps it: ``localcode.notebook_function_key``).
        """
        wanted = [n for n in names if n in self.plain_defs]
        if not wanted:
            return self.plain_now
        visiting: set[str] = set()

        def resolve(name: str) -> str | None:
            if name in self.plain_defs:
                if name in visiting:
                    return None  # functions calling each other: the kernel knows no key either
                visiting.add(name)
                try:
                    return def_key(self.plain_defs[name], resolve)
                finally:
                    visiting.discard(name)
            if name in self.plain_libs:
                return "lib"
            if name in self.plain_now:
                return self.plain_now[name]
            if name in self.writers:
                return None  # a step's value: only the kernel sees it
            return "lib"  # a builtin (IPython binds some, open() too), or bound by no cell

        now = dict(self.plain_now)
        for name in wanted:
            now[name] = resolve(name)
        return now

    def passed(
        self,
        info: StepInfo,
        written: frozenset[str],
        rec: StepRecord | None,
        body: str | None = None,
    ) -> None:
        """Remember ``info``'s prediction for the steps after it (see the module docstring).

        ``written``: the names its saved cell writes; with those its record saved.
        ``body``: its saved cell's code, if in the notebook.
        """
        entry = verdict.will_run_entry(info.label, info.state)
        if entry is not None:
            self.will_run[info.key] = entry
            if rec is not None and body is not None:
                self.outcomes[info.key] = _outcomes(rec.source, body)
            if body is not None:
                consts = constant_values(_python(body))
                self.upcoming[info.key] = {n: why.brief(v) for n, v in consts.items()}
        if info.state == "orphaned":
            return  # not in the notebook: the next run does not write anything through it
        names = set(written)
        if rec is not None:
            names.update(v.name for v in rec.variables)
            names.update(rec.deleted)
        for name in names:
            self.writers[name] = info.key
            self.plain_now.pop(name, None)  # a step's value now, not a plain cell's
            self.plain_brief.pop(name, None)
            self.plain_defs.pop(name, None)
            self.plain_libs.discard(name)

    def reason(self, rec: StepRecord, st: StepState, body: str | None) -> str | None:
        if self.current is not None:
            inputs, unknown = self.current(rec)
        else:  # no kernel: no namespace to compare with
            inputs, unknown = {}, frozenset(rec.inputs)
        source_fp = None if body is None else _python_source_fp(body)
        why = verdict.invalid_reason(
            rec,
            st,
            source_fp=source_fp,
            inputs=inputs,
            unknown=unknown,
            upstream=self.records_of,
            environment=self.current is not None,
            will_run=self.will_run,
            writers=self.writers,
            outcomes=self.outcomes,
            plain_now=self._plain_now(rec.plain),
        )
        view = self.view
        if why is not None and verdict.PLAIN_REBOUND in why and self.kept.get(rec.key):
            # A Run All brings back a kept version recorded from that value, if one was:
            # which one is not known without the kernel's fingerprints.
            return f"{verdict.MAY_RUN}{why}: replays a kept version recorded from it, if any"
        if (
            why is None
            or verdict.may_run(why)
            or st.pinned
            or unknown
            or source_fp not in (None, rec.source_fp)
        ):
            return why
        # The step runner first brings back a kept record of the version it is about
        # to run (store.versions): that one replays. Only where the version is known:
        # the same code (so the same input names) and every input seen in the kernel.
        if (
            self.current is not None
            and view is not None
            and versions.has(view.store, view.keys, rec.key, step_version(rec.source_fp, inputs))
        ):
            return None
        return why


#: How a step's failure begins when its run stopped at an approval (``nbdurable run``).
_STOPPED_AT_APPROVAL = "ApprovalPending"

#: The states a step waiting for an approval would otherwise show: it runs (or ran) up
#: to the question, and goes on from it once decided.
_WAITS_IN = ("running", "failed", "pending", "invalidated")


def _state_of(
    rec: StepRecord | None,
    st: StepState,
    live: tuple[str, str] | None,
    body: str | None,
    in_notebook: bool,
    judge: _Judge,
    key: str,
    db: dbwrites.Decision | None,
) -> tuple[str, str]:
    """The state shown for a step and its detail; ``waiting`` while an approval of it is pending.

    A step stopped at an approval would read as failed (``ApprovalPending``), or as
    running while a kernel waits for the click: it is waiting, and the detail names the
    approval and how to decide it. Once decided, the step is pending (the next run goes
    on from the decision), never failed.
    """
    state, detail = _judged(rec, st, live, body, in_notebook, judge, db)
    if key in judge.asked and state in _WAITS_IN:
        return "waiting", judge.asked[key]
    if state == "failed" and detail.startswith(_STOPPED_AT_APPROVAL):
        return "pending", "its approval was decided: the next run goes on from the decision"
    return state, detail


def _judged(
    rec: StepRecord | None,
    st: StepState,
    live: tuple[str, str] | None,
    body: str | None,
    in_notebook: bool,
    judge: _Judge,
    db: dbwrites.Decision | None,
) -> tuple[str, str]:
    live_state, live_detail = live or ("", "")
    if live_state == "running":
        return "running", ""
    if rec is None:
        if st.failed:
            return "failed", st.failed
        return "pending", ""
    stale = judge.reason(rec, st, body) or ""
    if (not stale or verdict.may_run(stale)) and live_state in ("invalidated", "pinned-stale"):
        stale = live_detail
    if st.pinned:
        return "pinned", stale
    if live_state == "failed" or (st.failed and (st.failed_at or 0) > rec.started):
        return "failed", st.failed or live_detail
    if stale and not verdict.may_run(stale):
        return "invalidated", stale
    if not in_notebook:
        return "orphaned", "no longer in the notebook"
    if db is not None:  # it wrote to a database file: replays with stand-ins, or refuses
        if db.action == "refuse":
            return "not replayable", db.detail()
        if not stale and live_state not in ("replayed", "pinned-stale"):
            return "recorded", db.detail()
    elif not rec.replayable:
        unsaved = ", ".join(v.name for v in rec.variables if v.kind == "unsaved")
        reasons = procstate.replayable_reasons(rec.process)
        why = f"cannot save {unsaved}" if unsaved else "; ".join(reasons)
        return "not replayable", f"{why}; its body reruns, sub-steps replay"
    if stale:  # its fate waits on a step before it (verdict.MAY_RUN)
        return "may run", stale.removeprefix(verdict.MAY_RUN)
    if live_state in ("replayed", "pinned-stale"):
        return "replayed", ""
    return "recorded", ""


#: What the next run does with a step in each state, for ``nbdurable status --why``.
_NEXT = {
    "recorded": "replays: nothing it reads or runs changed since it was recorded",
    "replayed": "replays: nothing it reads or runs changed since it was recorded",
    "pinned": "replays: it is pinned",
    "invalidated": "runs again",
    "may run": "replays if what it reads comes out of the steps before it the same, else runs",
    "pending": "runs: nothing is recorded for it",
    "failed": "runs again: it failed",
    "waiting": "stops at the same approval until a person decides it, then goes on from it",
    "running": "is running now",
    "orphaned": "nothing: it is no longer in the notebook",
    "not replayable": "runs its body again; its sub-steps replay",
}


def _db_next(db: dbwrites.Decision | None, state: str) -> str:
    """What the next run does with a step that wrote to a database file ("": the state says)."""
    if db is None or state not in ("recorded", "replayed", "not replayable", "may run"):
        return ""
    if state == "may run" and db.action == "standins":
        return f"{_NEXT[state]}; if it replays, {db.next_run().removeprefix('replays: ')}"
    return db.next_run()


def why_text(info: StepInfo) -> str:
    """One step's state, reason and what exactly changed, as ``nbdurable status --why``."""
    cell = f" (cell {info.cell})" if info.cell is not None else ""
    head = f"step {info.label!r}{cell}: {info.state}"
    if info.state == "pinned" and info.detail:
        head += f" (stale: {info.detail})"
    elif info.detail:
        head += f": {info.detail}"
    lines = [head, f"  next run: {info.next_run or _NEXT.get(info.state, info.state)}"]
    lines += [f"  {line}" for line in info.why]
    return "\n".join(lines)


def format_table(infos: list[StepInfo]) -> str:
    """The plain-text table shown by ``%step list`` and ``nbdurable status``.

    A ``tokens`` column (what each step's model replies reported, so what its
    replay saves) is there when some step's replies reported tokens.
    """
    with_tokens = any(i.tokens for i in infos)
    head = ("#", "step", "state", "recorded", "version", "sub-steps", "size", "detail")
    if with_tokens:
        head = (*head[:6], "tokens", *head[6:])
    rows = [head]
    for i in infos:
        when = "-"
        if i.recorded_at:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.recorded_at))
        pos = "-" if i.cell is None else str(i.cell)
        state = i.state + (" (stale)" if i.stale else "")
        version = (i.version or "-") + (f" +{i.versions}" if i.versions else "")
        row = (pos, i.label, state, when, version, str(i.substeps), human_size(i.size), i.detail)
        if with_tokens:
            row = (*row[:6], f"{i.tokens:,}" if i.tokens else "-", *row[6:])
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(head) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)
