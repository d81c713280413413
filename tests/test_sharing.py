"""A step's values keep what they share: with each other, with the namespace, numpy views.

In-process, on a real store in tmp_path (the kernel corpus in tests/fidelity
checks the same against plain runs): values are saved the way a step records
them, then loaded into a "fresh kernel" namespace rebuilt as a rerun would.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from nbdurable.durable import recording
from nbdurable.identity import keys
from nbdurable.store import Store, sharing, values


def _fp(value, _name):
    return keys.fingerprint(value)


def save(store: Store, ns: dict, names: list[str], checked=(), in_place=()) -> recording.Saved:
    others = [n for n in ns if n not in names]
    saved = recording.save_variables(
        store, ns, names, set(), _fp, {}, others=others, checked=checked, in_place=in_place
    )
    store.apply(puts=[], blobs=saved.pending)
    return saved


def load(store: Store, saved: recording.Saved, ns: dict, live=None) -> dict:
    restored, _pure = recording.load_variables(store, saved.variables, ns, live)
    return restored


def test_names_bound_to_one_object_load_back_as_one(store):
    a = [1, 2]
    ns = {"a": a, "b": a, "t": (a, a), "grid": [a, a]}
    saved = save(store, ns, ["a", "b", "t", "grid"])
    assert {v.kind for v in saved.variables} == {"shared"}
    assert len({v.ref for v in saved.variables}) == 1, "one blob for the step"
    got = load(store, saved, {})
    assert got["a"] is got["b"] is got["t"][0] is got["t"][1] is got["grid"][1]
    assert got["a"] is not a


def test_an_object_of_the_namespace_is_referenced_not_copied(store):
    missing, cfg = object(), {"lr": 1}

    def handler(x):
        return x + 1

    ns = {"MISSING": missing, "cfg": cfg, "handler": handler, "reg": None}
    ns["reg"] = {"x": missing, "cfg": cfg, "on": handler, "nested": [cfg]}
    saved = save(store, ns, ["reg"])
    # A rerun: the plain cells make new objects; the replayed step refers to them.
    fresh = {"MISSING": object(), "cfg": {"lr": 1}, "handler": handler}
    got = load(store, saved, fresh)["reg"]
    assert got["x"] is fresh["MISSING"]
    assert got["cfg"] is fresh["cfg"] and got["nested"][0] is fresh["cfg"]
    assert got["on"] is handler


def test_references_to_objects_alone_are_written_without_asking_about_every_object(
    store, monkeypatch
):
    """A reference to an instance, a class or a function is written from reducer_override.

    Only a reference to a list, dict, str... needs persistent_id, a Python
    call for every object pickled (seconds for a million). The references
    still load as the live objects, once each, and are still checked.
    """

    class Model:
        def __init__(self, n):
            self.n = n

    model = Model(1)
    ns = {"Model": Model, "model": model, "rows": None}
    ns["rows"] = [{"i": i, "m": model, "cls": Model} for i in range(1000)]
    asked = []
    monkeypatch.setattr(
        values._RefPickler, "persistent_id", lambda self, obj: asked.append(1), raising=True
    )
    saved = save(store, ns, ["rows"])
    assert asked == [], "no object was asked about"
    fresh = {"Model": Model, "model": Model(1)}
    rows = load(store, saved, fresh)["rows"]
    assert len(rows) == 1000 and all(r["m"] is fresh["model"] for r in rows)
    assert all(r["cls"] is Model for r in rows) and rows[5]["i"] == 5
    with pytest.raises(recording.LoadFailed) as failed:
        load(store, saved, {"Model": Model, "model": Model(2)})
    assert isinstance(failed.value.cause, sharing.NotExact)


def test_values_sharing_only_other_variables_are_pickled_once(store, monkeypatch):
    """Instances of a class another cell defined (the common large step) take one pass.

    The other variables' own values are known to live elsewhere before
    anything is pickled; a second pass is only for what lies deeper.
    """

    class Row:
        def __init__(self, i):
            self.i = i

    pickled = []
    real = values._Pickler.reducer_override

    def counting(self, obj):
        if type(obj) is Row:
            pickled.append(obj.i)
        return real(self, obj)

    monkeypatch.setattr(values._Pickler, "reducer_override", counting)
    ns = {"Row": Row, "rows": [Row(i) for i in range(50)]}
    saved = save(store, ns, ["rows"])
    assert sorted(pickled) == list(range(50)), "each row pickled once"
    got = load(store, saved, {"Row": Row})["rows"]
    assert [r.i for r in got] == list(range(50)) and all(type(r) is Row for r in got)
    # What lies below another variable is still found, with a second pass.
    cfg = {"lr": 1}
    ns = {"Row": Row, "holder": [cfg], "rows": [Row(1), cfg]}
    pickled.clear()
    saved = save(store, ns, ["rows"])
    assert pickled == [1, 1], "found below `holder` after the first pass, then written again"
    fresh_cfg = {"lr": 1}
    got = load(store, saved, {"Row": Row, "holder": [fresh_cfg]})["rows"]
    assert got[1] is fresh_cfg and type(got[0]) is Row


def test_a_reference_to_a_container_is_still_asked_about(store, monkeypatch):
    cfg = {"lr": 1}
    ns = {"cfg": cfg, "model": [cfg, cfg]}
    asked = []
    real = values._RefPickler.persistent_id
    monkeypatch.setattr(
        values._RefPickler, "persistent_id", lambda self, obj: asked.append(1) or real(self, obj)
    )
    saved = save(store, ns, ["model"])
    assert asked, "a dict is written by the pickler itself: only persistent_id sees it"
    got = load(store, saved, {"cfg": {"lr": 1}})["model"]
    assert got[0] is got[1]


def test_a_path_through_containers_and_attributes_is_followed(store):
    class Box:
        pass

    box = Box()
    box.items = [{"k": [1]}]
    inner = box.items[0]["k"]
    ns = {"box": box, "mine": [inner]}
    saved = save(store, ns, ["mine"])
    got = load(store, saved, ns)["mine"]
    assert got[0] is inner


def test_a_referenced_object_that_changed_refuses_the_replay(store):
    cfg = {"lr": 1}
    ns = {"cfg": cfg, "model": {"cfg": cfg}}
    saved = save(store, ns, ["model"])
    with pytest.raises(recording.LoadFailed) as failed:
        load(store, saved, {"cfg": {"lr": 2}})
    assert isinstance(failed.value.cause, sharing.NotExact)
    assert "cfg" in str(failed.value.cause)
    with pytest.raises(recording.LoadFailed):
        load(store, saved, {})  # gone from the namespace


def test_a_reference_rooted_at_a_checked_input_carries_no_fingerprint(store):
    cfg = {"lr": 1}
    ns = {"cfg": cfg, "model": {"cfg": cfg}}
    saved = save(store, ns, ["model"], checked=["cfg"])
    # The plan compares the inputs' fingerprints; the reference itself is not checked again.
    other = {"lr": 2}
    assert load(store, saved, {"cfg": other})["model"]["cfg"] is other


def test_numpy_views_stay_views_of_their_array(store):
    arr = np.arange(10.0)
    ns = {"arr": arr, "v": arr[2:8:2], "r": arr[::-1], "alias": arr}
    saved = save(store, ns, ["arr", "v", "r", "alias"])
    got = load(store, saved, {})
    a = got["arr"]
    assert got["alias"] is a and got["v"].base is a and got["r"].base is a
    assert got["v"].tolist() == [2.0, 4.0, 6.0] and got["r"][0] == 9.0
    got["v"][0] = 99
    assert a[2] == 99 and got["r"][7] == 99
    assert a[1:].base is a, "a view made after the replay has the array as its base"


def test_a_view_of_an_array_of_the_namespace_refers_to_it(store):
    arr = np.zeros(4)
    ns = {"arr": arr, "mid": arr[1:3]}
    saved = save(store, ns, ["mid"], checked=["arr"])
    fresh = {"arr": np.zeros(4)}
    mid = load(store, saved, fresh)["mid"]
    assert mid.base is fresh["arr"]
    mid[:] = 5
    assert fresh["arr"].tolist() == [0, 5, 5, 0]


def test_a_large_array_stays_out_of_band(store):
    big = np.ones(1_000_000)
    saved = save(store, {"big": big, "alias": big}, ["big", "alias"])
    sha = saved.variables[0].ref
    blob = store.get_blob(sha)
    assert len(blob.buffers) == 1 and blob.buffers[0].nbytes == big.nbytes
    assert len(blob.stream) < 10_000
    got = load(store, saved, {})
    assert got["big"] is got["alias"] and got["big"].flags.writeable


def test_an_aliased_dataframe_loads_as_one(store):
    df = pd.DataFrame({"x": [1, 2, 3]})
    saved = save(store, {"df": df, "train": df}, ["df", "train"])
    got = load(store, saved, {})
    assert got["train"] is got["df"]


def _frame_and_series():
    df = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    s = pd.Series([1.0, 2.0, 3.0, 4.0], name="s")
    return {"df": df, "g": df.groupby("k"), "s": s, "r": s.rolling(2)}


def test_a_frame_changed_in_place_is_restored_into_the_live_one(store):
    # `g = df.groupby(..)` in one step, `df["v"] *= 10` in the next: in a plain run
    # g.obj is df, so g sums the changed column. Loaded as a new frame bound to
    # `df`, the replay left g (restored by the first step) on the old one.
    ns = _frame_and_series()
    ns["df"]["v"] *= 10
    ns["s"][0] = 10.0
    saved = save(store, ns, ["df", "s"], in_place=["df", "s"])
    fresh = _frame_and_series()  # the first step's replay, in a fresh kernel
    live = sharing.LiveTargets({"df": fresh["df"], "s": fresh["s"]})
    got = load(store, saved, fresh, live)
    assert got["df"] is fresh["df"] is fresh["g"].obj
    assert got["s"] is fresh["s"] is fresh["r"].obj
    pd.testing.assert_frame_equal(fresh["g"].sum(), ns["g"].sum())
    pd.testing.assert_series_equal(fresh["r"].mean(), ns["r"].mean())
    assert fresh["s"].name == "s" and fresh["df"].flags.allows_duplicate_labels
    # An abandoned replay gives them back what they held.
    live.undo()
    assert fresh["df"]["v"].tolist() == [1, 2, 3] and fresh["s"][0] == 1.0


def test_one_unpicklable_value_does_not_lose_the_others(store):
    def gen():
        yield 1

    a = [1]
    ns = {"g": gen(), "a": a, "b": a}
    saved = save(store, ns, ["a", "g", "b"])
    kinds = {v.name: v.kind for v in saved.variables}
    assert kinds == {"g": "unsaved", "a": "shared", "b": "shared"}
    shared = [v for v in saved.variables if v.kind == "shared"]
    got, _pure = recording.load_variables(store, shared, {})
    assert got["a"] is got["b"]


def test_a_secret_in_one_value_keeps_only_that_one_out(store, monkeypatch):
    ns = {"token": "s3cr3t-value-123", "a": [1], "b": None}
    ns["b"] = ns["a"]
    secrets = {"API_KEY": b"s3cr3t-value-123"}
    saved = recording.save_variables(store, ns, ["token", "a", "b"], set(), _fp, secrets, others=[])
    kinds = {v.name: v.kind for v in saved.variables}
    assert kinds == {"token": "unsaved", "a": "shared", "b": "shared"}
    assert saved.secrets == ["token (the value of $API_KEY)"]


def test_an_old_record_of_one_value_per_blob_still_loads(store):
    from nbdurable.store.records import VarRecord

    stream, buffers = values.dumps_parts([1, 2])
    sha, _ = store.put_blob(stream, buffers)
    restored, _ = recording.load_variables(store, [VarRecord("x", "value", sha, "")], {})
    assert restored == {"x": [1, 2]}


def test_a_deep_linked_list_in_the_namespace_is_indexed_within_bounds():
    class Node:
        def __init__(self, nxt):
            self.nxt = nxt

    head = None
    for _ in range(5000):
        head = Node(head)
    every, node = set(), head
    while node is not None:
        every.add(id(node))
        node = node.nxt
    found = sharing.index({"head": head}, ["head"], every)
    assert len(found) == sharing.DEPTH + 1
    assert max(len(path) for path, _obj in found.values()) == sharing.DEPTH + 1


def test_each_large_array_is_a_blob_of_its_own(store):
    from nbdurable.store import blobs

    n = blobs.MAP_OVER // 8 + 1
    big, big2 = np.ones(n), np.full(n, 2.0)
    ns = {"big": big, "big2": big2, "small": np.arange(10), "view": big[:5]}
    saved = save(store, ns, ["big", "big2", "small", "view"])
    by = {v.name: v for v in saved.variables}
    assert len(by["big"].spilled) == 1 and len(by["big2"].spilled) == 1, by
    assert by["small"].spilled == () and by["view"].spilled == ()
    assert by["big"].spilled[0][1] != by["big2"].spilled[0][1]
    got = load(store, saved, {})
    assert got["big"][0] == 1.0 and got["big2"][-1] == 2.0 and list(got["small"]) == list(range(10))
    got["view"][0] = 9
    assert got["big"][0] == 9, "the view still writes into its array"
    # Two arrays of one shape: one step blob, told apart by their spilled blobs.
    other = save(store, {"big": np.zeros(n), "big2": big2}, ["big", "big2"])
    first = save(store, {"big": big, "big2": big2}, ["big", "big2"])
    assert other.variables[0].ref == first.variables[0].ref
    assert other.variables[0].fp != first.variables[0].fp


def test_plain_data_after_an_object_is_still_known_as_plain(store):
    class Obj:
        pass

    rows, objs, arr = [{"i": 1}], [Obj()], np.ones(3)
    ns = {"arr": arr, "objs": objs, "rows": rows, "more": [rows]}
    saved = save(store, ns, ["arr", "objs", "rows", "more"])
    plain = {name: got[2] for name, got in saved.origins.items()}
    assert plain == {"rows": True, "more": True, "objs": False, "arr": False}, plain
    _restored, pure = recording.load_variables(store, saved.variables, {})
    assert pure == plain


def test_one_value_that_would_not_restore_keeps_only_itself_unsaved(store, monkeypatch):
    class Weird:
        def __reduce__(self):
            return (int, ("not a number",))

    import sys

    Weird.__module__, Weird.__qualname__ = "__main__", "Weird"  # as if the notebook's
    monkeypatch.setattr(sys.modules["__main__"], "Weird", Weird, raising=False)
    ns = {"w": Weird(), "v": [7], "u": {"k": 1}}
    saved = save(store, ns, ["w", "v", "u"])
    kinds = {v.name: v.kind for v in saved.variables}
    assert kinds == {"w": "unsaved", "v": "shared", "u": "shared"}, kinds
    shared = [v for v in saved.variables if v.kind == "shared"]
    assert recording.load_variables(store, shared, {})[0] == {"v": [7], "u": {"k": 1}}


def test_a_value_that_fails_to_load_is_the_one_blamed(store):
    from nbdurable.store.records import VarRecord

    class Later:
        def __reduce__(self):
            return (_raise_on_load, ())

    ns = {"a": [1], "bad": Later(), "c": [3]}
    # Recorded as a trial load would not see it fail (it fails only on replay).
    stream_parts = values.dump_values([ns["a"], ns["bad"], ns["c"]])
    sha, _ = store.put_blob(stream_parts.stream, stream_parts.buffers)
    variables = [VarRecord(n, "shared", sha, "") for n in ("a", "bad", "c")]
    with pytest.raises(recording.LoadFailed) as failed:
        recording.load_variables(store, variables, {})
    assert failed.value.names == ["bad"]


def _raise_on_load():
    raise ValueError("not here")


def test_gc_keeps_the_spilled_blobs_a_record_names(store):
    from nbdurable.store import admin, blobs
    from nbdurable.store.records import StepRecord

    big = np.ones(blobs.MAP_OVER // 8 + 1)
    saved = save(store, {"big": big}, ["big"])
    rec = StepRecord("run", "key", "s", 0, "", "", {}, {}, tuple(saved.variables), (), (), 0.0, 0.0)
    refs = admin._blob_refs(rec.to_header())
    (var,) = saved.variables
    assert refs == {var.ref, var.spilled[0][1]}


def test_a_library_object_is_indexed_by_its_own_attributes_only():
    import logging

    handler = logging.StreamHandler()
    log = logging.Logger("indexed")
    log.addHandler(handler)
    wanted = {id(log.handlers), id(handler), id(handler.stream)}
    found = sharing.index({"log": log}, ["log"], wanted)
    assert {path for path, _obj in found.values()} == {("log", ("a", "handlers"))}


def test_a_literal_key_in_one_value_keeps_only_that_one_out(store):
    key = "sk-proj-" + "Ab3x" * 12
    ns = {"cfg": {"api_key": key}, "a": [1], "b": None}
    ns["b"] = ns["a"]
    saved = recording.save_variables(store, ns, ["cfg", "a", "b"], set(), _fp, {}, others=[])
    kinds = {v.name: v.kind for v in saved.variables}
    assert kinds == {"cfg": "unsaved", "a": "shared", "b": "shared"}
    assert saved.secrets == ["cfg (a literal openai key)"]


class _Checkpointer:
    """A library's SQLite checkpointer: a connection, a lock, a flag set on first use."""

    def __init__(self, conn) -> None:
        import threading

        self.conn, self.lock, self.local, self.is_setup = conn, threading.Lock(), None, False
        self.local = threading.local()


