"""Environment variables a step reads: inputs of the step, like the names it reads.

While a step runs, every read of ``os.environ`` (``os.environ[...]``,
``.get``, ``os.getenv``, ``in``) is noted in the step's context as
``name -> digest of the value`` (None when unset), and recorded with the
step; a later run whose environment gives another value (or sets or unsets
the variable) runs the step again, naming the variable. Values are kept
only as SHA-256 digests: secrets never reach the store.

A variable the step sets before it first reads it (``os.environ["KEY"] =
...`` then a library reading ``KEY``) is the step's own output, not an
input: what it holds when the step starts does not matter.

The hook is one class-level wrapper of ``os._Environ``'s lookups and
assignments, installed once per process and inert outside a step (one
attribute test).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from ..identity import verdict

_current: Callable[[], Any] | None = None  # the running StepContext, or None


def install(current: Callable[[], Any]) -> None:
    """Note environment reads in ``current().env_reads`` while a step runs (idempotent)."""
    global _current
    _current = current
    cls = type(os.environ)
    if getattr(cls, "__nbdurable_env__", False):
        return
    getitem, contains = cls.__getitem__, cls.__contains__
    setitem, delitem = cls.__setitem__, cls.__delitem__

    def __setitem__(self: Any, key: Any, value: Any) -> None:  # noqa: N807
        ctx = _current() if _current is not None and self is os.environ else None
        if ctx is not None:
            _note(ctx, key, SET_FIRST)
        setitem(self, key, value)

    def __delitem__(self: Any, key: Any) -> None:  # noqa: N807
        ctx = _current() if _current is not None and self is os.environ else None
        if ctx is not None:
            _note(ctx, key, SET_FIRST)
        delitem(self, key)

    def __getitem__(self: Any, key: Any) -> Any:  # noqa: N807
        ctx = _current() if _current is not None and self is os.environ else None
        if ctx is None:
            return getitem(self, key)
        try:
            value = getitem(self, key)
        except KeyError:
            _note(ctx, key, None)
            raise
        _note(ctx, key, value)
        return value

    def __contains__(self: Any, key: Any) -> bool:  # noqa: N807
        found = contains(self, key)
        ctx = _current() if _current is not None and self is os.environ else None
        if ctx is not None:
            _note(ctx, key, getitem(self, key) if found else None)
        return found

    cls.__getitem__ = __getitem__  # Mapping.get and os.getenv go through it
    cls.__contains__ = __contains__
    cls.__setitem__ = __setitem__  # MutableMapping.setdefault and update go through it
    cls.__delitem__ = __delitem__  # pop too
    cls.__nbdurable_env__ = True


#: Frames passed over to find who read: the lookup's own plumbing.
_PLUMBING = frozenset({"os", "_collections_abc", "collections.abc", __name__})
#: Readers that are not the step: nbdurable itself (it scans the environment for
#: secrets) and the kernel machinery, whose variables differ on every start.
_NOT_THE_STEP = ("nbdurable", "ipykernel", "IPython", "jupyter_client", "zmq", "tornado")


def _by_the_step() -> bool:
    f = sys._getframe(3)
    while f is not None and f.f_globals.get("__name__") in _PLUMBING:
        f = f.f_back
    name = str(f.f_globals.get("__name__", "")) if f is not None else ""
    return not any(name == p or name.startswith(p + ".") for p in _NOT_THE_STEP)


#: Noted for a variable the step set (or deleted) before it read it: not an input.
SET_FIRST = object()


def _note(ctx: Any, key: Any, value: Any) -> None:
    if value is SET_FIRST:
        if isinstance(key, str) and key not in ctx.env_reads and _by_the_step():
            ctx.env_reads[key] = SET_FIRST
        return
    if (
        isinstance(key, str)
        and key not in ctx.env_reads
        and not key.startswith("JPY_")  # the kernel's own, new on every start
        and _by_the_step()
    ):
        ctx.env_reads[key] = verdict.value_digest(value)  # the value the step first saw decides


def as_recorded(reads: dict[str, str | None]) -> dict[str, Any]:
    """The reads as a record keeps them: each variable's digest as the step read it, or
    ``[as read, as the step left it]`` when the step then set it itself (see
    :func:`nbdurable.identity.verdict.env_changed`).
    """
    out: dict[str, Any] = {}
    for name, digest in reads.items():
        if digest is SET_FIRST:
            continue  # the step's own value (see the module docstring)
        now = verdict.value_digest(os.environ.get(name))
        out[name] = digest if now == digest else [digest, now]
    return out
