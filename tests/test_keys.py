"""Unit tests for nbdurable.identity.keys: source normalization, analysis, fingerprints, names."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import threading
import types
import uuid

import numpy as np
import pytest

import nbdurable
from nbdurable.errors import UsageProblem
from nbdurable.identity.keys import (
    CellAnalysis,
    analyse,
    args_fingerprint,
    fingerprint,
    normalize_source,
    source_fingerprint,
    step_key,
    validate_name,
    validate_sub_id,
)

# -- source -------------------------------------------------------------------


def test_comment_and_formatting_edits_keep_the_source_fingerprint():
    a = "x = f(1, 2)\ny = x + 1\n"
    b = "# load\n\nx = f( 1,2 )   # trailing\n\n\n\ny = (x + 1)\n   \n"
    assert normalize_source(a) == normalize_source(b)
    assert source_fingerprint(a) == source_fingerprint(b)
    assert len(source_fingerprint(a)) == 32


@pytest.mark.parametrize(
    "edited",
    [
        "x = f(1, 3)\ny = x + 1\n",
        "x = f(1, 2)\ny = x - 1\n",
        "x = f(1, 2)\n",
        "x = f(1.0, 2)\ny = x + 1",
    ],
)
def test_code_edits_change_the_source_fingerprint(edited):
    assert source_fingerprint("x = f(1, 2)\ny = x + 1\n") != source_fingerprint(edited)


def test_top_level_await_parses_as_python():
    assert normalize_source("await   asyncio.sleep( 1 )  # nap") == "await asyncio.sleep(1)"
    assert normalize_source("async with a as b:\n  pass") == "async with a as b:\n    pass"


def test_unparseable_source_falls_back_to_text():
    src = "x = (\n  # comment\n\n   1   \n"
    assert normalize_source(src) == "x = (\n   1"
    assert source_fingerprint(src) == source_fingerprint("x = (\n\n   1\n# other comment")
    assert source_fingerprint(src) != source_fingerprint("x = (\n   2")


@pytest.mark.parametrize(
    "src",
    ["a\x00b", "x = 1 +", "(" * 500 + ")" * 500, "1" + "+1" * 50_000, ""],
    ids=["nul", "incomplete", "deep-parens", "long-sum", "empty"],
)
def test_normalize_source_never_raises(src):
    assert isinstance(normalize_source(src), str)
    assert len(source_fingerprint(src)) == 32


def test_syntax_warnings_are_not_raised_nor_break_parsing():
    # filterwarnings=error would turn a SyntaxWarning into a SyntaxError.
    src = 'x = "\\d"\nif x is 1:\n    pass'
    assert normalize_source(src) == "x = '\\\\d'\nif x is 1:\n    pass"
    assert analyse(src).binds == {"x"}


# -- analysis -----------------------------------------------------------------


def a(src: str) -> CellAnalysis:
    return analyse(textwrap.dedent(src))


@pytest.mark.parametrize(
    "src, reads, binds",
    [
        ("x = f(x)", {"f", "x"}, {"x"}),
        ("x += 1", {"x"}, {"x"}),
        ("x = 1\nx += 1", set(), {"x"}),
        ("for i in xs:\n    total = i", {"xs"}, {"i", "total"}),
        ("findings = []\nfindings.append(1)", set(), {"findings"}),
        ("a, (b, *c) = d", {"d"}, {"a", "b", "c"}),
        ("x: int = y", {"int", "y"}, {"x"}),
        ("x: int", {"int"}, set()),
        (
            "with open(p) as (fh, g):\n    data = fh.read()\nuse(data)",
            {"open", "p", "use"},
            {"fh", "g", "data"},
        ),
        ("import a.b.c\nimport x as y\nfrom m import p, q as r", set(), {"a", "y", "p", "r"}),
        ("from m import *", set(), set()),
        ("def f(a, *b, c=d, **e) -> R:\n    return a + b + c + e + g", {"d", "R", "g"}, {"f"}),
        ("async def f():\n    await g()", {"g"}, {"f"}),
        ("class A(B, metaclass=M):\n    x = 1\n    y = x + z", {"B", "M", "z"}, {"A"}),
        ("if (n := len(a)) > 1:\n    print(n)", {"len", "a", "print"}, {"n"}),
        ("del x", set(), {"x"}),
        ("try:\n    pass\nexcept E as e:\n    pass", {"E"}, {"e"}),
        ("lambda q: q + w", {"w"}, set()),
        ("[x * k for x in xs if x > t]", {"k", "xs", "t"}, set()),
        ("{k: v for k, v in d.items()}", {"d"}, set()),
        ("[y for x in xs for y in x]", {"xs"}, set()),
    ],
)
def test_reads_and_binds(src, reads, binds):
    result = a(src)
    assert result.reads == reads
    assert result.binds == binds


def test_name_bound_before_a_def_is_not_read_by_it():
    assert a("k = 2\ndef f(x):\n    return x * k\nf(1)").reads == set()
    # Bound only after the def: read where the def appears (conservative).
    assert a("def f(x):\n    return x * k\nk = 2").reads == {"k"}


def test_function_locals_params_and_nonlocals_are_not_reads():
    src = """
    def outer(p):
        x = 1
        def inner():
            nonlocal x
            x += p
            return x + free
        return inner
    """
    assert a(src).reads == {"free"}


def test_locals_anywhere_in_a_function_are_local_everywhere():
    src = """
    def f():
        print(v)
        v = 1
    """
    assert "v" not in a(src).reads


def test_global_in_a_function_binds_and_reads():
    src = """
    def bump():
        global counter, seen
        counter += 1
        seen = True
    """
    result = a(src)
    assert result.binds == {"bump", "counter", "seen"}
    assert result.reads == {"counter"}


def test_global_declared_in_an_inner_function_skips_the_outer_local():
    src = """
    def outer():
        x = 1
        def inner():
            global x
            return x
    """
    assert a(src).reads == {"x"}


def test_methods_do_not_see_class_variables():
    src = """
    class A:
        z = 1
        def m(self):
            return z
        w = [z for _ in range(3)]
    """
    assert a(src).reads == {"z", "range"}


def test_decorators_defaults_and_bases_are_read_at_definition():
    src = """
    @register(kind)
    class C(Base):
        @property
        def p(self, d=default):
            return 1
    """
    assert a(src).reads == {"register", "kind", "Base", "property", "default"}


def test_conditional_binding_still_reads():
    assert a("if c:\n    y = 1\nprint(y)").reads == {"c", "print", "y"}
    assert a("if c:\n    y = 1\nelse:\n    y = 2\nprint(y)").reads == {"c", "print"}
    assert a("if c:\n    y = 1\nelse:\n    raise ValueError\nprint(y)").reads == {
        "c",
        "print",
        "ValueError",
    }
    assert "y" in a("for i in r:\n    y = i\nprint(y)").reads
    assert "y" in a("while c:\n    y = 1\nprint(y)").reads
    assert "y" in a("x or (y := 1)\nprint(y)").reads


def test_try_paths():
    src = """
    try:
        import fast as impl
    except ImportError:
        impl = None
    impl.run()
    """
    assert a(src).reads == {"ImportError"}
    assert "data" in a("try:\n    data = load()\nexcept Exception:\n    pass\nuse(data)").reads
    assert "e" in a("try:\n    pass\nexcept E as e:\n    pass\nprint(e)").reads
    assert "y" not in a("try:\n    pass\nfinally:\n    y = 1\nprint(y)").reads


def test_with_suppress_may_skip_its_body():
    assert "v" in a("with suppress(KeyError):\n    v = d[k]\nuse(v)").reads
    assert "v" not in a("with lock:\n    v = d[k]\nuse(v)").reads


def test_match_statement():
    src = """
    match p:
        case Point(x=0, y=yy) if yy > limit:
            print(yy)
        case [first, *rest]:
            pass
        case {"k": v, **kw}:
            pass
        case Color.RED | other:
            pass
    """
    result = a(src)
    assert result.binds == {"yy", "first", "rest", "v", "kw", "other"}
    assert result.reads == {"p", "Point", "limit", "print", "Color"}


def test_walrus_in_a_comprehension_binds_outside():
    result = a("hits = [m for s in ss if (m := find(s))]")
    assert result.binds == {"hits", "m"}
    assert {"ss", "find"} <= result.reads


@pytest.mark.parametrize(
    "src, mutates",
    [
        ("x[k] = 1", {"x"}),
        ("x.attr = 1", {"x"}),
        ("x[k] += 1", {"x"}),
        ("x.a.b[0] = 1", {"x"}),
        ("del x[k]\ndel y.a", {"x", "y"}),
        ("x.append(1)\ny.a.extend([])\nz.anything()", {"x", "y", "z"}),
        ("f(x).append(1)", set()),
        ("for r in rows:\n    if r:\n        r['k'] = 1", {"r", "rows"}),
        ("for r in rows:\n    print(r)", set()),
        ("with open(p) as f:\n    for line in f:\n        acc.add(line)", {"acc"}),
        ("def f():\n    results.append(1)\n    local = []\n    local.append(2)", {"results"}),
        ("def f():\n    global g\n    g = []\n    g.append(1)", {"g"}),
        ("class A:\n    items = []\n    items.append(1)\n    registry.add(1)", {"registry"}),
        ("x = 1", set()),
    ],
)
def test_mutates(src, mutates):
    assert a(src).mutates == mutates


def test_mutated_names_are_also_read():
    result = a("x[k] = v")
    assert result.reads == {"x", "k", "v"}
    assert result.binds == set()


def test_has_await():
    assert a("await f()").has_await
    assert a("async for x in y:\n    pass").has_await
    assert a("async with y:\n    pass").has_await
    assert a("r = [await g(x) for x in xs]").has_await
    assert a("r = [x async for x in xs]").has_await
    assert not a("async def f():\n    await g()").has_await
    assert not a("x = 1").has_await


def test_unparseable_cell_gets_an_empty_analysis():
    assert analyse("x = = 1") == CellAnalysis(frozenset(), frozenset(), frozenset(), False)


def test_too_deep_cell_gets_a_conservative_analysis():
    src = "y = x" + " + x" * 5000 + "\nz.q = y"
    result = analyse(src)
    assert "x" in result.reads
    assert {"y"} <= result.binds
    assert "z" in result.mutates


def test_analysis_is_frozen():
    result = a("x = 1")
    assert isinstance(result.reads, frozenset)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reads = frozenset()  # type: ignore[misc]


# -- fingerprints: data -------------------------------------------------------


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1


@dataclasses.dataclass
class Point:
    x: int
    y: list


Pair = collections.namedtuple("Pair", "a b")


DISTINCT = [
    None,
    True,
    False,
    0,
    1,
    -1,
    10**5000,
    1.0,
    -0.0,
    0.0,
    float("nan"),
    float("inf"),
    1j,
    "1",
    "",
    b"1",
    bytearray(b"1"),
    memoryview(b"1"),
    (1,),
    [1],
    {1},
    frozenset({1}),
    {1: 1},
    {"1": 1},
    (),
    [],
    {},
    set(),
    [[]],
    [(), ()],
    ([],),
    range(3),
    range(0, 3, 2),
    slice(1, 2),
    decimal.Decimal("1.0"),
    decimal.Decimal("1.00"),
    fractions.Fraction(1, 3),
    datetime.datetime(2024, 1, 2, 3, 4, 5),
    datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
    datetime.date(2024, 1, 2),
    datetime.time(3, 4, 5),
    datetime.timedelta(days=1),
    uuid.UUID(int=1),
    pathlib.PurePosixPath("/x"),
    pathlib.PureWindowsPath("/x"),
    Color.RED,
    Color.BLUE,
    Level.LOW,
    Point(1, [2]),
    Point(1, [3]),
    Pair(1, 2),
    collections.OrderedDict(a=1),
    collections.defaultdict(list),
    collections.defaultdict(int),
    collections.Counter("a"),
    collections.deque([1]),
    types.SimpleNamespace(a=1),
    types.SimpleNamespace(a=2),
    np.int64(1),
    np.int32(1),
    np.float64(1.0),
    np.array([1]),
    np.array([1.0]),
    np.array([[1]]),
    np.array([1], dtype=">i8"),
    np.add,
    np.multiply,
    ...,
    NotImplemented,
    math,
    json,
    int,
    float,
    len,
    math.sqrt,
    str.upper,
    [].append,
]


def test_types_and_values_are_distinguished():
    fps = [fingerprint(v) for v in DISTINCT]
    clashes = [
        (DISTINCT[i], DISTINCT[j]) for i in range(len(fps)) for j in range(i) if fps[i] == fps[j]
    ]
    assert clashes == []
    assert all(len(f) == 32 and int(f, 16) >= 0 for f in fps)


@pytest.mark.parametrize(
    "make",
    [
        lambda: [1, "a", (2.5, None), {"k": [b"x"]}],
        lambda: {"b": 1, "a": {1, 2, 3}},
        lambda: Point(1, [2, {"z"}]),
        lambda: datetime.datetime(
            2024, 1, 2, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
        ),
        lambda: np.arange(12.0).reshape(3, 4),
        lambda: float("nan"),
        lambda: 10**5000,
    ],
)
def test_equal_content_gives_equal_fingerprints(make):
    assert fingerprint(make()) == fingerprint(make())


def test_sets_ignore_order_and_dicts_keep_it():
    words = [f"w{i}" for i in range(200)]
    assert fingerprint(set(words)) == fingerprint(set(reversed(words)))
    assert fingerprint(frozenset(words)) == fingerprint(frozenset(reversed(words)))
    # Key order is semantic: ",".join(d) and list(d) see it.
    assert fingerprint({1: "a", 2: "b"}) != fingerprint({2: "b", 1: "a"})
    assert fingerprint({1: "a"}) != fingerprint({"a": 1})
    assert fingerprint({1: "a", 2: "b"}) != fingerprint({1: "b", 2: "a"})
    assert fingerprint({"k": {1, 2}}) == fingerprint({"k": {2, 1}})


def test_container_element_boundaries_are_unambiguous():
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])
    assert fingerprint([[1], 2]) != fingerprint([[1, 2]])
    assert fingerprint({"a": [1], "b": 2}) != fingerprint({"a": [1, "b", 2]})
    assert fingerprint((b"a", b"")) != fingerprint((b"", b"a"))


def test_subclasses_hash_content_and_type():
    class MyList(list):
        pass

    class MyStr(str):
        pass

    assert fingerprint(MyList([1])) != fingerprint([1])
    assert fingerprint(MyList([1])) == fingerprint(MyList([1]))
    assert fingerprint(MyList([1])) != fingerprint(MyList([2]))
    assert fingerprint(MyStr("a")) != fingerprint(MyStr("b"))


def test_cycles_end_in_a_back_reference():
    a1: list = []
    a1.append(a1)
    a2: list = []
    a2.append(a2)
    assert fingerprint(a1) == fingerprint(a2)
    b: list = []
    b.append([b])
    assert fingerprint(a1) != fingerprint(b)
    d: dict = {}
    d["self"] = d
    assert len(fingerprint(d)) == 32
    shared = [1]
    assert fingerprint([shared, shared]) == fingerprint([[1], [1]])  # a DAG is not a cycle


def test_very_deep_nesting_does_not_overflow():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert len(fingerprint(deep)) == 32
    nested: frozenset = frozenset()
    for _ in range(20_000):
        nested = frozenset({nested})
    assert len(fingerprint(nested)) == 32
    chain: dict = {}
    for i in range(50_000):
        chain = {i: chain}
    assert len(fingerprint(chain)) == 32


def test_large_values_are_hashed_in_place():
    # How fast is bench/'s to say (no timed assertion here); what makes it fast is
    # testable: a 100 MB array is hashed over its own buffer, never copied, and a
    # long list of ints costs no per-item objects that outlive the call.
    import tracemalloc

    ints = list(range(100_000))
    array = np.ones(100 * 2**20 // 8)
    tracemalloc.start()
    try:
        first = fingerprint(array)
        _, peak = tracemalloc.get_traced_memory()
        assert fingerprint(ints) == fingerprint(list(range(100_000)))
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"fingerprinting a 100 MB array allocated {peak >> 20} MB"
    array[-1] = 2.0
    assert fingerprint(array) != first  # the last byte counts: the whole buffer is hashed


# -- fingerprints: numpy ------------------------------------------------------


def test_numpy_arrays_by_dtype_shape_and_bytes():
    base = np.arange(20, dtype=np.float64).reshape(4, 5)
    assert fingerprint(base) == fingerprint(base.copy())
    assert fingerprint(base) != fingerprint(base.astype(np.float32))
    assert fingerprint(base) != fingerprint(base.reshape(5, 4))
    changed = base.copy()
    changed[3, 4] += 1
    assert fingerprint(base) != fingerprint(changed)
    # A strided view hashes like its contiguous copy.
    assert fingerprint(base[:, ::2]) == fingerprint(np.ascontiguousarray(base[:, ::2]))
    assert fingerprint(base.T) == fingerprint(np.ascontiguousarray(base.T))
    assert fingerprint(np.array(3.0)) != fingerprint(np.array([3.0]))


def test_numpy_special_dtypes():
    dates = np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[ns]")
    assert fingerprint(dates) == fingerprint(dates.copy())
    assert fingerprint(dates) != fingerprint(dates.astype("datetime64[s]"))
    objects = np.array([1, "a", None, [2]], dtype=object)
    assert fingerprint(objects) == fingerprint(np.array([1, "a", None, [2]], dtype=object))
    assert fingerprint(objects) != fingerprint(np.array([1, "a", None, [3]], dtype=object))
    records = np.zeros(3, dtype=[("a", "i4"), ("b", "f8")])
    assert fingerprint(records) != fingerprint(np.zeros(3, dtype=[("c", "i4"), ("b", "f8")]))
    assert fingerprint(np.array([], dtype=np.int8)) != fingerprint(np.array([], dtype=np.int16))


def test_numpy_scalars():
    assert fingerprint(np.float64(1.5)) == fingerprint(np.float64(1.5))
    assert fingerprint(np.float64(1.5)) != fingerprint(np.float64(2.5))
    assert fingerprint(np.float64(1.5)) != fingerprint(1.5)
    assert fingerprint(np.str_("a")) != fingerprint("a")


# -- fingerprints: code -------------------------------------------------------


def _define(src: str, filename: str = "<cell>", namespace: dict | None = None):
    ns: dict = {} if namespace is None else namespace
    # dont_inherit: this module's `from __future__ import annotations` would change co_flags.
    exec(compile(textwrap.dedent(src), filename, "exec", dont_inherit=True), ns)
    return ns


def test_functions_by_code_not_by_file_or_line():
    one = _define("def f(x):\n    return x + 1", "/tmp/ipykernel_1/1.py")["f"]
    two = _define("\n\n\ndef f(x):\n    # moved\n    return x + 1", "/tmp/ipykernel_2/9.py")["f"]
    assert fingerprint(one) == fingerprint(two)
    other = _define("def f(x):\n    return x + 2")["f"]
    assert fingerprint(one) != fingerprint(other)
    renamed_arg = _define("def f(y):\n    return y + 1")["f"]
    assert fingerprint(one) != fingerprint(renamed_arg)


def test_functions_include_the_globals_they_read():
    one = _define("def f():\n    return g", namespace={"g": 1, "unread": 1})["f"]
    two = _define("def f():\n    return g", namespace={"g": 2, "unread": 1})["f"]
    same = _define("def f():\n    return g", namespace={"g": 1, "unread": 2})["f"]
    assert fingerprint(one) != fingerprint(two)
    assert fingerprint(one) == fingerprint(same)


def test_functions_include_defaults_and_nested_code():
    assert fingerprint(_define("def f(x=1): pass")["f"]) != fingerprint(
        _define("def f(x=2): pass")["f"]
    )
    assert fingerprint(_define("def f(*, k=1): pass")["f"]) != fingerprint(
        _define("def f(*, k=2): pass")["f"]
    )
    inner_a = _define("def f():\n    def g():\n        return 1\n    return g")["f"]
    inner_b = _define("def f():\n    def g():\n        return 2\n    return g")["f"]
    assert fingerprint(inner_a) != fingerprint(inner_b)
    assert fingerprint(lambda x: x + 1) != fingerprint(lambda x: x + 2)


def test_closures_and_decorators():
    def deco(func):
        @functools.wraps(func)
        def wrapper(*args):
            return func(*args)

        return wrapper

    @deco
    def plus1(x):
        return x + 1

    @deco
    def plus2(x):
        return x + 2

    assert fingerprint(plus1.__code__) == fingerprint(plus2.__code__)  # same wrapper code
    assert fingerprint(plus1) != fingerprint(plus2)

    def make(k):
        return lambda x: x * k

    assert fingerprint(make(2)) == fingerprint(make(2))
    assert fingerprint(make(2)) != fingerprint(make(3))


def test_recursive_closures_terminate():
    def outer():
        def again(n):
            return again(n - 1) if n else 0

        return again

    assert fingerprint(outer()) == fingerprint(outer())

    def empty_cell():
        def inner():
            return later

        return inner
        later = 1  # noqa: F841 - never runs: the cell stays empty

    assert len(fingerprint(empty_cell())) == 32


def test_partial_methods_and_wrappers():
    assert fingerprint(functools.partial(int, base=2)) == fingerprint(
        functools.partial(int, base=2)
    )
    assert fingerprint(functools.partial(int, base=2)) != fingerprint(
        functools.partial(int, base=8)
    )
    assert fingerprint(functools.partial(int, "1")) != fingerprint(functools.partial(float, "1"))

    class A:
        def m(self):
            return 1

    class B(A):
        pass

    assert fingerprint(A().m) == fingerprint(A().m)
    assert fingerprint(A().m) != fingerprint(B().m)
    assert fingerprint(staticmethod(len)) != fingerprint(classmethod(len))
    assert fingerprint(property(lambda s: 1)) != fingerprint(property(lambda s: 2))
    assert fingerprint(math.sqrt) != fingerprint(math.floor)


def test_classes_by_name_and_main_classes_by_content():
    def make(body: str):
        cls = _define(f"class K:\n{textwrap.indent(textwrap.dedent(body), '    ')}")["K"]
        cls.__module__ = "__main__"  # as if defined in the notebook
        return cls

    one = make("def m(self):\n    return 1\nrate = 0.1")
    assert fingerprint(one) == fingerprint(make("def m(self):\n    return 1\nrate = 0.1"))
    assert fingerprint(one) != fingerprint(make("def m(self):\n    return 2\nrate = 0.1"))
    assert fingerprint(one) != fingerprint(make("def m(self):\n    return 1\nrate = 0.2"))
    with_super = make("def __init__(self):\n    super().__init__()")
    assert len(fingerprint(with_super)) == 32  # the __class__ cell is a cycle
    # A library class is hashed by name only.
    assert fingerprint(collections.OrderedDict) == fingerprint(collections.OrderedDict)
    assert fingerprint(collections.OrderedDict) != fingerprint(collections.Counter)


def test_modules_by_name():
    assert fingerprint(math) == fingerprint(sys.modules["math"])
    assert fingerprint(math) != fingerprint(json)


# -- fingerprints: opaque objects and the escape hatch ------------------------


def test_opaque_objects_by_type_only():
    assert fingerprint(threading.Lock()) == fingerprint(threading.Lock())
    assert fingerprint(threading.Lock()) != fingerprint(threading.RLock())
    with socket.socket() as s1, socket.socket() as s2:
        assert fingerprint(s1) == fingerprint(s2)
    assert fingerprint(x for x in [1]) == fingerprint(x for x in [2])


def test_opaque_objects_never_call_repr():
    class Loud:
        def __repr__(self):
            raise AssertionError("repr was called")

        def __reduce__(self):
            raise AssertionError("pickle was called")

        def __getattr__(self, name):
            raise AssertionError(f"attribute {name} was looked up")

    assert fingerprint(Loud()) == fingerprint(Loud())


def test_escape_hatch():
    class Model:
        def __init__(self, version):
            self.version = version

        def __nbdurable_fingerprint__(self):
            return f"v{self.version}"

    class Blob:
        def __nbdurable_fingerprint__(self):
            return b"v1"

    assert fingerprint(Model(1)) == fingerprint(Model(1))
    assert fingerprint(Model(1)) != fingerprint(Model(2))
    assert fingerprint(Model(1)) != fingerprint(Blob())
    assert fingerprint([Model(1)]) != fingerprint([Model(2)])


def test_escape_hatch_must_return_str_or_bytes():
    class Bad:
        def __nbdurable_fingerprint__(self):
            return 42

    with pytest.raises(TypeError, match="must return str or bytes, got int"):
        fingerprint(Bad())


def test_pandas_like_objects_are_pickled(monkeypatch):
    fake = types.ModuleType("pandas")
    fake_frame = types.ModuleType("pandas.fake_frame")

    class Frame:
        def __init__(self, data):
            self.data = data

    Frame.__module__ = "pandas.fake_frame"
    Frame.__qualname__ = "Frame"
    fake_frame.Frame = Frame
    monkeypatch.setitem(sys.modules, "pandas", fake)
    monkeypatch.setitem(sys.modules, "pandas.fake_frame", fake_frame)
    assert fingerprint(Frame([1, 2])) == fingerprint(Frame([1, 2]))
    assert fingerprint(Frame([1, 2])) != fingerprint(Frame([1, 3]))

    class Unpicklable:
        def __reduce__(self):
            raise TypeError("no")

    Unpicklable.__module__ = "pandas.fake_frame"
    assert fingerprint(Unpicklable()) == fingerprint(Unpicklable())


# -- fingerprints: stable across processes ------------------------------------

_CROSS_PROCESS = """
import json, sys
from nbdurable.identity.keys import fingerprint, args_fingerprint, source_fingerprint
ns = {}
exec(compile(SRC, sys.argv[1], "exec"), ns)
values = {
    "strings": {"alpha", "beta", "gamma", "delta", "epsilon"},
    "frozen": frozenset({("a", 1), ("b", 2), frozenset({"x", "y"})}),
    "dict": {"b": [1, 2.5, None], "a": {"k": b"v"}},
    "sorted_dict": {w: len(w) for w in sorted({"alpha", "beta", "gamma", "delta"})},
    "function": ns["f"],
    "closure": ns["make"](3),
    "class": ns["K"],
}
out = {k: fingerprint(v) for k, v in values.items()}
out["args"] = args_fingerprint((1, "x"), {"b": {1, 2}, "a": None})
out["source"] = source_fingerprint(SRC)
print(json.dumps(out))
"""

_CROSS_SRC = """
def f(x, *, scale=2):
    return {x, "tag"} | {scale}

