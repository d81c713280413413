"""Operations on a run's steps, shared by the magics, the panel and the CLI.

Listing reads the store (and the notebook file when known) and never starts
a kernel; clear, pin and unpin are single transactions on the store.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CorruptRecord, UsageProblem
from .identity import locate
from .identity.keys import _shown, source_fingerprint
from .store import RUN_SCOPE, RunKeys, Store
from .store.records import StepRecord, StepState

STATES = (
    "recorded",
    "replayed",
    "running",
    "pending",
    "invalidated",
    "pinned",
    "failed",
    "not replayable",
    "orphaned",
)


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

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of this row."""
        return dict(self.__dict__)


@functools.lru_cache(maxsize=512)
def _python_source_fp(body: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        py = TransformerManager().transform_cell(body)
    except Exception:  # a cell IPython cannot transform: compare raw text
        py = body
    return source_fingerprint(py)


def _records(store: Store, rk: RunKeys) -> dict[str, StepRecord | None]:
    out: dict[str, StepRecord | None] = {}
    for k in store.scan(rk.base + "s/"):
        key = k[len(rk.base) + 2 :]
        try:
            got = store.get(k)
            out[key] = StepRecord.from_header(got[0]) if got else None
        except (CorruptRecord, KeyError, TypeError):
            out[key] = None
    return out


def _states(store: Store, rk: RunKeys) -> dict[str, StepState]:
    out: dict[str, StepState] = {}
    for k in store.scan(rk.base + "t/"):
        try:
            got = store.get(k)
        except CorruptRecord:
            continue
        if got:
            out[k[len(rk.base) + 2 :]] = StepState.from_header(got[0])
    return out


def step_infos(
    store: Store,
    run_id: str,
    notebook: Path | None = None,
    live: dict[str, tuple[str, str]] | None = None,
) -> list[StepInfo]:
    """Every step of the run in notebook order, then steps no longer in the notebook."""
    rk = RunKeys(run_id)
    records, states, live = _records(store, rk), _states(store, rk), live or {}
    cells: list[locate.StepCell] = []
    if notebook is not None:
        nbf = locate.NotebookFile(notebook)
        if nbf.refresh():
            cells = nbf.cells
    rows: list[StepInfo] = []
    seen: set[str] = set()
    for cell in cells:
        key = cell.key
        if key in seen:
            continue
        seen.add(key)
        rows.append(
            _info(
                store,
                rk,
                key,
                cell.label,
                cell.index,
                records.get(key),
                states.get(key),
                live.get(key),
                cell.body,
                True,
            )
        )

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
        rows.append(
            _info(
                store,
                rk,
                key,
                label,
                pos,
                rec,
                st,
                live.get(key),
                None,
                # A step this kernel ran is in the notebook, even if not saved yet.
                notebook is None or not cells or key in live,
            )
        )
    n, size = store.stats(rk.subs_prefix(RUN_SCOPE))
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
    store: Store,
    rk: RunKeys,
    key: str,
    label: str,
    position: int | None,
    rec: StepRecord | None,
    st: StepState | None,
    live: tuple[str, str] | None,
    body: str | None,
    in_notebook: bool,
) -> StepInfo:
    st = st or StepState()
    subs, sub_bytes = store.stats(rk.subs_prefix(key))
    size = sub_bytes + (store.size_of(rk.step(key)) if rec else 0)
    if rec is not None:
        size += sum(v.size for v in rec.variables)
    state, detail = _state_of(rec, st, live, body, in_notebook)
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
    )


def _state_of(
    rec: StepRecord | None,
    st: StepState,
    live: tuple[str, str] | None,
    body: str | None,
    in_notebook: bool,
) -> tuple[str, str]:
    live_state, live_detail = live or ("", "")
    if live_state == "running":
        return "running", ""
    if rec is None:
        if st.failed:
            return "failed", st.failed
        return "pending", ""
    stale = st.stale or ""
    if not stale and body is not None and _python_source_fp(body) != rec.source_fp:
        stale = "its code changed"
    if not stale and live_state in ("invalidated", "pinned-stale"):
        stale = live_detail
    if st.pinned:
        return "pinned", stale
    if live_state == "failed" or (st.failed and (st.failed_at or 0) > rec.started):
        return "failed", st.failed or live_detail
    if stale:
        return "invalidated", stale
    if not in_notebook:
        return "orphaned", "no longer in the notebook"
    if not rec.replayable:
        unsaved = ", ".join(v.name for v in rec.variables if v.kind == "unsaved")
        return "not replayable", f"cannot save {unsaved}; its body reruns, sub-steps replay"
    if live_state in ("replayed", "pinned-stale"):
        return "replayed", ""
    return "recorded", ""


def resolve(store: Store, run_id: str, names: list[str], notebook: Path | None = None) -> list[str]:
    """Step keys for user-given names (a step name, label or key); unknown names raise."""
    infos = step_infos(store, run_id, notebook)
    out = []
    for name in names:
        match = [i.key for i in infos if name in (i.key, i.label) or i.key == f"name:{name}"]
        if not match:
            known = ", ".join(i.label for i in infos if i.key != RUN_SCOPE) or "none yet"
            raise UsageProblem(f"no step {_shown(name)} in run {run_id!r} (known steps: {known})")
        out.append(match[0])
    return out


def clear(store: Store, run_id: str, step_keys: list[str]) -> list[str]:
    """Delete the steps' records, states and sub-steps; mark their dependants stale.

    Returns the keys of the dependants that were marked stale.
    """
    rk = RunKeys(run_id)
    records = _records(store, rk)
    states = _states(store, rk)
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
        deletes += store.scan(rk.subs_prefix(key))
    puts = []
    for key, why in stale.items():
        st = states.get(key, StepState())
        puts.append(
            (
                rk.state(key),
                StepState(
                    st.pinned, st.failed, st.failed_at, why, st.name, st.position
                ).to_header(),
                b"",
            )
        )
    store.apply(puts=puts, deletes=deletes)
    return sorted(stale)


def clear_all(store: Store, run_id: str) -> int:
    """Delete everything recorded for the run, pins included; returns the number of keys."""
    rk = RunKeys(run_id)
    keys = store.scan(rk.base)
    store.apply(deletes=keys)
    return len(keys)


def set_pin(store: Store, run_id: str, key: str, pinned: bool) -> None:
    """Pin or unpin one step."""
    rk = RunKeys(run_id)
    got = store.get(rk.step(key))
    if got is None and pinned:
        raise UsageProblem(f"step {key!r} has no record to pin yet; run it first")
    prev = store.get(rk.state(key))
    st = StepState.from_header(prev[0]) if prev else StepState()
    new = StepState(pinned, st.failed, st.failed_at, st.stale, st.name, st.position)
    if new.empty:
        store.apply(deletes=[rk.state(key)])
    else:
        store.apply(puts=[(rk.state(key), new.to_header(), b"")])


def human_size(n: int) -> str:
    """``1.2 MB`` style size."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def format_table(infos: list[StepInfo]) -> str:
    """The plain-text table shown by ``%step list`` and ``nbdurable status``."""
    import time

    head = ("#", "step", "state", "recorded", "sub-steps", "size", "detail")
    rows = [head]
    for i in infos:
        when = "-"
        if i.recorded_at:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.recorded_at))
        pos = "-" if i.position is None else str(i.position + 1)
        state = i.state + (" (stale)" if i.stale else "")
        rows.append((pos, i.label, state, when, str(i.substeps), human_size(i.size), i.detail))
    widths = [max(len(r[c]) for r in rows) for c in range(len(head) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)
