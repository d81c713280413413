"""An unchanged notebook never reruns: three restarts replay every step and make no call.

Each notebook makes one value of a kind users hold (pandas with object
columns, sets of strings, nested containers, NumPy, dataclasses, notebook
classes, datetimes, Decimal...) three ways: returned by a sub-step, built
directly in a step, and read by a later step that also passes it to a
sub-step. It runs durable once, then three times more in fresh kernels,
each with another PYTHONHASHSEED (string hashing, hence set order, differs
per process). Every restart must replay every step and make no call: a
fingerprint that depends on the process is a spurious rerun.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from fidelity_harness import Workdir, durable_cells, params

pytestmark = [pytest.mark.kernel, pytest.mark.fidelity]

SEEDS = ("0", "11", "222", "3333")  # the first durable run, then three restarts


@dataclass
class Kind:
    """A kind of value: the setup cell it needs and the expression that makes it."""

    id: str
    category: str
    expr: str
    setup: str = ""


def cells(kind: Kind) -> list[str]:
    """The notebook of one kind: a setup cell and three steps around one value."""
    setup = (
        f"{kind.setup}\n"
        "def make():\n"
        "    tick('make')\n"
        f"    return {kind.expr}\n"
        "def echo(v):\n"
        "    tick('echo')\n"
        "    return type(v).__name__"
    )
    return [
        setup.lstrip("\n"),
        "%%step make\nv = step('make', make)",
        f"%%step direct\nu = {kind.expr}",
        "%%step use\nname = step('echo', echo, v)\nsame = type(u) is type(v)\nprint(name, same)",
    ]


NP = "import numpy as np"
PD = "import pandas as pd"
DC = "from dataclasses import dataclass, field"

KINDS = [
    # builtins and nested containers
    Kind("scalars", "builtins", "{'i': 1, 'f': 2.5, 's': 'x', 'b': b'y', 'n': None, 't': True}"),
    Kind("nested-containers", "builtins", "{'a': [1, (2, 3)], 'b': {'c': None, 'd': [[], {}]}}"),
    Kind("set-of-strings", "builtins", "{'apple', 'banana', 'cherry', 'date'}"),
    Kind("frozenset-of-strings", "builtins", "frozenset({'red', 'green', 'blue'})"),
    Kind("set-of-ints", "builtins", "{3, 1, 2, 1000}"),
    Kind("dict-of-sets", "builtins", "{'k': {'x', 'y', 'z'}, 'l': set()}"),
    Kind("list-of-string-tuples", "builtins", "[('a', 'b'), ('c', 'd')] * 3"),
    Kind("mixed-key-dict", "builtins", "{1: 'one', 'two': 2, (3, 'x'): frozenset({'q', 'r'})}"),
    Kind("many-strings", "builtins", "[f'item-{i}' for i in range(1000)]"),
    Kind("bytes-and-bytearray", "builtins", "(b'abc', bytearray(b'def'))"),
    Kind("range-and-slice", "builtins", "(range(2, 10, 3), slice(1, None, 2))"),
    Kind("complex-and-nan", "builtins", "[1 + 2j, float('nan'), float('inf')]"),
    Kind("empty-containers", "builtins", "([], {}, set(), (), '')"),
    # the standard library
    Kind(
        "collections",
        "stdlib",
        "(OrderedDict(b=1, a=2), Counter('hello'), defaultdict(list, {'k': [1]}), deque([1, 2]))",
        "from collections import Counter, OrderedDict, defaultdict, deque",
    ),
    Kind(
        "datetimes",
        "stdlib",
        "(dt.datetime(2024, 5, 1, 12, 30), dt.date(2024, 1, 2), dt.timedelta(hours=3))",
        "import datetime as dt",
    ),
    Kind(
        "aware-datetime",
        "stdlib",
        "dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)",
        "import datetime as dt",
    ),
    Kind(
        "decimal-and-fraction",
        "stdlib",
        "(Decimal('1.10'), Fraction(1, 3))",
        "from decimal import Decimal\nfrom fractions import Fraction",
    ),
    Kind("uuid", "stdlib", "uuid.UUID('12345678-1234-5678-1234-567812345678')", "import uuid"),
    Kind("path", "stdlib", "pathlib.PurePosixPath('data/file.csv')", "import pathlib"),
    # NumPy
    Kind("numpy-float", "numpy", "np.linspace(0, 1, 50)", NP),
    Kind("numpy-strings", "numpy", "np.array(['a', 'bb', 'ccc'])", NP),
    Kind("numpy-object", "numpy", "np.array(['a', {'x'}, None], dtype=object)", NP),
    Kind(
        "numpy-structured",
        "numpy",
        "np.array([(1, 2.0), (3, 4.0)], dtype=[('a', 'i4'), ('b', 'f8')])",
        NP,
    ),
    Kind("numpy-2d-int", "numpy", "np.arange(12).reshape(3, 4)", NP),
    # pandas
    Kind("pandas-numeric", "pandas", "pd.DataFrame({'x': [1, 2, 3], 'y': [0.5, 1.5, 2.5]})", PD),
    Kind(
        "pandas-object-strings",
        "pandas",
        "pd.DataFrame({'name': ['ann', 'bob'], 'city': ['x', None]})",
        PD,
    ),
    Kind(
        "pandas-column-of-sets",
        "pandas",
        "pd.DataFrame({'tags': [{'a', 'b', 'c'}, {'d', 'e'}]})",
        PD,
    ),
    Kind(
        "pandas-column-of-dicts",
        "pandas",
        "pd.DataFrame({'meta': [{'k': 1}, {'k': 2, 'j': 'x'}]})",
        PD,
    ),
    Kind("pandas-series-string-index", "pandas", "pd.Series([1, 2], index=['alpha', 'beta'])", PD),
    Kind("pandas-categorical", "pandas", "pd.Series(pd.Categorical(['lo', 'hi', 'lo']))", PD),
    Kind(
        "pandas-datetimes",
        "pandas",
        "pd.DataFrame({'t': pd.date_range('2024-01-01', periods=3)})",
        PD,
    ),
    # classes defined in the notebook
    Kind(
        "dataclass",
        "classes",
        "Pt(1, 'a')",
        f"{DC}\n@dataclass\nclass Pt:\n    x: int\n    label: str",
    ),
    Kind(
        "dataclasses-with-sets",
        "classes",
        "[Doc('a', {'x', 'y'}), Doc('b', {'z'})]",
        f"{DC}\n@dataclass\nclass Doc:\n    name: str\n    tags: set = field(default_factory=set)",
    ),
    Kind(
        "frozen-dataclass",
        "classes",
        "Key('k', frozenset({'p', 'q'}))",
        f"{DC}\n@dataclass(frozen=True)\nclass Key:\n    name: str\n    parts: frozenset",
    ),
    Kind(
        "plain-class-with-set",
        "classes",
        "Bag({'s', 't', 'u'})",
        "class Bag:\n    def __init__(self, items):\n        self.items = items\n        self.n = len(items)",
    ),
    Kind(
        "slots-class",
        "classes",
        "Point(1, 2)",
        "class Point:\n    __slots__ = ('x', 'y')\n    def __init__(self, x, y):\n        self.x, self.y = x, y",
    ),
    Kind(
        "namedtuple",
        "classes",
        "Row('a', 1)",
        "from collections import namedtuple\nRow = namedtuple('Row', 'k v')",
    ),
    Kind(
        "enum-member",
        "classes",
        "Color.RED",
        "import enum\nclass Color(enum.Enum):\n    RED = 1\n    BLUE = 2",
    ),
]

#: Kinds whose steps rerun spuriously today, and why. A strict xfail: a fix
#: that makes one pass must remove it from here.
FAILS_TODAY: dict[str, str] = {}


@pytest.mark.parametrize("kind", params(KINDS, FAILS_TODAY))
def test_unchanged_notebook_replays_every_step_after_restarts(kind: Kind, tmp_path):
    wd = Workdir(tmp_path)
    sources = durable_cells(cells(kind), ["name", "same"])
    first = wd.run(sources, durable=True, hashseed=SEEDS[0])
    errors = [o for outs in first.outputs for o in outs if o["output_type"] == "error"]
    assert not errors, f"the first durable run fails: {errors}"
    assert first.calls == ["make", "echo"], first.calls
    problems = []
    for seed in SEEDS[1:]:
        again = wd.run(sources, durable=True, hashseed=seed)
        rerun = [
            again.sources[i].split("\n", 1)[0] for i in again.step_cells() if not again.replayed(i)
        ]
        if rerun or again.calls:
            said = [n for i in again.step_cells() for n in again.notes[i] if n != "replayed"]
            problems.append(
                f"PYTHONHASHSEED={seed}: steps not replayed {rerun}, calls made {again.calls}"
                + (f"; nbdurable said {said}" if said else "")
            )
        if again.probe != first.probe:
            problems.append(f"PYTHONHASHSEED={seed}: probe {again.probe!r} != {first.probe!r}")
    assert not problems, "\n".join(problems)


def test_corpus_is_large_enough():
    assert len(KINDS) >= 30
    assert len({k.id for k in KINDS}) == len(KINDS), "kind ids must be unique"