def make(k):
    def g(v):
        return v * k
    return g

class K:
    def method(self):
        return f(1)
"""


def _fingerprints_in_subprocess(seed: str, filename: str) -> dict:
    root = pathlib.Path(nbdurable.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
    code = f"SRC = {_CROSS_SRC!r}\n{_CROSS_PROCESS}"
    proc = subprocess.run(
        [sys.executable, "-c", code, filename], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fingerprints_are_stable_across_processes_and_hash_seeds():
    first = _fingerprints_in_subprocess("1", "/tmp/ipykernel_111/1.py")
    second = _fingerprints_in_subprocess("4242", "/tmp/ipykernel_222/7.py")
    assert first == second
    # K is defined in the subprocess's __main__, so it is hashed by content there;
    # everything else must also match this process.
    ns = _define(_CROSS_SRC, "/tmp/ipykernel_333/2.py")
    assert first["function"] == fingerprint(ns["f"])
    assert first["closure"] == fingerprint(ns["make"](3))
    assert first["strings"] == fingerprint({"alpha", "beta", "gamma", "delta", "epsilon"})
    assert first["args"] == args_fingerprint((1, "x"), {"a": None, "b": {2, 1}})


# -- args_fingerprint ---------------------------------------------------------


def test_args_fingerprint():
    assert args_fingerprint((1,), {"a": 1, "b": 2}) == args_fingerprint((1,), {"b": 2, "a": 1})
    assert args_fingerprint((1,), {}) != args_fingerprint((), {"x": 1})
    assert args_fingerprint((1, 2), {}) != args_fingerprint((2, 1), {})
    assert args_fingerprint([1], {}) == args_fingerprint((1,), {})


def test_args_fingerprints_are_those_recorded_by_earlier_versions():
    # A recorded call compares its fingerprint on every replay: if these change, every
    # existing store's sub-steps look diverged. Values computed by nbdurable 0.1.0.
    kwargs = {"model": "gpt", "temperature": 0.5, "stop": ["x", None, True]}
    assert args_fingerprint((42, "what is the capital of France?"), kwargs) == (
        "5c3c6097a25e5b80f1d01e801124fc10"
    )
    assert args_fingerprint(([1, [2]],), {}) == "0cdc95a8bf20254c144e1a340466b5d0"  # nested
    assert args_fingerprint((), {}) == "f1bd799adc13ad54f643c2eaf16961a5"


# -- step keys ----------------------------------------------------------------


def test_step_key_prefers_name_then_id_then_position_then_source():
    src = "# setup\n\n  df = load_the_very_large_dataset_from_disk(path)\n"
    assert step_key("load", "abc", 3, src) == ("name:load", "load")
    assert step_key(None, "0123456789ab", 3, src) == ("id:0123456789ab", "cell 01234567")
    assert step_key(None, None, 0, src) == ("pos:0", "cell #1")
    assert step_key(None, "", 4, src) == ("pos:4", "cell #5")
    key, label = step_key(None, None, None, src)
    assert key == "src:" + source_fingerprint(src)[:16]
    assert label == "cell " + "df = load_the_very_large_dataset"[:30]
    assert step_key(None, None, None, "# only\n")[1] == "cell (empty)"


def test_source_keys_survive_formatting_but_not_edits():
    assert step_key(None, None, None, "x=1")[0] == step_key(None, None, None, "x = 1  # c")[0]
    assert step_key(None, None, None, "x=1")[0] != step_key(None, None, None, "x = 2")[0]


def test_step_key_validates_the_name():
    with pytest.raises(UsageProblem, match="step name 'a b' is not allowed"):
        step_key("a b", None, None, "")


# -- names --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["load", "_x", "A1", "stage-2.fit:v3", "a" * 128])
def test_valid_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "a b", "1abc", "-a", "a/b", "é", "a\n", "a" * 129, "ab$"])
def test_invalid_names(name):
    with pytest.raises(UsageProblem) as info:
        validate_name(name)
    message = str(info.value)
    assert message.startswith(f"step name {repr(name)[:57]}")
    assert "use letters, digits, _ . : - (at most 128, starting with a letter or _)" in message
    assert "\n" not in message


def test_invalid_name_message():
    with pytest.raises(UsageProblem) as info:
        validate_name("a b")
    assert str(info.value) == (
        "step name 'a b' is not allowed: use letters, digits, _ . : - "
        "(at most 128, starting with a letter or _)"
    )
    with pytest.raises(UsageProblem, match=r"^run name 'x"):
        validate_name("x" * 200, what="run name")
    with pytest.raises(UsageProblem) as info:
        validate_name("x" * 200)
    assert "'xxx" in str(info.value) and "..." in str(info.value)
    assert len(str(info.value).split(" is not allowed")[0]) == len("step name ") + 60
    assert isinstance(info.value, ValueError)
    with pytest.raises(TypeError, match="step name must be a str, got int"):
        validate_name(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("sub_id", ["a", "page/3", "with space", "ünïcode", "🙂", "x" * 512, " "])
def test_valid_sub_ids_are_kept_exactly(sub_id):
    assert validate_sub_id(sub_id) == sub_id
    assert type(validate_sub_id(sub_id)) is str


def test_sub_id_str_subclass_becomes_plain_str():
    class Tag(str):
        pass

    result = validate_sub_id(Tag("t1"))
    assert result == "t1" and type(result) is str


@pytest.mark.parametrize(
    "sub_id, match",
    [
        ("", "must not be empty"),
        ("x" * 513, "has 513 characters: at most 512"),
        ("a\x00b", r"control character '\\x00' at index 1"),
        ("a\nb", r"control character '\\n' at index 1"),
        ("tab\there", "control character"),
        ("del\x7f", r"'\\x7f' at index 3"),
        ("http:1", "kept for the HTTP exchanges of --http steps"),
    ],
)
def test_invalid_sub_ids(sub_id, match):
    with pytest.raises(UsageProblem, match=match) as info:
        validate_sub_id(sub_id)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("sub_id", [3, None, b"a", ("a",)])
def test_sub_id_must_be_a_str(sub_id):
    with pytest.raises(TypeError, match=f"must be a str, got {type(sub_id).__name__}"):
        validate_sub_id(sub_id)
