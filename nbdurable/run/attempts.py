"""Run a notebook durably in real kernels: the engine behind ``nbdurable run``.

An *attempt* is a fresh kernel executing the notebook from the top through
nbclient. When the kernel dies, the next attempt starts a new kernel and
runs the notebook from the top again: recorded steps replay, so only the
unfinished work runs. At most ``retries`` deaths are survived.

What the kernel is told, so its keys match interactive use:

- ``NBDURABLE_NOTEBOOK`` = the notebook's absolute path, so the run id is the
  one JupyterLab gives the same file (see :func:`nbdurable.identity.locate.run_id_for`);
- every execute request carries ``{"cellId": <id>, "nbdurable": {"position":
  <index>}}`` in its metadata (jupyter_client copies ``Session.metadata`` into
  each message; the engine reads it from the parent header).

How outcomes are known, without changing what the kernel runs:

- replayed: the cell's outputs hold the engine's replay note
  (``metadata.nbdurable.note == "replayed"``, naming the step key);
- executed / invalidated: the step ran; it is *invalidated* when a record
  existed just before the cell ran (its code, inputs or upstream changed);
- failed: the cell raised; kernel died: the kernel died during the cell;
  stopped at an approval: the cell raised ``ApprovalPending`` (the kernel is
  told ``NBDURABLE_HEADLESS=1``: nobody is there to click), and the run's
  pending approvals are read from the store for the line that names them;
- calls made: sub-step records whose ``started`` time falls in this attempt
  (read from the store, so a crashed attempt's calls are counted too);
- calls replayed and time saved: asked of the kernel after every cell
  (``nbdurable.durable.session.run_summary()``), which counts exactly what it
  replayed; the run's totals add every attempt's (a kernel that died is
  counted up to the last cell it finished). The same answer names the run the
  kernel records into, so after ``%step run other`` the runner reads that run.

The notebook file is written back (in place, or to ``--output``) only when
the run produced results: it ran to the end, or a cell raised or timed out.
A lease refusal, kernel deaths past ``--retries`` and an interrupt leave it
byte for byte as it was.

On POSIX the kernels' sockets are IPC files in a fresh private directory:
over TCP, jupyter_client picks a free port and the kernel binds it a moment
later, and another kernel starting meanwhile (a parameter sweep running
several at once) can take it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageProblem
from ..identity import locate
from ..redact import scrub
from ..text import clip
from .notebook import check_path, kernel_log_tail, read_notebook, replay_note, write_atomic
from .progress import Progress
from .result import Attempt, CellError, CellOutcome, RunResult

#: Asked of the final kernel: nbdurable.durable.session.run_summary(), read through
#: sys.modules so that a kernel that never used nbdurable does not import it now.
_SAVED_EXPR = (
    "(lambda m: __import__('json').dumps(m and m.run_summary()))"
    "(__import__('sys').modules.get('nbdurable.durable.session'))"
)


class _Run:
    """One ``nbdurable run``: attempts until the notebook completes or retries run out."""

    def __init__(
        self,
        notebook: Path,
        *,
        output: Path | None,
        retries: int,
        run_name: str | None,
        timeout: float | None,
        cwd: Path,
        kernel: str | None,
        store: Path | str | None,
        env: Mapping[str, str],
        progress: Progress,
        startup_timeout: int,
        verify: bool = False,
    ) -> None:
        from ..store import RunKeys, RunView

        self.verify = verify

        self.nb = read_notebook(notebook)
        self.notebook = notebook
        self.retries = retries
        self.run_name = run_name
        self.timeout = timeout
        self.cwd = cwd
        self.kernel = kernel
        self.progress = progress
        self.startup_timeout = startup_timeout
        from .. import config
        from ..store import opener

        # The store: a directory, or a URL (then run ids stay relative to the local
        # directory, as the kernel computes them: see store.opener).
        self.store_target = (
            config.chosen_store(locate.store_dir(notebook)) if store is None else store
        )
        self.shared = opener.is_url(self.store_target)
        self.store_dir = locate.store_dir(notebook) if self.shared else Path(self.store_target)
        run_id = run_name or locate.run_id_for(notebook, self.store_dir)
        self.rk = RunKeys(run_id)
        self.kernel_env = {**os.environ, **env, "NBDURABLE_NOTEBOOK": str(notebook)}
        # Who holds the run's lease, as a second runner is told (see nbdurable.durable.lease).
        self.kernel_env.setdefault("NBDURABLE_HOLDER", f"nbdurable run (pid {os.getpid()})")
        # Older ipykernel kernelspecs start Python 3.11+ without
        # -Xfrozen_modules=off, and debugpy then prints a multi-line warning on
        # the kernel's stderr, which is shown when a kernel dies.
        self.kernel_env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        # Nobody is there to click: an approval not yet decided stops the run
        # (ApprovalPending, exit 7) instead of waiting (see nbdurable.durable.approval).
        self.kernel_env["NBDURABLE_HEADLESS"] = "1"
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
        self.view = RunView(self.store, run_id) if self.store is not None else None
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
        from ..store import open_store

        uses = any("nbdurable" in c.source for c in self.nb.cells if c.cell_type == "code")
        if not (uses or self.steps or self.shared or self.store_dir.exists()):
            return None
        return open_store(self.store_target)

    # -- reading the store ----------------------------------------------------------
    def _made_since(self, scope: str | None, since: float) -> int:
        """Sub-step records of ``scope`` (None: every scope) started at or after ``since``."""
        return 0 if self.view is None else self.view.calls_since(scope, since)

    def _snapshot(self) -> dict[str, Any]:
        """Step states before an attempt, to tell *invalidated* from *executed*."""
        if self.store is None:
            return {}
        from .. import status

        try:
            infos = status.step_infos(self.store, self.rk.run_id, self.notebook)
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
        limit = self.timeout
        if limit is not None:  # nbclient's `timeout` takes whole seconds; its function any
            kw["timeout_func"] = lambda cell: limit
        sockets = _private_sockets()
        if sockets:
            from traitlets.config import Config

            kw["config"] = Config({"KernelManager": sockets})
        client = NotebookClient(
            nb,
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
        with tempfile.TemporaryFile() as log, _removed(sockets):
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
                        att.saved = await self._savings(client) or att.saved
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
                att.kernel_log = "\n".join(p for p in (att.kernel_log, kernel_log_tail(log)) if p)
        self.current = None
        att.seconds = time.perf_counter() - t0
        error = self.result.error
        held = error is not None and error.ename == "LeaseHeld"
        # Refused by another process's lease, this run recorded nothing: what the store
        # got meanwhile is that process's.
        att.calls_made = 0 if held else self._made_since(None, att.started)
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
        return {**data, "seconds": round(data["seconds"], 3)}

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
            outcome = "failed"
            if isinstance(exc, CellExecutionError) and exc.ename == "ApprovalPending":
                # Not a failure: the run stops cleanly where a person must decide.
                outcome, what = "waiting", exc.evalue.split(". Decide with", 1)[0]
            att.cells.append(
                CellOutcome(
                    index,
                    key,
                    label or f"cell #{index + 1}",
                    outcome,
                    clip(scrub(what)[0], 200),  # masked whole, then cut
                    time.perf_counter() - t0,
                )
            )
            self.progress.cell_done(att.cells[-1])
            raise
        self.current = None
        self.done += 1
        if self.store is not None:
            await self._follow(client, att)
        if key is None:
            return
        out = CellOutcome(index, key, label, "executed", seconds=time.perf_counter() - t0)
        note = replay_note(cell.outputs, key)
        rec = self.view.header(self.rk.step(key)) if self.view is not None else None
        if note is not None:
            out.outcome = "replayed"
            if rec is not None:
                out.calls_replayed = int(rec.get("substeps", 0))
                out.seconds_saved = float(rec.get("duration", 0.0))
            if "pinned, stale" in note:
                out.detail = "pinned; stale: " + note.split("pinned, stale: ", 1)[1]
        else:
            out.calls_made = self._made_since(key, started)
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
                if not known:  # the kernel judged what no view could: ask it what it was
                    said = await self._savings(client)
                    reasons = (said or {}).get("reasons") or {}
                    out.detail = str(reasons.get(key) or "")
                out.detail = (
                    before.detail if known else out.detail
                ) or "its code or inputs changed"
        att.cells.append(out)
        self.progress.cell_done(out)

    async def _follow(self, client: Any, att: Attempt) -> None:
        """After a cell: what the kernel replayed so far, and the run it records into."""
        said = await self._savings(client)
        if said is None:
            return
        att.saved = said
        run = said.get("run")
        if isinstance(run, str) and run != self.rk.run_id:  # `%step run NAME` in a cell
            from ..store import RunKeys, RunView

            self.rk = RunKeys(run)
            self.view = RunView(self.store, run)

    def _cell_error(self, exc: Exception) -> None:
        from nbclient.exceptions import CellExecutionError

        index = self.current[0] if self.current else -1
        key, label = self.steps.get(index, (None, f"cell #{index + 1}"))
        if isinstance(exc, CellExecutionError):
            ename = exc.ename
            if ename in ("UsageError", "LeaseHeld") and "`%step takeover`" in exc.evalue:
                # The magic shows LeaseHeld as a one-line UsageError; both messages
                # (refused, taken over) point to `%step takeover`.
                ename = "LeaseHeld"
            self.result.error = CellError(index, label, ename, exc.evalue, str(exc))
        else:
            self.result.error = CellError(index, label, "CellTimeoutError", str(exc), str(exc))

    def _died(self, att: Attempt, pre: dict[str, Any]) -> None:
        if self.current is None:
            return
        index, key, started = self.current
        label = self.steps.get(index, (None, f"cell #{index + 1}"))[1]
        made = self._made_since(key, started) if key else 0
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
                n = self.view.sub_stats(cur[1])[0] if cur[1] and self.view else 0
            except Exception:  # a display must never break a run
                continue
            self.progress.tick(n)

    def _pending(self) -> list[dict[str, str]]:
        """The run's approvals waiting for a decision (read from the store, never guessed)."""
        from .. import approvals

        try:
            waiting = approvals.pending(self.store, self.rk.run_id)
        except Exception:  # a report must never turn a stop into a crash
            return []
        return [{"id": p.id, "step": p.step, "summary": p.summary} for p in waiting]

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
                result.saved = {"steps": 0, "calls": 0, "seconds": 0.0}
                if result.error is not None and result.error.ename == "ApprovalPending":
                    result.approvals = self._pending()
                self.store.close()
            result.add_savings()
        # Verify writes the executed notebook only where -o asks (its file is the record's).
        writes = result.produced_results or (self.verify and result.status == "refused")
        if writes and (not self.verify or result.output is not None):
            target = result.output or self.notebook
            write_atomic(self.nb_out, target)
            result.output = target
        else:
            result.output = None  # every file is left as it was
        self.progress.end(result)
        return result


