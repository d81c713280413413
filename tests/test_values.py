"""Saved variables load back as the objects they were (nbdurable.store.values), in-process.

What a kernel would restore, checked without one: pickled with nbdurable's
pickler, loaded back, compared with the object that was saved (its
fingerprint, or what its library reads of it).
"""

from __future__ import annotations

import functools
import reprlib
import types

import pytest

from nbdurable.identity import localcode
from nbdurable.identity.fingerprint import fingerprint
from nbdurable.store import values


def _notebook_function(source: str, name: str) -> types.FunctionType:
    """A function as a notebook cell defines it: its globals are ``__main__``'s."""
    ns: dict = {"__name__": "__main__"}
    exec(compile(source, "<cell-1>", "exec"), ns)
    return ns[name]


def test_a_library_wrapper_of_a_notebook_function_stays_library_code():
    # reprlib's guard (as dataclasses' __repr__) copies the notebook function's
    # __module__ onto its wrapper, so the wrapper is pickled by value; cloudpickle
    # wrote its code's file as <dynamic-code>, and the loaded wrapper was taken for
    # notebook code, whose fingerprint also reads its globals (reprlib's _thread).
    user = _notebook_function("def show(self):\n    return 'x'\n", "show")
    wrapper = reprlib.recursive_repr()(user)
    assert wrapper.__module__ == "__main__"
    loaded = values.loads(values.dumps(wrapper))
    assert loaded.__code__.co_filename == wrapper.__code__.co_filename
    assert not localcode.is_local_function(loaded)
    assert fingerprint(loaded) == fingerprint(wrapper)
    # The notebook's own code keeps cloudpickle's file name.
    assert values.loads(values.dumps(user)).__code__.co_filename == "<dynamic-code>"


def test_a_pydantic_model_loads_with_the_fields_it_was_given():
    # LlamaIndex's __setstate__ calls __init__(**fields), which marks every field set:
    # model_dump(exclude_unset=True) of the loaded object then differs.
    pydantic = pytest.importorskip("pydantic")

    class Store(pydantic.BaseModel):
        store: dict = {}
        name: str = "s"

        def __setstate__(self, state):
            self.__init__(**state["__dict__"])

    made = Store()
    made.store["k"] = 1
    assert made.model_fields_set == set()
    loaded = values.loads(values.dumps(made))
    assert loaded.store == {"k": 1}
    assert loaded.model_fields_set == set()
    assert loaded.model_dump(exclude_unset=True) == made.model_dump(exclude_unset=True)
    given = Store(name="t")
    assert values.loads(values.dumps(given)).model_fields_set == {"name"}


def test_a_registered_tiktoken_encoding_loads_without_making_it_again(monkeypatch):
    # tiktoken pickles an encoding of its registry by name, and loading makes it again
    # from files it downloads (LlamaIndex points it at the files it ships only while it
    # makes its tokenizer): a fresh kernel without a network could not load a splitter.
    tiktoken = pytest.importorskip("tiktoken")
    registry = pytest.importorskip("tiktoken.registry")
    ranks = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding(
        "nbdurable-test", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={"<e>": 256}
    )
    monkeypatch.setitem(registry.ENCODINGS, "nbdurable-test", enc)
    tokenizer = functools.partial(enc.encode, allowed_special="all")
    data, before = values.dumps(tokenizer), fingerprint(tokenizer)
    assert values.loads(data).func.__self__ is enc  # the registry's, while it has it

    # A fresh kernel: the registry does not have it, and nothing can make it by name.
    monkeypatch.delitem(registry.ENCODINGS, "nbdurable-test")
    loaded = values.loads(data)
    assert loaded("ab <e>") == tokenizer("ab <e>")
    assert registry.ENCODINGS["nbdurable-test"] is loaded.func.__self__  # as get_encoding
    assert fingerprint(loaded) == before

    # An unregistered encoding is tiktoken's own business (it pickles its ranks).
    other = tiktoken.Encoding("mine", pat_str=r"\S+", mergeable_ranks=ranks, special_tokens={})
    assert values.loads(values.dumps(other)).encode("ab") == other.encode("ab")
    assert "mine" not in registry.ENCODINGS


def test_a_polars_sqlcontext_keeps_its_registered_tables():
    # Its tables live in a native context: before, `register` changed nothing a
    # fingerprint saw (a step registering a table replayed as unchanged) and the
    # context did not pickle (the step that made it ran again, without the table).
    pl = pytest.importorskip("polars")
    ctx = pl.SQLContext()
    empty = fingerprint(ctx)
    ctx.register("t", pl.DataFrame({"a": [1, 2, 3]}))
    assert fingerprint(ctx) != empty
    loaded = values.loads(values.dumps(ctx))
    assert loaded.tables() == ["t"]
    assert loaded.execute("select sum(a) as s from t", eager=True)["s"].to_list() == [6]
    assert fingerprint(loaded) == fingerprint(ctx)


def test_instances_of_an_ordinary_class_are_looked_at_once_per_type(monkeypatch):
    """A step holding a million instances pays the pickler's rules once per type."""
    looked = []
    real = localcode.lazy_names
    monkeypatch.setattr(localcode, "lazy_names", lambda t: looked.append(t) or real(t))
    source = "class Point:\n    def __init__(self, x):\n        self.x = x\n"
    cls = _notebook_function(source, "Point")
    points = [cls(i) for i in range(200)]
    joint = values.dump_values([points])
    assert looked.count(cls) == 1
    got = values.load_values(joint.stream, 1, {"Point": cls}, joint.buffers)[0][0]
    assert [p.x for p in got] == list(range(200)) and all(type(p) is cls for p in got)
    assert joint.parts[0][3], "still known as notebook code"


class _Registered:
    def __init__(self, x):
        self.x = x


def _registered_reduce(obj):
    return _Registered, (obj.x * 10,)


def test_reducers_are_one_dict_and_a_copyreg_registration_made_later_counts():
    """The C pickler looks reducers up per object: a dict, not cloudpickle's ChainMap."""
    import copyreg
    import io

    pickler = values._Pickler(io.BytesIO(), protocol=values.PROTOCOL)
    assert type(pickler.dispatch_table) is dict
    copyreg.pickle(_Registered, _registered_reduce)
    try:
        assert values.loads(values.dumps([_Registered(2)]))[0].x == 20
        joint = values.dump_values([[_Registered(3)]])
        assert values.load_values(joint.stream, 1, {}, joint.buffers)[0][0][0].x == 30
    finally:
        del copyreg.dispatch_table[_Registered]
