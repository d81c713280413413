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
import logging, os, subprocess, sys, ctypes, time
log = logging.getLogger("fidelity")
log.addHandler(logging.StreamHandler())  # holds the original sys.stderr object
log.propagate = False
"""

# PLAIN_RACE: in a plain cell, ipykernel's pipe thread forwards fd output
# asynchronously; on a busy machine it can miss the end of the cell, and the
# plain run (the oracle) then lacks it. The fd cases wait a moment at their end
# so that the oracle is complete; a step needs no such wait (it syncs the pipe).

#: name -> step body. Each runs as `%%step name` in the durable runs.
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
    cells = [SETUP]
    for name, body in STEPS.items():
        body = textwrap.dedent(body)
        cells.append(f"%%step {name}\n{body}" if durable else body)
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


@pytest.mark.parametrize(
    "name",
    ["fig_noshow", "fig_show", "fig_semicolon", "fig_last", "logged", "nested", "reentrant"],
)
def test_replay_equals_plain_run(runs, name):
    expected = replay_matches_plain(runs, name)
    assert expected, f"the plain run of {name} shows something"


@pytest.mark.parametrize(
    # (widgets aside: their live views carry a fresh model id in every run;
    # a traceback names different frames)
    "name",
    [n for n in NAMES if n not in ("bar_auto", "slider", "container", "ipympl", "fig_error")],
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
