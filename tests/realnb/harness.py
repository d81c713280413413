"""Real public notebooks, run plain and durable, killed and edited.

Each notebook of the corpus (``adapted/<name>.ipynb``, made from
``original/<name>.ipynb`` as SOURCES.md says) is judged by five checks, all
against one plain run (and one plain run of the edited notebook):

``plain``
    (a) the notebook without nbdurable (its ``%load_ext nbdurable`` line and
    ``%%step`` header lines removed, ``from nbdurable import ...`` replaced
    by stand-ins that just call the function) runs to the end: the original
    program works against the fake model server.
``durable``
    (b) the notebook in a fresh store: the same outputs and probed values as
    plain, the same model requests.
``replay``
    (c) again, in a fresh kernel on the same store: every step replays, no
    model request is sent, the same outputs and values as plain. A step may
    take the rule's other branch instead, its body running again, only with
    nbdurable's line in its cell saying why and no request sent from it
    (reported apart: ``Result.reran``).
``resume``
    (d) in another fresh store, the kernel is SIGKILLed in the middle of the
    step that makes the most model requests (by the server, when request
    ``k+1`` of that step arrives: ``k`` had returned), or for a notebook that
    makes none, in its longest step by the work done: once the step's body
    has started (nbdurable's ``step-start`` event) and the kernel and its
    child processes have spent half the CPU time the plain run's kernel spent
    in that cell (see :func:`tree_cpu`; wall time depends on the machine's
    load, and on a busy machine the kill came after the step had finished).
    Spinning BLAS threads make CPU time a loose measure of progress: if the
    step still finishes first, the kill is tried again in a fresh store at
    the moment its body starts. Then run again: no
    request that had returned is sent again, and the outputs and values are
    those of plain. In a notebook that makes requests side by side
    (``Spec.concurrent``), a request had returned if its whole answer was
    written :data:`RETURNED_BEFORE` seconds before the kill; the others were
    in flight (unanswered, or answered an instant ago and not yet read).
``edit``
    (e) on the store of (c), after one realistic edit (``Spec.edit``, e.g. a
    prompt): the edited step and the steps named in ``Spec.reruns`` run
    again, every other step replays (or runs again as in (c), with its line
    and no request), and outputs and values equal a plain run of the edited
    notebook (nothing stale).

Every run gets a fresh kernel (``PYTHONHASHSEED=0``), the same fake server
(``fake_server.FakeServer``, reset between runs, so the base URL a notebook
reads from ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL`` never changes) and a
probe cell appended last, which prints each user variable of the namespace
in a canonical text (data by value, arrays and frames by a digest, other
objects by type). Durable runs also get an IPython startup file (not a cell)
that logs nbdurable's events (a step invalidated, and why) to a file, so a
step that ran again can be reported with nbdurable's own reason.

Outputs are compared cell by cell after normalization: execution counts,
nbdurable's own notes and warnings, memory addresses, UUIDs, timings and
wall-clock stamps (epoch seconds) go, and a cell's stderr may land at
another place among its stdout (ipykernel flushes the two on timers of their
own);
so do the fake server's answer numbers and ids where a run legitimately
makes other requests than the plain run (the resumed and edited runs, and
notebooks that call the model from several threads at once), and there too
the numbers scikit-learn gives its HTML displays (a process's count of them,
which replayed displays do not advance).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from traitlets.config import Config

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from fake_server import FakeServer, mask  # noqa: E402
from kernel_util import REPO_ROOT, kernel_name, normalize_outputs, private_sockets  # noqa: E402

ORIGINAL = HERE / "original"
ADAPTED = HERE / "adapted"
SUPPORT = HERE / "support"
CHECKS = ("plain", "durable", "replay", "resume", "edit")
#: In a notebook that makes requests side by side, a request had returned before the kill
#: if the server wrote its whole answer this many seconds before (see _resume).
RETURNED_BEFORE = 0.5

_STEP = re.compile(r"^\s*%%step\b[^\n]*\n?")
_STEP_NAME = re.compile(r"^\s*%%step\s+([^\s-][^\s]*)")
_IMPORT_API = re.compile(r"^(\s*)from nbdurable import [^\n]*$", re.M)
PLAIN_API = (
    "step = lambda _id, fn, *a, **k: fn(*a, **k)\n"
    "{indent}recorded = lambda fn: fn\n"
    "{indent}idempotency_key = lambda name='': 'plain-key-' + name"
)


@dataclass(frozen=True)
class Spec:
    """One notebook of the corpus and how it is judged."""

    name: str
    #: (old, new): the realistic edit of check (e); `old` occurs in exactly one cell.
    edit: tuple[str, str]
    #: the steps that must run again after the edit, besides the edited one
    reruns: tuple[str, ...] = ()
    #: modules the notebook imports that are not in nbdurable's test extra
    needs: tuple[str, ...] = ()
    #: the notebook calls the model from several threads or tasks at once: answer
    #: numbers depend on the schedule, so they are masked in every comparison
    concurrent: bool = False
    timeout: int = 120


# -- deriving the notebooks ----------------------------------------------------------------


def load(spec: Spec) -> NotebookNode:
    """The adapted notebook of `spec`, outputs cleared."""
    nb = nbformat.read(ADAPTED / f"{spec.name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def plain_source(source: str) -> str:
    """`source` without nbdurable (see the module docstring)."""
    source = _STEP.sub("", source, count=1) if _STEP.match(source) else source
    lines = [ln for ln in source.split("\n") if ln.strip() != "%load_ext nbdurable"]
    source = "\n".join(lines)
    return _IMPORT_API.sub(lambda m: m.group(1) + PLAIN_API.format(indent=m.group(1)), source)


def derive(nb: NotebookNode, transform) -> NotebookNode:
    out = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in out.cells:
        if cell.cell_type == "code":
            cell.source = transform(cell.source)
    return out


def edited(nb: NotebookNode, edit: tuple[str, str]) -> tuple[NotebookNode, int]:
    """`nb` with the edit applied, and the index of the edited cell."""
    old, new = edit
    hits = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and old in c.source]
    assert len(hits) == 1, f"the edit's text {old!r} is in cells {hits}, not in exactly one"
    out = derive(nb, lambda s: s)
    out.cells[hits[0]].source = out.cells[hits[0]].source.replace(old, new)
    return out, hits[0]


def step_name(source: str) -> str | None:
    m = _STEP_NAME.match(source)
    return m.group(1) if m else None


PROBE = r"""
def __realnb_probe():
    import hashlib, sys, types
    ip = get_ipython()
    hidden = set(ip.user_ns_hidden)
    np = sys.modules.get("numpy")
    pd = sys.modules.get("pandas")

    def canon(v, depth=0):
        if depth > 4:
            return "..."
        if v is None or isinstance(v, (bool, int, str, bytes)):
            return repr(v)[:400]
        if isinstance(v, float):
            return repr(round(v, 9))
        if isinstance(v, (list, tuple)):
            inner = ", ".join(canon(x, depth + 1) for x in list(v)[:30])
            return type(v).__name__ + "[" + inner + (", ..." if len(v) > 30 else "") + "]"
        if isinstance(v, dict):
            items = list(v.items())[:30]
            return "{" + ", ".join(canon(k, depth + 1) + ": " + canon(x, depth + 1)
                                   for k, x in items) + "}"
        if isinstance(v, (set, frozenset)):
            return type(v).__name__ + "{" + ", ".join(sorted(canon(x, depth + 1) for x in v)) + "}"
        if np is not None and isinstance(v, np.ndarray):
            if v.dtype == object:
                return "ndarray(object, %s)" % (v.shape,)
            h = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()[:12]
            return "ndarray(%s, %s, %s)" % (v.dtype, v.shape, h)
        if np is not None and isinstance(v, np.generic):
            return repr(v.item())[:400]
        if pd is not None and isinstance(v, (pd.DataFrame, pd.Series, pd.Index)):
            text = v.to_frame().to_csv() if isinstance(v, pd.Index) else v.to_csv()
            h = hashlib.sha256(text.encode()).hexdigest()[:12]
            return type(v).__name__ + "(%s, %s)" % (v.shape, h)
        if isinstance(v, type):
            return "class " + v.__qualname__
        if isinstance(v, types.ModuleType):
            return "module " + v.__name__
        if callable(v) and not hasattr(v, "model_dump"):
            return "callable " + type(v).__name__
        if hasattr(v, "model_dump") and not isinstance(v, type):
            try:
                return type(v).__qualname__ + canon(v.model_dump(), depth + 1)
            except Exception:
                pass
        return "<" + type(v).__qualname__ + ">"

    for name in sorted(ip.user_ns):
        if name.startswith("_") or name in hidden or name in ("In", "Out", "exit", "quit"):
            continue
        try:
            text = canon(ip.user_ns[name])
        except Exception as exc:
            text = "!! " + type(exc).__name__
        print(name, "=>", text)
