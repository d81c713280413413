"""Files a running step reads: inputs of the step, like the names it reads.

An audit hook (:func:`sys.addaudithook`, installed once per process: audit
hooks cannot be removed) sees every ``open`` event, which ``open()``,
``pathlib``, ``numpy.load``, ``pandas.read_csv`` and ``%run`` all raise.
While a step runs, each regular file opened for reading is noted once as
``absolute path -> [size, mtime_ns, SHA-256 of its content]`` and recorded
with the step. A later run checks each file: same size and mtime, it is
unchanged; otherwise its content hash decides, and a changed or missing
file runs the step again, naming the file.

Outside a step the hook returns after one test. Opens by nbdurable itself,
by the import system and by the kernel's machinery are not the step's.
The source files of local modules the step imports (``import helpers``
inside the step: an import opens nothing when the module is loaded already)
are noted when the step is recorded (:func:`note_imports`), with the local
modules those use, so an edit of ``helpers.py`` runs the step again.

Files the hook cannot see (read by a subprocess, a C library, a database
server) are declared: ``%%step NAME --inputs PATTERN ...``. Each pattern is a
glob (``*``, ``?``, ``[...]``, and ``**`` for any depth of directories),
relative to the kernel's working directory when the step runs (the
notebook's directory, unless the notebook changed it: where ``open`` looks
too). :func:`declared` resolves the patterns; the record keeps each
absolute pattern with the files it matched, and the files themselves like
those read. A later run whose patterns match other files (one added or
removed) or whose patterns were edited runs the step again, naming the file.
"""

from __future__ import annotations

import glob
import os
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..identity import analysis, localcode, verdict

_current: Callable[[], Any] | None = None  # the running StepContext, or None
_installed = False
_busy = threading.local()  # set while the hook hashes a file (its own open)

_PLUMBING = frozenset({"io", "_io", "codecs", "pathlib", "os", "builtins", __name__})
_NOT_THE_STEP = (
    "nbdurable",
    "importlib",
    "zipimport",
    "linecache",
    "tokenize",
    "traceback",
    "inspect",
    "ipykernel",
    "jupyter_client",
    "zmq",
    "tornado",
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def content_digest(path: str) -> str | None:
    """:func:`~nbdurable.identity.verdict.file_digest`, its own open unseen by the hook."""
    _busy.on = True
    try:
        return verdict.file_digest(path)
    finally:
        _busy.on = False


def install(current: Callable[[], Any]) -> None:
    """Note files read in ``current().file_reads`` while a step runs (once per process)."""
    global _current, _installed
    _current = current
    if not _installed:
        _installed = True
        sys.addaudithook(_hook)


def _hook(event: str, args: tuple) -> None:
    if event != "open" or _current is None or getattr(_busy, "on", False):
        return
    ctx = _current()
    if ctx is None:
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # an fd
    if isinstance(mode, str):
        if any(c in mode for c in "wax+"):
            return
    elif isinstance(flags, int) and flags & _WRITE_FLAGS:
        return
    try:
        full = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    if full in ctx.file_reads or not _by_the_step():
        return
    note(ctx.file_reads, full)


def note(reads: dict[str, list], path: str) -> None:
    """Note the regular file at the absolute ``path`` in ``reads``, unless it is noted."""
    if path in reads:
        return
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        reads[path] = [st.st_size, st.st_mtime_ns, content_digest(path)]


def note_imports(reads: dict[str, list], source: str) -> None:
    """Note the source files of the local modules ``source`` imports, and of those they use."""
    for path in localcode.local_module_files(analysis.imported_modules(source)):
        note(reads, path)


def _by_the_step() -> bool:
    f = sys._getframe(3)
    while f is not None and f.f_globals.get("__name__") in _PLUMBING:
        f = f.f_back
    name = str(f.f_globals.get("__name__", "")) if f is not None else ""
    return not any(name == p or name.startswith(p + ".") for p in _NOT_THE_STEP)


def declared(patterns: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """``--inputs`` patterns, made absolute, each with the regular files it matches (sorted)."""
    out: dict[str, list[str]] = {}
    for pattern in patterns:
        full = os.path.join(os.getcwd(), os.path.expanduser(pattern))
        found = glob.glob(full, recursive=True)
        out[full] = sorted(os.path.abspath(f) for f in found if os.path.isfile(f))
    return out
