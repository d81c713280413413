"""Run a notebook durably in real kernels: the engine behind ``nbdurable run``.

An *attempt* is a fresh kernel executing the notebook from the top through
nbclient. When the kernel dies, the next attempt starts a new kernel and
runs the notebook from the top again: recorded steps replay, so only the
unfinished work runs. At most ``retries`` deaths are survived.

What the kernel is told, so its keys match interactive use:

- ``NBDURABLE_NOTEBOOK`` = the notebook's absolute path, so the run id is the
  one JupyterLab gives the same file (see :func:`nbdurable.locate.run_id_for`);
- every execute request carries ``{"cellId": <id>, "nbdurable": {"position":
  <index>}}`` in its metadata (jupyter_client copies ``Session.metadata`` into
  each message; the engine reads it from the parent header).

How outcomes are known, without changing what the kernel runs:

- replayed: the cell's outputs hold the engine's replay note
  (``metadata.nbdurable.note == "replayed"``, naming the step key);
- executed / invalidated: the step ran; it is *invalidated* when a record
  existed just before the cell ran (its code, inputs or upstream changed);
- failed: the cell raised; kernel died: the kernel died during the cell;
- calls made: sub-step records whose ``started`` time falls in this attempt
  (read from the store, so a crashed attempt's calls are counted too);
- calls replayed and time saved: asked of the final kernel at the end
  (``engine.get_session().saved``), which counts exactly what it replayed.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import stat
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import CorruptRecord, UsageProblem
from ..identity import locate

EXIT_OK = 0
EXIT_CELL_ERROR = 1
EXIT_USAGE = 2
EXIT_KERNEL_DIED = 3
EXIT_INTERRUPTED = 130

#: What the final kernel replayed: steps, calls, seconds, and its run id.
_SAVED_EXPR = (
    "(lambda m: __import__('json').dumps(None if m is None or m._session is None else "
    "[m._session.saved.steps, m._session.saved.calls, m._session.saved.seconds, "
    "m._session.run_id]))(__import__('sys').modules.get('nbdurable.kernel.session'))"
)


@dataclass
class CellOutcome:
    """What happened to one cell in one attempt (only step cells, failures and deaths)."""

    index: int
    key: str | None  # None: not a %%step cell
    label: str
    outcome: str  # replayed | executed | invalidated | failed | kernel died
    detail: str = ""
    seconds: float = 0.0
    calls_made: int = 0
    calls_replayed: int = 0
    seconds_saved: float = 0.0


@dataclass
class Attempt:
    """One kernel's run through the notebook."""

    number: int
    outcome: str = "running"  # completed | cell error | kernel died | interrupted
    started: float = 0.0
    seconds: float = 0.0
    cells: list[CellOutcome] = field(default_factory=list)
    calls_made: int = 0
    died_in: int | None = None  # cell index (None: before the first cell)
    kernel_log: str = ""


@dataclass
class CellError:
    """The cell that raised, as nbclient reports it."""

    index: int
    label: str
    ename: str
    evalue: str
    message: str  # nbclient's text: the cell's source, then the traceback


