"""A replayed ``%%step`` shows what a plain run of the same cells shows, in real kernels.

Each case is a ``%%step`` cell. The notebook runs three times: plain (no
nbdurable, no ``%%step`` lines), then twice with nbdurable on one store (the
first run records, the second replays). The replayed outputs must equal the
plain ones after normalizing only what a frontend would not show differently:
execution counts, and carriage returns in stream text (nbclient keeps them raw,
a frontend and nbdurable's record apply them).
"""

from __future__ import annotations

import json
import os
import re
import textwrap

import pytest
from kernel_util import make_notebook, normalize_outputs, run_notebook, stream_text

from nbdurable.ipython.capture import WIDGET_VIEW_MIME
from nbdurable.ipython.kernelio import MARKER

pytestmark = pytest.mark.kernel

BAR = 'bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt}"'  # no rates: the same in every run

SETUP = """\
import logging, os, subprocess, sys, ctypes, threading, time
from concurrent.futures import ProcessPoolExecutor
log = logging.getLogger("fidelity")
log.addHandler(logging.StreamHandler())  # holds the original sys.stderr object
log.propagate = False
def work(i):  # run by worker processes
    print(f"worker {i}", flush=True)
    return i * i
attempts = {}
def pre():
    print("pre-call")
    return 1
def flaky(where):  # fails the first time: a transient error
    n = attempts[where] = attempts.get(where, 0) + 1
    print("trying", n - 1)
    if n < 2:
        raise ConnectionError("transient")
    return "ok"
"""

#: How the notebook gets ``step``: nbdurable's in the durable runs, a plain call in the plain one.
STEP_IMPORT = {
    True: "from nbdurable import step",
    False: "def step(_id, fn, *args):\n    return fn(*args)",
}

# PLAIN_RACE: in a plain cell, ipykernel's pipe thread forwards fd output
# asynchronously; on a busy machine it can miss the end of the cell, and the
# plain run (the oracle) then lacks it, or shows it after what the cell printed
# later. The fd cases wait a moment where the order must not depend on the
# machine's load; a step records the order its own run showed, and needs no wait
# at its end (it syncs the pipe).

RETRIED = """\
    a = step("pre", pre)
    r = step("flaky", flaky, "{where}")
    print("result", r)
    """

