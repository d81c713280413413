"""Record a kernel's output streams as the frontend receives them.

In an ipykernel kernel ``sys.stdout`` and ``sys.stderr`` are ``OutStream``
objects. A write only fills that stream's buffer; ipykernel's IO thread
sends the buffer as a ``stream`` message a little later (0.2 s after the
first unsent write, or when something flushes it: a display, the end of the
cell). Three kinds of writers reach the same buffer:

* ``print`` and everything else that writes to ``sys.stdout`` / ``sys.stderr``;
* objects that kept a reference to the stream itself, such as a
  ``logging.StreamHandler`` made in an earlier cell;
* file descriptors 1 and 2: ipykernel points them at a pipe and a watcher
  thread writes what comes out of it into the stream (``os.system``,
  subprocesses, C code, ``os.write(1, ...)``).

A fourth kind never reaches the stream: a *forked* child (a
``multiprocessing`` or ``ProcessPoolExecutor`` worker on Linux) inherits the
``OutStream`` without its IO thread, and sends its stream messages, already
made, through a zmq pipe that the kernel's IO thread forwards to the frontend
as they are (``IOPubThread._handle_pipe_msg``). While a tap is active, that
pipe's handler is wrapped: a forwarded ``stream`` message is recorded like
the kernel's own, in the IO thread, in the order the frontend gets it.

A :class:`StreamTap` therefore records the *messages* the stream sends,
through ``OutStream.register_hook`` in the IO thread, and only those whose
parent is the request that was executing when the tap started (what the
frontend puts in this cell). The recorded text is grouped exactly as the
frontend got it, so ``print(); print(file=sys.stderr); print()`` records the
two stdout lines together, as a plain cell shows them.

The watcher thread is asynchronous: text written to fd 1 just before the cell
ends may still be in the pipe (and a forked child's message in the zmq pipe,
which :meth:`StreamTap.sync_children` forwards). :meth:`StreamTap.sync_fd`
writes a marker through the descriptor and waits (with a deadline) until the
watcher has forwarded it; the marker itself is cut out before the stream sees
it. The watcher also copies each chunk it reads, as raw bytes, to the kernel's own
terminal (the server's console, nbconvert's log): for a chunk holding the
marker, that copy goes to a pipe of ours instead, and what it held besides
the marker is passed on to the terminal, so the marker's control bytes never
reach a terminal or a log.

:func:`flush_figures` shows what a matplotlib backend would show after the
cell (its ``post_execute`` hook), so figures drawn without ``plt.show()`` are
part of the recorded outputs, in the place a plain cell shows them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

#: How long to wait for ipykernel's IO or fd-watcher thread before giving up.
THREAD_DEADLINE = 10.0

#: The ``post_execute`` hooks of matplotlib backends that show figures after a
#: cell: ``(module, function name)``.
FIGURE_HOOKS = frozenset(
    {
        ("matplotlib_inline.backend_inline", "flush_figures"),
        ("ipympl.backend_nbagg", "flush_figures"),
        ("ipykernel.pylab.backend_inline", "flush_figures"),  # ipykernel < 6
    }
)

#: What :meth:`StreamTap.sync_fd` writes through a file descriptor: bytes no text
#: holds, cut out of both the stream and the terminal copy (see the docstring).
MARKER = "\x00\x06\x15\x06\x15\x00"

#: Per stream, the pipe the watcher's terminal copy of a marker chunk goes to:
#: ``id(stream) -> (read end, write end)``. Never closed: the watcher may still
#: hold its write end for a moment after a tap ended.
_ECHO_PIPES: dict[int, tuple[int, int]] = {}
_ECHO_PIPES_LOCK = threading.Lock()
_CHILD_PIPES_LOCK = threading.Lock()
#: Messages of forked children one drain of their pipe handles before it lets the
#: IO thread's loop go on (see :meth:`_ChildPipe.drain`).
DRAIN_BOUND = 100_000


def _echo_pipe(stream: Any) -> tuple[int, int] | None:
    with _ECHO_PIPES_LOCK:
        pipe = _ECHO_PIPES.get(id(stream))
        if pipe is None:
            try:
                pipe = os.pipe()
                os.set_blocking(pipe[0], False)
            except OSError:
                return None
            _ECHO_PIPES[id(stream)] = pipe
        return pipe


def out_stream(stream: Any) -> Any | None:
    """`stream` if it is an ipykernel ``OutStream`` whose IO thread runs, else None."""
    if type(stream).__module__ != "ipykernel.iostream":
        return None
    pub = getattr(stream, "pub_thread", None)
    thread = getattr(pub, "thread", None)
    if not hasattr(stream, "register_hook") or thread is None or not thread.is_alive():
        return None
    return stream


class StreamTap:
    """Records the stream messages one ``OutStream`` sends for the current request.

    ``on_text(name, text)`` is called in ipykernel's IO thread for each
    message, unless ``skip()`` is true then. Use as a context manager.
    """

    def __init__(
        self, stream: Any, on_text: Callable[[str, str], None], skip: Callable[[], bool]
    ) -> None:
        self.stream = stream
        self._on_text = on_text
        self._skip = skip
        header = getattr(stream, "parent_header", None) or {}
        self._parent = header.get("msg_id")
        self._active = False
        self._wrapped = False  # our write wrapper is in place (fd 1/2 are watched)
        self._fd_identity: tuple[int, int] | None = None  # what the fd pointed at
        self._synced = threading.Event()
        self._echo_lock = threading.Lock()
        self._echo_real: int | None = None  # the terminal copy's fd while it is diverted
        self._marker = MARKER
        self._carry = ""  # the start of a marker split between two pipe reads
        self._stack = contextlib.ExitStack()

    # -- lifetime --------------------------------------------------------------

    def __enter__(self) -> StreamTap:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _start(self) -> None:
        stream = self.stream
        # What was written before belongs before: send it unrecorded.
        self.flush()
        self._stack.callback(self._unhook)
        if not _in_io_thread(stream, lambda: stream.register_hook(self._hook)):
            raise RuntimeError("ipykernel's IO thread did not answer")
        self._active = True
        children = _ChildPipe.of(stream)
        if children is not None:
            _in_io_thread(stream, lambda: children.listen(self._child_message))
            self._stack.callback(
                _in_io_thread, stream, lambda: children.unlisten(self._child_message)
            )
        watcher = self._watcher()
        if watcher is not None:
            own = vars(stream)
            had_own, previous = "write" in own, own.get("write")
            self._fd_identity = _identity(stream._original_stdstream_fd)
            stream.write = self._wrap_write(stream.write, watcher)
            self._wrapped = True

            def restore() -> None:
                self._pass_echo()
                self._wrapped = False
                if had_own:
                    stream.write = previous
                else:
                    vars(stream).pop("write", None)
                if self._carry:  # not a marker after all: let it through
                    carry, self._carry = self._carry, ""
                    stream.write(carry)

            self._stack.callback(restore)

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def _unhook(self) -> None:
        self._active = False  # a hook the IO thread registers late stays inert
        stream = self.stream
        _in_io_thread(stream, lambda: stream.unregister_hook(self._hook))

    # -- what the frontend gets --------------------------------------------------

    def _hook(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._record(msg.get("parent_header"), msg.get("content"))
        return msg

    def _record(self, parent_header: Any, content: Any) -> None:
        """Record a stream message's text if it belongs to this cell (in the IO thread)."""
        if not self._active or not isinstance(content, dict):
            return
        header = parent_header if isinstance(parent_header, dict) else {}
        if self._parent is not None and header.get("msg_id") != self._parent:
            return
        text = content.get("text")
        if isinstance(text, str) and text and not self._skip():
            self._on_text(content.get("name") or self.stream.name, text)

    def _child_message(self, msg: dict[str, Any]) -> None:
        """A message a forked child sent through the kernel: this stream's are recorded."""
        content = msg.get("content")
        if (
            (msg.get("header") or {}).get("msg_type") == "stream"
            and isinstance(content, dict)
            and content.get("name") == self.stream.name
        ):
            self._record(msg.get("parent_header"), content)

    def flush(self) -> None:
        """Send what the stream buffered now, and wait until it was sent (and recorded)."""
        with contextlib.suppress(Exception):  # a closed stream has nothing to send
            self.stream.flush()

    def sync_children(self) -> None:
        """Forward (and record) what forked children sent that the kernel has not yet.

        A worker's message is in the kernel's pipe before the worker returns
        its result, but the IO thread forwards it when its loop next looks.
        """
        children = _ChildPipe.of(self.stream)
        if children is not None:
            _in_io_thread(self.stream, children.drain)

    # -- file descriptors ---------------------------------------------------------

    def _watcher(self) -> threading.Thread | None:
        stream = self.stream
        thread = getattr(stream, "watch_fd_thread", None)
        if (
            getattr(stream, "_should_watch", False)
            and isinstance(getattr(stream, "_original_stdstream_fd", None), int)
            and isinstance(thread, threading.Thread)
            and thread.is_alive()
        ):
            return thread
        return None

    def _wrap_write(self, original: Callable[[str], Any], watcher: threading.Thread):
        marker = self._marker

        def write(string: str) -> Any:
            if threading.current_thread() is not watcher or not isinstance(string, str):
                return original(string)
            carrying = bool(self._carry)
            if not carrying:
                # The chunk before was copied to our pipe: pass it on before this one's.
                self._pass_echo()
            text, self._carry = self._carry + string, ""
            found = marker in text
            keep = 0
            if found:
                text = text.replace(marker, "")
            else:
                keep = _marker_prefix_at_end(text, marker)
                if keep:
                    text, self._carry = text[:-keep], text[-keep:]
            if found or keep:
                # The watcher copies this chunk's raw bytes to the terminal next: to us
                # (after a marker's start, the two copies together hold it whole).
                self._divert_echo()
            elif carrying:  # that start was text: its copy passes on, this one goes direct
                self._pass_echo()
            result = original(text) if text else len(string)
            if found:
                self._synced.set()
            return result

        return write

    def _divert_echo(self) -> None:
        """Point the watcher's terminal copy at our pipe (in the watcher thread)."""
        pipe = _echo_pipe(self.stream)
        real = getattr(self.stream, "_original_stdstream_copy", None)
        if pipe is None or not isinstance(real, int):
            return
        with self._echo_lock:
            if self._echo_real is None:
                self._echo_real = real
                self.stream._original_stdstream_copy = pipe[1]

    def _pass_echo(self) -> None:
        """Point the terminal copy back, and pass on what it held, markers cut out."""
        with self._echo_lock:
            real, self._echo_real = self._echo_real, None
            if real is None:
                return
            self.stream._original_stdstream_copy = real
            pipe = _ECHO_PIPES.get(id(self.stream))
            data = b""
            while pipe is not None:
                try:
                    chunk = os.read(pipe[0], 1 << 16)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
            data = data.replace(self._marker.encode("ascii"), b"")
            if data:
                with contextlib.suppress(OSError):
                    os.write(real, data)

    def _echo_arrived(self, deadline: float) -> None:
        """Wait until the watcher copied the marker's chunk to our pipe, then pass it on."""
        pipe = _ECHO_PIPES.get(id(self.stream))
        end = time.monotonic() + deadline
        while pipe is not None and time.monotonic() < end:
            with self._echo_lock:
                if self._echo_real is None:
                    return  # the watcher passed it on already (a chunk came after it)
            try:
                ready, _, _ = select.select([pipe[0]], [], [], 0.05)
            except (OSError, ValueError):
                break
            if ready:
                break
        self._pass_echo()

    def sync_fd(self) -> bool:
        """Wait until what was written to this stream's file descriptor reached the stream.

        True when it did (or nothing watches the descriptor), False when the
        watcher thread did not forward the marker before the deadline.
        """
        if not self._wrapped or self._watcher() is None:
            return True
        fd = self.stream._original_stdstream_fd
        try:
            # The cell may have pointed the descriptor elsewhere (os.dup2): then
            # nothing written there reaches the stream, and the marker must not
            # land in somebody's file.
            if _identity(fd) != self._fd_identity:
                return True
            self._synced.clear()
            os.write(fd, self._marker.encode("ascii"))
        except (OSError, AttributeError, TypeError):
            return True
        if not self._synced.wait(THREAD_DEADLINE):
            return False
        self._echo_arrived(THREAD_DEADLINE)
        return True