@dataclass
class RunResult:
    """Everything ``nbdurable run`` reports."""

    notebook: Path
    output: Path | None
    run_id: str
    store: Path | str | None
    retries: int
    attempts: list[Attempt] = field(default_factory=list)
    error: CellError | None = None
    interrupted: bool = False
    saved: dict[str, Any] | None = None  # the final kernel's savings, if it used nbdurable
    seconds: float = 0.0

    @property
    def deaths(self) -> int:
        """How many times the kernel died."""
        return sum(a.outcome == "kernel died" for a in self.attempts)

    @property
    def status(self) -> str:
        """``ok``, ``cell error``, ``kernel died`` or ``interrupted``."""
        if self.interrupted:
            return "interrupted"
        if self.error is not None:
            return "cell error"
        if not self.attempts or self.attempts[-1].outcome == "kernel died":
            return "kernel died"
        return "ok"

    @property
    def exit_code(self) -> int:
        """0 success, 1 a cell raised, 3 the kernel died more than ``retries`` times."""
        return {
            "ok": EXIT_OK,
            "cell error": EXIT_CELL_ERROR,
            "kernel died": EXIT_KERNEL_DIED,
            "interrupted": EXIT_INTERRUPTED,
        }[self.status]

    @property
    def steps(self) -> Counter[str]:
        """Outcomes of the ``%%step`` cells in the final attempt."""
        last = self.attempts[-1].cells if self.attempts else []
        return Counter(c.outcome for c in last if c.key is not None)

    @property
    def calls_made(self) -> int:
        """Sub-steps recorded over all attempts (calls that really ran and returned)."""
        return sum(a.calls_made for a in self.attempts)

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` summary."""
        saved = self.saved or {}
        return {
            "notebook": str(self.notebook),
            "output": str(self.output) if self.output else None,
            "run": self.run_id,
            "store": str(self.store) if self.store else None,
            "status": self.status,
            "exit_code": self.exit_code,
            "kernel_deaths": self.deaths,
            "retries": self.retries,
            "seconds": round(self.seconds, 3),
            "steps": {
                k: self.steps.get(k, 0)
                for k in ("replayed", "executed", "invalidated", "failed", "kernel died")
            },
            "calls": {"made": self.calls_made, "replayed": saved.get("calls")},
            "seconds_saved": saved.get("seconds"),
            "attempts": [asdict(a) for a in self.attempts],
            "error": asdict(self.error) if self.error else None,
        }


# -- progress -------------------------------------------------------------------


class Progress:
    """Receives what happens during a run; the base class shows nothing."""

    live = False  # True: wants tick() calls with sub-step counts while a step runs

    def begin(self, result: RunResult, cells: int) -> None:
        """The run starts; ``cells`` code cells per attempt."""

    def attempt(self, number: int) -> None:
        """An attempt (a new kernel) starts."""

    def cell_started(self, index: int, label: str | None, done: int) -> None:
        """A code cell starts executing (``label`` None: not a step cell); ``done`` cells ran."""

    def tick(self, subs: int) -> None:
        """Sub-steps recorded so far by the running step (only when ``live``)."""

    def cell_done(self, cell: CellOutcome) -> None:
        """A step cell finished, or any cell failed or lost its kernel."""

    def kernel_died(self, attempt: Attempt, retrying: bool, result: RunResult) -> None:
        """The kernel died during ``attempt``."""

    def end(self, result: RunResult) -> None:
        """The run is over."""


_SYMBOLS = {"replayed": "↻", "executed": "✓", "invalidated": "✓", "failed": "✗", "kernel died": "✗"}
_ASCII = {"replayed": "=", "executed": "+", "invalidated": "+", "failed": "x", "kernel died": "x"}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _secs(t: float) -> str:
    return f"{t:.2f} s" if t < 0.1 else f"{t:.1f} s"


class ConsoleProgress(Progress):
    """One line per step on ``out``; a live bar on ``bar`` when it is a terminal."""

    def __init__(
        self, out: IO[str] | None = None, bar: IO[str] | None = None, live: bool | None = None
    ) -> None:
        self.out = out or sys.stdout
        self.bar = bar or sys.stderr
        self.live = self.bar.isatty() if live is None else live
        self._lock = threading.Lock()
        self._cells = 0
        self._done = 0
        self._label: str | None = None
        self._since = 0.0
        self._subs = 0
        self._drawn = False
        try:
            "".join(_SYMBOLS.values()).encode(getattr(self.out, "encoding", None) or "ascii")
            self._sym = _SYMBOLS
        except (UnicodeEncodeError, LookupError):
            self._sym = _ASCII

    def _line(self, text: str) -> None:
        with self._lock:
            self._clear_bar()
            print(text, file=self.out, flush=True)
            self._draw()

    def _clear_bar(self) -> None:
        if self._drawn:
            self.bar.write("\r\033[K")
            self.bar.flush()
            self._drawn = False

    def _draw(self) -> None:
        if not self.live or self._label is None:
            return
        width = 24
        filled = int(width * self._done / max(self._cells, 1))
        elapsed = time.monotonic() - self._since
        subs = f" · {_plural(self._subs, 'sub-step')}" if self._subs else ""
        text = (
            f"  [{'#' * filled}{'-' * (width - filled)}] {self._done}/{self._cells} cells"
            f" · {self._label}{subs} · {elapsed:4.1f} s"
        )
        self.bar.write("\r\033[K" + text)
        self.bar.flush()
        self._drawn = True

    def begin(self, result: RunResult, cells: int) -> None:
        """Print the run's header line."""
        self._cells = cells
        where = f" in {result.store}" if result.store else ""
        self._line(f"nbdurable run {result.notebook.name} (run {result.run_id!r}{where})")

    def attempt(self, number: int) -> None:
        """Announce a new kernel after a death."""
        if number > 1:
            self._line(
                f"attempt {number}: new kernel, running from the top (recorded steps replay)"
            )

    def cell_started(self, index: int, label: str | None, done: int) -> None:
        """Show the cell on the live bar."""
        with self._lock:
            self._done = done
            self._label = label or f"cell #{index + 1}"
            self._since = time.monotonic()
            self._subs = 0
            self._draw()

    def tick(self, subs: int) -> None:
        """Update the live bar's sub-step count."""
        with self._lock:
            self._subs = subs
            self._draw()

    def cell_done(self, cell: CellOutcome) -> None:
        """Print the step's line: its outcome, time, calls."""
        self._label = None  # the bar returns with the next cell
        if cell.outcome == "replayed":
            calls = (
                f"{_plural(cell.calls_replayed, 'call')} replayed, " if cell.calls_replayed else ""
            )
            info = f"{calls}saved {_secs(cell.seconds_saved)}"
        elif cell.outcome in ("executed", "invalidated"):
            made = [_plural(cell.calls_made, "call") + " made"] if cell.calls_made else []
            replayed = [f"{cell.calls_replayed} replayed"] if cell.calls_replayed else []
            info = ", ".join(made + replayed)
        elif cell.outcome == "kernel died":
            info = f"{_plural(cell.calls_made, 'call')} recorded before it died"
        else:
            info = ""
        detail = f" — {cell.detail}" if cell.detail else ""
        self._line(
            f"  {self._sym[cell.outcome]} {cell.label:<20} {cell.outcome:<12} "
            f"{cell.seconds:6.1f} s  {info}{detail}".rstrip()
        )

    def kernel_died(self, attempt: Attempt, retrying: bool, result: RunResult) -> None:
        """Print where the kernel died and what happens next."""
        self._label = None
        where = (
            "before the first cell"
            if attempt.died_in is None
            else f"in cell #{attempt.died_in + 1}"
        )
        if retrying:
            then = f"restarting ({result.deaths} of {result.retries} retries used)"
        else:
            then = f"no retries left (--retries {result.retries})"
        self._line(f"kernel died {where} after {attempt.seconds:.1f} s; {then}")
        if attempt.kernel_log:
            self._line("  kernel said: " + attempt.kernel_log.replace("\n", "\n  kernel said: "))

    def end(self, result: RunResult) -> None:
        """Print the summary."""
        with self._lock:
            self._label = None
            self._clear_bar()
        steps = result.steps
        saved = result.saved or {}
        parts = [
            f"{steps.get(k, 0)} {k}"
            for k in ("replayed", "executed", "invalidated", "failed")
            if steps.get(k)
        ]
        lines = [
            f"{result.status} in {result.seconds:.1f} s"
            + (
                f" · survived {_plural(result.deaths, 'kernel death')}"
                if result.deaths and result.status != "kernel died"
                else ""
            ),
            "steps: " + (", ".join(parts) or "none"),
            f"calls: {result.calls_made} made, {saved.get('calls', 0)} replayed"
            f" · time saved {saved.get('seconds', 0.0):.1f} s",
        ]
        if result.output is not None:
            lines.append(f"wrote {result.output}")
        self._line("\n".join(lines))


# -- the run ---------------------------------------------------------------------


def read_notebook(path: Path) -> Any:
    """The notebook at ``path`` as an nbformat v4 node; bad input raises :class:`UsageProblem`."""
    if not path.is_file():
        raise UsageProblem(f"no notebook at {path}: check the path (expected an .ipynb file)")
    import nbformat  # slow to import (jsonschema): only once the input is known to be good

    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:  # nbformat raises many types for a file that is not a notebook
        raise UsageProblem(
            f"{path} is not a readable notebook ({type(exc).__name__}: {exc}); "
            "expected Jupyter nbformat 4 JSON"
        ) from None


def _write_atomic(nb: Any, path: Path) -> None:
    """Write the notebook so a crash never leaves a half-written file."""
    import nbformat

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; keep the notebook's own mode, or the usual one.
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _note_of(outputs: list[Any], key: str) -> str | None:
    """The text of the engine's replay note for ``key`` among ``outputs``, if any."""
    for out in outputs:
        md = (out.get("metadata") or {}).get("nbdurable") or {}
        if md.get("note") == "replayed" and md.get("step") == key:
            return str((out.get("data") or {}).get("text/plain", ""))
    return None


def _tail(log: IO[bytes], lines: int = 6) -> str:
    """The end of the kernel's own stdout/stderr, without jupyter's transport notice."""
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    kept = [ln for ln in text.splitlines() if ln.strip() and "without encryption" not in ln]
    return "\n".join(kept[-lines:])


class _Run:
    """One ``nbdurable run``: attempts until the notebook completes or retries run out."""

    def __init__(
        self,
        notebook: Path,
        *,
        output: Path | None,
        retries: int,
        run_name: str | None,
        timeout: int | None,
        cwd: Path,
        kernel: str | None,
        store: Path | str | None,
        env: Mapping[str, str],
        progress: Progress,
        startup_timeout: int,
    ) -> None:
        from ..store import RunKeys

        self.nb = read_notebook(notebook)
        self.notebook = notebook
        self.retries = retries
        self.run_name = run_name
        self.timeout = timeout
        self.cwd = cwd
        self.kernel = kernel
        self.progress = progress
        self.startup_timeout = startup_timeout
        from ..store import engine as store_engine

        # The store: a directory, or a URL (then run ids stay relative to the local
        # directory, as the kernel computes them: see store.engine).
        self.store_target = (
            store_engine.chosen(locate.store_dir(notebook)) if store is None else store
        )
        self.shared = store_engine.is_url(self.store_target)
        self.store_dir = locate.store_dir(notebook) if self.shared else Path(self.store_target)
        run_id = run_name or locate.run_id_for(notebook, self.store_dir)
        self.rk = RunKeys(run_id)
        self.kernel_env = {**os.environ, **env, "NBDURABLE_NOTEBOOK": str(notebook)}
        # Who holds the run's lease, as a second runner is told (see nbdurable.lease).
        self.kernel_env.setdefault("NBDURABLE_HOLDER", f"nbdurable run (pid {os.getpid()})")
        if run_name:
            self.kernel_env["NBDURABLE_RUN"] = run_name
        if store is not None:
            # NBDURABLE_STORE outranks NBDURABLE_DIR in the kernel: set both.
            self.kernel_env["NBDURABLE_STORE"] = str(store)
            if not self.shared:
                self.kernel_env["NBDURABLE_DIR"] = str(store)
        if kernel:
            _check_kernel(kernel, "--kernel")
        elif (self.nb.metadata.get("kernelspec") or {}).get("name"):
            _check_kernel(self.nb.metadata.kernelspec.name, "the notebook's kernelspec")
        self.steps = self._step_cells()
        self.store = self._open_store()
        self.result = RunResult(
            notebook, output, run_id, self.store.path if self.store else None, retries
        )
        # The cell executing now: (index, step key or None, wall-clock start).
        self.current: tuple[int, str | None, float] | None = None
        self.done = 0  # code cells finished in this attempt
        self.interrupted = False

    # -- what the notebook holds ------------------------------------------------
    def _step_cells(self) -> dict[int, tuple[str, str]]:
        ids_persist = (self.nb.nbformat, self.nb.nbformat_minor) >= (4, 5)
        out: dict[int, tuple[str, str]] = {}
        for c in locate.step_cells(self.nb.cells, ids_persist):
            try:
                out[c.index] = (c.key, c.label)
            except UsageProblem:
                pass  # a bad step name: the kernel reports it when it runs the cell
        return out

    def _open_store(self) -> Any:
        """The run's store, opened *before* any kernel starts.

        Opened up front so that the runner and the kernel never race to create
        the store's key file. A notebook that never mentions nbdurable gets no store.
        """
        from ..store import Store

        uses = any("nbdurable" in c.source for c in self.nb.cells if c.cell_type == "code")
        if not (uses or self.steps or self.shared or self.store_dir.exists()):
            return None
        return Store(self.store_target)

    # -- reading the store ----------------------------------------------------------
    def _header(self, key: str) -> dict[str, Any] | None:
        try:
            got = self.store.get(key)
        except CorruptRecord:
            return None
        return None if got is None else got[0]

    def _made_since(self, prefix: str, since: float) -> int:
        """Sub-step records under ``prefix`` started at or after ``since``."""
        if self.store is None:
            return 0
        n = 0
        for k in self.store.scan(prefix):
            h = self._header(k)
            if h is not None and h.get("started", 0) >= since:
                n += 1
        return n

    def _snapshot(self) -> dict[str, Any]:
        """Step states before an attempt, to tell *invalidated* from *executed*."""
        if self.store is None:
            return {}
        from .. import commands

        try:
            infos = commands.step_infos(self.store, self.rk.run_id, self.notebook)
        except UsageProblem:
            return {}
        return {i.key: i for i in infos}

    # -- one attempt ------------------------------------------------------------------
    def attempt(self, number: int) -> Attempt:
        from jupyter_core.utils import run_sync

        return run_sync(self._attempt)(number)

    async def _attempt(self, number: int) -> Attempt:
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

        nb = copy.deepcopy(self.nb)
        kw: dict[str, Any] = {"kernel_name": self.kernel} if self.kernel else {}
        client = NotebookClient(
            nb,
            timeout=self.timeout,
            startup_timeout=self.startup_timeout,
            resources={"metadata": {"path": str(self.cwd)}},
            on_cell_execute=self._stamp,
            **kw,
        )
        self.client, self.nb_out, self.done = client, nb, 0
        att = Attempt(number, started=time.time())
        pre = self._snapshot()
        stop = threading.Event()
        poller = threading.Thread(target=self._poll, args=(stop,), daemon=True)
        if self.progress.live and self.store is not None:
            poller.start()
        t0 = time.perf_counter()
        # The kernel's own stdout/stderr (not the cells': those arrive as outputs)
        # go to a temporary file, shown only if the kernel dies.
        with tempfile.TemporaryFile() as log:
            try:
                async with client.async_setup_kernel(
                    env=self.kernel_env, cwd=str(self.cwd), stdout=log, stderr=log
                ):
                    self._trap_signals()
                    await self._kernel_info(client)
                    try:
                        for index, cell in enumerate(nb.cells):
                            await self._cell(client, att, pre, index, cell)
                        att.outcome = "completed"
                    except CellExecutionError as exc:
                        att.outcome = "cell error"
                        self._cell_error(exc)
                    except CellTimeoutError as exc:
                        att.outcome = "cell error"
                        self._cell_error(exc)
                        # The kernel is still busy with the cell: ask it nothing more,
                        # and do not wait for it to finish before shutting it down.
                        client.shutdown_kernel = "immediate"
                    if client.shutdown_kernel != "immediate":
                        self.result.saved = await self._savings(client)
                    client.set_widgets_metadata()
            except DeadKernelError:
                # nbclient turns a cancelled wait into DeadKernelError, so Ctrl-C lands here too.
                att.outcome = "interrupted" if self.interrupted else "kernel died"
            except asyncio.CancelledError:
                if not self.interrupted:
                    raise
                att.outcome = "interrupted"
            except RuntimeError as exc:
                # jupyter_client: "Kernel died before replying to kernel_info" and
                # startup timeouts. A kernel that cannot start counts as a death.
                if att.outcome != "running" or self.current is not None:
                    raise
                att.outcome = "kernel died"
                att.kernel_log = str(exc)
            finally:
                stop.set()
            if att.outcome == "kernel died":
                att.died_in = self.current[0] if self.current else None
                self._died(att, pre)
                att.kernel_log = "\n".join(p for p in (att.kernel_log, _tail(log)) if p)
        self.current = None
        att.seconds = time.perf_counter() - t0
        att.calls_made = self._made_since(self.rk.base + "u/", att.started)
        return att

    def _stamp(self, cell: Any, cell_index: int) -> None:
        """Hook for nbclient: put the cell's id and index on its execute request."""
        md: dict[str, Any] = {"nbdurable": {"position": cell_index}}
        if cell.get("id"):
            md["cellId"] = cell["id"]
        self.client.kc.session.metadata = md

    def _trap_signals(self) -> None:
        """Ctrl-C / SIGTERM stop the run instead of counting as a kernel death.

        nbclient's own handler only shuts the kernel down, which would look
        exactly like a crash and be retried.
        """
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def stop() -> None:
            self.interrupted = True
            if task is not None:
                task.cancel()

        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop)
        except (RuntimeError, NotImplementedError):  # not the main thread; Windows
            pass

    async def _kernel_info(self, client: Any) -> None:
        from nbclient.util import ensure_async

        msg_id = await ensure_async(client.kc.kernel_info())
        info = await client.async_wait_for_reply(msg_id)
        if info is not None and "language_info" in info["content"]:
            client.nb.metadata["language_info"] = info["content"]["language_info"]

    async def _silent(
        self, client: Any, code: str, expressions: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        from nbclient.util import ensure_async

        msg_id = await ensure_async(
            client.kc.execute(
                code,
                silent=True,
                store_history=False,
                user_expressions=expressions or {},
                stop_on_error=False,
            )
        )
        reply = await client.async_wait_for_reply(msg_id)
        return None if reply is None else reply["content"]

    async def _savings(self, client: Any) -> dict[str, Any] | None:
        """What the kernel replayed (None if the notebook never used nbdurable)."""
        try:
            content = await self._silent(client, "", {"saved": _SAVED_EXPR})
            value = content["user_expressions"]["saved"]["data"]["text/plain"]
            import ast

            data = json.loads(ast.literal_eval(value))
        except Exception:  # best effort: a summary must never turn a success into a failure
            return None
        if data is None:
            return None
        steps, calls, seconds, run_id = data
        return {"steps": steps, "calls": calls, "seconds": round(seconds, 3), "run": run_id}

    async def _cell(
        self, client: Any, att: Attempt, pre: dict[str, Any], index: int, cell: Any
    ) -> None:
        from nbclient.exceptions import CellExecutionError, CellTimeoutError

        if cell.cell_type != "code" or not cell.source.strip():
            return
        key, label = self.steps.get(index, (None, None))
        existed = key is not None and self.store is not None and self.store.has(self.rk.step(key))
        started, t0 = time.time(), time.perf_counter()
        self.current = (index, key, started)
        self.progress.cell_started(index, label, self.done)
        try:
            await client.async_execute_cell(
                cell, index, execution_count=client.code_cells_executed + 1
            )
        except (CellExecutionError, CellTimeoutError) as exc:
            what = (
                f"{exc.ename}: {exc.evalue}" if isinstance(exc, CellExecutionError) else "timed out"
            )
            att.cells.append(
                CellOutcome(
                    index,
                    key,
                    label or f"cell #{index + 1}",
                    "failed",
                    what[:200],
                    time.perf_counter() - t0,
                )
            )
            self.progress.cell_done(att.cells[-1])
            raise
        self.current = None
        self.done += 1
        if key is None:
            return
        out = CellOutcome(index, key, label, "executed", seconds=time.perf_counter() - t0)
        note = _note_of(cell.outputs, key)
        rec = self._header(self.rk.step(key)) if self.store is not None else None
        if note is not None:
            out.outcome = "replayed"
            if rec is not None:
                out.calls_replayed = int(rec.get("substeps", 0))
                out.seconds_saved = float(rec.get("duration", 0.0))
            if "pinned, stale" in note:
                out.detail = "pinned; stale: " + note.split("pinned, stale: ", 1)[1]
        else:
            out.calls_made = self._made_since(self.rk.subs_prefix(key), started)
            if rec is not None:
                out.calls_replayed = max(int(rec.get("substeps", 0)) - out.calls_made, 0)
            before = pre.get(key)
            if before is not None and before.state == "not replayable":
                out.detail = before.detail
            elif existed:
                # A record was there and did not replay. Only a code change (or an
                # upstream clear) shows without a kernel; inputs are judged inside it.
                out.outcome = "invalidated"
                known = before is not None and before.state in ("invalidated", "pinned")
                out.detail = (before.detail if known else "") or "its code or inputs changed"
        att.cells.append(out)
        self.progress.cell_done(out)

    def _cell_error(self, exc: Exception) -> None:
        from nbclient.exceptions import CellExecutionError

        index = self.current[0] if self.current else -1
        key, label = self.steps.get(index, (None, f"cell #{index + 1}"))
        if isinstance(exc, CellExecutionError):
            self.result.error = CellError(index, label, exc.ename, exc.evalue, str(exc))
        else:
            self.result.error = CellError(index, label, "CellTimeoutError", str(exc), str(exc))

    def _died(self, att: Attempt, pre: dict[str, Any]) -> None:
        if self.current is None:
            return
        index, key, started = self.current
        label = self.steps.get(index, (None, f"cell #{index + 1}"))[1]
        made = self._made_since(self.rk.subs_prefix(key), started) if key else 0
        att.cells.append(
            CellOutcome(
                index, key, label, "kernel died", "", time.time() - started, calls_made=made
            )
        )
        self.progress.cell_done(att.cells[-1])

    def _poll(self, stop: threading.Event) -> None:
        """Feed the live bar: sub-steps recorded so far by the running step."""
        while not stop.wait(0.2):
            cur = self.current
            if cur is None:
                continue
            try:
                n = self.store.stats(self.rk.subs_prefix(cur[1]))[0] if cur[1] else 0
            except Exception:  # a display must never break a run
                continue
            self.progress.tick(n)

    # -- all attempts -----------------------------------------------------------------
    def run(self) -> RunResult:
        result = self.result
        code_cells = sum(1 for c in self.nb.cells if c.cell_type == "code" and c.source.strip())
        self.progress.begin(result, code_cells)
        t0 = time.perf_counter()
        try:
            for number in range(1, self.retries + 2):
                self.progress.attempt(number)
                att = self.attempt(number)
                result.attempts.append(att)
                # A Ctrl-C can also reach the kernel and surface as a cell error.
                if att.outcome == "interrupted" or self.interrupted:
                    result.interrupted = True
                    break
                if att.outcome != "kernel died":
                    break
                self.progress.kernel_died(att, result.deaths <= self.retries, result)
        finally:
            result.seconds = time.perf_counter() - t0
            if self.store is not None:
                self.store.close()
        if result.interrupted:
            result.output = None  # the notebook on disk is left as it was
        else:
            target = result.output or self.notebook
            _write_atomic(self.nb_out, target)
            result.output = target
        self.progress.end(result)
        return result


def run_notebook(
    notebook: str | os.PathLike[str],
    *,
    output: str | os.PathLike[str] | None = None,
    retries: int = 3,
    run_name: str | None = None,
    timeout: int | None = None,
    cwd: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    store: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    startup_timeout: int = 60,
    takeover: bool = False,
) -> RunResult:
    """Execute ``notebook`` durably; restart its kernel up to ``retries`` times.

    ``output`` is where the executed notebook is written (default: in place;
    not written when interrupted). ``run_name`` records to a named run
    instead of the notebook's own. ``timeout`` is per cell in seconds (None:
    no limit). ``cwd`` is the kernel's working directory (default: the
    notebook's). ``store`` is the store directory or a ``postgresql://`` URL
    (default: ``NBDURABLE_STORE``, ``NBDURABLE_DIR``, or ``.nbdurable`` beside
    the notebook). ``env`` is added to the kernel's
    environment. ``takeover`` takes the run's lease even from a live holder
    (another kernel recording into the same run). Bad input raises
    :class:`UsageProblem`; everything else is in the returned
    :class:`RunResult` (see its ``exit_code``).
    """
    if retries < 0:
        raise UsageProblem(f"retries must be 0 or more, got {retries}")
    if timeout is not None and timeout <= 0:
        raise UsageProblem(f"timeout must be a positive number of seconds, got {timeout}")
    try:
        path = Path(notebook).expanduser().absolute()
        found = path.is_file()
    except (OSError, RuntimeError):  # too long a name; `~user` of no user
        path, found = Path(notebook), False
    if not found:
        raise UsageProblem(f"no notebook at {path}: check the path (expected an .ipynb file)")
    env = dict(env or {})
    if takeover:
        env["NBDURABLE_TAKEOVER"] = "1"
    if store is None and env.get("NBDURABLE_DIR"):
        store = env["NBDURABLE_DIR"]
    from ..store import engine as store_engine

    store_path: str | Path | None = None
    if store is not None:  # a directory, or a URL of a shared store
        store_path = (
            str(store) if store_engine.is_url(store) else Path(store).expanduser().absolute()
        )
    workdir = Path(cwd).expanduser().absolute() if cwd is not None else path.parent
    if not workdir.is_dir():
        raise UsageProblem(f"--cwd {workdir} is not a directory; give an existing directory")
    out = Path(output).expanduser().absolute() if output is not None else None
    if out is not None and not out.parent.is_dir():
        raise UsageProblem(f"cannot write {out}: its directory {out.parent} does not exist")
    run = _Run(
        path,
        output=out,
        retries=retries,
        run_name=run_name,
        timeout=timeout,
        cwd=workdir,
        kernel=kernel,
        store=store_path,
        env=env,
        progress=progress or Progress(),
        startup_timeout=startup_timeout,
    )
    return run.run()


def _check_kernel(name: str, asked_by: str) -> None:
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        known = ", ".join(sorted(KernelSpecManager().find_kernel_specs())) or "none"
        raise UsageProblem(
            f"{asked_by} names kernel {name!r}, which is not installed (installed kernels: "
            f"{known}); pass --kernel NAME"
        ) from None
