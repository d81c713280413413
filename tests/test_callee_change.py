"""A sub-step replays only if the function it calls is unchanged, in real kernels.

Each run is a fresh kernel on the same store; every real call appends to
``calls.log``. An edit to a global the callee reads, to an ``@recorded``
body or to a lambda makes those calls again, said in one line per step; an
unchanged notebook makes none; a record written before callee fingerprints
were recorded replays on its arguments and says so in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_util import outputs_of, run_saved, stream_text

pytestmark = pytest.mark.kernel

PRELUDE = (
    "%load_ext nbdurable\n"
    "from nbdurable import recorded, step\n"
    "def tick(tag):\n"
    "    with open('calls.log', 'a') as fh:\n"
    "        fh.write(tag + '\\n')"
)


def cells(model: str, suffix: str, extra: str = "") -> list[str]:
    return [
        PRELUDE,
        f"MODEL = {model!r}\ndef ask(i):\n    tick('ask')\n    return f'{{MODEL}}:{{i}}'",
        f"@recorded\ndef rec(i):\n    tick('rec')\n    return i{suffix}",
        "%%step s\nout = [step(f'a:{i}', ask, i) for i in range(3)]\n"
        "more = [rec(i) for i in range(2)]\n"
        "lam = step('lam', lambda: tick('lam') or MODEL.upper())" + extra,
        "print(out, more, lam)",
        extra
        and "from nbdurable.durable.session import get_session\n"
        "s = get_session()\n"
        "for k in list(s.store.scan(s.keys.subs_prefix('name:s'))):\n"
        "    header, body = s.store.get(k)\n"
        "    header.pop('callee_fp', None); header.pop('callee_parts', None)\n"
        "    s.store.put(k, header, body)",
    ]


def run(tmp: Path, nb_cells: list[str]):
    return run_saved(tmp, [c for c in nb_cells if c])


def calls(tmp: Path) -> list[str]:
    log = tmp / "calls.log"
    made = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return made


def test_changed_callee_is_called_again_and_said_in_one_line(tmp_path):
    run(tmp_path, cells("small", " * 2"))
    assert calls(tmp_path) == ["ask"] * 3 + ["rec"] * 2 + ["lam"]

    # MODEL is read by ask and by the lambda: both are made again; rec is not.
    nb = run(tmp_path, cells("large", " * 2"))
    assert sorted(calls(tmp_path)) == ["ask"] * 3 + ["lam"]
    assert stream_text(outputs_of(nb, 4)) == "['large:0', 'large:1', 'large:2'] [0, 2] LARGE\n"
    said = [
        line for line in stream_text(outputs_of(nb, 3), "stderr").splitlines() if "step 's'" in line
    ]
    assert len(said) == 1, said
    assert "step 's' ran again (input" in said[0] and " changed): 4 of 6 recorded calls " in said[0]
    assert "made again (sub-step 'a:0': its function 'ask' changed (global MODEL)" in said[0]

    nb = run(tmp_path, cells("large", " * 3"))  # the @recorded body changed
    assert calls(tmp_path) == ["rec"] * 2
    assert stream_text(outputs_of(nb, 4)) == "['large:0', 'large:1', 'large:2'] [0, 3] LARGE\n"

    run(tmp_path, cells("large", " * 3"))  # nothing changed: nothing is called
    assert calls(tmp_path) == []


def test_record_without_callee_fingerprint_replays_on_its_arguments_and_says_so(tmp_path):
    run(tmp_path, cells("small", " * 2", extra="\nx = 1"))  # its last cell strips the fingerprints
    assert len(calls(tmp_path)) == 6
    nb = run(tmp_path, cells("large", " * 2", extra="\nx = 2"))
    assert calls(tmp_path) == [], "old records replay on their arguments"
    said = [
        line for line in stream_text(outputs_of(nb, 3), "stderr").splitlines() if "step 's'" in line
    ]
    assert len(said) == 1 and "6 calls replayed from records made before" in said[0], said


def filling(version: int) -> list[str]:
    return [
        PRELUDE,
        "def fill(xs, d):\n    tick('fill')\n    xs.extend([1, 2])\n    d['k'] = 1\n    return xs",
        "class Slotted:\n    __slots__ = ('v',)\n    def __init__(self):\n        self.v = 1\n"
        "def setv(s):\n    tick('setv')\n    s.v += 1",
        f"%%step s\nres, d = [], {{}}\nr = step('fill', fill, res, d)\n"
        f"box = Slotted()\nstep('setv', setv, box)\nversion = {version}",
        "print(res, d, r is res, box.v)",
    ]


def test_substep_that_changes_its_arguments_restores_them_or_is_not_recorded(tmp_path):
    first = run(tmp_path, filling(1))
    assert sorted(calls(tmp_path)) == ["fill", "setv"]
    said = stream_text(outputs_of(first, 3), "stderr")
    assert "sub-step 'setv' of step 's' changed its argument #0 (" in said, said
    assert "NOT recorded" in said
    # The body runs again (its code changed): fill replays, and its arguments are filled
    # as the real call left them; setv, never recorded, is called again.
    again = run(tmp_path, filling(2))
    assert calls(tmp_path) == ["setv"]
    expected = "[1, 2] {'k': 1} True 2\n"
    assert stream_text(outputs_of(first, 4)) == stream_text(outputs_of(again, 4)) == expected
