"""Unit tests for content fingerprints of values and callables (nbdurable.identity.fingerprint).

tests/test_keys.py covers the basic data types; this file covers objects described
by their pickle state, the type-only fallback, callables (code, globals, local
modules), and determinism across processes with different PYTHONHASHSEED.
"""

from __future__ import annotations

import abc
import array
import collections
import dataclasses
import enum
import functools
import gc
import importlib
import io
import json
import operator
import os
import pathlib
import pickle
import re
import socket
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import weakref
import zoneinfo

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_util import make_notebook, run_notebook, stream_text

import nbdurable
from nbdurable.identity.analysis import imported_modules
from nbdurable.identity.callables import callable_fingerprint, first_change
from nbdurable.identity.fingerprint import (
    FINGERPRINT_VERSION,
    args_fingerprint,
    fingerprint,
    fingerprint_info,
)
from nbdurable.identity.keys import normalize_source, source_fingerprint
from nbdurable.identity.localcode import local_module_files

ROOT = pathlib.Path(nbdurable.__file__).resolve().parents[1]


class Box:
    def __init__(self, v):
        self.v = v

    def area(self):
        return self.v * 2


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


class Shape(abc.ABC):
    @abc.abstractmethod
    def area(self): ...


class Square(Shape):
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side**2


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclasses.dataclass
class Point:
    x: int
    y: list


def _define(src: str, namespace: dict | None = None, filename: str = "<cell>") -> dict:
    ns: dict = {} if namespace is None else namespace
    exec(compile(textwrap.dedent(src), filename, "exec", dont_inherit=True), ns)
    return ns


# -- objects by their state -----------------------------------------------------


def test_instances_of_notebook_classes_by_state():
    box = Box(50)
    before = fingerprint(box)
    assert fingerprint(Box(50)) == before
    box.v = 60
    assert fingerprint(box) != before
    assert fingerprint(Slotted(1, 2)) == fingerprint(Slotted(1, 2))
    assert fingerprint(Slotted(1, 2)) != fingerprint(Slotted(1, 3))
    assert fingerprint_info(box).type_only == ()
    # An ABC's registration cache is not content.
    assert fingerprint_info(Square(2)).type_only == ()
    assert fingerprint(Square(2)) != fingerprint(Square(3))


def test_instances_follow_an_edit_of_their_class():
    src = (
        "class K:\n    def __init__(self):\n        self.v = 1\n    def m(self):\n        return {}"
    )
    one = _define(src.format(1), {"__name__": "__main__"})["K"]()
    two = _define(src.format(1), {"__name__": "__main__"})["K"]()
    edited = _define(src.format(2), {"__name__": "__main__"})["K"]()
    assert fingerprint(one) == fingerprint(two)
    assert fingerprint(one) != fingerprint(edited)


@pytest.mark.parametrize(
    "make, other",
    [
        (lambda: re.compile("a+", re.I), lambda: re.compile("a+")),
        (lambda: re.compile("a+"), lambda: re.compile(b"a+")),
        (lambda: array.array("d", [1.0, 2.0]), lambda: array.array("d", [1.0, 3.0])),
        (lambda: array.array("i", [1]), lambda: array.array("l", [1])),
        (lambda: collections.ChainMap({"a": 1}, {"b": 2}), lambda: collections.ChainMap({"a": 1})),
        (lambda: operator.itemgetter(1), lambda: operator.itemgetter(2)),
        (lambda: operator.attrgetter("a.b"), lambda: operator.attrgetter("a.c")),
        (lambda: operator.methodcaller("f", 1, k=2), lambda: operator.methodcaller("f", 1, k=3)),
        (lambda: zoneinfo.ZoneInfo("UTC"), lambda: zoneinfo.ZoneInfo("Europe/Paris")),
        (lambda: functools.partial(round, ndigits=2), lambda: functools.partial(round, ndigits=3)),
        (lambda: Color.RED, lambda: Color.BLUE),
        (lambda: Point(1, [2]), lambda: Point(1, [3])),
        (lambda: collections.Counter("aab"), lambda: collections.Counter("abb")),
        (lambda: collections.OrderedDict(a=1, b=2), lambda: collections.OrderedDict(b=2, a=1)),
    ],
    ids=lambda f: "",
)
def test_described_values_by_content(make, other):
    assert fingerprint(make()) == fingerprint(make())
    assert fingerprint(make()) != fingerprint(other())
    assert fingerprint_info(make()).type_only == ()


def test_subclass_attributes_count():
    class Config(dict):
        pass

    one, two = Config(a=1), Config(a=1)
    two.name = "x"
    assert fingerprint(one) != fingerprint(two)
    assert fingerprint(one) != fingerprint({"a": 1})


def test_cache_and_wrapper_decorators_follow_the_wrapped_function():
    ns = _define(
        """
        import functools
        def deco(f):
            @functools.wraps(f)
            def wrapper(*a):
                return f(*a)
            return wrapper
        @functools.cache
        def c1(x):
            return x + 1
        @functools.lru_cache(maxsize=8)
        def c2(x):
            return x + 1
        @deco
        def w1(x):
            return x + 1
        """
    )
    edited = _define(
        """
        import functools
        @functools.cache
        def c1(x):
            return x + 2
        """
    )
    assert fingerprint(ns["c1"]) != fingerprint(edited["c1"])
    assert fingerprint(ns["c1"]) != fingerprint(ns["c2"])  # other name, other wrapper
    ns["c1"](1)  # a filled cache is not a change
    assert fingerprint(ns["c1"]) == fingerprint(
        _define("import functools\n@functools.cache\ndef c1(x):\n    return x + 1")["c1"]
    )
    assert callable_fingerprint(ns["c1"]).digest != callable_fingerprint(edited["c1"]).digest


