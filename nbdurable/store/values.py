"""Turning variables into bytes and back.

Values are pickled with cloudpickle, which saves functions and classes
defined in the notebook (module ``__main__``) by value, so they come back
after a restart. A notebook class is saved as "the class of that name in the
namespace, if it has the same fingerprint, else this copy of it": after a
restart, the cell that defines ``class Finding`` runs again, and a replayed
``Finding`` instance must be an instance of *that* class (``isinstance``,
dataclass ``==``), not of a private copy. Modules are never pickled: they are
recorded by name and re-imported. Anything that cannot be pickled (an open
client, a socket, a generator) is reported, never silently dropped.
"""

from __future__ import annotations

import contextvars
import importlib
import io
import pickle
import types
from collections.abc import Iterable
from typing import Any

import cloudpickle

from ..identity import keys

PROTOCOL = 5

# The namespace live notebook classes are looked up in while loading (see _live_class).
_namespace: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nbdurable_namespace", default=None
)


#: Types pickled by plain pickle exactly as by cloudpickle (no code, no classes inside).
_PLAIN = frozenset((str, bytes, int, float, bool, type(None)))


class Unsaveable(Exception):
    """A value could not be pickled; the message says why."""


def dumps(value: Any) -> bytes:
    """Pickle ``value``; raise :class:`Unsaveable` with the reason if it cannot be."""
    if type(value) in _PLAIN:  # the common result of a model call: no cloudpickle set-up
        return pickle.dumps(value, PROTOCOL)
    try:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=PROTOCOL).dump(value)
        return buffer.getvalue()
    except Exception as exc:  # pickling runs arbitrary __reduce__ code
        raise Unsaveable(f"{type(exc).__name__}: {exc}") from exc
    except RecursionError as exc:  # pragma: no cover - subclass of Exception anyway
        raise Unsaveable(f"too deeply nested: {exc}") from exc


def dumps_parts(value: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``value`` keeping large raw memory out of band: ``(stream, buffers)``.

    The buffers are views of the value's own memory (a numpy array's data,
    a bytearray), not copies; :func:`loads` takes them back. Raises
    :class:`Unsaveable` like :func:`dumps`.
    """
    buffers: list[memoryview] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(pb.raw())
        except BufferError:  # not contiguous: pickle copies it in band
            return True
        return False

    try:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=PROTOCOL, buffer_callback=keep).dump(value)
        return buffer.getvalue(), buffers
    except Exception as exc:  # pickling runs arbitrary __reduce__ code
        raise Unsaveable(f"{type(exc).__name__}: {exc}") from exc


def loads(
    data: bytes | memoryview,
    namespace: dict[str, Any] | None = None,
    buffers: list[memoryview] | None = None,
) -> Any:
    """Unpickle bytes that were verified by the store (with their out-of-band buffers).

    Notebook classes resolve to the same-named classes of ``namespace`` when
    their fingerprints match (see the module docstring).
    """
    token = _namespace.set(namespace)
    try:
        return pickle.loads(data, buffers=buffers or ())
    finally:
        _namespace.reset(token)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            isinstance(obj, type)
            and obj.__module__ == "__main__"
            and "<locals>" not in obj.__qualname__
        ):
            copy = cloudpickle.dumps(obj, protocol=PROTOCOL)
            return _live_class, (obj.__qualname__, keys.fingerprint(obj), copy)
        return super().reducer_override(obj)


def _live_class(qualname: str, fingerprint: str, copy: bytes) -> type:
    """The namespace's class ``qualname`` if its fingerprint matches, else the saved copy."""
    live: Any = _namespace.get()
    for part in qualname.split("."):
        live = live.get(part) if isinstance(live, dict) else getattr(live, part, None)
    if (
        isinstance(live, type)
        and live.__module__ == "__main__"
        and keys.fingerprint(live) == fingerprint
    ):
        return live
    return pickle.loads(copy)


def is_module(value: Any) -> bool:
    """True for module objects (recorded by name, re-imported on replay)."""
    return isinstance(value, types.ModuleType)


def module_ref(module: types.ModuleType, imported: Iterable[str] = ()) -> str:
    """How a module variable is recorded: its name, then the submodules imported through it.

    ``import a.b.c`` binds ``a``, and ``a.b.c`` is reachable as an attribute only
    because the submodule was imported; re-importing ``a`` alone after a restart
    would lose it. ``imported`` holds the dotted names the step imported.
    """
    name = module.__name__
    return " ".join([name, *sorted({n for n in imported if n.startswith(name + ".")})])


def import_module(ref: str) -> types.ModuleType:
    """Import a module recorded by :func:`module_ref` (and its recorded submodules)."""
    name, *submodules = ref.split()
    module = importlib.import_module(name)
    for sub in submodules:
        importlib.import_module(sub)
    return module


def adopt(value: Any, namespace: dict[str, Any]) -> Any:
    """Give functions and classes defined in the notebook the notebook's globals again.

    cloudpickle restores a notebook function (one whose globals were
    ``__main__``) with a private copy of the globals it used when it was
    saved: after a restart it would not see names defined by later cells
    (NameError) nor their current values. Such a function is rebuilt on
    ``namespace``, as are the ones in its closure (``@decorator`` wrappers) and
    the methods of notebook classes (in place, so their instances follow).
    Returns the value to bind (a new function object for a function).
    """
    memo: dict[int, Any] = {}
    if isinstance(value, types.FunctionType):
        return _adopt_function(value, namespace, memo)
    cls = value if isinstance(value, type) else type(value)
    _adopt_class(cls, namespace, memo)
    return value


def _adopt_function(fn: types.FunctionType, ns: dict[str, Any], memo: dict[int, Any]) -> Any:
    if id(fn) in memo:
        return memo[id(fn)]
    memo[id(fn)] = fn
    for cell in fn.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if isinstance(inner, types.FunctionType):
            new_inner = _adopt_function(inner, ns, memo)
            if new_inner is not inner:
                cell.cell_contents = new_inner
        elif isinstance(inner, type):
            _adopt_class(inner, ns, memo)
    if fn.__globals__ is ns or fn.__globals__.get("__name__") != "__main__":
        return fn
    new = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = fn.__annotations__
    new.__dict__.update(fn.__dict__)
    memo[id(fn)] = new
    return new


def _adopt_class(cls: type, ns: dict[str, Any], memo: dict[int, Any]) -> None:
    for klass in cls.__mro__:
        if klass.__module__ != "__main__" or id(klass) in memo:
            continue
        memo[id(klass)] = klass
        for name, member in list(vars(klass).items()):
            new = _adopt_member(member, ns, memo)
            if new is not member:
                try:
                    setattr(klass, name, new)
                except (AttributeError, TypeError):  # a class that refuses: keep it
                    pass


def _adopt_member(member: Any, ns: dict[str, Any], memo: dict[int, Any]) -> Any:
    if isinstance(member, types.FunctionType):
        return _adopt_function(member, ns, memo)
    if isinstance(member, (staticmethod, classmethod)):
        fn = member.__func__
        new = _adopt_member(fn, ns, memo)
        return member if new is fn else type(member)(new)
    if isinstance(member, property):
        parts = [member.fget, member.fset, member.fdel]
        new_parts = [None if p is None else _adopt_member(p, ns, memo) for p in parts]
        if all(a is b for a, b in zip(parts, new_parts, strict=True)):
            return member
        return type(member)(*new_parts, member.__doc__)
    return member


def type_name(value: Any) -> str:
    """``module.QualName`` of the value's type, for display."""
    t = type(value)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"
