"""The yardstick: a notebook run with nbdurable against the same notebook run plain.

A *case* is a list of cells written for nbdurable: ``%%step NAME`` cells,
``step(id, fn, *args)`` calls, ``@recorded`` functions, ``idempotency_key()``.
The harness puts a prelude cell first and a probe cell last:

- the prelude loads the extension and imports the sub-step API, and defines
  ``tick(tag)``, which appends ``tag`` to ``calls.log`` beside the notebook:
  a case calls it inside every function that stands for a costly or
  effectful call, so the harness can count the calls really made;
- the probe cell prints ``expr => value`` for each of the case's probe
  expressions, in a canonical text (sets sorted, so hash order is no
  difference), e.g. ``a``, ``a is b``, ``isinstance(m, Model)``.

The *plain* notebook is derived from the case, never written by hand: the
``%load_ext nbdurable`` line and every ``%%step`` header line are removed,
and the import becomes plain stand-ins (``step = lambda _id, fn, *a, **k:
fn(*a, **k)``, ``recorded = lambda fn: fn``), so a plain run needs no
nbdurable at all.

Outputs are compared cell by cell, byte for byte, after normalization:
execution counts go (they count differently across a kernel restart), and
so does what nbdurable says about itself, which a plain run cannot say: its
replay notes (``display_data`` with ``metadata.nbdurable``) and its
warnings (``NbdurableWarning`` lines on stderr). Traceback frames go too
(they name files of this machine); the exception's type and message stay.

The verdict on a durable run (see :func:`verdict`): it passes when its
outputs equal the plain run's, or when nbdurable *said* a step's body ran
again (a note other than "replayed", or a warning saying the body/step
"runs again") and the probe values still equal the plain run's. Anything
else is a silent difference, the one outcome nbdurable promises never to
produce.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest

# tests/ holds kernel_util; pytest puts only this folder on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_util import make_notebook, normalize_outputs, run_notebook  # noqa: E402

NOTEBOOK = "case.ipynb"
CALLS = "calls.log"

PRELUDE = (
    "%load_ext nbdurable\n"
    "from nbdurable import step, recorded, idempotency_key\n"
    "import os as __os\n"
    f"def tick(tag, __log=__os.path.abspath({CALLS!r})):\n"
    "    with open(__log, 'a') as __f:\n"
    "        __f.write(str(tag) + '\\n')"
)

PLAIN_API = (
    "step = lambda _id, fn, *a, **k: fn(*a, **k)\n"
    "recorded = lambda fn: fn\n"
    "idempotency_key = lambda name='': 'plain-key-' + name"
)

_PROBE = """\
def __canon(v, seen=()):
    if id(v) in seen:
        return '<cycle>'
    seen = seen + (id(v),)
    if isinstance(v, (set, frozenset)):
        inner = sorted(__canon(x, seen) for x in v)
        return type(v).__name__ + '{' + ', '.join(inner) + '}'
    if type(v) in (list, tuple):
        return type(v).__name__ + '[' + ', '.join(__canon(x, seen) for x in v) + ']'
    if type(v) is dict:
        items = (__canon(k, seen) + ': ' + __canon(x, seen) for k, x in v.items())
        return '{' + ', '.join(items) + '}'
    return repr(v)
for __e in __PROBES:
    try:
        __v = __canon(eval(__e))
    except Exception as __x:
        __v = '!! ' + type(__x).__name__
    print(__e, '=>', __v)
