"""procstate: snapshot, delta and re-apply of process state, in this process.

Each test changes real process state the way a step would, takes the delta,
puts the process back as it was (by hand, not with procstate), re-applies
the delta after a JSON round trip (as the store keeps it), and checks the
process is as right after the change.
"""

from __future__ import annotations

import collections
import decimal
import enum
import json
import os
import random
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from nbdurable import procstate
from nbdurable.procstate import NotPlain, decode, encode

pd = pytest.importorskip("pandas")
mpl = pytest.importorskip("matplotlib")


class _Saved:
    """The process state these tests touch, put back by hand."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        self.cwd = os.getcwd()
        self.path = list(sys.path)
        self.random = random.getstate()
        self.np_random = np.random.get_state()
        self.filters = list(warnings.filters)
        self.printoptions = np.get_printoptions()
        self.rc = dict(dict.items(mpl.rcParams))
        self.limit = sys.getrecursionlimit()
        self.decimal = decimal.getcontext().copy()

    def restore(self) -> None:
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.cwd)
        sys.path[:] = self.path
        random.setstate(self.random)
        np.random.set_state(self.np_random)
        warnings.filters[:] = self.filters
        warnings._filters_mutated()
        np.set_printoptions(**self.printoptions)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pd.reset_option("all")
            dict.update(mpl.rcParams, self.rc)
        sys.setrecursionlimit(self.limit)
        decimal.setcontext(self.decimal.copy())


@pytest.fixture
def saved():
    s = _Saved()
    yield s
    s.restore()


def roundtrip(d: dict) -> dict:
    """The delta as the store gives it back: through JSON."""
    return json.loads(json.dumps(d))


def change_and_replay(saved: _Saved, change, observe, watch=(), ns=None):
    """Delta of ``change()``; ``observe()`` after it equals ``observe()`` after a replay."""
    before = procstate.snapshot(ns, watch)
    change()
    d = procstate.delta(before, procstate.snapshot(ns, watch))
    expected = observe()
    saved.restore()
    assert observe() != expected, "the test's change changed nothing observable"
    procstate.apply(roundtrip(d))
    assert observe() == expected
    return d


# -- plain data ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        2**100,
        -0.5,
        float("nan"),
        float("inf"),
        "é",
        b"\x00\xff",
        1 + 2j,
        [1, (2, 3), {4}],
        {"a": [1], 2: {"b": frozenset({1})}, (1, 2): None},
        [],
        (),
        {},
    ],
)
def test_plain_values_survive_json(value):
    back = decode(json.loads(json.dumps(encode(value))))
    assert type(back) is type(value)
    if value == value:  # not NaN
        assert back == value
    else:
        assert back != back


class Color(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize(
    "value",
    [collections.OrderedDict(a=1), collections.namedtuple("P", "x")(1), Color.RED, object()],
)
def test_subclasses_and_objects_are_not_plain(value):
    with pytest.raises(NotPlain):
        encode([value])


# -- the parts -------------------------------------------------------------------------


def test_nothing_changed_is_an_empty_delta():
    assert procstate.delta(procstate.snapshot(), procstate.snapshot()) == {}


def test_environment_set_and_unset(saved, monkeypatch):
    monkeypatch.setenv("NBD_GONE", "x")
    saved.env = dict(os.environ)

    def change():
        os.environ["NBD_NEW"] = "1"
        del os.environ["NBD_GONE"]

    d = change_and_replay(saved, change, lambda: dict(os.environ))
    assert d["env"] == {"set": {"NBD_NEW": "1"}, "unset": ["NBD_GONE"]}


def test_a_secret_environment_variable_is_not_written(saved):
    before = procstate.snapshot()
    os.environ["MY_API_KEY"] = "sk-verysecretvalue"
    secrets = {"MY_API_KEY": b"sk-verysecretvalue"}
    d = procstate.delta(before, procstate.snapshot(), secrets)
    assert "sk-verysecretvalue" not in json.dumps(d)
    assert procstate.replayable_reasons(d) == [
        "environment variable $MY_API_KEY looks secret (not written)"
    ]
    with pytest.raises(ValueError, match="MY_API_KEY"):
        procstate.apply(d)


def test_a_secret_copied_into_another_variable_is_not_written(saved):
    before = procstate.snapshot()
    os.environ["PLAIN_NAME"] = "sk-verysecretvalue"
    d = procstate.delta(before, procstate.snapshot(), {"MY_API_KEY": b"sk-verysecretvalue"})
    assert "sk-verysecretvalue" not in json.dumps(d)
    assert procstate.replayable_reasons(d) == [
        "environment variable $PLAIN_NAME holds the value of $MY_API_KEY"
    ]


def test_an_unknown_option_fails_before_changing_anything(saved):
    os.environ.pop("NBD_X", None)
    d = {"env": {"set": {"NBD_X": "1"}, "unset": []}, "pandas": {"display.no_such": 1}}
    with pytest.raises(Exception, match="no_such"):
        procstate.apply(d)
    d = {"env": {"set": {"NBD_X": "1"}, "unset": []}, "rcparams": {"no.such": 1}}
    with pytest.raises(KeyError, match="no.such"):
        procstate.apply(d)
    assert "NBD_X" not in os.environ


def test_a_secret_copied_into_a_module_is_not_written(saved, tmp_path, monkeypatch):
    mod = _user_module(tmp_path, monkeypatch, "nbd_secretmod", "TOKEN = None\n")
    monkeypatch.setenv("SERVICE_TOKEN", "tok-0123456789")
    before = procstate.snapshot()
    mod.TOKEN = os.environ["SERVICE_TOKEN"]
    d = procstate.delta(before, procstate.snapshot(), {"SERVICE_TOKEN": b"tok-0123456789"})
    assert "tok-0123456789" not in json.dumps(d)
    assert "modules" not in d
    assert any("SERVICE_TOKEN" in r for r in procstate.replayable_reasons(d))


def test_working_directory(saved, tmp_path):
    d = change_and_replay(saved, lambda: os.chdir(tmp_path), os.getcwd)
    assert d == {"cwd": str(tmp_path)}


def test_a_missing_working_directory_fails_before_changing_anything(saved, tmp_path):
    os.environ.pop("NBD_X", None)
    d = {"env": {"set": {"NBD_X": "1"}, "unset": []}, "cwd": str(tmp_path / "gone")}
    with pytest.raises(FileNotFoundError):
        procstate.apply(d)
    assert "NBD_X" not in os.environ


@pytest.mark.parametrize(
    "change, kind",
    [
        (lambda: sys.path.append("/nbd/back"), "back"),
        (lambda: sys.path.insert(0, "/nbd/front"), "front"),
        (lambda: sys.path.insert(1, "/nbd/middle"), "replace"),
        (lambda: sys.path.pop(), "replace"),
    ],
)
def test_sys_path(saved, change, kind):
    d = change_and_replay(saved, change, lambda: list(sys.path))
    assert list(d["path"]) == [kind]


def test_an_entry_appended_to_sys_path_is_appended_to_a_different_base(saved):
    before = procstate.snapshot()
    sys.path.append("/nbd/back")
    d = roundtrip(procstate.delta(before, procstate.snapshot()))
    saved.restore()
    sys.path.insert(0, "/nbd/other-kernel")  # another kernel's start-up path
    procstate.apply(d)
    assert sys.path[0] == "/nbd/other-kernel" and sys.path[-1] == "/nbd/back"


def test_random_seed_draws_the_same_numbers(saved):
    def draws():
        state = random.getstate()
        out = [random.random() for _ in range(3)]
        random.setstate(state)
        return out

    d = change_and_replay(saved, lambda: random.seed(1), draws)
    assert set(d) == {"random"}


def test_numpy_seed_draws_the_same_numbers(saved):
    def draws():
        state = np.random.get_state()
        out = np.random.rand(3).tolist() + [np.random.normal()]
        np.random.set_state(state)
        return out

    d = change_and_replay(saved, lambda: np.random.seed(0), draws)
    assert set(d) == {"numpy_random"}


def test_a_cached_gaussian_is_kept(saved):
    def change():
        np.random.seed(3)
        np.random.normal()  # leaves the second Box-Muller value cached

    def draws():
        state = np.random.get_state()
        out = [np.random.normal()]
        np.random.set_state(state)
        return out

    change_and_replay(saved, change, draws)


def _filters():
    return [tuple(f) for f in warnings.filters]


def test_recursion_limit(saved):
    d = change_and_replay(saved, lambda: sys.setrecursionlimit(4321), sys.getrecursionlimit)
    assert d == {"recursionlimit": 4321}


def test_decimal_context_settings_flags_and_traps(saved):
    def change():
        ctx = decimal.getcontext()
        ctx.prec, ctx.rounding = 4, decimal.ROUND_DOWN
        ctx.traps[decimal.DivisionByZero] = False
        decimal.Decimal(1) / decimal.Decimal(3)  # sets Inexact and Rounded

    def observe():
        ctx = decimal.getcontext()
        return (str(decimal.Decimal(2) / decimal.Decimal(3)), repr(ctx))

    d = change_and_replay(saved, change, observe)
    assert set(d) == {"decimal"}
    assert set(d["decimal"]) == {"prec", "rounding", "flags", "traps"}, d


def test_warnings_filters_in_front_and_at_the_back(saved):
    def change():
        warnings.filterwarnings("ignore", message="nbd.*", category=DeprecationWarning)
        warnings.simplefilter("error", UserWarning, append=True)

    d = change_and_replay(saved, change, _filters)
    assert d["warnings"]["replace"][0] == [
        "ignore",
        ["nbd.*", 34],  # re.IGNORECASE | re.UNICODE
        "builtins:DeprecationWarning",
        None,
        0,
    ]


def test_a_filter_added_in_front_follows_warnings_own_rule(saved):
    before = procstate.snapshot()
    warnings.filterwarnings("ignore", message="nbd-once")
    d = roundtrip(procstate.delta(before, procstate.snapshot()))
    expected = _filters()
    assert "front" in d["warnings"]
    procstate.apply(d)  # already there: moved to the front, not doubled
    assert _filters() == expected


def test_a_filter_category_from_the_notebook_is_not_replayable(saved):
    class Local(Warning):
        pass

    before = procstate.snapshot()
    warnings.simplefilter("ignore", Local)
    d = procstate.delta(before, procstate.snapshot())
    (reason,) = procstate.replayable_reasons(d)
    assert "Local" in reason and "cannot be found by name" in reason


def test_numpy_print_options(saved):
    d = change_and_replay(
        saved, lambda: np.set_printoptions(precision=2, threshold=5), np.get_printoptions
    )
    assert d == {"printoptions": {"precision": 2, "threshold": 5}}


def test_a_numpy_formatter_function_is_not_replayable(saved):
    before = procstate.snapshot()
    np.set_printoptions(formatter={"float": lambda x: f"{x:.1f}"})
    d = procstate.delta(before, procstate.snapshot())
    assert "formatter" in procstate.replayable_reasons(d)[0]


def _pandas():
    return {k: pd.get_option(k) for k in ("display.max_rows", "display.precision")}


def test_pandas_options(saved):
    def change():
        pd.set_option("display.max_rows", 7)
        pd.options.display.precision = 3

    d = change_and_replay(saved, change, _pandas)
    assert d == {"pandas": {"display.max_rows": 7, "display.precision": 3}}


def test_a_pandas_float_format_function_is_not_replayable(saved):
    before = procstate.snapshot()
    pd.set_option("display.float_format", "{:.2f}".format)
    d = procstate.delta(before, procstate.snapshot())
    assert "display.float_format" in procstate.replayable_reasons(d)[0]


def _rc():
    rc = mpl.rcParams
    return rc["lines.linewidth"], list(rc["figure.figsize"]), rc["axes.prop_cycle"]


def test_matplotlib_rcparams_with_a_cycler(saved):
    from cycler import cycler

    def change():
        mpl.rcParams["lines.linewidth"] = 4
        mpl.rcParams["figure.figsize"][0] = 9.0  # changed in place
        mpl.rcParams["axes.prop_cycle"] = cycler(color=["r", "g"]) * cycler(lw=[1, 2])

    d = change_and_replay(saved, change, _rc)
    assert set(d["rcparams"]) == {"lines.linewidth", "figure.figsize", "axes.prop_cycle"}


def test_switching_the_matplotlib_backend_is_not_replayable(saved):
    before = procstate.snapshot()
    dict.__setitem__(mpl.rcParams, "backend", "agg")
    before.rcparams["backend"] = "module://some_backend"
    d = procstate.delta(before, procstate.snapshot())
    assert "backend" in procstate.replayable_reasons(d)[0]


def test_the_backend_pyplot_loads_on_its_first_figure_is_loaded_again_on_replay():
    # pyplot loads its backend with the first figure, not on import; IPython's inline
    # backend then registers the PNG formatter later cells display figures with. A
    # replayed step that made the first figure left a kernel that showed every figure
    # as text only. Each half in a fresh process: pyplot's backend is loaded once.
    recorded = _python(
        textwrap.dedent(
            """
            import json
            import matplotlib
            matplotlib.use("agg")
            import matplotlib.pyplot as plt
            from nbdurable import procstate
            before = procstate.snapshot()
            plt.close(plt.figure())
            print(json.dumps(procstate.delta(before, procstate.snapshot())))
            """
        )
    )
    process = json.loads(recorded)
    assert process == {"mplbackend": "agg"}
    replayed = _python(
        textwrap.dedent(
            f"""
            import matplotlib
            matplotlib.use("agg")
            import matplotlib.pyplot as plt
            from nbdurable import procstate
            print(plt._backend_mod is None)
            procstate.apply({process!r})
            print(plt._backend_mod is not None, matplotlib.get_backend())
            """
        )
    )
    assert replayed.splitlines() == ["True", "True agg"]


# -- modules ---------------------------------------------------------------------------


def _user_module(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    __import__(name)
    mod = sys.modules[name]
    monkeypatch.setitem(sys.modules, name, mod)  # removed again after the test
    return mod


HELPERS = """
REGISTRY = []
SCALE = 1
TABLE = {"a": 1}
def f():
    return 1
