"""Running one library notebook of the corpus plain, durable and replayed, and judging its cases.

See test_libcov.py for what is checked; libcov_cases.py for the cases. A notebook is
built from the cases of one library:

* cell 0, plain: ``%load_ext nbdurable`` and the library's imports (``LIBS``);
* per case: ``%%step make_<case>`` (declare), ``%%step change_<case>``
  (change), then a plain cell (read);
* last, the probe: every user variable in a canonical text, one line each.

A case's variables all start with ``<case>_`` (the sources write ``P_``), so
its probe lines are told apart from the other cases' and no two cases share
a name.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
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

from kernel_util import REPO_ROOT, kernel_name, normalize_outputs, private_sockets  # noqa: E402
from libcov_cases import CASES, LIBS, Case  # noqa: E402

#: seconds one cell may run before it counts as a hang (it is then interrupted)
CELL_TIMEOUT = 15
#: seconds a whole notebook may run before it counts as a hang (its kernel is then stopped)
NOTEBOOK_TIMEOUT = 420

_STEP = re.compile(r"^\s*%%step\b[^\n]*\n?")
_STEP_NAME = re.compile(r"^\s*%%step\s+([^\s-][^\s]*)")
_PREFIX = re.compile(r"\bP_")


def expand(source: str, case: Case) -> str:
    """`source` with its ``P_`` names made the case's own (``P_km`` -> ``sk_kmeans_km``)."""
    return _PREFIX.sub(case.name + "_", source.strip("\n"))


def plain_source(source: str) -> str:
    """`source` without nbdurable: no ``%load_ext nbdurable`` line, no ``%%step`` header."""
    source = _STEP.sub("", source, count=1) if _STEP.match(source) else source
    return "\n".join(ln for ln in source.split("\n") if ln.strip() != "%load_ext nbdurable")


# -- the probe: every variable in a canonical text ------------------------------------------