def test_np_vectorize_by_its_function():
    one = np.vectorize(lambda x: x + 1)
    two = np.vectorize(lambda x: x + 2)
    before = fingerprint(one)
    assert before != fingerprint(two)
    one(np.arange(3))  # calling builds a cached ufunc: not a change
    assert fingerprint(one) == before
    assert callable_fingerprint(one).digest != callable_fingerprint(two).digest


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.float32, np.complex128])
def test_masked_arrays_by_data_and_mask(dtype):
    data = np.arange(6, dtype=dtype).reshape(2, 3)
    masked = np.ma.masked_array(data, mask=[[0, 1, 0], [0, 0, 0]])
    assert fingerprint(masked) == fingerprint(masked.copy())
    remasked = masked.copy()
    remasked.mask[0, 0] = True
    assert fingerprint(masked) != fingerprint(remasked)
    changed = masked.copy()
    changed[1, 1] = 40
    assert fingerprint(masked) != fingerprint(changed)
    assert fingerprint(masked) != fingerprint(data)
    assert fingerprint(np.ma.masked_array(data)) == fingerprint(
        np.ma.masked_array(data, mask=np.zeros(data.shape, bool))
    )


def test_pydantic_models_by_fields():
    pydantic = pytest.importorskip("pydantic")

    class Query(pydantic.BaseModel):
        text: str
        k: int = 3

    assert fingerprint(Query(text="a")) == fingerprint(Query(text="a"))
    assert fingerprint(Query(text="a")) != fingerprint(Query(text="a", k=4))


def test_dicts_keep_order_sets_do_not():
    assert fingerprint({"a": 1, "b": 2}) != fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1, "b": 2}) == fingerprint(dict([("a", 1), ("b", 2)]))
    assert fingerprint({"x", "y", "z"}) == fingerprint({"z", "y", "x"})
    assert fingerprint(Box({"a": 1, "b": 2})) != fingerprint(Box({"b": 2, "a": 1}))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.integers(), min_size=2, max_size=8), st.randoms())
