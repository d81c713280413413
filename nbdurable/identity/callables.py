"""What a sub-step's callee is: the fingerprint that decides whether a recorded call may replay.

A recorded call replays only if the function it calls is unchanged, since the
arguments alone miss an edited prompt template, a changed ``MODEL = "large"``
global, or an edit to a helper in ``helpers.py``. :func:`callable_fingerprint`
splits a callable into named parts (``code``, ``global MODEL``, ``self``...),
each a :func:`~nbdurable.identity.fingerprint.fingerprint`, so that a caller can say
which one changed (:func:`first_change`).
"""

from __future__ import annotations

import functools
import hashlib
import types
from typing import Any, NamedTuple

from .fingerprint import (
    _EXACT,
    _MISSING,
    FINGERPRINT_VERSION,
    _Hasher,
    _instance_dict,
    function_parts,
)


class CallableFingerprint(NamedTuple):
    """What a sub-step's callee is, to tell whether a recorded call may replay."""

    digest: str  #: compare this: 32 hex digits
    #: ``label -> 32 hex digits``, in a fixed order: ``code``, ``defaults``,
    #: ``kwdefaults``, ``closure NAME``, ``wrapped``, ``global NAME``, ``self``,
    #: ``partial args``... (see :func:`callable_fingerprint`); for messages
    parts: dict[str, str]
    type_only: tuple[str, ...]  #: as in :class:`FingerprintInfo`


def callable_fingerprint(fn: Any) -> CallableFingerprint:
    """Identify a callable by everything that decides what calling it does.

    * a function or lambda: the parts of :func:`function_parts` (code with
      constants and nested code, defaults, closure values, ``__wrapped__``,
      and for notebook and local-module functions every global it reads:
      data by content, functions recursively, local modules by source plus
      the names read from them, transitively);
    * a bound method: its function's parts and ``self`` (the instance's state);
    * ``functools.partial``: the function's parts, ``partial args`` and
      ``partial keywords``;
    * a ``cache``/``lru_cache`` wrapper, ``np.vectorize``, anything with
      ``__wrapped__``: the wrapped function's parts and ``self``;
    * a callable instance: ``__call__``'s parts and ``self``;
    * a class or builtin: ``self`` only (see :func:`fingerprint`).

    ``parts`` names each piece so a caller can say what changed
    (:func:`first_change`). Cycle-safe; the same in every process.
    Raises ``TypeError`` if ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"callable_fingerprint() needs a callable, got {type(fn).__name__}")
    parts: dict[str, str] = {}
    type_only: list[str] = []

    def add(label: str, value: Any) -> None:
        h = _Hasher()
        parts[label] = h.run(value)
        type_only.extend(h.type_only)

    _callable_parts(fn, add, 0)
    h = hashlib.sha256(f"nbdurable-callable-{FINGERPRINT_VERSION}\0".encode())
    for label, digest in parts.items():
        h.update(f"{label}\0{digest}\0".encode("utf-8", "surrogatepass"))
    return CallableFingerprint(h.hexdigest()[:32], parts, tuple(type_only))


def _callable_parts(fn: Any, add: Any, depth: int) -> None:
    if depth > 100:  # a __wrapped__ chain that loops
        add("self", fn)
        return
    if type(fn) is types.FunctionType:
        for label, value in function_parts(fn):
            add(label, value)
    elif type(fn) is types.MethodType:
        _callable_parts(fn.__func__, add, depth + 1)
        add("self", fn.__self__)
    elif type(fn) is functools.partial:
        _callable_parts(fn.func, add, depth + 1)
        add("partial args", fn.args)
        add("partial keywords", fn.keywords)
    elif isinstance(fn, type) or type(fn) in _EXACT:
        add("self", fn)
    else:
        inner = _instance_dict(fn).get("__wrapped__", _MISSING)
        if inner is _MISSING and type(fn).__name__ == "vectorize":
            inner = getattr(fn, "pyfunc", _MISSING)
        if inner is _MISSING:
            owner = next((c for c in type(fn).__mro__ if "__call__" in vars(c)), object)
            inner = vars(owner).get("__call__", _MISSING)
        if inner is not fn and (
            type(inner) is types.FunctionType or (callable(inner) and not _is_slot(inner))
        ):
            _callable_parts(inner, add, depth + 1)
        add("self", fn)


def _is_slot(x: Any) -> bool:
    """A C type's ``__call__`` slot: it says nothing the instance does not."""
    return type(x) in (types.WrapperDescriptorType, types.MethodWrapperType)


def first_change(old: dict[str, str], new: dict[str, str]) -> str | None:
    """The label of the first part of ``new`` that differs from ``old``, else None.

    A part only in ``new`` counts as changed; a part only in ``old`` gives
    its label too (a global the function no longer reads). With the parts of
    :class:`CallableFingerprint`, e.g. ``"global MODEL"`` or ``"code"``.
    """
    for label, digest in new.items():
        if old.get(label) != digest:
            return label
    return next((label for label in old if label not in new), None)
