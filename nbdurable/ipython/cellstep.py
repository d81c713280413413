"""``%%step`` cells executed by IPython itself, with nbdurable deciding around them.

A ``%%step`` cell must run exactly like a plain cell: a top-level ``await``
on the kernel's own event loop and thread (so ``decimal`` contexts, context
variables, ``sqlite3`` connections and asyncio primitives made by earlier
cells behave as there), tracebacks showing the cell's own lines, and the last
expression shown by IPython's display hook (``_``, ``__``, ``Out``, ``_N`` and a
trailing ``;`` as in a plain cell). So the magic does not run the body:

1. :func:`StepCellTransformer` (an input transformer run after IPython's own)
   turns a cell that is exactly ``get_ipython().run_cell_magic('step', ARGS,
   BODY)`` into the line ``__nbdurable_step__(ARGS, BODY)`` followed by BODY as
   IPython transforms a plain cell. The header line becomes the marker line,
   so BODY keeps its line numbers.
2. :class:`StepCellAst` (an AST transformer) rewrites such a module into
   ``if __nbdurable_step__(ARGS, BODY): <body but a trailing expression>`` and,
   when the body ends in an expression, ``(<expr>) if
   __nbdurable_step__.executing() else __nbdurable_step__.replayed_value()``.
3. At run time the marker (:class:`StepCell`) calls
   :meth:`StepRunner.begin`: on replay it restores the record and shows its
   outputs up to the result, and the final expression yields the recorded
   value; otherwise the capture and step context start and the body runs.
4. The ``post_run_cell`` hook (after every ``post_execute`` hook, so figures
   the inline backend flushes are captured) ends the step with the cell's
   :class:`ExecutionResult`: records it, or its failure (``KeyboardInterrupt``
   included), or shows the outputs a replay recorded after the result.
   A silent execution skips ``post_run_cell``; the next ``pre_run_cell`` ends
   what it left open.

Called from code (``get_ipython().run_cell_magic('step', ...)``), the magic
still works: it runs the body itself through the same begin/finish
(:meth:`StepRunner.run_step`).
"""

from __future__ import annotations

import ast
import linecache
import sys
import threading
from typing import Any

from IPython.core.error import UsageError

from ..durable import httpsteps
from ..durable.context import say, warn
from ..durable.stepper import Replayed, Running
from ..errors import LeaseHeld, NbdurableError, StoreError, UsageProblem
from ..identity import stepline
from ..text import one_line
from .capture import WIDGET_VIEW_MIME, strip_widget_views

MARKER = "__nbdurable_step__"

_local = threading.local()  # .inner: transforming a step's body (no nested rewrite)


class StepCellTransformer:
    """Input transformer (``shell.input_transformers_post``): a ``%%step`` cell to marker + body.

    Pure: it only rewrites text. Anything it does not recognise passes unchanged.
    """

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def __call__(self, lines: list[str]) -> list[str]:
        """The cell's lines, rewritten when they are one ``%%step`` call."""
        if getattr(_local, "inner", False) or not lines:
            return lines
        parsed = _magic_call("".join(lines))
        if parsed is None:
            return lines
        args, body = parsed
        _local.inner = True
        try:
            py = self.shell.transform_cell(body)
        except Exception:  # the body does not transform: the magic reports it as before
            return lines
        finally:
            _local.inner = False
        marker = f"{MARKER}({args!r}, {body!r})\n"
        out = [marker, *py.splitlines(keepends=True)]
        _remember("".join(out), "".join(lines))
        return out


#: transformed text -> IPython's own text of the cell (the last few), see _restore_history
_originals: dict[str, str] = {}


def _remember(transformed: str, original: str) -> None:
    if len(_originals) > 16:
        _originals.clear()
    # IPython's history keeps a cell without its trailing newlines.
    _originals[transformed.rstrip("\n")] = original.rstrip("\n")


def _restore_history(shell: Any) -> None:
    """``In[n]`` (and ``%history``) hold the cell as IPython alone would have made it.

    IPython stores the transformed cell, here the marker and the body; a plain
    run of a ``%%step`` cell stores its ``run_cell_magic`` call.
    """
    hm = getattr(shell, "history_manager", None)
    hist = getattr(hm, "input_hist_parsed", None)
    if not hist or hist[-1] not in _originals:
        return
    ours = hist[-1]
    hist[-1] = _originals.pop(ours)
    lock = getattr(hm, "db_input_cache_lock", None)
    cache = getattr(hm, "db_input_cache", None)
    if lock is not None and cache:
        with lock:
            if cache and cache[-1][1] == ours:
                cache[-1] = (cache[-1][0], hist[-1], *cache[-1][2:])