def run_notebook(
    notebook: str | os.PathLike[str],
    *,
    output: str | os.PathLike[str] | None = None,
    retries: int = 3,
    run_name: str | None = None,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    store: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    startup_timeout: int = 60,
    takeover: bool = False,
    verify: bool = False,
) -> RunResult:
    """Execute ``notebook`` durably; restart its kernel up to ``retries`` times.

    ``output`` is where the executed notebook is written (default: in place;
    only when the run produced results, see the module docstring).
    ``run_name`` records to a named run instead of the notebook's own.
    ``timeout`` is per cell in seconds, fractions allowed (None: no limit).
    ``cwd`` is the kernel's working directory (default: the notebook's).
    ``store`` is the store directory or a ``postgresql://`` URL (default:
    ``NBDURABLE_STORE``, ``NBDURABLE_DIR`` or ``.nbdurable`` beside the
    notebook). ``env`` is added to the kernel's
    environment. ``takeover`` takes the run's lease even from a live holder
    (another kernel recording into the same run). ``verify`` runs replay-only
    (``NBDURABLE_MODE=verify``, no retries: see ``nbdurable verify``) and writes
    the executed notebook only to ``output``. Bad input raises
    :class:`UsageProblem`; everything else is in the returned
    :class:`RunResult` (see its ``exit_code``).
    """
    if retries < 0:
        raise UsageProblem(f"retries must be 0 or more, got {retries}")
    if timeout is not None and timeout <= 0:
        raise UsageProblem(f"timeout must be a positive number of seconds, got {timeout}")
    path = check_path(notebook)
    env = dict(env or {})
    if verify:
        env["NBDURABLE_MODE"] = "verify"
    if takeover:
        env["NBDURABLE_TAKEOVER"] = "1"
    if store is None and env.get("NBDURABLE_DIR"):
        store = env["NBDURABLE_DIR"]
    from ..store import opener

    store_path: str | Path | None = None
    if store is not None:  # a directory, or a URL of a shared store
        store_path = str(store) if opener.is_url(store) else Path(store).expanduser().absolute()
    workdir = Path(cwd).expanduser().absolute() if cwd is not None else path.parent
    if not workdir.is_dir():
        raise UsageProblem(f"--cwd {workdir} is not a directory; give an existing directory")
    out = Path(output).expanduser().absolute() if output is not None else None
    if out is not None and not out.parent.is_dir():
        what = "is not a directory" if out.parent.exists() else "does not exist"
        raise UsageProblem(f"cannot write {out}: {out.parent} {what}; give another -o path")
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
        verify=verify,
    )
    return run.run()


def _private_sockets() -> dict[str, str]:
    """KernelManager settings for IPC sockets in a fresh private directory (POSIX only).

    The directory is short-named: a Unix socket path must stay under about 100 bytes.
    """
    if os.name != "posix":
        return {}
    base = "/tmp" if os.path.isdir("/tmp") else None  # macOS's $TMPDIR is long
    return {"transport": "ipc", "ip": os.path.join(tempfile.mkdtemp(prefix="nbk-", dir=base), "k")}


class _removed:
    """Remove the sockets' directory after the attempt."""

    def __init__(self, sockets: dict[str, str]) -> None:
        self.directory = os.path.dirname(sockets["ip"]) if sockets else None

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)


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