PROBE = r"""
def __libcov_probe():
    import dataclasses, datetime, hashlib, sys, types
    ip = get_ipython()
    hidden = set(ip.user_ns_hidden)
    mods = sys.modules
    np, pd, pl, torch = (mods.get(m) for m in ("numpy", "pandas", "polars", "torch"))

    def digest(b):
        return hashlib.sha256(b).hexdigest()[:12]

    def get(module, dotted):
        obj = mods.get(module)
        for part in dotted.split("."):
            obj = getattr(obj, part, None) if obj is not None else None
        return obj

    def inst(v, module, dotted):
        cls = get(module, dotted)
        return isinstance(cls, type) and isinstance(v, cls)

    def fields(v, names, depth):
        out = []
        for n in names:
            try:
                x = getattr(v, n)
            except Exception as exc:
                x = "!" + type(exc).__name__
            if callable(x) and not isinstance(x, type):
                try:
                    x = x()
                except Exception as exc:
                    x = "!" + type(exc).__name__
            out.append(n + "=" + canon(x, depth + 1))
        return type(v).__qualname__ + "(" + ", ".join(out) + ")"

    def canon(v, depth=0):
        if depth > 5:
            return "..."
        if v is None or isinstance(v, (bool, int, str)):
            return repr(v)[:300]
        if isinstance(v, bytes):
            return "bytes(%d, %s)" % (len(v), digest(v))
        if isinstance(v, float):
            return repr(round(v, 9))
        if isinstance(v, complex):
            return repr(complex(round(v.real, 9), round(v.imag, 9)))
        if isinstance(v, (list, tuple)) and type(v) in (list, tuple) or (
            isinstance(v, tuple) and hasattr(v, "_fields")
        ):
            inner = ", ".join(canon(x, depth + 1) for x in list(v)[:30])
            return type(v).__name__ + "[" + inner + (", ..." if len(v) > 30 else "") + "]"
        if isinstance(v, dict) and type(v).__module__ in ("builtins", "collections"):
            items = list(v.items())[:40]
            return type(v).__name__ + "{" + ", ".join(
                canon(k, depth + 1) + ": " + canon(x, depth + 1) for k, x in items) + "}"
        if isinstance(v, (set, frozenset)):
            return type(v).__name__ + "{" + ", ".join(sorted(canon(x, depth + 1) for x in v)) + "}"
        if isinstance(v, datetime.datetime) and depth > 0:
            # a library's own timestamp (a store item's created_at): when it ran, not what
            return "<datetime>"
        if isinstance(v, (datetime.date, datetime.time, datetime.timedelta)):
            return repr(v)
        if isinstance(v, type):
            return "class " + v.__module__ + "." + v.__qualname__
        if isinstance(v, types.ModuleType):
            return "module " + v.__name__
        if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
            return "function " + getattr(v, "__qualname__", "?")
        if np is not None and isinstance(v, np.ndarray):
            if v.dtype == object:
                return "ndarray(object, %s)[%s]" % (v.shape, canon(v.ravel().tolist(), depth + 1))
            data = np.ascontiguousarray(v).tobytes()
            return "ndarray(%s, %s, %s)" % (v.dtype, v.shape, digest(data))
        if np is not None and isinstance(v, np.generic):
            return canon(v.item(), depth)
        if pd is not None and isinstance(v, (pd.DataFrame, pd.Series, pd.Index)):
            text = v.to_frame().to_csv() if isinstance(v, pd.Index) else v.to_csv()
            return type(v).__name__ + "(%s, %s, %s)" % (
                v.shape, digest(text.encode()), canon(getattr(v, "attrs", {}), depth + 1))
        if pd is not None and isinstance(v, pd.Categorical):
            return "Categorical(%s, %s)" % (canon(list(v.categories), depth + 1),
                                            canon(v.codes, depth + 1))
        if pl is not None and isinstance(v, pl.DataFrame):
            return "pl.DataFrame(%s, %s, %s)" % (v.shape, canon(dict(v.schema), depth + 1),
                                                 digest(v.write_csv().encode()))
        if pl is not None and isinstance(v, pl.Series):
            return "pl.Series(%r, %s, %s)" % (v.name, v.dtype, digest(repr(v.to_list()).encode()))
        if pl is not None and isinstance(v, pl.LazyFrame):
            return "pl.LazyFrame(%s)" % digest(v.explain(optimized=False).encode())
        if pl is not None and isinstance(v, pl.Expr):
            return "pl.Expr(%s)" % str(v)
        if torch is not None and isinstance(v, torch.Tensor):
            t = v.detach().cpu()
            grad = None if v.grad is None else canon(v.grad, depth + 1)
            return "Tensor(%s, %s, %s, rg=%s, grad=%s)" % (
                t.dtype, tuple(t.shape), digest(t.contiguous().numpy().tobytes()),
                v.requires_grad, grad)
        if torch is not None and isinstance(v, torch.nn.Module):
            return "%s(training=%s, %s)" % (type(v).__qualname__, v.training,
                                           canon(dict(v.state_dict()), depth + 1))
        if torch is not None and isinstance(v, torch.optim.Optimizer):
            return "%s(%s)" % (type(v).__qualname__, canon(v.state_dict(), depth + 1))
        if torch is not None and inst(v, "torch", "optim.lr_scheduler.LRScheduler"):
            sd = {k: x for k, x in v.state_dict().items() if k != "_get_lr_called_within_step"}
            return "%s(%s)" % (type(v).__qualname__, canon(sd, depth + 1))
        if torch is not None and isinstance(v, torch.Generator):
            return "Generator(%s)" % canon(v.get_state(), depth + 1)
        if torch is not None and isinstance(v, torch.Size):
            return "Size" + repr(tuple(v))
        if inst(v, "sklearn", "base.BaseEstimator"):
            # timings (cv_results_'s mean_fit_time, refit_time_) differ on every run
            fitted = {k: ({a: b for a, b in x.items() if "time" not in a}
                          if isinstance(x, dict) else x)
                      for k, x in sorted(vars(v).items())
                      if k.endswith("_") and not k.startswith("_") and "time" not in k}
            return "%s(%s, fitted=%s)" % (type(v).__qualname__,
                                          canon(v.get_params(deep=False), depth + 1),
                                          canon(fitted, depth + 1))
        if inst(v, "astropy", "units.Quantity"):
            return "Quantity(%s, %r)" % (canon(np.asarray(v.value), depth + 1), str(v.unit))
        if inst(v, "astropy", "time.Time"):
            return "Time(%s, %s, %s)" % (v.scale, v.format, canon(np.asarray(v.jd), depth + 1))
        if inst(v, "astropy", "time.TimeDelta"):
            return "TimeDelta(%s, %s)" % (v.format, canon(np.asarray(v.jd), depth + 1))
        if inst(v, "astropy", "table.Table"):
            text = "\n".join(v.pformat(max_lines=-1, max_width=-1))
            return "%s(%s, %s)" % (type(v).__qualname__, canon(dict(v.meta), depth + 1),
                                   digest(text.encode()))
        if inst(v, "astropy", "coordinates.SkyCoord"):
            return "SkyCoord(%s, %s)" % (v.frame.name, digest(repr(v).encode()))
        if inst(v, "astropy", "wcs.WCS"):
            return "WCS(%s, %r)" % (v.pixel_shape, v.to_header_string())
        if inst(v, "astropy", "units.UnitBase"):
            return "Unit(%r)" % v.to_string()
        if inst(v, "matplotlib", "figure.Figure"):
            return "Figure(%s, axes=%s, texts=%s)" % (
                canon(v.get_size_inches(), depth + 1), canon(v.axes, depth + 1),
                canon(v.texts, depth + 1))
        if inst(v, "matplotlib", "axes.Axes"):
            return "Axes(%s)" % canon({
                "title": v.get_title(), "xlabel": v.get_xlabel(), "ylabel": v.get_ylabel(),
                "xlim": v.get_xlim(), "ylim": v.get_ylim(), "xscale": v.get_xscale(),
                "lines": v.lines, "patches": len(v.patches), "texts": v.texts,
                "images": v.images, "collections": len(v.collections),
                "legend": v.get_legend(),
            }, depth + 1)
        if inst(v, "matplotlib", "lines.Line2D"):
            return fields(v, ["get_xydata", "get_color", "get_linewidth", "get_linestyle",
                              "get_label", "get_marker"], depth)
        if inst(v, "matplotlib", "text.Text"):
            return fields(v, ["get_text", "get_position", "get_color", "get_fontsize"], depth)
        if inst(v, "matplotlib", "image.AxesImage"):
            return fields(v, ["get_array", "get_clim", "get_extent"], depth) + v.get_cmap().name
        if inst(v, "matplotlib", "legend.Legend"):
            return "Legend(%s)" % canon([t.get_text() for t in v.get_texts()], depth + 1)
        if inst(v, "matplotlib", "patches.Patch"):
            return fields(v, ["get_verts", "get_facecolor", "get_edgecolor", "get_label"], depth)
        if inst(v, "matplotlib", "colors.Colormap"):
            return "%s(%r, %s, %s, %s, %s)" % (
                type(v).__qualname__, v.name, v.N, canon(v(np.linspace(0, 1, v.N)), depth + 1),
                canon(v.get_under(), depth + 1), canon(v.get_over(), depth + 1))
        if inst(v, "matplotlib", "colors.Normalize"):
            return fields(v, ["vmin", "vmax", "clip"], depth)
        if inst(v, "matplotlib", "artist.Artist"):
            return fields(v, ["get_visible", "get_label", "get_zorder", "get_alpha"], depth)
        if inst(v, "plotly", "basedatatypes.BaseFigure"):
            return "%s(%s)" % (type(v).__qualname__, digest(v.to_json().encode()))
        if inst(v, "plotly", "basedatatypes.BasePlotlyType"):
            return "%s(%s)" % (type(v).__qualname__, canon(v.to_plotly_json(), depth + 1))
        if inst(v, "seaborn", "axisgrid.Grid"):
            return "%s(%s)" % (type(v).__qualname__, canon(v.figure, depth + 1))
        if inst(v, "langgraph", "checkpoint.base.BaseCheckpointSaver"):
            rows = []
            for t in v.list(None):
                rows.append((t.config["configurable"].get("thread_id"),
                             t.metadata.get("step"), t.checkpoint.get("channel_values")))
            return "%s(%s)" % (type(v).__qualname__, canon(sorted(rows, key=repr), depth + 1))
        if hasattr(v, "model_dump") and not isinstance(v, type):
            try:
                return type(v).__qualname__ + canon(v.model_dump(), depth + 1)
            except Exception:
                pass
        if dataclasses.is_dataclass(v):
            return type(v).__qualname__ + canon(
                {f.name: getattr(v, f.name, "?") for f in dataclasses.fields(v)}, depth + 1)
        attrs = mods.get("attr")
        if attrs is not None and attrs.has(type(v)):
            return type(v).__qualname__ + canon(
                {a.name: getattr(v, a.name, "?") for a in attrs.fields(type(v))}, depth + 1)
        if isinstance(v, (list, tuple, dict)):
            base = list if isinstance(v, list) else tuple if isinstance(v, tuple) else dict
            return type(v).__qualname__ + ":" + canon(base(v), depth + 1)
        if callable(v) and not hasattr(v, "__dict__"):
            return "callable " + type(v).__qualname__
        state = dict(getattr(v, "__dict__", None) or {})
        for cls in type(v).__mro__:
            slots = getattr(cls, "__slots__", ())
            for s in (slots,) if isinstance(slots, str) else slots:
                if s not in ("__dict__", "__weakref__") and hasattr(v, s):
                    state[s] = getattr(v, s)
        state = {k: x for k, x in sorted(state.items())
                 if not callable(x) or isinstance(x, type)}
        return "<%s %s>" % (type(v).__qualname__, canon(state, depth + 2))

    for name in sorted(ip.user_ns):
        if name.startswith("_") or name in hidden or name in ("In", "Out", "exit", "quit"):
            continue
        try:
            text = canon(ip.user_ns[name])
        except Exception as exc:
            text = "!! " + type(exc).__name__ + ": " + str(exc)[:100]
        print(name, "=>", text)
__libcov_probe()
del __libcov_probe
"""

