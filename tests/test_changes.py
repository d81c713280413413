"""What a step changed in place without naming it: tokens before and after (no kernel)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nbdurable.durable import changes


def changed_by(ns: dict, act) -> list[str]:
    tokens = changes.Tokens(ns, changes.user_names(ns))
    act()
    return tokens.changed(ns)


def test_helpers_methods_closures_and_setattr_are_seen():
    counts, log, seen = {}, [], set()

    class C:
        pass

    c, fleet = C(), [C()]
    fleet[0].items = []

    def make():
        n = [0]

        def inc():
            n[0] += 1

        return inc

    inc = make()
    inc.__module__ = "__main__"
    ns = {"counts": counts, "log": log, "seen": seen, "c": c, "fleet": fleet, "inc": inc}
    ns["untouched"] = {"a": [1]}

    def act():
        counts["a"] = 1
        log.append(2)
        seen.add(3)
        setattr(c, "v", 5)  # noqa: B010 (the case: setattr, not an assignment)
        fleet[0].items.append("crate")
        inc()

    assert changed_by(ns, act) == ["c", "counts", "fleet", "inc", "log", "seen"]


def test_an_advanced_iterator_or_generator_is_seen():
    def gen():
        yield from range(5)

    ns = {"g": gen(), "it": iter([1, 2, 3])}
    assert changed_by(ns, lambda: (next(ns["g"]), next(ns["it"]))) == ["g", "it"]


def test_a_notebook_class_changed_in_place_gives_a_patch():
    Model = type("Model", (), {"scale": 1, "__module__": "__main__"})
    ns = {"Model": Model}
    tokens = changes.Tokens(ns, ["Model"])
    Model.scale = 5
    Model.double = lambda self: 2 * self.scale
    del Model.scale
    assert tokens.changed(ns) == ["Model"]
    patch = tokens.class_patches(ns, ["Model"])["Model"]
    assert set(patch.attrs) == {"double"} and patch.removed == ["scale"]


def test_array_writes_are_seen_small_whole_and_large_by_sample():
    small, big = np.zeros(100), np.zeros(50_000_000 // 8)
    ns = {"small": small, "big": big}

    def act():
        small[37] = 1
        big[0] = 1  # an end of the sample

    assert changed_by(ns, act) == ["big", "small"]
    assert changed_by(ns, lambda: None) == []


def test_a_dataframe_column_added_or_written_is_seen():
    df = pd.DataFrame({"x": np.arange(10.0)})
    ns = {"df": df}

    def add():
        df["z"] = 0

    assert changed_by(ns, add) == ["df"]

    def write():
        df.loc[3, "x"] = 99.0

    assert changed_by(ns, write) == ["df"]


def test_a_tensor_written_through_another_tensor_on_its_memory_is_seen():
    # `sd = model.state_dict()` holds tensors on the parameters' memory: training the
    # model changes sd, which must then be recorded with the training step.
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 1)
    ns = {"model": model, "sd": model.state_dict(), "other": {"w": torch.zeros(3)}}

    def train():
        with torch.no_grad():
            model.weight.add_(1.0)

    assert changed_by(ns, train) == ["model", "sd"]


def test_nbdurable_own_objects_are_never_a_change():
    # A step panel kept in a variable is redrawn by its watcher thread while a
    # step runs; the step must not take it for state it changed (and fail to save it).
    from nbdurable.durable.changes import Tokens
    from nbdurable.ipython.panel import StepPanel

    assert StepPanel.nbdurable_view is True
    Panel = type("Panel", (), {"nbdurable_view": True})
    Mine = type("Mine", (), {"__module__": "__main__"})
    ns = {"p": Panel(), "m": Mine()}
    ns["p"].rows = {}
    ns["m"].rows = {}
    tokens = Tokens(ns, ["p", "m"])
    ns["p"].rows["a"] = 1
    ns["m"].rows["a"] = 1
    assert tokens.changed(ns) == ["m"]
