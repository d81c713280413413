"""The ``%%step`` line: ``%%step [NAME] [--force] [--http] [--inputs PATTERN ...]``.

One grammar, read by the magic when a cell runs and by every reader of a
saved notebook (the runner, ``nbdurable status``, the cell marks): a cell
whose first line the magic refuses is never a step anywhere. The frontend
gets the same rules from the server (:func:`nbdurable.states.vocabulary`),
never from a copy.
"""

from __future__ import annotations

import re
import shlex
from typing import NamedTuple

from ..errors import UsageProblem
from .keys import _shown, validate_name

#: ``%step`` commands: never a step name.
STEP_COMMANDS = ("list", "clear", "pin", "unpin", "run", "fork", "panel", "takeover")
#: The options the line takes (``-f`` is ``--force``).
OPTIONS = ("--force", "-f", "--http", "--inputs")
#: A code cell's first line that makes it a step; group 1 is the rest of the line.
STEP_LINE = re.compile(r"^\s*%%step\b(.*)$")


class StepArgs(NamedTuple):
    """What the line after ``%%step`` says (see :func:`parse`)."""

    name: str | None
    force: bool
    #: ``--inputs`` patterns, as written (checked by :func:`check_input_pattern`)
    inputs: tuple[str, ...] = ()
    #: ``--http``: the body's HTTP is recorded (see ``nbdurable.durable.httpsteps``)
    http: bool = False


#: A line shlex splits at its spaces alone: no quote, no backslash, no whitespace but
#: the four shlex splits at (str.split splits at others too, such as a form feed).
_PLAIN_WORDS = re.compile(r"[^'\"\\\s]*(?:[ \t\r\n]+[^'\"\\\s]*)*")

_USAGE = "usage: %%step [NAME] [--force] [--http] [--inputs PATTERN ...]"


def parse(line: str) -> StepArgs:
    """The name, ``--force``, ``--http`` and ``--inputs`` patterns from the text after ``%%step``.

    The one parser of that line, for the magic and for reading saved notebooks
    alike; raises :class:`UsageProblem` for a line the magic refuses. Every
    word after ``--inputs`` up to the next option is a pattern.
    """
    if _PLAIN_WORDS.fullmatch(line):
        args = line.split()  # what shlex.split makes of it, without its per-character loop
    else:
        try:
            args = shlex.split(line)
        except ValueError as exc:
            raise UsageProblem(f"%%step: cannot parse arguments ({exc})") from None
    force, http, rest, inputs = False, False, [], []
    in_inputs = False
    for i, a in enumerate(args):
        if a.startswith("-") and a not in OPTIONS:
            raise UsageProblem(f"%%step: unknown option {_shown(a)}; {_USAGE}")
        if a == "--inputs" and (i + 1 == len(args) or args[i + 1].startswith("-")):
            raise UsageProblem(f"%%step: --inputs needs at least one PATTERN; {_USAGE}")
        if a.startswith("-"):
            force = force or a in ("--force", "-f")
            http = http or a == "--http"
            in_inputs = a == "--inputs"
        elif in_inputs:
            inputs.append(check_input_pattern(a))
        else:
            rest.append(a)
    if len(rest) > 1:
        raise UsageProblem(f"%%step takes one NAME, got {len(rest)}: {_shown(' '.join(rest))}")
    if rest and rest[0] in STEP_COMMANDS:
        raise UsageProblem(
            f"%%step {rest[0]}: {rest[0]!r} is a %step command; use %step {rest[0]} on one line"
        )
    return StepArgs((validate_name(rest[0]) if rest else None), force, tuple(inputs), http)


def check_input_pattern(pattern: str) -> str:
    """``pattern`` if it is a usable glob pattern; else :class:`UsageProblem`.

    Refused: an empty pattern, a NUL character, a ``[`` never closed by ``]``
    (glob would take it literally: almost surely a typo).
    """
    if not pattern.strip():
        raise UsageProblem("%%step: --inputs: an empty PATTERN matches nothing")
    if "\0" in pattern:
        raise UsageProblem(f"%%step: --inputs: bad PATTERN {_shown(pattern)} (a NUL character)")
    i = pattern.find("[")
    while i >= 0:  # a class as fnmatch reads it: `[!...]`, a `]` first is literal
        j = i + 1 + (pattern[i + 1 : i + 2] == "!")
        j = pattern.find("]", j + (pattern[j : j + 1] == "]"))
        if j < 0:
            break
        i = pattern.find("[", j + 1)
    if i >= 0:
        raise UsageProblem(
            f"%%step: --inputs: bad PATTERN {_shown(pattern)}: '[' without ']' "
            "(write [[] for a literal '[')"
        )
    return pattern
