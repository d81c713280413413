"""One row of the step panel: its HTML (label, state badge, facts, detail) and its buttons.

Every state has a glyph, a colour and a text label of its own, so a row
reads without colour; :data:`STATE_HELP` is the tooltip of each state.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

import ipywidgets as widgets

from ..states import GREY, STATES
from ..status import StepInfo
from ..store.layout import RUN_SCOPE
from ..text import human_size, seconds, tokens

if TYPE_CHECKING:
    from .panel import StepPanel

_GREY = GREY
#: One line per state, as docs/views.md explains them (see nbdurable.states).
STATE_HELP: dict[str, str] = {name: state.help for name, state in STATES.items()}

#: Below this, a record's duration is not shown as time saved when it made calls.
_MEASURABLE = 0.05

_BUTTON = widgets.Layout(width="5.5em", min_width="5.5em", margin="0 0 0 4px")
_HIDDEN_BUTTON = widgets.Layout(
    width="5.5em", min_width="5.5em", margin="0 0 0 4px", visibility="hidden"
)


class StepRow:
    """One step's row: a line of HTML (label, state badge, facts, detail) and two buttons."""

    def __init__(self, owner: StepPanel, info: StepInfo) -> None:
        self.info = info
        # The text takes the line; when less than ~22em would be left beside the
        # buttons, they wrap onto a line of their own instead of covering it.
        self.html = widgets.HTML(layout=widgets.Layout(flex="1 1 22em", min_width="0"))
        self.pin_button = widgets.Button(
            description="Pin", layout=_HIDDEN_BUTTON if info.key == RUN_SCOPE else _BUTTON
        )
        self.clear_button = widgets.Button(description="Clear", layout=_BUTTON)
        # The two buttons wrap as one: a narrow panel puts both under the text, never
        # Pin beside it and Clear alone on the next line.
        self.buttons = widgets.HBox(
            [self.pin_button, self.clear_button], layout=widgets.Layout(flex="0 0 auto")
        )
        self.line = widgets.HBox(
            [self.html, self.buttons],
            layout=widgets.Layout(align_items="center", flex_flow="row wrap"),
        )
        self.box = widgets.VBox(
            [self.line],
            layout=widgets.Layout(
                border_top="1px solid var(--jp-border-color3, #eee)", padding="2px 0"
            ),
        )
        self.pin_button.on_click(lambda _b: owner.set_pin(self.info.key, not self.info.pinned))
        self.clear_button.on_click(lambda _b: owner._ask_clear(self))

    @property
    def state(self) -> str:
        """The state shown: a key of :data:`STATE_HELP`, or ``pinned-stale``."""
        return _shown_state(self.info)

    def show(self, new: int = 0, replayed: int = 0) -> None:
        """Redraw from ``self.info`` plus sub-steps counted in memory since the last reload."""
        info = self.info
        value = row_html(info, new, replayed)
        if value != self.html.value:
            self.html.value = value
        classes = ("nbd-row", "nbd-state-" + self.state.replace(" ", "-"))
        if tuple(self.box._dom_classes) != classes:
            self.box._dom_classes = classes
        recorded = info.recorded_at is not None
        running = info.state == "running"
        with self.pin_button.hold_sync():
            self.pin_button.description = "Unpin" if info.pinned else "Pin"
            self.pin_button.disabled = running or not (recorded or info.pinned)
            self.pin_button.tooltip = (
                "Stop replaying this step when it is invalidated"
                if info.pinned
                else "Replay this step even when its code or inputs change"
                if recorded
                else "Nothing recorded to pin yet"
            )
        with self.clear_button.hold_sync():
            self.clear_button.disabled = running or (
                info.state == "pending" and info.substeps == 0 and not new
            )
            n = info.substeps + new
            self.clear_button.tooltip = (
                f"Forget this step's record and its {n} "
                f"sub-step{'' if n == 1 else 's'} (asks first)"
                if n
                else "Forget this step's record"
            )

    def close(self) -> None:
        """Close the row's widgets (not the shared layouts)."""
        for w in (self.html, self.pin_button, self.clear_button, self.buttons, self.line, self.box):
            w.close()


_GROUP = {
    "replayed": "recorded",
    "pinned": "recorded",
    "not replayable": "recorded",
}


