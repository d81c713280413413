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

from . import localcode
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
    type_only: list[str] = []
    parts = callable_parts(fn, type_only)
    h = hashlib.sha256(f"nbdurable-callable-{FINGERPRINT_VERSION}\0".encode())
    h.update(
        "".join(f"{label}\0{digest}\0" for label, digest in parts.items()).encode(
            "utf-8", "surrogatepass"
        )
    )
    return CallableFingerprint(h.hexdigest()[:32], parts, tuple(type_only))


def callable_parts(fn: Any, type_only: list[str] | None = None) -> dict[str, str]:
    """The ``parts`` of :func:`callable_fingerprint` alone, without the digest over them.

    What a caller compares part by part (what a call changed in its callee);
    ``type_only`` collects what was hashed by type only.
    """
    if not callable(fn):
        raise TypeError(f"callable_fingerprint() needs a callable, got {type(fn).__name__}")
    pairs: list[tuple[str, Any]] = []
    _callable_parts(fn, pairs, 0)
    found: list[str] = [] if type_only is None else type_only
    return {label: _part_digest(value, found) for label, value in pairs}


# A part whose value can never change (its code, a default of None, a prompt
# string, a library module, which is hashed by name) would otherwise be hashed
# again on every call, twice: before it and after it (to tell state the call
# changed). Such digests are kept here, keyed by the value's id with the value
# held, so the id cannot be reused while the entry lives. A mutable value (a
# list, an instance, a local module, whose source may be edited) is always
# hashed again: only its content says whether it changed.
_STABLE: dict[int, tuple[Any, Any, str]] = {}  # id -> (value, check, digest)
_STABLE_MAX = 4096
_STABLE_ATOMS = frozenset(
    {type(None), bool, int, float, complex, str, bytes, types.CodeType, type(...)}
)
#: Larger strings and bytes are not held by the cache (a replaced 100 MB prompt
#: must not stay in memory); they are hashed on each use, as before.
_STABLE_BYTES_MAX = 1 << 20


def _part_digest(value: Any, type_only: list[str]) -> str:
    """The fingerprint of one part, from :data:`_STABLE` when ``value`` cannot have changed."""
    hit = _STABLE.get(id(value))
    if hit is not None and hit[0] is value and (hit[1] is None or hit[1] == _module_check(value)):
        return hit[2]
    h = _Hasher()
    digest = h.run(value)
    type_only.extend(h.type_only)
    if not h.type_only and _stable(value, 0):
        if len(_STABLE) >= _STABLE_MAX:
            _STABLE.clear()
        _STABLE[id(value)] = (value, _module_check(value), digest)
    return digest


def _stable(value: Any, depth: int) -> bool:
    """True if ``value``'s fingerprint can never change: immutable all the way down."""
    t = type(value)
    if t in _STABLE_ATOMS:
        return t not in (str, bytes) or len(value) <= _STABLE_BYTES_MAX
    if t is tuple or t is frozenset:
        return depth < 3 and len(value) <= 64 and all(_stable(x, depth + 1) for x in value)
    # A library module is hashed by its name alone (see _module_check).
    return t is types.ModuleType and depth == 0 and localcode.module_file(value) is None


def _module_check(value: Any) -> Any:
    """What a library module's digest depends on, compared on every cache hit."""
    if type(value) is not types.ModuleType:
        return None
    namespace = vars(value)
    return (namespace.get("__name__"), namespace.get("__file__"))


def _callable_parts(fn: Any, out: list[tuple[str, Any]], depth: int) -> None:
    """Append ``(label, value)`` for each part of ``fn`` to ``out`` (see callable_fingerprint)."""
    if depth > 100:  # a __wrapped__ chain that loops
        out.append(("self", fn))
        return
    if type(fn) is types.FunctionType:
        out += function_parts(fn)
    elif type(fn) is types.MethodType:
        _callable_parts(fn.__func__, out, depth + 1)
        out.append(("self", fn.__self__))
    elif type(fn) is functools.partial:
        _callable_parts(fn.func, out, depth + 1)
        out += (("partial args", fn.args), ("partial keywords", fn.keywords))
    elif isinstance(fn, type) or type(fn) in _EXACT:
        out.append(("self", fn))
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
            _callable_parts(inner, out, depth + 1)
        out.append(("self", fn))


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
