"""The engine against its spec, in real kernels (nbclient), across real kernel restarts.

Each test runs one notebook several times, each time in a fresh kernel, and
checks several things per run to keep the kernel starts few. Re-execution is
detected outside the store: every step body calls ``ran(NAME)``, which
appends to ``ran.log`` in the kernel's working directory, and the simulated
model and search (:mod:`nbdurable.demo.sim`) append every real call to a ledger.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from kernel_util import make_notebook, outputs_of, ran, run_notebook, run_saved, stream_text
from nbclient.exceptions import CellExecutionError, DeadKernelError

from nbdurable.demo.sim import ledger_calls
from nbdurable.ipython.capture import WIDGET_VIEW_MIME

pytestmark = pytest.mark.kernel

SETUP = (
    "%load_ext nbdurable\n"
    "import asyncio, json, os, signal, sys, threading, time\n"
    "from IPython.display import HTML, display\n"
    "import nbdurable\n"
    "from nbdurable import idempotency_key, recorded, step\n"
    "from nbdurable.demo.sim import llm_plan, llm_synthesize, search_web\n"
    "def ran(name):\n"
    "    with open('ran.log', 'a') as f:\n"
    "        f.write(name + '\\n')"
)


# -- helpers ------------------------------------------------------------------------


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        "NBDURABLE_DIR": str(tmp / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp / "nb.ipynb"),
        "NBDURABLE_SIM_LEDGER": str(tmp / "ledger.jsonl"),
        "NBDURABLE_SIM_LATENCY": "0",
        "JPY_SESSION_NAME": "",
    }
    env.update(extra)
    return env


def execute(tmp: Path, cells: list[str], *, allow_errors: bool = True, **env: str):
    """Save the notebook where NBDURABLE_NOTEBOOK says, as a user would have it, and run it."""
    return run_saved(tmp, cells, env=env_for(tmp, **env), allow_errors=allow_errors)


def calls(tmp: Path, since: int = 0) -> list[str]:
    """``kind:arg`` of every real model/search call after the first ``since``."""
    return [f"{c['kind']}:{c['arg']}" for c in ledger_calls(tmp / "ledger.jsonl")[since:]]


def is_note(output: dict) -> bool:
    return bool((output.get("metadata") or {}).get("nbdurable", {}).get("note"))


def visible(outputs: list[dict]) -> list[dict]:
    """Outputs without the replay note and without execution counts."""
    out = []
    for o in outputs:
        if is_note(o):
            continue
        o = dict(o)
        o.pop("execution_count", None)
        out.append(o)
    return out


def notes(outputs: list[dict]) -> list[str]:
    return [o["data"]["text/plain"] for o in outputs if is_note(o)]


def errors(outputs: list[dict]) -> list[dict]:
    return [o for o in outputs if o["output_type"] == "error"]


def last_json_at(nb, index: int) -> object:
    """The JSON that cell ``index`` printed."""
    return json.loads(stream_text(outputs_of(nb, index)))


def last_json(nb) -> object:
    """The JSON that the notebook's last cell printed."""
    return last_json_at(nb, len(nb.cells) - 1)


def step_table(nb, index: int) -> dict[str, tuple[str, str]]:
    """``%step list`` output of cell ``index``: label -> (state, detail)."""
    rows = {}
    for line in stream_text(outputs_of(nb, index)).splitlines()[2:]:
        cols = re.split(r"\s{2,}", line.strip())
        rows[cols[1]] = (cols[2], cols[7] if len(cols) > 7 else "")
    return rows


# -- 2. restart and replay ----------------------------------------------------------

