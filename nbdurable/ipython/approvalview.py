"""An approval in a kernel: its summary and details with Approve / Reject buttons, and the wait.

:func:`wait` is the shell host's :meth:`~nbdurable.durable.host.Host.wait_approval`.
The widget is shown past the step's capture (``capture.unrecorded``): it is
a question about this execution, not an output a replay shows again. After
the decision it says what was decided, by whom and when.

The kernel is busy running the cell while it waits, so a click (a comm
message on the shell channel) would only be handled after the cell ends:
never. So the wait handles the shell messages itself, the approach of the
``jupyter-ui-poll`` package. With ipykernel 7 the shell channel thread hands
the main shell its messages through an in-process socket; the wait reads it,
handles comm messages (the clicks, the reason typed) at once, and keeps
every other request (the next cell's ``execute_request``) to hand back, in
order, to the kernel's own loop when the wait ends. With ipykernel 6 it reads
the shell socket the same way. A kernel without either (or a plain IPython
shell) has no buttons that work while busy: the wait then reads only the
store, where ``nbdurable approve`` or another machine decides; so does an
approval asked from a worker thread (the shell's socket is the main
thread's). The store is
read every half second in any case, so a decision made elsewhere ends the
wait (the widget then says who decided).
"""

from __future__ import annotations

import contextlib
import html
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..durable.host import POLL_SECONDS
from . import capture

_COMM = ("comm_open", "comm_msg", "comm_close")


def wait(
    shell: Any, pending: Any, elsewhere: Callable[[], Any], decide: Callable[[bool, str], Any]
) -> Any:
    """Show ``pending`` with its buttons; return the decision made here or elsewhere."""
    view = ApprovalView(pending)
    kernel = getattr(shell, "kernel", None)
    pump = _ShellPump.of(kernel)
    with capture.unrecorded():
        from IPython.display import display

        display(view.box)
        if pump is None:
            print(
                f"{pending.where}: waiting for a decision made elsewhere "
                f"(`nbdurable approve NOTEBOOK {pending.id}`)",
                flush=True,
            )
    decision = None
    try:
        next_poll = 0.0
        while decision is None:
            if view.choice is not None:
                approved, reason = view.choice
                decision = decide(approved, reason)
                break
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + POLL_SECONDS
                decision = elsewhere()
                if decision is not None:
                    break
            if pump is not None:
                pump.once(0.1)
            else:
                time.sleep(0.1)
    finally:
        if pump is not None:
            pump.close()
    view.done(decision)
    return decision


class ApprovalView:
    """The widget: what is asked, Approve / Reject, a reason; then what was decided."""

    def __init__(self, pending: Any) -> None:
        import ipywidgets as widgets

        self.choice: tuple[bool, str] | None = None
        again = (
            f"<div style='color:#a15c00'>asked again: {html.escape(pending.again)}</div>"
            if pending.again
            else ""
        )
        details = (
            f"<pre style='white-space:pre-wrap;margin:4px 0'>{html.escape(pending.details)}</pre>"
            if pending.details
            else ""
        )
        self.head = widgets.HTML(
            f"<b>Approval needed</b> · {html.escape(pending.where)}"
            f"<div style='font-size:1.1em;margin:4px 0'>{html.escape(pending.summary)}</div>"
            f"{details}{again}"
        )
        self.reason = widgets.Text(placeholder="reason (optional)")
        self.approve = widgets.Button(description="Approve", button_style="success")
        self.reject = widgets.Button(description="Reject", button_style="danger")
        self.approve.on_click(lambda _b: self._chose(True))
        self.reject.on_click(lambda _b: self._chose(False))
        self.status = widgets.HTML("")
        self.box = widgets.VBox(
            [self.head, widgets.HBox([self.approve, self.reject, self.reason]), self.status]
        )
        self.box.add_class("nbdurable-approval")

    def _chose(self, approved: bool) -> None:
        if self.choice is None:
            self.choice = (approved, self.reason.value.strip())

    def done(self, decision: Any) -> None:
        """Say what was decided; the buttons are off."""
        for w in (self.approve, self.reject, self.reason):
            w.disabled = True
        if decision is not None:
            color = "#1a7f37" if decision.approved else "#c62828"
            self.status.value = f"<span style='color:{color}'>{html.escape(decision.said())}</span>"


