"""Module-level state of the user's own modules, and attributes a step assigns on modules.

A user module is one whose file lies outside the stdlib and site-packages
(and is not nbdurable). Its globals are compared before and after a step:
functions, classes and modules by identity, everything else by content
(:func:`nbdurable.fingerprint.fingerprint`). Plain data is recorded: a
value rebound is set again on replay, a value changed in place is updated
in place (so ``from helpers import REGISTRY`` elsewhere sees it too). A
changed value that is not plain data makes the step not replayable.

Library modules are not compared in full (far too many); only the
attributes the step's source assigns (``requests.get = fake``,
``setattr(mod, "x", ..)``), found by :func:`assigned_attributes`.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import site
import sys
import sysconfig
import types
import warnings
from collections.abc import Mapping
from typing import Any

from ..identity.fingerprint import fingerprint
from .plain import ABSENT, MAX_VALUE_CHARS, NotPlain, decode, encode


def _library_dirs() -> tuple[str, ...]:
    dirs = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_path = sysconfig.get_paths().get(name)
        if with_path:
            dirs.add(with_path)
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site.py lacks them
        pass
    dirs.add(os.path.dirname(os.__file__))  # the stdlib, wherever it is
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs if d)


_LIBRARY_DIRS = _library_dirs()


_user: dict[str, tuple[Any, bool]] = {}  # module name -> (the module, is a user module)


def is_user_module(name: str, module: Any) -> bool:
    """True for a module of the user's own files: not the stdlib, site-packages or nbdurable.

    Only a module imported from its file (one with an import spec and an
    absolute ``__file__``) can be imported again by a replay: a module object
    a library makes on the fly is not one, whatever ``__file__`` it sets
    (torch's ``torch.ops`` says ``_ops.py`` and grows ``torch.ops.<name>``
    namespaces as code touches them), and its attributes are the library's.
    """
    known = _user.get(name)
    if known is not None and known[0] is module:  # asked around every step: kept
        return known[1]
    file = getattr(module, "__file__", None)
    mine = (
        isinstance(file, str)
        and os.path.isabs(file)
        and getattr(module, "__spec__", None) is not None
        and name != "__main__"
        and name.split(".")[0] != "nbdurable"
        and file.endswith(".py")
        and not os.path.abspath(file).startswith(_LIBRARY_DIRS)
        and "site-packages" not in file
        and "dist-packages" not in file
    )
    _user[name] = (module, mine)
    return mine


OPAQUE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)


#: Values that cannot change in place: compared by identity alone, never hashed.
_IMMUTABLE = frozenset((int, float, complex, str, bytes, bool, type(None), range))


def _module_state(module: Any) -> dict[str, tuple[Any, str | None]]:
    out = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        # Functions, classes and immutable values: a change is a rebinding, seen by identity.
        fp = None
        if type(value) not in _IMMUTABLE and not isinstance(value, OPAQUE):
            fp = fingerprint_or_none(value)  # None: identity only (a failing hook)
        out[name] = (value, fp)
    return out


def user_modules() -> dict[str, dict[str, tuple[Any, str | None]]]:
    """``{module name: {global: (object, fingerprint or None)}}`` of every user module."""
    cache = _user
    out = {}
    # dict.copy runs without releasing the GIL: list(items()) could meet an import
    # made meanwhile by another thread ("dictionary changed size during iteration").
    for name, mod in sys.modules.copy().items():
        known = cache.get(name)
        mine = known[1] if known is not None and known[0] is mod else is_user_module(name, mod)
        if mine:
            out[name] = _module_state(mod)
    return out


def _resolve(namespace: Mapping[str, Any], dotted: str) -> Any:
    first, *rest = dotted.split(".")
    obj = namespace.get(first, ABSENT)
    for part in rest:
        obj = getattr(obj, part, ABSENT)
    return obj


def watched(
    namespace: Mapping[str, Any] | None, watch: tuple[tuple[str, str], ...]
) -> dict[tuple[str, str], Any]:
    """``{(module name, attribute): object}`` for the ``watch`` pairs naming a module."""
    out: dict[tuple[str, str], Any] = {}
    if namespace is None:
        return out
    for dotted, attr in watch:
        mod = _resolve(namespace, dotted)
        if isinstance(mod, types.ModuleType):
            out[(mod.__name__, attr)] = getattr(mod, attr, ABSENT)
    return out


def assigned_attributes(source: str) -> list[tuple[str, str]]:
    """``(dotted name, attribute)`` for each ``a.b.attr = ..`` (or ``del``, ``+=``) in ``source``.

    Also ``setattr(a.b, "attr", ..)`` / ``delattr`` with a literal name.
    Whether ``a.b`` is a module is decided by :func:`snapshot`.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = compile(
                source, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
    except (SyntaxError, ValueError):
        return []
    found = set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = _dotted(node.args[0])
            if base:
                found.add((base, node.args[1].value))
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Attribute):
                base = _dotted(t.value)
                if base:
                    found.add((base, t.attr))
    return sorted(found)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def modules_delta(before: Any, after: Any, out: dict, why: list[str]) -> None:
    """Add the ``modules`` part of a delta to ``out`` (reasons it cannot be kept to ``why``)."""
    changes: dict[str, dict[str, Any]] = {}

    def note(mod: str, kind: str, attr: str, value: Any = None) -> None:
        entry = changes.setdefault(mod, {})
        if kind == "del":
            entry.setdefault("del", []).append(attr)
            return
        if isinstance(value, types.ModuleType):  # `import pkg.sub` binds pkg.sub
            if not importable(value):
                why.append(f"module {mod} attribute {attr} is a module that cannot be imported")
                return
            entry.setdefault("import", {})[attr] = value.__name__
            return
        try:
            data = encode(value)
        except NotPlain as exc:
            why.append(f"module {mod} attribute {attr} {exc}")
            return
        if len(json.dumps(data)) > MAX_VALUE_CHARS:
            why.append(f"module {mod} attribute {attr} is too large to record")
            return
        entry.setdefault(kind, {})[attr] = data

    for mod, now in after.modules.items():
        old = before.modules.get(mod)
        if old is None:
            fresh_module(mod, now, after, changes, why)
            continue
        for attr, (value, fp) in now.items():
            was = old.get(attr)
            if was is None or was[0] is not value:
                note(mod, "set", attr, value)
            elif fp != was[1]:  # the same object, changed in place
                note(mod, "update", attr, value)
        for attr in old:
            if attr not in now:
                note(mod, "del", attr)
    for (mod, attr), value in after.watched.items():
        if mod in after.modules:
            continue  # a user module: compared above, in full
        was = before.watched.get((mod, attr), ABSENT)
        if was is value:
            continue
        if value is ABSENT:
            note(mod, "del", attr)
        elif isinstance(value, OPAQUE) or callable(value):
            why.append(f"module {mod} attribute {attr} was rebound to a {type(value).__name__}")
        else:
            note(mod, "set", attr, value)
    changes = {m: c for m, c in changes.items() if c}
    if changes:
        out["modules"] = changes


