"""The step panel's compare view: this run beside another run of the store.

The panel's **Compare…** button opens it under the header: a drop-down of
the store's other runs (read when the view opens: listing runs reads every
run's keys, so it is never done on the panel's once-a-second path), and,
once one is picked, :func:`nbdurable.rundiff.diff_runs` of the two as HTML:
one line per step (same, differs, only in one run) with each run's time and
calls, and under a differing step what differs, as ``nbdurable diff``
prints it. Nothing is loaded from a record (no value is unpickled); every
line is escaped and was recorded redacted.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from .. import rundiff
from ..store import admin
from ..text import plural

_GREY = "var(--jp-ui-font-color2, #757575)"


def _e(text: object) -> str:
    return html.escape(str(text), quote=False)


class CompareView(widgets.VBox):
    """Pick another run; read how it differs from ``run_id``, step by step."""

    def __init__(self, session: Any, run_id: str) -> None:
        self.session, self.run_id = session, run_id
        self.lines: list[str] = []  # what show() showed, one line per step (tests, text)
        others = [r for r in admin.run_names(session.store) if r != run_id]
        options: list[tuple[str, str | None]] = [("another run…", None)]
        options += [(r, r) for r in sorted(others)]
        self.pick = widgets.Dropdown(
            options=options,
            description="Compare with",
            style={"description_width": "initial"},
            layout=widgets.Layout(width="auto", max_width="100%"),
            disabled=not others,
        )
        self.result = widgets.HTML(
            f'<div style="color:{_GREY};font-size:smaller">'
            + ("pick a run to compare" if others else "no other run in this store yet")
            + "</div>"
        )
        self.result.add_class("nbd-compare-result")
        self.pick.observe(self._picked, "value")
        super().__init__([self.pick, self.result], layout=widgets.Layout(padding="2px 0 6px 2px"))
        self.add_class("nbd-compare")

    def _picked(self, change: dict[str, Any]) -> None:
        other = change.get("new")
        if other is None:
            return
        self.show(other)

    def show(self, other: str) -> None:
        """The comparison of this view's run (A) with ``other`` (B)."""
        rows = rundiff.diff_runs(self.session.store, self.run_id, other, self.session.notebook)
        differ = sum(r.verdict != "same" for r in rows)
        parts = [
            f'<div class="nbd-compare-head"><b>A</b> <code>{_e(self.run_id)}</code> · '
            f"<b>B</b> <code>{_e(other)}</code>: {plural(len(rows), 'step')}, "
            f"{differ} differ</div>"
        ]
        for r in rows:
            mark = "=" if r.verdict == "same" else "≠"
            parts.append(
                f'<div class="nbd-compare-step" data-verdict="{_e(r.verdict)}">{mark} '
                f"<b>{_e(r.label)}</b>: {_e(r.verdict)} "
                f'<span style="color:{_GREY}">A {r.a.seconds:.1f} s, '
                f"{plural(r.a.calls, 'call')} · B {r.b.seconds:.1f} s, "
                f"{plural(r.b.calls, 'call')}</span></div>"
            )
            parts += [
                f'<div class="nbd-compare-line" style="padding-left:1.5em;'
                f"font-family:var(--jp-code-font-family, monospace);font-size:smaller;"
                f'white-space:pre-wrap;overflow-wrap:anywhere">{_e(line)}</div>'
                for line in r.lines
            ]
        self.result.value = "".join(parts)
        self.lines = [f"{'=' if r.verdict == 'same' else '≠'} {r.label}: {r.verdict}" for r in rows]

    def close(self) -> None:
        """Close the view and its widgets."""
        self.pick.close()
        self.result.close()
        super().close()
