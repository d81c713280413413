"""Executing a ``%%step`` body in the user's namespace when the magic is called from code.

A ``%%step`` cell is run by IPython itself (see :mod:`.cellstep`); only
``get_ipython().run_cell_magic("step", ...)`` called from code comes here,
where IPython is already running the calling cell. The body is compiled with
the cell's own file name (tracebacks show its lines), a trailing expression
is shown through the display hook, and a top-level ``await`` runs on a loop of
its own (see :func:`run_coroutine`): the kernel's loop is busy with the caller.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import threading
from typing import Any

from ..identity.analysis import ends_with_semicolon
from .capture import show_last_expr


def run_body(shell: Any, py: str, has_await: bool) -> None:
    """Execute the cell body in the user namespace; show a trailing expression."""
    __tracebackhide__ = True
    filename = shell.compile.cache(py, shell.execution_count)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if has_await else 0
    tree = compile(py, filename, "exec", ast.PyCF_ONLY_AST | flags)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    glb, loc = shell.user_global_ns, shell.user_ns
    code = compile(tree, filename, "exec", flags)
    _exec(code, glb, loc, has_await)
    if last is not None:
        value = _exec(compile(last, filename, "eval", flags), glb, loc, has_await, evaluate=True)
        # The displayhook's own ';' check reads the outer cell's history entry
        # (the magic call), so the trailing-semicolon rule is applied here.
        if not ends_with_semicolon(py):
            show_last_expr(shell, value)


def _exec(code: Any, glb: dict, loc: dict, has_await: bool, evaluate: bool = False) -> Any:
    __tracebackhide__ = True
    result = eval(code, glb, loc)  # noqa: S307 - this is the user's own cell
    if has_await and asyncio.iscoroutine(result):
        result = run_coroutine(result)
    return result if evaluate else None


def run_coroutine(coro: Any) -> Any:
    """Run a top-level-await body to completion.

    The kernel's own event loop is busy running this very cell, so the body
    runs on a fresh loop in a helper thread while this thread waits. An
    interrupt (KeyboardInterrupt) cancels the body and waits for it to stop,
    so no sub-step keeps calling a model in the background after the cell
    has failed; a second interrupt stops waiting.
    """
    __tracebackhide__ = True
    box: dict[str, Any] = {}

    async def main() -> Any:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        if box.get("cancelled"):  # interrupted before the body started
            coro.close()
            raise asyncio.CancelledError
        return await coro

    def runner() -> None:
        try:
            box["value"] = asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=runner, name="nbdurable-step", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.1)
    except KeyboardInterrupt:
        box["cancelled"] = True
        loop, task = box.get("loop"), box.get("task")
        if loop is not None and task is not None:
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has just finished
                pass
        with contextlib.suppress(KeyboardInterrupt):  # a second interrupt stops waiting
            while t.is_alive():
                t.join(0.1)
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")
