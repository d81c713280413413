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

from ..errors import LeaseHeld, NbdurableError, StoreError, UsageProblem
from ..identity import keys, locate
from .context import warn
from .stepper import Replayed, Running

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
        return [marker, *py.splitlines(keepends=True)]


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

    def __call__(self, line: str, body: str) -> bool:
        """Begin the step; True when its body must execute, False when it was replayed."""
        __tracebackhide__ = True
        from .session import get_session

        self.close(getattr(self.shell, "last_execution_result", None), stale=True)
        _show_header(sys._getframe(1).f_code.co_filename, line)
        try:
            name, force = locate.parse_step_line(line)
            started = get_session(self.shell).steps.begin(body, name=name, force=force)
        except (UsageProblem, StoreError, LeaseHeld) as exc:
            # One line, no traceback, as the magic says it.
            raise UsageError(keys.one_line(" ".join(str(exc).split()))) from None
        self._owner = getattr(self.shell.displayhook, "exec_result", None)
        if isinstance(started, Replayed):
            self._replayed = started
            return False
        self._running = started
        return True

    def executing(self) -> bool:
        """True while a step's body executes (the final expression is its own)."""
        return self._running is not None

    def replayed_value(self) -> Any:
        """The result a replayed step recorded (None: nothing to show)."""
        return self._replayed.value if self._replayed is not None else None

    def close(self, result: Any, stale: bool = False) -> None:
        """End what the cell that gave ``result`` (an ``ExecutionResult``) began.

        From ``post_run_cell``; with ``stale``, from the next cell's start
        (``result`` is then the last finished cell's: a silent execution has no
        ``post_run_cell``). Does nothing for another cell's result (one the
        step's body ran itself). Never raises: this runs in IPython's event hooks.
        """
        if self._owner is not None and result is not self._owner:
            return
        if stale and self._owner is None and result is not None:
            return  # not begun by a cell IPython ran (no displayhook result): leave it
        running, self._running = self._running, None
        replayed, self._replayed = self._replayed, None
        self._owner = None
        if running is None and replayed is None:
            return
        from .session import get_session

        steps = get_session(self.shell).steps
        try:
            if replayed is not None:
                steps.finish_replay(replayed)
            elif running is not None:
                error = _error_of(result)
                value = None if error is not None else getattr(result, "result", None)
                steps.finish(running, error, value)
        except NbdurableError as exc:
            warn(keys.one_line(" ".join(str(exc).split())))
        except Exception as exc:  # never leave IPython with a broken hook
            warn(f"nbdurable could not finish the step: {type(exc).__name__}: {exc}")


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