"""

_STEP_HEADER = re.compile(r"^\s*%%step\b")
_IMPORT_API = re.compile(r"^\s*from nbdurable import ")
_WARNING_BLOCK = re.compile(r"^[^\n]*NbdurableWarning: [^\n]*\n", re.M)
#: The one line saying which run a kernel records to, printed once per kernel.
_RUN_LINE = re.compile(r"^nbdurable: [^\n]*\n", re.M)
_CELL_FILE = re.compile(r"\S*(?:ipykernel_\d+/\d+\.py|<ipython-input-[^>]*>):\d+")
_RERUN_TEXT = re.compile(r"runs? again|reran|reruns|not replayable", re.I)


def probe_cell(probes: list[str]) -> str:
    """The last cell: one ``expr => canonical value`` line per probe expression."""
    return f"__PROBES = {probes!r}\n" + _PROBE


def durable_cells(cells: list[str], probes: list[str]) -> list[str]:
    """The durable notebook of a case: prelude, its cells, the probe cell."""
    return [PRELUDE, *cells, probe_cell(probes)]


def plain_cell(source: str) -> str:
    """`source` without nbdurable: no ``%load_ext``, no ``%%step`` header, plain API."""
    lines = source.split("\n")
    if lines and _STEP_HEADER.match(lines[0]):
        lines = lines[1:]
    out = []
    for line in lines:
        if line.strip() == "%load_ext nbdurable":
            continue
        out.append(PLAIN_API if _IMPORT_API.match(line) else line)
    return "\n".join(out)


def plain_cells(cells: list[str], probes: list[str]) -> list[str]:
    """The plain notebook derived from a case (see the module docstring)."""
    return [plain_cell(c) for c in durable_cells(cells, probes)]


@dataclass
class Run:
    """One execution of a notebook in a fresh kernel, as the harness sees it."""

    sources: list[str]
    outputs: list[list[dict[str, Any]]]  # normalized, per cell
    notes: list[list[str]]  # what nbdurable said about each cell
    calls: list[str]  # tags ticked during this run, in order

    @property
    def probe(self) -> str:
        """The probe cell's text."""
        return "".join(o.get("text", "") for o in self.outputs[-1] if o["output_type"] == "stream")

    def replayed(self, index: int) -> bool:
        """Whether nbdurable replayed cell `index` (its replay note is there)."""
        return "replayed" in self.notes[index]

    def step_cells(self) -> list[int]:
        """Indexes of the ``%%step`` cells."""
        return [i for i, s in enumerate(self.sources) if _STEP_HEADER.match(s)]

    def said_rerun(self) -> bool:
        """Whether nbdurable said some step's body ran again instead of replaying."""
        return any(
            note != "replayed" and (note.startswith("note:") or _RERUN_TEXT.search(note))
            for notes in self.notes
            for note in notes
        )


@dataclass
class Workdir:
    """A notebook's folder: its file, its store, the files it reads, its call log."""

    path: Path
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def write(self, files: dict[str, str | bytes]) -> None:
        """Write files beside the notebook (a module, a data file), as a user edits them."""
        for name, content in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
            # A rewrite within the same clock tick must still look new to mtime checks.
            st = target.stat()
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))

    def calls(self) -> list[str]:
        """Every tag ticked so far in this folder."""
        log = self.path / CALLS
        return log.read_text().split() if log.exists() else []

    def run(
        self,
        sources: list[str],
        *,
        durable: bool,
        env: dict[str, str] | None = None,
        hashseed: str = "0",
        nbformat_minor: int = 5,
    ) -> Run:
        """Save `sources` as the notebook and run it in a fresh kernel.

        Durable runs record into ``store/`` in this folder (NBDURABLE_DIR) and
        name the notebook (NBDURABLE_NOTEBOOK), as ``nbdurable run`` does.
        PYTHONHASHSEED is fixed (``hashseed``) so that a plain and a durable
        run print sets alike; a restart corpus varies it on purpose.
        """
        nb_path = self.path / NOTEBOOK
        kernel_env = {"PYTHONHASHSEED": hashseed, **self.env, **(env or {})}
        if durable:
            kernel_env["NBDURABLE_DIR"] = str(self.path / "store")
            kernel_env["NBDURABLE_NOTEBOOK"] = str(nb_path)
        before = len(self.calls())
        for attempt in range(3):
            nb = make_notebook(sources, nbformat_minor=nbformat_minor)
            nbformat.write(nb, str(nb_path))
            try:
                done = run_notebook(
                    nb,
                    cwd=self.path,
                    env=kernel_env,
                    allow_errors=True,
                    timeout=180,
                    startup_timeout=180,
                )
                break
            except RuntimeError as exc:
                # A kernel that dies before answering kernel_info ran no cell: on a
                # loaded machine two kernels starting at once can race for a TCP
                # port (ZMQError: Address already in use). Start another.
                if "kernel_info" not in str(exc) or attempt == 2:
                    raise
        outputs, notes = [], []
        for cell in done.cells:
            visible, said = split_outputs(cell.get("outputs", []))
            outputs.append(visible)
            notes.append(said)
        return Run(list(sources), outputs, notes, self.calls()[before:])


