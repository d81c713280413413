"""Showing a run as it happens: the :class:`Progress` hooks, and the console's lines and bar."""

from __future__ import annotations

import sys
import threading
import time
from typing import IO

from ..states import OUTCOMES
from ..text import plural, seconds, tokens
from .result import Attempt, CellOutcome, RunResult


class Progress:
    """Receives what happens during a run; the base class shows nothing."""

    live = False  # True: wants tick() calls with sub-step counts while a step runs

    def begin(self, result: RunResult, cells: int) -> None:
        """The run starts; ``cells`` code cells per attempt."""

    def attempt(self, number: int) -> None:
        """An attempt (a new kernel) starts."""

    def cell_started(self, index: int, label: str | None, done: int) -> None:
        """A code cell starts executing (``label`` None: not a step cell); ``done`` cells ran."""

    def tick(self, subs: int) -> None:
        """Sub-steps recorded so far by the running step (only when ``live``)."""

    def cell_done(self, cell: CellOutcome) -> None:
        """A step cell finished, or any cell failed or lost its kernel."""

    def kernel_died(self, attempt: Attempt, retrying: bool, result: RunResult) -> None:
        """The kernel died during ``attempt``."""

    def end(self, result: RunResult) -> None:
        """The run is over."""


_SYMBOLS = {outcome: glyph for outcome, (glyph, _) in OUTCOMES.items()}
_ASCII = {outcome: ascii_ for outcome, (_, ascii_) in OUTCOMES.items()}


class ConsoleProgress(Progress):
    """One line per step on ``out``; a live bar on ``bar`` when it is a terminal."""

    def __init__(
        self,
        out: IO[str] | None = None,
        bar: IO[str] | None = None,
        live: bool | None = None,
        command: str = "run",
    ) -> None:
        self.command = command  # the header's: `nbdurable run` or `nbdurable verify`
        self.out = out or sys.stdout
        self.bar = bar or sys.stderr
        self.live = self.bar.isatty() if live is None else live
        self._lock = threading.Lock()
        self._cells = 0
        self._done = 0
        self._label: str | None = None
        self._since = 0.0
        self._subs = 0
        self._drawn = False
        try:
            "".join(_SYMBOLS.values()).encode(getattr(self.out, "encoding", None) or "ascii")
            self._sym = _SYMBOLS
        except (UnicodeEncodeError, LookupError):
            self._sym = _ASCII

    def _line(self, text: str) -> None:
        with self._lock:
            self._clear_bar()
            print(text, file=self.out, flush=True)
            self._draw()

    def _clear_bar(self) -> None:
        if self._drawn:
            self.bar.write("\r\033[K")
            self.bar.flush()
            self._drawn = False

    def _draw(self) -> None:
        if not self.live or self._label is None:
            return
        width = 24
        filled = int(width * self._done / max(self._cells, 1))
        elapsed = time.monotonic() - self._since
        subs = f" · {plural(self._subs, 'sub-step')}" if self._subs else ""
        text = (
            f"  [{'#' * filled}{'-' * (width - filled)}] {self._done}/{self._cells} cells"
            f" · {self._label}{subs} · {elapsed:4.1f} s"
        )
        self.bar.write("\r\033[K" + text)
        self.bar.flush()
        self._drawn = True

    def begin(self, result: RunResult, cells: int) -> None:
        """Print the run's header line."""
        self._cells = cells
        where = f" in {result.store}" if result.store else ""
        self._line(
            f"nbdurable {self.command} {result.notebook.name} (run {result.run_id!r}{where})"
        )

    def attempt(self, number: int) -> None:
        """Announce a new kernel after a death."""
        if number > 1:
            self._line(
                f"attempt {number}: new kernel, running from the top (recorded steps replay)"
            )

    def cell_started(self, index: int, label: str | None, done: int) -> None:
        """Show the cell on the live bar."""
        with self._lock:
            self._done = done
            self._label = label or f"cell #{index + 1}"
            self._since = time.monotonic()
            self._subs = 0
            self._draw()

    def tick(self, subs: int) -> None:
        """Update the live bar's sub-step count."""
        with self._lock:
            self._subs = subs
            self._draw()

    def cell_done(self, cell: CellOutcome) -> None:
        """Print the step's line: its outcome, time, calls."""
        self._label = None  # the bar returns with the next cell
        if cell.outcome == "replayed":
            calls = (
                f"{plural(cell.calls_replayed, 'call')} replayed, " if cell.calls_replayed else ""
            )
            info = f"{calls}saved {seconds(cell.seconds_saved)}"
        elif cell.outcome in ("executed", "invalidated"):
            made = [plural(cell.calls_made, "call") + " made"] if cell.calls_made else []
            replayed = [f"{cell.calls_replayed} replayed"] if cell.calls_replayed else []
            info = ", ".join(made + replayed)
        elif cell.outcome == "kernel died":
            info = f"{plural(cell.calls_made, 'call')} recorded before it died"
        else:
            info = ""
        detail = f" — {cell.detail}" if cell.detail else ""
        self._line(
            f"  {self._sym[cell.outcome]} {cell.label:<20} {cell.outcome:<12} "
            f"{cell.seconds:6.1f} s  {info}{detail}".rstrip()
        )

    def kernel_died(self, attempt: Attempt, retrying: bool, result: RunResult) -> None:
        """Print where the kernel died and what happens next."""
        self._label = None
        where = (
            "before the first cell"
            if attempt.died_in is None
            else f"in cell #{attempt.died_in + 1}"
        )
        # The cell's own line already said "kernel died", and the summary says
        # it again when no retry is left: here only what happens next.
        if retrying:
            self._line(
                f"  restarting the kernel (died {where}; {result.deaths} of "
                f"{result.retries} retries used)"
            )
        if attempt.kernel_log.strip():
            self._line("  kernel said: " + attempt.kernel_log.replace("\n", "\n  kernel said: "))

    def end(self, result: RunResult) -> None:
        """Print the summary."""
        with self._lock:
            self._label = None
            self._clear_bar()
        steps = result.steps
        saved = result.saved or {}
        parts = [
            f"{steps.get(k, 0)} {k}"
            for k in ("replayed", "executed", "invalidated", "failed", "waiting")
            if steps.get(k)
        ]
        where = ""
        if result.status == "kernel died" and result.attempts:
            died_in = result.attempts[-1].died_in
            where = " before the first cell" if died_in is None else f" in cell #{died_in + 1}"
        lines = [
            f"{result.status}{where} after {result.seconds:.1f} s"
            + (
                f" · survived {plural(result.deaths, 'kernel death')}"
                if result.deaths and result.status != "kernel died"
                else ""
            ),
            "steps: " + (", ".join(parts) or "none"),
            f"calls: {result.calls_made} made, {saved.get('calls', 0)} replayed"
            f" · time saved {saved.get('seconds', 0.0):.1f} s" + _tokens_saved(saved),
        ]
        if result.output is not None:
            lines.append(f"wrote {result.output}")
        self._line("\n".join(lines))


def _tokens_saved(saved: dict) -> str:
    """`` · tokens saved 1,234 ($0.0123)``, or nothing when replay saved no tokens."""
    got = saved.get("tokens") or {}
    n = int(got.get("input", 0)) + int(got.get("output", 0))
    return f" · {tokens(n, saved.get('cost'))} saved" if n else ""