def test_dict_order_counts_and_set_order_does_not(d, rnd):
    items = list(d.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    assert (fingerprint(d) == fingerprint(shuffled)) == (list(d) == list(shuffled))
    keys = list(d)
    rnd.shuffle(keys)
    assert fingerprint(set(d)) == fingerprint(set(keys))
    assert fingerprint(frozenset(d.items())) == fingerprint(frozenset(items))


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.frozensets(st.text(max_size=4) | st.integers(), max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None)
@given(_VALUES)
def test_equal_values_built_apart_give_equal_fingerprints(value):
    copy = _rebuild(value)
    assert fingerprint(Box(value)) == fingerprint(Box(copy))


def _rebuild(v):
    if isinstance(v, list):
        return [_rebuild(x) for x in v]
    if isinstance(v, dict):
        return {k: _rebuild(x) for k, x in v.items()}
    if isinstance(v, frozenset):
        return frozenset(_rebuild(x) for x in sorted(v, key=repr, reverse=True))
    return v


# -- cycles ---------------------------------------------------------------------


def test_self_referencing_objects_terminate():
    box = Box(None)
    box.v = box
    other = Box(None)
    other.v = other
    assert fingerprint(box) == fingerprint(other)
    d: dict = {}
    d["box"] = Box(d)
    assert len(fingerprint(d)) == 32
    a, b = Box(None), Box(None)
    a.v, b.v = b, a
    assert len(fingerprint(a)) == 32


def test_a_reduce_that_builds_new_objects_forever_ends():
    class Endless:
        def __reduce__(self):
            return (Endless, (Endless(),))

    info = fingerprint_info(Endless())
    assert info.type_only  # cut off at a fixed depth, and says so
    assert info.digest == fingerprint(Endless())


# -- type only --------------------------------------------------------------------


def test_type_only_is_reported_for_what_cannot_be_described():
    with socket.socket() as s:
        assert fingerprint_info(s).type_only == ("socket.socket",)
    assert fingerprint_info(threading.Lock()).type_only == ("_thread.lock",)
    assert fingerprint_info(x for x in [1]).type_only == ("builtins.generator",)
    assert fingerprint_info([1, "a", Box(2)]).type_only == ()


def test_a_library_object_holding_a_socket_is_type_only_as_a_whole():
    class Client:
        def __init__(self, url):
            self.url = url
            self.sock = socket.socket()

    # The same class, as if a library's client.
    LibClient = type("LibClient", (Client,), {"__module__": "somelib.client"})
    one, two = Client("a"), Client("b")
    lib_one, lib_two = LibClient("a"), LibClient("b")
    try:
        # A notebook class: its state, with the socket by type.
        assert fingerprint(one) != fingerprint(two)
        assert fingerprint_info(one).type_only == ("socket.socket",)
        assert fingerprint(lib_one) == fingerprint(lib_two)
        assert fingerprint_info(lib_one).type_only == ("somelib.client.LibClient",)
        # A notebook object holding that client keeps its own state.
        assert fingerprint(Box(lib_one)) == fingerprint(Box(lib_two))
        assert fingerprint(Box(lib_one)) != fingerprint(Box(3))
    finally:
        for c in (one, two, lib_one, lib_two):
            c.sock.close()


def test_a_cut_short_library_object_hides_nothing_elsewhere():
    # Hashing stops inside a library object at its first type-only part; a function
    # walked only partly there must still be hashed fully where it appears again.
    Holder = type("Holder", (), {"__module__": "somelib.holder"})
    with socket.socket() as conn:

        def value(zeta):
            f = _define("def f():\n    return (conn, zeta)", {"conn": conn, "zeta": zeta})["f"]
            holder = Holder()
            holder.fn = f
            return [holder, f]

        assert fingerprint(value(1)) != fingerprint(value(2))
        assert fingerprint_info(value(1)).type_only == ("somelib.holder.Holder", "socket.socket")


def test_a_weak_reference_is_by_type_alive_or_not_never_its_referent():
    # A live weak proxy handed pickle its referent's state, a dead one nothing: a value
    # holding one changed its fingerprint when the collector freed the referent, and
    # two proxies compared their referents. Weak references and proxies are their type.
    class Node:
        def __call__(self):
            return 1

    one, two, gone = Box(1), Box(2), Box(3)
    call_one, call_gone = Node(), Node()
    held = {
        "ref": (weakref.ref(one), weakref.ref(two), weakref.ref(gone)),
        "proxy": (weakref.proxy(one), weakref.proxy(two), weakref.proxy(gone)),
        "callable proxy": (
            weakref.proxy(call_one),
            weakref.proxy(call_one),
            weakref.proxy(call_gone),
        ),
        "keyed": (weakref.KeyedRef(one, None, "k"), weakref.KeyedRef(two, None, "k")) * 2,
    }
    del gone, call_gone
    gc.collect()
    for kind, (live, other, dead, *_) in held.items():
        assert fingerprint(Box(live)) == fingerprint(Box(other)) == fingerprint(Box(dead)), kind
        assert fingerprint_info(Box(live)).type_only == fingerprint_info(Box(dead)).type_only
        assert len(fingerprint_info(Box(live)).type_only) == 1, kind
        # what holds it keeps its own state
        assert fingerprint([live, 1]) != fingerprint([live, 2]), kind
    assert fingerprint(Box(held["proxy"][0])) != fingerprint(Box(held["ref"][0]))


def test_kernel_machinery_is_by_type():
    Shell = type("Shell", (), {"__module__": "IPython.core.interactiveshell"})
    shell = Shell()
    shell.user_ns = {"big": list(range(10))}
    assert fingerprint_info(shell).type_only == ("IPython.core.interactiveshell.Shell",)


def test_repr_is_never_called():
    class Loud:
        def __init__(self):
            self.v = 1

        def __repr__(self):
            raise AssertionError("repr was called")

    assert fingerprint(Loud()) == fingerprint(Loud())


# -- cost -------------------------------------------------------------------------


def _peak_bytes(fn, *args) -> int:
    tracemalloc.start()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_large_arrays_and_frames_are_hashed_in_place():
    # No copy of the data: the buffer goes to SHA-256 as it is (no per-element loop).
    array_ = np.ones(40 * 2**20 // 8)
    assert _peak_bytes(fingerprint, array_) < 2**20
    frame = pd.DataFrame(np.ones((80 * 2**20 // 80, 10)))  # 80 MB: over the in-band limit
    assert _peak_bytes(fingerprint, frame) < 4 * 2**20
    changed = frame.copy()
    changed.iloc[-1, -1] = 2.0
    assert fingerprint(changed) != fingerprint(frame)


# -- callables --------------------------------------------------------------------

_ASK = """
MODEL = "{model}"
TEMPLATE = "Answer briefly: {{q}}"

def clean(text):
    return text.strip(){clean}

def ask(q, n={n}):
    prompt = "{prompt}" + TEMPLATE.format(q=q)
    return (MODEL, clean(prompt), n, scale)

def make(k):
    def inner(x):
        return x * k
    return inner
"""


def _ask(model="small", prompt="Q: ", n=1, clean="", scale=2):
    ns = {"__name__": "__main__", "scale": scale}
    return _define(_ASK.format(model=model, prompt=prompt, n=n, clean=clean), ns)


@pytest.mark.parametrize(
    "edit, label",
    [
        ({"prompt": "Question: "}, "code"),
        ({"model": "large"}, "global MODEL"),
        ({"clean": ".lower()"}, "global clean"),
        ({"n": 2}, "defaults"),
        ({"scale": 3}, "global scale"),
    ],
)
def test_callable_fingerprint_sees_every_edit(edit, label):
    base = callable_fingerprint(_ask()["ask"])
    assert callable_fingerprint(_ask()["ask"]) == base
    changed = callable_fingerprint(_ask(**edit)["ask"])
    assert changed.digest != base.digest
    assert first_change(base.parts, changed.parts) == label
    assert fingerprint(_ask()["ask"]) != fingerprint(_ask(**edit)["ask"])


def test_parts_kept_between_fingerprints_never_hide_a_change():
    """Immutable parts are hashed once per process; every kind of change is still seen."""
    import types

    from nbdurable.identity import callables

    library = types.ModuleType("some_library")
    ns = _define(
        "def f(x, n=(1, 'a')):\n    return (x, n, PROMPT, STATE, LIB, BIG)",
        {
            "__name__": "__main__",
            "PROMPT": "Answer: ",
            "STATE": [0],
            "LIB": library,
            "BIG": "x" * (callables._STABLE_BYTES_MAX + 1),
        },
    )
    f = ns["f"]
    seen = [callable_fingerprint(f)]
    assert callable_fingerprint(f) == seen[0], "the same function, the same fingerprint"
    cached = {type(entry[0]) for entry in callables._STABLE.values()}
    assert {types.CodeType, tuple, str, types.ModuleType} <= cached
    assert not any(entry[0] is ns["BIG"] for entry in callables._STABLE.values())

    def changed(label: str) -> None:
        now = callable_fingerprint(f)
        assert first_change(seen[-1].parts, now.parts) == label
        assert now.digest != seen[-1].digest
        seen.append(now)

    ns["PROMPT"] = "Reply: "  # a global rebound
    changed("global PROMPT")
    ns["STATE"].append(1)  # a mutable global changed in place
    changed("global STATE")
    library.__name__ = "renamed_library"  # what a library module is hashed by
    changed("global LIB")
    f.__defaults__ = (2, "a")
    changed("defaults")
    # Back to an earlier value: the earlier digest, whatever the cache holds.
    ns["PROMPT"] = "Answer: "
    assert callable_fingerprint(f).parts["global PROMPT"] == seen[0].parts["global PROMPT"]
    f.__code__ = _define("def g(x, n=0):\n    return x")["g"].__code__
    changed("code")


def test_attribute_names_are_not_global_reads():
    src = "def f(obj):\n    return obj.model.shape"
    one = _define(src, {"__name__": "__main__", "model": 1, "shape": 1})["f"]
    two = _define(src, {"__name__": "__main__", "model": 2, "shape": 2})["f"]
    assert callable_fingerprint(one) == callable_fingerprint(two)
    assert not any(label.startswith("global") for label in callable_fingerprint(one).parts)


def test_code_only_fingerprints_leave_globals_out():
    small, large = _ask()["ask"], _ask(model="large")["ask"]
    assert fingerprint(small, read_globals=False) == fingerprint(large, read_globals=False)
    assert fingerprint(small, read_globals=False) != fingerprint(
        _ask(prompt="Other")["ask"], read_globals=False
    )


def test_callable_fingerprint_ignores_globals_it_does_not_read():
    ns = _ask()
    before = callable_fingerprint(ns["ask"])
    ns["unrelated"] = [1, 2, 3]
    ns["make"] = None
    assert callable_fingerprint(ns["ask"]) == before


def test_closure_values_and_lambdas():
    ns = _ask()
    assert callable_fingerprint(ns["make"](2)) == callable_fingerprint(ns["make"](2))
    changed = callable_fingerprint(ns["make"](3))
    assert changed != callable_fingerprint(ns["make"](2))
    assert first_change(callable_fingerprint(ns["make"](2)).parts, changed.parts) == "closure k"
    limit = 5
    one = lambda x: x < limit  # noqa: E731
    limit = 6
    two = lambda x: x < limit  # noqa: E731, F841 - a cell: both see limit = 6
    assert callable_fingerprint(one) == callable_fingerprint(two)
    assert callable_fingerprint(lambda x: x + 1) != callable_fingerprint(lambda x: x + 2)


def test_mutually_recursive_functions_terminate():
    src = """
    def even(n):
        return True if n == 0 else odd(n - 1)
    def odd(n):
        return False if n == 0 else even(n - 1)
    """
    one = _define(src, {"__name__": "__main__"})
    two = _define(src, {"__name__": "__main__"})
    assert callable_fingerprint(one["even"]) == callable_fingerprint(two["even"])
    edited = _define(src.replace("False if", "True if"), {"__name__": "__main__"})
    assert callable_fingerprint(one["even"]) != callable_fingerprint(edited["even"])


def test_bound_methods_callable_instances_and_partials():
    box = Box(2)
    before = callable_fingerprint(box.area)
    box.v = 3
    after = callable_fingerprint(box.area)
    assert after != before and first_change(before.parts, after.parts) == "self"

    class Scorer:
        def __init__(self, w):
            self.w = w

        def __call__(self, x):
            return x * self.w

    assert callable_fingerprint(Scorer(1)) == callable_fingerprint(Scorer(1))
    assert callable_fingerprint(Scorer(1)) != callable_fingerprint(Scorer(2))
    assert "code" in callable_fingerprint(Scorer(1)).parts  # __call__'s own parts

    ns = _ask()
    p1 = functools.partial(ns["ask"], n=5)
    assert callable_fingerprint(p1) == callable_fingerprint(functools.partial(ns["ask"], n=5))
    p2 = functools.partial(ns["ask"], n=6)
    assert first_change(callable_fingerprint(p1).parts, callable_fingerprint(p2).parts) == (
        "partial keywords"
    )
    p3 = functools.partial(_ask(model="large")["ask"], n=5)
    assert first_change(callable_fingerprint(p1).parts, callable_fingerprint(p3).parts) == (
        "global MODEL"
    )


def test_wrapped_chains():
    def deco(f):
        @functools.wraps(f)
        def wrapper(*a):
            return f(*a)

        return wrapper

    base = _ask()
    edited = _ask(model="large")
    one = deco(deco(base["ask"]))
    two = deco(deco(edited["ask"]))
    assert callable_fingerprint(one) != callable_fingerprint(two)
    assert callable_fingerprint(one) == callable_fingerprint(deco(deco(_ask()["ask"])))


def test_callable_fingerprint_needs_a_callable():
    with pytest.raises(TypeError, match="needs a callable, got int"):
        callable_fingerprint(3)


def test_library_functions_by_code_not_by_their_globals():
    # json.dumps reads module globals; they are not walked (a library changes on upgrade).
    parts = callable_fingerprint(json.dumps).parts
    assert not any(label.startswith("global") for label in parts)
    assert callable_fingerprint(len).parts.keys() == {"self"}


def _write(path: pathlib.Path, text: str) -> None:
    path.write_text(textwrap.dedent(text))
    # Another mtime for the import system's cached bytecode check.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


@pytest.fixture
def local_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []

    def make(name: str, text: str):
        path = tmp_path / f"{name}.py"
        _write(path, text)
        importlib.invalidate_caches()
        names.append(name)
        return path, importlib.import_module(name)

    yield make
    for name in names:
        sys.modules.pop(name, None)


def test_a_local_module_edit_changes_the_functions_reading_it(local_module):
    path, helpers = local_module("nbd_helpers_a", "SCALE = 2\ndef f(x):\n    return x * SCALE\n")
    ns = _define(
        "import nbd_helpers_a\nfrom nbd_helpers_a import f\n"
        "def step_a(x):\n    return nbd_helpers_a.SCALE + x\n"
        "def step_b(x):\n    return f(x)\n",
        {"__name__": "__main__"},
    )
    a0, b0 = callable_fingerprint(ns["step_a"]), callable_fingerprint(ns["step_b"])
    _write(path, "SCALE = 3\ndef f(x):\n    return x * SCALE\n")
    # The file changed: a function reading the module sees it even before a reload.
    assert callable_fingerprint(ns["step_a"]) != a0
    importlib.reload(helpers)
    ns2 = _define("from nbd_helpers_a import f", {"__name__": "__main__"})
    a1 = callable_fingerprint(ns["step_a"])
    assert a1 != a0 and first_change(a0.parts, a1.parts) == "global nbd_helpers_a"
    b1 = callable_fingerprint(_define("def step_b(x):\n    return f(x)\n", ns2)["step_b"])
    assert b1 != b0 and first_change(b0.parts, b1.parts) == "global f"


def test_local_modules_are_followed_transitively(local_module):
    path, _ = local_module("nbd_helpers_low", "RATE = 1\n")
    local_module(
        "nbd_helpers_mid",
        "import nbd_helpers_low\ndef g():\n    return nbd_helpers_low.RATE\n",
    )
    ns = _define(
        "from nbd_helpers_mid import g\ndef top():\n    return g()\n", {"__name__": "__main__"}
    )
    before = callable_fingerprint(ns["top"])
    sys.modules["nbd_helpers_low"].RATE = 5  # a runtime change, the file is the same
    assert callable_fingerprint(ns["top"]) != before
    sys.modules["nbd_helpers_low"].RATE = 1
    assert callable_fingerprint(ns["top"]) == before
    _write(path, "RATE = 1  # edited\n")
    assert callable_fingerprint(ns["top"]) != before


def test_the_files_of_modules_a_step_imports_and_of_those_they_import(local_module, tmp_path):
    consts, _ = local_module("nbd_imp_consts", "VALUE = 1\n")
    funcs, _ = local_module("nbd_imp_funcs", "def g():\n    return 2\n")
    other, _ = local_module("nbd_imp_other", "X = 3\n")
    top, _ = local_module(
        "nbd_imp_top",
        "import json\nfrom nbd_imp_consts import VALUE\n"
        "def _late():\n    import nbd_imp_other\n"
        "from nbd_imp_funcs import g\nimport nbd_imp_top\n",  # imports itself: a cycle
    )
    step = "import nbd_imp_top, numpy\nfrom nbd_imp_missing import x"
    names = imported_modules(step)
    assert {"nbd_imp_top", "numpy", "nbd_imp_missing", "nbd_imp_missing.x"} <= names
    found = local_module_files(names)
    assert found == sorted(str(p) for p in (consts, funcs, other, top))  # no json, no numpy
    assert local_module_files(imported_modules("import json")) == []


def test_modules_as_values(local_module):
    path, helpers = local_module("nbd_helpers_v", "X = 1\n")
    before = fingerprint(helpers)
    assert fingerprint(json) == fingerprint(sys.modules["json"])
    _write(path, "X = 2\n")
    assert fingerprint(helpers) != before
    path.unlink()
    assert len(fingerprint(helpers)) == 32  # a deleted file is a change, not an error


# -- across processes ---------------------------------------------------------------

_PROBE = r"""
import json, sys, collections, functools, re, zoneinfo, operator, array
import numpy as np, pandas as pd
from nbdurable.identity.fingerprint import fingerprint
from nbdurable.identity.callables import callable_fingerprint
SRC = sys.argv[1]
ns = {"__name__": "__main__", "scale": 2}
exec(compile(SRC, sys.argv[2], "exec"), ns)
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
frame = pd.DataFrame({
    "sets": [set(words), {"x", "y"}, frozenset(words[:3])],
    "dicts": [{"a": 1}, {"b": {"c", "d"}}, {}],
    "n": [1.5, 2.5, 3.5],
    "tags": pd.Categorical(["u", "v", "u"]),
    "mixed": [{1, "a", ("t", 2)}, {2.5, "b"}, set()],
})
values = {
    "sets": {w: set(words) for w in words},
    "frame": frame,
    "series": frame["sets"],
    "box": ns["Box"]({"s": set(words), "r": re.compile("a"), "z": zoneinfo.ZoneInfo("UTC")}),
    "chain": collections.ChainMap({"a": set(words)}),
    "ops": [operator.itemgetter("a"), array.array("i", [1, 2])],
}
out = {k: fingerprint(v) for k, v in values.items()}
out["ask"] = callable_fingerprint(ns["ask"]).digest
out["ask_fp"] = fingerprint(ns["ask"])
out["method"] = callable_fingerprint(ns["Box"](set(words)).get).digest
print(json.dumps(out))
"""

_PROBE_SRC = """
MODEL = "small"
TAGS = {"red", "green", "blue"}

class Box:
    def __init__(self, v):
        self.v = v
    def get(self):
        return self.v

def helper(x):
    return sorted(TAGS) + [x]

def ask(q, n=1):
    return (MODEL, helper(q), n, scale)
"""


def _probe(seed: str, filename: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, _PROBE_SRC, filename],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_fingerprints_are_the_same_in_every_process():
    first = _probe("1", "ipykernel_101/3.py")
    second = _probe("98765", "ipykernel_202/8.py")
    third = _probe("random", "<cell-9>")
    assert first == second == third


# -- the version and the rest --------------------------------------------------------


def test_version_and_unchanged_encodings():
    assert FINGERPRINT_VERSION == 4
    # Kinds whose encoding did not change keep their 0.1.0 fingerprints, so upgrading
    # does not invalidate steps fed plain data. Values computed by nbdurable 0.1.0.
    assert fingerprint([1, "a", (2.5, None), b"x"]) == "c8955574d9b3628a65e1c96de72aa623"
    assert fingerprint({"alpha", "beta"}) == "ba91e9bad006d6c7f18761499d31d8cb"
    assert fingerprint(np.arange(6.0).reshape(2, 3)) == "a1be3f7c6d72e550cc400729b00bcd4d"
    assert fingerprint([[1], {3, 4}, frozenset({"q"})]) == "5aa28467d1dfb9123735af7e2a722c9b"
    assert args_fingerprint(([1, [2]],), {}) == "0cdc95a8bf20254c144e1a340466b5d0"
    assert fingerprint(threading.Lock()) == "dedcb0580348f2bd67bc97bcd24ba466"  # type only
    assert fingerprint(json) == "60e251b1182c7cee7b1d70833dd0b45c"


def test_what_two_processes_make_differently_inside_objects_is_not_a_difference():
    # A library stamps random ids on what it does (LlamaIndex's callback trace ids) and
    # lists sets of classes (a workflow's events): two processes building the same
    # object make other ids and other orders. Inside a library object's state those
    # are no difference; in the notebook's own data they are.
    import argparse
    import uuid

    class A: ...

    class B: ...

    def made(ids, classes):
        return argparse.Namespace(trace={"root": ids}, run=f"run-{ids[0]}", events=classes)

    one = made([str(uuid.uuid4())], [A, B])
    other = made([str(uuid.uuid4())], [B, A])
    assert fingerprint(one) == fingerprint(other)
    assert fingerprint(made([str(uuid.uuid4()), str(uuid.uuid4())], [A, B])) != fingerprint(one)
    assert fingerprint(made([str(uuid.uuid1())], [A, B])) != fingerprint(
        made([str(uuid.uuid1())], [A, B])
    ), "a time-based UUID is data, not a random stamp"
    assert fingerprint(made(["x"], [A])) != fingerprint(made(["x"], [B]))
    assert fingerprint(argparse.Namespace(u=uuid.uuid4())) == fingerprint(
        argparse.Namespace(u=uuid.uuid4())
    )
    # The notebook's own values keep both.
    assert fingerprint(str(uuid.uuid4())) != fingerprint(str(uuid.uuid4()))
    assert fingerprint({"id": str(uuid.uuid4())}) != fingerprint({"id": str(uuid.uuid4())})
    assert fingerprint(uuid.uuid4()) != fingerprint(uuid.uuid4())
    assert fingerprint([A, B]) != fingerprint([B, A])


def test_pandas_values_do_not_depend_on_which_equal_strings_are_one_object():
    # Version 2 pickles pandas values without the memo. With it (0.1.0), a column
    # named like a string pandas itself interns ('name') was written as a reference
    # in the frame as built, in full in the frame loaded back from the store.
    frame = pd.DataFrame({"name": ["ann", "bob"], "city": ["x", None], "n": [1, 2]})
    loaded = pickle.loads(pickle.dumps(frame))
    assert fingerprint(loaded) == fingerprint(frame)
    assert fingerprint(loaded["name"]) == fingerprint(frame["name"])
    assert fingerprint(loaded.set_index("name")) == fingerprint(frame.set_index("name"))
    changed = frame.copy()
    changed.loc[1, "city"] = "y"
    assert fingerprint(changed) != fingerprint(frame)
    cyclic = [1]
    cyclic.append(cyclic)  # fast mode refuses cycles: the memo pickle is used then
    assert fingerprint(pd.Series([cyclic], dtype=object)) != fingerprint(
        pd.Series([[1]], dtype=object)
    )


def test_a_pandas_cache_filled_on_first_use_is_no_change():
    # pandas' cache_readonly keeps its values in the array's `_cache`, part of a
    # DatetimeArray's pickle: reading `.unit` (as statsmodels' ARIMA fit reads the
    # index of the Series it is given) made the plain cell's Series look changed,
    # and the copy a store load gives back differ from the one a fresh cell makes.
    def series():
        return pd.Series([1.0, 2.5, 3.0], index=pd.date_range("2020-01-01", periods=3))

    fresh = series()
    used = series()
    assert used.index.unit  # filled on first use
    assert "_cache" in vars(used.index._data), "pandas no longer caches there: rewrite this"
    assert fingerprint(used) == fingerprint(fresh)
    assert fingerprint(pickle.loads(pickle.dumps(used))) == fingerprint(fresh)
    assert fingerprint(used.index) == fingerprint(fresh.index)
    changed = series()
    changed.iloc[0] = 0.0
    assert fingerprint(changed) != fingerprint(fresh)
    assert fingerprint(series().tz_localize("UTC")) != fingerprint(fresh)


def test_args_fingerprints_changed_only_where_they_were_wrong():
    # 0.1.0 ignored dict order and hashed plain instances by type: these now differ.
    assert args_fingerprint(({"a": 1, "b": 2},), {}) != args_fingerprint(({"b": 2, "a": 1},), {})
    assert args_fingerprint((Box(1),), {}) != args_fingerprint((Box(2),), {})
    # Pinned: any change here changes every recorded call's fingerprint (see
    # FINGERPRINT_VERSION); update only together with a version bump.
    assert args_fingerprint(({"b": [1, 2], "a": None},), {"k": {"x"}}) == (
        "87f9eef5ddb7ae0e8c845a4c7adf3301"
    )


# -- the source of a cell: trailing ; -------------------------------------------------


@pytest.mark.parametrize(
    "plain, quiet",
    [
        ("df.head()", "df.head();"),
        ("x = 1\nx", "x = 1\nx;"),
        ("f(1)\n", "f(1);  # quiet\n\n"),
    ],
)
def test_a_trailing_semicolon_counts(plain, quiet):
    assert source_fingerprint(plain) != source_fingerprint(quiet)
    assert source_fingerprint(quiet) == source_fingerprint(quiet.replace(";", " ;") + "\n# c")


def test_semicolons_that_do_not_hide_output_do_not_count():
    assert source_fingerprint("x = 1") == source_fingerprint("x = 1;")
    assert source_fingerprint("x  # a ;") == source_fingerprint("x")
    assert source_fingerprint("a = 1; b = 2") == source_fingerprint("a = 1\nb = 2")
    assert normalize_source("print(1); y") == "print(1)\ny"


# -- in a real kernel -------------------------------------------------------------------

_KERNEL_CELLS = [
    "import json, dataclasses, re\nimport numpy as np, pandas as pd\nimport helpers_nbd\n"
    "from nbdurable.identity.fingerprint import fingerprint, fingerprint_info\n"
    "from nbdurable.identity.callables import callable_fingerprint",
    'MODEL = "small"\nWORDS = {"alpha", "beta", "gamma", "delta"}',
    "class Box:\n    def __init__(self, v):\n        self.v = v\n"
    "    def area(self):\n        return helpers_nbd.SCALE * self.v",
    "@dataclasses.dataclass\nclass Cfg:\n    name: str\n    tags: set",
    "def ask(q):\n    return f'{MODEL}: {q}' + helpers_nbd.suffix()",
    "frame = pd.DataFrame({'s': [set(WORDS), {'x'}], 'n': [1, 2]})\n"
    "values = {'words': WORDS, 'frame': frame, 'box': Box(3), 'cfg': Cfg('c', set(WORDS)),\n"
    "          'arr': np.ma.masked_array([1.0, 2.0], mask=[0, 1]), 'pat': re.compile('a')}\n"
    "out = {k: fingerprint(v) for k, v in values.items()}\n"
    "out['ask'] = callable_fingerprint(ask).digest\n"
    "out['area'] = callable_fingerprint(Box(3).area).digest\n"
    "out['type_only'] = [fingerprint_info(v).type_only for v in values.values()]\n"
    "print(json.dumps(out))",
]


@pytest.mark.kernel
def test_fingerprints_in_real_kernels_survive_restarts_and_see_module_edits(tmp_path):
    helpers = tmp_path / "helpers_nbd.py"
    helpers.write_text("SCALE = 2\n\ndef suffix():\n    return '!'\n")

    def run() -> dict:
        nb = run_notebook(make_notebook(_KERNEL_CELLS), cwd=tmp_path)
        return json.loads(stream_text(nb.cells[-1].outputs))

    first, second = run(), run()  # two kernels, each with its own hash seed
    assert first == second
    assert first["type_only"] == [[]] * 6
    helpers.write_text("SCALE = 2\n\ndef suffix():\n    return '?'\n")
    edited = run()
    changed = {k for k in first if first[k] != edited[k]}
    # ask calls helpers_nbd.suffix; Box.area reads helpers_nbd.SCALE from the same file.
    assert changed == {"ask", "area", "box"}


def test_every_nbdurable_module_is_library_code():
    """nbdurable's own modules, in every subpackage, are never followed as the user's code."""
    import nbdurable.durable.substeps
    import nbdurable.store.disk
    from nbdurable.identity import localcode

    for module in (nbdurable, nbdurable.durable.substeps, nbdurable.store.disk, localcode):
        assert localcode.is_library_file(module.__file__), module.__name__


# -- library objects as the libraries keep them ------------------------------------------


def test_a_figure_is_walked_once_per_object_and_its_callbacks_are_left_alone():
    # Every matplotlib artist points at its figure, axes and transforms: walked as a
    # tree, a small figure's fingerprint ran for minutes. And CallbackRegistry's
    # __getstate__ advances a counter: each fingerprint differed from the last, and
    # the ids a plain run's later mpl_connect returns moved.
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        ax.plot([1, 2, 3])
        ax.imshow([[1, 2], [3, 4]])
        ax.legend(["a"])
        registry = fig.canvas.callbacks
        before = fingerprint(fig)
        assert fingerprint(fig) == before
        assert fingerprint(ax.lines[0]) == fingerprint(ax.lines[0])
        cid = registry.connect("draw_event", print)
        plain, _ = plt.subplots()
        try:
            assert cid == plain.canvas.callbacks.connect("draw_event", print)
        finally:
            plt.close(plain)
        ax.lines[0].set_ydata([3, 2, 1])
        assert fingerprint(fig) != before
    finally:
        plt.close(fig)


def test_a_drawn_figure_fingerprints_alike_once_loaded_back_from_its_record():
    # Drawing a figure (the inline backend shows it after its cell) leaves bookkeeping
    # in it: transforms' back-pointers keyed by id() (some to transforms since
    # collected), invalidation flags, artists' stale flags and callbacks. Loaded back
    # from a record that all differs, so a step reading a restored figure or a seaborn
    # grid reran. What it draws is the same; a change to it still counts.
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    from nbdurable.store import values

    fig, ax = plt.subplots(figsize=(3, 2), dpi=50)
    try:
        ax.bar(["a", "b"], [1, 2])
        ax.legend(["n"])
        shown = {"format": "png", "bbox_inches": "tight"}  # as the inline backend shows it
        fig.savefig(io.BytesIO(), **shown)
        plt.close(fig)
        copy = values.loads(values.dumps(fig))
        assert fingerprint(copy) == fingerprint(fig)
        assert fingerprint(copy.axes[0]) == fingerprint(ax)
        copy.savefig(io.BytesIO(), **shown)  # shown again: still the same figure
        assert fingerprint(copy) == fingerprint(fig)
        copy.axes[0].set_ylabel("n")
        assert fingerprint(copy) != fingerprint(fig)
    finally:
        plt.close("all")


def test_a_pydantic_model_is_what_its_fields_hold_not_which_were_given():
    # LlamaIndex's objects mark every field set when pickled: the restored copy of
    # an unchanged document was "changed". pydantic's == ignores it too.
    pydantic = pytest.importorskip("pydantic")

    class Doc(pydantic.BaseModel):
        text: str
        tags: list[str] = []

    assert fingerprint(Doc(text="a")) == fingerprint(Doc(text="a", tags=[]))
    assert fingerprint(Doc(text="a")) != fingerprint(Doc(text="a", tags=["x"]))


def test_a_tensor_is_its_content():
    # A tensor's pickle is keyed by its storage's memory address: equal tensors,
    # and a model restored from its record, never fingerprinted alike.
    torch = pytest.importorskip("torch")
    assert fingerprint(torch.ones(3)) == fingerprint(torch.ones(3))
    assert fingerprint(torch.ones(3)) != fingerprint(torch.zeros(3))
    assert fingerprint(torch.ones(3)) != fingerprint(torch.ones(3, dtype=torch.float64))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    copy = pickle.loads(pickle.dumps(model))
    assert fingerprint(copy) == fingerprint(model)
    with torch.no_grad():
        copy.weight[0, 0] += 1
    assert fingerprint(copy) != fingerprint(model)


def test_a_tensor_keeps_its_gradient_through_a_record():
    # torch's pickle leaves .grad out: a step that ran loss.backward() replayed
    # with every gradient None, and the optimizer stepped on nothing.
    torch = pytest.importorskip("torch")
    from nbdurable.store import values

    model = torch.nn.Linear(2, 1)
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    model(x).sum().backward()
    x2, model2 = values.loads(values.dumps([x, model]))
    assert torch.equal(x2.grad, x.grad) and x2.requires_grad
    assert isinstance(model2.weight, torch.nn.Parameter)
    assert torch.equal(model2.weight.grad, model.weight.grad)
    assert fingerprint(model2) == fingerprint(model)


def test_a_llama_index_callback_manager_is_its_handlers_not_its_last_trace():
    # Every use of a LlamaIndex model or embedding records its events' ids in its
    # callback manager's trace map: the MockEmbedding a plain cell put in Settings
    # looked changed once a step's index had used it, and the step's reference to
    # it was refused on replay.
    callbacks = pytest.importorskip("llama_index.core.callbacks")
    used, fresh = callbacks.CallbackManager([]), callbacks.CallbackManager([])
    with used.event(callbacks.CBEventType.EMBEDDING):
        pass
    assert used.trace_map, "LlamaIndex no longer records its events there: rewrite this"
    assert fingerprint(used) == fingerprint(fresh)
    debug = callbacks.LlamaDebugHandler()
    assert fingerprint(callbacks.CallbackManager([debug])) != fingerprint(fresh)


_ORM = """
import sys
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from nbdurable.durable.plan import input_fingerprint

def fingerprint(v):  # as a step's input is fingerprinted
    return input_fingerprint(v, None)[0]

class Base(DeclarativeBase):
    pass

class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[TYPE]

print(fingerprint(Item), fingerprint(Base))
if sys.argv[1:]:  # used: the mapper is configured, the session registered
    engine = create_engine("sqlite:///" + sys.argv[1])
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add(Item(text=TYPE(1)))
        session.commit()
    print(fingerprint(Item), fingerprint(Base))
"""


def test_a_sqlalchemy_declarative_class_is_its_table(tmp_path):
    # The ORM sets its bookkeeping on a mapped class (instrumented attributes, the
    # class manager, the registry): sets in hash order, mappers configured on first
    # use. A step reading the class never replayed, and its body wrote its rows again.
    pytest.importorskip("sqlalchemy")

    def run(kind: str, seed: str, *args: str) -> list[str]:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        code = _ORM.replace("TYPE", kind)
        out = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    first = run("str", "1", str(tmp_path / "shop.db"))
    assert first[0] == first[1]  # used, the same class
    assert run("str", "2") == first[:1]  # another process
    assert run("int", "1")[0].split()[0] != first[0].split()[0]  # a column of another type


def test_the_distributions_of_a_package_are_what_importlib_says_without_its_table():
    # package_version names a library class's distribution from this, not from
    # importlib.metadata.packages_distributions(), which parses every installed
    # distribution's file list (seconds of a first step in a large environment).
    import importlib.metadata

    from nbdurable.identity import localcode

    table = importlib.metadata.packages_distributions()
    tops = sorted(table)
    sample = {*tops[:: max(1, len(tops) // 25)], "yaml", "sklearn", "IPython", "no_such_package"}
    for top in sorted(sample):
        assert sorted(set(localcode.distributions_of(top))) == sorted(set(table.get(top, []))), top
