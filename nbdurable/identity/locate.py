"""Where am I? The notebook this kernel runs, its run id, its store, its cells.

The notebook path comes from what the frontend gives, first match wins:

1. ``NBDURABLE_NOTEBOOK`` in the environment (set by ``nbdurable run`` and other runners);
2. ``JPY_SESSION_NAME`` (JupyterLab, Notebook 7, anything jupyter_server starts);
3. ``__vsc_ipynb_file__`` in the user namespace (VS Code);
4. ``__session__`` in the user namespace (jupyter_server, older kernels).

Clients built on nbclient (nbconvert ``--execute``, papermill, ``jupyter
execute``, nbclient itself) send neither a path nor cell ids: the kernel then
finds its notebook by the cells it executed (:func:`find_by_cells`), among the
``.ipynb`` files named on the command line of the process that started it
(``papermill in.ipynb out.ipynb``), else among those of its working directory.

The store is ``NBDURABLE_DIR`` if set, else ``.nbdurable/`` beside the
notebook, else ``.nbdurable/`` in the working directory. The run id is the
notebook's path relative to the directory holding the store (so moving a
project folder keeps its history), or its absolute path when the store lives
elsewhere; with no notebook known (a console, a script, a notebook that
exists only in memory) it is ``default``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import UsageProblem
from . import stepline
from .keys import source_fingerprint

DEFAULT_RUN = "default"


def find_notebook(user_ns: dict[str, Any] | None = None) -> Path | None:
    """The path of the notebook this kernel runs, if the frontend told us."""
    ns = user_ns or {}
    for raw in (
        os.environ.get("NBDURABLE_NOTEBOOK"),
        os.environ.get("JPY_SESSION_NAME"),
        ns.get("__vsc_ipynb_file__"),
        ns.get("__session__"),
    ):
        if isinstance(raw, str) and raw.strip():
            return _resolve(raw.strip())
    return None


def find_by_cells(executed: list[str], cwd: Path | None = None) -> tuple[Path | None, str]:
    """The notebook file whose code cells are the cells this kernel executed.

    ``executed`` are the raw sources this kernel ran, the current cell last.
    A candidate must hold the current cell; among those, the ones holding the
    most of the earlier cells win (papermill's injected parameters cell is in
    no file and counts for none). An output copy that names its input
    (papermill's ``metadata.papermill.input_path``, nbconvert's
    ``X.nbconvert.ipynb`` beside ``X.ipynb``) gives way to that input.
    Candidates named on the starting command line are preferred to the other
    files of the working directory. Returns ``(path, where)``, ``where``
    saying how it was found; ``(None, "")`` when no file holds the cell;
    raises :class:`UsageProblem` when several do, equally.
    """
    if not executed:
        return None, ""
    cwd = Path(cwd or Path.cwd()).absolute()
    named = _named_on_command_line()
    local = sorted(p.absolute() for p in cwd.glob("*.ipynb") if p.is_file())
    for candidates, where in (
        (named, "named on the command line that started this kernel"),
        (local, f"found by its cells among the notebooks of {cwd}"),
    ):
        found = _best_match(candidates, executed)
        if len(found) == 1:
            return found[0], where
        if len(found) > 1:
            names = ", ".join(str(p) for p in found[:4])
            raise UsageProblem(
                f"nbdurable cannot tell which notebook this kernel runs: its cells are in "
                f"{names}; set NBDURABLE_NOTEBOOK=<file> for the kernel or name the run "
                "with `%step run NAME`"
            )
    return None, ""


def _named_on_command_line() -> list[Path]:
    """``.ipynb`` files named on the command lines of the processes that started this one."""
    try:
        import psutil  # ipykernel requires it
    except ImportError:  # pragma: no cover
        return []
    out: list[Path] = []
    try:
        proc = psutil.Process().parent()
        for _ in range(3):  # jupyter -> jupyter-nbconvert, papermill, a wrapping shell
            if proc is None:
                break
            args, base = proc.cmdline(), Path(proc.cwd())
            for arg in args[1:]:
                arg = arg.split("=", 1)[-1] if arg.startswith("-") else arg
                if arg.endswith(".ipynb"):
                    path = Path(os.path.abspath(base / Path(arg).expanduser()))
                    if path.is_file() and path not in out:
                        out.append(path)
            proc = proc.parent()
    except (psutil.Error, OSError):  # gone, or not ours to read
        pass
    return out


def _code_sources(path: Path) -> tuple[list[str], dict[str, Any]] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        cells = data.get("cells", [])
        sources = []
        for cell in cells:
            if cell.get("cell_type") == "code":
                src = cell.get("source", "")
                sources.append(("".join(src) if isinstance(src, list) else src).strip())
        return sources, data.get("metadata") or {}
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _best_match(candidates: list[Path], executed: list[str]) -> list[Path]:
    current = executed[-1].strip()
    scored: dict[Path, int] = {}
    meta: dict[Path, dict[str, Any]] = {}
    for path in candidates:
        read = _code_sources(path)
        if read is None or current not in read[0]:
            continue
        sources = set(read[0])
        scored[path] = sum(1 for src in executed if src.strip() in sources)
        meta[path] = read[1]
    if not scored:
        return []
    # Copies give way before scoring: papermill's output holds the injected
    # parameters cell, so it would hold more of the executed cells than its input.
    inputs = set(scored)
    copies = set()
    for p in scored:
        pm = meta[p].get("papermill")
        src = pm.get("input_path") if isinstance(pm, dict) else None
        if isinstance(src, str):  # as papermill was given it: from its cwd, or ours
            named = {
                Path(os.path.abspath(d / Path(src).expanduser())) for d in (p.parent, Path.cwd())
            }
            if named & (inputs - {p}):
                copies.add(p)
        if p.name.endswith(".nbconvert.ipynb"):
            if p.with_name(p.name.removesuffix(".nbconvert.ipynb") + ".ipynb") in inputs:
                copies.add(p)
    kept = {p: n for p, n in scored.items() if p not in copies} or scored  # copies of each other
    top = max(kept.values())
    return [p for p, n in kept.items() if n == top]


def _resolve(raw: str) -> Path:
    path = Path(raw).expanduser()
    if path.is_absolute():
        return path
    # jupyter_server gives a path relative to its root when it knows no file
    # name; the kernel's working directory is the notebook's own directory.
    if path.exists():
        return path.absolute()
    if Path(path.name).exists():
        return Path(path.name).absolute()
    return path.absolute()


def store_dir(notebook: Path | None) -> Path:
    """The store directory for ``notebook``."""
    env = os.environ.get("NBDURABLE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    base = notebook.parent if notebook is not None else Path.cwd()
    return (base / ".nbdurable").absolute()


def run_id_for(notebook: Path | None, store: Path) -> str:
    """The run id of ``notebook`` in the store at ``store``."""
    if notebook is None:
        return DEFAULT_RUN
    nb = Path(os.path.abspath(notebook))
    try:
        return nb.relative_to(Path(os.path.abspath(store)).parent).as_posix()
    except ValueError:
        return nb.as_posix()


@dataclass(frozen=True)
class StepCell:
    """A ``%%step`` cell as saved in the notebook file."""

    index: int
    cell_id: str | None
    name: str | None
    body: str

    @property
    def key(self) -> str:
        """The key a kernel running this saved cell computes (see :mod:`.keys`)."""
        return self._key_label[0]

    @property
    def label(self) -> str:
        """Display label of the cell."""
        return self._key_label[1]

    @functools.cached_property
    def _key_label(self) -> tuple[str, str]:
        # Once per cell read: a view asks each cell's key and label, and the name's
        # check (secrets among others) is not free on a notebook of thousands of steps.
        from .keys import step_key

        cid = None if self.name else self.cell_id
        return step_key(self.name, cid, self.index, self.body)


class NotebookFile:
    """The saved notebook, re-read only when its file changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.ids_persist = False
        self.cells: list[StepCell] = []
        #: the other code cells: (position, source), in order (what a Run All runs between steps)
        self.plain: list[tuple[int, str]] = []
        self._fps: list[str] | None = None  # source fingerprints of `cells`, made once per read

    def refresh(self) -> bool:
        """Re-read the file if it changed; False if it cannot be read."""
        try:
            st = self.path.stat()
        except OSError:
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return True
        parsed = _read_saved(self.path)
        if parsed is None:
            return False
        self._stamp = stamp
        self.ids_persist = parsed.ids_persist
        # Copies: a reader may consume its lists (the status rows pop the plain cells).
        self.cells, self.plain = list(parsed.cells), list(parsed.plain)
        self._fps = None
        return True

    def find_all(self, body: str) -> list[StepCell]:
        """Every saved ``%%step`` cell whose body matches ``body``, in order."""
        if self._fps is None:
            self._fps = [source_fingerprint(c.body) for c in self.cells]
        fp = source_fingerprint(body)
        return [c for c, saved in zip(self.cells, self._fps, strict=True) if saved == fp]

    def find(self, body: str, position: int | None = None) -> StepCell | None:
        """The first saved ``%%step`` cell whose body matches ``body``, if any.

        With ``position`` (a runner said where the cell is), only the cell there.
        Identical cells are told apart by the session (``Session._find_saved``,
        by occurrence, over :meth:`find_all`).
        """
        if self._fps is None:  # once per read of the file, not once per step
            self._fps = [source_fingerprint(c.body) for c in self.cells]
        fp = source_fingerprint(body)
        found = [
            c
            for c, saved in zip(self.cells, self._fps, strict=True)
            if (position is None or c.index == position) and saved == fp
        ]
        return found[0] if found else None