def _magic_call(text: str) -> tuple[str, str] | None:
    """``(ARGS, BODY)`` when `text` is exactly one ``run_cell_magic('step', ARGS, BODY)`` call."""
    if "run_cell_magic" not in text:
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    call = tree.body[0].value
    if not (
        isinstance(call, ast.Call)
        and not call.keywords
        and len(call.args) == 3
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "run_cell_magic"
        and isinstance(call.func.value, ast.Call)
        and isinstance(call.func.value.func, ast.Name)
        and call.func.value.func.id == "get_ipython"
        and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in call.args)
    ):
        return None
    magic, args, body = (a.value for a in call.args)  # type: ignore[attr-defined]
    return (args, body) if magic == "step" else None


class StepCellAst(ast.NodeTransformer):
    """AST transformer: the marker decides whether the body runs (see the module docstring).

    Never raises (IPython unregisters a transformer that does): anything
    unexpected leaves the tree unchanged.
    """

    def visit(self, node: ast.AST) -> ast.AST:
        """The module rewritten when it starts with the marker; else `node` unchanged."""
        try:
            return _rewrite(node)
        except Exception:
            return node


def _rewrite(node: ast.AST) -> ast.AST:
    if not (isinstance(node, ast.Module) and node.body and _is_marker(node.body[0])):
        return node
    marker, *stmts = node.body
    last = stmts.pop() if stmts and isinstance(stmts[-1], ast.Expr) else None
    test = marker.value  # type: ignore[attr-defined]
    body: list[ast.stmt] = stmts or [ast.copy_location(ast.Pass(), marker)]
    new: list[ast.stmt] = [ast.copy_location(ast.If(test=test, body=body, orelse=[]), marker)]
    if last is not None:
        shown = ast.IfExp(
            test=_method("executing", last), body=last.value, orelse=_method("replayed_value", last)
        )
        new.append(ast.copy_location(ast.Expr(ast.copy_location(shown, last.value)), last))
    node.body = new
    return ast.fix_missing_locations(node)


def _is_marker(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Name)
        and stmt.value.func.id == MARKER
    )


def _method(name: str, where: ast.AST) -> ast.Call:
    func = ast.Attribute(value=ast.Name(id=MARKER, ctx=ast.Load()), attr=name, ctx=ast.Load())
    return ast.copy_location(ast.Call(func=func, args=[], keywords=[]), where)


class StepCell:
    """The marker: begins a ``%%step`` cell, and ends it from the cell hooks."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._running: Running | None = None
        self._replayed: Replayed | None = None
        # The ExecutionResult of the cell that began the step: a cell the body
        # runs itself (get_ipython().run_cell) fires the cell hooks too, and
        # must not end the step.
        self._owner: object = None
        self._cell_file: str | None = None  # the file name IPython compiled that cell under
        self._unpatch: Any = None  # undoes replayed_value's display hook patch
        self._http: httpsteps.StepHTTP | None = None  # --http: the body's HTTP session

    def __call__(self, line: str, body: str) -> bool:
        """Begin the step; True when its body must execute, False when it was replayed."""
        __tracebackhide__ = True
        from .host import session_for

        self.close(None, stale=True)
        cell_file = sys._getframe(1).f_code.co_filename
        _show_header(cell_file, line)
        try:
            args = stepline.parse(line)
            started = session_for(self.shell).steps.begin(
                body, name=args.name, force=args.force, input_patterns=args.inputs, http=args.http
            )
        except (UsageProblem, StoreError, LeaseHeld) as exc:
            # One line, no traceback, as the magic says it.
            raise UsageError(one_line(exc)) from None
        self._owner = getattr(self.shell.displayhook, "exec_result", None)
        self._cell_file = cell_file
        if isinstance(started, Replayed):
            self._replayed = started
            return False
        self._running = started
        if httpsteps.wanted(args.http):
            self._http = httpsteps.StepHTTP(session_for(self.shell), started.ctx)
            try:
                self._http.start()
            except StoreError as exc:
                self._http = None
                warn(f"step {started.plan.label!r}: its HTTP is not recorded ({exc})")
        return True

    def executing(self) -> bool:
        """True while a step's body executes (the final expression is its own)."""
        return self._running is not None

    def replayed_value(self) -> Any:
        """The result a replayed step recorded (None: nothing to show).

        The display hook shows it with the recorded data, not formatted again:
        a formatter the recording kernel had (matplotlib's PNG for a figure)
        may be missing here, and a ``__repr__`` that prints must not print twice.
        """
        replayed = self._replayed
        if replayed is None:
            return None
        value = replayed.value
        if value is not None and replayed.shown is not None:
            hook = self.shell.displayhook
            original = hook.compute_format_data

            def recorded_format(result: Any) -> tuple[dict, dict]:
                vars(hook).pop("compute_format_data", None)  # once
                return recorded_data(replayed.shown) if result is value else original(result)

            hook.compute_format_data = recorded_format
            self._unpatch = lambda: vars(hook).pop("compute_format_data", None)
        return value

    def close(self, result: Any, stale: bool = False) -> None:
        """End what the cell that gave ``result`` (an ``ExecutionResult``) began.

        From ``post_run_cell``. With ``stale``, from a cell's start: a silent
        execution has no ``post_run_cell``, so a step it began is ended then,
        with that cell's own result, unless its cell is still running (a cell
        the step's body runs itself). Does nothing for another cell's result.
        Never raises: this runs in IPython's event hooks.
        """
        if self._running is None and self._replayed is None:
            return
        if stale:
            if self._cell_file is not None and _on_stack(self._cell_file):
                return
            result = self._owner
        elif self._owner is not None and result is not self._owner:
            return
        running, self._running = self._running, None
        replayed, self._replayed = self._replayed, None
        self._owner = self._cell_file = None
        unpatch, self._unpatch = self._unpatch, None
        http, self._http = self._http, None
        try:
            if http is not None:
                http.stop()  # before the step's record: what it replayed counts for it
        except Exception as exc:  # never leave IPython with a broken hook
            warn(f"nbdurable could not stop the step's HTTP recording: {exc}")
        try:
            if unpatch is not None:
                unpatch()
            _restore_history(self.shell)
        except Exception:  # the history's look is not worth failing a hook for
            pass
        from .host import session_for

        steps = session_for(self.shell).steps
        try:
            if replayed is not None and not stale:
                # (Ended late, a silent cell's: its outputs would land in another cell.)
                steps.finish_replay(replayed)
            elif running is not None:
                error = _error_of(result)
                value = None if error is not None else getattr(result, "result", None)
                steps.finish(running, error, value)
        except NbdurableError as exc:
            # Raised after the body ran (recording it failed): an end-of-cell hook
            # cannot raise a UsageError, so the same one line goes to stderr.
            say("nbdurable: " + one_line(exc))
        except Exception as exc:  # never leave IPython with a broken hook
            warn(f"nbdurable could not finish the step: {type(exc).__name__}: {exc}")