#: name -> step body. Each runs as `%%step name` in the durable runs (`name@n`: the
#: n-th cell of step `name`), except `plain:...` cells, which run as they are.
STEPS = {
    "fig_noshow": """\
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3])
        print("drawn")
        42
        """,
    "fig_show": """\
        plt.plot([3, 1, 2])
        plt.show()
        print("after show")
        """,
    "fig_semicolon": """\
        print("before")
        plt.plot([2, 2, 1]);
        """,
    "fig_last": """\
        fig, ax = plt.subplots()
        ax.plot([1, 3])
        fig
        """,
    "fig_error": """\
        plt.plot([1, 1, 2])
        raise ValueError("after drawing")
        """,
    "logged": """\
        log.warning("careful: %d", 3)
        print("printed")
        """,
    "fd_out": """\
        print("python first")
        os.system("echo from-system")
        subprocess.run(["echo", "from-subprocess"])
        os.write(1, b"from-os-write\\n")
        libc = ctypes.CDLL(None)
        libc.printf(b"from-printf\\n")
        libc.fflush(None)
        del libc  # a CDLL cannot be saved
        time.sleep(1)  # see PLAIN_RACE
        """,
    "fd_err": """\
        os.system("echo to-fd-2 >&2");
        time.sleep(1)  # see PLAIN_RACE
        """,
    "fd_big": """\
        os.write(1, b"x" * 2999 + b"\\n");  # more than one pipe read
        time.sleep(1)  # see PLAIN_RACE
        """,
    "bar_text": f"""\
        from tqdm import tqdm as text_tqdm
        for _ in text_tqdm(range(3), {BAR}):
            pass
        """,
    "bar_auto": f"""\
        from tqdm.auto import tqdm as auto_tqdm
        for _ in auto_tqdm(range(3), {BAR}):
            pass
        """,
    "nested": """\
        get_ipython().run_cell("print(1)")
        print(2)
        """,
    "reentrant": """\
        class Loud:
            def __repr__(self):
                print("inside repr")
                return "Loud()"
        print(Loud())
        Loud()
        """,
    "capture_magic": """\
        %%capture captured
        print("hidden")
        display("hidden display")
        """,
    # (a plain cell: what the step bound, as the next cell sees it)
    "plain:captured": """\
        print(repr(captured.stdout), len(captured.outputs))
        captured.show()
        """,
    "timeit": """\
        %timeit -n1 -r2 sum(range(10))
        print("after")
        """,
    "bar_auto_leave": f"""\
        from tqdm.auto import tqdm as auto_tqdm
        for _ in auto_tqdm(range(3), {BAR}, leave=False):
            pass
        print("after the bar")
        """,
    "bar_sub": f"""\
        from tqdm.auto import tqdm as auto_tqdm
        def count_to(n):
            for _ in auto_tqdm(range(n), {BAR}):
                pass
            return n
        counted = step("count", count_to, 3)
        unsaveable = threading.Lock()  # on replay the body runs again, its sub-step replays
        """,
    "pool": """\
        with ProcessPoolExecutor(1) as pool:  # forked workers: their prints come through zmq
            squares = list(pool.map(work, range(3)))
        del pool  # cannot be saved
        print("squares", squares)
        time.sleep(1)  # see PLAIN_RACE
        """,
    "joblib": """\
        from joblib import Parallel, delayed  # loky workers: their prints come through fd 1
        cubes = Parallel(n_jobs=2)(delayed(work)(i) for i in [5])
        time.sleep(1)  # see PLAIN_RACE (the worker's line before this cell's next one)
        print("cubes", cubes)
        time.sleep(1)  # see PLAIN_RACE
        """,
    "subprocess_crlf": """\
        subprocess.run(["printf", "a\\r\\nb\\r\\n"])
        time.sleep(0.3)  # (another stream message)
        subprocess.run(["sh", "-c", "echo one; sleep 0.3; echo two"])
        time.sleep(1)  # see PLAIN_RACE
        """,
    # One step run twice, as a user runs a cell again after a transient error.
    "retried@1": RETRIED.format(where="step"),
    "retried@2": RETRIED.format(where="step"),
    # The same calls in a plain cell (recorded in the run's scope), run again.
    "plain:retried@1": RETRIED.format(where="cell"),
    "plain:retried@2": RETRIED.format(where="cell"),
    "container": """\
        import ipywidgets
        ipywidgets.HBox([ipywidgets.Label("inside")])
        """,
    "slider": """\
        slider = ipywidgets.IntSlider(value=1)
        display(slider)
        slider.value = 7
        del slider  # a live widget cannot be saved
        """,
    "ipympl": """\
        %matplotlib widget
        figure = plt.figure()
        plt.plot([1, 2]);
        """,
}
NAMES = list(STEPS)


def step_cells(durable: bool) -> list[str]:
    cells = [f"{SETUP}{STEP_IMPORT[durable]}\n"]
    for name, body in STEPS.items():
        body = textwrap.dedent(body)
        plain = not durable or name.startswith("plain:")
        cells.append(body if plain else f"%%step {name.split('@')[0]}\n{body}")
    if durable:
        cells.insert(0, "%load_ext nbdurable")
    return cells


