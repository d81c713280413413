"""The yardstick itself: how a plain notebook is derived, what is normalized, the verdict."""

from __future__ import annotations

import pytest
from fidelity_harness import PLAIN_API, Run, plain_cell, split_outputs, verdict

pytestmark = pytest.mark.fidelity

WARNING = (
    "NbdurableWarning: step 'a' was recorded, but these variables "
    "cannot be saved: g. On replay this step's body runs again.\n"
)
NOTE = {
    "output_type": "display_data",
    "metadata": {"nbdurable": {"note": "replayed", "step": "name:a"}},
    "data": {"text/plain": "replayed step 'a'"},
}


def _stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def _run(*cells: list[dict], notes: list[list[str]] | None = None) -> Run:
    sources = ["%%step a\nx = 1"] * (len(cells) - 1) + ["probe"]
    return Run(sources, list(cells), notes or [[] for _ in cells], [])


def test_plain_cell_drops_the_step_header_and_the_extension():
    assert plain_cell("%%step load --force\nx = 1\nx") == "x = 1\nx"
    assert plain_cell("%load_ext nbdurable\nfrom nbdurable import step\ny = 2") == (
        PLAIN_API + "\ny = 2"
    )
    assert plain_cell("print('%%step stays')") == "print('%%step stays')"


def test_plain_api_runs_calls_directly():
    ns: dict = {}
    exec(PLAIN_API, ns)
    assert ns["step"]("id", lambda a, b=0: a + b, 1, b=2) == 3
    assert ns["recorded"](len) is len


def test_split_outputs_keeps_what_a_plain_run_shows():
    raw = [
        _stream("a\n"),
        NOTE,
        _stream(WARNING + "user text\n", "stderr"),
        _stream("b\n"),
        {"output_type": "execute_result", "execution_count": 7, "data": {"text/plain": "1"}},
        {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["/a/path"]},
    ]
    kept, said = split_outputs(raw)
    assert kept == [
        _stream("a\n"),
        _stream("user text\n", "stderr"),
        _stream("b\n"),
        {"output_type": "execute_result", "data": {"text/plain": "1"}},
        {"output_type": "error", "ename": "E", "evalue": "v"},
    ]
    assert said[0] == "replayed" and "body runs again" in said[1]


def test_split_outputs_merges_a_stream_split_by_a_note():
    kept, _ = split_outputs([_stream("a"), NOTE, _stream("b\n")])
    assert kept == [_stream("ab\n")]


def test_verdict_passes_equal_runs_and_fails_a_silent_difference():
    plain = _run([_stream("1\n")], [_stream("x => 1\n")])
    assert verdict(plain, _run([_stream("1\n")], [_stream("x => 1\n")])) is None
    silent = _run([], [_stream("x => 2\n")])
    assert "differs" in verdict(plain, silent)


def test_verdict_accepts_a_said_rerun_only_with_equal_probe_values():
    plain = _run([_stream("printed by a call\n")], [_stream("x => 1\n")])
    said = [["step 'a': cannot restore its variables; the step runs again."], []]
    rerun = _run([], [_stream("x => 1\n")], notes=said)
    assert verdict(plain, rerun) is None
    assert verdict(plain, rerun, rerun_ok=False) is not None
    wrong = _run([], [_stream("x => 2\n")], notes=said)
    assert "probe differs" in verdict(plain, wrong)
    replayed = _run([], [_stream("x => 1\n")], notes=[["replayed"], []])
    assert verdict(plain, replayed) is not None, "a replay note is not a rerun note"
