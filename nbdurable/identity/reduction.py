"""A library object's reduction (``__reduce_ex__``), taken without changing the object.

nbdurable reduces objects to fingerprint them (is this input the same?) and
to pickle them (a step's record). A plain run does neither, so reducing must
leave the object exactly as it was. Some libraries' ``__getstate__`` does not:
pydantic's returns the instance's own ``__dict__`` and ``__pydantic_private__``
(not copies), and LlamaIndex's ``BaseComponent.__getstate__`` then deletes
what it cannot pickle from them — from the live object. A LlamaIndex
``Memory`` lost its ``sql_store`` that way the first time nbdurable
fingerprinted it, and the notebook's next ``memory.put(...)`` raised
``AttributeError`` in a durable run where the plain run went on.

So for an instance whose class takes its pickling from a library
(``__getstate__``, ``__reduce__`` or ``__reduce_ex__`` defined below
``object`` by a class of an installed package), :func:`reduce_ex` notes its
``__dict__`` and ``__pydantic_private__`` before the call. If the call took
anything out of them or rebound anything, the object gets back what it had,
and the reduction keeps what the library meant to save: the dicts in its
state that were the live ones are replaced by copies of what the library
left in them.
"""

from __future__ import annotations

import weakref
from typing import Any

#: The instance dicts a library's reduction may hand out as its state.
_DICTS = ("__dict__", "__pydantic_private__")
_PICKLING = ("__getstate__", "__reduce__", "__reduce_ex__")


def guarded(t: type) -> bool:
    """True when ``t`` takes its pickling from a library class (see the module docstring)."""
    try:
        return _KNOWN[t]
    except (KeyError, TypeError):  # new, or a type that cannot be a weak key
        pass
    found = _guarded(t)
    try:
        _KNOWN[t] = found
    except TypeError:
        pass
    return found


#: type -> guarded(type); weak, so a notebook class redefined is not kept alive here
_KNOWN: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _guarded(t: type) -> bool:
    for klass in t.__mro__:
        if klass is object:
            return False
        if any(name in vars(klass) for name in _PICKLING):
            module = getattr(klass, "__module__", "") or ""
            return module.partition(".")[0] not in ("builtins", "__main__", "nbdurable")
    return False


def reduce_ex(obj: Any, protocol: int) -> Any:
    """``obj.__reduce_ex__(protocol)``, with ``obj`` given back anything the call took."""
    return reduce_noting(obj, protocol)[0]


def reduce_noting(obj: Any, protocol: int) -> tuple[Any, tuple[str, ...]]:
    """:func:`reduce_ex`, and the names of the attributes the call took out of ``obj``.

    A name listed is missing from the reduction: a copy loaded from it would
    lack what the live object has (see :mod:`nbdurable.store.values`, which
    does not save such a copy).
    """
    t = type(obj)
    if not guarded(t):
        return obj.__reduce_ex__(protocol), ()
    noted = []
    for name in _DICTS:
        try:
            d = object.__getattribute__(obj, name)
        except AttributeError:
            continue
        if type(d) is dict:
            noted.append((d, dict(d)))
    reduced = obj.__reduce_ex__(protocol)
    taken = [(d, before) for d, before in noted if not _same(d, before)]
    if not taken:
        return reduced, ()
    left = {id(d): dict(d) for d, _ in taken}  # what the library meant to save
    names = []
    for d, before in taken:
        names += [k for k, v in before.items() if k not in d or d[k] is not v]
        d.clear()
        d.update(before)
    if type(reduced) is tuple and len(reduced) >= 3:
        reduced = (*reduced[:2], _detached(reduced[2], left), *reduced[3:])
    return reduced, tuple(str(n) for n in names)


def _same(now: dict, before: dict) -> bool:
    if now.keys() != before.keys():
        return False
    return all(now[k] is v for k, v in before.items())


def _detached(state: Any, left: dict[int, dict]) -> Any:
    """``state`` with each live dict in it (itself, or one level down) replaced by its copy."""
    if id(state) in left:
        return left[id(state)]
    if type(state) is dict:
        if any(id(v) in left for v in state.values()):
            return {k: left.get(id(v), v) for k, v in state.items()}
        return state
    if type(state) is tuple:
        return tuple(left.get(id(v), v) for v in state)
    return state
