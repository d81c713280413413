"""Named crash points for the fault-injection suite.

``NBDURABLE_FAULT=<point>:<n>`` makes the process die with ``os._exit`` the
n-th time (1-based) execution passes :func:`point` with that name. Points:

- ``sub-returned``: a sub-step's function returned, its record not yet written;
- ``sub-written``: a sub-step's record was just written;
- ``blob-written``: a step's variable was saved (a large one written, a small one
  queued for the record's transaction), the step record not yet written;
- ``step-written``: a step's record was just written;
- ``file-hashed``: a file the step wrote was hashed (one of its outputs), the
  step record not yet written;
- ``replay``: in the middle of restoring a step's variables.
- ``store-write``: inside a store transaction, before it commits.
- ``store-readonly``: not a crash: every write to an embedded store fails as
  it does in a read-only directory (which root, who may write anywhere,
  cannot make).
- ``http-written``: a ``--http`` step's exchange was just recorded;
- ``stream-chunk``: a streamed model reply handed a chunk to its reader (the
  stream not yet recorded: a kill mid-stream).

Without the variable this costs one dictionary lookup per point.
"""

from __future__ import annotations

import os
import threading

_counts: dict[str, int] = {}
_lock = threading.Lock()
_spec: tuple[str, int] | None = None
_loaded = False


def _load() -> tuple[str, int] | None:
    raw = os.environ.get("NBDURABLE_FAULT", "")
    if not raw:
        return None
    name, _, n = raw.partition(":")
    return name, int(n or 1)


def armed(name: str) -> bool:
    """True if ``NBDURABLE_FAULT`` names this point (a write then takes the slow path)."""
    global _spec, _loaded
    if not _loaded:
        _spec, _loaded = _load(), True
    return _spec is not None and _spec[0] == name


def point(name: str) -> None:
    """Die here if ``NBDURABLE_FAULT`` names this point and its count is reached."""
    global _spec, _loaded
    if not _loaded:
        _spec, _loaded = _load(), True
    if _spec is None or _spec[0] != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _counts[name] == _spec[1]:
            os._exit(137)