def test_what_a_failed_pass_failed_on_is_referenced_when_it_lives_elsewhere(store, tmp_path):
    # The connection cannot be pickled and is not in the failed pass's memo; it is the
    # plain cell's `conn`, so the checkpointer is saved with a reference to it.
    # Before: "cannot pickle 'sqlite3.Connection'", and the step's body ran again on
    # replay, writing its rows into the checkpointer's file a second time.
    import sqlite3

    conn = sqlite3.connect(tmp_path / "cp.sqlite")
    saver = _Checkpointer(conn)
    saver.is_setup = True
    saved = save(store, {"conn": conn, "saver": saver}, ["saver"])
    fresh_conn = sqlite3.connect(tmp_path / "cp.sqlite")
    got = load(store, saved, {"conn": fresh_conn})["saver"]
    assert got.conn is fresh_conn and got.is_setup
    conn.close()
    fresh_conn.close()


def test_locks_inside_an_object_are_made_anew_and_a_lock_alone_is_not_saved():
    import threading

    saver = _Checkpointer(None)
    saver.rlock = threading.RLock()
    saver.held = threading.Lock()
    saver.held.acquire()
    got = values.loads(values.dumps(saver))
    assert type(got.lock) is type(saver.lock) and got.lock is not saver.lock
    assert not got.lock.locked() and got.held.locked()
    assert type(got.rlock) is type(saver.rlock) and type(got.local) is threading.local
    # What cannot be made anew as it was is not saved.
    saver.local.conn = "per-thread"
    with pytest.raises(values.Unsaveable, match="threading.local holding values"):
        values.dumps(saver)
    del saver.local.conn
    with saver.rlock:
        with pytest.raises(values.Unsaveable, match="re-entrant lock that is held"):
            values.dumps(saver)
    # A variable holding a lock coordinates the notebook's threads: not saved.
    with pytest.raises(values.Unsaveable, match="cannot pickle '_thread.lock'"):
        values.dumps(threading.Lock())


