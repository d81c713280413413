"""The durable engine's host in IPython: a :class:`~nbdurable.durable.host.Host` over a shell.

What the engine asks of its program (see :mod:`nbdurable.durable.host`),
answered by an ``InteractiveShell``: its namespace, its cell transformer,
its display publisher and hook (through :mod:`.capture`), the execute
request's metadata (the frontend's cell id) and its input history. Works
with ipykernel's shell and with a plain ``InteractiveShell`` (tests).

Importing this module sets the engine's two process-wide hooks: a session
created without a host gets the shell running now, and nbdurable's notices
pass every capture unrecorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..durable import host as hosts
from ..durable.host import Host
from . import capture, execute


class ShellHost:
    """:class:`~nbdurable.durable.host.Host` for an IPython ``InteractiveShell``."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    @property
    def user_ns(self) -> dict[str, Any]:  # noqa: D102 - see Host
        return self.shell.user_ns

    def hidden(self) -> Mapping[str, Any]:  # noqa: D102
        return getattr(self.shell, "user_ns_hidden", {})

    def transform(self, body: str) -> str:  # noqa: D102
        return self.shell.transform_cell(body)

    def run_body(self, py: str, has_await: bool) -> None:  # noqa: D102
        __tracebackhide__ = True
        execute.run_body(self.shell, py, has_await)

    def capture(self) -> capture.Capture:  # noqa: D102
        return capture.Capture(self.shell)

    def show(self, outputs: list[dict[str, Any]]) -> None:  # noqa: D102
        capture.replay(self.shell, outputs)

    def publish(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:  # noqa: D102
        self.shell.display_pub.publish(data=data, metadata=metadata)

    def executed(self) -> list[str]:  # noqa: D102
        history = getattr(self.shell, "history_manager", None)
        raw = getattr(history, "input_hist_raw", None)
        return [s for s in raw[1:] if isinstance(s, str)] if isinstance(raw, list) else []

    def frontend_cell(self) -> tuple[str | None, int | None]:  # noqa: D102
        kernel = getattr(self.shell, "kernel", None)
        if kernel is None:
            return None, None
        try:
            md = kernel.get_parent("shell").get("metadata", {}) or {}
        except Exception:  # not in an execute request (e.g. driven from a test)
            return None, None
        cid = md.get("cellId")
        pos = (md.get("nbdurable") or {}).get("position")
        return (cid if isinstance(cid, str) and cid else None), (
            pos if isinstance(pos, int) else None
        )

    def describe(self) -> str:  # noqa: D102
        if getattr(self.shell, "kernel", None) is not None:
            try:
                from ipykernel.connect import get_connection_file

                return "kernel " + Path(get_connection_file()).stem.removeprefix("kernel-")
            except Exception:  # not started from a connection file
                return "kernel"
        return hosts.PlainHost().describe()

    def wait_approval(self, pending: Any, elsewhere: Any, decide: Any) -> Any:  # noqa: D102
        from . import approvalview

        return approvalview.wait(self.shell, pending, elsewhere, decide)


def current() -> Host | None:
    """The host of the IPython shell running now (None outside IPython)."""
    from IPython import get_ipython

    shell = get_ipython()
    return ShellHost(shell) if shell is not None else None


def session_for(shell: Any) -> Any:
    """The process-wide session, its host this shell (see ``durable.session.get_session``)."""
    from ..durable.session import get_session

    return get_session(ShellHost(shell))


hosts.default_host = current
hosts.unrecorded = capture.unrecorded
