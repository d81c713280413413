"""Library objects whose own pickle round trip is not exact, written so that it is.

A replayed value must be what the plain run held, down to what the user can
print. Most library objects get there through their own ``__reduce__``; the
ones below do not, and :class:`nbdurable.store.values._Pickler` asks
:func:`reduce` about every object before cloudpickle does:

* **plotly** figures and graph objects pickle as ``(cls, (props,))`` and load
  through their constructor, which sets properties in its own (alphabetical)
  order: ``fig.to_json()`` or ``trace.to_plotly_json()`` of the copy lists
  keys otherwise than the live object did, and a notebook that prints or
  saves one would show another text. They are written as the same
  constructor call followed by putting every dict of their properties back
  in the recorded order (the dicts themselves are kept, as the child objects
  read them through their parent).

* **polars** ``SQLContext``: its registered tables live in a native context
  that does not pickle. It is written as its tables (each collected into a
  ``DataFrame``) and loads as a new context with them registered again;
  one with catalogs, or a table that cannot be read back, is not written
  (the variable is unsaved, and its step runs again saying why).

Only ``sys.modules`` is consulted: nothing here imports a library, so an
object of a library the process never imported costs one dict look-up.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from ..identity.fingerprint import sqlcontext_tables


def reduce(obj: Any) -> tuple | None:
    """The reduction that makes ``obj`` load back exactly, or None for the usual one."""
    module = getattr(type(obj), "__module__", "") or ""
    if module.startswith("plotly."):
        return _plotly_reduce(obj)
    if loads_anew(type(obj)):
        return _sqlcontext_reduce(obj)
    return None


def loads_anew(t: type) -> bool:
    """Whether objects of ``t`` are written only as new ones (never loaded into the live one).

    A polars ``SQLContext``'s state is its native context: there is no state to
    set on the live object, so a context a step changed loads as a new one.
    """
    return t.__module__ == "polars.sql.context" and t.__name__ == "SQLContext"


def _sqlcontext_reduce(ctx: Any) -> tuple | None:
    tables = sqlcontext_tables(ctx)
    if tables is None:
        return None  # its own pickle fails and says why: the variable is unsaved
    return _sqlcontext, (bool(getattr(ctx, "_eager_execution", False)), tables)


def _sqlcontext(eager: bool, tables: dict[str, Any]) -> Any:
    """A polars ``SQLContext`` with ``tables`` registered, as the recorded one had."""
    polars = sys.modules.get("polars") or __import__("polars")
    ctx = polars.SQLContext(eager=eager)
    for name, frame in tables.items():
        ctx.register(name, frame)
    return ctx


def _plotly_reduce(obj: Any) -> tuple | None:
    base = sys.modules.get("plotly.basedatatypes")
    if base is None or not isinstance(obj, (base.BaseFigure, base.BasePlotlyType)):
        return None
    try:
        reduced = obj.__reduce__()
    except Exception:  # not pickleable its own way: the usual path says why
        return None
    if (
        type(reduced) is not tuple
        or len(reduced) != 2
        or reduced[0] is not type(obj)
        or len(reduced[1]) != 1
        or not isinstance(reduced[1][0], dict)
    ):
        return None
    return _plotly_ordered, (type(obj), reduced[1][0])


def _plotly_ordered(cls: type, props: dict) -> Any:
    """``cls(props)`` with each dict of its properties in ``props``' order."""
    obj = cls(copy.deepcopy(props))  # the constructor may consume what it is given
    base = sys.modules["plotly.basedatatypes"]
    if isinstance(obj, base.BaseFigure):
        _reorder(obj._data, props.get("data"))
        _reorder(obj._layout, props.get("layout"))
    else:
        _reorder(obj._props, props)
    return obj


def _reorder(target: Any, model: Any) -> None:
    """Put the keys of every dict in ``target`` in the order of ``model``'s, in place."""
    if isinstance(target, dict) and isinstance(model, dict):
        order = [k for k in model if k in target] + [k for k in target if k not in model]
        if list(target) != order:
            items = [(k, target[k]) for k in order]
            target.clear()
            target.update(items)
        for key, value in target.items():
            if key in model:
                _reorder(value, model[key])
    elif isinstance(target, list) and isinstance(model, list | tuple):
        for value, like in zip(target, model, strict=False):  # a list the constructor grew
            _reorder(value, like)
