"""Library chatter while nbdurable looks at values: kept out of the user's cell.

Fingerprinting, pickling, a trial load and a restore run the objects' own
code (``__reduce__``, ``__getstate__``, ``__setstate__``): a LlamaIndex agent
logs ``Removing unpickleable private attribute ...``, pydantic warns of keys
it skips. A plain run does none of this, so none of it may show in the cell.
:func:`hush` drops, in the calling thread only, the warnings raised and the
log records emitted while it is active; nbdurable's own notices are issued
outside it (see ``nbdurable.durable.context.warn``).

Both are dropped by a check of a thread-local depth: log records in
``logging.Logger.handle`` (patched once, on first use), warnings by an
``ignore`` filter kept first in ``warnings.filters`` whose message pattern
matches only in a hushed thread. ``logging.disable`` would silence every
other thread of the kernel too (a background job's log lost because a step
was recorded); ``warnings.catch_warnings`` would restore the filter list on
exit, dropping the filters a library adds when it is first imported during
a load.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import warnings
from collections.abc import Iterator
from typing import Any

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        handle = logging.Logger.handle

        def handle_unless_hushed(self: logging.Logger, record: logging.LogRecord) -> Any:
            if getattr(_local, "depth", 0):
                return None  # emitted by an object's own code while nbdurable looked at it
            return handle(self, record)

        handle_unless_hushed.__wrapped__ = handle  # type: ignore[attr-defined]
        logging.Logger.handle = handle_unless_hushed  # type: ignore[method-assign]
        _installed = True


class _InAHushedThread:
    """A warnings filter's message pattern that matches in a hushed thread only."""

    def match(self, text: str) -> bool:
        return bool(getattr(_local, "depth", 0))

    def __repr__(self) -> str:
        return "<nbdurable: warnings of objects nbdurable is pickling>"


#: First in warnings.filters while any thread is hushed, and only then (a plain
#: run's `warnings.filters` has no such entry). Placed first on every entry: a
#: filter added before it, `simplefilter("error")` say, must not turn an
#: object's own warning into an error inside nbdurable's pickling.
_FILTER = ("ignore", _InAHushedThread(), Warning, None, 0)
_hushed = 0  # threads in a hush now
_count_lock = threading.Lock()


def _enter() -> None:
    global _hushed
    with _count_lock:
        _hushed += 1
        filters = warnings.filters
        if not filters or filters[0] is not _FILTER:
            with contextlib.suppress(ValueError):
                filters.remove(_FILTER)
            filters.insert(0, _FILTER)
            _mutated()


def _leave() -> None:
    global _hushed
    with _count_lock:
        _hushed -= 1
        if not _hushed:
            # Only this entry goes: filters added meanwhile (a library imported during
            # a load) stay, as they would in a plain run.
            with contextlib.suppress(ValueError):
                warnings.filters.remove(_FILTER)
            _mutated()


@contextlib.contextmanager
def hush(streams: bool = False) -> Iterator[None]:
    """Drop the warnings and log records the calling thread emits in this block.

    ``streams``: what it prints on ``sys.stdout`` / ``sys.stderr`` too, for a
    restore (a class whose ``__reduce__`` calls its ``__init__``, which
    prints): the replayed cell shows the recorded outputs, nothing more.
    """
    if not _installed:
        _install()
    outermost = not getattr(_local, "depth", 0)
    if outermost:
        _enter()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        with contextlib.ExitStack() as stack:
            if streams:
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        _local.depth -= 1
        if outermost:
            _leave()


def _mutated() -> None:
    # warnings caches which filter matched a location; a changed list must say so
    # (CPython's private hook, as filterwarnings calls it; absent elsewhere: no cache).
    getattr(warnings, "_filters_mutated", lambda: None)()
