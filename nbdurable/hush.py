"""Library chatter while nbdurable looks at values: kept out of the user's cell.

Fingerprinting, pickling, a trial load and a restore run the objects' own
code (``__reduce__``, ``__getstate__``, ``__setstate__``): a LlamaIndex agent
logs ``Removing unpickleable private attribute ...``, pydantic warns of keys
it skips. A plain run does none of this, so none of it may show in the cell.
:func:`hush` drops, in the calling thread only, the warnings raised and the
log records emitted while it is active; nbdurable's own notices are issued
outside it (see ``nbdurable.durable.context.warn``).

Both are dropped by a check of a thread-local depth, installed once on first
use, in ``logging.Logger.handle`` and around ``warnings.showwarning``:
``logging.disable`` would silence every other thread of the kernel too (a
background job's log lost because a step was recorded), and
``warnings.catch_warnings`` restores the filter list on exit, which drops
the filters a library adds when it is first imported during a load.
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
        show = warnings.showwarning

        def show_unless_hushed(*args: Any, **kwargs: Any) -> Any:
            if getattr(_local, "depth", 0):
                return None
            return show(*args, **kwargs)

        show_unless_hushed.__wrapped__ = show  # type: ignore[attr-defined]
        warnings.showwarning = show_unless_hushed
        _installed = True


@contextlib.contextmanager
def hush(streams: bool = False) -> Iterator[None]:
    """Drop the warnings and log records the calling thread emits in this block.

    ``streams``: what it prints on ``sys.stdout`` / ``sys.stderr`` too, for a
    restore (a class whose ``__reduce__`` calls its ``__init__``, which
    prints): the replayed cell shows the recorded outputs, nothing more.
    """
    if not _installed:
        _install()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        with contextlib.ExitStack() as stack:
            if streams:
                stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        _local.depth -= 1