"""


def test_user_module_data_is_updated_in_place_or_set(saved, tmp_path, monkeypatch):
    mod = _user_module(tmp_path, monkeypatch, "nbd_helpers1", HELPERS)
    registry = mod.REGISTRY
    assert procstate.is_user_module(mod.__name__, mod)

    def change():
        mod.REGISTRY.append(("h", 1))
        mod.SCALE = 3
        mod.NEW = {1, 2}
        del mod.TABLE

    before = procstate.snapshot()
    change()
    d = roundtrip(procstate.delta(before, procstate.snapshot()))
    assert d["modules"]["nbd_helpers1"] == {
        "update": {"REGISTRY": [{"tuple": ["h", 1]}]},
        "set": {"SCALE": 3, "NEW": {"set": [1, 2]}},
        "del": ["TABLE"],
    }
    registry.clear()
    mod.SCALE, mod.TABLE = 1, {"a": 1}
    del mod.NEW
    procstate.apply(d)
    assert mod.REGISTRY is registry and registry == [("h", 1)]
    assert (mod.SCALE, mod.NEW, hasattr(mod, "TABLE")) == (3, {1, 2}, False)


def test_rebinding_a_user_module_function_is_not_replayable(tmp_path, monkeypatch):
    mod = _user_module(tmp_path, monkeypatch, "nbd_helpers2", HELPERS)
    before = procstate.snapshot()
    mod.f = lambda: 2
    d = procstate.delta(before, procstate.snapshot())
    assert procstate.replayable_reasons(d) == [
        "module nbd_helpers2 attribute f holds a builtins.function"
    ]


def test_a_user_module_the_step_imports_and_changes(tmp_path, monkeypatch):
    (tmp_path / "nbd_helpers3.py").write_text(HELPERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nbd_helpers3", raising=False)
    before = procstate.snapshot()
    import nbd_helpers3  # noqa: F401 - the step's own import

    nbd_helpers3.REGISTRY.append("h")
    nbd_helpers3.SCALE = 3
    d = roundtrip(procstate.delta(before, procstate.snapshot()))
    assert procstate.replayable_reasons(d) == []
    del sys.modules["nbd_helpers3"]  # a new kernel
    procstate.apply(d)
    again = sys.modules["nbd_helpers3"]
    assert again is not nbd_helpers3 and (again.REGISTRY, again.SCALE) == (["h"], 3)


def test_an_object_in_a_user_module_the_step_imports_must_match(tmp_path, monkeypatch):
    src = "import collections\nBOX = collections.deque()\n"
    (tmp_path / "nbd_helpers4.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nbd_helpers4", raising=False)
    before = procstate.snapshot()
    import nbd_helpers4

    nbd_helpers4.BOX.append(5)  # by content, but not plain data
    d = roundtrip(procstate.delta(before, procstate.snapshot()))
    del sys.modules["nbd_helpers4"]
    with pytest.raises(LookupError, match="nbd_helpers4 attribute BOX"):
        procstate.apply(d)


def test_assigned_attributes_are_read_from_the_source():
    src = "a.b.c = 1\nx.y += 2\ndel m.z\nsetattr(q, 'w', 3)\nu, v.t = 1, 2\nd['k'] = 1\n"
    assert procstate.assigned_attributes(src) == [
        ("a.b", "c"),
        ("m", "z"),
        ("q", "w"),
        ("v", "t"),
        ("x", "y"),
    ]
    assert procstate.assigned_attributes("def (") == []


def test_a_monkeypatch_on_a_library_module_is_not_replayable(monkeypatch):
    import json as json_mod

    ns = {"js": json_mod}
    watch = procstate.assigned_attributes("js.dumps = fake")
    before = procstate.snapshot(ns, watch)
    monkeypatch.setattr(json_mod, "dumps", lambda *a, **k: "")
    d = procstate.delta(before, procstate.snapshot(ns, watch))
    assert procstate.replayable_reasons(d) == [
        "module json attribute dumps was rebound to a function"
    ]


def test_plain_data_set_on_a_library_module_is_replayed(monkeypatch):
    import textwrap as mod

    ns = {"tw": mod}
    watch = procstate.assigned_attributes("tw.NBD_FLAG = 5")
    before = procstate.snapshot(ns, watch)
    monkeypatch.setattr(mod, "NBD_FLAG", 5, raising=False)
    d = roundtrip(procstate.delta(before, procstate.snapshot(ns, watch)))
    assert d == {"modules": {"textwrap": {"set": {"NBD_FLAG": 5}}}}
    monkeypatch.setattr(mod, "NBD_FLAG", 0)
    procstate.apply(d)
    assert mod.NBD_FLAG == 5


def test_modules_made_on_the_fly_are_not_user_state(monkeypatch):
    # torch.ops is a module object torch makes itself, with __file__ "_ops.py" (relative,
    # no import spec); it grows a namespace module per name code touches
    # (torch.ops._inductor_test), which no fresh kernel can import.
    ops = type(sys)("nbd_fake_ops")
    ops.__file__ = "_ops.py"
    monkeypatch.setitem(sys.modules, "nbd_fake_ops", ops)
    assert not procstate.is_user_module("nbd_fake_ops", ops)
    before = procstate.snapshot()
    ops._made_on_the_fly = type(sys)("nbd_fake_ops._made_on_the_fly")
    d = procstate.delta(before, procstate.snapshot())
    assert "modules" not in d
    assert procstate.replayable_reasons(d) == []


def test_a_user_module_bound_to_a_module_made_on_the_fly_is_not_replayable(
    saved, tmp_path, monkeypatch
):
    mod = _user_module(tmp_path, monkeypatch, "nbd_helpers_dyn", HELPERS)
    before = procstate.snapshot()
    monkeypatch.setattr(mod, "SUB", type(sys)("nbd_nowhere"), raising=False)
    monkeypatch.setattr(mod, "JSON", json, raising=False)
    d = procstate.delta(before, procstate.snapshot())
    assert d["modules"]["nbd_helpers_dyn"]["import"] == {"JSON": "json"}
    (reason,) = procstate.replayable_reasons(d)
    assert "SUB is a module that cannot be imported" in reason


def test_library_and_own_modules_are_not_user_modules():
    assert not procstate.is_user_module("json", json)
    assert not procstate.is_user_module("numpy", np)
    assert not procstate.is_user_module("nbdurable.procstate", procstate)


# -- cost and imports ----------------------------------------------------------------


def _python(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_snapshots_and_applying_import_no_heavy_module():
    code = textwrap.dedent(
        """
        import os, sys
        from nbdurable import procstate
        b = procstate.snapshot()
        os.environ["NBD_X"] = "1"
        d = procstate.delta(b, procstate.snapshot())
        procstate.apply(d)
        print(sorted(m for m in ("numpy", "pandas", "matplotlib") if m in sys.modules))
        procstate.apply({"printoptions": {"precision": 3}})
        print("numpy" in sys.modules)
        """
    )
    assert _python(code).splitlines() == ["[]", "True"]


def test_a_step_importing_numpy_and_pandas_records_only_its_changes():
    code = textwrap.dedent(
        """
        import json
        from nbdurable import procstate
        b = procstate.snapshot()
        import numpy as np, pandas as pd
        pd.set_option("display.max_rows", 9)
        np.set_printoptions(precision=4)
        d = procstate.delta(b, procstate.snapshot())
        print(json.dumps({k: d[k] for k in ("printoptions", "pandas")}))
        print(procstate.replayable_reasons(d))
        """
    )
    first, second = _python(code).splitlines()
    assert json.loads(first) == {
        "printoptions": {"precision": 4},
        "pandas": {"display.max_rows": 9},
    }
    assert second == "[]"


# -- in-memory SQLite databases (procstate.sqlite) --------------------------------------


def test_a_write_to_an_in_memory_sqlite_database_makes_the_step_unreplayable(tmp_path):
    # An agent framework's session (the Agents SDK's SQLiteSession, LlamaIndex's Memory)
    # keeps its rows there: no attribute changes, and a replay left the session empty.
    import sqlite3

    procstate.watch_sqlite()
    memory = sqlite3.connect(":memory:")
    memory.execute("create table t (x)")
    on_disk = sqlite3.connect(tmp_path / "db.sqlite")
    on_disk.execute("create table t (x)")

    before = procstate.snapshot()
    on_disk.execute("insert into t values (1)")  # a file's rows stay written
    memory.execute("select count(*) from t").fetchall()  # a read changes nothing
    assert procstate.replayable_reasons(procstate.delta(before, procstate.snapshot())) == []

    before = procstate.snapshot()
    memory.execute("insert into t values (1)")
    reasons = procstate.replayable_reasons(procstate.delta(before, procstate.snapshot()))
    assert reasons == [
        "it wrote to an in-memory SQLite database, whose rows a replay cannot restore"
    ]

    # A database the step made and let go of leaves nothing behind.
    before = procstate.snapshot()
    scratch = sqlite3.connect(":memory:")
    scratch.execute("create table s (x)")
    scratch.close()
    del scratch
    import gc

    gc.collect()
    assert procstate.replayable_reasons(procstate.delta(before, procstate.snapshot())) == []
    memory.close()
    on_disk.close()


def test_the_database_files_a_step_writes_are_kept_with_its_process_changes(tmp_path):
    # A step that inserts into a SQLite file through a handle it keeps would insert
    # again if its body ran on replay: the files it wrote are recorded (see dbwrites).
    import sqlite3

    from nbdurable.store import open_store

    procstate.watch_sqlite()
    con = sqlite3.connect(tmp_path / "shop.db")
    con.execute("create table t (x)")
    con.execute("insert into t values (1)")

    before = procstate.snapshot()
    con.execute("with v as (select x from t) select count(*) from v").fetchall()  # a read
    assert "dbfiles" not in procstate.delta(before, procstate.snapshot())

    before = procstate.snapshot()
    con.execute("insert into t values (2)")
    con.commit()
    con.close()  # closed and freed inside the step: still counted
    del con
    delta = procstate.delta(before, procstate.snapshot())
    assert delta["dbfiles"] == [str(tmp_path / "shop.db")]
    assert procstate.replayable_reasons(delta) == []  # the file keeps the rows

    # nbdurable's own store (diskcache, in SQLite) is not the step's database.
    before = procstate.snapshot()
    with open_store(tmp_path / "store") as store:
        store.put("k", b"header", b"body")
    assert "dbfiles" not in procstate.delta(before, procstate.snapshot())


def test_what_a_statement_writes_is_told_from_its_sql_not_its_words(tmp_path):
    # A function named like a write in a CTE and a literal holding a write's word are
    # reads; a write after a leading comment is a write (a file's and memory's alike).
    import sqlite3

    procstate.watch_sqlite()
    con = sqlite3.connect(tmp_path / "shop.db")
    memory = sqlite3.connect(":memory:")
    for db in (con, memory):
        db.execute("create table t (x)")
        db.execute("insert into t values ('a')")
    reads = [
        "with v as (select replace(x, 'a', 'b') as y from t) select * from v",
        "select 'update' from t where x != 'delete'",
        '-- insert into t values (9)\nselect x as "insert" from t',
    ]
    writes = [
        "-- one more row\ninsert into t values ('b')",
        "/* fix it */ update t set x = 'c' where x = 'b'",
        "  -- a\n  /* b */\n  with v as (select 'd') insert into t select * from v",
    ]
    for db in (con, memory):
        for sql in reads:
            before = procstate.snapshot()
            db.execute(sql).fetchall()
            delta = procstate.delta(before, procstate.snapshot())
            assert "dbfiles" not in delta and "unreplayable" not in delta, sql
        for sql in writes:
            before = procstate.snapshot()
            db.execute(sql)
            delta = procstate.delta(before, procstate.snapshot())
            assert "dbfiles" in delta or "unreplayable" in delta, sql
    con.close()
    memory.close()


def test_a_file_written_is_counted_once_between_two_snapshots(tmp_path):
    # Once a file is known written since the last snapshot, its callback returns
    # at once: a step inserting row by row pays one check per statement, not a parse.
    import sqlite3

    from nbdurable.procstate import sqlite as watched

    procstate.watch_sqlite()
    con = sqlite3.connect(tmp_path / "shop.db")
    con.execute("create table t (x)")
    before = procstate.snapshot()
    for i in range(5):
        con.execute("insert into t values (?)", (i,))
    after = procstate.snapshot()
    path = str(tmp_path / "shop.db")
    assert after.sqlite_files[path] == before.sqlite_files[path] + 1
    assert procstate.delta(before, after)["dbfiles"] == [path]
    con.execute("insert into t values (5)")  # the next interval counts again
    assert watched.file_counts()[path] == after.sqlite_files[path] + 1
    con.close()
