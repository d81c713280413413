"""The systems compared on sub-steps: one adapter each, all driven the same way.

Every adapter records ``n`` steps whose function ``produce(i)`` returns a
prepared value ``VALUES[i]`` (so the timing is the durable layer's, not the
work's), then *replays* them from a fresh instance on the same directory (a
new store object, a new DBOS launch, a new checkpointer connection: what a
restarted kernel does), calling the same step ids in the same order.

Each call is timed on its own with ``perf_counter_ns`` from the caller's side,
inside the workflow body for DBOS and LangGraph. ``CALLS`` counts real calls of
``produce``: a replay that made any is reported as not having replayed.

What "record" and "replay" are for each peer (see also ``bench/README.md``):

- nbdurable: ``step(id, produce, i)`` outside a ``%%step`` (scope: the run);
  replay = a new session with a new ``Store`` on the same directory.
- raw diskcache: ``Cache.set(key, value)`` / ``Cache.get(key)`` with the
  settings nbdurable uses (eviction none, WAL, ``synchronous=NORMAL``).
- raw SQLite: one ``INSERT`` per autocommit transaction / one ``SELECT``, WAL,
  ``synchronous=NORMAL``.
- seed JSON checkpoint: the article's ``step(cp, id, fn, ...)``; replay =
  a new ``Checkpoint`` (loads the JSON file once, not counted per step).
- joblib.Memory: ``Memory(dir).cache(produce)(i)``; replay = a new ``Memory``.
- diskcache memoize: ``Cache.memoize()(produce)(i)``; replay = a new ``Cache``.
- DBOS: ``@DBOS.step`` calls inside a ``@DBOS.workflow``, SQLite system
  database as DBOS configures it. The record run is cut short after its last
  step by an exception DBOS does not catch (as a kernel death would), so the
  workflow stays PENDING; replay = ``DBOS.destroy()``, a new ``DBOS`` and
  ``launch()``, whose recovery re-executes the workflow and returns each
  step's recorded output.
- LangGraph: ``@task`` calls inside an ``@entrypoint(checkpointer=SqliteSaver)``.
  The record run raises after its last task; replay = a new connection and
  saver, ``invoke(None)`` on the same thread id, which re-runs the entrypoint
  and returns each task's saved write.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import seed
from bench.stats import perf_ns, timed_loop

# The prepared values live in a module that has no file. nbdurable identifies a
# step function by what it reads, and a global of a local module (this one) by
# its content: a plain global list would be hashed in full on every call, twice
# (before it and after), and the list grows with the run (10 MB at 10,000
# steps), a cost of this harness, not of the function a user writes (a model
# call reads a client and a prompt). A module without a file is identified by
# its name, as a library is.
TABLE = types.ModuleType("bench_values")
TABLE.values = []
VALUES: list[Any] = TABLE.values  # filled in place: VALUES[:] = make_values(...)
CALLS = [0]
RUN_ID = "bench-run"


def produce(i: int) -> Any:
    """The step's function: count the call, return the prepared value."""
    CALLS[0] += 1
    return TABLE.values[i]


def step_id(i: int) -> str:
    return f"s:{i}"


def make_values(size: int, count: int) -> list[str]:
    """``count`` distinct random strings of ``size`` characters (JSON-able, like model text)."""
    half = (size + 1) // 2
    return [os.urandom(half).hex()[:size] for _ in range(count)]


class Unavailable(Exception):
    """A peer cannot run here; the message says why."""


@dataclass
class Phase:
    """One record or replay run of ``len(times)`` steps."""

    times: list[int]  # ns per call
    #: the whole phase as a user waits for it, per-run costs that scale with the
    #: log included: a record run until the system hands control back (deferred
    #: writes flushed); a replay run from opening the store (which may load the
    #: whole log, as the seed and LangGraph do) to the last step. Not included:
    #: DBOS's launch and its recovery queue's poll, fixed costs of ~1 s.
    wall_ns: int
    open_ns: int  # opening the store / launching the runtime
    calls: int  # real calls of produce() during the phase


