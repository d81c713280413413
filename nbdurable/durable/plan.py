"""A ``%%step`` cell's plan: what is known about it before it runs.

Its key, its code as Python, what it reads (each input's fingerprint, see
:func:`read_names`) and the record and state the store holds for it. The
step runner (:mod:`.stepper`) decides from a plan whether to replay or
execute.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..identity import keys
from ..store import values
from ..store.records import StepRecord, StepState
from .context import warn

#: Names the shell keeps in the namespace for itself: never a step's input or output.
HIDDEN = re.compile(
    r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|get_ipython|exit|quit|__nbdurable_step__)$"
)


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


def version_of(rec: StepRecord) -> str:
    """The version of a record: its code and the inputs it was recorded with."""
    return keys.step_version(rec.source_fp, rec.inputs)


def fingerprint_or_type(value: Any, what: str) -> str:
    """:func:`keys.fingerprint`, falling back to the type when a custom hook fails."""
    try:
        return keys.fingerprint(value)
    except Exception as exc:  # a user's __nbdurable_fingerprint__ may raise
        warn(f"{what}: cannot fingerprint it ({exc!r}); comparing it by type only.")
        return "type:" + values.type_name(value)
