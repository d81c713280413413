"""A displayed widget's text as it looks at the end of the cell, not when it was displayed.

A widget output carries a live view (which dies with the kernel) and static
fallbacks (``text/plain``, maybe ``text/html`` or an image) rendered when it
was *displayed*. For a progress bar that is its first state: ``0%| | 0/3``.
:class:`WidgetWatch` keeps each displayed widget's fallbacks up to date while
the cell runs: it observes the widget and the widgets inside it, and renders
its fallbacks again after every change (a ``tqdm.auto`` bar's text is only
available while the bar object lives, so waiting for the end of the cell is
too late). :meth:`WidgetWatch.finish` writes the last rendering into the
recorded outputs, so a replay shows the final state, as a finished
``tqdm.tqdm`` text bar does.

A widget closed before the end of the cell (a ``tqdm.auto`` bar made with
``leave=False``, ``widget.close()``) is gone from the frontend: its view is
removed, the cell shows nothing in its place. :meth:`WidgetWatch.finish`
names its outputs so the caller drops them, and a replay shows nothing there
either.

Some widgets have no text that says what they show (an ``ipympl`` figure,
a container, an ``Output`` area, a custom widget); their replay cannot be
faithful. :meth:`WidgetWatch.finish` names them, so the caller can say so
once when the step is recorded.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

#: Mime type of a live widget view (the same as ``capture.WIDGET_VIEW_MIME``).
VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def model_id_of(data: Any) -> str | None:
    """The widget model id a mime bundle's live view points at, if any."""
    view = data.get(VIEW_MIME) if isinstance(data, dict) else None
    model_id = view.get("model_id") if isinstance(view, dict) else None
    return model_id if isinstance(model_id, str) else None


def find_widget(model_id: str) -> Any | None:
    """The live ipywidgets ``Widget`` with this model id, or None."""
    module = sys.modules.get("ipywidgets.widgets.widget")
    instances = getattr(module, "_instances", None) if module is not None else None
    if not isinstance(instances, dict):
        return None
    return instances.get(model_id)


def has_own_text(widget: Any) -> bool:
    """Whether the widget's text fallback says what it shows.

    True for ipywidgets' value widgets (their repr lists the value) and for
    classes that define their own text representation (``tqdm``'s bar);
    False for containers, output areas, figures and custom widgets, whose
    text is only a list of traits.
    """
    value_widget = getattr(sys.modules.get("ipywidgets"), "ValueWidget", None)
    for cls in type(widget).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if module.startswith("ipywidgets."):
            return value_widget is not None and issubclass(cls, value_widget)
        if "__repr__" in vars(cls) or "_repr_pretty_" in vars(cls):
            return True
    return False


def render(widget: Any) -> dict[str, Any]:
    """The widget's mime bundle now, as IPython's display formatter computes it.

    Called directly rather than through the shell's formatter, which shows a
    traceback in the cell when a representation raises.
    """
    method = getattr(widget, "_repr_mimebundle_", None)
    bundle = method() if callable(method) else None
    data = dict(bundle[0] if isinstance(bundle, tuple) else bundle or {})
    if "text/plain" not in data:
        from IPython.lib.pretty import pretty

        data["text/plain"] = pretty(widget)
    return data


def _descendants(widget: Any, widget_type: type) -> list[Any]:
    """`widget` and every widget reachable through its traits (children, layout, ...)."""
    seen: dict[int, Any] = {}
    todo = [widget]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen[id(item)] = item
        for name in item.keys:
            value = getattr(item, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            todo.extend(v for v in values if isinstance(v, widget_type))
    return list(seen.values())


def is_closed(widget: Any) -> bool:
    """Whether `widget` was closed: its model is gone from the frontend with its views."""
    return getattr(widget, "comm", True) is None


class Finished(NamedTuple):
    """What :meth:`WidgetWatch.finish` found."""

    #: class names of the widgets whose replay cannot be faithful
    unfaithful: list[str]
    #: the outputs of widgets closed during the cell: the frontend shows none of them
    closed: list[dict[str, Any]]


class _Tracked:
    def __init__(self, widget: Any) -> None:
        self.widget = widget
        self.outputs: list[dict[str, Any]] = []
        self.latest: dict[str, Any] | None = None
        self.watched: list[Any] = []


class WidgetWatch:
    """Keeps the fallbacks of the widgets a cell displays up to date (see module doc).

    `convert` makes a rendered bundle JSON-able, as the recorded outputs are.
    """

    def __init__(self, convert: Callable[[Any], Any]) -> None:
        self._convert = convert
        self._lock = threading.RLock()
        self._tracked: dict[str, _Tracked] = {}
        self._lost: list[str] = []

    def track(self, output: dict[str, Any]) -> None:
        """Keep `output`'s fallbacks (if it shows a widget) up to date until :meth:`finish`."""
        model_id = model_id_of(output.get("data"))
        if model_id is None:
            return
        with self._lock:
            entry = self._tracked.get(model_id)
            if entry is None:
                widget = find_widget(model_id)
                if widget is None:
                    self._lost.append(model_id)
                    return
                entry = self._tracked[model_id] = _Tracked(widget)
                self._observe(entry)
            entry.outputs.append(output)

    def _observe(self, entry: _Tracked) -> None:
        widget_type = sys.modules["ipywidgets"].Widget  # find_widget found one: imported

        def changed(_change: Any) -> None:
            self._refresh(entry)

        for item in _descendants(entry.widget, widget_type):
            item.observe(changed)
            entry.watched.append((item, changed))

    def _refresh(self, entry: _Tracked) -> bool:
        try:
            bundle = self._convert(render(entry.widget))
        except Exception:  # e.g. a tqdm bar whose pbar proxy died with the loop
            return False
        fallbacks = {k: v for k, v in bundle.items() if k != VIEW_MIME}
        if fallbacks:
            with self._lock:
                entry.latest = fallbacks
        return True

    def current(self, output: dict[str, Any]) -> dict[str, Any] | None:
        """`output` as its widget looks now (None if it was closed); other outputs as they are.

        For the outputs a sub-step recorded: its call has ended, the cell has not.
        """
        model_id = model_id_of(output.get("data"))
        with self._lock:
            entry = self._tracked.get(model_id) if model_id is not None else None
        if entry is None:
            return output
        if is_closed(entry.widget):
            return None
        self._refresh(entry)
        with self._lock:
            latest = entry.latest
        if latest is None:
            return output
        data = output.get("data") or {}
        return {**output, "data": {**{k: v for k, v in data.items() if k == VIEW_MIME}, **latest}}

    def finish(self) -> Finished:
        """Write each widget's last rendering into its outputs; stop watching."""
        unfaithful: list[str] = []
        closed: list[dict[str, Any]] = []
        with self._lock:
            tracked, self._tracked = self._tracked, {}
            lost, self._lost = self._lost, []
        for entry in tracked.values():
            for item, handler in entry.watched:
                try:
                    item.unobserve(handler)
                except Exception:  # a closed widget has no observers left
                    pass
            if is_closed(entry.widget):
                closed += entry.outputs
                continue
            self._refresh(entry)
            if entry.latest is not None:
                for output in entry.outputs:
                    data = output.get("data") or {}
                    output["data"] = {
                        **{k: v for k, v in data.items() if k == VIEW_MIME},
                        **entry.latest,
                    }
            if not has_own_text(entry.widget):
                unfaithful.append(type(entry.widget).__name__)
        unfaithful += ["closed widget"] * bool(lost)
        return Finished(sorted(set(unfaithful)), closed)