__realnb_probe()
del __realnb_probe
"""

STARTUP = r"""
def _realnb_events():
    import json
    import os

    path = os.environ.get("REALNB_EVENTS")
    if not path:
        return
    # Opened here, before any step: a file a step writes to through a file opened
    # before it began is not one of its outputs (docs/steps.md, Files).
    log = open(path, "a", buffering=1)
    try:
        from nbdurable import events
    except Exception as exc:
        log.write(json.dumps({"kind": "no-events", "data": {"error": repr(exc)}}) + "\n")
        return
    kinds = ("step-invalidated", "step-start", "step-failed", "step-recorded")

    def listener(e):
        if e.kind in kinds:
            data = {k: str(v) for k, v in e.data.items()}
            log.write(json.dumps({"kind": e.kind, "step": e.step, "data": data}) + "\n")

    events.subscribe(listener)


_realnb_events()
del _realnb_events
"""


# -- running ------------------------------------------------------------------------------


@dataclass
class Run:
    """One execution of a notebook in a fresh kernel."""

    label: str
    sources: list[str]
    outputs: list[list[dict[str, Any]]]  # raw, per cell (code cells; markdown: [])
    requests: list[dict[str, Any]]  # what the server got during this run
    per_cell: dict[int, tuple[int, int]]  # cell index -> (requests before, after)
    seconds: float
    error: str | None = None  # a cell raised (CellExecutionError's first lines)
    died: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)
    durations: dict[int, float] = field(default_factory=dict)  # cell index -> seconds
    #: cell index -> CPU seconds the kernel (and its child processes) spent in it
    cpu: dict[int, float] = field(default_factory=dict)

    @property
    def probe(self) -> str:
        return "".join(
            o.get("text", "") for o in self.outputs[-1] if o.get("output_type") == "stream"
        )

    def replayed(self, index: int) -> bool:
        return any(
            o.get("output_type") == "display_data"
            and (o.get("metadata", {}).get("nbdurable") or {}).get("note") == "replayed"
            for o in self.outputs[index]
        )

    def steps(self) -> dict[int, str]:
        """Cell index -> step name, for the ``%%step NAME`` cells."""
        return {i: n for i, s in enumerate(self.sources) if (n := step_name(s))}

    def said(self, index: int) -> str:
        """nbdurable's warnings in cell `index`, one line."""
        lines = []
        for o in self.outputs[index]:
            if o.get("output_type") == "stream" and o.get("name") == "stderr":
                lines += [m.group(1) for m in _WARNING.finditer(o["text"])]
        return "; ".join(lines)

    def why(self, name: str) -> str:
        """Why step `name` ran again, from nbdurable's events (or "")."""
        for e in self.events:
            if e.get("kind") == "step-invalidated" and name in str(e.get("data", {}).get("label")):
                return e["data"].get("reason", "")
        return ""