DEFINE = (
    "%%step define\n"
    "import json as j\n"
    "import os.path\n"
    "import xml.etree.ElementTree\n"
    "import contextlib\n"
    "from collections import OrderedDict as OD\n"
    "def double(x):\n"
    "    return x * factor()  # factor() is defined by a later plain cell\n"
    "def logged(fn):\n"
    "    def inner(*args):\n"
    "        return ['logged', fn(*args)]\n"
    "    return inner\n"
    "@logged\n"
    "def tool(x):\n"
    "    return double(x)\n"
    "class Point:\n"
    "    def __init__(self, x, y):\n"
    "        self.x, self.y = x, y\n"
    "    def norm1(self):\n"
    "        return abs(self.x) + abs(self.y)\n"
    "p = Point(3, -4)\n"
    "found = [Finding('x')]  # a class of a plain cell, defined again after a restart\n"
    "items = [1]\n"
    "reg = {}\n"
    "a, (b, *rest) = 1, (2, 3, 4)\n"
    "n: int = 5\n"
    "n += 1\n"
    "for i, ch in enumerate('xy'):\n"
    "    pass\n"
    "with contextlib.nullcontext(7) as cm:\n"
    "    pass\n"
    "if (w := 10) > 5:\n"
    "    squares = [y := k * k for k in range(3)]\n"
    "try:\n"
    "    raise KeyError('k')\n"
    "except KeyError as e:\n"
    "    caught = str(e)\n"
    "def set_g():\n"
    "    global g\n"
    "    g = 'global'\n"
    "set_g()\n"
    "match p:\n"
    "    case Point(x=px):\n"
    "        pass\n"
    "scratch = 1\n"
    "del scratch\n"
    "ran('define')\n"
    "print('to stdout')\n"
    "print('to stderr', file=sys.stderr)\n"
    "display(HTML('<b>bold</b>'))\n"
    "print('after display')\n"
    "{'items': j.dumps(items)}"
)

REPLAY_CELLS = [
    SETUP + "\nfrom dataclasses import dataclass\n@dataclass\nclass Finding:\n    text: str",
    DEFINE,
    "%%step mutate\nitems.append(2)\nreg['k'] = 'v'\np.x = 30\nran('mutate')\nlen(items)",
    "%%step unsaved\n"
    "lock = threading.Lock()\n"
    "gen = (c for c in 'abc')\n"
    "hits = step('search', search_web, 'unsaved')\n"
    "fnd = step('find', Finding, 'y')\n"
    "ran('unsaved')\n"
    "print('hits', len(hits))",
    "%%step widget\n"
    "import ipywidgets\n"
    "display(ipywidgets.IntSlider(value=3, description='n'))\n"
    "ran('widget')",
    "def factor():\n    return 2",
    "print(json.dumps({\n"
    "    'j': [j.__name__, j.dumps(items)], 'path': os.path.join('a', 'b'),\n"
    "    'etree': xml.etree.ElementTree.fromstring('<t/>').tag, 'od': OD.__name__,\n"
    "    'double': double(21), 'point': [isinstance(p, Point), p.norm1()], 'tool': tool(1),\n"
    "    'found': [isinstance(found[0], Finding), found == [Finding('x')], fnd == Finding('y')],\n"
    "    'a': a, 'b': b, 'rest': rest, 'n': n, 'i': i, 'ch': ch, 'cm': cm, 'w': w,\n"
    "    'y': y, 'squares': squares, 'caught': caught, 'g': g, 'px': px,\n"
    "    'scratch': 'scratch' in globals(), 'reg': reg, 'items': items,\n"
    "    'lock': type(lock).__name__, 'gen': list(gen), 'hits': len(hits),\n"
    "}))",
]

EXPECTED_VALUES = {
    "j": ["json", "[1, 2]"],
    "path": "a/b",
    "etree": "t",
    "od": "OrderedDict",
    "double": 42,
    "point": [True, 34],
    "tool": ["logged", 2],
    "found": [True, True, True],
    "a": 1,
    "b": 2,
    "rest": [3, 4],
    "n": 6,
    "i": 1,
    "ch": "y",
    "cm": 7,
    "w": 10,
    "y": 4,
    "squares": [0, 1, 4],
    "caught": "'k'",
    "g": "global",
    "px": 3,
    "scratch": False,
    "reg": {"k": "v"},
    "items": [1, 2],
    "lock": "lock",
    "gen": ["a", "b", "c"],
    "hits": 3,
}


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    """The replay notebook run twice, each time in a new kernel."""
    tmp = tmp_path_factory.mktemp("replay")
    first = execute(tmp, REPLAY_CELLS, allow_errors=False)
    second = execute(tmp, REPLAY_CELLS, allow_errors=False)
    return tmp, first, second


def test_restart_restores_every_kind_of_variable(restarted):
    tmp, first, second = restarted
    assert last_json(first) == EXPECTED_VALUES
    assert last_json(second) == EXPECTED_VALUES
    assert ran(tmp)["define"] == 1 and ran(tmp)["mutate"] == 1, ran(tmp)