#: IPython startup file of the durable runs: nbdurable's step events, one JSON line each.
STARTUP = r"""
def _libcov_events():
    import json
    import os

    path = os.environ.get("LIBCOV_EVENTS")
    if not path:
        return
    log = open(path, "a", buffering=1)  # opened before any step: not a step's output
    from nbdurable import events

    def listener(e):
        if e.kind.startswith("step-"):
            data = {k: str(v)[:400] for k, v in e.data.items() if k != "record"}
            log.write(json.dumps({"kind": e.kind, "step": e.step, "data": data}) + "\n")

    events.subscribe(listener)


_libcov_events()
del _libcov_events
"""


# -- the notebook ---------------------------------------------------------------------------


@dataclass
class Layout:
    """A library's notebook and which cells belong to which case."""

    nb: NotebookNode
    cells: dict[str, list[int]]  # case -> its cell indexes (make, change, read)


def build(lib: str) -> Layout:
    """The durable notebook of library `lib` (see the module docstring)."""
    sources = ["%load_ext nbdurable\n" + LIBS[lib].strip("\n")]
    cells: dict[str, list[int]] = {}
    for case in (c for c in CASES if c.lib == lib):
        at = len(sources)
        sources.append(f"%%step make_{case.name}\n" + expand(case.declare, case))
        sources.append(f"%%step change_{case.name}\n" + expand(case.change, case))
        sources.append(expand(case.read, case))
        cells[case.name] = [at, at + 1, at + 2]
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return Layout(nb, cells)