class Peer:
    """A system that records and replays steps."""

    name = "?"
    #: a peer whose per-step cost grows with the log gets fewer steps (see run.py)
    grows = False

    def check(self) -> None:
        """Raise :class:`Unavailable` if this peer cannot run here."""

    def record(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        raise NotImplementedError

    def replay(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        raise NotImplementedError

    def close(self) -> None:
        """Release anything process-wide (DBOS)."""


class SimplePeer(Peer):
    """A peer driven by plain calls: open, call per step, close."""

    def _open(self, d: Path) -> Any:
        raise NotImplementedError

    def _rec(self, h: Any, i: int) -> Any:
        raise NotImplementedError

    def _rep(self, h: Any, i: int) -> Any:
        return self._rec(h, i)

    def _close(self, h: Any) -> None:
        pass

    def _phase(self, d: Path, n: int, deadline: float | None, replaying: bool) -> Phase:
        fn = self._rep if replaying else self._rec
        before = CALLS[0]
        t0 = perf_ns()
        h = self._open(d)
        t1 = perf_ns()
        times = timed_loop(n, lambda i: fn(h, i), deadline)
        t2 = perf_ns()
        self._close(h)
        return Phase(times, t2 - (t0 if replaying else t1), t1 - t0, CALLS[0] - before)

    def record(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        return self._phase(d, n, deadline, replaying=False)

    def replay(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        return self._phase(d, n, deadline, replaying=True)


# -- nbdurable --------------------------------------------------------------------


class Nbdurable(SimplePeer):
    """nbdurable's ``step()`` inside a ``%%step`` (the default) or outside any.

    Inside a ``%%step`` is how the issue and the research notebook use it:
    the enclosing step holds the run's lease (no per-call lease check) and
    its sub-step records are read in one range read on its first lookup.
    The bench stands in for the cell by setting the session's current step
    context, which is what the engine does while a body runs. Outside a
    step (scope: the run) the calls are made as in one notebook cell: the
    run scope's records are read once per cell, and each record call
    checks the run's lease (at most once a second).
    """

    def __init__(self, durability: str = "crash", in_step: bool = True) -> None:
        self.durability = durability
        self.in_step = in_step
        extra = [durability] if durability != "crash" else []
        extra += [] if in_step else ["outside %%step"]
        self.name = "nbdurable" + (f" ({', '.join(extra)})" if extra else "")

    def _open(self, d: Path) -> Any:
        from nbdurable.durable import session as engine
        from nbdurable.store import open_store

        engine.reset_session()
        store = open_store(d, durability=self.durability)
        session = engine.get_session()
        session.set_store(store, RUN_ID)
        if self.in_step:
            from nbdurable.durable.context import StepContext

            session.current = StepContext("bench-step", "bench-step")
        else:
            # All calls in one notebook cell: the extension's per-cell hook gives the
            # run scope a fresh index at the start of each cell, as here.
            session.new_cell()
        import nbdurable

        return nbdurable.step

    def _rec(self, step: Any, i: int) -> Any:
        return step(step_id(i), produce, i)

    def _close(self, h: Any) -> None:
        from nbdurable.durable import session as engine

        engine.get_session().current = None
        engine.reset_session()


# -- the floors ---------------------------------------------------------------------


def diskcache_settings() -> dict[str, Any]:
    """The diskcache settings nbdurable's Store uses (see nbdurable/store/_diskcache.py)."""
    return {
        "eviction_policy": "none",
        "cull_limit": 0,
        "statistics": 0,
        "timeout": 60,
        "sqlite_synchronous": 1,
    }


class RawDiskcache(SimplePeer):
    name = "raw diskcache set/get"

    def _open(self, d: Path) -> Any:
        import diskcache

        return diskcache.Cache(str(d), **diskcache_settings())

    def _rec(self, c: Any, i: int) -> Any:
        return c.set(step_id(i), VALUES[i], retry=True)

    def _rep(self, c: Any, i: int) -> Any:
        return c.get(step_id(i), retry=True)

    def _close(self, c: Any) -> None:
        c.close()


class RawSqlite(SimplePeer):
    name = "raw SQLite WAL insert/select"

    def _open(self, d: Path) -> Any:
        d.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(d / "raw.sqlite", isolation_level=None)  # autocommit
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB)")
        return con

    def _rec(self, con: Any, i: int) -> Any:
        return con.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (step_id(i), VALUES[i]))

    def _rep(self, con: Any, i: int) -> Any:
        return con.execute("SELECT v FROM kv WHERE k = ?", (step_id(i),)).fetchone()[0]

    def _close(self, con: Any) -> None:
        con.close()


# -- the alternatives ---------------------------------------------------------------


class SeedJson(SimplePeer):
    name = "seed JSON checkpoint"
    grows = True

    def _open(self, d: Path) -> Any:
        return seed.Checkpoint(RUN_ID, path=str(d))

    def _rec(self, cp: Any, i: int) -> Any:
        return seed.step(cp, step_id(i), produce, i)


class JoblibMemory(SimplePeer):
    name = "joblib.Memory"

    def check(self) -> None:
        _require("joblib")

    def _open(self, d: Path) -> Any:
        import joblib

        return joblib.Memory(str(d), verbose=0).cache(produce)

    def _rec(self, f: Any, i: int) -> Any:
        return f(i)


class DiskcacheMemoize(SimplePeer):
    name = "diskcache memoize"

    def _open(self, d: Path) -> Any:
        import diskcache

        cache = diskcache.Cache(str(d), **diskcache_settings())
        return cache, cache.memoize(name="produce")(produce)

    def _rec(self, h: Any, i: int) -> Any:
        return h[1](i)

    def _close(self, h: Any) -> None:
        h[0].close()


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise Unavailable(
            f"{module} is not installed (it is in the bench extra: pip install -e '.[bench]')"
        )


class _Crash(BaseException):
    """Ends a record run after its last step without letting the runtime see an error.

    A BaseException that is not an Exception is what a dying kernel looks like
    to DBOS: it leaves the workflow PENDING, to be recovered on the next launch.
    """


class _Stop(Exception):
    """Ends a LangGraph record run after its last task (an ordinary failure)."""


class Dbos(Peer):
    name = "DBOS (SQLite)"

    def __init__(self) -> None:
        self._state: dict[str, Any] = {}
        self._fns: tuple[Any, Any] | None = None
        self._live = False

    def check(self) -> None:
        _require("dbos")

    def _launch(self, d: Path) -> None:
        from dbos import DBOS

        d.mkdir(parents=True, exist_ok=True)
        DBOS(
            config={
                "name": "nbdurable-bench",
                "system_database_url": f"sqlite:///{d / 'dbos.sqlite'}",
                "log_level": "ERROR",
            }
        )
        if self._fns is None:
            self._fns = self._define()
        DBOS.launch()
        self._live = True

    def _define(self) -> tuple[Any, Any]:
        from dbos import DBOS

        state = self._state

        @DBOS.step()
        def bench_step(i: int) -> Any:
            return produce(i)

        @DBOS.workflow()
        def bench_workflow(n: int) -> int:
            limit = min(n, state["limit"])
            t0 = perf_ns()
            state["times"] = timed_loop(limit, bench_step, state["deadline"])
            state["span"] = perf_ns() - t0
            if state["crash"]:
                raise _Crash()
            return len(state["times"])

        return bench_step, bench_workflow

    def _destroy(self) -> None:
        # close() runs for every peer, installed or not: import dbos only when
        # it was launched, so a missing dbos stays a one-line "not installed".
        if not self._live:
            return
        from dbos import DBOS

        DBOS.destroy(destroy_registry=False)
        self._live = False

    def record(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        from dbos import SetWorkflowID

        before = CALLS[0]
        t0 = perf_ns()
        self._launch(d)
        t1 = perf_ns()
        self._state.update(crash=True, limit=n, deadline=deadline, times=[])
        assert self._fns is not None
        with contextlib.suppress(_Crash), SetWorkflowID("bench-wf"):
            self._fns[1](n)
        t2 = perf_ns()
        self._destroy()
        return Phase(self._state["times"], t2 - t1, t1 - t0, CALLS[0] - before)

    def replay(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        from dbos import DBOS

        before = CALLS[0]
        self._state.update(crash=False, limit=n, deadline=None, times=[])
        t0 = perf_ns()
        self._launch(d)  # launch's recovery re-executes the PENDING workflow
        t1 = perf_ns()
        DBOS.retrieve_workflow("bench-wf").get_result()
        self._destroy()
        # Recovery goes through DBOS's internal queue, polled about once a
        # second; that wait is not a per-step cost, so wall is the loop's span.
        return Phase(self._state["times"], self._state["span"], t1 - t0, CALLS[0] - before)

    def close(self) -> None:
        self._destroy()


class LangGraph(Peer):
    name = "LangGraph (SqliteSaver)"

    def __init__(self, durability: str | None = None) -> None:
        self._state: dict[str, Any] = {}
        #: ``invoke(durability=...)``; None: LangGraph's default ("async": a
        #: task's write is saved while the next task runs)
        self.durability = durability

    def check(self) -> None:
        _require("langgraph")
        _require("langgraph.checkpoint.sqlite")

    def _entrypoint(self, d: Path) -> tuple[Any, Any]:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.func import entrypoint, task

        d.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(d / "langgraph.sqlite", check_same_thread=False)
        saver = SqliteSaver(conn)
        state = self._state
        bench_task = task(name="bench_task")(produce)

        def call(i: int) -> Any:
            return bench_task(i).result()

        @entrypoint(checkpointer=saver)
        def bench_entry(inp: dict[str, int]) -> int:
            limit = min(inp["n"], state["limit"])
            state["times"] = timed_loop(limit, call, state["deadline"])
            if state["crash"]:
                raise _Stop()
            return len(state["times"])

        return bench_entry, conn

    def _run(self, d: Path, n: int, deadline: float | None, crash: bool) -> Phase:
        before = CALLS[0]
        self._state.update(crash=crash, limit=n, deadline=deadline, times=[])
        t0 = perf_ns()
        entry, conn = self._entrypoint(d)
        t1 = perf_ns()
        config = {"configurable": {"thread_id": "bench-thread"}}
        extra = {"durability": self.durability} if self.durability else {}
        try:
            entry.invoke({"n": n} if crash else None, config, **extra)
        except _Stop:
            pass
        t2 = perf_ns()
        conn.close()
        # invoke() loads the checkpoint and every saved write before the first
        # task runs: on replay that is per-step work, so it is in the wall time.
        wall = t2 - t1 if crash else t2 - t0
        return Phase(self._state["times"], wall, t1 - t0, CALLS[0] - before)

    def record(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        return self._run(d, n, deadline, crash=True)

    def replay(self, d: Path, n: int, deadline: float | None = None) -> Phase:
        return self._run(d, n, None, crash=False)


def all_peers() -> list[Peer]:
    """Every system, nbdurable first (ratios are taken against it)."""
    return [
        Nbdurable(),
        Nbdurable(in_step=False),
        Nbdurable("power"),
        RawDiskcache(),
        RawSqlite(),
        SeedJson(),
        JoblibMemory(),
        DiskcacheMemoize(),
        Dbos(),
        LangGraph(),
    ]


def disk_usage(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (like ``du``)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def apparent_size(path: Path) -> int:
    """Sum of file sizes under ``path``."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def now() -> float:
    return time.monotonic()