class _Saved(NamedTuple):
    ids_persist: bool
    cells: tuple[StepCell, ...]
    plain: tuple[tuple[int, str], ...]


#: Saved notebooks read lately: path -> (the digest of the file's bytes, what they hold). Every view
#: makes a NotebookFile of its own (the side panel on each poll, the widget panel on
#: each refresh); a file that holds the same bytes as when last read is not parsed
#: again, and its cells keep their keys (a notebook of thousands of steps costs tens
#: of milliseconds to parse). Compared by content, not by modification time: two
#: saves within the clock's granularity are told apart.
_SAVED: dict[Path, tuple[bytes, _Saved]] = {}
_SAVED_MAX = 16
_SAVED_LOCK = threading.Lock()


def _read_saved(path: Path) -> _Saved | None:
    """What the notebook file at ``path`` holds (None: unreadable), parsed once per content."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    digest = hashlib.sha256(raw).digest()
    with _SAVED_LOCK:
        hit = _SAVED.get(path)
    if hit is not None and hit[0] == digest:
        return hit[1]
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        return None
    major, minor = data.get("nbformat", 4), data.get("nbformat_minor", 0)
    ids_persist = (major, minor) >= (4, 5)
    cells = step_cells(data.get("cells", []), ids_persist)
    steps = {c.index for c in cells}
    plain = tuple(
        (i, "".join(src) if isinstance(src := cell.get("source", ""), list) else src)
        for i, cell in enumerate(data.get("cells", []))
        if cell.get("cell_type") == "code" and i not in steps
    )
    saved = _Saved(ids_persist, tuple(cells), plain)
    with _SAVED_LOCK:
        _SAVED.pop(path, None)
        _SAVED[path] = (digest, saved)
        while len(_SAVED) > _SAVED_MAX:
            del _SAVED[next(iter(_SAVED))]
    return saved


def step_cells(cells: list[dict[str, Any]], ids_persist: bool = True) -> list[StepCell]:
    """The ``%%step`` cells among nbformat cell dicts, in order."""
    out: list[StepCell] = []
    for i, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(src)
        first, _, body = src.partition("\n")
        m = stepline.STEP_LINE.match(first)
        if not m:
            continue
        try:
            name = stepline.parse(m.group(1)).name
        except UsageProblem:  # the magic refuses this cell: it never runs as a step
            continue
        out.append(StepCell(i, cell.get("id") if ids_persist else None, name, body))
    return out
