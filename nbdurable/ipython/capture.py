"""Tee a cell's outputs: everything still reaches the frontend live, and is recorded.

:class:`Capture` records what a cell prints and displays as nbformat v4 output
dicts, in the order the frontend sees them, while letting every output through
(a ten-minute cell must not look frozen). :func:`replay` emits recorded outputs
again after a kernel restart. Nothing here knows about stores.

IPython's own ``capture_output`` is no use for this: it swallows the outputs,
keeps stdout apart from displays (so their order is lost) and turns the
cell's result into ``display_data``. Instead, while a :class:`Capture` is
active:

* in a kernel, the stream messages ipykernel sends for this cell are
  recorded (:mod:`nbdurable.ipython.kernelio`): that includes logging handlers that
  hold the original stream object, what is written to file descriptors
  1 and 2 (subprocesses, C code) and what forked workers print, grouped
  exactly as the frontend got it;
* elsewhere (a terminal shell, tests) ``sys.stdout`` / ``sys.stderr`` are
  replaced by tees that write through to the previous stream object and
  record the text;
* ``shell.display_pub.publish`` / ``.clear_output`` and
  ``shell.displayhook.write_format_data`` are wrapped by *instance*
  attributes, which are removed again on exit (so the class methods show
  through) or set back to the previous wrapper when captures are nested.

At the end of the cell, figures the matplotlib backend would show after it
(drawn without ``plt.show()``) are shown and recorded in the place a plain
cell shows them, after the cell's result; widgets are recorded with the text
of their final state (:mod:`nbdurable.widgettext`).

:func:`unrecorded` lets nbdurable's own notices through without recording
them.

Recorded outputs are compacted the way the notebook itself would show them:
consecutive chunks of one stream merge into one output, carriage returns
overwrite their line (a progress bar stays one line, not a megabyte), and a
``clear_output`` drops the outputs it clears.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import math
import numbers
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from . import kernelio
from .widgettext import WidgetWatch

#: Mime type of a live widget view; it points at a model that dies with the kernel.
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"

#: What a replayed widget shows when it had no static representation at all.
WIDGET_PLACEHOLDER = "<widget: not restorable after a kernel restart>"

#: The output types :class:`Capture` records and :func:`replay` emits.
OUTPUT_TYPES = frozenset(
    {"stream", "display_data", "update_display_data", "execute_result", "clear_output"}
)


# What unrecorded() sets: a per-thread depth for the tees, and a process-wide
# count for kernel stream taps (ipykernel sends stream messages from its own
# IO thread, so "this thread" means nothing there).
_local = threading.local()
_dropping = 0
_state_lock = threading.Lock()
_active: list[Capture] = []


def _thread_quiet() -> bool:
    return getattr(_local, "depth", 0) > 0


def _taps_dropping() -> bool:
    return _dropping > 0


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Let what is printed or displayed in this block reach the frontend, but record it in
    no capture.

    For notices about this execution (a warning that a value could not be
    saved) that must not come back on every replay. In a kernel the streams
    are flushed on entry and exit, so the block's text travels in messages of
    its own (text another thread prints meanwhile is not recorded either).
    """
    global _dropping
    with _state_lock:
        taps = [tap for cap in _active for tap in cap._taps]
    for tap in taps:
        tap.flush()
    with _state_lock:
        _dropping += 1
    _local.depth = getattr(_local, "depth", 0) + 1
    # Displays too (not only the tees' depth: a nested capture's own writes are quiet
    # to the outer one, yet recorded by it).
    _local.unrecorded = getattr(_local, "unrecorded", 0) + 1
    try:
        yield
    finally:
        try:
            for tap in taps:
                tap.flush()
        finally:
            _local.depth -= 1
            _local.unrecorded -= 1
            with _state_lock:
                _dropping -= 1