def derive(nb: NotebookNode, transform) -> NotebookNode:
    out = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in out.cells:
        cell.source = transform(cell.source)
    return out


# -- running --------------------------------------------------------------------------------


@dataclass
class Run:
    """One execution of a notebook (plus the probe) in a fresh kernel."""

    label: str
    sources: list[str]
    outputs: list[list[dict[str, Any]]]
    seconds: float
    durations: dict[int, float]
    error: str | None = None  # the run stopped: dead kernel, notebook timeout
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def probe(self) -> dict[str, str]:
        text = "".join(
            o.get("text", "") for o in self.outputs[-1] if o.get("output_type") == "stream"
        )
        lines = (ln.split(" => ", 1) for ln in text.splitlines() if " => " in ln)
        return {name: text_norm(value) for name, value in lines}

    def replayed(self, index: int) -> bool:
        return any(
            (o.get("metadata", {}).get("nbdurable") or {}).get("note") == "replayed"
            for o in self.outputs[index]
        )

    def said(self, index: int) -> str:
        """nbdurable's warnings and notes in cell `index`, one line."""
        lines = []
        for o in self.outputs[index]:
            if o.get("output_type") == "stream" and o.get("name") == "stderr":
                lines += [m.group(1) for m in _WARNING.finditer(o["text"])]
            note = (o.get("metadata", {}).get("nbdurable") or {}).get("note")
            if note and note != "replayed":
                text = (o.get("data") or {}).get("text/plain", note)
                lines.append("".join(text) if isinstance(text, list) else str(text))
        return "; ".join(lines)

    def why(self, step: str) -> str:
        """Why step `step` ran again, from nbdurable's events (or "")."""
        for e in self.events:
            if e["kind"] == "step-invalidated" and step in e["data"].get("label", ""):
                return e["data"].get("reason", "")
        return ""


