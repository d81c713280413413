"""Replay restores exactly the state a plain run leaves, or says the body ran again.

Each case runs three ways in real kernels: plain (no nbdurable), durable on
a fresh store, and durable again in a fresh kernel on the same store (the
restart, where steps replay). The first durable run must equal the plain
run; the restart must equal it too, or say a body ran again and still end
with the plain run's probe values (see fidelity_harness). Categories:
shared objects, mutations a step never names, process and module state,
iterators, the output history (``_``, ``Out``), notebook classes, records
that cannot be restored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from fidelity_harness import Workdir, check_plain, durable_cells, params, plain_cells, verdict

pytestmark = [pytest.mark.kernel, pytest.mark.fidelity]


@dataclass
class Case:
    """A notebook for the corpus: its cells (after the prelude), its probes, its files."""

    id: str
    category: str
    cells: list[str]
    probes: list[str]
    files: dict[str, str] = field(default_factory=dict)


NP = "import numpy as np"
PD = "import pandas as pd"

SHARING = [
    Case(
        "alias-append-in-later-step",
        "sharing",
        ["%%step make\na = [1, 2]", "%%step extend\nb = a\nb.append(3)", "a.append(4)"],
        ["a", "b", "a is b"],
    ),
    Case(
        "alias-made-in-one-step",
        "sharing",
        ["%%step make\na = [1]\nb = a", "b.append(2)"],
        ["a", "b", "a is b"],
    ),
    Case(
        "dict-holds-object-of-earlier-step",
        "sharing",
        ["%%step make\nh = {'n': 1}", "%%step register\nreg = {'h': h}", "h['n'] = 2"],
        ["reg", "reg['h'] is h"],
    ),
    Case(
        "sentinel-from-plain-cell",
        "sharing",
        ["MISSING = object()", "%%step build\nreg = {'x': MISSING, 'y': 1}"],
        ["reg['x'] is MISSING", "[k for k, v in reg.items() if v is MISSING]"],
    ),
    Case(
        "handler-registered-in-dict",
        "sharing",
        ["def handler(x):\n    return x + 1", "%%step register\nhandlers = {'on': handler}"],
        ["handlers['on'] is handler", "handlers['on'](1)"],
    ),
    Case(
        "numpy-view-written-in-step",
        "sharing",
        [NP, "%%step make\narr = np.arange(6)", "%%step view\nv = arr[:3]\nv[0] = 99", "v[1] = 77"],
        ["arr.tolist()", "v.tolist()", "v.base is arr"],
    ),
    Case(
        "numpy-view-made-in-step-written-later",
        "sharing",
        [NP, "%%step make\narr = np.zeros(4)\nmid = arr[1:3]", "mid[:] = 5"],
        ["arr.tolist()", "mid.base is arr"],
    ),
    Case(
        "large-array-and-alias",
        "sharing",
        [NP, "%%step make\nbig = np.ones(200_000)\nalias = big", "alias[0] = 3"],
        ["float(big[0])", "alias is big"],
    ),
    Case(
        "pandas-alias-new-column",
        "sharing",
        [
            PD,
            "%%step load\ndf = pd.DataFrame({'x': [1, 2, 3]})",
            "%%step prep\ntrain = df\ntrain['z'] = 0",
            "print(df.columns.tolist())",
        ],
        ["df.columns.tolist()", "train is df"],
    ),
    Case(
        "config-shared-across-steps",
        "sharing",
        ["%%step cfg\ncfg = {'lr': 1}", "%%step model\nmodel = {'cfg': cfg}", "cfg['lr'] = 2"],
        ["model['cfg']['lr']", "model['cfg'] is cfg"],
    ),
    Case(
        "same-row-twice-in-grid",
        "sharing",
        ["%%step grid\nrow = [0, 0]\ngrid = [row, row]", "grid[0][0] = 1"],
        ["grid", "grid[0] is grid[1]"],
    ),
    Case(
        "self-reference",
        "sharing",
        ["%%step loop\na = []\na.append(a)\nn = len(a)"],
        ["a[0] is a", "n"],
    ),
    Case(
        "wrap-object-of-plain-cell",
        "sharing",
        ["base = [1]", "%%step wrap\nwrap = [base]", "base.append(2)"],
        ["wrap", "wrap[0] is base"],
    ),
    Case(
        "tuple-of-shared-lists",
        "sharing",
        ["%%step make\nx = [1]\nt = (x, x)", "t[0].append(2)"],
        ["x", "t", "t[0] is x"],
    ),
    Case(
        "two-names-one-dict-across-steps",
        "sharing",
        ["%%step make\nstate = {'k': 0}", "%%step alias\ncurrent = state", "current['k'] = 1"],
        ["state", "current is state"],
    ),
]

MUTATION = [
    Case(
        "helper-mutates-global",
        "mutation",
        [
            "counts = {}\ndef bump(k):\n    counts[k] = counts.get(k, 0) + 1",
            "%%step count\nbump('a')\nbump('a')\ndone = True",
        ],
        ["counts", "done"],
    ),
    Case(
        "setattr-through-function",
        "mutation",
        [
            "class C:\n    pass\nc = C()\ndef setv(o):\n    setattr(o, 'v', 5)",
            "%%step set\nsetv(c)",
        ],
        ["getattr(c, 'v', None)"],
    ),
    Case(
        "setattr-in-step",
        "mutation",
        ["class C:\n    pass\nc = C()", "%%step set\nsetattr(c, 'w', 7)\nok = 1"],
        ["getattr(c, 'w', None)", "ok"],
    ),
    Case(
        "element-reached-through-list",
        "mutation",
        [
            "class Ship:\n    def __init__(self):\n        self.items = []\nship = Ship()\nfleet = [ship]",
            "%%step load\nfleet[0].items.append('crate')",
        ],
        ["fleet[0].items", "ship.items", "fleet[0] is ship"],
    ),
    Case(
        "closure-counter",
        "mutation",
        [
            "def make():\n    n = [0]\n    def inc():\n        n[0] += 1\n        return n[0]\n"
            "    return inc\ninc = make()",
            "%%step use\ninc()\ninc()",
            "print(inc())",
        ],
        ["inc()"],
    ),
    Case(
        "callable-instance-state",
        "mutation",
        [
            "class Counter:\n    def __init__(self):\n        self.n = 0\n"
            "    def __call__(self):\n        self.n += 1\n        return self.n\ncount = Counter()",
            "%%step use\ncount()\ncount()",
            "print(count())",
        ],
        ["count.n"],
    ),
    Case(
        "class-attribute-changed-by-step",
        "mutation",
        ["class Model:\n    scale = 1\nm0 = Model()", "%%step tune\nModel.scale = 5"],
        ["Model.scale", "m0.scale", "isinstance(m0, Model)"],
    ),
    Case(
        "method-added-by-step",
        "mutation",
        [
            "class Model:\n    scale = 2\nm0 = Model()",
            "%%step extend\nModel.double = lambda self: 2 * self.scale",
        ],
        ["hasattr(Model, 'double')", "m0.double()", "isinstance(m0, Model)"],
    ),
    Case(
        "log-appended-by-helper",
        "mutation",
        [
            "log = []\ndef record(x):\n    log.append(x)\n    return x",
            "%%step use\ny = record(3)",
        ],
        ["log", "y"],
    ),
    Case(
        "global-statement-in-helper",
        "mutation",
        ["total = 0\ndef add(n):\n    global total\n    total += n", "%%step add\nadd(5)"],
        ["total"],
    ),
    Case(
        "list-sorted-by-helper",
        "mutation",
        ["xs = [3, 1, 2]\ndef srt(values):\n    values.sort()", "%%step sort\nsrt(xs)"],
        ["xs"],
    ),
    Case(
        "method-mutates-instance-of-earlier-step",
        "mutation",
        [
            "class Config:\n    def __init__(self):\n        self.v = 0\n"
            "    def set(self, v):\n        self.v = v",
            "%%step make\ncfg = Config()",
            "%%step tune\ncfg.set(3)",
        ],
        ["cfg.v"],
    ),
    Case(
        "dict-updated-in-place-by-step",
        "mutation",
        ["%%step make\nd = {'a': 1}", "%%step update\nd.update(b=2)\nd.pop('a')"],
        ["d"],
    ),
    Case(
        "set-filled-by-helper",
        "mutation",
        [
            "seen = set()\ndef visit(x):\n    seen.add(x)",
            "%%step walk\nfor w in ['b', 'a']:\n    visit(w)",
        ],
        ["seen", "w"],
    ),
]

PROCESS = [
    Case(
        "os-environ-set",
        "process",
        [
            "import os",
            "%%step env\nos.environ['FIDELITY_FLAG'] = 'on'",
            "print(os.environ.get('FIDELITY_FLAG'))",
        ],
        ["os.environ.get('FIDELITY_FLAG')"],
    ),
    Case(
        "env-magic",
        "process",
        [
            "import os",
            "%%step env\n%env FIDELITY_MODE=fast\nx = 1",
            "print(os.environ.get('FIDELITY_MODE'))",
        ],
        ["os.environ.get('FIDELITY_MODE')", "x"],
    ),
    Case(
        "chdir",
        "process",
        [
            "import os",
            "%%step cd\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')",
            "print(os.path.basename(os.getcwd()))",
        ],
        ["os.path.basename(os.getcwd())"],
    ),
    Case(
        "sys-path-append",
        "process",
        ["import sys", "%%step path\nsys.path.append('libdir')", "import mymod\nprint(mymod.X)"],
        ["'libdir' in sys.path"],
        files={"libdir/mymod.py": "X = 41\n"},
    ),
    Case(
        "random-seed",
        "process",
        ["import random", "%%step seed\nrandom.seed(3)", "print(random.random())"],
        ["random.random()"],
    ),
    Case(
        "random-state-consumed-in-step",
        "process",
        [
            "import random",
            "%%step draw\nrandom.seed(1)\na = random.random()",
            "print(random.random())",
        ],
        ["a"],
    ),
    Case(
        "numpy-random-seed",
        "process",
        [NP, "%%step seed\nnp.random.seed(0)", "print(np.random.rand())"],
        ["np.random.randint(1000)"],
    ),
    Case(
        "numpy-printoptions",
        "process",
        [NP, "%%step opts\nnp.set_printoptions(precision=2)", "print(np.array([1 / 3]))"],
        ["np.get_printoptions()['precision']"],
    ),
    Case(
        "pandas-option",
        "process",
        [
            PD,
            "%%step opts\npd.set_option('display.max_rows', 4)",
            "print(pd.DataFrame({'x': range(10)}))",
        ],
        ["pd.get_option('display.max_rows')"],
    ),
    Case(
        "warnings-filter",
        "process",
        [
            "import warnings",
            "%%step quiet\nwarnings.filterwarnings('ignore', message='noisy')",
            "warnings.warn('noisy thing')\nprint('after')",
        ],
        ["any(f[0] == 'ignore' for f in warnings.filters[:3])"],
    ),
    Case(
        "matplotlib-rcparams",
        "process",
        ["import matplotlib", "%%step style\nmatplotlib.rcParams['lines.linewidth'] = 7"],
        ["matplotlib.rcParams['lines.linewidth']"],
    ),
    Case(
        "user-module-registry",
        "process",
        [
            "import helpers",
            "%%step register\nhelpers.REGISTRY.append('a')",
            "print(helpers.REGISTRY)",
        ],
        ["helpers.REGISTRY"],
        files={"helpers.py": "REGISTRY = []\n"},
    ),
    Case(
        "user-module-monkeypatch",
        "process",
        [
            "import helpers",
            "%%step patch\nhelpers.greet = lambda: 'patched'",
            "print(helpers.greet())",
        ],
        ["helpers.greet()"],
        files={"helpers.py": "def greet():\n    return 'hello'\n"},
    ),
    Case(
        "user-module-setting",
        "process",
        ["import helpers", "%%step tune\nhelpers.SCALE = 3", "print(helpers.scaled(2))"],
        ["helpers.SCALE"],
        files={"helpers.py": "SCALE = 1\ndef scaled(x):\n    return SCALE * x\n"},
    ),
    Case(
        "decimal-context",
        "process",
        [
            "from decimal import Decimal, getcontext",
            "%%step prec\ngetcontext().prec = 4",
            "print(Decimal(1) / Decimal(3))",
        ],
        ["getcontext().prec"],
    ),
    Case(
        "recursion-limit",
        "process",
        ["import sys", "%%step limit\nsys.setrecursionlimit(4321)"],
        ["sys.getrecursionlimit()"],
    ),
]

ITERATORS = [
    Case(
        "generator-across-steps",
        "iterators",
        [
            "%%step make\ng = (i * i for i in range(10))",
            "%%step head\nfirst = [next(g) for _ in range(3)]",
            "%%step rest\nrest = list(g)",
        ],
        ["first", "rest"],
    ),
    Case(
        "generator-consumed-then-plain-cell",
        "iterators",
        [
            "%%step make\ng = (i * i for i in range(10))",
            "%%step head\nfirst = [next(g) for _ in range(3)]",
            "print(list(g))",
        ],
        ["first"],
    ),
    Case(
        "list-iterator-across-steps",
        "iterators",
        [
            "%%step make\nit = iter([1, 2, 3, 4])",
            "%%step one\na = next(it)",
            "%%step two\nb = next(it)",
        ],
        ["a", "b", "list(it)"],
    ),
    Case(
        "itertools-count",
        "iterators",
        [
            "import itertools",
            "%%step make\nc = itertools.count()",
            "%%step take\nx = next(c)",
            "print(next(c))",
        ],
        ["x"],
    ),
    Case(
        "open-file-read-in-steps",
        "iterators",
        [
            "%%step open\nf = open('data.txt')",
            "%%step first\nline1 = f.readline()",
            "print(f.readline())",
        ],
        ["line1"],
        files={"data.txt": "one\ntwo\nthree\n"},
    ),
    Case(
        "map-object",
        "iterators",
        ["%%step make\nm = map(str, range(5))", "%%step head\nh = next(m)", "print(list(m))"],
        ["h"],
    ),
]

HISTORY = [
    Case(
        "underscore-after-replayed-result",
        "history",
        ["%%step answer\nx = 41\nx", "print(_ + 1)"],
        ["_"],
    ),
    Case(
        "double-underscore",
        "history",
        ["%%step one\n1 + 1", "%%step two\n'two'", "print(repr(__), repr(_))"],
        ["__", "_"],
    ),
    Case(
        "out-dict",
        "history",
        ["%%step answer\n40 + 2", "print(list(Out.values()))"],
        ["list(Out.values())"],
    ),
    Case(
        "numbered-output",
        "history",
        ["%%step seven\n7", "print(_2)"],
        ["_2"],
    ),
    Case(
        "semicolon-hides-result",
        "history",
        ["'before'", "%%step quiet\n5;", "print(repr(_))"],
        ["_"],
    ),
    Case(
        "in-list-length",
        "history",
        ["%%step a\nx = 1", "%%step b\ny = 2"],
        ["len(In)"],
    ),
]

CLASSES = [
    Case(
        "instance-of-plain-cell-class",
        "classes",
        ["class P:\n    def __init__(self, v):\n        self.v = v", "%%step make\np = P(3)"],
        ["isinstance(p, P)", "type(p) is P", "p.v"],
    ),
    Case(
        "dataclass-equality",
        "classes",
        [
            "from dataclasses import dataclass\n@dataclass\nclass Pt:\n    x: int",
            "%%step make\npts = [Pt(1), Pt(2)]",
        ],
        ["pts[0] == Pt(1)", "isinstance(pts[1], Pt)", "pts"],
    ),
    Case(
        "class-defined-in-step",
        "classes",
        ["%%step make\nclass Q:\n    pass\nq = Q()"],
        ["isinstance(q, Q)", "type(q) is Q"],
    ),
    Case(
        "enum-member-identity",
        "classes",
        ["import enum\nclass Color(enum.Enum):\n    RED = 1", "%%step pick\nc = Color.RED"],
        ["c is Color.RED", "c == Color.RED"],
    ),
    Case(
        "exception-instance",
        "classes",
        ["class MyErr(Exception):\n    pass", "%%step make\ne = MyErr('x')"],
        ["isinstance(e, MyErr)", "str(e)"],
    ),
    Case(
        "list-subclass",
        "classes",
        ["class Bag(list):\n    pass", "%%step make\nb = Bag([1, 2])"],
        ["isinstance(b, Bag)", "b"],
    ),
    Case(
        "class-redefined-after-step",
        "classes",
        [
            "class P:\n    def __init__(self, v):\n        self.v = v\n    def show(self):\n        return 'old'",
            "%%step make\np = P(1)",
            "class P:\n    def __init__(self, v):\n        self.v = v\n    def show(self):\n        return 'new'",
        ],
        ["isinstance(p, P)", "p.show()"],
    ),
]

UNRESTORABLE = [
    Case(
        "lru-cache-function-defined-in-step",
        "unrestorable",
        [
            "import functools",
            "%%step cache\n@functools.lru_cache\ndef f(x):\n    tick('f')\n    return x * 2\ny = f(2)",
            "print(f(2), f(3))",
        ],
        ["y"],
    ),
    Case(
        "lock-in-step",
        "unrestorable",
        ["import threading", "%%step make\nlock = threading.Lock()\nn = 1", "print(n)"],
        ["n", "lock.locked()"],
    ),
    Case(
        "generator-and-substep",
        "unrestorable",
        [
            "def fetch(q):\n    tick('fetch')\n    return q.upper()",
            "%%step make\nans = step('fetch', fetch, 'q')\ngen = (c for c in ans)",
            "print(ans, next(gen))",
        ],
        ["ans"],
    ),
]

CASES = SHARING + MUTATION + PROCESS + ITERATORS + HISTORY + CLASSES + UNRESTORABLE

#: Cases that fail against the library today, and what differs. A strict xfail:
#: a fix that makes one pass must remove it from here.
FAILS_TODAY: dict[str, str] = {}


@pytest.mark.parametrize("case", params(CASES, FAILS_TODAY))
def test_replay_restores_plain_state(case: Case, tmp_path):
    plain_dir = Workdir(tmp_path / "plain")
    plain_dir.write(case.files)
    plain = plain_dir.run(plain_cells(case.cells, case.probes), durable=False)
    check_plain(plain)

    wd = Workdir(tmp_path / "durable")
    wd.write(case.files)
    cells = durable_cells(case.cells, case.probes)
    first = wd.run(cells, durable=True)
    restart = wd.run(cells, durable=True)
    problems = []
    if (why := verdict(plain, first, rerun_ok=False)) is not None:
        problems.append(f"first durable run: {why}")
    if first.calls != plain.calls:
        problems.append(f"first durable run made calls {first.calls}, the plain run {plain.calls}")
    if (why := verdict(plain, restart)) is not None:
        problems.append(f"restart: {why}")
    assert not problems, "\n".join(problems)


def test_unrestorable_record_is_warned_at_record_time(tmp_path):
    """A record that can never be restored is found when it is written, and said then."""
    case = next(c for c in CASES if c.id == "lru-cache-function-defined-in-step")
    wd = Workdir(tmp_path)
    first = wd.run(durable_cells(case.cells, case.probes), durable=True)
    step_cell = first.step_cells()[0]
    assert any(re.search(r"\bf\b", note) for note in first.notes[step_cell]), first.notes


def test_corpus_is_large_enough():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"