class _ChildPipe:
    """The kernel's pipe for forked children's messages, its handler wrapped while listened to.

    One per ``IOPubThread`` (stdout and stderr share it). Every method runs in
    the IO thread, which owns the pipe's socket and its handler.
    """

    _all: dict[int, _ChildPipe] = {}

    def __init__(self, pub: Any, pipe: Any) -> None:
        self.pub = pub
        self.pipe = pipe  # a ZMQStream
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self.previous: Callable[[list[bytes]], Any] | None = None  # the kernel's handler

    @classmethod
    def of(cls, stream: Any) -> _ChildPipe | None:
        """The child pipe of `stream`'s IO thread, None if the kernel forwards none."""
        pub = getattr(stream, "pub_thread", None)
        pipe = getattr(pub, "_pipe_in", None)
        if (
            not getattr(pub, "_pipe_flag", False)
            or not isinstance(getattr(pub, "_pipe_uuid", None), bytes)
            or not callable(getattr(pipe, "on_recv", None))
            or not callable(getattr(pub, "_handle_pipe_msg", None))
        ):
            return None
        with _CHILD_PIPES_LOCK:
            found = cls._all.get(id(pub))
            if found is None or found.pub is not pub:
                found = cls._all[id(pub)] = cls(pub, pipe)
            return found

    def listen(self, listener: Callable[[dict[str, Any]], None]) -> None:
        if self.previous is None:
            self.previous = getattr(self.pipe, "_recv_callback", None) or self.pub._handle_pipe_msg
            self.pipe.on_recv(self.forward)
        self.listeners.append(listener)

    def unlisten(self, listener: Callable[[dict[str, Any]], None]) -> None:
        with contextlib.suppress(ValueError):
            self.listeners.remove(listener)
        if not self.listeners and self.previous is not None:
            previous, self.previous = self.previous, None
            self.pipe.on_recv(previous)

    def forward(self, frames: list[bytes]) -> None:
        """The wrapped handler: the kernel forwards the message, then listeners see it."""
        previous = self.previous or self.pub._handle_pipe_msg
        previous(frames)
        # The kernel drops a message without its pipe's key (see _handle_pipe_msg).
        if not frames or frames[0] != self.pub._pipe_uuid or not self.listeners:
            return
        msg = _parse(frames[1:])
        if msg is not None:
            for listener in list(self.listeners):
                listener(msg)

    def drain(self) -> None:
        """Handle every message the pipe holds now (the stream finds it empty after).

        At most ``DRAIN_BOUND`` at a time: a child writing forever must not hold the
        cell. What is left then is drained on a later turn of the IO thread's loop,
        never left for the stream: it wakes on the edge of the socket's file
        descriptor, which these reads consumed, so it would not read the pipe again.
        """
        socket = getattr(self.pipe, "socket", None)
        if socket is None or self.previous is None:
            return
        import zmq

        for _ in range(DRAIN_BOUND):
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:  # EAGAIN: empty (or closed)
                return
            self.forward(frames)
        self.pipe.io_loop.add_callback(self.drain)


