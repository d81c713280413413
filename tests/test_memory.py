"""Deep values, freed memory and unrestorable records, in real kernels, against plain runs.

Each notebook runs plain (no nbdurable: ``%%step`` lines and ``%load_ext``
removed), then durable in a fresh kernel, then durable again in another
fresh kernel (replaying). What the notebook prints is compared between the
three; re-execution is counted outside the store through ``ran.log``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from kernel_util import outputs_of, run_saved, stream_text

pytestmark = pytest.mark.kernel

SETUP = (
    "%load_ext nbdurable\n"
    "import gc, json, os, sys, weakref\n"
    "from nbdurable import step\n"
    "def ran(name):\n"
    "    with open('ran.log', 'a') as f:\n"
    "        f.write(name + '\\n')"
)


def plain(cells: list[str]) -> list[str]:
    """The same notebook without nbdurable: no extension, ``%%step`` cells as plain cells."""
    out = []
    for cell in cells:
        lines = [
            ln for ln in cell.split("\n") if not ln.startswith(("%%step", "%load_ext nbdurable"))
        ]
        text = "\n".join(lines)
        text = text.replace(
            "from nbdurable import step\n", "def step(_id, fn, *a):\n    return fn(*a)\n"
        )
        out.append(text)
    return out


def execute(tmp: Path, cells: list[str], *, timeout: int = 300):
    """Save the notebook where NBDURABLE_NOTEBOOK says and run it in a fresh kernel."""
    return run_saved(tmp, cells, timeout=timeout)


def three_runs(tmp_path_factory, name: str, cells: list[str], *, durable: int = 2):
    """``(plain, durable run 1, run 2, ..., ran counts of the durable runs)``, fresh kernels."""
    base = tmp_path_factory.mktemp(name)
    (base / "plain").mkdir()
    (base / "durable").mkdir()
    runs = [execute(base / "plain", plain(cells))]
    runs += [execute(base / "durable", cells) for _ in range(durable)]
    log = base / "durable" / "ran.log"
    return (*runs, Counter(log.read_text().split() if log.exists() else ()))


def printed(nb, index: int) -> dict:
    return json.loads(stream_text(outputs_of(nb, index)))


def warnings_in(nb) -> list[str]:
    """Every nbdurable warning line the notebook showed (stderr of all cells)."""
    lines = []
    for i in range(len(nb.cells)):
        err = stream_text(outputs_of(nb, i), "stderr")
        lines += [ln for ln in err.splitlines() if "NbdurableWarning" in ln]
    return lines


def replay_noted(nb, index: int) -> bool:
    return any(
        (o.get("metadata") or {}).get("nbdurable", {}).get("note") == "replayed"
        for o in outputs_of(nb, index)
    )


# -- deep and huge values --------------------------------------------------------------

DEEP_CELLS = [
    SETUP + "\nclass Node:\n    def __init__(self, nxt, v=0):\n        self.nxt, self.v = nxt, v",
    "%%step at_default_limit\nchain = None\nfor i in range(200_000):\n    chain = Node(chain)\n"
    "ran('at_default_limit')",
    "sys.setrecursionlimit(10**6)",
    "%%step deep\nhead = None\nfor i in range(200_000):\n    head = Node(head, i)\nran('deep')",
    "%%step huge\nxs = list(range(10_000_000))\nran('huge')",
    "n, node, total = 0, head, 0\n"
    "while node is not None:\n"
    "    n, total, node = n + 1, total + node.v, node.nxt\n"
    "print(json.dumps({'n': n, 'total': total, 'first': head.v, 'isnode': isinstance(head, Node),\n"
    "                  'xs': [len(xs), xs[-1], xs[123456]], 'chain': chain is not None}))",
]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    return three_runs(tmp_path_factory, "deep", DEEP_CELLS)


def test_deep_chain_with_raised_limit_records_and_replays_without_crashing(deep):
    p, first, second, counts = deep
    want = {
        "n": 200_000,
        "total": sum(range(200_000)),
        "first": 199_999,
        "isnode": True,
        "xs": [10_000_000, 9_999_999, 123456],
        "chain": True,
    }
    assert printed(p, 5) == want
    assert printed(first, 5) == want
    assert printed(second, 5) == want
    assert counts["deep"] == 1 and counts["huge"] == 1, counts
    assert replay_noted(second, 3) and replay_noted(second, 4)


def test_deep_chain_at_default_limit_is_unsaveable_said_once(deep):
    p, first, second, counts = deep
    (line,) = warnings_in(first)
    assert "at_default_limit" in line and "chain (__main__.Node" in line, line
    # Each later run that runs the body again says why, in one line (not the warning again).
    (again,) = warnings_in(second)
    assert "step 'at_default_limit' runs again: its variables chain cannot be restored" in again
    assert counts["at_default_limit"] == 2, "not replayable: its body ran again"


# -- memory the user frees ---------------------------------------------------------------

MEM_SETUP = (
    SETUP + "\n"
    "import tracemalloc\n"
    "import numpy as np\n"
    "tracemalloc.start()\n"
    "STORE = os.environ.get('NBDURABLE_DIR') or '(none)'\n"
    "freed = []\n"
    "class Obj:\n"
    "    def __init__(self, i):\n"
    "        self.i = i\n"
    "def traced_mb():\n"
    "    gc.collect()\n"
    "    return tracemalloc.get_traced_memory()[0] / 1e6\n"
    "def snapshot():\n"
    "    gc.collect()\n"
    "    with open('/proc/self/statm') as f:\n"
    "        rss = int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
    "    with open('/proc/self/maps') as f:\n"
    "        maps = sum(STORE in line and line.rstrip().endswith('.val') for line in f)\n"
    "    return {'rss': rss, 'traced': tracemalloc.get_traced_memory()[0], 'maps': maps}\n"
    "def describe(r):\n"
    "    # A referrer of a value the cell deleted, named so a failure says what held it.\n"
    "    keys = sorted(map(str, r))[:8] if isinstance(r, dict) else ''\n"
    "    return f'{type(r).__module__}.{type(r).__qualname__}{keys}'\n"
    "def holders(ref):\n"
    "    o = ref()\n"
    "    return [] if o is None else sorted({describe(r) for r in gc.get_referrers(o)})\n"
    "def report(before, after, ref=lambda: None):\n"
    "    return {'freed': list(freed), 'rss_mb': round((before['rss'] - after['rss']) / 1e6),\n"
    "            'traced_mb': round((before['traced'] - after['traced']) / 1e6),\n"
    "            'maps': [before['maps'], after['maps']], 'held_by': holders(ref)}"
)

ROW_CELLS = [
    "t0 = traced_mb()\nrid = id(rows)\ndel rows\ngc.collect()\nmb = round(t0 - traced_mb())\n"
    "alive = [o for o in gc.get_objects() if id(o) == rid and type(o) is list] if mb < 5 else []\n"
    "held = [describe(r) for o in alive for r in gc.get_referrers(o) if r is not alive]\n"
    "print(json.dumps({'mb': mb, 'held_by': held}))",
    "t1 = traced_mb()\ndel objs\ngc.collect()\nprint(json.dumps(round(t1 - traced_mb())))",
    "print(json.dumps(round(t1 - traced_mb())))",
]

MEM_CELLS = [
    MEM_SETUP,
    "%%step make\nbig = np.ones(4_000_000)\nbig2 = np.full(4_000_000, 2.0)\nran('make')\n"
    "rows = [{'i': i, 's': str(i)} for i in range(30_000)]\n"
    "objs = [Obj(i) for i in range(30_000)]\n"
    "print(big.sum())",
    "fins = [weakref.finalize(v, freed.append, k) for k, v in (('big', big), ('big2', big2))]\n"
    "refs = {'big': weakref.ref(big), 'big2': weakref.ref(big2)}\n"
    "s0 = snapshot()",
    "del big\ngc.collect()\ns1 = snapshot()\nprint(json.dumps(report(s0, s1, refs['big'])))",
    "%%step drop\ndel big2\ngc.collect()\nran('drop')\nprint('in step', freed)",
    "s2 = snapshot()\nprint(json.dumps(report(s1, s2, refs['big2'])))",
    *ROW_CELLS,
]


@pytest.fixture(scope="module")
def memory(tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/statm and /proc/self/maps")
    return three_runs(tmp_path_factory, "memory", MEM_CELLS)


def test_del_frees_a_recorded_array_as_in_a_plain_run(memory):
    p, first, _second, _ = memory
    for nb in (p, first):
        got = printed(nb, 3)
        assert got["freed"] == ["big"], got  # the finalizer fired at `del`, in this cell
        assert got["rss_mb"] >= 25 and got["traced_mb"] >= 28, got
    step_out = stream_text(outputs_of(first, 4))
    assert step_out == stream_text(outputs_of(p, 4)) == "in step ['big', 'big2']\n"
    for nb in (p, first):
        got = printed(nb, 5)
        assert got["freed"] == ["big", "big2"] and got["rss_mb"] >= 25, got


def test_del_unmaps_a_replayed_array(memory):
    _p, _first, second, counts = memory
    assert counts["make"] == 1 and counts["drop"] == 1, counts
    assert replay_noted(second, 1) and replay_noted(second, 4)
    got = printed(second, 3)
    # Replayed arrays live on a copy-on-write mapping of their blob file.
    assert got["freed"] == ["big"] and got["maps"] == [2, 1] and got["rss_mb"] >= 25, got
    got = printed(second, 5)
    assert got["freed"] == ["big", "big2"] and got["maps"] == [1, 0] and got["rss_mb"] >= 25, got


# -- a record that cannot be restored ------------------------------------------------------

LRU_CELLS = [
    SETUP + "\nimport functools\n@functools.lru_cache\ndef f0(x):\n    return x + 100\n"
    "os.makedirs('lib', exist_ok=True)\n"
    "with open('lib/mymod.py', 'w') as fh:\n"
    "    fh.write('class Model:\\n    def __init__(self, n):\\n        self.n = n\\n')",
    "%%step cached\n"
    "@functools.lru_cache\n"
    "def f(x):\n"
    "    return x + 1\n"
    "class Weird:\n"
    "    def __reduce__(self):\n"
    "        return (int, ('not a number',))\n"
    "w = Weird()\n"
    "v = step('sub', lambda: ran('sub') or 7)\n"
    "ran('cached')\n"
    "print(f(1), v)",
    "%%step alias\ng = f0\nran('alias')",
    # Loads here, but not in a fresh kernel, whose sys.path lacks lib/: found on replay.
    "%%step frompath\nsys.path.insert(0, os.path.abspath('lib'))\nimport mymod\n"
    "m = mymod.Model(3)\nran('frompath')",
    "print(json.dumps({'f': f(2), 'g': g is f0, 'v': v, 'w': type(w).__name__, 'm': m.n}))",
]


@pytest.fixture(scope="module")
def lru(tmp_path_factory):
    return three_runs(tmp_path_factory, "lru", LRU_CELLS, durable=3)


def test_unrestorable_values_are_found_when_recorded_and_said_once(lru):
    p, first, second, third, counts = lru
    (line,) = warnings_in(first)
    assert "'cached'" in line and "f (functools._lru_cache_wrapper" in line, line
    assert "w (__main__.Weird: it does not load back (ValueError" in line, line
    assert " g (" not in line and " v (" not in line, line
    for nb in (second, third):  # each later run says in one line why the body runs
        (again,) = [ln for ln in warnings_in(nb) if "'cached'" in ln]
        assert "step 'cached' runs again: its variables " in again, again
        assert "f" in again and "w" in again and "cannot be restored" in again, again
    assert counts["cached"] == 3, "not replayable: the body ran again"
    assert counts["sub"] == 1, "its sub-step replayed"
    assert counts["alias"] == 1 and replay_noted(second, 2) and replay_noted(third, 2)
    want = {"f": 3, "g": True, "v": 7, "w": "Weird", "m": 3}
    for nb in (p, first, second, third):
        assert printed(nb, 4) == want
        assert stream_text(outputs_of(nb, 1)) == "2 7\n"


def test_a_value_that_fails_to_load_on_replay_is_said_once(lru):
    _p, _first, second, third, counts = lru
    (line,) = [ln for ln in warnings_in(second) if "'frompath'" in ln]
    assert "'frompath': cannot restore its variables (No module named 'mymod')" in line, line
    # Recorded as not replayable since: the next run says so in one line, not the failure.
    (again,) = [ln for ln in warnings_in(third) if "'frompath'" in ln]
    assert "step 'frompath' runs again: its variables mymod cannot be restored" in again, again
    assert counts["frompath"] == 3


def test_del_frees_recorded_lists(memory):
    """Plain data is freed at ``del``; a list of objects at the end of that cell.

    30,000 of each: the rows hold about 8.5 MB, the objects about 3.6 MB (32 MB arrays
    and these sizes keep every figure far above the noise while the steps that walk
    them stay quick: tracemalloc traces every allocation nbdurable makes too).
    """
    p, first, second, _ = memory
    rows, objs, after = 6, 7, 8
    for nb in (p, first, second):
        assert printed(nb, rows)["mb"] >= 5, printed(nb, rows)
        assert printed(nb, after) >= 2, printed(nb, after)
    assert printed(p, objs) >= 2, "a plain run frees it at once"


# -- the parts, without a kernel ------------------------------------------------------------


def _in_main(monkeypatch, obj, name: str):
    """Make ``obj`` (a class or function) look defined in the notebook as ``name``."""
    obj.__module__ = "__main__"
    obj.__qualname__ = name
    monkeypatch.setattr(sys.modules["__main__"], name, obj, raising=False)
    return obj


def test_dump_value_knows_plain_data_and_notebook_code(monkeypatch):
    from nbdurable.store import values

    class Thing:
        pass

    _in_main(monkeypatch, Thing, "Thing")
    plain = [
        {"i": i, "s": str(i), "t": (i, None, 1.5, b"x", {True}, bytearray(3))}
        for i in range(40_000)
    ]
    got = values.dump_value(plain)
    assert got.plain and not got.notebook
    assert b"\x93" in got.stream, "an int's bytes can look like STACK_GLOBAL: not a byte test"
    assert values.load_value(got.stream, {}, got.buffers) == (plain, True)
    for impure in ([1 + 2j], [Thing()], {"f": len}, [range(3)], [True, {1: [len]}]):
        got = values.dump_value(impure)
        assert not got.plain, impure
        assert values.load_value(got.stream, {}, got.buffers)[1] is False, impure
    assert values.dump_value([Thing()]).notebook


def test_restore_problem_finds_what_replay_cannot_load(monkeypatch):
    import functools

    from nbdurable.store import values

    @functools.lru_cache
    def f(x):
        return x

    class Weird:
        def __reduce__(self):
            return (int, ("not a number",))

    _in_main(monkeypatch, f, "f")
    _in_main(monkeypatch, Weird, "Weird")
    by_name = values.dump_value({"g": f})
    assert "__main__.f, which this step defines" in values.restore_problem(by_name, {"f"})
    assert values.restore_problem(by_name, {"g"}) is None, "f defined before the step: fine"
    assert "does not load back (ValueError" in values.restore_problem(
        values.dump_value([Weird()]), set()
    )
    big = values.dump_value([list(range(600_000)), f])  # over TRIAL_MAX: scanned, not loaded
    assert len(big.stream) > values.TRIAL_MAX
    assert "__main__.f" in values.restore_problem(big, {"f"})
    assert values.restore_problem(values.dump_value(list(range(10))), {"f"}) is None

    class Model:  # a cached method is saved by name inside the class's saved copy
        @functools.cache  # noqa: B019 - the case under test
        def size(self):
            return 1

    _in_main(monkeypatch, Model, "Model")
    _in_main(monkeypatch, Model.size, "Model.size")
    for value in (Model(), [list(range(600_000)), Model()]):
        why = values.restore_problem(values.dump_value(value), {"Model"})
        assert "__main__.Model.size, which this step defines" in why, why
    assert values.restore_problem(values.dump_value(Model()), {"other"}) is None


def test_restore_problem_does_not_load_library_objects(monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    from nbdurable.store import values

    class Report:
        def __init__(self, fig):
            self.fig = fig

    _in_main(monkeypatch, Report, "Report")
    plt.switch_backend("agg")
    fig = plt.figure()
    try:
        before = plt.get_fignums()
        assert values.restore_problem(values.dump_value(Report(fig)), set()) is None
        assert plt.get_fignums() == before, "a trial load would register the figure again"
    finally:
        plt.close("all")


def test_origins_hold_nothing_a_plain_run_frees():
    import gc
    import weakref

    from nbdurable.durable.recording import Origins, Snapshot

    class Obj:
        pass

    origins = Origins()
    obj, plain, held = Obj(), [1, 2, 3], [Obj()]
    origins.update({"o": (obj, "s1", False), "p": (plain, "s2", True), "h": (held, "s3", False)})
    ns = {"o": obj, "p": plain, "h": held}
    assert [origins.sha_for(n, ns[n]) for n in ("o", "p", "h")] == ["s1", "s2", "s3"]
    assert origins.sha_for("o", Obj()) is None and origins.sha_for("p", [1, 2, 3]) is None
    freed = []
    weakref.finalize(obj, freed.append, "o")
    del ns["o"], obj
    gc.collect()
    assert freed == ["o"], "held weakly"
    held_ref = weakref.ref(held[0])
    del ns["h"], held
    origins.prune(ns)
    gc.collect()
    assert held_ref() is None and len(origins) == 1, "a held list is dropped once unbound"

    snap_obj = Obj()
    snap = Snapshot({"x": snap_obj, "n": None, "l": [1]})
    assert snap["x"] is snap_obj and snap["n"] is None and "l" in snap and len(snap) == 3
    weakref.finalize(snap_obj, freed.append, "x")
    del snap_obj
    gc.collect()
    assert freed == ["o", "x"] and snap["x"] is None and "x" in snap


DEEP_SCRIPT = """
import sys, threading
from nbdurable.store import values
class Node:
    def __init__(self, nxt):
        self.nxt = nxt
