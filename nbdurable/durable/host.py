"""The host: what the durable engine needs from the program it runs in.

The engine (this package) never imports IPython. Everything it needs from
the shell goes through one :class:`Host`, which the IPython side
(:class:`nbdurable.ipython.host.ShellHost`) implements over an
``InteractiveShell``:

- the namespace steps run in, and the names the shell hides in it;
- turning a cell body into Python (IPython syntax), running it, capturing
  what it shows, and showing recorded outputs again;
- what the frontend said about the executing cell (its id, its position)
  and the sources of the cells executed so far (to find the notebook);
- a description of this process for the lease;
- waiting for a person's decision about an approval (see :mod:`.approval`).

:class:`PlainHost` is the host of a session outside IPython (a script, the
CLI, a test without a shell): an empty namespace of its own, no cells. It
can hold a lease and record sub-steps; it cannot run a ``%%step`` body.

Two process-wide hooks stand in for what only the shell side knows, set
when :mod:`nbdurable.ipython` is imported: :data:`default_host` makes the
host of a session created without one (the shell running now, if any), and
:data:`unrecorded` lets nbdurable's own notices past every capture.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..errors import UsageProblem

#: How often a wait for an approval reads the store for a decision made elsewhere (seconds).
POLL_SECONDS = 0.5


class Capture(Protocol):
    """A cell's outputs recorded between ``__enter__`` and ``__exit__``."""

    outputs: list[dict[str, Any]]
    unfaithful: list[str]  # outputs a replay cannot show as they looked

    def mark(self) -> Any:
        """Where the outputs stand now, for :meth:`since`."""

    def since(self, mark: Any) -> list[dict[str, Any]]:
        """The outputs recorded after ``mark`` (a stream's new text only)."""

    def __enter__(self) -> Any: ...  # noqa: D105

    def __exit__(self, *exc: Any) -> Any: ...  # noqa: D105


class Host(Protocol):
    """What a :class:`~nbdurable.durable.session.Session` asks of its program."""

    @property
    def user_ns(self) -> dict[str, Any]:
        """The namespace steps run in."""

    def hidden(self) -> Mapping[str, Any]:
        """Names the shell put into the namespace itself (not the user's)."""

    def transform(self, body: str) -> str:
        """A cell body as Python (IPython's syntax turned into calls)."""

    def run_body(self, py: str, has_await: bool) -> None:
        """Execute ``py`` in the namespace; show a trailing expression as a cell does."""

    def capture(self) -> Capture:
        """A new capture of what the shell shows (not entered yet)."""

    def show(self, outputs: list[dict[str, Any]]) -> None:
        """Show recorded outputs again, in order, as the cell showed them."""

    def publish(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        """Display one output (nbdurable's own note)."""

    def executed(self) -> list[str]:
        """The raw sources of the cells executed so far, the current one last."""

    def frontend_cell(self) -> tuple[str | None, int | None]:
        """``(cell id, position)`` the frontend sent with the executing cell."""

    def describe(self) -> str:
        """What this process is, for the message a second runner of the run sees."""

    def wait_approval(
        self,
        pending: Any,
        elsewhere: Callable[[], Any],
        decide: Callable[[bool, str], Any],
    ) -> Any:
        """Show ``pending`` (an :class:`~nbdurable.approvals.Pending`) and wait for a decision.

        A person deciding here calls ``decide(approved, reason)``, which records
        the decision and returns it; ``elsewhere()`` returns a decision made
        elsewhere (the CLI, another machine), None until there is one. Returns
        the :class:`~nbdurable.approvals.Decision`.
        """


class PlainHost:
    """The host outside IPython: a namespace of its own, no cells, no outputs."""

    def __init__(self) -> None:
        self._ns: dict[str, Any] = {}

    @property
    def user_ns(self) -> dict[str, Any]:  # noqa: D102 - see Host
        return self._ns

    def hidden(self) -> Mapping[str, Any]:  # noqa: D102
        return {}

    def transform(self, body: str) -> str:  # noqa: D102
        return body

    def run_body(self, py: str, has_await: bool) -> None:  # noqa: D102
        raise UsageProblem("a %%step cell runs in IPython: `%load_ext nbdurable` there first")

    def capture(self) -> Capture:  # noqa: D102
        raise UsageProblem("a %%step cell runs in IPython: `%load_ext nbdurable` there first")

    def show(self, outputs: list[dict[str, Any]]) -> None:  # noqa: D102
        raise UsageProblem("a %%step cell runs in IPython: `%load_ext nbdurable` there first")

    def publish(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:  # noqa: D102
        print(data.get("text/plain", ""), file=sys.stderr)

    def executed(self) -> list[str]:  # noqa: D102
        return []

    def frontend_cell(self) -> tuple[str | None, int | None]:  # noqa: D102
        return None, None

    def describe(self) -> str:  # noqa: D102
        return "python " + " ".join(sys.argv[:1])

    def wait_approval(  # noqa: D102
        self,
        pending: Any,
        elsewhere: Callable[[], Any],
        decide: Callable[[bool, str], Any],
    ) -> Any:
        # No buttons here: the decision comes through the store (`nbdurable approve`).
        print(
            f"{pending.where} is waiting for a decision: {pending.summary} "
            f"(decide with `nbdurable approve NOTEBOOK {pending.id}` or `nbdurable reject`)",
            file=sys.stderr,
            flush=True,
        )
        while True:
            got = elsewhere()
            if got is not None:
                return got
            time.sleep(POLL_SECONDS)


def _no_host() -> Host | None:
    return None


#: The host of a session created without one: the IPython side sets it to
#: "the shell running now, if any" (see nbdurable.ipython.host).
default_host: Callable[[], Host | None] = _no_host


@contextlib.contextmanager
def _passthrough() -> Iterator[None]:
    yield


#: What lets a notice about this execution past every capture (the IPython
#: side sets it to nbdurable.ipython.capture.unrecorded): a warning is about
#: this execution, never part of a step's recorded outputs.
unrecorded: Callable[[], AbstractContextManager[None]] = _passthrough
