"""Tests for nbdurable.ipython.panel: the widget's rows, buttons, live updates and batching.

The in-process tests drive a real Session on a plain InteractiveShell with a
real Store in tmp_path (no kernel: widgets get ipywidgets' dummy comm); the
last test checks ``%step panel`` in a real kernel.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from pathlib import Path

import ipywidgets
import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell
from kernel_util import (
    REPO_ROOT,
    kernel_name,
    make_notebook,
    outputs_of,
    private_sockets,
    run_notebook,
)

import nbdurable
from nbdurable import cli, commands, events, status
from nbdurable.durable import session as engine
from nbdurable.errors import NbdurableWarning
from nbdurable.identity import locate
from nbdurable.ipython.host import session_for
from nbdurable.ipython.panel import STATE_HELP, StepPanel, row_html
from nbdurable.store import RUN_SCOPE, RunKeys, open_store

RUN = "panel-test"

# name -> body as first run; CHANGED_LATER bodies are then edited in the notebook.
STEPS = {
    "plan": "plan = [1, 2, 3]",
    "research": "findings = [step(f'q:{i}', str, i) for i in plan]",
    "frozen": "kept = 'pinned, unchanged'",
    "pinned": "stale_pin = 1",
    "changed": "x = 1",
    "broken": "raise ValueError('boom')",
    "handle": "import threading\nlock = threading.Lock()",
    "later": "y = 1",
}
CHANGED_LATER = {"pinned": "stale_pin = 2", "changed": "x = 2"}


def confirming(p: StepPanel) -> bool:
    """True while a Clear / Clear all waits for Confirm or Cancel."""
    return p._confirm_action is not None


def write_notebook(path, bodies):
    nb = make_notebook(["%load_ext nbdurable"] + [f"%%step {n}\n{b}" for n, b in bodies.items()])
    nbformat.write(nb, path)


@pytest.fixture
def session(tmp_path):
    shell = InteractiveShell.instance()
    shell.user_ns["step"] = nbdurable.step
    engine.reset_session()
    s = session_for(shell)
    s.set_store(open_store(tmp_path / "store"), RUN)
    s.notebook = tmp_path / "nb.ipynb"
    s.nbfile = locate.NotebookFile(s.notebook)
    yield s
    engine.reset_session()


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres)])
def every_state(session, request):
    """A run with a step in every state (running is tested live, below), on either engine.

    On ``postgres`` the same panel works on the team store (a namespace of the
    shared test server), unchanged.
    """
    if request.param == "postgres":
        session.store.close()
        session.set_store(open_store(request.getfixturevalue("pg_url")), RUN)
    write_notebook(session.notebook, STEPS)
    for name in ("plan", "research", "frozen", "pinned", "changed"):
        session.steps.run_step(STEPS[name], name=name)
    with pytest.raises(ValueError, match="boom"):
        session.steps.run_step(STEPS["broken"], name="broken")
    with pytest.warns(NbdurableWarning, match="cannot be saved"):
        session.steps.run_step(STEPS["handle"], name="handle")
    session.steps.run_step("gone = 0", name="gone")  # later deleted from the notebook
    session.status.pop("name:gone")  # ... and this is a new kernel as far as it knows
    session.steps.run_step(STEPS["plan"], name="plan")  # replayed
    for name in ("frozen", "pinned"):
        commands.set_pin(session.store, RUN, f"name:{name}", True)
    write_notebook(session.notebook, {**STEPS, **CHANGED_LATER})
    return session


def states(p):
    return {row.info.label: row.state for row in p.rows.values()}


def test_rows_show_every_state_in_notebook_order(every_state):
    p = StepPanel(every_state)
    try:
        assert states(p) == {
            "plan": "replayed",
            "research": "recorded",
            "frozen": "pinned",
            "pinned": "pinned-stale",
            "changed": "invalidated",
            "broken": "failed",
            "handle": "not replayable",
            "later": "pending",
            "gone": "orphaned",
        }, states(p)
        assert [r.info.label for r in p.rows.values()][:8] == list(STEPS)
        rows = {r.info.label: r for r in p.rows.values()}
        # Every state is a colour *and* a text label, and the DOM says which.
        for label, row in rows.items():
            assert f'data-state="{row.state}"' in row.html.value, label
            assert "nbd-state-" + row.state.replace(" ", "-") in row.box._dom_classes
        assert "pinned · stale" in rows["pinned"].html.value
        assert "its code changed" in rows["changed"].html.value  # the reason, in a detail line
        assert "ValueError: boom" in rows["broken"].html.value
        assert "body reruns" in rows["handle"].html.value
        assert "3 of 3 sub-steps" in rows["research"].html.value
        assert (
            "replay saves" in rows["research"].html.value
            and "3 calls" in rows["research"].html.value
        )
        assert "saved" in rows["plan"].html.value
        # Pin needs a record; the run-wide row has nothing to pin.
        assert rows["later"].pin_button.disabled
        assert rows["frozen"].pin_button.description == "Unpin"
        assert rows["research"].pin_button.description == "Pin"
        assert rows["later"].clear_button.disabled
        assert "(outside steps)" not in rows  # step() outside a step: none here
        header = p.header.value
        assert RUN in header and str(every_state.store.path) in header
        # recorded: plan research frozen pinned handle; pending: later; invalidated: changed
        assert "5 recorded · 1 pending · 1 invalidated · 1 failed · 1 orphaned" in header
        assert "replay saved" in header and "(1 step)" in header
    finally:
        p.close()


def test_text_fallback_is_the_list_table(every_state):
    p = StepPanel(every_state)
    try:
        bundle = p._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        text = bundle["text/plain"]
        assert status.format_table(p.infos) in text
        assert text.startswith(f"nbdurable run {RUN!r}")
        assert "invalidated" in text and "orphaned" in text
        # What plain IPython (and nbconvert) shows: the text, not a widget repr.
        formatted, _ = InteractiveShell.instance().display_formatter.format(p)
        assert formatted["text/plain"] == text
    finally:
        p.close()


def test_buttons_change_the_store_and_the_rows(every_state):
    s = every_state
    rk = RunKeys(RUN)
    p = StepPanel(s)
    try:
        rows = {r.info.label: r for r in p.rows.values()}
        # Pin / Unpin
        rows["research"].pin_button.click()
        assert status.step_infos(s.store, RUN, s.notebook)[1].pinned
        assert (
            rows["research"].state == "pinned"
            and rows["research"].pin_button.description == "Unpin"
        )
        rows["research"].pin_button.click()
        assert not status.step_infos(s.store, RUN, s.notebook)[1].pinned
        assert rows["research"].state == "recorded"

        # Clear a step with sub-steps: asks first; Cancel keeps everything.
        rows["research"].clear_button.click()
        assert confirming(p) and p.confirm_box in rows["research"].box.children
        assert "3 recorded sub-steps" in p.confirm_text.value
        assert s.store.has(rk.step("name:research"))
        p.cancel_button.click()
        assert not confirming(p) and p.confirm_box not in rows["research"].box.children
        rows["research"].clear_button.click()
        p.confirm_button.click()
        assert not s.store.has(rk.step("name:research"))
        assert s.store.scan(rk.subs_prefix("name:research")) == []
        assert rows["research"].state == "pending"
        assert "cleared: research" in p.message.value

        # Clear a step without sub-steps: no question; its dependants go stale.
        rows["plan"].clear_button.click()
        assert not confirming(p) and not s.store.has(rk.step("name:plan"))
        assert rows["plan"].state == "pending"

        # Clear all: asks, then the run is empty and every row pending.
        p.clear_all_button.click()
        assert confirming(p) and p.confirm_box in p._confirm_slot.children
        p.confirm_button.click()
        # what was recorded is gone; the lease stays, so this kernel goes on recording (and
        # the manifest, which refuses what was cleared)
        assert sorted(s.store.scan(rk.base)) == sorted([rk.lease, rk.changed, rk.manifest])
        assert set(states(p).values()) == {"pending"}
        assert "gone" not in states(p)  # orphans go with their records
    finally:
        p.close()


def test_changes_made_elsewhere_show_on_refresh(every_state, capsys):
    s = every_state
    p = StepPanel(s)
    try:
        # The CLI pins a step: no event reaches the panel.
        argv = ["pin", str(s.notebook), "research", "--store", str(s.store.path), "--run", RUN]
        assert cli.main(argv) == 0, capsys.readouterr()
        assert p.rows["name:research"].state == "recorded"
        p.refresh_button.click()
        assert p.rows["name:research"].state == "pinned"
        # The magics emit store-changed; the panel follows without a click.
        commands.set_pin(s.store, RUN, "name:research", False)
        events.emit("store-changed", RUN, "name:research", action="unpin")
        wait_for(lambda: p.rows["name:research"].state == "recorded")
    finally:
        p.close()


def wait_for(cond, timeout=5.0, msg=lambda: ""):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met in {timeout} s {msg()}")
        time.sleep(0.01)


def test_live_updates_while_a_step_runs(session):
    """The row switches to running and its counter moves while the cell is still running."""
    session.notebook.write_text("{}")  # no cells saved yet: the row comes from events
    p = StepPanel(session, interval=0.05)
    # What probe saw: in a queue, fingerprinted by its type only, so filling it does not
    # change probe's fingerprint (a list would: the step's input 'probe' changed).
    seen_q: queue.SimpleQueue = queue.SimpleQueue()

    def row_says(text):
        row = p.rows.get("name:loop")
        return row is not None and text in row.html.value

    def probe(text):
        # Runs inside the step's body: the timer thread must update the panel meanwhile.
        # On failure, say what the panel showed: its row and its message line.
        wait_for(
            lambda: row_says(text),
            timeout=60,
            msg=lambda: (
                f"row: {getattr(getattr(p.rows.get('name:loop'), 'html', None), 'value', None)!r}; "
                f"message: {p.message.value!r}"
            ),
        )
        seen_q.put((p.rows["name:loop"].state, text))

    def seen():
        out = []
        while not seen_q.empty():
            out.append(seen_q.get())
        return out

    session.user_ns["probe"] = probe
    body = "for i in range(4):\n    step(f's:{i}', str, i)\n    probe(f'{i + 1} {WHAT}')"
    try:
        session.user_ns["WHAT"] = "sub-step"  # "1 sub-step recorded", "2 sub-steps ..."
        session.steps.run_step(body, name="loop")
        assert seen() == [("running", f"{n} sub-step") for n in range(1, 5)]
        # The row's state and its text change in one flush on the timer thread:
        # wait for the text, which is set last.
        wait_for(lambda: p.rows["name:loop"].state == "recorded", timeout=60)
        wait_for(
            lambda: row_says("4 of 4 sub-steps"),
            timeout=60,
            msg=lambda: p.rows["name:loop"].html.value,
        )
        # Run again (forced): the sub-steps replay, and the counter says so.
        session.user_ns["WHAT"] = "replayed"
        session.steps.run_step(body, name="loop", force=True)
        assert seen() == [("running", f"{n} replayed") for n in range(1, 5)]
        wait_for(lambda: p.rows["name:loop"].state == "recorded", timeout=60)
        wait_for(
            lambda: row_says("4 of 4 sub-steps") and not row_says("replayed"),
            timeout=60,
            msg=lambda: p.rows["name:loop"].html.value,
        )
    finally:
        p.close()


def test_a_reload_while_a_sub_step_is_recorded_counts_it_once(session):
    """A reload that reads a sub-step from the store before its event arrives counts it once.

    The race the full suite found: the panel reloads (a step starts, Refresh
    is pressed) while the step records; the store already holds the sub-step
    and its event comes after the reload's read. A listener subscribed before
    the panel's reloads the panel at the moment each sub-step is announced,
    so that order is forced on every sub-step, not left to timing.
    """
    session.notebook.write_text("{}")
    holder: dict = {}

    def reload_first(event):
        if event.kind == "sub-recorded" and "panel" in holder:
            holder["panel"].refresh()

    unsubscribe = events.subscribe(reload_first)
    p = StepPanel(session, interval=0.05)
    holder["panel"] = p
    shown: list[str] = []

    def probe():
        p.flush()
        shown.append(p.rows["name:two"].html.value)

    session.user_ns["probe"] = probe
    try:
        session.steps.run_step(
            "step('s:0', str, 0)\nprobe()\nstep('s:1', str, 1)\nprobe()", name="two"
        )
        assert len(shown) == 2
        assert "1 sub-step recorded" in shown[0] and "2 sub-steps" not in shown[0], shown[0]
        assert "2 sub-steps recorded" in shown[1] and "3 sub-steps" not in shown[1], shown[1]
    finally:
        unsubscribe()
        p.close()


def test_a_failed_step_shows_failed_live(session):
    session.notebook.write_text("{}")
    p = StepPanel(session, interval=0.02)
    try:
        with pytest.raises(ZeroDivisionError):
            session.steps.run_step("1 / 0", name="oops")
        wait_for(lambda: "name:oops" in p.rows and p.rows["name:oops"].state == "failed")
        # the row's state is set before its text is drawn (the watcher's thread): wait
        wait_for(
            lambda: "ZeroDivisionError" in p.rows["name:oops"].html.value,
            msg=lambda: p.rows["name:oops"].html.value,
        )
    finally:
        p.close()


def test_thousands_of_substeps_are_batched(session, monkeypatch):
    """A loop of 3000 real sub-steps: a handful of flushes, and no store reads per sub-step."""
    session.notebook.write_text("{}")
    p = StepPanel(session, interval=0.2)
    loads, sent = [], []
    # Queues, fingerprinted by type only: filling them leaves the step's input 'middle' as it was.
    changes: queue.SimpleQueue = queue.SimpleQueue()
    mid: queue.SimpleQueue = queue.SimpleQueue()
    real_load = p._load
    monkeypatch.setattr(p, "_load", lambda: loads.append(1) or real_load())
    real_send = ipywidgets.Widget._send
    monkeypatch.setattr(
        ipywidgets.Widget,
        "_send",
        lambda self, msg, buffers=None: sent.append(msg) or real_send(self, msg, buffers),
    )
    n = 3000

    def middle():
        # Halfway through the loop, wait (with a deadline) for the panel's timer
        # to show the row live; sampling at a fixed iteration raced the first
        # flush on a fast machine.
        def live():
            row = p.rows.get("name:big")
            return row is not None and "running" in row.html.value

        wait_for(live, timeout=30, msg=lambda: repr(p.rows.get("name:big")))
        row = p.rows["name:big"]
        mid.put(row.html.value)
        row.html.observe(lambda ch: changes.put(ch["new"]), "value")

    session.user_ns["middle"] = middle
    t0 = time.monotonic()
    try:
        session.steps.run_step(
            f"for i in range({n}):\n    step(f's:{{i}}', str, i)\n    if i == {n // 2}: middle()",
            name="big",
        )
        wait_for(lambda: p.rows["name:big"].state == "recorded")
        elapsed = time.monotonic() - t0
        assert f"{n} of {n} sub-steps" in p.rows["name:big"].html.value
        first = mid.get_nowait()
        assert "running" in first and " recorded" in first  # live mid-loop
        # Flushes are throttled to one per interval (plus the leading and trailing
        # ones), and the store is read at step boundaries only, never per sub-step.
        bound = elapsed / p.interval + 3
        assert p.flushes <= bound, (p.flushes, elapsed)
        assert changes.qsize() <= bound, (changes.qsize(), elapsed)
        assert len(sent) <= 6 * bound, (len(sent), elapsed)
        assert len(loads) <= 3, len(loads)
    finally:
        p.close()


def test_the_event_listener_is_cheap(session, monkeypatch):
    """20,000 sub-step events read nothing from the store; flushes stay one per interval.

    What an event costs in time is a figure, printed here (``-s``), not asserted:
    the work per event is a set insertion under a lock, and what must hold on any
    machine is that the store is never read and the widgets are not redrawn per event.
    """
    session.notebook.write_text("{}")
    p = StepPanel(session, interval=0.2)
    p.flush()
    reads = []
    store = session.store
    for name in ("get", "scan", "stats"):
        real = getattr(store, name)
        monkeypatch.setattr(
            store,
            name,
            lambda *a, _real=real, _name=name, **k: reads.append(_name) or _real(*a, **k),
        )
    try:
        n = 20000
        flushes = p.flushes
        t0 = time.perf_counter()
        for i in range(n):
            events.emit("sub-recorded", RUN, "name:big", id=f"s:{i}", duration=0.0)
        elapsed = time.perf_counter() - t0
        print(f"{elapsed / n * 1e6:.1f} µs per sub-step event")
        assert reads == [], reads[:5]
        assert p.flushes - flushes <= elapsed / p.interval + 3, (p.flushes - flushes, elapsed)
    finally:
        p.close()


def test_panel_function_returns_one_live_panel(session):
    session.notebook.write_text("{}")
    first = nbdurable.panel()
    try:
        assert isinstance(first, StepPanel)
        assert nbdurable.panel() is first  # shown twice: one listener, two views
        first.close()
        second = nbdurable.panel()
        assert second is not first and not second.closed
        second.close()
    finally:
        first.close()


def test_closed_panel_stops_listening(session):
    session.notebook.write_text("{}")
    p = StepPanel(session, interval=0.01)
    p.close()
    before = p.flushes
    events.emit("step-start", RUN, "name:x", label="x")
    time.sleep(0.05)
    assert p.flushes == before


def test_outside_steps_row_and_badge_text():
    info = status.StepInfo(RUN_SCOPE, "(outside steps)", "recorded", substeps=4, calls=4, size=2048)
    html = row_html(info)
    assert "4 sub-steps recorded" in html and "2.0 KB" in html and "✓ recorded" in html


# -- a real kernel ----------------------------------------------------------------------


@pytest.mark.kernel
def test_step_panel_magic_in_a_real_kernel(tmp_path):
    nb = make_notebook(
        [
            "%load_ext nbdurable",
            "%%step greet\nword = 'hi'",
            "%step panel",
            "import nbdurable\nnbdurable.panel() is nbdurable.panel()",
        ]
    )
    env = {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb"),
    }
    nbformat.write(nb, tmp_path / "nb.ipynb")
    out = run_notebook(nb, cwd=tmp_path, env=env)
    shown = outputs_of(out, 2)
    assert [o["output_type"] for o in shown] == ["display_data"], shown
    data = shown[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in data
    text = data["text/plain"]
    lines = text.splitlines()
    assert lines[0] == f"nbdurable run 'nb.ipynb' in {tmp_path / 'store'}"
    assert (
        lines[1] == "1 recorded · 0 pending · 0 invalidated — nothing replayed in this kernel yet"
    )
    assert lines[2].split() == [
        "#",
        "step",
        "state",
        "recorded",
        "version",
        "sub-steps",
        "size",
        "detail",
    ]
    assert lines[3].split()[:3] == ["2", "greet", "recorded"]
    assert outputs_of(out, 3)[0]["data"]["text/plain"] == "True"


def test_a_step_run_here_but_not_saved_yet_is_not_orphaned(session):
    write_notebook(session.notebook, {"plan": STEPS["plan"]})
    session.steps.run_step("fresh = 1", name="fresh")  # a new cell JupyterLab has not saved yet
    p = StepPanel(session)
    try:
        assert states(p) == {"plan": "pending", "fresh": "recorded"}
        session.status.clear()  # a new kernel: now it is only in the store
        p.refresh()
        assert states(p) == {"plan": "pending", "fresh": "orphaned"}
    finally:
        p.close()


def test_the_views_page_explains_every_state():
    page = (REPO_ROOT / "docs" / "views.md").read_text(encoding="utf-8")
    section = page[page.index("## The step panel") :]
    assert "](panel.png)" in section
    for state, help_line in STATE_HELP.items():  # one line per state, as the panel's tooltips
        assert f"**{state}** — {help_line}\n" in section, state


def test_time_saved_is_claimed_only_when_the_record_took_time():
    # A record made while its 10 calls replayed (after a Clear of the step) took ~0 s.
    quick = status.StepInfo(
        "name:a", "a", "recorded", recorded_at=time.time(), duration=0.01, substeps=10, calls=10
    )
    assert "replay saves 10 calls" in row_html(quick), row_html(quick)
    assert "0.0" not in row_html(quick)
    slow = dataclasses.replace(quick, duration=12.0)
    assert "replay saves 12.0 s, 10 calls" in row_html(slow), row_html(slow)
    no_calls = dataclasses.replace(quick, calls=0, substeps=0)
    assert "replay saves 0.01 s" in row_html(no_calls), row_html(no_calls)


def test_a_buttons_message_goes_when_a_cell_runs(every_state):
    p = StepPanel(every_state)
    try:
        p.show()  # the panel follows the cells run after it
        rows = {r.info.label: r for r in p.rows.values()}
        rows["research"].pin_button.click()
        assert "pinned: research" in p.message.value, p.message.value
        every_state.host.shell.run_cell("1 + 1")
        assert p.message.value == ""
        assert rows["research"].state == "pinned"  # the action itself stays
    finally:
        p.close()


def test_a_save_shows_without_running_a_cell(every_state):
    """The notebook saved with an edited step: the panel shows it will run, its dependant may."""
    p = StepPanel(every_state, watch=0.05)
    try:
        assert states(p)["plan"] == "replayed" and states(p)["research"] == "recorded"
        # Nothing changes: the watcher only stats the file, the panel is not redrawn.
        flushes, looks = p.flushes, p.looks
        wait_for(lambda: p.looks >= looks + 3, msg=lambda: f"{p.looks} looks")
        assert p.flushes == flushes
        count = every_state.host.shell.execution_count
        write_notebook(every_state.notebook, {**STEPS, **CHANGED_LATER, "plan": "plan = [1, 2]"})
        # The watcher's thread redraws row by row (the info, then the row's HTML,
        # then the header): waited for to the last of them, the header.
        wait_for(
            lambda: states(p)["plan"] == "invalidated" and "1 may run" in p.header.value,
            msg=lambda: f"rows: {states(p)}, header: {p.header.value}",
        )
        rows = {r.info.label: r.info for r in p.rows.values()}
        assert rows["plan"].detail == "its code changed"
        assert rows["research"].state == "may run", rows["research"]
        assert rows["research"].detail == (
            "step 'plan' runs first: replays only if 'plan' comes out the same"
        )
        assert 'data-state="may run"' in p.rows["name:research"].html.value
        assert "1 may run" in p.header.value, p.header.value
        assert every_state.host.shell.execution_count == count  # no cell ran
    finally:
        p.close()
    p._watcher.join(5)  # closing stops the watcher
    assert not p._watcher.is_alive()


def test_a_kernel_that_lost_its_lease_says_so_in_the_panel_header(session):
    """Another kernel took the run over: the step is refused in one line, and the panel's
    header says this kernel stopped recording and what brings it back, until it does."""
    from nbdurable.durable import lease
    from nbdurable.errors import LeaseHeld

    write_notebook(session.notebook, {"a": "a = 1", "b": "b = 2"})
    p = StepPanel(session, interval=0.05)
    other = lease.Lease(session.store, RUN, "another kernel")
    try:
        session.steps.run_step("a = 1", name="a")
        assert "not recording" not in p.header.value
        other.acquire(takeover=True)
        with pytest.raises(LeaseHeld, match="taken over"):
            session.steps.run_step("b = 2", name="b")
        wait_for(lambda: "not recording" in p.header.value, msg=lambda: p.header.value)
        assert "Run `%step takeover` to take it back" in p.header.value
        assert "not recording: run" in p.text()
        commands.take_over(session)  # `%step takeover`
        wait_for(lambda: "not recording" not in p.header.value, msg=lambda: p.header.value)
        session.steps.run_step("b = 2", name="b")  # records again
        wait_for(lambda: states(p).get("b") == "recorded", msg=lambda: states(p))
    finally:
        other._stop.set()
        p.close()


def test_another_process_pin_and_clear_show_by_themselves(every_state, request):
    """The CLI, on its own handle to the store, pins and clears: no event reaches this
    kernel, yet the panel shows each change (it reads the run's change mark)."""
    p = StepPanel(every_state, watch=0.05)
    path = every_state.store.path
    other = path if isinstance(path, Path) else request.getfixturevalue("pg_url")
    try:
        assert states(p)["research"] == "recorded"
        flushes = p.flushes
        with open_store(other) as store:  # as `nbdurable pin` opens it
            commands.set_pin(store, RUN, "name:research", True)
        wait_for(lambda: states(p)["research"] == "pinned", msg=lambda: states(p))
        # the rows change before the watcher counts its flush: wait for it, not assert
        wait_for(lambda: p.flushes > flushes, msg=lambda: f"{p.flushes} flushes")
        with open_store(other) as store:
            commands.clear(store, RUN, ["name:research"])
        wait_for(lambda: states(p)["research"] == "pending", msg=lambda: states(p))
        # Nothing changes: the mark is read, the panel is not redrawn.
        flushes, looks = p.flushes, p.looks
        wait_for(lambda: p.looks >= looks + 3, msg=lambda: f"{p.looks} looks")
        assert p.flushes == flushes
    finally:
        p.close()


@pytest.mark.kernel
def test_a_save_refreshes_the_panel_in_a_real_kernel(tmp_path):
    """A real kernel shows the panel; the notebook is saved with an edit; no cell runs.

    The panel's new rows reach the frontend as widget updates (``comm_msg`` on
    iopub) while the kernel is idle: no execute request is sent after the save.
    """
    import os

    from jupyter_client import KernelManager

    path = tmp_path / "nb.ipynb"
    cells = ["%load_ext nbdurable", "n = 1", "%%step up\nx = n + 1", "%%step down\ny = x * 10"]
    nbformat.write(make_notebook([*cells, "%step panel"]), path)
    env = dict(os.environ)
    env.update(NBDURABLE_DIR=str(tmp_path / "store"), NBDURABLE_NOTEBOOK=str(path))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    with private_sockets() as sockets:
        km = KernelManager(kernel_name=kernel_name(), **sockets)
        km.start_kernel(cwd=str(tmp_path), env=env)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=180)
            for code in [*cells, "%step panel"]:
                reply = kc.execute_interactive(code, timeout=120, output_hook=lambda _m: None)
                assert reply["content"]["status"] == "ok", (code, reply["content"])
            # Saved with 'up' edited, as a frontend saves it.
            edited = [*cells[:2], "%%step up\nx = n + 2", cells[3], "%step panel"]
            nbformat.write(make_notebook(edited), path)
            want = {"up": "invalidated", "down": "may run"}
            seen: dict[str, str] = {}
            executed = []
            deadline = time.monotonic() + 30
            while seen != want and time.monotonic() < deadline:
                try:
                    msg = kc.get_iopub_msg(timeout=1)
                except queue.Empty:
                    continue
                if msg["msg_type"] == "execute_input":
                    executed.append(msg["content"]["code"])
                if msg["msg_type"] != "comm_msg":
                    continue
                value = msg["content"]["data"].get("state", {}).get("value")
                for step in want:
                    marker = f'data-step="{step}" data-state="'
                    if isinstance(value, str) and marker in value:
                        seen[step] = value.split(marker, 1)[1].split('"', 1)[0]
            assert seen == want, f"widget updates after the save: {seen}"
            assert executed == [], executed
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_the_compare_view_shows_how_a_fork_differs(session):
    """Compare…: pick another run of the store, read its differences step by step."""
    write_notebook(session.notebook, {"a": "x = 1", "b": "y = x + 1"})
    session.steps.run_step("x = 1", name="a")
    session.steps.run_step("y = x + 1", name="b")
    commands.fork(session.store, RUN, "fork", session.notebook, "b")
    session.set_run("fork")
    session.user_ns["x"] = 5
    session.steps.run_step("y = x + 1", name="b")  # x changed: b differs in the fork
    session.set_run(RUN)
    p = StepPanel(session)
    try:
        p.toggle_compare()
        view = p.compare
        assert view is not None and p.compare_button.description == "Close compare"
        assert [o[1] for o in view.pick.options] == [None, "fork"]
        view.pick.value = "fork"
        assert view.lines == ["= a: same", "≠ b: differs"], view.lines
        assert "input 'x': 1 / 5" in view.result.value, view.result.value
        p.toggle_compare()
        assert p.compare is None and p._compare_slot.children == ()
    finally:
        p.close()


def test_a_step_waiting_for_an_approval_reads_as_waiting_not_failed():
    line = "approval 'send' of step 'email' waits for a decision: Send the draft to bob"
    html = row_html(status.StepInfo("name:email", "email", "waiting", line, position=1))
    assert "◷" in html and "waiting" in html and line.replace("'", "&#x27;") in html, html
    assert "✗" not in html and "failed" not in html