def test_a_view_of_an_array_in_an_ordered_dict_refers_to_it(store):
    # OrderedDict, defaultdict and Counter are walked as dicts (a torch
    # state_dict() is an OrderedDict): an array inside one is found.
    import collections

    od = collections.OrderedDict(a=np.zeros(4))
    ns = {"od": od, "mid": od["a"][1:3]}
    saved = save(store, ns, ["mid"])
    fresh = {"od": collections.OrderedDict(a=np.zeros(4))}
    mid = load(store, saved, fresh)["mid"]
    assert mid.base is fresh["od"]["a"]


def _linear(torch, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))


def test_a_state_dict_loads_on_the_memory_of_the_live_model(store):
    # `sd = model.state_dict()`: tensors on the parameters' own memory, which a
    # later optimizer.step() changes. Loaded as copies, sd kept the old weights.
    torch = pytest.importorskip("torch")
    model = _linear(torch, 0)
    saved = save(store, {"model": model, "sd": model.state_dict()}, ["sd"], checked=["model"])
    fresh = {"model": _linear(torch, 0)}  # the step that made it, replayed
    sd = load(store, saved, fresh)["sd"]
    live = fresh["model"]
    assert sd["2.bias"].data_ptr() == live[2].bias.data_ptr()
    with torch.no_grad():
        live[0].weight.mul_(2)
    assert torch.equal(sd["0.weight"], live[0].weight)


