"""A ``%%step`` cell's plan: what is known about it before it runs.

Its key, its code as Python, what it reads (each input's fingerprint, see
:func:`read_names`) and the record and state the store holds for it. The
step runner (:mod:`.stepper`) decides from a plan whether to replay or
execute.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..identity import keys, localcode
from ..store import values
from ..store.records import StepRecord, StepState
from . import standins
from .changes import HIDDEN
from .context import warn


@dataclass
class Plan:
    """Everything known about a ``%%step`` cell before it runs."""

    key: str
    label: str
    position: int | None
    py: str  # the cell body as Python (IPython syntax transformed)
    source_fp: str
    analysis: keys.CellAnalysis
    inputs: dict[str, str]  # name -> fingerprint compared with the record
    raw_fps: dict[str, str]  # name -> plain content fingerprint, to spot in-place mutation
    state: StepState
    reason: str | None = None  # why its record was not replayed (it was invalidated)
    declared: dict[str, list[str]] | None = None  # --inputs patterns -> the files they match
    #: globals the step reaches only through the notebook functions it calls (a
    #: helper's `client`) -> their content fingerprint before the body (see reached)
    reached: dict[str, str] = field(default_factory=dict)
    #: the inputs bound to a library's module, class or function (``StepRecord.library``)
    library: frozenset[str] = frozenset()
    #: inputs a plain cell bound to an immutable builtin value -> its literal key
    #: (``StepRecord.plain``)
    plain: dict[str, str] = field(default_factory=dict)
    #: each input's :func:`nbdurable.why.brief` as the step starts (``StepRecord.seen``)
    seen: dict[str, str] = field(default_factory=dict)


#: Builtins that read the namespace by name at run time: a step calling one may
#: read any variable, so every user variable is its input (conservative).
_DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec"})


def read_names(
    analysis: keys.CellAnalysis, ns: dict[str, Any], hidden: Mapping[str, Any]
) -> frozenset[str]:
    """The names a step reads: its analysis's, or every user variable if it reads dynamically."""
    if not any(n in analysis.reads and n not in ns for n in _DYNAMIC):  # not shadowed by the user
        return analysis.reads
    user = {n for n in ns if not (n.startswith("__") and n.endswith("__")) and n not in hidden}
    return analysis.reads | user


def reached(names: Iterable[str], ns: dict[str, Any]) -> list[str]:
    """The names of ``ns`` that the notebook functions among ``names`` read, transitively,
    and that ``names`` do not hold: what a helper the step calls may change.

    ``chat(q)`` reads the global ``client``: the step's syntax never names it,
    yet the call builds ``client.chat`` on first use, and a helper appending
    to a global history changes it. Functions of libraries are not followed
    (what they touch is theirs).
    """
    names = set(names)
    todo = [n for n in names if isinstance(ns.get(n), types.FunctionType)]
    seen: set[str] = set()
    out: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        fn = ns.get(name)
        if isinstance(fn, types.FunctionType) and localcode.is_local_function(fn):
            if fn.__globals__ is ns:
                todo.extend(g for g in localcode.names_read(fn.__code__)[0] if g in ns)
        elif name not in names and not HIDDEN.match(name):
            out.add(name)
    return sorted(out)


def version_of(rec: StepRecord) -> str:
    """The version of a record: its code and the inputs it was recorded with."""
    return keys.step_version(rec.source_fp, rec.inputs)


def fingerprint_or_type(value: Any, what: str) -> str:
    """:func:`keys.fingerprint`, falling back to the type when a custom hook fails."""
    return input_fingerprint(value, what)[0]


def input_fingerprint(value: Any, what: str | None) -> tuple[str, bool]:
    """:func:`fingerprint_or_type` and whether it describes the value completely.

    Complete: nothing in the value was compared by type only (see
    :func:`keys.fingerprint_info`), so an equal fingerprint is equal content.
    ``what=None``: a failing hook is not said (a prediction; the step says it).
    """
    standing_in = standins.recorded_fp(value)
    if standing_in:  # the handle's fingerprint when recorded, as its readers compared it
        return standing_in, False
    try:
        info = keys.fingerprint_info(value)
    except Exception as exc:  # a user's __nbdurable_fingerprint__ may raise
        if what is not None:
            warn(f"{what}: cannot fingerprint it ({exc!r}); comparing it by type only.")
        return "type:" + values.type_name(value), False
    return info.digest, not info.type_only