@contextlib.contextmanager
def _interrupt_deferred() -> Iterator[None]:
    """Hold a SIGINT that arrives inside the block until it ends, then deliver it.

    Python runs signal handlers in the main thread only (the pump's thread), so
    swapping the handler for the block is enough, whichever thread the signal hit.
    """
    caught: list[tuple[int, Any]] = []
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    except ValueError:  # not the main thread: nothing to hold
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if caught:
            if callable(old):
                old(*caught[0])  # the kernel's handler: KeyboardInterrupt, as it would have
            else:
                signal.raise_signal(signal.SIGINT)


class _ShellPump:
    """The kernel's shell messages, handled while a cell blocks (see the module docstring)."""

    def __init__(self, kernel: Any, socket: Any, reinject: Callable[[Any], None]) -> None:
        self.kernel, self.socket, self.reinject = kernel, socket, reinject
        self.held: list[Any] = []

    @classmethod
    def of(cls, kernel: Any) -> _ShellPump | None:
        """The pump of ``kernel``; None where its shell messages cannot be reached."""
        if kernel is None or getattr(kernel, "session", None) is None:
            return None
        if threading.current_thread() is not threading.main_thread():
            # The shell's socket is the main thread's (a zmq socket is not thread-safe):
            # an approval asked from a worker thread is decided through the store.
            return None
        try:
            thread = getattr(kernel, "shell_channel_thread", None)
            if thread is not None:  # ipykernel 7: the main shell's in-process socket
                pair = thread.manager._shell_channel_to_main
                loop = kernel.io_loop
                return cls(
                    kernel, pair.to_socket, lambda m: loop.add_callback(kernel.shell_main, None, m)
                )
            stream = getattr(kernel, "shell_stream", None)
            if stream is not None and hasattr(kernel, "dispatch_shell"):  # ipykernel 6
                loop = kernel.io_loop
                return cls(
                    kernel, stream.socket, lambda m: loop.add_callback(kernel.dispatch_shell, m)
                )
        except Exception:  # another kernel's insides: no buttons, the store still answers
            return None
        return None

    def once(self, timeout: float) -> None:
        """Handle the messages that arrive within ``timeout`` seconds."""
        if not self.socket.poll(int(timeout * 1000)):
            return
        # An interrupt (SIGINT) raised between reading a message off the socket and
        # keeping it would lose it: the next cell of Run All, sent just before the
        # interrupt, would never run nor be answered. So it waits until the
        # messages read are handled or kept (the poll above stays interruptible).
        with _interrupt_deferred():
            for frames in self._unread():
                self.handle(frames)

    def _unread(self) -> Iterator[Any]:
        """The messages in the socket now, read until it is empty (or closed)."""
        import zmq

        while True:
            try:
                yield self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:  # EAGAIN: empty
                return

    def handle(self, frames: Any) -> None:
        """A comm message now; anything else kept for the kernel's own loop."""
        kernel = self.kernel
        try:
            idents, rest = kernel.session.feed_identities(frames, copy=False)
            # A peek first (content=False notes no signature): a message handed back
            # is read again by the kernel, which refuses a signature it has seen.
            kind = kernel.session.deserialize(rest, content=False, copy=False)["header"].get(
                "msg_type"
            )
            handler = kernel.shell_handlers.get(kind) if kind in _COMM else None
            if handler is None:
                self.held.append(frames)
                return
            msg = kernel.session.deserialize(rest, content=True, copy=False)
        except Exception:
            self.held.append(frames)  # the kernel's loop reports what it cannot read
            return
        parent = kernel.get_parent("shell")
        ident = kernel._parent_ident["shell"]
        try:
            kernel.set_parent(idents, msg, channel="shell")
            handler(kernel.shell_stream, idents, msg)
        except Exception as exc:  # a widget callback that raised: said, the wait goes on
            kernel.log.error("nbdurable: a widget message failed: %r", exc)
        finally:
            kernel.set_parent(ident, parent, channel="shell")

    def close(self) -> None:
        """Hand the requests kept back to the kernel's loop, in the order they came.

        What is still in the socket is read first and handed back after them. The
        kernel's loop reads this socket through a ``ZMQStream``, which wakes on the
        edge of the socket's file descriptor; a ``poll`` that saw a message (the
        interrupt that ends a wait may come between the pump's ``poll`` and its
        ``recv``) has consumed that edge, and while the message stays unread no new
        edge comes: the stream would never read this socket again, and every later
        cell would wait behind it, unanswered. Read to empty, the next message
        signals the stream as usual.
        """
        with _interrupt_deferred():
            self.held.extend(self._unread())
            held, self.held = self.held, []
            for frames in held:
                self.reinject(frames)