def row_html(info: StepInfo, new: int = 0, replayed: int = 0) -> str:
    """The HTML of one row: position and label, state badge, facts, and a detail line."""
    state = _shown_state(info)
    look = STATES.get(info.state)
    glyph, colour, filled = (look.glyph, look.colour, look.filled) if look else ("?", GREY, False)
    text = "pinned · stale" if state == "pinned-stale" else info.state
    border = "dashed" if info.state in ("pending", "orphaned", "may run") else "solid"
    badge_style = (
        f"display:inline-block;min-width:9.5em;box-sizing:border-box;padding:0 8px;"
        f"border:1px {border} {colour};border-radius:10px;font-size:0.92em;white-space:nowrap;"
        + (
            f"background:{colour};color:var(--jp-ui-inverse-font-color1, #fff);"
            if filled
            else f"color:{colour};"
        )
    )
    hint = info.detail or STATE_HELP.get(info.state, "")
    pos = "" if info.position is None else f"#{info.position + 1} "
    facts = _facts(info, new, replayed)
    detail = ""
    if info.detail:
        tone = (
            colour
            if info.state in ("invalidated", "may run", "failed", "waiting") or info.stale
            else _GREY
        )
        detail = (
            f'<div class="nbd-detail" style="color:{tone};font-size:0.9em;'
            f'padding-left:1.5em;white-space:normal;overflow-wrap:anywhere">'
            f"{_e(info.detail)}</div>"
        )
    if info.why:
        # What exactly changed (nbdurable.why): code and values, so in the code font.
        lines = "".join(f"<div>{_e(line)}</div>" for line in info.why)
        detail += (
            f'<div class="nbd-why" style="color:{_GREY};font-size:0.85em;padding-left:1.5em;'
            f"font-family:var(--jp-code-font-family, monospace);line-height:1.4;"
            f'overflow-wrap:anywhere">{lines}</div>'
        )
    return (
        f'<div class="nbd-step" data-step="{_attr(info.label)}" data-state="{_attr(state)}">'
        # The line wraps between whole values, never inside one: at any width the
        # name, the badge and each fact stay on one line each, and nothing runs
        # under the buttons (the widget's box ends where they begin).
        f'<div class="nbd-line" style="display:flex;flex-wrap:wrap;align-items:baseline;'
        f'column-gap:0.8em;line-height:1.6"><span class="nbd-name" title="{_attr(info.key)}" '
        f'style="flex:0 1 14em;min-width:0;max-width:100%;overflow:hidden;'
        f'text-overflow:ellipsis;white-space:nowrap">'
        f'<span style="color:{_GREY}">{pos}</span><b>{_e(info.label)}</b></span>'
        f'<span class="nbd-badge" title="{_attr(hint)}" style="{badge_style}">'
        f"{glyph} {_e(text)}</span>"
        f'<span class="nbd-facts" style="flex:1 1 auto;min-width:0;color:{_GREY}">{facts}</span>'
        f"</div>{detail}</div>"
    )


def _facts(info: StepInfo, new: int, replayed: int) -> str:
    """Sub-step progress, when recorded, what replay saves, size (HTML, escaped)."""
    parts: list[str] = []
    recorded = info.recorded_at is not None
    have = info.substeps + new
    expected = info.calls if recorded and info.key != RUN_SCOPE else 0
    if info.state == "running":
        progress = _progress(have, expected)
        if replayed:
            progress += f", {replayed} replayed"
        parts.append(f'<span class="nbd-progress">{progress}</span>')
    elif have or expected:
        parts.append(f'<span class="nbd-progress">{_progress(have, expected)}</span>')
    if recorded and info.recorded_at is not None:
        when = time.localtime(info.recorded_at)
        today = time.localtime().tm_yday == when.tm_yday
        short = time.strftime("%H:%M" if today else "%b %d %H:%M", when)
        full = time.strftime("%Y-%m-%d %H:%M:%S", when)
        parts.append(f'<span title="recorded {full}">at {short}</span>')
    calls = f"{info.calls} call{'s' if info.calls != 1 else ''}" if info.calls else ""
    spent_tokens = tokens(info.tokens) if info.tokens else ""
    # A record made while its calls replayed took next to no time: its duration says
    # nothing of what replay saves, so only the calls are named ("0.0 s, 10 calls" read
    # as a contradiction).
    counted = calls or spent_tokens
    spent = seconds(info.duration) if info.duration >= _MEASURABLE or not counted else ""
    saving = ", ".join(p for p in (spent, calls, spent_tokens) if p)
    if recorded and info.state == "replayed":
        parts.append(f"saved {saving}")
    elif recorded and info.state in ("recorded", "pinned", "orphaned", "may run"):
        parts.append(f"replay saves {saving}")
    elif recorded and info.state == "not replayable" and info.calls:
        parts.append(f"replay saves {info.calls} call{'s' if info.calls != 1 else ''}")
    if info.version:
        # Non-breaking spaces: a narrow panel wraps between facts, never inside one.
        kept = f"&nbsp;(+{info.versions}&nbsp;kept)" if info.versions else ""
        title = "this step's code and inputs; a step set back to a kept version replays it"
        parts.append(
            f'<span class="nbd-version" title="{title}">v&nbsp;{info.version}{kept}</span>'
        )
    if info.size:
        parts.append(human_size(info.size))
    # Each fact is one unbreakable value ("13.0 KB" never splits); lines break between them.
    return " · ".join(
        f'<span class="nbd-fact" style="white-space:nowrap">{p}</span>' for p in parts
    )


def _shown_state(info: StepInfo) -> str:
    return "pinned-stale" if info.state == "pinned" and info.stale else info.state


def _progress(have: int, expected: int) -> str:
    """``39 of 60 sub-steps`` when the step's last record says how many to expect."""
    if 0 < expected and have <= expected:
        return f"{have} of {expected} sub-steps"
    return f"{have} sub-step{'' if have == 1 else 's'} recorded"


def _e(text: str) -> str:
    """Escape text for HTML element content."""
    return html.escape(text, quote=False)


def _attr(text: str) -> str:
    """Escape text for a double-quoted HTML attribute."""
    return html.escape(text, quote=True)
