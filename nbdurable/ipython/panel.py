"""The step panel: an ipywidgets view of every step of the run, kept live by engine events.

Rows come from :func:`nbdurable.status.step_infos` (the same rows as ``%step
list`` and ``nbdurable status``), and the buttons call the same commands as
the ``%step`` magics (:mod:`nbdurable.commands`), so the panel, the magics
and the CLI never disagree.

Live updates and batching. The panel listens to :mod:`nbdurable.events`. The
listener runs on the step's hot path, so it only touches memory: a sub-step
event increments a counter, a step boundary (start, recorded, replayed,
failed, invalidated, store changed) sets a "reload" flag. Either way it asks
for a flush, which runs on a timer thread at most once every ``interval``
seconds: a flush re-reads the store only if a boundary asked for it, then
pushes changed widget values (with ``hold_sync``). A loop of thousands of
sub-steps therefore costs a counter increment each and a few widget messages
a second, and the store is never read per sub-step. The flush runs off the
kernel's main thread so the counter moves while the cell is still running
(ipykernel sends widget messages from any thread).

Saves. What a step will do depends on the saved notebook (its code as
saved), so the panel follows the file: once a second a watcher thread
stats the notebook (one ``os.stat``, no read, no widget message), and when
its modification time or size moved, it asks for a reload as a step
boundary does. The same look reads the run's ``changed`` mark (one small
key), which every clear, pin and unpin rewrites, so another process's
``nbdurable clear`` or ``nbdurable pin`` shows within a second too. So
saving an edited ``%%step`` cell shows that step as going to run (``its
code changed``) and its dependants as *may run*, without running any cell,
in any frontend that writes the file (JupyterLab, Notebook 7, VS Code, an
editor). Unsaved edits are not in
the file; the cell marks show those (the frontend knows them).

Where widgets cannot render (plain IPython, nbconvert), the widget's
``text/plain`` is the run header and :func:`nbdurable.status.format_table`;
:meth:`StepPanel.show` (``%step panel``) keeps the saved copy of it current.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from .. import commands, config, events, status
from ..durable.session import Session, get_session
from ..errors import NbdurableError
from ..status import StepInfo
from ..store import RUN_SCOPE, RunKeys, RunView
from .rows import _BUTTON, _GREY, _GROUP, STATE_HELP, StepRow, _attr, _e, row_html

__all__ = ["DEFAULT_INTERVAL", "STATE_HELP", "StepPanel", "StepRow", "panel", "row_html"]

#: Seconds between two flushes of the panel at most (live updates are batched).
DEFAULT_INTERVAL = 0.25

#: Seconds between two looks at the notebook file's modification time (see the docstring).
DEFAULT_WATCH = 1.0

_BOUNDARY = {
    "step-start",
    "step-replayed",
    "step-recorded",
    "step-failed",
    "step-invalidated",
    "store-changed",
    "run-changed",
}


def panel() -> StepPanel:
    """The step panel of this kernel's run, refreshed.

    There is one live panel per session: showing it again (``%step panel``
    twice) shows the same, live widget rather than adding another listener.
    """
    global _panel
    session = get_session()
    with _panel_lock:
        current = _panel
        if current is not None and current.session is session and not current.closed:
            current.refresh()
            return current
        if current is not None:
            current.close()
        _panel = StepPanel(session)
        return _panel


class StepPanel(widgets.VBox):
    """A live table of the run's steps with Clear / Pin buttons; see the module docstring."""

    #: Not the user's state: its watcher redraws it while a step runs, which must not
    #: count as the step changing it (see nbdurable.durable.changes).
    nbdurable_view = True

    def __init__(
        self,
        session: Session | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        watch: float = DEFAULT_WATCH,
    ) -> None:
        self.session = session if session is not None else get_session()
        self.interval = interval
        self.watch = watch
        self.closed = False
        #: Flushes done so far (batching is tested on it).
        self.flushes = 0
        #: Looks at the notebook file so far (the watcher is tested on it).
        self.looks = 0
        self.infos: list[StepInfo] = []
        self.rows: dict[str, StepRow] = {}
        self._run_id = ""
        self._parent: tuple[str, str | None] = ("", None)  # (run id, the run it forks)
        # Pending changes, written by the event listener (guarded by _lock,
        # held only for a few dictionary operations).
        self._lock = threading.Lock()
        self._reload = True
        # Sub-steps recorded since the last reload, by id: the reload reads the
        # store while the step goes on recording, so one sub-step can be both in
        # what the reload read and in an event that arrives after it. Counting
        # ids, never events, is what keeps it from being counted twice.
        self._new: dict[str, set[str]] = {}
        self._stored: dict[str, set[str]] = {}  # sub-step ids the last reload read, live steps
        self._replayed: Counter[str] = Counter()  # sub-steps replayed by the running step
        self._dirty: set[str] = set()
        self._labels: dict[str, str] = {}
        self._timer: threading.Timer | None = None
        self._last_flush = 0.0
        # Widget changes: one flush or one button action at a time.
        self._ui_lock = threading.RLock()
        self._confirm_action: Callable[[], None] | None = None
        self._confirm_host: StepRow | None = None
        # Where show() displayed the panel, and the text last saved there.
        self._displays: list[str] = []
        self._saved_text = ""
        self._watching: Any = None  # the shell whose post_run_cell we listen to

        # Toolbar, confirm box and rows wrap: below ~22em of text beside them the
        # buttons go on a line of their own rather than over the text.
        self.header = widgets.HTML(layout=widgets.Layout(flex="1 1 22em", min_width="0"))
        self.refresh_button = widgets.Button(
            description="Refresh",
            icon="refresh",
            tooltip="Re-read the store and the notebook",
            layout=widgets.Layout(width="7.5em", min_width="7.5em"),
        )
        self.clear_all_button = widgets.Button(
            description="Clear all…",
            icon="trash",
            tooltip="Forget every record of this run",
            layout=widgets.Layout(width="8em", min_width="8em", margin="0 0 0 4px"),
        )
        self.compare_button = widgets.Button(
            description="Compare…",
            icon="columns",
            tooltip="Compare this run with another run of the store, step by step",
            layout=widgets.Layout(width="8.5em", min_width="8.5em", margin="0 0 0 4px"),
        )
        self.compare: Any = None  # the open CompareView (see compareview.py), else None
        self._compare_slot = widgets.VBox()
        self.confirm_text = widgets.HTML(layout=widgets.Layout(flex="1 1 16em", min_width="0"))
        self.confirm_button = widgets.Button(
            description="Confirm", button_style="danger", layout=_BUTTON
        )
        self.cancel_button = widgets.Button(description="Cancel", layout=_BUTTON)
        self.confirm_box = widgets.HBox(
            [self.confirm_text, self.cancel_button, self.confirm_button],
            layout=widgets.Layout(
                align_items="center", flex_flow="row wrap", padding="2px 0 4px 2em"
            ),
        )
        self.confirm_box.add_class("nbd-confirm")
        self._confirm_slot = widgets.VBox()
        self.rows_box = widgets.VBox()
        self.message = widgets.HTML()
        toolbar = widgets.HBox(
            [self.header, self.refresh_button, self.compare_button, self.clear_all_button],
            layout=widgets.Layout(align_items="flex-start", flex_flow="row wrap"),
        )
        self.compare_button.on_click(lambda _b: self.toggle_compare())
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.clear_all_button.on_click(lambda _b: self._ask_clear_all())
        self.confirm_button.on_click(lambda _b: self._confirmed())
        self.cancel_button.on_click(lambda _b: self._hide_confirm())
        super().__init__(
            [toolbar, self._compare_slot, self._confirm_slot, self.rows_box, self.message],
            layout=widgets.Layout(
                border="1px solid var(--jp-border-color2, #e0e0e0)",
                padding="6px 8px",
            ),
        )
        self.add_class("nbd-panel")
        self._unsubscribe = events.subscribe(self._on_event)
        # Stamped before the first read: a save made while it reads is seen as a change.
        self._file_stamp = self._notebook_stamp()
        self._changed_stamp: bytes | None = None
        self._changed_stamp = self._store_stamp()
        self._stop = threading.Event()
        self.refresh()
        self._watcher = threading.Thread(
            target=self._watch_notebook, name="nbdurable-panel-watch", daemon=True
        )
        self._watcher.start()

    # -- the text saved with the notebook --------------------------------------------
    def show(self) -> None:
        """Display the panel here; the text saved with the notebook then follows the run.

        The output gets a display id, and after every cell's execution, if the
        panel's text changed, the output is updated with it (``update_display``).
        So a notebook reopened where no widget can be drawn (a viewer, no
        kernel) shows where the run stood when last saved, not when the panel
        was first drawn. Only the end of a cell updates it: an update redraws
        the widget, which must not happen per step.
        """
        from IPython.display import display

        handle = display(self, display_id=True)
        if handle is None:
            return
        self._displays.append(handle.display_id)
        self._saved_text = self.text()
        shell = getattr(self.session.host, "shell", None)  # a ShellHost's
        if self._watching is None and shell is not None:
            shell.events.register("post_run_cell", self._after_cell)
            self._watching = shell

    def _after_cell(self, result: object = None) -> None:
        try:
            # A button's message ("unpinned 'plan'") is about what the panel showed
            # then; once a cell has run, it would read as news about this run.
            if self.message.value:
                self.message.value = ""
            self.refresh()
            text = self.text()
            if text == self._saved_text or self.closed:
                return
            from IPython.display import update_display

            self._saved_text = text
            for display_id in self._displays:
                update_display(self, display_id=display_id)
        except Exception as exc:  # a display must never break a run: say so in the panel
            with contextlib.suppress(Exception):
                self._say(f"the panel could not update: {exc!r}; press Refresh", error=True)

    # -- reading -----------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the store and the notebook now and redraw every row."""
        with self._lock:
            self._reload = True
        self.flush()

    def flush(self) -> None:
        """Apply pending changes to the widgets now (the timer calls this)."""
        with self._ui_lock:
            if self.closed:
                return
            with self._lock:
                self._timer = None
                # Stamped before the work: an event arriving meanwhile waits a full interval.
                self._last_flush = time.monotonic()
                reload, self._reload = self._reload, False
                dirty, self._dirty = self._dirty, set()
            if reload:
                self._set_rows(self._reread())
                dirty = set(self.rows)
            with self._lock:
                new = {key: len(ids) for key, ids in self._new.items()}
                replayed = dict(self._replayed)
            for key in dirty:
                row = self.rows.get(key)
                if row is not None:
                    row.show(new.get(key, 0), replayed.get(key, 0))
            self._show_header()
            self.flushes += 1

    def _reread(self) -> list[StepInfo]:
        """Read the store again; sub-steps of live steps are counted by id.

        For a step that is running or has sub-steps counted from events, the
        store's ids are read after the rows, and that one read is the count:
        a sub-step written while the rows were read is in it exactly once,
        and an event for an id it holds adds nothing.
        """
        infos = self._load()
        with self._lock:
            live = set(self._new)
        live |= {i.key for i in infos if i.state == "running"}
        view = RunView(self.session.store, self._run_id)
        stored = {key: view.sub_ids(key) for key in live}
        with self._lock:
            self._stored = stored
            for key, ids in stored.items():
                left = self._new.pop(key, set()) - ids
                if left:
                    self._new[key] = left
        return [
            dataclasses.replace(i, substeps=len(stored[i.key])) if i.key in stored else i
            for i in infos
        ]

    def _load(self) -> list[StepInfo]:
        s = self.session
        self._run_id = s.run_id
        live = dict(s.status)
        infos = status.step_infos(
            s.store, self._run_id, s.notebook, live, s.steps.current_inputs, s.steps.brief_now
        )
        # A step now running in a cell not yet saved to the notebook has no
        # record or state yet, so the store does not know it: show it anyway.
        known = {i.key for i in infos}
        for key, (state, detail) in live.items():
            if key not in known and state in ("running", "failed"):
                subs, size = RunView(s.store, self._run_id).sub_stats(key)
                infos.append(
                    StepInfo(
                        key,
                        self._labels.get(key, key),
                        state,
                        detail,
                        substeps=subs,
                        size=size,
                        calls=subs,
                    )
                )
        return infos

    def _set_rows(self, infos: list[StepInfo]) -> None:
        self.infos = infos
        rows: dict[str, StepRow] = {}
        for info in infos:
            row = self.rows.get(info.key) or StepRow(self, info)
            row.info = info
            rows[info.key] = row
        for key, row in self.rows.items():
            if key not in rows:
                if self._confirm_host is row:
                    self._hide_confirm()
                row.close()
        self.rows = rows
        boxes = tuple(r.box for r in rows.values())
        if boxes != self.rows_box.children:
            self.rows_box.children = boxes

    def _summary(self) -> tuple[str, str]:
        """``("5 recorded · 1 pending · 1 invalidated", "replay saved 3.2 s and 61 calls ...")``."""
        counts = Counter(_GROUP.get(i.state, i.state) for i in self.infos if i.key != RUN_SCOPE)
        totals = [f"{counts.get(g, 0)} {g}" for g in ("recorded", "pending", "invalidated")]
        totals += [
            f"{counts[g]} {g}"
            for g in ("running", "waiting", "may run", "failed", "orphaned")
            if counts.get(g)
        ]
        with self.session.lock:
            spared = self.session.saved.line(config.get().prices)
        return " · ".join(totals), spared

    def _forked_from(self) -> str | None:
        """The parent of the shown run, read once per run (a fork's lineage never changes)."""
        if self._parent[0] != self._run_id:
            self._parent = (self._run_id, RunView(self.session.store, self._run_id).parent())
        return self._parent[1]

    def _show_header(self) -> None:
        totals, spared = self._summary()
        parent = self._forked_from()
        forked = (
            f'<span class="nbd-parent" style="color:{_GREY}">forked from '
            f"<code>{_e(parent)}</code></span> "
            if parent
            else ""
        )
        path, nb = self.session.store.path, self.session.notebook
        grey = f"color:{_GREY}"
        lost = self.session.lost
        stopped = (
            f'<div class="nbd-lost" style="color:var(--jp-error-color1, #d32f2f)">'
            f"⚠ not recording: {_e(lost)}</div>"
            if lost
            else ""
        )
        value = (
            f'<div class="nbd-header" style="line-height:1.5">'
            f"<b>nbdurable</b> run <code>{_e(self._run_id)}</code> {forked}"
            f'<span style="{grey}" title="{_attr(str(path))}">in {_e(_place(path, nb))}</span><br>'
            f'<span class="nbd-totals">{totals}</span>'
            f' <span style="{grey}">— <span class="nbd-saved">{_e(spared)}</span></span>'
            f"{stopped}</div>"
        )
        if value != self.header.value:
            self.header.value = value

    def text(self) -> str:
        """The panel as plain text: the run, its totals, and the ``%step list`` table."""
        totals, spared = self._summary()
        table = status.format_table(self.infos) if self.infos else "no steps recorded yet"
        lost = f"not recording: {self.session.lost}\n" if self.session.lost else ""
        parent = self._forked_from()
        forked = f" (forked from {parent!r})" if parent else ""
        return (
            f"nbdurable run {self._run_id!r}{forked} in {self.session.store.path}\n"
            f"{totals} — {spared}\n{lost}{table}"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/plain"] = self.text()
        return data

    # -- events (the hot path: memory only) -----------------------------------------
    def _on_event(self, event: events.Event) -> None:
        if self.closed:
            return
        kind, key = event.kind, event.step
        if kind != "run-changed" and event.run != self._run_id:
            return
        with self._lock:
            if kind == "sub-recorded" and key is not None:
                sub_id = str(event.data.get("id"))
                if sub_id in self._stored.get(key, ()):
                    return  # the last reload read it from the store already
                self._new.setdefault(key, set()).add(sub_id)
                self._dirty.add(key)
            elif kind == "sub-replayed" and key is not None:
                self._replayed[key] += 1
                self._dirty.add(key)
            elif kind in _BOUNDARY:
                if kind == "step-start" and key is not None:
                    self._replayed.pop(key, None)
                label = event.data.get("label")
                if key is not None and isinstance(label, str):
                    self._labels[key] = label
                self._reload = True
            else:
                return
            if self._timer is not None:
                return
            delay = max(0.0, self._last_flush + self.interval - time.monotonic())
            self._timer = threading.Timer(delay, self._timed_flush)
            self._timer.daemon = True
            self._timer.start()

    # -- the notebook file (a save shows without running a cell) -------------------
    def _notebook_stamp(self) -> tuple[str, int, int] | None:
        """The notebook's path, modification time and size; None if there is none to read."""
        path = self.session.notebook
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (str(path), st.st_mtime_ns, st.st_size)

    def _store_stamp(self) -> bytes | None:
        """The run's ``changed`` mark as stored (one key read; see ``RunKeys.changed``)."""
        s = self.session
        try:
            return s.store.read(RunKeys(s.run_id).changed)
        except Exception:  # a store that cannot be read now: the next look tries again
            return self._changed_stamp

    def _watch_notebook(self) -> None:
        """Every ``watch`` seconds until closed: a reload when the notebook file moved, or
        a command changed the run (another process's ``nbdurable clear``, a CLI pin).
        """
        while not self._stop.wait(self.watch):
            stamp, changed = self._notebook_stamp(), self._store_stamp()
            self.looks += 1
            if stamp == self._file_stamp and changed == self._changed_stamp:
                continue
            self._file_stamp, self._changed_stamp = stamp, changed
            with self._lock:
                self._reload = True
            self._timed_flush()

    def _timed_flush(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # a display must never break a run: say so in the panel
            with self._lock:
                self._timer = None
            with contextlib.suppress(Exception):
                self._say(f"the panel could not update: {exc!r}; press Refresh", error=True)

    # -- actions (the same commands as %step clear / pin / unpin) ---------------------
    def clear_step(self, key: str) -> None:
        """Clear one step, as ``%step clear`` does; dependants are marked stale."""
        s = self.session
        self._act(lambda: commands.clear_steps(s.store, s.run_id, [key], s.notebook))

    def set_pin(self, key: str, pinned: bool) -> None:
        """Pin or unpin one step, as ``%step pin`` / ``%step unpin`` do."""
        s = self.session
        self._act(lambda: commands.pin_steps(s.store, s.run_id, [key], s.notebook, pinned))

    def clear_all(self) -> None:
        """Clear the whole run, pins included, as ``%step clear --all`` does."""
        s = self.session
        self._act(lambda: commands.clear_run(s.store, s.run_id))

    def _act(self, command: Callable[[], commands.Done]) -> None:
        with self._ui_lock:
            try:
                done = command()
            except NbdurableError as exc:
                self._say(str(exc), error=True)
                return
            self.session.changed(done)
            self._say(done.message)
            self.refresh()

    def _ask_clear(self, row: StepRow) -> None:
        info = row.info
        if info.substeps == 0:
            self.clear_step(info.key)
            return
        n = info.substeps
        self._ask(
            f"Clear <b>{_e(info.label)}</b> and its {n} recorded sub-step{'s' if n != 1 else ''}? "
            "They will be called again on the next run.",
            lambda: self.clear_step(info.key),
            row,
        )

    def _ask_clear_all(self) -> None:
        n = sum(1 for i in self.infos if i.recorded_at is not None or i.substeps)
        self._ask(
            f"Clear every record of run <b>{_e(self._run_id)}</b> "
            f"({n} step{'' if n == 1 else 's'} with records, "
            "pins included)? Everything will run again.",
            self.clear_all,
            None,
        )

    def _ask(self, question: str, action: Callable[[], None], row: StepRow | None) -> None:
        with self._ui_lock:
            self._hide_confirm()
            self.confirm_text.value = f'<span class="nbd-question">{question}</span>'
            self._confirm_action = action
            self._confirm_host = row
            if row is None:
                self._confirm_slot.children = (self.confirm_box,)
            else:
                row.box.children = (row.line, self.confirm_box)

    def _confirmed(self) -> None:
        action = self._confirm_action
        self._hide_confirm()
        if action is not None:
            action()

    def _hide_confirm(self) -> None:
        with self._ui_lock:
            host, self._confirm_host, self._confirm_action = self._confirm_host, None, None
            if host is not None:
                host.box.children = (host.line,)
            if self._confirm_slot.children:
                self._confirm_slot.children = ()

    def toggle_compare(self) -> None:
        """Open the compare view under the header (reading the store's runs), or close it."""
        from .compareview import CompareView

        with self._ui_lock:
            if self.compare is not None:
                self.compare.close()
                self.compare = None
                self._compare_slot.children = ()
                self.compare_button.description = "Compare…"
                return
            self.compare = CompareView(self.session, self._run_id)
            self._compare_slot.children = (self.compare,)
            self.compare_button.description = "Close compare"

    def _say(self, text: str, error: bool = False) -> None:
        colour = "var(--jp-error-color1, #d32f2f)" if error else _GREY
        self.message.value = (
            f'<div class="nbd-message" style="color:{colour};font-size:smaller">{_e(text)}</div>'
        )

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop listening to the engine and close every widget of the panel."""
        with self._ui_lock:  # not in the middle of a flush
            if self.closed:
                return
            self.closed = True
        self._stop.set()
        self._unsubscribe()
        if self._watching is not None:
            with contextlib.suppress(ValueError):
                self._watching.events.unregister("post_run_cell", self._after_cell)
            self._watching = None
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        for row in self.rows.values():
            row.close()
        if self.compare is not None:
            self.compare.close()
        for w in (
            self.header,
            self.refresh_button,
            self.compare_button,
            self._compare_slot,
            self.clear_all_button,
            self.confirm_text,
            self.confirm_button,
            self.cancel_button,
            self.confirm_box,
            self._confirm_slot,
            self.rows_box,
            self.message,
        ):
            w.close()
        super().close()


def _place(path: Path | str, notebook: Path | None) -> str:
    """A short form of a store path: beside the notebook, under home, else in full.

    A team store's path is its URL (without password), shown as it is.
    """
    if not isinstance(path, Path):
        return path
    for base, prefix in ((notebook.parent if notebook else None, ""), (Path.home(), "~/")):
        if base is not None and path.is_relative_to(base):
            return f"{prefix}{path.relative_to(base).as_posix()}/"
    return str(path)


_panel: StepPanel | None = None
_panel_lock = threading.Lock()
