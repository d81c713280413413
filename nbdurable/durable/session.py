"""The run in this process: its store, its run id, its lease, what it saved.

One :class:`Session` per process holds the run context (store, run id,
notebook), the lease that makes this process the run's only recorder, the
step executing now (sub-steps scope to it), what happened to each step in
this kernel, and the savings so far. Which cell is which is
:mod:`.cellkeys`' job; executing a ``%%step`` cell the step runner's
(:mod:`.stepper`). A session asks its program for everything else through a
:class:`~.host.Host`, so it is driven the same from IPython, a script or a test.

Public API for code outside the kernel side: :func:`get_session`,
:func:`current_session` and :func:`run_summary` (what ``nbdurable run`` asks
the final kernel).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import config, events
from ..clients.usage import Tally
from ..errors import LeaseHeld, LeaseLost, LiveCallRefused, NbdurableError, StoreError
from ..identity import keys, locate
from ..store import RunKeys, RunView, Store, open_store, opener
from . import host as hosts
from . import lease
from .cellkeys import CellKeys
from .context import Savings, StepContext, SubIndex, say, warn
from .host import Capture, Host, PlainHost
from .stepper import StepRunner


class Session:
    """The durable run of this kernel (or script)."""

    def __init__(self, host: Host | None = None) -> None:
        self.host: Host = host if host is not None else PlainHost()
        self._store: Store | None = None
        self._configured: str | None = None  # config.get().store when the store was opened
        self._run_name: str | None = None
        self.notebook: Path | None = None
        self.nbfile: locate.NotebookFile | None = None
        self.current: StepContext | None = None
        self.status: dict[str, tuple[str, str]] = {}  # step key -> (state, detail)
        #: why this kernel stopped recording into its run (another process took the
        #: run's lease), with the one action that fixes it; None while it records
        self.lost: str | None = None
        #: step key -> why its record did not replay when it last ran here (see summary)
        self.reasons: dict[str, str] = {}
        #: what verify mode refused to run live, one line each, in order (see refuse)
        self.refused: list[str] = []
        self.saved = Savings()
        self.steps = StepRunner(self)
        self._cell_ordinals: dict[str, int] = {}  # @recorded outside steps; reset per cell
        #: Guards the savings and the cell's ordinals (sub-steps may run in threads).
        self.lock = threading.RLock()
        self._warned_no_notebook = False
        self.cells = CellKeys(self)  # which cell is executing: its step key
        self._lease: lease.Lease | None = None
        self._lease_seen = 0.0  # when the store last confirmed we hold it
        self._atexit = False
        self._run_id_for: tuple[tuple[Path | None, Path], str] | None = None
        self._keys: RunKeys | None = None
        #: The run scope's sub-step index for the current cell; None when no
        #: per-cell hook resets it (plain Python), then each call reads its record
        #: (see :meth:`new_cell`).
        self.run_index: SubIndex | None = None
        #: What the executing plain cell shows, recorded from its first sub-step on
        #: (see :meth:`cell_capture`), and the thread that cell runs in.
        self._cell_capture: Capture | None = None
        self._cell_thread: int | None = None
        env_run = os.environ.get("NBDURABLE_RUN", "").strip()
        if env_run:  # set by `nbdurable run --run NAME`
            self._run_name = keys.validate_name(env_run, "run name (NBDURABLE_RUN)")

    # -- run context ---------------------------------------------------------
    @property
    def user_ns(self) -> dict[str, Any]:
        """The namespace steps run in (the host's)."""
        return self.host.user_ns

    def _locate(self) -> None:
        if self._store is not None:
            # configure(store=...) named another store: move there between steps
            # (a step that is executing finishes where it started).
            if self._configured != config.get().store and self.current is None:
                self._move_store()
            return
        self.notebook = locate.find_notebook(self.user_ns)
        where = ""
        if self.notebook is None:
            # nbclient-based clients (nbconvert, papermill, `jupyter execute`) say
            # nothing: find the file by the cells this kernel executed.
            self.notebook, where = locate.find_by_cells(self.host.executed())
        if self.notebook is not None and where:
            store = locate.store_dir(self.notebook)
            say(
                f"nbdurable: this kernel runs {self.notebook} ({where}): run "
                f"{self._run_name or locate.run_id_for(self.notebook, store)!r} in {store}"
            )
        if self.notebook is None and not self._warned_no_notebook:
            self._warned_no_notebook = True
            named = self._run_name is not None
            say(
                "nbdurable: no notebook file holds the cells of this kernel; recording to "
                f"run {self._run_name or locate.DEFAULT_RUN!r} in {locate.store_dir(None)}"
                + ("" if named else " (name it with `%step run NAME`)")
            )
        if self.notebook is not None:
            self.nbfile = locate.NotebookFile(self.notebook)
        self._open_store()

    def _open_store(self) -> None:
        # The store: a directory, or a URL for a shared one (see store.opener). Run ids
        # are relative to the local directory even then, so two machines whose
        # projects lie at different paths share the run of the same notebook.
        local = locate.store_dir(self.notebook)
        target = config.chosen_store(local)
        configured = config.get().store
        self._store = open_store(target, durability=config.get().durability)
        self._configured = configured
        self._anchor = local if opener.is_url(target) else self._store.path

    def _move_store(self) -> None:
        """Record into the store ``configure(store=...)`` named from now on, lease and all.

        The old store keeps what was recorded in it. If the new one does not
        open, nothing moves: the one-line error is raised at every use until
        the store opens or the setting is set back, never a silent fallback.
        """
        old, held = self._store, self._lease is not None
        assert old is not None
        self.release()
        try:
            self._open_store()
        except NbdurableError as exc:
            self._store = old
            raise StoreError(
                f"configure(store=...) named a store that does not open, so this kernel "
                f"records nothing until it does (or the setting is set back): {exc}"
            ) from None
        old.close()
        with self.lock:
            self.status.clear()
            self.steps.forget()
            self.run_index = SubIndex() if self.run_index is not None else None
        self._run_id_for = None
        run = self.run_id
        say(
            f"nbdurable: run {run!r} now records in {self._store.path} (configure(store=...)); "
            f"its records in {old.path} stay there "
            f"(`nbdurable copy {run} --from {old.path} --to {self._store.path}` copies them)"
        )
        events.emit("run-changed", run)
        if held:  # the lease moves with the run: a holder in the new store is named now
            self.claim()

    @property
    def store(self) -> Store:
        """The store of this run, opened on first use."""
        self._locate()
        assert self._store is not None
        return self._store

    @property
    def run_id(self) -> str:
        """The run's id: a name set by ``%step run``, else the notebook's (see :mod:`locate`)."""
        self._locate()
        if self._run_name is not None:
            return self._run_name
        assert self._store is not None
        # Read on every sub-step: computed once per (notebook, store), not per call.
        where = (self.notebook, self._anchor)
        if self._run_id_for is None or self._run_id_for[0] != where:
            self._run_id_for = (where, locate.run_id_for(*where))
        return self._run_id_for[1]

    @property
    def keys(self) -> RunKeys:
        """Store keys of this run."""
        run_id = self.run_id
        if self._keys is None or self._keys.run_id != run_id:
            self._keys = RunKeys(run_id)
        return self._keys

    @property
    def view(self) -> RunView:
        """The run's records as the store holds them now."""
        return RunView(self.store, self.run_id)

    def set_run(self, name: str | None) -> str:
        """Switch to a named run (None: back to the notebook's run)."""
        self.release()
        self._run_name = name
        self.status.clear()
        self.steps.forget()
        events.emit("run-changed", self.run_id)
        return self.run_id

    @property
    def verifying(self) -> bool:
        """Whether this kernel may only replay (``configure(mode="verify")``)."""
        return config.get().mode == "verify"

    def refuse(self, what: str) -> LiveCallRefused:
        """The error for live work in verify mode, noted for ``nbdurable verify`` (raise it).

        Noted here as well as raised because the error may not reach the cell as
        itself: an SDK wraps what its transport raises in an error of its own.
        """
        line = f"verify: {what}; nothing was run live"
        with self.lock:
            if line not in self.refused:
                self.refused.append(line)
        return LiveCallRefused(line)

    def claim(self, *, takeover: bool = False, verify: bool = True) -> lease.Holder | None:
        """Hold this run's lease before executing anything in it (see :mod:`lease`).

        Raises :class:`LeaseHeld` when another live process holds it; with
        ``takeover`` (or ``NBDURABLE_TAKEOVER=1``) takes it anyway. Returns
        the previous holder when one was replaced.
        """
        run = self.run_id
        held = self._lease
        if held is not None and held.generation != self.store.generation:
            # The store was deleted or replaced and reopened: its lease went with it.
            held._stop.set()
            self._lease = held = None
            warn(
                f"the store at {self.store.path} was deleted or replaced while this kernel "
                "ran; recording into a new store there."
            )
        if held is not None and held.run_id == run and not takeover:
            # Sub-steps outside any step call this on every call (verify=False):
            # they look at the store at most once a second; a step always looks.
            now = time.monotonic()
            if not verify and now - self._lease_seen < 1.0:
                return None
            if held.holds():
                self._lease_seen = now
                return None
            self._lease = None
            who = lease.read(self.store, run)
            raise LeaseHeld(
                self._lose(
                    f"run {run!r} was taken over by "
                    f"{who.describe() if who else 'another process'}; this kernel stopped "
                    "recording into it. Run `%step takeover` to take it back."
                )
            )
        if held is not None:
            held.release()
            self._lease = None
        mine = lease.Lease(self.store, run, self._holder())
        previous = mine.acquire(takeover=takeover or os.environ.get("NBDURABLE_TAKEOVER") == "1")
        mine.generation = self.store.generation
        self._lease = mine
        self._lease_seen = time.monotonic()
        if self.lost is not None:  # recording again (`%step takeover`): the views say so
            self.lost = None
            events.emit("run-changed", run, None)
        if not self._atexit:
            self._atexit = True
            atexit.register(self.release)
        return previous

    def write(
        self,
        puts: Iterable[tuple[str, dict[str, Any], bytes]] = (),
        deletes: Iterable[str] = (),
        blobs: dict[str, bytes] | None = None,
    ) -> int:
        """Write records of this run in one transaction, under its lease (``Store.apply``).

        Every record the kernel writes goes through here: with the lease held,
        the store refuses the write whole if another process took the lease
        over meanwhile (a heartbeat that stalled past the expiry on a shared
        store, or ``%step takeover``). Then this kernel stops recording: the
        :class:`LeaseLost` raised names the new holder in one line, and every
        later write under the lost lease is refused too, until a step claims
        the run again (see :meth:`claim`).
        """
        held = self._lease
        try:
            return self.store.apply(puts, deletes, blobs, fence=held.fence if held else None)
        except LeaseLost:
            assert held is not None
            held._stop.set()  # its heartbeat would only find the lease gone
            who = lease.read(self.store, held.run_id)
            raise LeaseLost(
                self._lose(
                    f"run {held.run_id!r} was taken over by "
                    f"{who.describe() if who else 'another process, since gone,'} while this "
                    "kernel recorded it: this record was NOT written and this kernel stopped "
                    "recording into the run. Run `%step takeover` to take it back."
                )
            ) from None

    def _lose(self, message: str) -> str:
        """Note that this kernel lost its run's lease (the panel's header says it)."""
        self.lost = message
        events.emit("run-changed", self.run_id, None)
        return message

    def release(self) -> None:
        """Give back the run's lease, if held."""
        if self._lease is not None:
            # A deleted store is not recreated just to give its lease back.
            if self._store is not None and not self._store.replaced():
                self._lease.release()
            self._lease._stop.set()
            self._lease = None

    def set_store(self, store: Store, run_id: str | None = None) -> None:
        """Record into a store opened elsewhere, as run ``run_id`` (tests and benchmarks)."""
        self._store = store
        self._configured = config.get().store
        self._anchor = store.path if isinstance(store.path, Path) else locate.store_dir(None)
        self._run_name = run_id

    def _holder(self) -> str:
        """What holds a lease, for the message a second runner sees."""
        return os.environ.get("NBDURABLE_HOLDER") or self.host.describe()

    def touch_run(self) -> tuple[str, dict[str, Any], bytes]:
        """The run's ``meta`` record, to write with a step's record (its last activity)."""
        now = time.time()
        meta = {"kind": "run", "run": self.run_id, "last": now}
        meta["notebook"] = str(self.notebook) if self.notebook else None
        return (self.keys.meta, meta, b"")

    # -- identity --------------------------------------------------------------
    def resolve_key(self, name: str | None, body: str) -> tuple[str, str, int | None]:
        """``(key, label, position)`` of the executing cell (see :class:`.cellkeys.CellKeys`)."""
        return self.cells.resolve(name, body)

    def changed(self, done: Any) -> None:
        """A command (:mod:`nbdurable.commands`) changed the run: update what this kernel shows."""
        if done.action == "clear-all":
            self.status.clear()
            events.emit("store-changed", self.run_id, None, action="clear-all")
            return
        for key in done.keys:
            if done.action == "clear":
                self.status.pop(key, None)
            events.emit("store-changed", self.run_id, key, action=done.action)

    # -- cells and steps ----------------------------------------------------------------
    def new_cell(self, hooked: bool = True) -> None:
        """A cell starts: ``@recorded`` ordinals restart, the run scope's records are read afresh.

        ``hooked=False`` (the extension unloaded): no hook marks cells any more,
        so each sub-step outside a step reads its own record.
        """
        self.end_cell()
        with self.lock:
            self._cell_ordinals.clear()
        self.run_index = SubIndex() if hooked else None
        self._cell_thread = threading.get_ident() if hooked else None

    def end_cell(self) -> None:
        """The cell ended (a hook says so): stop recording what it shows.

        Until the next cell starts, nothing is recorded (a widget's callback
        calling a sub-step between cells has no cell to show in).
        """
        self._cell_thread = None
        cap, self._cell_capture = self._cell_capture, None
        if cap is not None:
            cap.__exit__(None, None, None)

    def cell_capture(self) -> Capture | None:
        """The capture of what the executing plain cell shows, started on first use.

        A sub-step called in a plain cell records what it prints from it, as
        one in a step does from the step's capture, so its replay shows the
        same. Started by the cell's first sub-step (a cell without one pays
        nothing) and ended by the hook that ends the cell; None where no hook
        marks cells (plain Python), off the cell's thread, or where the host
        has no capture.
        """
        if self.run_index is None or self._cell_thread != threading.get_ident():
            return None
        if self._cell_capture is None:
            try:
                cap = self.host.capture()
                cap.__enter__()
            except Exception:  # noqa: BLE001 - no capture: the call runs, unrecorded output
                return None
            self._cell_capture = cap
        return self._cell_capture

    def next_ordinal(self, base: str) -> int:
        """How many ``@recorded`` calls with this ``base`` id the current cell made before."""
        with self.lock:
            n = self._cell_ordinals.get(base, 0)
            self._cell_ordinals[base] = n + 1
        return n

    def count_replayed(
        self, seconds: float, steps: int = 0, calls: int = 1, tokens: Tally | None = None
    ) -> None:
        """Add to what replay saved in this kernel."""
        with self.lock:
            self.saved.steps += steps
            self.saved.calls += calls
            self.saved.seconds += seconds
            if tokens:
                self.saved.tokens = self.saved.tokens + tokens

    def summary(self) -> dict[str, Any]:
        """What this kernel replayed: ``{"steps", "calls", "seconds", "tokens", "cost", "run",
        "reasons"}`` (``reasons``: step key -> why its record did not replay).

        ``tokens`` is ``{"input", "output"}``; ``cost`` is what they cost at the
        prices given to ``configure(prices=...)`` (None without prices), and
        ``unpriced`` the models that had tokens but no price.
        """
        with self.lock:
            saved = self.saved
            total = saved.tokens.total
            prices = config.get().prices
            cost, unpriced = saved.tokens.cost(prices) if prices else (None, [])
            return {
                "steps": saved.steps,
                "calls": saved.calls,
                "seconds": saved.seconds,
                "tokens": {"input": total.input, "output": total.output},
                "cost": cost,
                "unpriced": unpriced,
                "run": self.run_id,
                # what `nbdurable run` prints for a step that ran instead of replaying
                "reasons": dict(self.reasons),
                # what verify mode refused to run live (`nbdurable verify`)
                "refused": list(self.refused),
            }


_session: Session | None = None
_session_lock = threading.Lock()


def get_session(host: Host | None = None) -> Session:
    """The process-wide session, created on first use (with ``host``, else the default)."""
    global _session
    with _session_lock:
        if _session is None:
            _session = Session(host if host is not None else hosts.default_host())
        elif host is not None and isinstance(_session.host, PlainHost):
            _session.host = host  # made before the shell was known (a plain step() call)
        return _session


def current_session() -> Session | None:
    """The process-wide session if one was created (never creates one)."""
    return _session


def run_summary() -> dict[str, Any] | None:
    """What this process replayed (see :meth:`Session.summary`); None if nbdurable was not used.

    ``nbdurable run`` asks the final kernel for it, as a user expression
    that never imports nbdurable into a kernel that did not.
    """
    session = _session
    return None if session is None else session.summary()


def reset_session() -> None:
    """Forget the process-wide session (tests; ``%reload_ext``)."""
    global _session
    with _session_lock:
        if _session is not None:
            _session.release()
        if _session is not None and _session._store is not None:
            _session._store.close()
        _session = None
