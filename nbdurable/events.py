"""State-change events from the engine, for the panel and progress displays.

The engine calls :func:`emit`; listeners never call back into the engine on
the hot path. A listener that raises is dropped from that event with a
warning, so a broken display never breaks a run.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """One state change.

    ``kind`` is one of ``step-start``, ``step-replayed``, ``step-recorded``,
    ``step-failed``, ``step-invalidated``, ``sub-recorded``, ``sub-replayed``,
    ``store-changed`` (clear, pin, unpin), ``run-changed``.
    """

    kind: str
    run: str
    step: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[Event], None]
_listeners: list[Listener] = []
_lock = threading.Lock()


def subscribe(listener: Listener) -> Callable[[], None]:
    """Register ``listener``; returns a function that unsubscribes it."""
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(kind: str, run: str, step: str | None = None, **data: Any) -> None:
    """Send an event to every listener."""
    if not _listeners:
        return
    event = Event(kind, run, step, data)
    for listener in list(_listeners):
        try:
            listener(event)
        except Exception as exc:  # a display must never break a run
            warnings.warn(f"nbdurable: an event listener failed: {exc!r}", stacklevel=2)
