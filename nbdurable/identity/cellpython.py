r"""A saved cell's Python as IPython makes it, for the views that have no kernel.

A kernel runs a cell through its shell's input transformer
(``shell.transform_cell``): ``%magic``, ``!cmd``, ``x?`` and ``a = %foo``
become calls, prompts pasted with the code are stripped. A view with no
kernel (``nbdurable status``, the side panel, :mod:`nbdurable.status`)
makes the same text with IPython's own ``TransformerManager``, so a saved
cell's code compares with the code its record kept.

That manager spends most of its time tokenizing the cell, again after each
piece of IPython syntax it rewrites, to find the next one: about a
millisecond per cell, a second or more for a notebook of a thousand steps,
on every look. Most cells hold no IPython syntax. :func:`python_of` runs the
manager's cheap passes (prompts, leading indentation, a ``%%`` cell magic)
and skips the token passes for a cell in which none could find anything:

- each token pass looks for a token of its own: ``?`` (help), ``!`` (a
  shell command, ``a = !cmd``), ``%`` right after an assignment's ``=``
  (``a = %magic``), or one of ``! ? % , ; /`` first on a logical line (an
  escaped command). The screen (:func:`_may_hold_ipython`) is coarser than
  the passes: a ``?`` or ``!`` anywhere but ``!=`` (in a string or a comment
  too), a ``%`` after a ``=`` and spaces, a backslash line continuation,
  any line whose first character but spaces is one of the escapes, a line
  break other than ``\n`` (``\r``, a form feed: lines ``^`` does not
  see). A cell it flags goes through the manager whole, as before;
- the text must also parse as Python: the tokenizer raises on some code
  that does not (an unindent matching no outer level), which the manager
  reports as a failure (None here), so such a cell goes through the manager.

Either way the answer is the manager's own. Answers are cached by the
cell's text (:func:`by_text`, which the views' other per-cell analyses use
too): a view reading a notebook again (the side panel polls, the widget
panel refreshes) transforms only the cells that changed.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Distinct cell texts kept (a notebook of this many steps is read with no transform),
#: each at most this long (a cell holding megabytes of data is transformed each time).
CACHED = 8192
CACHED_CHARS = 65_536

_SCREEN = re.compile(
    r"[?]"  # help (x?, ?x, x??)
    r"|!(?!=)"  # a shell command (!cmd, a = !cmd); != is an operator
    r"|=[ \t\f]*%"  # a = %magic
    r"|\\\r?\n"  # a line continued: an assignment's = and its % on two lines
    r"|^[ \t\f]*[%,;/]"  # an escaped command first on its line (%time, ,f a, ;f a, /f a)
    # Line breaks other than \n (str.splitlines breaks the cell there, ^ does not see them)
    r"|[\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]",
    re.MULTILINE,
)

_PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def _may_hold_ipython(text: str) -> bool:
    """False only when no token pass of IPython's transformer can find anything in ``text``."""
    return _SCREEN.search(text) is not None


def _parses(text: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SyntaxWarnings: the parse alone matters here
        try:
            compile(text, "<cell>", "exec", flags=_PARSE_FLAGS, dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
    return True


@functools.lru_cache(maxsize=1)
def _manager() -> object:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


def _transform(body: str) -> str:
    """``TransformerManager().transform_cell(body)``, the token passes skipped where idle."""
    tm = _manager()
    cell = body if body.endswith("\n") else body + "\n"
    lines = cell.splitlines(keepends=True)
    for transform in tm.cleanup_transforms + tm.line_transforms:  # type: ignore[attr-defined]
        lines = transform(lines)
    text = "".join(lines)
    if not _may_hold_ipython(text) and _parses(text):
        return text
    return "".join(tm.do_token_transforms(lines))  # type: ignore[attr-defined]


def by_text(fn: Callable[[str], T]) -> Callable[[str], T]:
    """``fn`` of a cell's text, its answers kept for :data:`CACHED` texts of at most
    :data:`CACHED_CHARS` (``.cache_clear()`` empties them).
    """
    cached = functools.lru_cache(maxsize=CACHED)(fn)

    @functools.wraps(fn)
    def of(body: str) -> T:
        return cached(body) if len(body) <= CACHED_CHARS else fn(body)

    of.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
    return of


@by_text
def python_of(body: str) -> str | None:
    """The Python IPython runs for the cell text ``body``; None if IPython cannot transform it."""
    return _transform_or_none(body)


def _transform_or_none(body: str) -> str | None:
    try:
        return _transform(body)
    except Exception:  # what the kernel's shell would refuse too
        return None


def ipython_python_of(body: str) -> str | None:
    """The same through IPython's transformer alone, every pass run (what tests compare with)."""
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        return TransformerManager().transform_cell(body)
    except Exception:
        return None