def run(nb: NotebookNode, label: str, cwd: Path, *, durable: bool, ipython_dir: Path) -> Run:
    """Run `nb` plus the probe cell in a fresh kernel in `cwd`."""
    nb = derive(nb, lambda s: s)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE.strip()))
    path = cwd / "nb.ipynb"
    nbformat.write(nb, str(path))
    events = cwd / "events.jsonl"
    env = dict(os.environ)
    for var in (
        "NBDURABLE_DIR",
        "NBDURABLE_STORE",
        "NBDURABLE_NOTEBOOK",
        "NBDURABLE_RUN",
        "PYTEST_CURRENT_TEST",
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_TESTRUNUID",
        "JPY_SESSION_NAME",
    ):
        env.pop(var, None)
    env.update(
        {
            # one environment for every run: a step may read any variable
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "IPYTHONDIR": str(ipython_dir),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
    )
    if durable:
        env["NBDURABLE_DIR"] = str(cwd / "store")
        env["NBDURABLE_NOTEBOOK"] = str(path)
        env["LIBCOV_EVENTS"] = str(events)
    began: dict[int, float] = {}
    durations: dict[int, float] = {}

    def on_execute(cell, cell_index, **_):
        began[cell_index] = time.monotonic()

    def on_executed(cell, cell_index, **_):
        durations[cell_index] = time.monotonic() - began.get(cell_index, time.monotonic())

    error = None
    t0 = time.monotonic()
    with private_sockets() as sockets:
        client = NotebookClient(
            nb,
            timeout=CELL_TIMEOUT,
            interrupt_on_timeout=True,
            kernel_name=kernel_name(),
            allow_errors=True,
            startup_timeout=180,
            resources={"metadata": {"path": str(cwd)}},
            config=Config({"KernelManager": sockets}),
            on_cell_execute=on_execute,
            on_cell_executed=on_executed,
        )

        async def go(c: NotebookClient) -> None:
            await asyncio.wait_for(c.async_execute(env=env), NOTEBOOK_TIMEOUT)

        try:
            asyncio.run(go(client))
        except (asyncio.TimeoutError, TimeoutError):
            error = f"the notebook ran longer than {NOTEBOOK_TIMEOUT} s"
        except DeadKernelError:
            error = "the kernel died"
        except CellTimeoutError:
            error = f"a cell ran longer than {CELL_TIMEOUT} s"
        except CellExecutionError as exc:  # not with allow_errors, but say so if it happens
            error = str(exc).strip().splitlines()[-1][:200]
        except RuntimeError as exc:
            if "dead" in str(exc).lower() or "died" in str(exc).lower():
                error = "the kernel died"
            else:
                raise
    del client
    gc.collect()
    outputs = [list(c.get("outputs", [])) for c in nb.cells]
    evs = []
    if events.exists():
        evs = [json.loads(x) for x in events.read_text().splitlines() if x.strip()]
        events.unlink()
    return Run(
        label, [c.source for c in nb.cells], outputs, time.monotonic() - t0, durations, error, evs
    )


# -- normalizing ----------------------------------------------------------------------------

_WARNING = re.compile(r"^[^\n]*NbdurableWarning: ([^\n]*)\n(?:[ \t]+[^\n]*\n)?", re.M)
_RUN_LINE = re.compile(r"^nbdurable: [^\n]*\n?", re.M)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CELL_FILE = re.compile(r"\S*(?:ipykernel_\d+/\d+\.py|<ipython-input-[^>]*>):\d+")
_TMP = re.compile(re.escape(tempfile.gettempdir()) + r"/libcov-[^/\s'\"]+/\w+")


def text_norm(text: str) -> str:
    """`text` without what differs between any two runs: addresses, UUIDs, cell file names."""
    text = _ADDRESS.sub("0x?", text)
    text = _UUID.sub("<uuid>", text)
    text = _CELL_FILE.sub("<cell>", text)
    return _TMP.sub("<dir>", text)


def norm_cell(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A cell's outputs as a plain run shows them: nbdurable's notes and warnings removed."""
    kept: list[dict[str, Any]] = []
    for out in normalize_outputs(raw, execution_count=False):
        kind = out.get("output_type")
        if (out.get("metadata") or {}).get("nbdurable") is not None:
            continue
        if kind == "stream":
            text = out["text"]
            if out.get("name") == "stderr":
                text = _WARNING.sub("", _RUN_LINE.sub("", text))
            text = text_norm(text)
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
                    value = text_norm(value)
                else:
                    value = json.loads(text_norm(json.dumps(value, sort_keys=True)))
                data[mime] = value
            kept.append({"output_type": kind, "data": data})
    return normalize_outputs(kept, execution_count=False)


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


def diff(p: list[dict[str, Any]], g: list[dict[str, Any]]) -> str:
    """Where outputs `g` first differ from `p`, in one line."""
    pl, gl = _flat(p).splitlines(), _flat(g).splitlines()
    for a, b in zip(pl, gl, strict=False):
        if a != b:
            at = next(
                (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
            start = max(0, at - 60)
            return f"plain {a[start : at + 80]!r} / durable {b[start : at + 80]!r}"
    longer = pl[len(gl) :] if len(pl) > len(gl) else gl[len(pl) :]
    who = "plain has" if len(pl) > len(gl) else "durable has"
    return f"{who} more: {' | '.join(longer)[:200]!r}"


# -- judging --------------------------------------------------------------------------------


@dataclass
class LibResult:
    """What the runs of one library's notebook found: per case, None (passed) or its problem."""

    lib: str
    problems: dict[str, str | None]
    seconds: dict[str, float]
    runs: dict[str, Run] = field(default_factory=dict)


def judge_lib(lib: str, keep: bool = False) -> LibResult:
    """Run library `lib`'s notebook plain, durable and replayed, and judge each of its cases."""
    layout = build(lib)
    base = Path(tempfile.mkdtemp(prefix=f"libcov-{lib}-"))
    ipython_dir = base / "ipython"
    startup = ipython_dir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-libcov-events.py").write_text(STARTUP)
    try:
        (base / "plain").mkdir()
        (base / "durable").mkdir()
        plain = run(
            derive(layout.nb, plain_source),
            "plain",
            base / "plain",
            durable=False,
            ipython_dir=ipython_dir,
        )
        first = run(layout.nb, "durable", base / "durable", durable=True, ipython_dir=ipython_dir)
        again = run(layout.nb, "replay", base / "durable", durable=True, ipython_dir=ipython_dir)
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    runs = {"plain": plain, "durable": first, "replay": again}
    problems = {
        name: judge_case(name, cells, plain, first, again) for name, cells in layout.cells.items()
    }
    return LibResult(lib, problems, {k: round(r.seconds, 1) for k, r in runs.items()}, runs)


def judge_case(name: str, cells: list[int], plain: Run, first: Run, again: Run) -> str | None:
    """The first problem of case `name` (see test_libcov.py), or None."""
    for r in (plain, first, again):
        for i in cells:
            if r.durations.get(i, 0.0) >= CELL_TIMEOUT:
                return (
                    f"hang: cell {i} of the {r.label} run ran {CELL_TIMEOUT} s and was interrupted"
                )
        if r.error and any(i not in r.durations for i in cells):
            return f"the {r.label} run stopped before the case ran: {r.error}"
    for i in cells:
        errors = [o for o in plain.outputs[i] if o.get("output_type") == "error"]
        if errors:
            e = errors[0]
            return f"the case is broken: cell {i} fails plain: {e['ename']}: {e['evalue']}"
    prefix = name + "_"
    pp = {k: v for k, v in plain.probe.items() if k.startswith(prefix)}
    if not pp:
        return f"the case is broken: the plain probe shows no variable {prefix}*"
    for r in (first, again):
        for i in cells:
            pn, gn = norm_cell(plain.outputs[i]), norm_cell(r.outputs[i])
            if pn != gn:
                said = r.said(i)
                note = f" [nbdurable said: {said[:200]}]" if said else ""
                return f"{r.label} run: cell {i} differs: {diff(pn, gn)}{note}"
        gp = {k: v for k, v in r.probe.items() if k.startswith(prefix)}
        for k in sorted(set(pp) | set(gp)):
            if pp.get(k) != gp.get(k):
                return (
                    f"{r.label} run: variable {k} differs: plain {pp.get(k, '<unbound>')[:150]!r}"
                    f" / durable {gp.get(k, '<unbound>')[:150]!r}"
                )
    for i in cells[:2]:
        step = _STEP_NAME.match(again.sources[i]).group(1)
        if not again.replayed(i):
            why = again.why(step) or again.said(i)
            if not why and first.said(i):
                why = "recorded not replayable: " + first.said(i)
            return f"step {step!r} reran in the replay run: {why or 'no reason given'}"[:400]
    return None
