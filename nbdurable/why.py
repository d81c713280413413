"""What exactly changed: the lines "why" shows under an invalidated step's reason.

A reason says *what* invalidates a record ("input 'STYLE' changed", "its
code changed", "file 'data.csv' changed"); :func:`explain` says *how*, in
a few short lines a user can check at a glance::

    'STYLE': was 'plain', now 'bold'
    - STYLE = "plain"
    + STYLE = "bold"
    data.csv: was 1.2 KB, now 1.5 KB

The same lines go to the panel, the side panel and the cell marks (through
``StepInfo.why``) and to ``nbdurable status --why NAME``, so every view
explains a step alike.

What a value looked like is kept with the record (``StepRecord.seen`` for the
inputs as the step started, ``StepRecord.made`` for the variables it saved)
as :func:`brief` makes it: a short repr of a small builtin value (numbers,
strings, short containers of them), and of anything else only its type and,
for an array or a frame, its shape. A brief never calls a user object's
``repr`` or touches its attributes: that could be slow, or build the lazy
parts of a client (see :mod:`nbdurable.durable.changes`). A brief never holds
a secret: each string is redacted (:mod:`nbdurable.redact`) before it is cut
to length, so a key cut in half is not left half-shown. Values that brief
alike (two frames of one shape) are told apart by their fingerprints' first
hex digits, which say *that* the value changed, never what it holds.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from typing import Any

from . import redact
from .identity import verdict
from .store.records import StepRecord
from .text import human_size, one_line

#: A brief's length at most (an ellipsis marks a cut).
LIMIT = 60
#: Changed lines of code shown at most; the rest are counted.
CODE_LINES = 6
#: Inputs, files and variables named at most; the rest are counted.
NAMES = 3
#: Longer than any key format or environment secret: redacted whole before a cut.
_SECRET_ROOM = 256
#: Libraries whose arrays and frames say their shape cheaply and without side effects.
_SHAPED = ("numpy", "pandas", "polars", "torch", "jax", "xarray", "pyarrow")


def brief(value: Any, secrets: dict[str, bytes] | None = None) -> str:
    """A short, secret-free description of ``value`` (see the module docstring)."""
    secrets = redact.secrets_in_env() if secrets is None else secrets
    return _cut(_brief(value, secrets, 2), LIMIT)


def _brief(value: Any, secrets: dict[str, bytes], depth: int) -> str:
    t = type(value)
    if value is None or t in (bool, float, complex):
        return repr(value)
    if t is int:
        try:
            return repr(value)
        except ValueError:  # more digits than int -> str allows
            return f"int of {value.bit_length()} bits"
    if t in (str, bytes):
        head = value[: LIMIT + _SECRET_ROOM]
        text = _safe(repr(head), secrets)
        return text if len(value) <= LIMIT else f"{_cut(text, 40)} ({len(value):,} long)"
    if t in (list, tuple, set, frozenset, dict):
        n = len(value)
        if depth == 0 or n > 50:
            return f"{t.__name__} of {n} item{'s' if n != 1 else ''}"
        if t is dict:
            parts = [f"{_brief(k, secrets, 0)}: {_brief(v, secrets, depth - 1)}"
                     for k, v in list(value.items())[:4]]  # fmt: skip
        else:
            parts = [_brief(v, secrets, depth - 1) for v in list(value)[:4]]
        if n > 4:
            parts.append("…")
        inner = ", ".join(parts)
        if t is tuple:
            return f"({inner}{',' if n == 1 else ''})"
        if t is list:
            return f"[{inner}]"
        if t is dict:
            return "{" + inner + "}"
        return f"{t.__name__}({{{inner}}})" if n else f"{t.__name__}()"
    name = t.__name__
    if t.__module__.split(".")[0] in _SHAPED:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape):
            return f"{name} {shape}"
    return name


def _safe(text: str, secrets: dict[str, bytes]) -> str:
    text, _ = redact.redact_text(text, secrets)
    text, _ = redact.redact_keys(text)
    return one_line(text)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def briefs(
    ns: dict[str, Any], names: Any, secrets: dict[str, bytes] | None = None
) -> dict[str, str]:
    """``{name: brief(ns[name])}`` for the names ``ns`` holds (what a record keeps)."""
    secrets = redact.secrets_in_env() if secrets is None else secrets
    return {n: brief(ns[n], secrets) for n in names if n in ns}


def code_diff(old: str, new: str, secrets: dict[str, bytes] | None = None) -> list[str]:
    """The lines that differ, ``- old`` / ``+ new``, at most :data:`CODE_LINES` of them.

    Blank lines and trailing spaces are not a change worth a line. The new
    code is redacted as the record's was: a key typed into the cell is not
    printed by a view.
    """
    secrets = redact.secrets_in_env() if secrets is None else secrets
    a = [line.rstrip() for line in old.splitlines() if line.strip()]
    b = [_safe(line.rstrip(), secrets) for line in new.splitlines() if line.strip()]
    lines = [
        f"{d[0]} {d[2:].strip()}" for d in difflib.ndiff(a, b) if d[:1] in "+-" and d[2:].strip()
    ]
    if len(lines) > CODE_LINES:
        more = len(lines) - CODE_LINES + 1
        lines = lines[: CODE_LINES - 1] + [f"… {more} more changed line{'s' if more > 1 else ''}"]
    return [_cut(line, 100) for line in lines]


_QUOTED = re.compile(r"'([^']+)'")


def explain(
    rec: StepRecord,
    reason: str,
    *,
    code_now: str | None = None,
    now: Callable[[str], str | None] = lambda name: None,
) -> tuple[str, ...]:
    """The lines under ``reason`` (which :func:`~nbdurable.identity.verdict.invalid_reason`
    gave for ``rec``): old and new value of each input it names, the code that
    changed, the files that did. Empty when there is nothing concrete to add
    (a step that waits on another: that one's row says why).

    ``code_now``: the step's code as it is now (Python), where known;
    ``now``: a name's brief as it is now (the kernel's value, or the value
    the step that makes it recorded last), None where not known.
    """
    if verdict.may_run(reason):
        return ()
    if reason.startswith("its code changed"):
        return tuple(code_diff(rec.source, code_now)) if code_now is not None else ()
    if reason.startswith("input"):
        head = reason.split(" changed", 1)[0].split(" change", 1)[0]
        return tuple(_value_line(rec, n, now(n)) for n in _QUOTED.findall(head)[:NAMES])
    if reason.startswith(verdict.OUTPUT_REASON):
        return tuple(_file_lines(rec.written, verdict.files_changed(rec.written)))
    if reason.startswith("file"):
        return tuple(_file_lines(rec.files, verdict.files_changed(rec.files)))
    if reason.startswith("environment variable"):
        return tuple(_env_lines(rec.env))
    return ()


def _value_line(rec: StepRecord, name: str, now: str | None) -> str:
    was = rec.seen.get(name)
    if was is None:
        return f"{name!r}: its value when recorded is not known (recorded before nbdurable kept it)"
    if now is None:
        return f"{name!r}: was {was}"
    if now == was:  # alike in brief (two frames of one shape): the digests differ
        return f"{name!r}: was {was}, now another {now} (its content changed)"
    return f"{name!r}: was {was}, now {now}"


def _file_lines(recorded: dict[str, list[Any]], changed: list[str]) -> list[str]:
    lines = []
    for path in changed[:NAMES]:
        shown = os.path.basename(path)
        try:
            size = int(recorded[path][0])
            start = int(recorded[path][3]) if len(recorded[path]) > 3 else 0
        except (TypeError, ValueError, IndexError):
            size, start = -1, 0
        was = human_size(size - start) if size >= 0 else "?"
        try:
            now = f"now {human_size(os.stat(path).st_size)} (content differs)"
        except OSError:
            now = "now missing"
        lines.append(f"{shown}: was {was}, {now}")
    if len(changed) > NAMES:
        lines.append(f"… and {len(changed) - NAMES} more")
    return lines


def _env_lines(recorded: dict[str, Any]) -> list[str]:
    lines = []
    for name in verdict.env_changed(recorded)[:NAMES]:
        was = recorded[name]
        unset_then = was is None or (isinstance(was, list) and None in was)
        set_now = name in os.environ
        if unset_then and set_now:
            lines.append(f"${name}: was unset, now set")
        elif set_now:
            lines.append(f"${name}: set to another value (values are never recorded)")
        else:
            lines.append(f"${name}: was set, now unset")
    return lines