def test_restart_replays_outputs_identically_and_in_order(restarted):
    _, first, second = restarted
    define = visible(outputs_of(first, 1, execution_count=False))
    shape = [(o["output_type"], o.get("name")) for o in define]
    assert shape == [
        ("stream", "stdout"),
        ("stream", "stderr"),
        ("display_data", None),
        ("stream", "stdout"),
        ("execute_result", None),
    ], define
    assert [o.get("text") for o in define if o["output_type"] == "stream"] == [
        "to stdout\n",
        "to stderr\n",
        "after display\n",
    ]
    for cell in (1, 2):
        assert visible(outputs_of(second, cell)) == visible(outputs_of(first, cell)), cell
        assert len(notes(outputs_of(second, cell))) == 1, cell
        assert not notes(outputs_of(first, cell)), cell
    result = [o for o in outputs_of(second, 2) if o["output_type"] == "execute_result"]
    assert [r["data"]["text/plain"] for r in result] == ["2"], "stays an execute_result"
    note = next(o for o in outputs_of(second, 1) if is_note(o))
    assert note["output_type"] == "display_data"
    assert note["metadata"]["nbdurable"]["note"] == "replayed"
    assert "define" in note["data"]["text/plain"]


def test_unsaved_value_warns_once_and_replay_reruns_body_not_substeps(restarted):
    tmp, first, second = restarted
    err = stream_text(outputs_of(first, 3), "stderr")
    assert err.count("NbdurableWarning") == 1, err
    # one line, like the replay note: no file of nbdurable's, no source line under it
    assert err.startswith("NbdurableWarning: step 'unsaved'") and err.count("\n") == 1, err
    assert "gen (generator" in err and "lock (_thread.lock" in err, err
    assert "hits" not in err.split("cannot be saved:")[1], "only unsaved names are listed"
    assert ran(tmp)["unsaved"] == 2, "the body ran again on replay"
    assert calls(tmp) == ["search:unsaved"], "its sub-step replayed"
    assert stream_text(outputs_of(second, 3)) == "hits 3\n"


def test_widget_view_replays_as_its_static_fallback(restarted):
    tmp, first, second = restarted
    (live,) = [o for o in outputs_of(first, 4) if o["output_type"] == "display_data"]
    assert WIDGET_VIEW_MIME in live["data"]
    (shown,) = [o for o in visible(outputs_of(second, 4)) if o["output_type"] == "display_data"]
    assert WIDGET_VIEW_MIME not in shown["data"]
    assert shown["data"]["text/plain"] == live["data"]["text/plain"]
    assert "IntSlider" in shown["data"]["text/plain"]
    assert ran(tmp)["widget"] == 1


# -- 3. invalidation ----------------------------------------------------------------


def invalidation_cells(topic: str, plan: str, count: str) -> list[str]:
    return [
        SETUP + "\nclass Resp:\n    def __init__(self, text):\n        self.text = text",
        f"topic = {topic!r}",
        f"%%step plan\n{plan}\nran('plan')",
        f"%%step count\n{count}\nran('count')",
        "%%step other\nhits = search_web('unrelated')\nran('other')",
        "%%step report\nreport = llm_synthesize(topic, [plan['title']])\nran('report')",
        # An object fingerprinted by type only: the dependant must still notice a new one.
        "%%step wrap\nresp = Resp(plan['title'])\nran('wrap')",
        "%%step shout\nloud = resp.text.upper()\nran('shout')",
        "print(json.dumps(\n"
        "    [n, loud == plan['title'].upper(), report.startswith(f'Report on {topic}')]\n"
        "))",
    ]


def test_invalidation_by_code_and_inputs_reaches_dependants_only(tmp_path):
    plan = "plan = llm_plan(topic, 3)"
    count = "n = len(plan['subquestions'])"
    everything = {"plan", "count", "other", "report", "wrap", "shout"}

    nb = execute(tmp_path, invalidation_cells("cats", plan, count), allow_errors=False)
    assert set(ran(tmp_path)) == everything and max(ran(tmp_path).values()) == 1
    assert last_json(nb) == [3, True, True]

    def rerun(topic: str, plan: str, count: str) -> tuple[set[str], list[str]]:
        before, n_calls = ran(tmp_path), len(calls(tmp_path))
        nb = execute(tmp_path, invalidation_cells(topic, plan, count), allow_errors=False)
        assert last_json(nb) == [3, True, True]
        return set(ran(tmp_path) - before), calls(tmp_path, n_calls)

    # Comments, blank lines and spacing are not code: everything replays.
    edited = "# plan the research\n\nplan = llm_plan( topic,3 )  # three questions\n"
    assert rerun("cats", edited, count) == (set(), [])

    # A new topic: plan re-runs, and so does everything that depends on it, by fingerprint.
    executed, made = rerun("dogs", plan, count)
    assert executed == everything - {"other"}
    assert made == ["plan:dogs", "synthesize:dogs"]

    # A code edit re-runs that step; its output n is unchanged, so nothing else runs.
    assert rerun("dogs", plan, count + " * 1") == ({"count"}, [])