head = None
for i in range(200_000):
    head = Node(head)
try:
    values.dumps(head)
    print("saved at the default limit")
except values.Unsaveable as exc:
    print("unsaveable:", type(exc.__cause__).__name__)
size = threading.stack_size()
sys.setrecursionlimit(10**6)
stream, buffers = values.dumps_parts(head)
back = values.loads(stream, {}, buffers)
n = 0
while back is not None:
    back, n = back.nxt, n + 1
print(n, threading.stack_size() == size, sys.getrecursionlimit())
sys.setrecursionlimit(10**7)  # no stack we start can hold this many levels: held to fewer
values.dumps_parts(head)
print(sys.getrecursionlimit())
"""


def test_deep_value_pickles_on_a_stack_that_fits_the_limit(tmp_path):
    import subprocess

    from kernel_util import REPO_ROOT

    script = tmp_path / "deep.py"
    script.write_text(DEEP_SCRIPT)
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split("\n")[:3] == [
        "unsaveable: PicklingError",
        "200000 True 1000000",
        "10000000",
    ], done.stdout


def test_a_trial_load_and_a_replay_leave_no_cycle_holding_the_values(monkeypatch):
    """A value recorded with a notebook object (which makes the record trial-load its
    stream) and then loaded back is freed by reference counting alone: the
    unpickler, whose memo held a bound method of itself, kept its out-of-band
    buffers, and with them the array, until a collection; Python 3.11.2's
    collector never freed that cycle (a `del` freed nothing in a kernel there)."""
    import gc
    import weakref

    import numpy as np

    from nbdurable.store import values

    Obj = _in_main(
        monkeypatch, type("Obj", (), {"__init__": lambda self, i: setattr(self, "i", i)}), "Obj"
    )
    freed = []
    paused = gc.isenabled()
    gc.disable()
    try:
        big = np.ones(100_000)
        weakref.finalize(big, freed.append, "recorded")
        joint = values.dump_values([big, [Obj(i) for i in range(50)]])
        pickled = values.Pickled(joint.stream, joint.buffers, False, True)
        assert values.restore_problem(pickled, (), {"Obj": Obj}, count=2) is None
        loaded = values.load_values(joint.stream, 2, {"Obj": Obj}, list(joint.buffers))
        copy = loaded[0][0]
        weakref.finalize(copy, freed.append, "loaded")
        assert copy.sum() == 100_000
        del joint, pickled, loaded, copy
        assert freed == ["loaded"], "the loaded array lives on after its last reference"
        del big
        assert freed == ["loaded", "recorded"], "the recorded array lives on"
    finally:
        if paused:
            gc.enable()