def test_tensors_sharing_memory_within_a_step_load_sharing_it(store):
    torch = pytest.importorskip("torch")
    model = _linear(torch, 1)
    model(torch.ones(1, 3)).sum().backward()  # a gradient: written with its tensor
    flat = torch.arange(6.0)
    ns = {"both": (model, model.state_dict()), "flat": flat, "part": flat[2:4].view(2, 1)}
    saved = save(store, ns, ["both", "flat", "part"])
    blob = store.get_blob(saved.variables[0].ref)
    assert blob.buffers, "the storages' memory is out of band"
    got = load(store, saved, {})
    m, sd = got["both"]
    assert isinstance(m[0].weight, torch.nn.Parameter) and m[0].weight.requires_grad
    assert torch.equal(m[0].weight.grad, model[0].weight.grad)
    assert sd["0.weight"].data_ptr() == m[0].weight.data_ptr()
    assert torch.equal(sd["0.weight"], model[0].weight)
    got["part"][0, 0] = 100
    assert got["flat"].tolist() == [0, 1, 100, 3, 4, 5]


def test_a_storage_the_namespace_holds_changed_since_refuses_the_replay(store):
    torch = pytest.importorskip("torch")
    w = torch.zeros(4)
    saved = save(store, {"w": w, "head": w[:2]}, ["head"])
    with pytest.raises(recording.LoadFailed) as err:
        load(store, saved, {"w": torch.ones(4)})
    assert "w.untyped_storage() is not the object it was" in str(err.value.cause)


