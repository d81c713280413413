"""What a step changed: the names it bound, and the objects it changed in place.

Bound or rebound names are seen by comparing the namespace before and
after the body (:func:`changed_names`). Changes in place are found three
ways: the step's syntax (a method call, an item or attribute assignment),
an input whose content fingerprint moved (:func:`mutated_inputs`), and the
tokens of :mod:`.changes` for objects reached through helpers. A method
called on an object that shows nothing changed (a model client whose
attributes still hold what they held, see :func:`untouched`) is not a change.
"""

from __future__ import annotations

import ast
import functools
import types
import warnings
from typing import Any

from ..identity import keys
from ..store import values
from .changes import HIDDEN
from .plan import Plan, fingerprint_or_type


def changed_names(
    before: dict[str, Any], after: dict[str, Any], analysis: keys.CellAnalysis
) -> list[str]:
    """Names the step bound, rebound or (by its syntax) may have mutated."""
    out = set()
    for name, value in after.items():
        if HIDDEN.match(name):
            continue
        if name not in before or before[name] is not value:
            out.add(name)
    for name in analysis.binds | analysis.mutates:
        if name in after and not HIDDEN.match(name):
            # `time.sleep(1)` looks like a method call on `time`; a module the
            # step did not rebind is not something it produced. Nor is the same
            # int or str after `n.bit_length()`: no method changes it, and
            # counting it made every step reading `n` depend on this one.
            if name not in analysis.binds and (
                values.is_module(after[name])
                or (before.get(name) is after[name] and _immutable(after[name]))
            ):
                continue
            out.add(name)
    return sorted(out)


_SCALARS = (int, float, complex, str, bytes, bool, type(None))


def _immutable(value: Any) -> bool:
    """A builtin scalar, or a tuple or frozenset of them: nothing a method call can change.

    Exact types only (a subclass may add state), and one level only, so the
    check costs a pass over a tuple at most; anything else a method was
    called on stays a possible change, however its fingerprint looks, since
    a large value's fingerprint samples it.
    """
    kind = type(value)
    if kind in _SCALARS:
        return True
    return kind in (tuple, frozenset) and all(type(v) in _SCALARS for v in value)


def attributes(plan: Plan, ns: dict[str, Any]) -> dict[str, dict[str, int]]:
    """For each input and each name the step's syntax may mutate (not bind): the ids
    its attributes hold.

    Inputs too, not only method calls the syntax shows: ``step("o",
    client.chat.completions.create, ...)`` hands a bound method on, and the
    change detection (:meth:`recording.Snapshot.mutated`) sees the client's
    connection pool move. Only objects with attributes: one without (a database
    connection, a generator) shows nothing of its state, so a call on it stays a
    change.
    """
    out = {}
    names = (plan.analysis.mutates | set(plan.raw_fps)) - plan.analysis.binds
    for name in names | set(plan.reached):  # a helper's client too (see plan.reached)
        attrs = getattr(ns.get(name), "__dict__", None)
        if isinstance(attrs, dict) and attrs and not values.is_module(ns[name]):
            # An attribute that held nothing yet (None, an SDK's NOT_GIVEN) is left
            # out: filling it is a lazy cache, not a change (-1 never matches an id).
            out[name] = {k: -1 if _unset(v) else id(v) for k, v in attrs.items()}
    return out


def _unset(value: Any) -> bool:
    return value is None or type(value).__name__ in ("NotGiven", "Omit", "_NotGiven")


def untouched(
    plan: Plan, before: dict[str, Any], after: dict[str, Any], attrs: dict[str, dict[str, int]]
) -> set[str]:
    """Names the step's syntax may have mutated (a method call) whose object did not change.

    The same object, not rebound, with the content fingerprint it had before
    the step (see :func:`mutated_inputs`), every attribute it had then still
    holding the same object (attributes added since are lazily made parts,
    such as an SDK client's ``chat``, and so are attributes that held nothing).
    """
    out = set()
    for name, ids in attrs.items():
        fp = plan.raw_fps.get(name, plan.reached.get(name))
        if fp is None or name not in after or after[name] is not before.get(name):
            continue
        now = getattr(after[name], "__dict__", None)
        if not isinstance(now, dict) or any(
            i != -1 and id(now.get(k)) != i for k, i in ids.items()
        ):
            continue
        if fingerprint_or_type(after[name], name) == fp:
            out.add(name)
    return out


def mutated_inputs(
    raw_fps: dict[str, str], before: dict[str, Any], after: dict[str, Any], known: set[str]
) -> list[str]:
    """Inputs changed in place by calls the syntax cannot see (``random.shuffle(xs)``).

    Each input still bound to the same object is fingerprinted again; a
    different fingerprint means the step mutated it, so it is recorded too.
    """
    out = []
    for name, fp in raw_fps.items():
        if name in known or name not in after or after[name] is not before.get(name):
            continue
        value = after[name]
        # Functions and classes change by rebinding; a callable object does not:
        # a torch module's forward pass updates its buffers in place (BatchNorm).
        if values.is_module(value) or isinstance(value, _BY_IDENTITY):
            continue
        if fingerprint_or_type(value, name) != fp:
            out.append(name)
    return sorted(out)


_BY_IDENTITY = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
)

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def dotted_imports(py: str) -> set[str]:
    """``a.b.c`` for each ``import a.b.c`` (without ``as``) of the cell, outside functions."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = compile(py, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.asname is None and "." in a.name}
        elif not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return found
