"""One runner per run: a lease record in the store.

The first process that records into a run takes its lease; a second one
(another browser tab's kernel, ``nbdurable run`` beside an open notebook)
gets :class:`~nbdurable.errors.LeaseHeld` naming the holder. A lease whose
holder is dead is taken over automatically: on the same host the holder's
process id is checked (with its start time, so a recycled pid does not count
as alive); from another host the holder counts as dead once its heartbeat is
older than :data:`STALE_AFTER` seconds. A live holder refreshes its heartbeat
from a daemon thread every :data:`HEARTBEAT` seconds. ``takeover=True`` takes
the lease whatever the holder's state.

On a store shared by machines (PostgreSQL) the host is what tells a holder
on this machine from one elsewhere: ``NBDURABLE_HOST`` names this machine
when its host name is not unique (containers that all call themselves
``localhost``), and ``NBDURABLE_LEASE_EXPIRY`` (seconds) shortens
:data:`STALE_AFTER`, the heartbeat following at a quarter of it.

A heartbeat that comes late (a stalled thread, a slow store) cannot make two
writers: every record the holder writes carries its lease's :attr:`Lease.fence`,
which the store checks in the record's own transaction. Once another process
has taken the lease over, the old holder's next record is refused whole
(:class:`~nbdurable.errors.LeaseLost`), whatever its heartbeat thread believes;
the kernel then stops with one line naming the new holder (see
``Session.write``). A slow store answers within these rules: a takeover and
a record are serialized on the lease row, so the record lands before the
takeover or not at all.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import LeaseHeld
from ..store import RunKeys, Store
from ..store.base import Fence
from ..store.view import read_header

HEARTBEAT = 30.0
STALE_AFTER = 120.0


def host() -> str:
    """The name of this machine in a lease: ``NBDURABLE_HOST``, else the host name."""
    return os.environ.get("NBDURABLE_HOST", "").strip() or socket.gethostname()


def stale_after() -> float:
    """Seconds without a heartbeat after which a holder on another host counts as dead."""
    try:
        value = float(os.environ.get("NBDURABLE_LEASE_EXPIRY", ""))
    except ValueError:
        return STALE_AFTER
    return value if value > 0 else STALE_AFTER


def heartbeat() -> float:
    """Seconds between heartbeats: a quarter of :func:`stale_after`, at most HEARTBEAT."""
    return min(HEARTBEAT, stale_after() / 4)


@dataclass(frozen=True)
class Holder:
    """Who holds a run's lease."""

    host: str
    pid: int
    started: str  # the process's start time, to tell a recycled pid apart
    token: str
    since: float
    heartbeat: float
    what: str = ""

    def describe(self) -> str:
        """``pid 123 on host h (kernel …) since 2026-…``."""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        what = f", {self.what}" if self.what else ""
        return f"process {self.pid} on {self.host}{what}, since {since}"


def _proc_stat(pid: int) -> tuple[str, str]:
    """``(state, start time)`` of a process from ``/proc`` (``("", "")`` where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return "", ""


def _start_time(pid: int) -> str:
    return _proc_stat(pid)[1]


def _alive(holder: Holder, now: float) -> bool:
    if holder.host != host():
        return now - holder.heartbeat < stale_after()
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    state, started = _proc_stat(holder.pid)
    # A killed kernel its parent has not reaped yet is a zombie: signals reach its pid,
    # but it records nothing any more.
    if state in ("Z", "X", "x"):
        return False
    return not holder.started or not started or started == holder.started


def lease_key(run_id: str) -> str:
    """Where a run's lease lives in the store."""
    return RunKeys(run_id).lease


def _holder(header: dict[str, Any] | None) -> Holder | None:
    if header is None:
        return None
    try:
        return Holder(**{k: v for k, v in header.items() if k in Holder.__dataclass_fields__})
    except TypeError:
        return None


def read(store: Store, run_id: str) -> Holder | None:
    """The current holder of the run's lease, if any (dead or alive)."""
    return _holder(read_header(store, lease_key(run_id)))


class _Keep(Exception):
    """Leave the lease record as it is (see Store.swap)."""


class Lease:
    """A lease on one run held by this process; :meth:`release` gives it back."""

    def __init__(self, store: Store, run_id: str, what: str = "") -> None:
        self.store, self.run_id, self.what = store, run_id, what
        self.token = secrets.token_hex(8)
        self.generation = 0  # the store generation it was taken in (see Store.reopen)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, takeover: bool = False) -> Holder | None:
        """Take the lease; returns the previous (dead or overridden) holder, if any.

        Raises :class:`LeaseHeld` when another live process holds it and
        ``takeover`` is false.
        """
        now = time.time()
        mine = Holder(
            host(),
            os.getpid(),
            _start_time(os.getpid()),
            self.token,
            now,
            now,
            self.what,
        )
        previous: Holder | None = None

        def take(header: dict[str, Any] | None) -> dict[str, Any]:
            nonlocal previous
            current = _holder(header)
            if current is not None and current.token != self.token:
                ours = current.host == mine.host and current.pid == mine.pid
                if not ours and _alive(current, now) and not takeover:
                    raise LeaseHeld(
                        f"run {self.run_id!r} is being recorded by {current.describe()}. "
                        "Two runners would execute the same steps twice: stop the other "
                        "kernel, or take the lease over with `%step takeover` "
                        "(`nbdurable run --takeover`) if you are sure it is gone."
                    )
                previous = current
            return asdict(mine)

        self.store.swap(lease_key(self.run_id), take)
        self._start_heartbeat()
        return previous

    @property
    def fence(self) -> Fence:
        """What every record written under this lease carries (see ``Store.write``)."""
        return Fence(lease_key(self.run_id), self.token)

    def holds(self) -> bool:
        """True while the store still names this process as the holder."""
        current = read(self.store, self.run_id)
        return current is not None and current.token == self.token

    def _start_heartbeat(self) -> None:
        if self._thread is not None:
            return
        ref = weakref.ref(self)
        stop = self._stop

        def beat() -> None:
            while not stop.wait(heartbeat()):
                lease = ref()
                if lease is None:
                    return
                lease._beat()

        self._thread = threading.Thread(target=beat, name="nbdurable-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        def beat(header: dict[str, Any] | None) -> dict[str, Any]:
            current = _holder(header)
            if current is None or current.token != self.token:
                self._stop.set()  # taken over: stop claiming it
                raise _Keep
            return {**asdict(current), "heartbeat": time.time()}

        try:
            self.store.swap(lease_key(self.run_id), beat)
        except Exception:  # taken over, or the next beat tries again (the holder check is by pid)
            pass

    def release(self) -> None:
        """Give the lease back (only if this process still holds it)."""
        self._stop.set()

        def drop(header: dict[str, Any] | None) -> None:
            current = _holder(header)
            if current is None or current.token != self.token:
                raise _Keep

        try:
            self.store.swap(lease_key(self.run_id), drop)
        except Exception:  # taken over, or closing down: a dead holder is detected by pid anyway
            pass