def split_outputs(raw: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """``(normalized outputs a plain run could show, what nbdurable said)``.

    nbdurable speaks through ``display_data`` carrying ``metadata.nbdurable``
    (its ``note``, e.g. "replayed") and through ``NbdurableWarning`` on stderr.
    A display note other than "replayed" is reported as ``note:<kind>``.
    """
    kept: list[dict[str, Any]] = []
    said: list[str] = []
    for out in normalize_outputs(raw, execution_count=False):
        md = out.get("metadata", {}).get("nbdurable") if isinstance(out, dict) else None
        if out.get("output_type") == "display_data" and isinstance(md, dict):
            note = str(md.get("note", ""))
            said.append(note if note == "replayed" else f"note:{note}")
            continue
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            text = out["text"]
            said.extend(m.group(0).strip() for m in _WARNING_BLOCK.finditer(text))
            text = _CELL_FILE.sub("<cell>", _WARNING_BLOCK.sub("", _RUN_LINE.sub("", text)))
            if not text:
                continue
            out = {**out, "text": text}
        if out.get("output_type") == "error":
            out = {"output_type": "error", "ename": out["ename"], "evalue": out["evalue"]}
        kept.append(out)
    # Removing a note may leave two chunks of one stream side by side: merge them.
    return normalize_outputs(kept, execution_count=False), said


def verdict(plain: Run, got: Run, *, rerun_ok: bool = True) -> str | None:
    """None if `got` is faithful to `plain` (see the module docstring), else what differs.

    Without `rerun_ok` (a first durable run, where nothing can replay) only
    equal outputs pass.
    """
    if got.outputs == plain.outputs:
        return None
    if rerun_ok and got.said_rerun() and got.probe == plain.probe:
        return None
    for i, (p, g) in enumerate(zip(plain.outputs, got.outputs, strict=True)):
        if p != g:
            first = got.sources[i].split("\n", 1)[0][:60]
            return (
                f"cell {i} ({first!r}) differs from the plain run"
                + (
                    " (nbdurable said a body reran, but the probe differs)"
                    if got.said_rerun()
                    else ""
                )
                + f":\n  plain:   {_show(p)}\n  durable: {_show(g)}\n"
                + f"  nbdurable said: {got.notes[i]}"
            )
    return "outputs differ"  # pragma: no cover - zip covers every cell


def _show(outputs: list[dict[str, Any]]) -> str:
    text = json.dumps(outputs, ensure_ascii=False)
    return text if len(text) < 1200 else text[:1200] + "..."


def params(cases: list[Any], fails_today: dict[str, str]) -> list[Any]:
    """``pytest.param`` per case (``id``, ``category``), strict xfail for those that fail today.

    Strict: when a fix makes a case pass, its entry must go from `fails_today`.
    """
    unknown = set(fails_today) - {c.id for c in cases}
    assert not unknown, f"fails_today names no case: {sorted(unknown)}"
    out = []
    for case in cases:
        marks = []
        if case.id in fails_today:
            marks.append(pytest.mark.xfail(strict=True, reason=fails_today[case.id]))
        out.append(pytest.param(case, id=f"{case.category}:{case.id}", marks=marks))
    return out


def check_plain(plain: Run) -> None:
    """A case must run cleanly without nbdurable: otherwise the case itself is wrong."""
    errors = [
        (i, o) for i, outs in enumerate(plain.outputs) for o in outs if o["output_type"] == "error"
    ]
    assert not errors, f"the plain run of this case fails: {errors}"
    assert plain.probe, "the probe cell printed nothing"