def test_a_step_that_runs_again_and_makes_an_equal_value_leaves_its_dependants(tmp_path):
    # `a` cannot be saved whole (a generator), so a fresh kernel runs it again. Its set of
    # strings comes out equal, but pickled in another order: string hashing differs per
    # process. `b` reads only the set, and must replay: an input is its content.
    cells = [
        SETUP,
        "%%step a\n"
        "tags = set('alpha beta gamma delta epsilon zeta eta theta iota kappa'.split())\n"
        "gen = (i for i in range(3))\n"
        "ran('a')",
        "%%step b\nn = sorted(tags)[:3]\nran('b')\nprint(n)",
    ]
    # The premise: under these two seeds the set pickles to other bytes.
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    dump = f"import pickle,sys; sys.stdout.write(pickle.dumps(set({words!r}.split())).hex())"
    pickled = {
        subprocess.run(
            [sys.executable, "-c", dump],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(pickled) == 2, "the two seeds pickle the set alike: the test proves nothing"
    execute(tmp_path, cells, allow_errors=False, PYTHONHASHSEED="1")
    nb = execute(tmp_path, cells, allow_errors=False, PYTHONHASHSEED="2")
    assert ran(tmp_path) == Counter({"a": 2, "b": 1}), ran(tmp_path)
    assert stream_text(visible(outputs_of(nb, 2))) == "['alpha', 'beta', 'delta']\n"


def test_a_step_whose_upstream_reran_replays_when_what_it_reads_came_out_the_same(tmp_path):
    # `config` reruns (its STYLE line changed) and makes N_QUESTIONS equal to before:
    # `plan` reads only N_QUESTIONS, so it replays, and its model call is not made again.
    # (The two share a blob: the digest of the blob changed with STYLE.)
    def cells(style: str) -> list[str]:
        return [
            SETUP,
            f"%%step config\nN_QUESTIONS = 3\nSTYLE = {style!r}\nran('config')",
            "%%step plan\nplan = llm_plan('cats', N_QUESTIONS)\nran('plan')",
            "%%step styled\nshout = STYLE.upper()\nran('styled')",
        ]

    execute(tmp_path, cells("plain"), allow_errors=False)
    before = len(calls(tmp_path))
    execute(tmp_path, cells("bold"), allow_errors=False)
    assert ran(tmp_path) == Counter({"config": 2, "plan": 1, "styled": 2}), ran(tmp_path)
    assert calls(tmp_path, before) == [], "plan's call was made again"

    # The views with no kernel say what the next run does: `config` was recorded after
    # `plan`'s record, yet `plan` replayed against it, so its N_QUESTIONS is not
    # "changed (step 'config' ran again)". `ran` is a plain cell's function, known from
    # its saved `def` (and `llm_plan`, a library's, is what its name says): every step
    # replays, and the run below does just that.
    from nbdurable.server.marks import step_marks

    marks = step_marks(tmp_path / "nb.ipynb", tmp_path / "store")["cells"]
    rows = {c["label"]: (c["state"], c["detail"]) for c in marks}
    same = ("recorded", "")
    assert rows == {"config": same, "plan": same, "styled": same}, rows
    execute(tmp_path, cells("bold"), allow_errors=False)
    assert ran(tmp_path) == Counter({"config": 2, "plan": 1, "styled": 2}), ran(tmp_path)


# -- 4. clear, pin, unpin, --force; failures ------------------------------------------


def control_cells(v: int, extra: list[str], force: str = "") -> list[str]:
    return [
        SETUP,
        f"v = {v}",
        f"%%step a {force}\nx = v\nhit_a = step('sa', search_web, 'qa')\nran('a')",
        "%%step b\ny = x + 1\nran('b')",
        "%%step c\nz = 5\nhit_c = step('sc', search_web, 'qc')\nran('c')",
        "print(json.dumps([x, y, z]))",
        *extra,
    ]


def test_clear_pin_unpin_and_force(tmp_path):
    def run(v: int, extra: list[str], force: str = "") -> tuple[object, set[str], list[str]]:
        before, n_calls = ran(tmp_path), len(calls(tmp_path))
        nb = execute(tmp_path, control_cells(v, extra, force), allow_errors=False)
        assert not any(errors(outputs_of(nb, i)) for i in range(len(nb.cells)))
        return nb, set(ran(tmp_path) - before), calls(tmp_path, n_calls)

    nb, executed, made = run(1, ["%step pin b", "%step list"])
    assert executed == {"a", "b", "c"} and made == ["search:qa", "search:qc"]
    assert stream_text(outputs_of(nb, 6)) == "pinned: b\n"
    table = step_table(nb, 7)
    assert [table[s][0] for s in "abc"] == ["recorded", "pinned", "recorded"], table

    # v changes: a re-runs; b depends on it but is pinned, so it replays its old y.
    extra = ["%step list", "%step unpin b", "%step clear c", "%step list"]
    nb, executed, made = run(2, extra)
    assert executed == {"a"} and made == [], "a's unchanged sub-step replayed"
    assert last_json_at(nb, 5) == [2, 2, 5]
    assert "pinned, stale" in notes(outputs_of(nb, 3))[0]
    table = step_table(nb, 6)
    assert table["b"] == ("pinned (stale)", "input 'x' changed"), table
    assert stream_text(outputs_of(nb, 8)) == "cleared: c\n"
    table = step_table(nb, 9)
    assert table["b"][0] == "invalidated" and table["c"][0] == "pending", table

    # --force runs a again (its recorded sub-step still replays); b is no longer pinned;
    # c was cleared with its sub-steps, so its call is made again.
    nb, executed, made = run(2, ["%step clear a", "%step list"], force="--force")
    assert executed == {"a", "b", "c"} and made == ["search:qc"]
    assert last_json_at(nb, 5) == [2, 3, 5]
    assert stream_text(outputs_of(nb, 6)) == "cleared: a; invalidated dependants: b\n"
    table = step_table(nb, 7)
    assert [table[s][0] for s in "abc"] == ["pending", "invalidated", "recorded"], table

    # a was cleared (its sub-step too); b was invalidated although its input is the same.
    nb, executed, made = run(2, ["%step clear --all", "%step list"])
    assert executed == {"a", "b"} and made == ["search:qa"]
    assert last_json_at(nb, 5) == [2, 3, 5]
    assert stream_text(outputs_of(nb, 6)).startswith("cleared run 'nb.ipynb'")
    assert {state for state, _ in step_table(nb, 7).values()} == {"pending"}


ASYNC_INTERRUPTED = (
    "%%step aintr\n"
    "async def slow(i):\n"
    "    for _ in range(15):\n"
    "        await asyncio.sleep(0.02)\n"
    "        ran('tick')\n"
    "    return i\n"
    "async def main():\n"
    "    if not os.path.exists('fixed'):\n"
    "        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGINT)\n"
    "    return await asyncio.gather(*(step(f'slow:{i}', slow, i) for i in range(2)))\n"
    "res = await main()\n"
    "ran('aintr')"
)

FAILING_CELLS = [
    SETUP,
    "%%step ok\nran('ok')",
    "%%step bad\n"
    "r1 = step('s1', search_web, 'q1')\n"
    "r2 = step('s2', search_web, 'q2')\n"
    "ran('bad')\n"
    "def explode():\n"
    "    ran('explode')\n"
    "    if not os.path.exists('fixed'):\n"
    "        raise ValueError('boom')\n"
    "    return 'fine'\n"
    "r4 = step('s4', explode)\n"
    "print('bad finished')",
    "%%step intr\n"
    "r3 = step('s3', search_web, 'q3')\n"
    "ran('intr')\n"
    "if not os.path.exists('fixed'):\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    time.sleep(10)\n"
    "print('intr finished')",
    ASYNC_INTERRUPTED,
    "def ticks():\n"
    "    return open('ran.log').read().split().count('tick')\n"
    "before = ticks()\n"
    "time.sleep(0.4)\n"
    "print(json.dumps([before, ticks()]))",
    "%%step later\nran('later')",
    "%step list",
]


def test_a_failing_step_stops_run_all_and_is_not_recorded(tmp_path):
    with pytest.raises(CellExecutionError) as failed:
        execute(tmp_path, FAILING_CELLS, allow_errors=False)
    assert failed.value.ename == "ValueError"
    assert ran(tmp_path) == Counter(ok=1, bad=1, explode=1), "run-all stopped at the failure"
    assert calls(tmp_path) == ["search:q1", "search:q2"]

    # Run all again, going on after errors: the failed step runs again, its finished
    # sub-steps replay; the error shows once. An interrupt fails a step the same way.
    nb = execute(tmp_path, FAILING_CELLS)
    assert ran(tmp_path)["bad"] == 2 and ran(tmp_path)["intr"] == 1
    assert ran(tmp_path)["explode"] == 2, "a failed sub-step is not recorded: called again"
    bad = outputs_of(nb, 2)
    assert [o["output_type"] for o in bad] == ["error"], bad
    assert bad[0]["ename"] == "ValueError" and bad[0]["evalue"] == "boom"
    assert [e["ename"] for e in errors(outputs_of(nb, 3))] == ["KeyboardInterrupt"]
    # An interrupted await shows what it shows in a plain cell: the kernel's loop
    # cancels the cell (ipykernel 7: CancelledError; 6: KeyboardInterrupt).
    (interrupted,) = [e["ename"] for e in errors(outputs_of(nb, 4))]
    assert interrupted in ("CancelledError", "KeyboardInterrupt")
    before, after = last_json_at(nb, 5)
    assert before == after < 30, "an interrupted async step stops, and stays stopped"
    assert calls(tmp_path) == ["search:q1", "search:q2", "search:q3"]
    table = step_table(nb, 7)
    assert table["ok"][0] == "replayed" and table["later"][0] == "recorded", table
    assert table["bad"] == ("failed", "ValueError: boom"), table
    assert table["intr"] == ("failed", "KeyboardInterrupt"), table
    assert table["aintr"] == ("failed", interrupted), table

    # Fixed: the failed steps run to the end (never recorded as done) and are recorded;
    # no finished sub-step is called again.
    (tmp_path / "fixed").touch()
    nb = execute(tmp_path, FAILING_CELLS, allow_errors=False)
    assert ran(tmp_path)["bad"] == 3 and ran(tmp_path)["intr"] == 2 and ran(tmp_path)["aintr"] == 1
    assert ran(tmp_path)["explode"] == 3
    assert stream_text(outputs_of(nb, 2)) == "bad finished\n"
    assert calls(tmp_path) == ["search:q1", "search:q2", "search:q3"]
    table = step_table(nb, 7)
    assert {table[s][0] for s in ("bad", "intr", "aintr")} == {"recorded"}, table
    assert ran(tmp_path)["later"] == 1 and ran(tmp_path)["ok"] == 1


# -- 5. nbformat 4.4: no cell ids, unnamed steps ----------------------------------------


@pytest.mark.parametrize(
    ("minor", "saved"),
    [(4, True), (4, False), (5, True)],
    ids=["4.4-saved", "4.4-unsaved", "4.5-saved"],
)
def test_unnamed_steps_keep_their_keys_across_kernel_starts(tmp_path, minor, saved):
    cells = [
        SETUP,
        "%%step\nx = 1\nran('one')",
        "%%step\ny = x + 1\nran('two')",
        "%step list",
        "print(json.dumps([x, y]))",
    ]
    path = tmp_path / "nbs" / "nb.ipynb"
    env = env_for(tmp_path, NBDURABLE_DIR="", NBDURABLE_NOTEBOOK=str(path) if saved else "")
    if saved:
        path.parent.mkdir()
        nbformat.write(make_notebook(cells, nbformat_minor=minor), path)
    for attempt in (1, 2):
        # What is saved is what runs, with the saved cell ids (if any) each time.
        nb = nbformat.read(path, as_version=4) if saved else make_notebook(cells, minor)
        assert all("id" not in c for c in nb.cells) == (minor == 4)
        nb = run_notebook(nb, cwd=tmp_path, env=env, allow_errors=False)
        assert last_json(nb) == [1, 2]
        assert bool(notes(outputs_of(nb, 1))) == (attempt == 2)
        assert bool(notes(outputs_of(nb, 2))) == (attempt == 2)
    assert ran(tmp_path) == Counter({"one": 1, "two": 1}), "the second run replayed both"

    table = step_table(nb, 3)
    assert [state for state, _ in table.values()] == ["replayed", "replayed"], table
    if saved and minor == 4:
        assert list(table) == ["cell #2", "cell #3"], "keyed by position in the saved file"
    elif saved:
        assert all(label.startswith("cell ") and "#" not in label for label in table), table
    else:
        assert list(table) == ["cell x = 1", "cell y = x + 1"], "keyed by source"

    # The store sits beside the notebook (or in the working directory without one), 0700.
    store = (path.parent if saved else tmp_path) / ".nbdurable"
    assert stat.S_IMODE(store.stat().st_mode) == 0o700


# -- sub-steps: async, threads, @recorded, divergence, duplicates ------------------------


def substep_cells(arg: str) -> list[str]:
    return [
        SETUP,
        f"arg = {arg!r}",
        "%%step asy\n"
        "async def fetch(q):\n"
        "    await asyncio.sleep(0.01)\n"
        "    return search_web(q)\n"
        "res = await asyncio.gather(*(step(f'a:{i}', fetch, f'aq{i}') for i in range(3)))\n"
        "one = await step('a:one', fetch, 'aq-one')\n"
        "ran('asy')",
        "%%step thr\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "def fan_out(qs):\n"
        "    with ThreadPoolExecutor(8) as pool:\n"
        "        return list(pool.map(lambda iq: step(f't:{iq[0]}', search_web, iq[1]),\n"
        "                             enumerate(qs)))\n"
        "tres = fan_out([f'tq{i}' for i in range(16)])\n"
        "ran('thr')",
        "@recorded\ndef ask(q):\n    return search_web(q)",
        "%%step rec\nr = [ask('rx'), ask('ry'), ask('rx')]\nran('rec')",
        "%%step div\nd_step = step('d', search_web, query=arg)\nran('div')",
        *(
            f"nbdurable.configure(on_divergence={mode!r})\n"
            f"d_{mode} = step('div:{mode}', search_web, arg)"
            for mode in ("warn", "rerun", "replay", "error")
        ),
        "nbdurable.configure(on_divergence='warn');",
        "%%step dup\nstep('same', len, 'a')\nstep('same', len, 'b')",
        "from nbdurable.durable.session import get_session\n"
        "s = get_session()\n"
        "def ids(scope):\n"
        "    return sorted(k.rsplit('/', 1)[1] for k in s.store.scan(s.keys.subs_prefix(scope)))\n"
        "print(json.dumps({\n"
        "    'ids': {k: ids(f'name:{k}') for k in ('asy', 'thr', 'rec')},\n"
        "    'run': ids('~run'),\n"
        "    'values': [res, one, tres, r, d_replay],\n"
        "}))",
    ]


def test_substeps_async_threads_recorded_divergence(tmp_path):
    first = execute(tmp_path, substep_cells("one"))
    made = calls(tmp_path)
    assert len(made) == 3 + 1 + 16 + 3 + 1 + 4, made
    assert ran(tmp_path) == Counter(asy=1, thr=1, rec=1, div=1)
    got = last_json(first)
    assert got["ids"] == {
        "asy": ["a:0", "a:1", "a:2", "a:one"],
        "thr": sorted(f"t:{i}" for i in range(16)),
        "rec": ["__main__.ask#0", "__main__.ask#1", "__main__.ask#2"],
    }
    assert got["run"] == ["div:error", "div:replay", "div:rerun", "div:warn"]
    res, one, tres, r, _ = got["values"]
    distinct = {json.dumps(v) for v in [*res, one, *tres, *r]}
    assert len(distinct) == 3 + 1 + 16 + 3, "each call its own result"

    # The same id with other arguments: the run has diverged.
    second = execute(tmp_path, substep_cells("two"))
    assert calls(tmp_path, len(made)) == ["search:two"] * 3, "div (warned), warn, rerun"
    assert last_json(second)["values"] == got["values"], "replay mode kept the old result"
    assert ran(tmp_path) == Counter(asy=1, thr=1, rec=1, div=2)
    warned = [stream_text(outputs_of(second, i), "stderr") for i in (6, 7, 8, 9)]
    # Inside a step: one line for the step when it is recorded, naming the first call.
    assert "diverged" in warned[0]
    assert (
        "step 'div' ran again (input 'arg' changed): 1 of 1 recorded call made again "
        "(sub-step 'd'" in warned[0]
    ), warned[0]
    assert "diverged" in warned[1] and "'div:warn'" in warned[1]
    assert warned[2] == warned[3] == "", "rerun and replay are silent"
    assert [e["ename"] for e in errors(outputs_of(second, 10))] == ["DivergenceError"]

    for nb in (first, second):  # a duplicate id is a one-line usage error
        dup = outputs_of(nb, 12)
        assert [o["output_type"] for o in dup] == ["stream"], dup
        assert re.fullmatch(
            r"UsageError: sub-step 'same' of step 'dup' was already used[^\n]*\n", dup[0]["text"]
        ), dup


# -- idempotency keys across a crash ----------------------------------------------------

NOTIFY = [
    SETUP + "\nfrom nbdurable.demo.sim import MailProvider\nmail = MailProvider('mailbox.sqlite')",
    "%%step notify\n"
    "outer = idempotency_key('welcome')\n"
    "def send(to):\n"
    "    key = idempotency_key()\n"
    "    with open('keys.log', 'a') as f:\n"
    "        f.write(outer + ' ' + key + '\\n')\n"
    "    receipt = mail.send(to, 'hello', idempotency_key=key)\n"
    "    if not os.path.exists('crashed'):  # die between the effect and its record\n"
    "        open('crashed', 'w').close()\n"
    "        os._exit(1)\n"
    "    return receipt\n"
    "receipt = step('send', send, 'ada@example.com')\n"
    "print(outer)",
    "print(json.dumps([receipt, mail.delivered(), mail.attempts(), idempotency_key('run')]))",
]


def test_idempotency_key_is_the_same_after_a_crash_and_on_replay(tmp_path):
    with pytest.raises(DeadKernelError):
        execute(tmp_path, NOTIFY, allow_errors=False)
    second = execute(tmp_path, NOTIFY, allow_errors=False)
    third = execute(tmp_path, NOTIFY, allow_errors=False)

    lines = (tmp_path / "keys.log").read_text().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], lines
    outer, inner = lines[0].split()
    assert re.fullmatch(r"nbd-[0-9a-f]{32}", outer) and outer != inner
    assert stream_text(outputs_of(second, 1)) == stream_text(outputs_of(third, 1)) == outer + "\n"
    receipt, delivered, attempts, run_key = last_json(second)
    assert receipt["duplicate"] is True, "the provider dropped the repeated send"
    assert (delivered, attempts) == (1, 2)
    assert last_json(third) == [receipt, 1, 2, run_key], "replayed: no third attempt"


# -- usage errors -----------------------------------------------------------------------

BAD_INPUT = [
    "%step clear nope",
    "%step pin nope",
    "%step unpin nope",
    "%step pin",
    "%step bogus",
    "%step",
    '%%step "a b"\nprint(1)',
    "%%step x --nope\nprint(1)",
    "%%step x y\nprint(1)",
    "%%step list\nprint(1)",
    "%step clear",
    "%step clear --all extra",
    "%step list extra",
    "%step run a b",
]


def test_bad_step_input_is_a_one_line_usage_error(tmp_path):
    twins = ["%%step twin\nt = 1", "%%step twin\nt = 2"]
    cells = [SETUP, "%%step known\nran('known')", *twins, *BAD_INPUT, "%step bogus"]
    nb = make_notebook(cells)
    nbformat.write(nb, tmp_path / "nb.ipynb")
    for cell in nb.cells[2:-1]:
        cell.metadata["tags"] = ["raises-exception"]  # nbclient goes on after these
    with pytest.raises(CellExecutionError) as failed:
        run_notebook(nb, cwd=tmp_path, env=env_for(tmp_path))
    assert failed.value.ename == "UsageError"
    for index, source in enumerate(BAD_INPUT, start=4):
        out = outputs_of(nb, index)
        assert [(o["output_type"], o.get("name")) for o in out] == [("stream", "stderr")], source
        assert re.fullmatch(r"UsageError: [^\n]+\n", out[0]["text"]), (source, out)
    assert "no step 'nope'" in outputs_of(nb, 4)[0]["text"]
    assert "(known steps: known, twin)" in outputs_of(nb, 4)[0]["text"]  # the saved cells
    assert "'a b'" in outputs_of(nb, 10)[0]["text"]
    assert "'--nope'" in outputs_of(nb, 11)[0]["text"]
    assert ran(tmp_path) == Counter(known=1), "no bad cell ran its body"

    # Two saved cells with one name would share one record: each is refused, naming both.
    for index in (2, 3):
        out = outputs_of(nb, index)
        assert [o["output_type"] for o in out] == ["stream"], out
        assert re.fullmatch(
            r"UsageError: step name 'twin' is used by 2 cells of nb.ipynb \(cells #3, #4\)"
            r"; give each %%step its own name\n",
            out[0]["text"],
        ), out