def index(name: str, durable: bool) -> int:
    return NAMES.index(name) + (2 if durable else 1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(plain, recorded, replayed) notebooks, each run in a fresh kernel."""
    tmp = tmp_path_factory.mktemp("fidelity")
    env = {
        "NBDURABLE_DIR": str(tmp / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp / "nb.ipynb"),
        "JPY_SESSION_NAME": "",
    }
    # ipykernel does not forward fds 1/2 when it sees it runs under pytest.
    saved = os.environ.pop("PYTEST_CURRENT_TEST", None)
    try:
        # allow_errors: one failing case must not hide the others' results.
        kw = {"cwd": tmp, "env": env, "allow_errors": True}
        plain = run_notebook(make_notebook(step_cells(False)), **kw)
        recorded = run_notebook(make_notebook(step_cells(True)), **kw)
        replayed = run_notebook(make_notebook(step_cells(True)), **kw)
    finally:
        if saved is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved
    return plain, recorded, replayed


_CARRIAGE = re.compile(r".*\r(?=[^\n])")  # what nbclient's coalesce_streams applies


def shown(outputs: list[dict]) -> list[dict]:
    """Outputs as the frontend shows them, without nbdurable's "replayed" note."""
    result = []
    for out in normalize_outputs(outputs, execution_count=False):
        if (out.get("metadata") or {}).get("nbdurable", {}).get("note"):
            continue
        if out["output_type"] == "stream":
            out["text"] = _CARRIAGE.sub("", out["text"])
        result.append(out)
    return result


def cell(nb, name: str, durable: bool = True) -> list[dict]:
    return nb.cells[index(name, durable)].get("outputs", [])


def replay_matches_plain(runs, name: str) -> list[dict]:
    plain, _, replayed = runs
    notes = [o for o in cell(replayed, name) if o.get("metadata", {}).get("nbdurable")]
    assert len(notes) == 1, f"{name} did not replay: {cell(replayed, name)}"
    expected = shown(cell(plain, name, durable=False))
    assert shown(cell(replayed, name)) == expected, name
    return expected


def replayed_outputs(runs, name: str) -> list[dict]:
    """What the replayed run's cell `name` shows, checking that its step replayed."""
    _, _, replayed = runs
    notes = [o for o in cell(replayed, name) if o.get("metadata", {}).get("nbdurable")]
    assert len(notes) == 1, f"{name} did not replay: {cell(replayed, name)}"
    return shown(cell(replayed, name))


@pytest.mark.parametrize(
    "name",
    [
        *("fig_noshow", "fig_show", "fig_semicolon", "fig_last", "logged", "nested", "reentrant"),
        *("pool", "joblib", "subprocess_crlf"),
    ],
)
def test_replay_equals_plain_run(runs, name):
    expected = replay_matches_plain(runs, name)
    assert expected, f"the plain run of {name} shows something"


@pytest.mark.parametrize(
    # (widgets aside: their live views carry a fresh model id in every run;
    # a traceback names different frames; %timeit measures again)
    "name",
    [
        n
        for n in NAMES
        if n not in ("bar_auto", "bar_auto_leave", "bar_sub", "slider", "container", "ipympl")
        and n not in ("fig_error", "retried@1", "plain:retried@1", "timeit")
    ],
)
def test_the_recording_run_shows_what_a_plain_run_shows(runs, name):
    plain, recorded, _ = runs
    assert shown(cell(recorded, name)) == shown(cell(plain, name, durable=False)), name


def test_figures_drawn_without_show_come_after_the_result(runs):
    kinds = [o["output_type"] for o in replay_matches_plain(runs, "fig_noshow")]
    assert kinds == ["stream", "execute_result", "display_data"]
    (figure,) = [o for o in replay_matches_plain(runs, "fig_semicolon") if "data" in o]
    assert "image/png" in figure["data"]


def test_a_failing_step_shows_its_figure_after_the_error_as_a_plain_cell_does(runs):
    plain, recorded, replayed = runs
    expected = shown(cell(plain, "fig_error", durable=False))
    assert [o["output_type"] for o in expected] == ["error", "display_data"]
    for nb in (recorded, replayed):  # not recorded: it fails again
        got = shown(cell(nb, "fig_error"))
        assert [o["output_type"] for o in got] == ["error", "display_data"]
        assert got[0]["evalue"] == "after drawing"
        assert got[1] == expected[1]


def test_logging_through_a_handler_made_before_the_step(runs):
    expected = replay_matches_plain(runs, "logged")
    assert stream_text(expected, "stderr") == "careful: 3\n"


def test_file_descriptor_output_in_order(runs):
    expected = replay_matches_plain(runs, "fd_out")
    assert expected == [
        {
            "output_type": "stream",
            "name": "stdout",
            "text": "python first\nfrom-system\nfrom-subprocess\nfrom-os-write\nfrom-printf\n",
        }
    ]
    assert stream_text(replay_matches_plain(runs, "fd_err"), "stderr") == "to-fd-2\n"
    assert stream_text(replay_matches_plain(runs, "fd_big")) == "x" * 2999 + "\n"


def test_text_progress_bar_replays_its_final_line(runs):
    expected = replay_matches_plain(runs, "bar_text")
    assert stream_text(expected, "stderr") == "100%|" + "\u2588" * 10 + "| 3/3\n"


def widget_state(nb) -> dict:
    return nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]