#: Raised by sub-steps inside a step's body; said in one line, as the magic says them.
ONE_LINE = (UsageProblem, StoreError, LeaseHeld)


def one_line_errors(cell: StepCell) -> Any:
    """A ``set_custom_exc`` handler: :data:`ONE_LINE` errors of a step's body in one line.

    Elsewhere (a plain cell) a bad input to nbdurable (a :class:`UsageProblem`:
    ``step("", fn)``, ``step(123, fn)``, a bad ``configure(...)`` argument) is one
    line too: its message says what to change, and no frame of nbdurable's
    helps. A store error there shows IPython's usual traceback.
    """

    def handler(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None):  # noqa: ANN202
        if cell.executing() or isinstance(value, UsageProblem):
            shell.show_usage_error(UsageError(one_line(value)))
            return []
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        shell._showtraceback(etype, value, stb)
        return stb

    return handler


def _on_stack(filename: str) -> bool:
    """True while code compiled under `filename` (the step's cell) is executing."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return True
        frame = frame.f_back
    return False


def _error_of(result: Any) -> BaseException | None:
    if result is None:
        # No ExecutionResult (a silent execution was interrupted before it had
        # one): the step cannot be known to have finished.
        return RuntimeError("the cell ended without a result")
    error = getattr(result, "error_in_exec", None) or getattr(result, "error_before_exec", None)
    return error if isinstance(error, BaseException) else None


def _show_header(filename: str, args: str) -> None:
    """Let tracebacks show the cell's ``%%step`` line where the marker call stands."""
    try:
        entry = linecache.cache.get(filename)
        if entry and entry[2] and entry[2][0].startswith(MARKER + "("):
            lines = [f"%%step {args}".rstrip() + "\n", *entry[2][1:]]
            entry = (entry[0], entry[1], lines, entry[3])
            linecache.cache[filename] = entry
            # IPython 8 restores linecache from its own copy on checkcache().
            kept = getattr(linecache, "_ipython_cache", None)
            if isinstance(kept, dict) and filename in kept:
                kept[filename] = entry
    except Exception:  # a traceback's look is not worth failing a cell for
        pass


def recorded_data(shown: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A recorded ``execute_result``'s ``(data, metadata)``, as :func:`.capture.replay` does."""
    data = strip_widget_views(shown.get("data", {}))
    metadata = {k: v for k, v in (shown.get("metadata") or {}).items() if k != WIDGET_VIEW_MIME}
    return data, metadata
