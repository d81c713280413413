"""nbdurable never changes an object by reducing it, and refuses a copy that lacks something.

A class of this module stands for a library's (its module is not ``__main__``):
its ``__getstate__`` behaves as pydantic's and LlamaIndex's ``BaseComponent``'s
together, handing out the instance's own ``__dict__`` and deleting from it
what it cannot pickle. A LlamaIndex ``Memory`` lost its ``sql_store`` that way
the first time nbdurable fingerprinted it, and the notebook's next
``memory.put(...)`` raised in a durable run where the plain run went on.
"""

from __future__ import annotations

import pickle
import threading

import pytest

from nbdurable.identity import fingerprint, reduction
from nbdurable.store import values


class Component:
    def __init__(self) -> None:
        self.items = [1, 2]
        self.lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = {"__dict__": self.__dict__}  # the live dict, as pydantic's is
        for key, value in list(state["__dict__"].items()):
            try:
                pickle.dumps(value)
            except Exception:
                del state["__dict__"][key]  # from the live object, as LlamaIndex's does
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state["__dict__"])


class Plain(Component):
    """The same pickling, with nothing it cannot pickle: its copy is whole."""

    def __init__(self) -> None:
        self.items = [1, 2]


def test_the_premise_reducing_such_an_object_changes_it():
    c = Component()
    c.__reduce_ex__(4)
    assert not hasattr(c, "lock")


def test_fingerprinting_leaves_the_object_as_it_was():
    c = Component()
    lock = c.lock
    first = fingerprint.fingerprint(c)
    assert c.lock is lock and vars(c) == {"items": [1, 2], "lock": lock}
    assert fingerprint.fingerprint(c) == first


def test_a_copy_that_would_lack_an_attribute_is_not_saved_and_the_object_keeps_it():
    c = Component()
    lock = c.lock
    with pytest.raises(values.Unsaveable, match="leaves out lock"):
        values.dumps(c)
    assert c.lock is lock
    with c.lock:  # still usable, as in a plain run
        c.items.append(3)


def test_an_object_whose_pickling_takes_nothing_saves_whole():
    p = Plain()
    copy = values.loads(values.dumps(p))
    assert type(copy) is Plain and copy.items == [1, 2] and vars(p) == {"items": [1, 2]}


def test_reduce_noting_names_what_was_taken_and_the_reduction_keeps_what_the_library_meant():
    c = Component()
    reduced, taken = reduction.reduce_noting(c, 4)
    assert taken == ("lock",)
    assert reduced[2]["__dict__"] == {"items": [1, 2]}
    assert reduced[2]["__dict__"] is not vars(c)
    assert set(vars(c)) == {"items", "lock"}
