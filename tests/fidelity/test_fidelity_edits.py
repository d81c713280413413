"""A change is never missed: after an edit, the durable rerun equals a plain run of the edited notebook.

Each case runs its notebook durable, then edits it the way users do (a
cell's code, the function a sub-step calls, a lambda, an ``@recorded`` body,
a global a call reads, ``helpers.py`` beside the notebook, a data file, an
environment variable, a trailing ``;``...) and runs it durable again in a
fresh kernel on the same store. That rerun is compared with a plain run of
the edited notebook (see fidelity_harness). Every function standing for a
costly call ticks the call log; ``remade`` lists the calls whose code or
inputs the edit changed, which the rerun must really make again, never
replay.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import pytest
from fidelity_harness import Workdir, check_plain, durable_cells, params, plain_cells, verdict

pytestmark = [pytest.mark.kernel, pytest.mark.fidelity]


@dataclass
class Edit:
    """A notebook before and after an edit, the files and environment of each."""

    id: str
    category: str
    before: list[str]
    after: list[str]
    probes: list[str]
    files_before: dict[str, str | bytes] = field(default_factory=dict)
    files_after: dict[str, str | bytes] = field(default_factory=dict)
    env_before: dict[str, str] = field(default_factory=dict)
    env_after: dict[str, str] = field(default_factory=dict)
    remade: tuple[str, ...] = ()
    nbformat_minor: int = 5


def _npy(values: list[float]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array(values))
    return buf.getvalue()


def _helpers(body: str) -> str:
    """A local module whose calls tick the call log too."""
    return (
        "def _tick(tag):\n"
        "    with open('calls.log', 'a') as fh:\n"
        "        fh.write(tag + '\\n')\n\n" + body
    )


ASK = "def ask(q):\n    tick('ask')\n    return f'{TEMPLATE}:{q}'"

CODE = [
    Edit(
        "cell-code",
        "code",
        ["def f(x):\n    tick('f')\n    return x * 2", "%%step s\nx = step('f', f, 2)\ny = x + 1"],
        ["def f(x):\n    tick('f')\n    return x * 2", "%%step s\nx = step('f', f, 2)\ny = x + 2"],
        ["x", "y"],
    ),
    Edit(
        "callee-edited-in-plain-cell",
        "code",
        [
            "def ask(q):\n    tick('ask')\n    return f'short answer to {q}'",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        [
            "def ask(q):\n    tick('ask')\n    return f'long answer to {q}'",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "callee-defined-in-the-step",
        "code",
        ["%%step s\ndef ask(q):\n    tick('ask')\n    return 'v1 ' + q\na = step('ask', ask, 'q')"],
        ["%%step s\ndef ask(q):\n    tick('ask')\n    return 'v2 ' + q\na = step('ask', ask, 'q')"],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "lambda-in-step",
        "code",
        ["%%step s\na = step('ask', lambda q: tick('l') or f'small:{q}', 'q')"],
        ["%%step s\na = step('ask', lambda q: tick('l') or f'large:{q}', 'q')"],
        ["a"],
        remade=("l",),
    ),
    Edit(
        "recorded-body",
        "code",
        ["@recorded\ndef ask(q):\n    tick('ask')\n    return 'v1 ' + q", "%%step s\na = ask('q')"],
        ["@recorded\ndef ask(q):\n    tick('ask')\n    return 'v2 ' + q", "%%step s\na = ask('q')"],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "callee-default-argument",
        "code",
        [
            "def ask(q, style='short'):\n    tick('ask')\n    return style + q",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        [
            "def ask(q, style='long'):\n    tick('ask')\n    return style + q",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "callee-closure-value",
        "code",
        [
            "def make(n):\n    def ask(q):\n        tick('ask')\n        return q * n\n    return ask\nask = make(1)",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        [
            "def make(n):\n    def ask(q):\n        tick('ask')\n        return q * n\n    return ask\nask = make(2)",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "helper-of-callee-edited",
        "code",
        [
            "def fmt(q):\n    return 'v1 ' + q",
            "def ask(q):\n    tick('ask')\n    return fmt(q)",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        [
            "def fmt(q):\n    return 'v2 ' + q",
            "def ask(q):\n    tick('ask')\n    return fmt(q)",
            "%%step s\na = step('ask', ask, 'q')",
        ],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "global-read-by-callee",
        "code",
        ["TEMPLATE = 'small'", ASK, "%%step s\na = step('ask', ask, 'q')"],
        ["TEMPLATE = 'large'", ASK, "%%step s\na = step('ask', ask, 'q')"],
        ["a"],
        remade=("ask",),
    ),
    Edit(
        "global-read-through-lambda",
        "code",
        [
            "MODEL = 'small'\ndef call(m, q):\n    tick('call')\n    return m + ':' + q",
            "%%step s\na = step('ask', lambda: call(MODEL, 'q'))",
        ],
        [
            "MODEL = 'large'\ndef call(m, q):\n    tick('call')\n    return m + ':' + q",
            "%%step s\na = step('ask', lambda: call(MODEL, 'q'))",
        ],
        ["a"],
        remade=("call",),
    ),
    Edit(
        "vectorize-wrapped-function",
        "code",
        [
            "import numpy as np\ndef f(x):\n    return x + 1\nvf = np.vectorize(f)",
            "%%step s\nr = vf(np.arange(3)).tolist()",
        ],
        [
            "import numpy as np\ndef f(x):\n    return x + 2\nvf = np.vectorize(f)",
            "%%step s\nr = vf(np.arange(3)).tolist()",
        ],
        ["r"],
    ),
    Edit(
        "lru-cache-wrapped-function",
        "code",
        [
            "import functools\n@functools.lru_cache\ndef sq(x):\n    return x * x",
            "%%step s\nr = sq(3)",
        ],
        [
            "import functools\n@functools.lru_cache\ndef sq(x):\n    return x * x * x",
            "%%step s\nr = sq(3)",
        ],
        ["r"],
    ),
]

MODULES = [
    Edit(
        "local-module-function",
        "modules",
        ["import helpers", "%%step s\na = step('f', helpers.f, 2)"],
        ["import helpers", "%%step s\na = step('f', helpers.f, 2)"],
        ["a"],
        files_before={"helpers.py": _helpers("def f(x):\n    _tick('f')\n    return x * 1\n")},
        files_after={"helpers.py": _helpers("def f(x):\n    _tick('f')\n    return x * 10\n")},
        remade=("f",),
    ),
    Edit(
        "local-module-setting",
        "modules",
        ["import helpers", "%%step s\na = helpers.scaled(2)"],
        ["import helpers", "%%step s\na = helpers.scaled(2)"],
        ["a"],
        files_before={"helpers.py": "SCALE = 1\ndef scaled(x):\n    return SCALE * x\n"},
        files_after={"helpers.py": "SCALE = 10\ndef scaled(x):\n    return SCALE * x\n"},
    ),
    Edit(
        "function-imported-from-local-module",
        "modules",
        ["from helpers import g", "%%step s\nr = step('g', g, 3)"],
        ["from helpers import g", "%%step s\nr = step('g', g, 3)"],
        ["r"],
        files_before={"helpers.py": _helpers("def g(x):\n    _tick('g')\n    return x + 1\n")},
        files_after={"helpers.py": _helpers("def g(x):\n    _tick('g')\n    return x + 100\n")},
        remade=("g",),
    ),
    Edit(
        "import-inside-the-step",
        "modules",
        ["%%step s\nimport helpers\nr = helpers.VALUE"],
        ["%%step s\nimport helpers\nr = helpers.VALUE"],
        ["r"],
        files_before={"helpers.py": "VALUE = 'old'\n"},
        files_after={"helpers.py": "VALUE = 'new'\n"},
    ),
    Edit(
        "module-the-imported-module-imports",
        "modules",
        ["%%step s\nimport helpers\nr = helpers.VALUE"],
        ["%%step s\nimport helpers\nr = helpers.VALUE"],
        ["r"],
        files_before={"helpers.py": "from consts import VALUE\n", "consts.py": "VALUE = 'old'\n"},
        files_after={"consts.py": "VALUE = 'new'\n"},
    ),
]

_CAT = (
    "%%step s --inputs 'data/*.txt'\nimport glob, subprocess\n"
    "words = subprocess.run(['cat', *sorted(glob.glob('data/*.txt'))],"
    " capture_output=True, text=True).stdout.split()"
)

FILES = [
    Edit(
        "data-file-open",
        "files",
        ["%%step s\nn = len(open('data.txt').read().split())"],
        ["%%step s\nn = len(open('data.txt').read().split())"],
        ["n"],
        files_before={"data.txt": "a b c\n"},
        files_after={"data.txt": "a b c d e\n"},
    ),
    Edit(
        "data-file-np-load",
        "files",
        ["import numpy as np", "%%step s\ntotal = float(np.load('data.npy').sum())"],
        ["import numpy as np", "%%step s\ntotal = float(np.load('data.npy').sum())"],
        ["total"],
        files_before={"data.npy": _npy([1.0, 2.0])},
        files_after={"data.npy": _npy([1.0, 2.0, 30.0])},
    ),
    Edit(
        "data-file-read-csv",
        "files",
        ["import pandas as pd", "%%step s\nrows = len(pd.read_csv('data.csv'))"],
        ["import pandas as pd", "%%step s\nrows = len(pd.read_csv('data.csv'))"],
        ["rows"],
        files_before={"data.csv": "x\n1\n2\n"},
        files_after={"data.csv": "x\n1\n2\n3\n4\n"},
    ),
    Edit(
        "run-script",
        "files",
        ["%%step s\n%run script.py\nr = z"],
        ["%%step s\n%run script.py\nr = z"],
        ["r"],
        files_before={"script.py": "z = 1\n"},
        files_after={"script.py": "z = 2\n"},
    ),
    Edit(
        "env-var-read-by-step",
        "files",
        ["import os", "%%step s\nmode = os.environ.get('FIDELITY_MODE', 'none')"],
        ["import os", "%%step s\nmode = os.environ.get('FIDELITY_MODE', 'none')"],
        ["mode"],
        env_before={"FIDELITY_MODE": "fast"},
        env_after={"FIDELITY_MODE": "slow"},
    ),
    Edit(
        "dynamic-read-globals",
        "files",
        ["x = 1", "%%step s\ny = globals()['x'] * 10"],
        ["x = 2", "%%step s\ny = globals()['x'] * 10"],
        ["y"],
    ),
    Edit(
        "dynamic-read-exec",
        "files",
        ["x = 1", "%%step s\nexec('y = x * 3')"],
        ["x = 2", "%%step s\nexec('y = x * 3')"],
        ["y"],
    ),
    Edit(
        "dynamic-read-vars",
        "files",
        ["x = 1", "%%step s\ny = vars()['x'] + 5"],
        ["x = 2", "%%step s\ny = vars()['x'] + 5"],
        ["y"],
    ),
    Edit(
        "dynamic-read-eval",
        "files",
        ["x = 1", "%%step s\ny = eval('x') + 1"],
        ["x = 2", "%%step s\ny = eval('x') + 1"],
        ["y"],
    ),
    Edit(  # read by a subprocess, which the audit hook cannot see: declared
        "data-file-declared-read-by-subprocess",
        "files",
        [_CAT],
        [_CAT],
        ["words"],
        files_before={"data/a.txt": "a b\n"},
        files_after={"data/a.txt": "a b\n", "data/b.txt": "c\n"},
    ),
]

VALUES = [
    Edit(
        "trailing-semicolon-added",
        "values",
        ["%%step s\nx = 1\nx"],
        ["%%step s\nx = 1\nx;"],
        ["x"],
    ),
    Edit(
        "trailing-semicolon-removed",
        "values",
        ["%%step s\nx = 1\nx;"],
        ["%%step s\nx = 1\nx"],
        ["x"],
    ),
    Edit(
        "dict-key-order",
        "values",
        ["d = {'a': 1, 'b': 2}", "%%step s\ns = ','.join(d)"],
        ["d = {'b': 2, 'a': 1}", "%%step s\ns = ','.join(d)"],
        ["s"],
    ),
    Edit(
        "notebook-class-instance",
        "values",
        [
            "class Box:\n    def __init__(self, v):\n        self.v = v\nbox = Box(50)",
            "%%step s\nr = box.v * 2",
        ],
        [
            "class Box:\n    def __init__(self, v):\n        self.v = v\nbox = Box(60)",
            "%%step s\nr = box.v * 2",
        ],
        ["r"],
    ),
    Edit(
        "notebook-class-instance-as-substep-argument",
        "values",
        [
            "class Box:\n    def __init__(self, v):\n        self.v = v\nbox = Box(50)\n"
            "def use(b):\n    tick('use')\n    return b.v + 1",
            "%%step s\nr = step('use', use, box)",
        ],
        [
            "class Box:\n    def __init__(self, v):\n        self.v = v\nbox = Box(60)\n"
            "def use(b):\n    tick('use')\n    return b.v + 1",
            "%%step s\nr = step('use', use, box)",
        ],
        ["r"],
        remade=("use",),
    ),
    Edit(
        "re-compile",
        "values",
        ["import re\npat = re.compile('a+')", "%%step s\nfound = pat.findall('aabb')"],
        ["import re\npat = re.compile('b+')", "%%step s\nfound = pat.findall('aabb')"],
        ["found"],
    ),
    Edit(
        "array-array",
        "values",
        ["import array\narr = array.array('i', [1, 2])", "%%step s\ntotal = sum(arr)"],
        ["import array\narr = array.array('i', [1, 3])", "%%step s\ntotal = sum(arr)"],
        ["total"],
    ),
    Edit(
        "chainmap",
        "values",
        ["import collections\ncm = collections.ChainMap({'a': 1})", "%%step s\nv = cm['a']"],
        ["import collections\ncm = collections.ChainMap({'a': 2})", "%%step s\nv = cm['a']"],
        ["v"],
    ),
    Edit(
        "itemgetter",
        "values",
        ["import operator\nget = operator.itemgetter(0)", "%%step s\nv = get([5, 6])"],
        ["import operator\nget = operator.itemgetter(1)", "%%step s\nv = get([5, 6])"],
        ["v"],
    ),
    Edit(
        "zoneinfo",
        "values",
        ["import zoneinfo\ntz = zoneinfo.ZoneInfo('UTC')", "%%step s\nname = str(tz)"],
        ["import zoneinfo\ntz = zoneinfo.ZoneInfo('Europe/Paris')", "%%step s\nname = str(tz)"],
        ["name"],
    ),
    Edit(
        "masked-array-mask",
        "values",
        [
            "import numpy as np\nm = np.ma.array([1, 2, 3], mask=[0, 1, 0])",
            "%%step s\ns = int(m.sum())",
        ],
        [
            "import numpy as np\nm = np.ma.array([1, 2, 3], mask=[0, 0, 0])",
            "%%step s\ns = int(m.sum())",
        ],
        ["s"],
    ),
    Edit(
        "float-masked-array-as-substep-argument",
        "values",
        [
            "import numpy as np\nm = np.ma.array([1.0, 2.0], mask=[0, 1])",
            "%%step s\ns = step('sum', lambda a: float(a.sum()), m)",
        ],
        [
            "import numpy as np\nm = np.ma.array([1.0, 2.0], mask=[0, 0])",
            "%%step s\ns = step('sum', lambda a: float(a.sum()), m)",
        ],
        ["s"],
    ),
]

FLOW = [
    Edit(
        "substep-fills-its-argument",
        "flow",
        [
            "def fill(xs):\n    tick('fill')\n    xs.extend([1, 2])",
            "%%step s\nres = []\nstep('fill', fill, res)",
        ],
        [
            "def fill(xs):\n    tick('fill')\n    xs.extend([1, 2])",
            "%%step s\nres = []\nstep('fill', fill, res)\nn = len(res)",
        ],
        ["res"],
    ),
    Edit(
        "cascade-through-plain-cell",
        "flow",
        [
            "Q = 'cats'\ndef search(q):\n    tick('search')\n    return [q + ':1', q + ':2']",
            "%%step find\nresults = step('search', search, Q)",
            "best = results[0]",
            "%%step sum\nsummary = best.upper()",
        ],
        [
            "Q = 'dogs'\ndef search(q):\n    tick('search')\n    return [q + ':1', q + ':2']",
            "%%step find\nresults = step('search', search, Q)",
            "best = results[0]",
            "%%step sum\nsummary = best.upper()",
        ],
        ["summary"],
        remade=("search",),
    ),
    Edit(
        "cascade-after-unsaved-value",
        "flow",
        ["K = 1", "%%step make\ng = (x * K for x in range(3))", "%%step use\nvals = list(g)"],
        ["K = 2", "%%step make\ng = (x * K for x in range(3))", "%%step use\nvals = list(g)"],
        ["vals"],
    ),
    Edit(
        "idempotency-key-after-input-change",
        "flow",
        [
            "TOPIC = 'cats'",
            "import os\ndef send(report, key):\n    tick('send')\n"
            "    sent = open('sent.log').read().split() if os.path.exists('sent.log') else []\n"
            "    if key in sent:\n        return 'dropped as duplicate'\n"
            "    with open('sent.log', 'a') as fh:\n        fh.write(key + '\\n')\n    return 'sent'",
            "%%step notify\nstatus = step('send', send, 'report on ' + TOPIC, idempotency_key('send'))\n"
            "print(status)",
        ],
        [
            "TOPIC = 'dogs'",
            "import os\ndef send(report, key):\n    tick('send')\n"
            "    sent = open('sent.log').read().split() if os.path.exists('sent.log') else []\n"
            "    if key in sent:\n        return 'dropped as duplicate'\n"
            "    with open('sent.log', 'a') as fh:\n        fh.write(key + '\\n')\n    return 'sent'",
            "%%step notify\nstatus = step('send', send, 'report on ' + TOPIC, idempotency_key('send'))\n"
            "print(status)",
        ],
        ["status"],
        remade=("send",),
    ),
]

# Not edits: on the very first run, with no cell ids (nbformat 4.4, as nbclient,
# nbconvert and papermill send none), two identical unnamed step cells must
# each run; a plain run is the yardstick of both durable runs.
IDENTICAL = ["%%step\ntick('cell')\nprint('ran')", "%%step\ntick('cell')\nprint('ran')"]
FIRST_RUN = [
    Edit(
        "identical-unnamed-cells-nbformat-4.4",
        "identity",
        IDENTICAL,
        IDENTICAL,
        ["1"],
        nbformat_minor=4,
    ),
    Edit("identical-unnamed-cells", "identity", IDENTICAL, IDENTICAL, ["1"]),
]

EDITS = CODE + MODULES + FILES + VALUES + FLOW + FIRST_RUN

#: Cases that fail against the library today, and what differs. A strict xfail:
#: a fix that makes one pass must remove it from here.
FAILS_TODAY: dict[str, str] = {}


@pytest.mark.parametrize("case", params(EDITS, FAILS_TODAY))
def test_rerun_after_edit_equals_plain_run_of_edited_notebook(case: Edit, tmp_path):
    plain_dir = Workdir(tmp_path / "plain")
    plain_dir.write({**case.files_before, **case.files_after})
    plain = plain_dir.run(
        plain_cells(case.after, case.probes),
        durable=False,
        env={**case.env_before, **case.env_after},
        nbformat_minor=case.nbformat_minor,
    )
    check_plain(plain)

    wd = Workdir(tmp_path / "durable")
    wd.write(case.files_before)
    first = wd.run(
        durable_cells(case.before, case.probes),
        durable=True,
        env=case.env_before,
        nbformat_minor=case.nbformat_minor,
    )
    wd.write(case.files_after)
    rerun = wd.run(
        durable_cells(case.after, case.probes),
        durable=True,
        env={**case.env_before, **case.env_after},
        nbformat_minor=case.nbformat_minor,
    )
    problems = []
    unedited = case.before == case.after and not case.files_after and not case.env_after
    if unedited and (why := verdict(plain, first, rerun_ok=False)):
        problems.append(f"first durable run: {why}")
    if unedited and first.calls != plain.calls:
        problems.append(f"first durable run made calls {first.calls}, the plain run {plain.calls}")
    if (why := verdict(plain, rerun)) is not None:
        problems.append(f"rerun after the edit: {why}")
    missing = [tag for tag in case.remade if tag not in rerun.calls]
    if missing:
        problems.append(f"calls replayed although the edit changed them: {missing}")
    assert not problems, "\n".join(problems)


def test_one_line_per_step_after_an_input_change(tmp_path):
    """A changed input that re-makes five calls is said in one line, not five warnings."""
    setup = "def ask(topic, i):\n    tick('ask')\n    return f'{topic}:{i}'"
    body = "%%step research\nnotes = [step(f'ask:{i}', ask, TOPIC, i) for i in range(5)]"
    wd = Workdir(tmp_path)
    wd.run(durable_cells(["TOPIC = 'cats'", setup, body], ["notes"]), durable=True)
    rerun = wd.run(durable_cells(["TOPIC = 'dogs'", setup, body], ["notes"]), durable=True)
    assert rerun.calls == ["ask"] * 5, rerun.calls
    said = rerun.notes[rerun.step_cells()[0]]
    assert len(said) <= 1, f"{len(said)} messages: {said}"


def test_same_step_name_in_two_cells_is_a_usage_error(tmp_path):
    """Two cells naming the same step: a one-line UsageError naming both cells."""
    cells = ["%%step load\nx = 1", "%%step load\ny = 2"]
    run = Workdir(tmp_path).run(durable_cells(cells, ["x"]), durable=True)
    # IPython shows a magic's UsageError as one stderr line, not as an error output.
    step_outputs = [run.outputs[i] for i in run.step_cells()]
    for outs in step_outputs:
        text = "".join(o.get("text", "") for o in outs if o.get("name") == "stderr")
        assert text.startswith("UsageError: ") and text.count("\n") == 1, step_outputs
        assert "'load'" in text and "#2, #3" in text, text


def test_corpus_is_large_enough():
    assert len(EDITS) >= 30
    assert len({c.id for c in EDITS}) == len(EDITS), "case ids must be unique"