def _parse(frames: list[bytes]) -> dict[str, Any] | None:
    """A serialized Jupyter message's header, parent header and content (unverified)."""
    try:
        at = frames.index(b"<IDS|MSG>")
        header, parent, _metadata, content = frames[at + 2 : at + 6]
        return {
            "header": json.loads(header),
            "parent_header": json.loads(parent),
            "content": json.loads(content),
        }
    except (ValueError, TypeError):  # not a message as ipykernel packs it (JSON)
        return None


def _identity(fd: int) -> tuple[int, int] | None:
    """``(device, inode)`` of what `fd` points at, None if it is closed."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _marker_prefix_at_end(text: str, marker: str) -> int:
    """Length of the longest proper prefix of `marker` that `text` ends with."""
    start = text.rfind(marker[0], max(0, len(text) - len(marker) + 1))
    while start != -1:
        if marker.startswith(text[start:]):
            return len(text) - start
        start = text.find(marker[0], start + 1)
    return 0


def _in_io_thread(stream: Any, fn: Callable[[], None]) -> bool:
    """Run `fn` in the stream's IO thread (where its message hooks live) and wait."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        finally:
            done.set()

    stream.pub_thread.schedule(run)
    return done.wait(THREAD_DEADLINE)


def flush_figures(shell: Any) -> None:
    """Run the matplotlib backends' after-cell hooks now (see :data:`FIGURE_HOOKS`).

    They show the figures drawn in the cell and are no-ops when nothing was
    drawn since they last ran, so the kernel's own run after the cell finds
    nothing left to show.
    """
    events = getattr(shell, "events", None)
    callbacks = getattr(events, "callbacks", {}).get("post_execute", [])
    for callback in list(callbacks):
        where = (getattr(callback, "__module__", None), getattr(callback, "__name__", None))
        if where in FIGURE_HOOKS:
            callback()