def test_widget_progress_bar_replays_its_final_state(runs):
    plain, recorded, replayed = runs
    (live,) = normalize_outputs(cell(plain, "bar_auto", durable=False), execution_count=False)
    assert live["data"]["text/plain"].startswith("  0%"), "the fallback a plain run saves"
    # The bar's final state, as the plain run's widgets ended: "100%" and "3/3".
    state = widget_state(plain)
    box = state[live["data"][WIDGET_VIEW_MIME]["model_id"]]["state"]
    left, _, right = (state[ref.removeprefix("IPY_MODEL_")]["state"] for ref in box["children"])
    # (the widget's text uses figure spaces where the text bar has spaces)
    final = f"{left['value']}|{'#' * 10}|{right['value']}".replace("\u2007", " ")
    assert final == "100%|##########| 3/3"
    assert shown(cell(replayed, "bar_auto")) == [
        {"output_type": "display_data", "data": {"text/plain": final}, "metadata": {}}
    ]
    # The live run of the step still showed the live widget.
    assert WIDGET_VIEW_MIME in normalize_outputs(cell(recorded, "bar_auto"))[0]["data"]


def test_a_value_widget_replays_its_final_value(runs):
    _, _, replayed = runs
    (out,) = shown(cell(replayed, "slider"))
    assert out["data"] == {"text/plain": "IntSlider(value=7)"}


def warnings_of(nb, name: str) -> str:
    return stream_text(normalize_outputs(cell(nb, name)), "stderr")


def test_unfaithful_widgets_are_named_once_when_recorded(runs):
    _, recorded, replayed = runs
    for name, widget in (("container", "HBox"), ("ipympl", "Canvas")):
        err = warnings_of(recorded, name)
        lines = [line for line in err.splitlines() if "NbdurableWarning" in line]
        assert len(lines) == 1, err
        if widget == "Canvas":
            # `%matplotlib widget` switches the backend, which a replay cannot
            # restore: the step is not replayable and says that (its body, and
            # so its canvas, runs again live), not that its outputs differ.
            assert "matplotlib backend was switched" in lines[0], lines
        else:
            assert f"({widget} widget)" in lines[0], lines
            assert "cannot be replayed as they looked" in lines[0], lines
        again = [ln for ln in warnings_of(replayed, name).splitlines() if "NbdurableWarning" in ln]
        if widget == "Canvas":  # its body runs again: one line says why, each time
            assert len(again) == 1 and f"step {name!r} runs again" in again[0], again
        else:  # replayed: said only when recorded
            assert again == [], "only when recorded"
    for name in ("bar_auto", "slider", "fig_noshow", "fd_out"):
        assert "NbdurableWarning" not in warnings_of(recorded, name), name


def test_outputs_hold_no_sync_marker(runs):
    _, recorded, replayed = runs
    for nb in (recorded, replayed):
        text = json.dumps([c.get("outputs", []) for c in nb.cells])
        assert json.dumps(MARKER)[1:-1] not in text
        assert "\\u0000" not in text


def test_captured_output_stays_captured_and_the_variable_holds_it(runs):
    plain, recorded, replayed = runs
    for nb in (recorded, replayed):
        assert shown(cell(nb, "capture_magic")) == [], "%%capture shows nothing"
        got = shown(cell(nb, "plain:captured"))
        assert got == shown(cell(plain, "plain:captured", durable=False))
    assert stream_text(got) == "'hidden\\n' 1\nhidden\n"
    assert got[-1]["data"] == {"text/plain": "'hidden display'"}


# IPython writes microseconds with the Greek mu or the micro sign, depending on the release.
_TIMING = re.compile(r"[\d.e+]+ (?:ns|\u03bcs|\u00b5s|us|ms|s)\b")


def timeit_lines(text: str) -> list[str]:
    """%timeit's result line and what follows, its times replaced (a "slowest run took"
    line before it comes and goes with the machine's load)."""
    return _TIMING.sub("T", text).splitlines()[-2:]


