"""What ``nbdurable run`` reports: per cell, per attempt, for the whole run; and its exit codes."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_CELL_ERROR = 1
EXIT_USAGE = 2
EXIT_KERNEL_DIED = 3
EXIT_LEASE_HELD = 4
EXIT_TIMEOUT = 5
EXIT_LIVE = 6
EXIT_APPROVAL = 7
EXIT_INTERRUPTED = 130

#: Every exit code of ``nbdurable run``, as ``--help`` and docs/cli.md list them.
EXIT_CODES = (
    (EXIT_OK, "the notebook ran to the end"),
    (EXIT_CELL_ERROR, "a cell raised"),
    (EXIT_USAGE, "bad usage (a wrong option, path or notebook)"),
    (EXIT_KERNEL_DIED, "the kernel died more than --retries times"),
    (EXIT_LEASE_HELD, "another live kernel records into this run (see --takeover)"),
    (EXIT_TIMEOUT, "a cell ran longer than --timeout"),
    (EXIT_LIVE, "verify: a step or call would have run live"),
    (EXIT_APPROVAL, "stopped at an approval waiting for a decision (see `nbdurable approvals`)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM)"),
)


@dataclass
class CellOutcome:
    """What happened to one cell in one attempt (only step cells, failures and deaths)."""

    index: int
    key: str | None  # None: not a %%step cell
    label: str
    outcome: str  # replayed | executed | invalidated | failed | kernel died | waiting
    detail: str = ""
    seconds: float = 0.0
    calls_made: int = 0
    calls_replayed: int = 0
    seconds_saved: float = 0.0


@dataclass
class Attempt:
    """One kernel's run through the notebook."""

    number: int
    outcome: str = "running"  # completed | cell error | kernel died | interrupted
    started: float = 0.0
    seconds: float = 0.0
    cells: list[CellOutcome] = field(default_factory=list)
    calls_made: int = 0
    died_in: int | None = None  # cell index (None: before the first cell)
    kernel_log: str = ""
    #: What this attempt's kernel replayed, as it last said (after each cell; a kernel
    #: that died cannot count the cell it died in). None: it never used nbdurable.
    saved: dict[str, Any] | None = None


@dataclass
class CellError:
    """The cell that raised, as nbclient reports it."""

    index: int
    label: str
    ename: str
    evalue: str
    message: str  # nbclient's text: the cell's source, then the traceback


@dataclass
class RunResult:
    """Everything ``nbdurable run`` reports."""

    notebook: Path
    output: Path | None
    run_id: str
    store: Path | str | None
    retries: int
    attempts: list[Attempt] = field(default_factory=list)
    error: CellError | None = None
    interrupted: bool = False
    #: What replay saved over all attempts (``steps``, ``calls``, ``seconds``,
    #: ``tokens`` as ``{"input", "output"}``, and ``cost`` at the prices the
    #: notebook gave to ``configure(prices=...)``, None without); None when the
    #: notebook does not use nbdurable.
    saved: dict[str, Any] | None = None
    seconds: float = 0.0
    #: The approvals of the run waiting for a decision when it ended, each
    #: ``{"id", "step", "summary"}`` (the run stopped at the last one asked).
    approvals: list[dict[str, str]] = field(default_factory=list)

    @property
    def deaths(self) -> int:
        """How many times the kernel died."""
        return sum(a.outcome == "kernel died" for a in self.attempts)

    @property
    def refused(self) -> list[str]:
        """What verify mode refused to run live, one line each (every attempt's, in order)."""
        lines: list[str] = []
        for att in self.attempts:
            said = (att.saved or {}).get("refused")
            for line in said if isinstance(said, list) else ():
                if isinstance(line, str) and line not in lines:
                    lines.append(line)
        return lines

    @property
    def status(self) -> str:
        """One of ``ok``, ``cell error``, ``timed out``, ``lease held``, ``kernel died``,
        ``interrupted``, ``refused`` (verify mode met live work, even where a cell caught
        the error), ``pending approval`` (a cell stopped at an approval: ApprovalPending).
        """
        if self.interrupted:
            return "interrupted"
        if self.refused:
            return "refused"
        if self.error is not None:
            return {
                "LeaseHeld": "lease held",
                "CellTimeoutError": "timed out",
                "ApprovalPending": "pending approval",
            }.get(self.error.ename, "cell error")
        if not self.attempts or self.attempts[-1].outcome == "kernel died":
            return "kernel died"
        return "ok"

    @property
    def produced_results(self) -> bool:
        """Whether the executed notebook is worth writing: it ran, or a cell of it failed."""
        return self.status in ("ok", "cell error", "timed out", "pending approval")

    @property
    def exit_code(self) -> int:
        """See :data:`EXIT_CODES`."""
        return {
            "ok": EXIT_OK,
            "cell error": EXIT_CELL_ERROR,
            "timed out": EXIT_TIMEOUT,
            "lease held": EXIT_LEASE_HELD,
            "kernel died": EXIT_KERNEL_DIED,
            "interrupted": EXIT_INTERRUPTED,
            "refused": EXIT_LIVE,
            "pending approval": EXIT_APPROVAL,
        }[self.status]

    def add_savings(self) -> None:
        """:attr:`saved` as the sum of every attempt's (each kernel counts only its own)."""
        said = [a.saved for a in self.attempts if a.saved is not None]
        if not said and self.saved is None:
            return
        tokens = [s.get("tokens") or {} for s in said]
        costs = [float(s["cost"]) for s in said if isinstance(s.get("cost"), (int, float))]
        self.saved = {
            "steps": sum(int(s.get("steps", 0)) for s in said),
            "calls": sum(int(s.get("calls", 0)) for s in said),
            "seconds": round(sum(float(s.get("seconds", 0.0)) for s in said), 3),
            "tokens": {k: sum(int(t.get(k, 0)) for t in tokens) for k in ("input", "output")},
            "cost": round(sum(costs), 6) if costs else None,
        }

    @property
    def steps(self) -> Counter[str]:
        """Outcomes of the ``%%step`` cells in the final attempt."""
        last = self.attempts[-1].cells if self.attempts else []
        return Counter(c.outcome for c in last if c.key is not None)

    @property
    def calls_made(self) -> int:
        """Sub-steps recorded over all attempts (calls that really ran and returned)."""
        return sum(a.calls_made for a in self.attempts)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` summary."""
        saved = self.saved or {}
        return {
            "notebook": str(self.notebook),
            "output": str(self.output) if self.output else None,
            "run": self.run_id,
            "store": str(self.store) if self.store else None,
            "status": self.status,
            "exit_code": self.exit_code,
            "kernel_deaths": self.deaths,
            "retries": self.retries,
            "seconds": round(self.seconds, 3),
            "steps": {
                k: self.steps.get(k, 0)
                for k in ("replayed", "executed", "invalidated", "failed", "kernel died", "waiting")
            },
            "calls": {"made": self.calls_made, "replayed": saved.get("calls")},
            "seconds_saved": saved.get("seconds"),
            "tokens_saved": saved.get("tokens"),
            "cost_saved": saved.get("cost"),
            "attempts": [asdict(a) for a in self.attempts],
            "error": asdict(self.error) if self.error else None,
            "refused": self.refused,
            "approvals": self.approvals,
        }