class Runner:
    """Runs the notebooks of one spec, in its own folder and with its own fake server."""

    def __init__(self, spec: Spec, base: Path) -> None:
        self.spec = spec
        self.base = base
        self.server = FakeServer(lifetime=1800, max_requests=5000).start()
        self.ipython_dir = base / "ipython"
        startup = self.ipython_dir / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-realnb-events.py").write_text(STARTUP)

    def close(self) -> None:
        self.server.stop()

    def workdir(self, label: str) -> Path:
        path = self.base / label
        if not path.exists():
            path.mkdir(parents=True)
            support = SUPPORT / self.spec.name
            # support files are kept as NAME.txt (third-party code, unchanged: no linter
            # reformats it) and put beside the notebook as NAME
            for f in support.glob("*.txt") if support.is_dir() else ():
                shutil.copyfile(f, path / f.name[: -len(".txt")])
        return path

    def run(
        self,
        nb: NotebookNode,
        label: str,
        *,
        durable: bool,
        folder: str,
        reset: bool = True,
        kill: tuple[int, int] | None = None,
        kill_step: str | None = None,
    ) -> Run:
        """Run `nb` (plus the probe cell) in folder `folder` and return what happened.

        `kill`: ``(cell index, m)``: SIGKILL the kernel when the server gets
        request ``m + 1`` of that cell (``m`` returned); with ``m <= 0`` and
        `kill_step` (the step's name), once that step's body has started and the
        kernel has spent ``-m`` milliseconds of CPU time since (see :func:`kill_in_step`).
        """
        if reset:
            self.server.reset()
        cwd = self.workdir(folder)
        nb = derive(nb, lambda s: s)
        nb.cells.append(nbformat.v4.new_code_cell(PROBE.strip()))
        path = cwd / "notebook.ipynb"
        nbformat.write(nb, str(path))
        # one path for every run: an environment variable is an input of a step that
        # copies the environment (some SDKs do), so nothing in it may differ between runs
        events = self.base / "events.jsonl"
        env = dict(os.environ)
        env.update(
            {
                "PYTHONHASHSEED": "0",
                "OPENAI_BASE_URL": self.server.openai_base_url,
                "OPENAI_API_KEY": "dummy-openai-key",
                "ANTHROPIC_BASE_URL": self.server.anthropic_base_url,
                "ANTHROPIC_API_KEY": "dummy-anthropic-key",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1",
                "OPENAI_AGENTS_DISABLE_TRACING": "1",
                "ANONYMIZED_TELEMETRY": "False",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                "IPYTHONDIR": str(self.ipython_dir),
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
        )
        volatile = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID")
        for var in ("NBDURABLE_DIR", "NBDURABLE_STORE", "NBDURABLE_NOTEBOOK", "NBDURABLE_RUN"):
            env.pop(var, None)
        for var in volatile:
            env.pop(var, None)
        if durable:
            env["NBDURABLE_DIR"] = str(cwd / "store")
            env["NBDURABLE_NOTEBOOK"] = str(path)
            env["REALNB_EVENTS"] = str(events)
        per_cell: dict[int, tuple[int, int]] = {}
        starts: dict[int, int] = {}
        watchers: list[threading.Thread] = []
        start_n = self.server.n
        client_box: list[NotebookClient] = []

        def pid() -> int:
            return client_box[0].km.provisioner.pid

        began: dict[int, float] = {}
        durations: dict[int, float] = {}
        cpu_began: dict[int, float] = {}
        cpu: dict[int, float] = {}
        done = threading.Event()  # the cell to kill in has finished (the watcher stops)

        def on_execute(cell, cell_index, **_):
            starts[cell_index] = self.server.n
            began[cell_index] = time.monotonic()
            cpu_began[cell_index] = tree_cpu(pid())
            if kill is not None and kill[0] == cell_index:
                if kill_step is None:
                    self.server.kill_at = (self.server.n + kill[1] + 1, pid())
                else:
                    budget = -kill[1] / 1000
                    args = (pid(), events, kill_step, budget, done)
                    t = threading.Thread(target=kill_in_step, args=args, daemon=True)
                    t.start()
                    watchers.append(t)

        def on_executed(cell, cell_index, **_):
            per_cell[cell_index] = (starts.get(cell_index, self.server.n), self.server.n)
            durations[cell_index] = time.monotonic() - began.get(cell_index, time.monotonic())
            cpu[cell_index] = tree_cpu(pid()) - cpu_began.get(cell_index, 0.0)
            if kill is not None and kill[0] == cell_index:
                done.set()

        error = None
        died = False
        t0 = time.monotonic()
        with private_sockets() as sockets:
            client = NotebookClient(
                nb,
                timeout=self.spec.timeout,
                kernel_name=kernel_name(),
                allow_errors=False,
                startup_timeout=180,
                resources={"metadata": {"path": str(cwd)}},
                config=Config({"KernelManager": sockets}),
                on_cell_execute=on_execute,
                on_cell_executed=on_executed,
            )
            client_box.append(client)
            try:
                # asyncio.run: the loop is closed after, not left to the collector
                asyncio.run(client.async_execute(env=env))
            except DeadKernelError:
                died = True
            except CellExecutionError as exc:
                error = _first_error(str(exc))
            except CellTimeoutError:
                error = f"a cell ran longer than {self.spec.timeout} s"
            except RuntimeError as exc:  # nbclient: the kernel died while it was busy
                if "Kernel died" in str(exc) or "dead" in str(exc).lower():
                    died = True
                else:
                    raise
        done.set()
        for t in watchers:
            t.join()
        del client, client_box[:]
        gc.collect()
        seconds = time.monotonic() - t0
        self.server.kill_at = None
        requests = [r for r in self.server.requests if r["n"] > start_n]
        outputs = [list(c.get("outputs", [])) if c.cell_type == "code" else [] for c in nb.cells]
        evs = []
        if events.exists():
            evs = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
            events.unlink()
        return Run(
            label,
            [c.source for c in nb.cells],
            outputs,
            requests,
            per_cell,
            seconds,
            error,
            died,
            evs,
            durations,
            cpu,
        )


def tree_cpu(pid: int) -> float:
    """CPU seconds spent so far by process ``pid`` and its descendants (0.0: gone).

    User and system time of each live process of the tree, plus what the
    children each has waited for spent (a joblib or multiprocessing worker
    that ended). Read from ``/proc``; the work a cell has done, whatever the
    machine's load.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                kids = Path(f"/proc/{p}/task/{task}/children").read_text().split()
            except OSError:
                continue
            todo.extend(int(k) for k in kids)
    return total / tick


def kill_in_step(pid: int, events: Path, step: str, budget: float, done: threading.Event) -> None:
    """SIGKILL ``pid`` in step ``step``: once its body has started (its ``step-start``
    event is in ``events``, see :data:`STARTUP`) and the process tree has spent
    ``budget`` CPU seconds since; nothing if ``done`` is set first.
    """
    start = None
    seen = 0
    while not done.wait(0.005):
        if start is None:
            try:
                with open(events) as f:
                    f.seek(seen)
                    text = f.read()
            except OSError:  # not written yet
                continue
            lines = text.split("\n")
            seen += len(text) - len(lines[-1])  # a line being written is read again
            for line in lines[:-1]:
                e = json.loads(line) if line.strip() else {}
                if e.get("kind") == "step-start" and e.get("data", {}).get("label") == step:
                    start = tree_cpu(pid)
            if start is None:
                continue
        if tree_cpu(pid) - start >= budget:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return


def _first_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = [ln for ln in lines if re.match(r"^\w+(Error|Exception|Exit)\b", ln)]
    return (tail[-1] if tail else lines[-1] if lines else "error")[:300]


# -- normalizing and comparing ---------------------------------------------------------------

_WARNING = re.compile(r"^[^\n]*NbdurableWarning: ([^\n]*)\n", re.M)
_RUN_LINE = re.compile(r"^nbdurable: [^\n]*\n?", re.M)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMING = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:ns|µs|us|ms|s|sec|seconds)\b(?: ± [^\n]*)?|\b\d+:\d\d(?::\d\d)?\b"
)
_CELL_FILE = re.compile(r"\S*(?:ipykernel_\d+/\d+\.py|<ipython-input-[^>]*>):\d+")
_TMP = re.compile(r"/tmp/realnb-[^/\s'\"]+/\w+")
# A wall-clock stamp in epoch seconds (2023 to 2033): litellm stamps each streamed chunk
# with the time it parsed it, so two plain runs differ there, as do a body that ran again
# and the run it replays (the rule's other branch).
_EPOCH = re.compile(r"\b1[78]\d{8}(?:\.\d+)?\b")
# scikit-learn numbers its HTML displays per process (``sk-container-id-2``): where part
# of a run replays and part runs live, a live display gets another number than in plain
# (the replayed ones were not drawn by scikit-learn in this process).
_SK_DISPLAY = re.compile(r"\bsk-(container|estimator)-id-\d+")


def text_norm(text: str, counters: bool) -> str:
    text = _ADDRESS.sub("0x?", text)
    text = _UUID.sub("<uuid>", text)
    text = _TIMING.sub("<time>", text)
    text = _CELL_FILE.sub("<cell>", text)
    text = _TMP.sub("<dir>", text)
    text = _EPOCH.sub("<clock>", text)
    if counters:
        text = mask(text)
        text = _SK_DISPLAY.sub(r"sk-\1-id-?", text)
    return text


def norm_cell(raw: list[dict[str, Any]], counters: bool) -> list[dict[str, Any]]:
    """Outputs of one cell as a plain run could show them (see the module docstring)."""
    kept: list[dict[str, Any]] = []
    for out in normalize_outputs(raw, execution_count=False):
        kind = out.get("output_type")
        if (out.get("metadata") or {}).get("nbdurable") is not None:
            continue
        if kind == "stream":
            text = out["text"]
            if out.get("name") == "stderr":
                text = _WARNING.sub("", _RUN_LINE.sub("", text))
            text = text_norm(text, counters)
            if text:
                kept.append({"output_type": kind, "name": out.get("name"), "text": text})
        elif kind == "error":
            kept.append({"output_type": kind, "ename": out["ename"], "evalue": out["evalue"]})
        else:
            data = {}
            for mime, value in (out.get("data") or {}).items():
                if isinstance(value, list):
                    value = "".join(value)
                if mime.startswith("image/"):
                    value = "sha:" + hashlib.sha256(str(value).encode()).hexdigest()[:12]
                elif mime == "application/vnd.jupyter.widget-view+json":
                    continue
                elif isinstance(value, str):
                    value = text_norm(value, counters)
                data[mime] = value
            kept.append({"output_type": kind, "data": data})
    return normalize_outputs(kept, execution_count=False)


def first_difference(plain: Run, got: Run, counters: bool) -> str | None:
    """None if `got` shows what `plain` showed, cell by cell, else one line saying where not."""
    for i, (p, g) in enumerate(zip(plain.outputs, got.outputs, strict=True)):
        pn, gn = norm_cell(p, counters), norm_cell(g, counters)
        if pn != gn and _stderr_apart(pn) != _stderr_apart(gn):
            first = got.sources[i].strip().split("\n", 1)[0][:50]
            where = "the probe of the values" if i == len(got.outputs) - 1 else f"cell {i}"
            return f"{where} ({first!r}) differs: {_diff(pn, gn)}"
    return None


def _stderr_apart(outputs: list[dict[str, Any]]) -> tuple[Any, str]:
    """A cell's outputs with stderr taken out of their sequence, and stderr's text.

    ipykernel sends stdout and stderr from two buffers, each flushed on a timer of
    its own, so where a warning lands among a cell's prints depends on timing
    (the same cell, run twice plain, can show it first or last); everything else
    keeps its order (a display flushes stdout first).
    """
    rest = [o for o in outputs if not (o["output_type"] == "stream" and o["name"] == "stderr")]
    err = "".join(o["text"] for o in outputs if o not in rest)
    return normalize_outputs(rest, execution_count=False), err


def _diff(p: list[dict[str, Any]], g: list[dict[str, Any]]) -> str:
    ptext, gtext = _flat(p), _flat(g)
    if ptext == gtext:
        return f"plain {json.dumps(p)[:150]} / durable {json.dumps(g)[:150]}"
    pl, gl = ptext.splitlines(), gtext.splitlines()
    for a, b in zip(pl, gl, strict=False):
        if a != b:
            return f"plain {a[:120]!r} / durable {b[:120]!r}"
    if len(pl) != len(gl):
        longer = pl[len(gl) :] if len(pl) > len(gl) else gl[len(pl) :]
        who = "plain has" if len(pl) > len(gl) else "durable has"
        return f"{who} more: {' | '.join(longer)[:200]!r}"
    return "outputs differ"


def _flat(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for o in outputs:
        if o["output_type"] == "stream":
            parts.append(f"[{o['name']}] {o['text']}")
        elif o["output_type"] == "error":
            parts.append(f"[error] {o['ename']}: {o['evalue']}")
        else:
            parts.append(f"[{o['output_type']}] " + json.dumps(o.get("data"), sort_keys=True))
    return "\n".join(parts)


# -- the five checks --------------------------------------------------------------------------


@dataclass
class Result:
    """What the checks found for one notebook: None (passed) or a one-line cause, per check."""

    name: str
    problems: dict[str, str | None] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    #: per check: the steps whose body ran again with nbdurable's line saying why and
    #: no request sent (the rule's other branch: passed, and reported as such)
    reran: dict[str, list[str]] = field(default_factory=dict)


def judge(spec: Spec) -> Result:
    """Run the five checks of `spec` (see the module docstring)."""
    t0 = time.monotonic()
    result = Result(spec.name)
    base = Path(tempfile.mkdtemp(prefix=f"realnb-{spec.name}-"))
    runner = Runner(spec, base)
    try:
        _judge(spec, runner, result)
    finally:
        runner.close()
        result.total = time.monotonic() - t0
        shutil.rmtree(base, ignore_errors=True)
    return result


def _judge(spec: Spec, runner: Runner, result: Result) -> None:
    nb = load(spec)
    plain_nb = derive(nb, plain_source)
    edited_nb, edited_cell = edited(nb, spec.edit)
    plain_edited_nb = derive(edited_nb, plain_source)
    loose = spec.concurrent

    def timed(run: Run) -> Run:
        result.seconds[run.label] = round(run.seconds, 1)
        return run

    plain = timed(runner.run(plain_nb, "plain", durable=False, folder="plain"))
    problem = None
    if plain.died:
        problem = "the plain run's kernel died"
    elif plain.error:
        problem = f"the plain run fails: {plain.error}"
    elif not plain.probe:
        problem = "the plain run's probe printed nothing"
    result.problems["plain"] = problem
    if problem:
        for check in CHECKS[1:]:
            result.problems[check] = "no plain run to compare with"
        return
    # (b) durable, fresh store
    first = timed(runner.run(nb, "durable", durable=True, folder="durable"))
    steps = first.steps()
    result.problems["durable"] = _same(plain, first, loose, fresh=True)

    # (c) durable again, fresh kernel, same store
    again = timed(runner.run(nb, "replay", durable=True, folder="durable"))
    problem = _same(plain, again, loose, fresh=False)
    if problem is None and again.requests:
        problem = f"{len(again.requests)} model request(s) sent on replay: " + _lasts(
            again.requests
        )
    result.problems["replay"] = problem or _reran(
        again, steps, expect=set(), first=first, noted=result.reran.setdefault("replay", [])
    )

    # (d) killed mid-step, resumed
    result.problems["resume"] = _resume(runner, nb, plain, steps, loose)

    # (e) one edit: the edited step and its dependants run again, nothing else
    plain_edited = timed(runner.run(plain_edited_nb, "plain-edited", durable=False, folder="pe"))
    if plain_edited.error or plain_edited.died:
        result.problems["edit"] = f"the edited plain run fails: {plain_edited.error}"
        return
    after = timed(runner.run(edited_nb, "edited", durable=True, folder="durable"))
    problem = _same(plain_edited, after, True, fresh=False)
    expect = {steps[edited_cell]} if edited_cell in steps else set()
    expect |= set(spec.reruns)
    if problem is None:
        problem = _reran(
            after, steps, expect=expect, first=again, noted=result.reran.setdefault("edit", [])
        )
    if problem is None:
        extra = Counter(r["digest"] for r in after.requests) - Counter(
            r["digest"] for r in plain_edited.requests
        )
        if extra:
            problem = "requests a plain run of the edit does not send: " + _lasts(
                [r for r in after.requests if r["digest"] in extra]
            )
    result.problems["edit"] = problem


def _same(plain: Run, got: Run, loose: bool, *, fresh: bool) -> str | None:
    """One line saying how `got` differs from `plain` (outputs, values, requests), or None."""
    if got.died:
        return f"the {got.label} run's kernel died"
    diff = first_difference(plain, got, counters=loose)
    if diff is not None:
        note = f" [nbdurable said: {got.said(_cell_of(diff))}]" if got.said(_cell_of(diff)) else ""
        return diff + note
    if got.error and not plain.error:
        return f"the {got.label} run fails: {got.error}"
    if fresh:
        p = [r["digest"] for r in plain.requests]
        g = [r["digest"] for r in got.requests]
        if (sorted(p) if loose else p) != (sorted(g) if loose else g):
            return (
                f"the durable run sent {len(g)} model requests where the plain run sent {len(p)}"
                f" (first differing: {_first_other(plain.requests, got.requests)})"
            )
    return None


def _cell_of(diff: str) -> int:
    m = re.match(r"cell (\d+)", diff)
    return int(m.group(1)) if m else -1


def _first_other(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    for x, y in zip(a, b, strict=False):
        if x["digest"] != y["digest"]:
            return repr(y["last"][:60])
    longer = a[len(b) :] or b[len(a) :]
    return repr(longer[0]["last"][:60]) if longer else "?"


def _lasts(requests: list[dict[str, Any]]) -> str:
    return ", ".join(repr(r["last"][:50]) for r in requests[:3])


def _reran(
    run: Run, steps: dict[int, str], expect: set[str], first: Run, noted: list[str]
) -> str | None:
    """None if exactly the steps in `expect` ran (did not replay), else which did or did not.

    The rule's other branch passes too: a step whose body ran again with
    nbdurable's line in its cell saying why ("... runs again ...": its record
    cannot be restored, a secret was never written) and that sent no request
    from that cell. Such steps are listed in `noted`. A step invalidated
    without such a line (an input seen as changed) is a failure. The reason
    given is nbdurable's: the step's invalidation event in `run`, its warning
    there, or the warning it gave when `first` recorded it.
    """
    for i, name in steps.items():
        replayed = run.replayed(i)
        if name in expect and replayed:
            return f"step {name!r} replayed after the edit: stale"
        if name not in expect and not replayed:
            line = run.said(i)
            before, after = run.per_cell.get(i, (0, 0))
            if "runs again" in line and after == before and not run.why(name):
                noted.append(f"{name}: {line}"[:300])
                continue
            why = run.why(name) or run.said(i)
            if not why and first.said(i):
                why = "recorded not replayable: " + first.said(i)
            why = why or "no reason given"
            return f"step {name!r} reran: {why}"[:300]
    return None


def _resume(runner: Runner, nb: NotebookNode, plain: Run, steps: dict[int, str], loose) -> str:
    calls = {i: plain.per_cell.get(i, (0, 0)) for i in steps}
    counts = {i: b - a for i, (a, b) in calls.items()}
    target = max(counts, key=lambda i: counts[i]) if counts else None
    if target is None:
        return "the notebook has no step"
    n = counts[target]
    folder = "kill"
    if n > 0:
        killed = runner.run(nb, "killed", durable=True, folder=folder, kill=(target, n // 2))
    else:  # no model request: half way through the longest step, by the CPU it spends
        target = max(steps, key=lambda i: plain.durations.get(i, 0.0))
        budget = int(plain.cpu.get(target, 0.0) * 500)
        for attempt, ms in enumerate((budget, 0)):  # then: as its body starts
            folder = f"kill{attempt}" if attempt else "kill"
            kill = (target, -ms)
            killed = runner.run(
                nb, "killed", durable=True, folder=folder, kill=kill, kill_step=steps[target]
            )
            if killed.died:
                break
    runner.server.killed = False
    if not killed.died:
        return f"the kernel was not killed in step {steps[target]!r} (it finished first)"
    if loose:
        # Requests made side by side (an input guardrail beside its agent): when the kill
        # comes, the others may be unanswered, or answered an instant ago and not yet read
        # by the kernel. A request had returned if its answer was written whole at least
        # RETURNED_BEFORE seconds before the kill; the others were in flight.
        killed_at = runner.server.killed_at or 0.0
        done = [
            r["digest"]
            for r in killed.requests
            if n > 0 and killed_at - r.get("answered", killed_at) >= RETURNED_BEFORE
        ]
        returned = Counter(done)
        inflight = Counter(r["digest"] for r in killed.requests if n > 0) - returned
    else:
        returned = Counter(r["digest"] for r in killed.requests[:-1] if n > 0)
        inflight = Counter([killed.requests[-1]["digest"]] if n > 0 and killed.requests else [])
    resumed = runner.run(nb, "resumed", durable=True, folder=folder, reset=False)
    problem = _same(plain, resumed, True, fresh=False)
    if problem:
        return problem
    sent = Counter(r["digest"] for r in resumed.requests)
    budget = Counter(r["digest"] for r in plain.requests)
    for d, count in (returned + sent).items():
        if count > budget[d] + inflight[d]:
            again = next(r for r in resumed.requests if r["digest"] == d)
            return f"a request that had returned before the kill was sent again: {again['last']!r}"
    return None