class Capture:
    r"""Context manager: while active, everything the cell prints or displays still goes
    to the frontend live AND is appended to :attr:`outputs` as nbformat v4 output
    dicts, in the true order.

    Output shapes (nbformat v4):

    * ``{"output_type": "stream", "name": "stdout" | "stderr", "text": str}``
    * ``{"output_type": "display_data", "data": {...}, "metadata": {...}}``, plus
      ``"transient": {"display_id": ...}`` when one was given
    * ``{"output_type": "update_display_data", ...}`` (same keys), from
      ``display(..., display_id=X, update=True)`` or ``handle.update(...)``
    * ``{"output_type": "execute_result", "data": ..., "metadata": ...,
      "execution_count": int | None}``
    * ``{"output_type": "clear_output", "wait": bool}``

    Data values are JSON-able: bytes become base64 text as Jupyter sends them.

    ``outputs`` is compacted as the notebook would show it: consecutive chunks of
    the same stream merge into one dict, ``"\r"`` overwrites its line, and a
    ``clear_output`` drops every earlier output (at once, or with ``wait=True``
    when the next output arrives). Updates to a display that was cleared are
    dropped with it.

    In a kernel, streams are recorded as the stream messages the frontend
    gets (see :mod:`nbdurable.ipython.kernelio`), so the grouping of stdout and
    stderr is the frontend's. Elsewhere, to keep the live view in the true
    order, a write to one stream first flushes the other stream if it has
    unflushed text.

    Captures nest (an inner one records into itself and, through the outer
    one's wrappers, into the outer one too) but must exit in reverse order of
    entry, like ``contextlib.redirect_stdout``. A ``Capture`` can be entered
    once. ``__exit__`` restores everything, even on an exception or
    ``KeyboardInterrupt``.

    On exit (without an exception) the figures a matplotlib backend would
    show after the cell are shown and recorded (:func:`kernelio.flush_figures`).
    :attr:`unfaithful` then lists what a replay cannot show as it looked:
    widgets without a text for their state (see :mod:`nbdurable.widgettext`),
    and fd output still unforwarded at a deadline.

    Not seen outside a kernel: text written to file descriptors 1/2 directly.
    Outputs inside an ``ipywidgets.Output`` context are recorded as if they
    went to the cell.
    """

    def __init__(self, shell: Any) -> None:
        """Prepare to capture the outputs of `shell`, an IPython ``InteractiveShell``.

        Works with ipykernel's ``ZMQInteractiveShell`` and with a plain shell
        (whose ``DisplayPublisher`` prints text/plain; that printing is not
        recorded twice).
        """
        self.shell = shell
        self.outputs: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        #: What a replay cannot show as it looked (widgets that have no text
        #: for their state, fd output that arrived too late); set on exit.
        self.unfaithful: list[str] = []
        self._taps: list[kernelio.StreamTap] = []
        self._widgets = WidgetWatch(_jsonable)
        # The tee that was written to and not flushed since; see _Tee.write.
        self._dirty: _Tee | None = None
        # Index in self.outputs of a clear_output(wait=True) not yet applied.
        self._pending_clear: int | None = None
        self._stack: contextlib.ExitStack | None = None
        self._entered = False

    def __enter__(self) -> Capture:
        if self._entered:
            raise RuntimeError("this Capture was already used; create a new Capture per cell")
        self._entered = True
        stack = contextlib.ExitStack()
        try:
            self._capture_streams(stack)
            pub = getattr(self.shell, "display_pub", None)
            if pub is not None:
                _patch(stack, pub, "publish", self._wrap_publish)
                _patch(stack, pub, "clear_output", self._wrap_clear_output)
            hook = getattr(self.shell, "displayhook", None)
            if hook is not None:
                _patch(stack, hook, "write_output_prompt", self._wrap_quiet)
                _patch(stack, hook, "write_format_data", self._wrap_write_format_data)
                _patch(stack, hook, "finish_displayhook", self._wrap_quiet)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        with _state_lock:
            _active.append(self)
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            # What fd 1/2 got before the end is still in ipykernel's pipe.
            late = [tap.stream.name for tap in self._taps if not tap.sync_fd()]
            for tap in self._taps:
                tap.sync_children()
            if exc_type is None:
                # After an error a plain cell shows the traceback first, then
                # the figures; the kernel's own hook still does that.
                kernelio.flush_figures(self.shell)
            for tap in self._taps:
                tap.flush()
            widgets = self._widgets.finish()
            self._drop(widgets.closed)
            self.unfaithful = [f"{name} widget" for name in widgets.unfaithful]
            self.unfaithful += [
                f"{name} output that the kernel had not forwarded from its file "
                f"descriptor within {kernelio.THREAD_DEADLINE:g} s"
                for name in late
            ]
        finally:
            with _state_lock:
                if self in _active:
                    _active.remove(self)
            stack.close()

    def mark(self) -> tuple[int, int]:
        """Where the outputs stand now: their count, and the last stream's length.

        What was printed before but not yet sent (ipykernel buffers streams) is
        sent first, so that it lands before the mark.
        """
        _flush_pending()
        with self._lock:
            outs = self.outputs
            last = outs[-1] if outs else None
            tail = len(last["text"]) if last is not None and last["output_type"] == "stream" else 0
            return len(outs), tail

    def since(self, mark: tuple[int, int]) -> list[dict[str, Any]]:
        """The outputs recorded after ``mark``: a stream it cut, from the cut on.

        Streams reach the capture when ipykernel flushes them: flush first. A
        clear that removed outputs before ``mark`` makes the span unknown (empty).
        """
        _flush_pending()
        with self._lock:
            count, tail = mark
            outs = self.outputs
            if len(outs) < count:
                return []
            span = [dict(o) for o in outs[count:]]
            if count and tail:
                last = outs[count - 1]
                if last["output_type"] == "stream" and len(last["text"]) > tail:
                    span.insert(0, {**last, "text": last["text"][tail:]})
        # A widget the call displayed, as it looks at the call's end (closed: not at all).
        return [o for o in map(self._widgets.current, span) if o is not None]

    # -- recording --------------------------------------------------------------

    def _drop(self, dropped: list[dict[str, Any]]) -> None:
        """Remove these outputs (the very dicts) from :attr:`outputs`."""
        if not dropped:
            return
        gone = {id(o) for o in dropped}
        with self._lock:
            outs = self.outputs
            pending = outs[self._pending_clear] if self._pending_clear is not None else None
            outs[:] = [o for o in outs if id(o) not in gone]
            self._pending_clear = next((i for i, o in enumerate(outs) if o is pending), None)

    def _append(self, output: dict[str, Any]) -> None:
        """Record one output (compacting as described in the class docstring)."""
        with self._lock:
            outs = self.outputs
            kind = output["output_type"]
            if kind == "clear_output":
                if output["wait"]:
                    if self._pending_clear is not None:
                        del outs[self._pending_clear]
                    outs.append(output)
                    self._pending_clear = len(outs) - 1
                else:
                    outs[:] = [output]
                    self._pending_clear = None
            else:
                # Frontends apply a waiting clear at the next output, but an
                # update of an existing display is not a new output.
                if self._pending_clear is not None and kind != "update_display_data":
                    del outs[: self._pending_clear]
                    self._pending_clear = None
                last = outs[-1] if outs else None
                if (
                    kind == "stream"
                    and last is not None
                    and last["output_type"] == "stream"
                    and last["name"] == output["name"]
                ):
                    last["text"] = join_stream_text(last["text"], output["text"])
                elif kind == "stream":
                    outs.append({**output, "text": join_stream_text("", output["text"])})
                else:
                    outs.append(output)

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """In this thread, let writes through the tees without recording them.

        Our own machinery writing: a plain DisplayHook prints the result that
        is already recorded as an execute_result.
        """
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            yield
        finally:
            _local.depth -= 1

    def _is_quiet(self) -> bool:
        return _thread_quiet()

    def _capture_streams(self, stack: contextlib.ExitStack) -> None:
        for name in ("stdout", "stderr"):
            original = getattr(sys, name)
            if original is None:  # pythonw and some embedders have no streams
                continue
            stream = kernelio.out_stream(underlying(original))
            if stream is not None and all(tap.stream is not stream for tap in self._taps):
                tap = kernelio.StreamTap(stream, self._on_stream_text, _taps_dropping)
                try:
                    stack.enter_context(tap)
                except RuntimeError:  # the IO thread is stuck: fall back to a tee
                    pass
                else:
                    self._taps.append(tap)
                    continue
            setattr(sys, name, _Tee(self, name, original))
            stack.callback(setattr, sys, name, original)

    def _on_stream_text(self, name: str, text: str) -> None:
        self._append({"output_type": "stream", "name": name, "text": text})

    def _flush_taps(self) -> None:
        for tap in self._taps:
            tap.flush()

    # -- wrappers (each receives the bound method it replaces) ------------------

    def _wrap_publish(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def publish(data: Mapping[str, Any], metadata: Any = None, *args: Any, **kwargs: Any):
            # Shown in unrecorded() (an approval's buttons): sent, never recorded.
            dropped = getattr(_local, "unrecorded", 0) > 0
            with self._quiet():
                result = original(data, metadata, *args, **kwargs)
            if dropped:
                return result
            # ipykernel's publish flushed both streams before sending.
            self._dirty = None
            update = bool(kwargs.get("update"))
            output: dict[str, Any] = {
                "output_type": "update_display_data" if update else "display_data",
                "data": _jsonable(data),
                "metadata": _jsonable(metadata or {}),
            }
            transient = kwargs.get("transient")
            if transient:
                output["transient"] = _jsonable(transient)
            self._widgets.track(output)
            self._append(output)
            return result

        return publish

    def _wrap_clear_output(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def clear_output(wait: bool = False, *args: Any, **kwargs: Any):
            with self._quiet():
                result = original(wait, *args, **kwargs)
            self._dirty = None
            self._append({"output_type": "clear_output", "wait": bool(wait)})
            return result

        return clear_output

    def _wrap_write_format_data(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def write_format_data(format_dict: Mapping[str, Any], md_dict: Any = None):
            with self._quiet():
                result = original(format_dict, md_dict)
            # ipykernel flushes the streams before it sends the result: what
            # computing the result printed comes first.
            self._flush_taps()
            output = {
                "output_type": "execute_result",
                "data": _jsonable(format_dict),
                "metadata": _jsonable(md_dict or {}),
                "execution_count": _execution_count(self.shell),
            }
            self._widgets.track(output)
            self._append(output)
            return result

        return write_format_data

    def _wrap_quiet(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # A plain DisplayHook prints "Out[n]: " and a separator here: part of
        # the execute_result, not stream output.
        def quiet(*args: Any, **kwargs: Any):
            with self._quiet():
                return original(*args, **kwargs)

        return quiet


class _Tee:
    """Stands in for sys.stdout / sys.stderr: writes through, records the text.

    Code that patches ``sys.stdout.write`` (IPython 9 does, around a nested
    ``run_cell``) patches the tee itself, not the stream beneath: forwarding
    that patch would make the stream's write call the tee, which calls the
    stream, and so on. A write that comes back to the tee with the text it is
    writing (from a patch like that made on the stream itself) goes straight
    to the stream's class method.
    """

    __slots__ = ("__dict__", "_capture", "_name", "_stream", "_local")

    _OWN = frozenset({"write", "writelines", "flush"})

    def __init__(self, capture: Capture, name: str, stream: Any) -> None:
        object.__setattr__(self, "_capture", capture)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_stream", stream)
        object.__setattr__(self, "_local", threading.local())

    def write(self, text: str) -> int:
        cap = self._capture
        local = self._local
        stream = self._stream
        if getattr(local, "text", None) is text:
            # The stream's write called back into the tee with the very text
            # being written (a patch on the stream that calls sys.stdout.write):
            # finish it with the stream's class method; the outer call records it.
            return type(stream).write(stream, text)
        other = cap._dirty
        if other is not None and other is not self:
            # ipykernel buffers stdout and stderr separately; flush the other one
            # so the frontend sees the two in the order they were written.
            other._stream.flush()
        cap._dirty = self
        outer, local.text = getattr(local, "text", None), text
        try:
            written = stream.write(text)
        finally:
            local.text = outer
        if isinstance(text, str) and text and not cap._is_quiet():
            cap._append({"output_type": "stream", "name": self._name, "text": text})
        return written

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        cap = self._capture
        if cap._dirty is self:
            cap._dirty = None
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        if name in _Tee.__slots__:  # not yet set (e.g. during copy): avoid recursion
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _Tee._OWN:
            if getattr(value, "__self__", None) is self:
                vars(self).pop(name, None)  # setting back the tee's own method
            else:
                vars(self)[name] = value
            return
        setattr(self._stream, name, value)

    def __repr__(self) -> str:
        return f"<nbdurable tee of {self._stream!r}>"


def _patch(
    stack: contextlib.ExitStack,
    obj: Any,
    name: str,
    make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Shadow ``obj.name`` with an instance attribute; undo it when `stack` closes."""
    own = vars(obj)
    had_own = name in own
    previous = own.get(name)
    setattr(obj, name, make_wrapper(getattr(obj, name)))

    def restore() -> None:
        if had_own:
            setattr(obj, name, previous)
        else:
            vars(obj).pop(name, None)

    stack.callback(restore)


def _execution_count(shell: Any) -> int | None:
    hook = getattr(shell, "displayhook", None)
    count = getattr(hook, "prompt_count", None)
    if count is None:
        count = getattr(shell, "execution_count", None)
    return count if isinstance(count, int) else None


def join_stream_text(text: str, chunk: str) -> str:
    r"""Append `chunk` to stream `text`, letting ``"\r"`` overwrite its line.

    A carriage return moves back to the start of the line and the following
    text overwrites it, as terminals and JupyterLab show it; ``"\r\n"`` is a
    plain newline, kept as it came (a subprocess's Windows-style line ends
    replay as they were printed). Only the last line of `text` is
    reprocessed, so appending many small chunks stays linear. A trailing
    ``"\r"`` is kept until the next chunk shows whether a newline follows.

    >>> join_stream_text("10%", "\r50%")
    '50%'
    >>> join_stream_text("abc\r", "d\n")
    'dbc\n'
    >>> join_stream_text("a\r", "\nb\n")
    'a\r\nb\n'
    """
    start = text.rfind("\n") + 1
    tail = text[start:] + chunk
    if "\r" not in tail:
        return text + chunk
    lines = tail.split("\n")
    done = [
        _overwrite(line.rstrip("\r")) + ("\r" if line.endswith("\r") else "") for line in lines[:-1]
    ]
    last = lines[-1]
    trailing = "\r" if last.endswith("\r") else ""
    done.append(_overwrite(last.rstrip("\r")) + trailing)
    return text[:start] + "\n".join(done)


def _overwrite(line: str) -> str:
    shown = ""
    for part in line.split("\r"):
        shown = part + shown[len(part) :]
    return shown


def _jsonable(value: Any) -> Any:
    """A JSON-able copy of `value`, converted the way jupyter_client sends it.

    Bytes become base64 text (how Jupyter ships ``image/png``), tuples and sets
    lists, numpy-style numbers plain ones, non-finite floats their repr (as
    jupyter_client's ``json_clean`` does). Anything else becomes its repr, with
    a warning: it could not have reached a Jupyter frontend as it was.
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else repr(number)
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, Iterable):
        return [_jsonable(item) for item in value]
    warnings.warn(
        f"nbdurable: recorded a displayed value of type {type(value).__name__} as its repr; "
        "display data must be JSON-able (str, numbers, lists, dicts, bytes)",
        RuntimeWarning,
        stacklevel=2,
    )
    return repr(value)


def strip_widget_views(data: Mapping[str, Any]) -> dict[str, Any]:
    """Return mime bundle `data` without the live widget view.

    A widget view points at a model that died with the kernel that made it, so
    a replay shows the widget's static fallbacks (text/plain, text/html, ...)
    instead. If nothing else is left, it shows a text/plain placeholder.

    >>> strip_widget_views({"text/plain": "IntSlider(value=3)", WIDGET_VIEW_MIME: {}})
    {'text/plain': 'IntSlider(value=3)'}
    >>> strip_widget_views({WIDGET_VIEW_MIME: {}})
    {'text/plain': '<widget: not restorable after a kernel restart>'}
    """
    rest = {mime: value for mime, value in data.items() if mime != WIDGET_VIEW_MIME}
    if not rest:
        rest = {"text/plain": WIDGET_PLACEHOLDER}
    return rest


def show_last_expr(shell: Any, value: Any) -> None:
    """Display `value` as the cell's result, unless it is None.

    It becomes an ``execute_result`` with the current execution count, and sets
    ``_`` and ``Out[n]`` like a normal cell. Used when the ``%%step`` magic runs
    the cell body itself and its last statement is an expression. A trailing
    ``;`` is the caller's business: do not call this then.
    """
    if value is None:
        return
    hook = shell.displayhook
    # DisplayHook.quiet() looks for a trailing ";" in the last *history* entry,
    # which inside a magic is the magic call (or, when the cell does not store
    # history, some earlier cell): the caller has already decided.
    own = vars(hook)
    had_own = "quiet" in own
    previous = own.get("quiet")
    hook.quiet = _never_quiet
    try:
        hook(value)
    finally:
        if had_own:
            hook.quiet = previous
        else:
            vars(hook).pop("quiet", None)


def _never_quiet() -> bool:
    return False


def _flush_pending() -> None:
    """Flush stdout and stderr if they hold unsent text (a flush of ipykernel's stream
    waits for its IO thread: skipped when its buffer is empty, on every sub-step call).
    """
    for stream in (sys.stdout, sys.stderr):
        buffer = getattr(stream, "_buffer", None)
        tell = getattr(buffer, "tell", None)
        try:
            if tell is None or tell():
                stream.flush()
        except (AttributeError, OSError, ValueError):  # a closed or odd stream
            pass


def replay(shell: Any, outputs: Iterable[Mapping[str, Any]]) -> None:
    """Emit recorded `outputs` again, in the same order and of the same types.

    Streams are written to ``sys.stdout`` / ``sys.stderr`` and flushed; displays,
    display updates and clears go through ``shell.display_pub``; an
    ``execute_result`` goes through the displayhook, so it stays an
    ``execute_result``, numbered with the *current* execution count (``_`` and
    ``Out`` are not updated: there is no value, only its representation).
    Widget views are replaced by their static fallback (:func:`strip_widget_views`).

    Raises ValueError, before emitting anything, if an output has a type
    :class:`Capture` does not record.
    """
    outputs = list(outputs)
    for index, output in enumerate(outputs):
        kind = output.get("output_type")
        if kind not in OUTPUT_TYPES:
            raise ValueError(
                f"cannot replay output {index}: output_type {kind!r} is not one of "
                f"{sorted(OUTPUT_TYPES)}; the record may come from a newer nbdurable"
            )
    for output in outputs:
        kind = output["output_type"]
        if kind == "stream":
            stream = sys.stderr if output["name"] == "stderr" else sys.stdout
            stream.write(output["text"])
            stream.flush()
        elif kind == "clear_output":
            shell.display_pub.clear_output(wait=bool(output.get("wait", False)))
        else:
            data = strip_widget_views(output.get("data", {}))
            metadata = {
                key: value
                for key, value in (output.get("metadata") or {}).items()
                if key != WIDGET_VIEW_MIME
            }
            if kind == "execute_result":
                hook = shell.displayhook
                hook.start_displayhook()
                hook.write_output_prompt()
                hook.write_format_data(data, metadata)
                hook.finish_displayhook()
            else:
                shell.display_pub.publish(
                    data=data,
                    metadata=metadata,
                    transient=dict(output.get("transient") or {}),
                    update=kind == "update_display_data",
                )


def underlying(stream: Any) -> Any:
    """The real stream beneath any :class:`Capture` tees (for text that must not be recorded)."""
    while isinstance(stream, _Tee):
        stream = stream._stream
    return stream