# -- a library object's graph: an artist changed in place inside the live figure --------


def _figure_with_image():
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2), dpi=40)
    return {"fig": fig, "im": fig.add_subplot().imshow(np.arange(6).reshape(2, 3))}


def _change_in_place(store: Store, ns: dict) -> recording.Saved:
    ns["im"].set_clim(0, 10)
    saved = recording.save_variables(
        store, ns, ["im"], set(), _fp, {}, others=["fig"], in_place=["im"]
    )
    store.apply(puts=[], blobs=saved.pending)
    return saved


def test_an_artist_changed_in_place_loads_into_the_live_figure_not_beside_a_copy(store):
    # The step changed the image; the figure (not an input) holds it. Its reference was
    # fingerprinted with the change in it, so the figure the make step restored in a new
    # kernel was "not the object it was", and the step reran. And the image's axes and
    # transforms, below the figure's own attributes, were pickled as copies: a_im.axes
    # was not fig.axes[0] after a replay.
    made = _figure_with_image()
    first = save(store, made, ["fig", "im"])
    changed = _change_in_place(store, made)
    fresh = load(store, first, {})  # the make step replayed in a new kernel
    live = sharing.LiveTargets({"im": fresh["im"]})
    got, _pure = recording.load_variables(store, changed.variables, fresh, live)
    im, fig = fresh["im"], fresh["fig"]
    assert got["im"] is im and im.get_clim() == (0, 10)
    assert im.axes is fig.axes[0] and im in fig.axes[0].images
    assert im.get_transform() is fig.axes[0].transData
    # Drawn as the inline backend shows it (another layout for the draw): the image's
    # own clip box, loaded beside the live transforms, follows them (sharing.relink).
    shown = []
    for figure in (made["fig"], fig):
        out = io.BytesIO()
        figure.savefig(out, format="png", bbox_inches="tight")
        shown.append(out.getvalue())
    assert shown[0] == shown[1]


def test_a_figure_changed_otherwise_is_still_not_the_object_it_was(store):
    made = _figure_with_image()
    first = save(store, made, ["fig", "im"])
    changed = _change_in_place(store, made)
    fresh = load(store, first, {})
    fresh["fig"].axes[0].set_title("not in the recorded figure")
    live = sharing.LiveTargets({"im": fresh["im"]})
    with pytest.raises(recording.LoadFailed, match="not the object it was"):
        recording.load_variables(store, changed.variables, fresh, live)
