"""What a run knows while a step executes: its context, its sub-step index, its savings.

Also :func:`warn`, the one way nbdurable warns: a warning is about this
execution, never part of a step's recorded output.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..clients.usage import Tally
from ..errors import NbdurableWarning
from ..store import Store
from ..text import plural, seconds, tokens
from . import host

#: The id of the sub-step call executing now (None: none). Its effects are the
#: call's, which replays and is never repeated: idempotency keys name it, and
#: files it writes are not outputs of the step (see :mod:`.fileio`).
current_sub: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nbdurable_sub", default=None
)


def warn(message: str) -> None:
    """Warn loudly; every nbdurable warning goes through here.

    A warning raised while a step runs is about this execution, not part of
    the step's output: it goes past the capture, so it is shown now and not
    replayed with the step's outputs on every later run. It is a real
    ``warnings.warn`` (a program may filter or record it), shown as one line
    without a location (see :func:`_format`): the file and source line of
    nbdurable's code that raised it made a note read like a crash.
    """
    global _formatting
    if not _formatting:
        # Once: a formatter installed after this one (which may call this one) is left
        # in charge; installing again would chain the two into each other.
        _formatting = True
        if warnings.formatwarning is not _format:  # never chained to itself
            _format.chained = warnings.formatwarning  # type: ignore[attr-defined]
            warnings.formatwarning = _format
    with host.unrecorded():
        warnings.warn(message, NbdurableWarning, stacklevel=3)


def _format(message: Any, category: type, filename: str, lineno: int, line: Any = None) -> str:
    """``warnings.formatwarning`` for nbdurable's own: ``NbdurableWarning: <the note>``.

    Every other warning is formatted by the function this one replaced.
    """
    if isinstance(category, type) and issubclass(category, NbdurableWarning):
        return f"{category.__name__}: {message}\n"
    return _format.chained(message, category, filename, lineno, line)  # type: ignore[attr-defined]


_format.chained = warnings.formatwarning  # type: ignore[attr-defined]
_formatting = False  # _format is installed (see warn)


def flush_streams() -> None:
    """Send what was printed so far (nbdurable's warnings) before the step's own outputs."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no stream, or a closed one
            pass


def say(line: str) -> None:
    """Print one line about this execution on stderr, past any capture (never replayed)."""
    with host.unrecorded():
        print(line, file=sys.stderr, flush=True)


class SubIndex:
    """The sub-step records of one scope, read in one range read on the first lookup.

    A step's index lives as long as the step's execution; the run scope's
    (sub-steps called outside any step) as long as one cell, when the
    extension's per-cell hook is installed. It is read again if the store
    was reopened or something was deleted from it since. A value is handed
    out once; after that, and after a sub-step is recorded, the entry says
    "present: read it from the store", so a second lookup of an id still
    finds its record.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._basis: tuple[Any, int, int, str] | None = None
        self._entries: dict[str, bytes | None] = {}

    def find(self, store: Store, prefix: str, key: str) -> tuple[bool, bytes | None]:
        """``(present, stored bytes or None: read it with Store.get)``."""
        with self._lock:
            if self._stale(store, prefix):
                self._read(store, prefix)
            elif key in self._entries:
                store.check_same()  # never replay from a store deleted since the read
                if self._stale(store, prefix):  # it was reopened just now
                    self._read(store, prefix)
            if key not in self._entries:
                return False, None  # (a miss is checked by the write that follows)
            raw = self._entries[key]
            if raw is not None:
                self._entries[key] = None  # the bytes are handed out once
            return True, raw

    def _stale(self, store: Store, prefix: str) -> bool:
        b = self._basis
        return (
            b is None
            or b[0] is not store
            or b[1] != store.generation
            or b[2] != store.deletions
            or b[3] != prefix
        )

    def _read(self, store: Store, prefix: str) -> None:
        self._entries = store.load_prefix(prefix)
        self._basis = (store, store.generation, store.deletions, prefix)

    def recorded(self, key: str) -> None:
        """Note that ``key`` was just recorded (if this index was read)."""
        with self._lock:
            if self._basis is not None:
                self._entries[key] = None


@dataclass
class StepContext:
    """The ``%%step`` executing now; sub-steps called during it scope to it."""

    key: str
    label: str
    #: the step's version: its source and inputs (see ``keys.step_version``); part of
    #: idempotency keys, so a new version of a step gets new ones
    version: str = ""
    seen: set[str] = field(default_factory=set)
    ordinals: dict[str, int] = field(default_factory=dict)
    subs_recorded: int = 0
    subs_replayed: int = 0
    sub_seconds: float = 0.0
    #: objects the step's syntax may mutate by a method call: name -> the ids of the
    #: objects in their attributes when the body began, -1 for an attribute that held
    #: nothing yet (see stepper._untouched)
    attrs: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the step's output capture (see Host.capture) and the thread its body runs in:
    #: what a sub-step called there prints is recorded with it (see substeps)
    capture: Any = None
    thread: int = 0
    #: the step's body runs with its HTTP recorded (see httpsteps): then a body that
    #: runs again repeats no call made through httpx or requests either
    http: bool = False
    #: tokens the step's sub-step replies reported, made or replayed (the step record's)
    tokens: Tally = field(default_factory=Tally)
    #: recorded calls made again (their function or arguments changed), and why the first was
    subs_remade: int = 0
    first_remade: str = ""
    #: calls replayed from records that hold no callee fingerprint (made before it was recorded)
    subs_unchecked: int = 0
    #: environment variables read while the step ran: name -> digest (None: unset)
    env_reads: dict[str, str | None] = field(default_factory=dict)
    #: files read while the step ran: absolute path -> [size, mtime_ns, content digest]
    file_reads: dict[str, list[Any]] = field(default_factory=dict)
    #: files written while the step ran: absolute path -> None (written whole) or the
    #: offset its first append started at (see :mod:`.fileio`)
    file_writes: dict[str, int | None] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sub_index: SubIndex = field(default_factory=lambda: SubIndex())


def remade_summary(ctx: StepContext, reason: str | None = None) -> list[str]:
    """The lines a step says about its sub-steps once it ran: at most one for each kind.

    Calls made again because their function or arguments changed, in one
    line naming why the step ran again (``reason``, e.g. "input 'TOPIC'
    changed"), the first call made again and how many; replays from records
    too old to hold a callee fingerprint, in another.
    """
    lines = []
    total = ctx.subs_recorded + ctx.subs_replayed
    if ctx.subs_remade:
        n = ctx.subs_remade
        lines.append(
            f"step {ctx.label!r}{f' ran again ({reason})' if reason else ''}: "
            f"{n} of {total} recorded call{'s' if total != 1 else ''} "
            f"made again ({ctx.first_remade}"
            + (f"; {n - 1} other{'s' if n > 2 else ''} likewise)" if n > 1 else ")")
        )
    if ctx.subs_unchecked:
        n = ctx.subs_unchecked
        lines.append(
            f"step {ctx.label!r}: {n} call{'s' if n != 1 else ''} replayed from records made "
            "before nbdurable recorded the function a call makes, so only the arguments "
            "were compared; clear the step if a function changed since."
        )
    return lines


@dataclass
class Savings:
    """What replay saved in this kernel."""

    steps: int = 0
    calls: int = 0
    seconds: float = 0.0
    #: tokens the replayed calls had used, per model
    tokens: Tally = field(default_factory=Tally)

    def line(self, prices: Any = None) -> str:
        """``replay saved 3.2 s, 61 calls and 12,400 tokens ($0.0310) in this kernel (5 steps)``.

        Tokens are said when replayed calls had reported any; their cost when
        ``prices`` (``configure(prices=...)``) price them.
        """
        if not (self.calls or self.steps):
            return "nothing replayed in this kernel yet"
        what = [seconds(self.seconds), plural(self.calls, "call")]
        total = self.tokens.total.total
        if total:
            cost = self.tokens.cost(prices)[0] if prices else None
            what.append(tokens(total, cost))
        said = ", ".join(what[:-1]) + " and " + what[-1]
        return f"replay saved {said} in this kernel ({plural(self.steps, 'step')})"


def what_replays(http: bool) -> str:
    """The end of every "its body runs again" line: what of a rerun body replays.

    True to the letter: with the step's HTTP recorded (the default), its
    sub-steps and its requests through httpx or requests replay, which
    covers the model SDKs, and the line says that other side effects (a
    database insert through a driver, a file written) are not replayed;
    without, only its sub-steps do, and the line says that other calls are
    made again.
    """
    if http:
        return (
            "its sub-steps and its HTTP requests replay; what else it does "
            "(a database write, a file) is done again"
        )
    return (
        "its sub-steps still replay; calls it made outside step() are made again: "
        "record them with %%step --http"
    )
