"""The panel, ``%step list`` and ``nbdurable status`` say what running a step does.

One decision (:func:`nbdurable.verdict.invalid_reason`) serves the step
runner and every view. Here an upstream step runs again in a real kernel
with a new value: before the downstream step runs, the panel and ``%step
list`` (in that kernel) and ``nbdurable status`` (no kernel) all say it is
invalidated, and running it (in a new kernel) indeed executes its body.

An upstream step that *will* run (its code or an input changed, not run yet)
leaves its dependants' fate open: each view says "may run", and the next run
replays the dependant when the upstream's value comes out the same and runs
it otherwise. The tests compare each prediction with what the next run does:
a step predicted to replay must replay, one predicted to run must run.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text

from nbdurable import cli

UP = "%%step up\nx = n + 1"
DOWN = "%%step down\ny = x * 10\nprint('computed', y)"


def _text(nb, index: int) -> str:
    return stream_text(outputs_of(nb, index))


#: Every state a row can show, longest first ("may run" has a space).
STATES = ("not replayable", "may run", "invalidated", "recorded", "replayed", "pending",
          "pinned", "failed", "orphaned", "running")  # fmt: skip


def _listed(table: str) -> dict[str, tuple[str, str]]:
    """``%step list`` rows: step -> (state, detail)."""
    lines = table.splitlines()
    at = lines[1].index("detail")  # the table's columns are aligned on its header
    rows = {}
    for line in lines[2:]:
        _cell, name, rest = line.split(None, 2)
        state = next(s for s in STATES if rest.startswith(s))
        rows[name] = (state, line[at:].strip())
    return rows


PANEL_JSON = (
    "import json, nbdurable\np = nbdurable.panel()\n"
    "print(json.dumps({r.info.label: [r.state, r.info.detail] for r in p.rows.values()}))"
)


@pytest.mark.kernel
def test_an_upstream_rerun_invalidates_downstream_everywhere(tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    cells = ["%load_ext nbdurable", "n = 1", UP, DOWN]
    nbformat.write(make_notebook(cells), path)
    first = make_notebook(
        cells
        + [
            # The upstream step runs again in this kernel, on a new value of n.
            "n = 5\nget_ipython().run_cell_magic('step', 'up', 'x = n + 1')",
            "%step list",
            PANEL_JSON,
        ]
    )
    # Before that: n changed in the kernel, 'up' not run yet: 'up' will run, 'down' may.
    first.cells[4:4] = [nbformat.v4.new_code_cell(c) for c in ("n = 5", "%step list", PANEL_JSON)]
    out = run_notebook(first, cwd=tmp_path, env=env, startup_timeout=180, timeout=300)
    assert _text(out, 3) == "computed 20\n"
    waiting = "step 'up' runs first: replays only if 'x' comes out the same"
    assert _listed(_text(out, 5)) == {
        "up": ("invalidated", "input 'n' changed"),
        "down": ("may run", waiting),
    }, _text(out, 5)
    rows = json.loads(_text(out, 6))
    assert rows == {"up": ["invalidated", "input 'n' changed"], "down": ["may run", waiting]}
    listed = {k: v[0] for k, v in _listed(_text(out, 8)).items()}
    assert listed == {"up": "recorded", "down": "invalidated"}, _text(out, 8)
    assert "input 'x' changed" in _text(out, 8)
    rows = json.loads(_text(out, 9))
    assert rows == {"up": ["recorded", ""], "down": ["invalidated", "input 'x' changed"]}, rows

    # No kernel: the store shows 'up' recorded after 'down' read its x. 'up' read n = 5,
    # which the kernel set; the saved notebook's plain cell binds n = 1, and the record of
    # n = 1 is kept: a Run All of it may bring that one back.
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    assert cli.main(["status", str(path), "--json"]) == 0
    steps = {s["label"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert steps["up"]["state"] == "may run", steps
    assert steps["up"]["detail"] == (
        "input 'n' changed (a plain cell binds it to another value): replays a kept version "
        "recorded from it, if any"
    ), steps
    assert steps["down"]["state"] == "invalidated", steps
    assert steps["down"]["detail"] == "input 'x' changed (step 'up' ran again)", steps

    # What running does: in a new kernel with n = 5, 'up' replays and 'down' executes.
    second = make_notebook(["%load_ext nbdurable", "n = 5", UP, DOWN, "%step list"])
    out = run_notebook(second, cwd=tmp_path, env=env, startup_timeout=180, timeout=300)
    assert _text(out, 3).endswith("computed 60\n"), _text(out, 3)
    listed = {k: v[0] for k, v in _listed(_text(out, 4)).items()}
    assert listed == {"up": "replayed", "down": "recorded"}, _text(out, 4)


def _status(path, capsys) -> dict[str, tuple[str, str]]:
    assert cli.main(["status", str(path), "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    return {s["label"]: (s["state"], s["detail"]) for s in steps}


def _check(predicted: dict[str, str], ran: dict[str, str]) -> None:
    """A step predicted to replay replayed; one predicted to run ran; "may run": either."""
    for step, state in predicted.items():
        if state in ("recorded", "replayed"):
            assert ran[step] == "replayed", (step, predicted, ran)
        elif state == "pinned":  # a pinned step that replayed stays shown as pinned
            assert ran[step] == "pinned", (step, predicted, ran)
        elif state == "not replayable":  # its body ran again, and it stays so
            assert ran[step] == "not replayable", (step, predicted, ran)
        elif state != "may run":
            assert ran[step] == "recorded", (step, predicted, ran)  # executed in that kernel


@pytest.mark.kernel
@pytest.mark.parametrize(
    ("edit", "down_runs"),
    [
        # A call on a module 'other' reads: not a change of it (other still replays).
        ("math.floor(0.5)\nx = n + 2", True),
        ("x = 1 + n  # the same value, other code", False),
    ],
)
def test_an_upstream_that_will_run_leaves_its_dependants_open(
    tmp_path, capsys, monkeypatch, edit, down_runs
):
    """'up' edited on disk, not run: every view says 'down' may run; the run decides."""
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    # It reads n and math, not x: it replays, and every view says so.
    other = "%%step other\nz = math.floor(n * 3)"
    cells = ["%load_ext nbdurable\nimport math", "n = 1", UP, DOWN, other]
    nbformat.write(make_notebook(cells), path)
    run_notebook(make_notebook(cells), cwd=tmp_path, env=env, startup_timeout=180, timeout=300)

    edited = f"%%step up\n{edit}"
    # The views first, in the notebook the next run executes: no kernel, then a kernel
    # (%step list and the panel, before 'up' runs), then the run itself.
    second = ["%load_ext nbdurable\nimport math", "n = 1", "%step list", PANEL_JSON, edited,
              DOWN, other, "%step list"]  # fmt: skip
    nbformat.write(make_notebook(second), path)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    waiting = "step 'up' runs first: replays only if 'x' comes out the same"
    expected = {
        "up": ("invalidated", "its code changed"),
        "down": ("may run", waiting),
        "other": ("recorded", ""),
    }
    # With no kernel, n (a plain cell's) is not seen: 'other' may run, the only difference.
    plain_n = (
        "reads 'n' from plain cells (seen only in a kernel): replays only if it comes out the same"
    )
    assert _status(path, capsys) == dict(expected, other=("may run", plain_n))

    out = run_notebook(
        make_notebook(second), cwd=tmp_path, env=env, startup_timeout=180, timeout=300
    )
    assert _listed(_text(out, 2)) == expected, _text(out, 2)
    assert json.loads(_text(out, 3)) == {k: list(v) for k, v in expected.items()}
    ran = {k: v[0] for k, v in _listed(_text(out, 7)).items()}
    assert ran == {
        "up": "recorded",
        "down": "recorded" if down_runs else "replayed",
        "other": "replayed",
    }, _text(out, 7)
    _check({k: v[0] for k, v in expected.items()}, ran)


@pytest.mark.kernel
def test_may_run_passes_down_and_stops_at_a_pin(tmp_path, capsys, monkeypatch):
    """A step reading a 'may run' step may run too; a pinned one replays, and says so."""
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    last = "%%step last\nw = y + 1\nprint('last ran')"
    frozen = "%%step frozen\nv = x - 1"
    cells = ["%load_ext nbdurable", "n = 1", UP, DOWN, last, frozen]
    nbformat.write(make_notebook(cells), path)
    run_notebook(make_notebook(cells), cwd=tmp_path, env=env, startup_timeout=180, timeout=300)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    assert cli.main(["pin", str(path), "frozen"]) == 0
    capsys.readouterr()

    second = list(cells)
    second[2] = "%%step up\nx = n + 2"
    nbformat.write(make_notebook(second), path)
    steps = _status(path, capsys)
    assert steps == {
        "up": ("invalidated", "its code changed"),
        "down": ("may run", "step 'up' runs first: replays only if 'x' comes out the same"),
        "last": ("may run", "step 'down' may run first: replays only if 'y' comes out the same"),
        "frozen": ("pinned", ""),
    }, steps
    out = run_notebook(
        make_notebook([*second, "%step list"]), cwd=tmp_path, env=env, startup_timeout=180
    )
    ran = {k: v[0] for k, v in _listed(_text(out, 6)).items()}
    assert ran == {"up": "recorded", "down": "recorded", "last": "recorded", "frozen": "pinned"}
    # The pin replayed: its value is the one recorded from the old x (2 - 1), now stale.
    assert "input 'x' changed" in _listed(_text(out, 6))["frozen"][1], _text(out, 6)
    _check({k: v[0] for k, v in steps.items()}, ran)


@pytest.mark.kernel
def test_a_not_replayable_upstream_leaves_its_dependants_recorded(tmp_path, capsys, monkeypatch):
    """Its body reruns with the same code and inputs: a step reading its value replays."""
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    handle = "%%step handle\nimport threading\nlock = threading.Lock()\nbase = 10"
    cells = ["%load_ext nbdurable", handle, "%%step use\nk = base * 2"]
    nbformat.write(make_notebook(cells), path)
    run_notebook(make_notebook(cells), cwd=tmp_path, env=env, startup_timeout=180)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    steps = {k: v[0] for k, v in _status(path, capsys).items()}
    assert steps == {"handle": "not replayable", "use": "recorded"}, steps
    out = run_notebook(make_notebook([*cells, "%step list"]), cwd=tmp_path, env=env)
    ran = {k: v[0] for k, v in _listed(_text(out, 3)).items()}
    assert ran == {"handle": "not replayable", "use": "replayed"}, _text(out, 3)
    _check(steps, ran)


@pytest.mark.kernel
def test_a_renamed_upstream_is_found_by_what_its_cell_writes(tmp_path, capsys, monkeypatch):
    """'up' renamed (a new step, no record) and changed: 'down' read x, which it writes."""
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    cells = ["%load_ext nbdurable", "n = 1", UP, DOWN]
    nbformat.write(make_notebook(cells), path)
    run_notebook(make_notebook(cells), cwd=tmp_path, env=env, startup_timeout=180)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)

    second = ["%load_ext nbdurable", "n = 1", "%%step first\nx = n + 2", DOWN]
    nbformat.write(make_notebook(second), path)
    steps = _status(path, capsys)
    assert steps == {
        "first": ("pending", ""),
        "down": ("may run", "step 'first' runs first: replays only if 'x' comes out the same"),
        "up": ("orphaned", "no longer in the notebook"),
    }, steps
    out = run_notebook(make_notebook([*second, "%step list"]), cwd=tmp_path, env=env)
    ran = {k: v[0] for k, v in _listed(_text(out, 4)).items()}
    assert ran == {"first": "recorded", "down": "recorded", "up": "orphaned"}, _text(out, 4)
    assert _text(out, 3) == "computed 30\n"
    _check({k: v[0] for k, v in steps.items() if k != "up"}, ran)


@pytest.mark.kernel
def test_a_method_called_on_an_int_input_is_not_a_change(tmp_path):
    """``n.bit_length()`` reads n: the step stays recorded, and running it again replays.

    A method call on a name may change its object, so the step records that
    object as one of its outputs. An int or a str cannot be changed: counting
    it made the step invalidate itself ("input 'n' changed") right after it
    ran, and run again in the same kernel. A list's method call stays a change.
    """
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    up = "%%step up\nn.bit_length()\nname.upper()\nx = n + len(name)\nprint('body ran')"
    grow = "%%step grow\nxs.append(x)"
    again = f"get_ipython().run_cell({up!r})"
    cells = ["%load_ext nbdurable", "n = 1\nname = 'a'\nxs = []", up, grow, "%step list", again]
    nbformat.write(make_notebook(cells), path)
    out = run_notebook(make_notebook([*cells, "%step list"]), cwd=tmp_path, env=env)
    first = _listed(_text(out, 4))
    assert first["up"][0] == "recorded", _text(out, 4)
    assert _text(out, 5) == "body ran\n"  # replayed: its output shown again
    then = _listed(_text(out, 6))
    assert then["up"][0] == "replayed", _text(out, 6)
    # xs.append(x) did change xs: run again, a plain notebook would append again,
    # so the step must run again too.
    assert then["grow"] == ("invalidated", "input 'xs' changed"), _text(out, 6)


@pytest.mark.kernel
def test_an_upstream_edit_that_keeps_a_literal_leaves_its_readers_replaying(
    tmp_path, capsys, monkeypatch
):
    """`config` edited on disk: a reader of what it binds to the same literal replays;
    a reader of what it binds to another literal runs. Every view says which, before
    anything runs, and the run does it."""
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}

    def cells(style: str) -> list[str]:
        return [
            "%load_ext nbdurable\nLIMIT = 2  # a plain cell's literal: the views see it saved",
            f"%%step config\nN_QUESTIONS = 3\nSTYLE = {style!r}\nMODELS = ('a', 'b')",
            "%%step plan\nquestions = [f'q{i}' for i in range(N_QUESTIONS)][:LIMIT + 1]\n"
            "print('plan ran')",
            "%%step styled\nshout = STYLE.upper()\nprint('styled ran')",
            "%%step both\npairs = [(m, q) for m in MODELS for q in questions]",
        ]

    run_notebook(make_notebook(cells("plain")), cwd=tmp_path, env=env, startup_timeout=180)
    nbformat.write(make_notebook(cells("bold")), path)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    expected = {
        "config": ("invalidated", "its code changed"),
        "plan": ("recorded", ""),
        "styled": ("invalidated", "input 'STYLE' changes (step 'config' runs first)"),
        "both": ("recorded", ""),
    }
    assert _status(path, capsys) == expected
    # ... and what changes: the literal config's saved code binds, before config runs.
    assert cli.main(["status", str(path), "--why", "styled", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["why"] == ["'STYLE': was 'plain', now 'bold'"]
    second = [*cells("bold"), "%step list"]
    out = run_notebook(make_notebook(second), cwd=tmp_path, env=env, startup_timeout=180)
    ran = {k: v[0] for k, v in _listed(_text(out, 5)).items()}
    assert ran == {"config": "recorded", "plan": "replayed", "styled": "recorded",
                   "both": "replayed"}, _text(out, 5)  # fmt: skip
    assert _text(out, 3) == "styled ran\n" and _text(out, 2) == "plan ran\n"
    _check({k: v[0] for k, v in expected.items()}, ran)

    # The plain cell's literal edited and saved: 'plan' runs again, and status says so.
    third = cells("bold")
    third[0] = third[0].replace("LIMIT = 2", "LIMIT = 3")
    nbformat.write(make_notebook(third), path)
    changed = "input 'LIMIT' changed (a plain cell binds it to another value)"
    assert _status(path, capsys)["plan"] == ("invalidated", changed)
    out = run_notebook(make_notebook([*third, "%step list"]), cwd=tmp_path, env=env)
    assert _listed(_text(out, 5))["plan"][0] == "recorded", _text(out, 5)  # it ran


@pytest.mark.kernel
def test_a_plain_cells_helper_function_is_known_without_a_kernel(tmp_path, capsys, monkeypatch):
    """A helper defined in a plain cell (the cookbooks' ``chat_completion_request``) is
    known from the saved cell: the same ``def`` reading the same literals and libraries
    replays, an edited one (or one reading an edited literal) runs, and one reading a
    value only the kernel sees (a client) may run. The run does what each view said."""
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}

    def cells(helper: str, prefix: str = "Q") -> list[str]:
        return [
            "%load_ext nbdurable",
            f"import math\nPREFIX = {prefix!r}\nclient = object()\n{helper}",
            "def ask(q):\n    return client, q",
            "%%step shout\nlines = [fmt(i) for i in range(3)]\nprint('shout ran')",
            "%%step asks\nsent = ask('x')[1]\nprint('asks ran')",
        ]

    helper = "def fmt(i):\n    # a comment\n    return PREFIX + str(math.floor(i))"
    run_notebook(make_notebook(cells(helper)), cwd=tmp_path, env=env, startup_timeout=180)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)

    def predict_then_run(saved: list[str]) -> dict[str, tuple[str, str]]:
        nbformat.write(make_notebook(saved), path)
        predicted = _status(path, capsys)
        out = run_notebook(make_notebook([*saved, "%step list"]), cwd=tmp_path, env=env)
        ran = {k: v[0] for k, v in _listed(_text(out, 5)).items()}
        _check({k: v[0] for k, v in predicted.items()}, ran)
        return predicted

    waits = (
        "reads 'ask' from plain cells (seen only in a kernel): replays only if it comes out "
        "the same"
    )
    # Saved as it ran; then only its comment and layout edited: both replay.
    for saved in (helper, helper.replace("# a comment", "# another").replace("+ str", "+  str")):
        assert predict_then_run(cells(saved)) == {
            "shout": ("recorded", ""),
            "asks": ("may run", waits),
        }
    changed = "input 'fmt' changed (a plain cell binds it to another value)"
    assert predict_then_run(cells(helper.replace("str(", "repr(")))["shout"] == (
        "invalidated",
        changed,
    )
    # The literal it reads edited: the function is another one too (that a kept version
    # was recorded from it is not known without the kernel's fingerprints).
    edited = helper.replace("str(", "repr(")
    assert predict_then_run(cells(edited, prefix="A"))["shout"] == (
        "may run",
        f"{changed}: replays a kept version recorded from it, if any",
    )
