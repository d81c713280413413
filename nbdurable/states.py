"""The step-state vocabulary: each state's name, glyph, colour, and what it means.

One table for every view: the panel's rows and tooltips (:mod:`nbdurable.ipython.rows`),
the console's progress lines (:mod:`nbdurable.run.progress`) and the cell
marks in JupyterLab and Notebook 7, whose TypeScript gets it from the
server with the marks (:func:`vocabulary`), never from a copy. Which state a
step is in is :mod:`nbdurable.status`' decision; this module only names them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .identity import keys, stepline


class State(NamedTuple):
    """How one step state reads, wherever it is shown."""

    glyph: str
    #: A JupyterLab theme variable with a fallback for other frontends, so the
    #: light and dark themes both read well; every state also has its own glyph
    #: and label, so it reads without colour.
    colour: str
    filled: bool  # the badge is drawn filled (something happened in this kernel)
    help: str  # one line, as docs/views.md explains it (the panel's tooltip)
    next_run: str  # what the next run does with the step (the cell mark's tooltip)


GREY = "var(--jp-ui-font-color2, #757575)"
_GREEN = "var(--jp-success-color1, #388e3c)"
_ORANGE = "var(--jp-warn-color1, #f57c00)"

STATES: dict[str, State] = {
    "recorded": State(
        "✓",
        _GREEN,
        False,
        "in the store; a rerun replays it instead of running it",
        "Recorded: the next run replays it.",
    ),
    "replayed": State(
        "↻",
        _GREEN,
        True,
        "restored from its record in this kernel; nothing in it ran again",
        "Replayed from its record in the last run; the next run replays it again.",
    ),
    "running": State(
        "▶",
        "var(--jp-brand-color1, #1976d2)",
        True,
        "executing now; its sub-step counter moves as calls are recorded",
        "The kernel runs it now.",
    ),
    "pending": State(
        "○",
        GREY,
        False,
        "no record yet: it will run (sub-steps recorded before a crash still replay)",
        "Not recorded yet: the next run executes and records it.",
    ),
    "invalidated": State(
        "⚠",
        _ORANGE,
        False,
        "recorded, but its code or inputs changed (reason shown): it will run again",
        "Its record no longer matches: the next run executes it again.",
    ),
    "may run": State(
        "?",
        _ORANGE,
        False,
        "recorded, but a step before it will run first: it replays only if the values "
        "it reads from that step come out the same",
        "A step before it runs first: the next run replays it only if what it reads "
        "from that step comes out the same.",
    ),
    "pinned": State(
        "⚑",
        "var(--md-purple-400, #ab47bc)",
        False,
        "replays even when invalidated; 'pinned · stale' says it would otherwise run again",
        "Pinned: the next run replays its record even if it no longer matches.",
    ),
    "failed": State(
        "✗",
        "var(--jp-error-color1, #d32f2f)",
        True,
        "its last execution raised; only the sub-steps that finished are recorded",
        "Its last run raised: the next run executes it again.",
    ),
    "waiting": State(
        "◷",
        "var(--jp-warn-color0, #e65100)",
        True,
        "stopped at an approval a person has not decided yet: Approve or Reject it in the "
        "cell, the side panel, or with `nbdurable approve` / `nbdurable reject`",
        "Waiting for a person to approve or reject: once decided, the next run replays "
        "what came before and goes on with the decision.",
    ),
    "not replayable": State(
        "◐",
        "var(--jp-info-color1, #0097a7)",
        False,
        "recorded, but a value could not be saved: its body reruns, sub-steps replay",
        "Recorded, but a variable could not be saved: its body runs again, its sub-steps replay.",
    ),
    "orphaned": State(
        "⊘",
        "var(--jp-ui-font-color3, #9e9e9e)",
        False,
        "recorded in the store, but no longer in the notebook",
        "Recorded in the store, but no longer in the notebook.",
    ),
}

#: Only the frontend knows it: the cell's source differs from the saved one.
EDITED = State(
    "✎",
    GREY,
    False,
    "edited and not saved",
    "Edited and not saved: save the notebook to see what the next run does.",
)

#: What a cell of ``nbdurable run`` came to, as the console shows it (glyph, ASCII).
OUTCOMES: dict[str, tuple[str, str]] = {
    "replayed": (STATES["replayed"].glyph, "="),
    "executed": (STATES["recorded"].glyph, "+"),
    "invalidated": (STATES["recorded"].glyph, "+"),  # it ran again and is recorded
    "failed": (STATES["failed"].glyph, "x"),
    "kernel died": (STATES["failed"].glyph, "x"),
    "waiting": (STATES["waiting"].glyph, "?"),  # stopped at an approval not decided yet
}


def vocabulary() -> dict[str, Any]:
    """What the frontend needs to read cells as nbdurable does, as JSON.

    The states (with ``edited``), the ``%step`` commands and options and the
    step-name pattern: the cell marks parse a ``%%step`` line with these, so
    they never disagree with the magic.
    """
    states = {**STATES, "edited": EDITED}
    return {
        "states": {name: s._asdict() for name, s in states.items()},
        "commands": list(stepline.STEP_COMMANDS),
        "options": list(stepline.OPTIONS),
        "name_pattern": keys.NAME_PATTERN,
    }


if __name__ == "__main__":  # `python -m nbdurable.states > js/src/vocabulary.json`
    import json

    print(json.dumps(vocabulary(), indent=2, ensure_ascii=False))