def importable(module: types.ModuleType) -> bool:
    """True if importing ``module``'s name gives this module (it is in ``sys.modules``
    and came from an import: a module object made on the fly cannot be imported again).
    """
    name = getattr(module, "__name__", None)
    return (
        isinstance(name, str)
        and sys.modules.get(name) is module
        and getattr(module, "__spec__", None) is not None
    )


def updated_in_place(process: Mapping[str, Any] | None) -> list[Any]:
    """The live objects of user modules that ``process`` (a delta) updates in place."""
    out = []
    for mod, change in ((process or {}).get("modules") or {}).items():
        module = sys.modules.get(mod)
        for attr in change.get("update") or ():
            obj = getattr(module, attr, ABSENT) if module is not None else ABSENT
            if obj is not ABSENT:
                out.append(obj)
    return out


def fresh_module(
    mod: str,
    now: dict[str, tuple[Any, str | None]],
    after: Any,
    changes: dict[str, dict[str, Any]],
    why: list[str],
) -> None:
    """A user module the step imported: what it holds after the step, to check on replay.

    The step may have changed it right after importing it
    (``import helpers; helpers.REGISTRY.append(..)``), and nothing tells
    that apart from what the import itself did. So each data attribute's
    fingerprint is kept, with its value when it is plain data: replay imports
    the module and puts back every value that differs (see :func:`prepare`).
    Functions and classes come back from the import; one the step's source
    rebinds cannot be restored.
    """
    fresh = {}
    for attr, (value, fp) in now.items():
        if isinstance(value, OPAQUE):
            if (mod, attr) in after.watched:
                why.append(f"module {mod} attribute {attr} was rebound to a {type(value).__name__}")
            continue
        if fp is None:
            fp = fingerprint_or_none(value)
        if fp is None:
            continue  # no fingerprint: cannot be compared (see the module docstring)
        try:
            data = encode(value)
            if len(json.dumps(data)) > MAX_VALUE_CHARS:
                data = None
        except NotPlain:
            data = None  # checked on replay; restored only if it is as imported
        fresh[attr] = [fp, data]
    if fresh:
        changes.setdefault(mod, {})["fresh"] = fresh


def check_fresh(name: str, mod: Any, fresh: Mapping[str, list]) -> None:
    """Raise ``LookupError`` if a value the step left differs now and cannot be put back."""
    for attr, (fp, data) in fresh.items():
        current = getattr(mod, attr, ABSENT)
        if data is None and (current is ABSENT or fingerprint_or_none(current) != fp):
            raise LookupError(
                f"module {name} attribute {attr} is not as the step left it, and cannot be "
                "recorded as plain data"
            )


def fingerprint_or_none(value: Any) -> str | None:
    """:func:`fingerprint`, or None when a fingerprint hook fails."""
    try:
        return fingerprint(value)
    except Exception:  # a fingerprint hook that fails: never equal
        return None


def apply_module(mod: Any, change: Mapping[str, Any]) -> None:
    """Re-apply one module's part of a delta (checked by :func:`check_fresh` first)."""
    for attr, name in change.get("import", {}).items():
        setattr(mod, attr, importlib.import_module(name))
    for attr, data in change.get("set", {}).items():
        setattr(mod, attr, decode(data))
    updates = dict(change.get("update", {}))
    for attr, (fp, data) in change.get("fresh", {}).items():
        current = getattr(mod, attr, ABSENT)
        if data is not None and (current is ABSENT or fingerprint_or_none(current) != fp):
            updates[attr] = data
    for attr, data in updates.items():
        value, current = decode(data), getattr(mod, attr, ABSENT)
        # The step changed this very object in place; a name imported from the
        # module elsewhere (`from helpers import REGISTRY`) must see it too.
        if type(current) is type(value) and isinstance(value, (list, dict, set)):
            if isinstance(current, list):
                current[:] = value
            else:
                current.clear()
                current.update(value)
        else:
            setattr(mod, attr, value)
    for attr in change.get("del", ()):
        if hasattr(mod, attr):
            delattr(mod, attr)
