"""Files a running step reads and writes: its inputs and its outputs.

An audit hook (:func:`sys.addaudithook`, installed once per process: audit
hooks cannot be removed) sees every ``open`` event, which ``open()``,
``os.open``, ``pathlib``, ``numpy.load``/``numpy.save``,
``pandas.read_csv``/``DataFrame.to_csv``, ``shutil.copy`` and ``%run`` all
raise, and every ``os.rename`` event (``os.rename``, ``os.replace``,
``shutil.move``).

**Reads are inputs.** While a step runs, each regular file opened for
reading is noted once as ``absolute path -> [size, mtime_ns, SHA-256 of its
content]`` and recorded with the step. A file the step wrote before reading
it is its own product, not an input.

**Writes are outputs.** A file opened for writing (modes ``w``, ``a``,
``x``, ``+``; ``os.open`` with write flags) or renamed into place is noted
by path only; when the step ends, :func:`outputs` stats and hashes each
once, streaming, as ``absolute path -> [size, mtime_ns, SHA-256]``. A file
the step only appended to is its appended part, ``[end, mtime_ns, SHA-256
of the bytes start..end, start]``: later appends by other cells (a shared
log) are no change, truncating or rewriting that part is. Not outputs: a
file gone by the end of the step (a temporary file it removed or renamed
away, a ``TemporaryDirectory``; a file that outlives the step is an output
wherever it lies, the temporary directory included), and files written
while a sub-step call (``step()``, ``@recorded``) runs: they are the call's
effect, and the call replays, never repeated, so running the step again
could not write them anew. A file the step both read and wrote is checked
as an output only: the step itself changed what it read.

A later run checks both kinds with
:func:`~nbdurable.identity.verdict.files_changed`: same size and mtime, a
file is unchanged; otherwise its content hash decides, and a changed or
missing file runs the step again (its sub-steps still replay), naming it.

Outside a step the hook returns after one test. Opens by nbdurable itself,
by the import system and by the kernel's machinery are not the step's.

**Inputs are what the user's code reads**, decided by the file, not by who
opened it (``pandas.read_csv("data.csv")`` opens from library code, and
``data.csv`` is an input all the same). Not inputs: the operating system's
own files (``/proc``, ``/sys``, ``/dev``: threadpoolctl reads
``/proc/self/maps`` the first time scikit-learn's KMeans runs), the files
of the interpreter, the standard library and installed packages (a
package's CSS, its bundled data sets: its version stands for them), the
time-zone database and certificate stores, and the user's cache directory
(``~/.cache``, ``$XDG_CACHE_HOME``). ``--inputs`` patterns are inputs
whatever they match.
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

from .. import faults
from ..identity import analysis, localcode, verdict
from .context import current_sub

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
_CHUNK = 1 << 20
#: Files of the operating system's own that look regular (``/proc/self/oom_score_adj``):
#: what they hold is the process's, not content a step leaves behind.
_KERNEL_FILES = ("/proc/", "/sys/", "/dev/")


def content_digest(path: str, start: int = 0, end: int | None = None) -> str | None:
    """:func:`~nbdurable.identity.verdict.file_digest`, its own open unseen by the hook."""
    _busy.on = True
    try:
        return verdict.file_digest(path, start, end)
    finally:
        _busy.on = False


def install(current: Callable[[], Any]) -> None:
    """Note files read and written in ``current()`` while a step runs (once per process)."""
    global _current, _installed
    _current = current
    if not _installed:
        _installed = True
        sys.addaudithook(_hook)


def _hook(event: str, args: tuple) -> None:
    if (event != "open" and event != "os.rename") or _current is None:
        return
    if getattr(_busy, "on", False):
        return
    ctx = _current()
    if ctx is None:
        return
    if event == "os.rename":
        _renamed(ctx, args)
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if not isinstance(path, (str, bytes, os.PathLike)):
        return  # an fd
    if isinstance(mode, str):
        writes, appends = any(c in mode for c in "wax+"), "a" in mode
    else:
        writes = isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
        appends = writes and bool(flags & os.O_APPEND)
    full = _absolute(path)
    if full is None:
        return
    if writes:
        noted = ctx.file_writes.get(full, False)
        if noted is None or (appends and noted is not False):
            return  # nothing new: a loop reopening its log costs one lookup
        # The origin of the open decides (frame 2: _hook is 1): a sub-step's
        # call, nbdurable's own store or the kernel's files are not the step's.
        if current_sub.get() is None and _by_the_step(2):
            _wrote(ctx, full, appends)
        return
    if full in ctx.file_reads or full in ctx.file_writes or not _by_the_step(3):
        return
    if not_an_input(full):
        return
    note(ctx.file_reads, full)


def not_an_input(path: str) -> bool:
    """True for a file read for the process's or a library's own purposes (see above)."""
    return path.startswith(_NOT_INPUTS) or localcode.is_library_file(path)


def _not_inputs() -> tuple[str, ...]:
    roots = list(_KERNEL_FILES) + ["/usr/share/zoneinfo/", "/etc/localtime", "/etc/ssl/"]
    roots += ["/etc/pki/", "/usr/lib/ssl/", "/usr/share/ca-certificates/"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    roots.append(os.path.join(os.path.abspath(cache), ""))
    if sys.prefix != sys.base_prefix:  # a virtual environment: everything in it is installed
        roots.append(os.path.join(os.path.abspath(sys.prefix), ""))
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        roots.append(os.path.join(os.path.abspath(prefix), "lib", ""))  # the interpreter's own
    return tuple(roots)


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


def _absolute(path: Any) -> str | None:
    try:
        return os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


def _wrote(ctx: Any, full: str, appends: bool) -> None:
    """Note a file opened for writing: whole, or appended to from its size now."""
    writes: dict[str, int | None] = ctx.file_writes
    if full in writes:
        if not appends:
            writes[full] = None  # written whole at some point: the whole file is the output
        return
    start = None
    if appends:
        # The hook runs before the open: the size now is where the step's part begins.
        try:
            start = os.stat(full).st_size
        except OSError:
            start = 0
    writes[full] = start


def _renamed(ctx: Any, args: tuple) -> None:
    """``os.rename(src, dst)``: dst is written whole; what was noted under src moves."""
    src, dst = (tuple(args) + (None, None))[:2]
    dir_fds = tuple(args)[2:4]
    if any(isinstance(fd, int) and fd >= 0 for fd in dir_fds):
        return  # paths relative to directory descriptors: not resolvable here
    if not isinstance(src, (str, bytes, os.PathLike)) or not isinstance(
        dst, (str, bytes, os.PathLike)
    ):
        return
    if current_sub.get() is not None or not _by_the_step(3):
        return
    old, new = _absolute(src), _absolute(dst)
    if old is None or new is None:
        return
    writes: dict[str, int | None] = ctx.file_writes
    # A directory renamed into place (write to out.tmp/, then publish as out/):
    # the files written inside it now live under the new name.
    inside = old + os.sep
    for path in [p for p in writes if p.startswith(inside)]:
        writes[new + os.sep + path[len(inside) :]] = writes.pop(path)
    writes.pop(old, None)
    writes[new] = None


def _by_the_step(depth: int) -> bool:
    f = sys._getframe(depth)
    while f is not None and f.f_globals.get("__name__") in _PLUMBING:
        f = f.f_back
    name = str(f.f_globals.get("__name__", "")) if f is not None else ""
    return not any(name == p or name.startswith(p + ".") for p in _NOT_THE_STEP)


def outputs(written: dict[str, int | None]) -> dict[str, list[Any]]:
    """The files a step wrote, as they are now (its end): path -> what is checked on replay.

    ``[size, mtime_ns, digest]`` for a file written whole, ``[end, mtime_ns,
    digest of start..end, start]`` for one only appended to. A path that is
    no longer a regular file is not an output. Each file is hashed once.
    """
    out: dict[str, list[Any]] = {}
    for path in sorted(written):
        start = written[path]
        try:
            st = os.stat(path)
        except OSError:
            continue  # removed or renamed away before the step ended
        if not stat.S_ISREG(st.st_mode) or path.startswith(_KERNEL_FILES):
            continue
        if start is not None and st.st_size < start:
            start = None  # shrunk since the append began: the whole file is what it left
        digest = content_digest(path, start or 0, st.st_size)
        faults.point("file-hashed")
        if digest is None:
            continue
        entry: list[Any] = [st.st_size, st.st_mtime_ns, digest]
        out[path] = entry if start is None else [*entry, start]
    return out


def declared(patterns: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """``--inputs`` patterns, made absolute, each with the regular files it matches (sorted)."""
    out: dict[str, list[str]] = {}
    for pattern in patterns:
        full = os.path.join(os.getcwd(), os.path.expanduser(pattern))
        found = glob.glob(full, recursive=True)
        out[full] = sorted(os.path.abspath(f) for f in found if os.path.isfile(f))
    return out


#: Where a file is read for the process's or a library's own purposes (see not_an_input).
_NOT_INPUTS = _not_inputs()