def test_timeit_replays_the_line_it_printed(runs):
    """%timeit measures each time it runs; a replay shows what the recorded run measured."""
    plain, recorded, _ = runs
    expected = shown(cell(recorded, "timeit"))
    assert replayed_outputs(runs, "timeit") == expected
    line = stream_text(expected)
    assert timeit_lines(line) == timeit_lines(stream_text(shown(cell(plain, "timeit", False))))
    assert line.endswith(" per loop (mean \u00b1 std. dev. of 2 runs, 1 loop each)\nafter\n"), line


def test_a_widget_closed_in_the_cell_replays_as_nothing(runs):
    """A ``leave=False`` bar is closed at its end (``Widget.close()``: "all of the widget views
    are automatically removed from the front-end"), so a replay shows nothing in its place.

    (nbclient is no frontend here: it keeps the closed widget's view and state.)
    """
    plain, recorded, _ = runs
    outs = normalize_outputs(cell(plain, "bar_auto_leave", durable=False))
    assert [WIDGET_VIEW_MIME in o.get("data", {}) for o in outs] == [True, False], outs
    expected = [{"output_type": "stream", "name": "stdout", "text": "after the bar\n"}]
    assert replayed_outputs(runs, "bar_auto_leave") == expected
    assert "NbdurableWarning" not in warnings_of(recorded, "bar_auto_leave")


def test_a_sub_step_bar_replays_its_final_state(runs):
    """A bar a sub-step showed, shown again when the sub-step replays in a body that runs again."""
    _, _, replayed = runs
    got = shown(cell(replayed, "bar_sub"))
    warned = [o for o in got if o["output_type"] == "stream" and o["name"] == "stderr"]
    assert len(warned) == 1 and "step 'bar_sub' runs again" in warned[0]["text"], got
    assert [o for o in got if o not in warned] == [
        {
            "output_type": "display_data",
            "data": {"text/plain": "100%|##########| 3/3"},
            "metadata": {},
        }
    ]


def test_worker_processes_output_in_order(runs):
    expected = replay_matches_plain(runs, "pool")
    assert stream_text(expected) == "worker 0\nworker 1\nworker 2\nsquares [0, 1, 4]\n"
    assert stream_text(replay_matches_plain(runs, "joblib")) == "worker 5\ncubes [25]\n"


def test_subprocess_line_ends_replay_as_printed(runs):
    expected = replay_matches_plain(runs, "subprocess_crlf")
    assert stream_text(expected) == "a\r\nb\r\none\ntwo\n"


def test_a_retried_step_shows_a_replayed_sub_steps_output_once_per_attempt(runs):
    """A cell run again after a transient error: its recorded sub-step shows what it printed
    once, as the plain run's second attempt printed it (the call ran again there)."""
    plain, recorded, replayed = runs
    first = shown(cell(plain, "retried@1", durable=False))
    assert stream_text(first) == "pre-call\ntrying 0\n"
    assert [o.get("ename") for o in first if o["output_type"] == "error"] == ["ConnectionError"]
    again = shown(cell(plain, "retried@2", durable=False))
    assert stream_text(again) == "pre-call\ntrying 1\nresult ok\n"
    assert stream_text(shown(cell(recorded, "retried@1"))) == stream_text(first)
    assert shown(cell(recorded, "retried@2")) == again
    # A fresh kernel: the first cell's body runs again (attempts, an input, is back to
    # 0) with both calls replayed; the second replays the step whole.
    assert shown(cell(replayed, "retried@1")) == again
    assert replayed_outputs(runs, "retried@2") == again


def test_sub_steps_in_a_plain_cell_show_what_they_printed_when_they_replay(runs):
    """A plain cell run again after a transient error: the call that was recorded replays and
    shows what it printed, once, as the plain run's second attempt (which called it again);
    in a fresh kernel both calls replay, and the cell shows what that attempt showed."""
    plain, recorded, replayed = runs
    first = shown(cell(plain, "plain:retried@1", durable=False))
    assert stream_text(first) == "pre-call\ntrying 0\n"
    again = shown(cell(plain, "plain:retried@2", durable=False))
    assert stream_text(again) == "pre-call\ntrying 1\nresult ok\n"
    assert stream_text(shown(cell(recorded, "plain:retried@1"))) == stream_text(first)
    assert shown(cell(recorded, "plain:retried@2")) == again
    assert shown(cell(replayed, "plain:retried@1")) == again
    assert shown(cell(replayed, "plain:retried@2")) == again
