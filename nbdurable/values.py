"""Turning variables into bytes and back.

Values are pickled with cloudpickle, which saves functions and classes
defined in the notebook (module ``__main__``) by value, so they come back
after a restart. Modules are never pickled: they are recorded by name and
re-imported. Anything that cannot be pickled (an open client, a socket, a
generator) is reported, never silently dropped.
"""

from __future__ import annotations

import importlib
import pickle
import types
from typing import Any

import cloudpickle

PROTOCOL = 5


class Unsaveable(Exception):
    """A value could not be pickled; the message says why."""


def dumps(value: Any) -> bytes:
    """Pickle ``value``; raise :class:`Unsaveable` with the reason if it cannot be."""
    try:
        return cloudpickle.dumps(value, protocol=PROTOCOL)
    except Exception as exc:  # pickling runs arbitrary __reduce__ code
        raise Unsaveable(f"{type(exc).__name__}: {exc}") from exc
    except RecursionError as exc:  # pragma: no cover - subclass of Exception anyway
        raise Unsaveable(f"too deeply nested: {exc}") from exc


def loads(data: bytes) -> Any:
    """Unpickle bytes that were verified by the store."""
    return pickle.loads(data)


def is_module(value: Any) -> bool:
    """True for module objects (recorded by name, re-imported on replay)."""
    return isinstance(value, types.ModuleType)


def import_module(name: str) -> types.ModuleType:
    """Import a module by its dotted name."""
    return importlib.import_module(name)


def type_name(value: Any) -> str:
    """``module.QualName`` of the value's type, for display."""
    t = type(value)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"
