"""The team store on PostgreSQL, side by side with its peers on the same server.

    python -m bench.postgres [--url postgresql://postgres@127.0.0.1:5432/test]
                             [--steps 100,1000,10000] [--size 1000] [--writers 8]
                             [--rounds 3] [--calls 300] [--load 8] [--only 1,2,3]

1. **Per step, record and replay**, at each ``--steps`` (is it flat?):
   nbdurable's ``step()`` inside a ``%%step`` on the PostgreSQL store, the same
   on the embedded store for reference, DBOS with its system database on the
   same server, and LangGraph with ``PostgresSaver`` on the same server, with
   its default durability and with ``durability="sync"`` (each driven exactly
   as in ``bench/peers.py``; a peer not installed is reported as such,
   ``pip install -e '.[bench]'``). With each row, the server's own count of
   transactions committed and WAL flushes per recorded step: the work each
   system asks of the server, whatever the load on the machine. Each ``n``
   is measured in ``--rounds`` rounds, every system once per round in a
   rotated order, and the rounds' timings pooled: a VM whose speed drifts
   during the run then slows every system alike.
2. **Concurrent kernels**: ``--writers`` processes, each recording its own run
   into ONE namespace at once: throughput in steps/s over all of them, and
   the per-step median and p99.
3. **Wall time per recorded call, quiet and under load** (:func:`versus`;
   also ``python -m bench --only postgres``): nbdurable, LangGraph and DBOS
   by the record run's wall time over its ``--calls`` calls, every commit
   included (LangGraph's background writes too), each round once quiet and
   once while ``--load`` other processes record into the same server.

Each system works in a namespace (schema or database prefix) of its own,
dropped at the end. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import peers
from bench.report import Table
from bench.stats import Summary, fmt_ratio, fmt_us, perf_ns, quiesce, timed_loop

#: Recorded calls per run in section 3 (each system, each round, each condition).
VERSUS_CALLS = 300
DEFAULT_URL = os.environ.get("NBDURABLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _with_namespace(url: str, namespace: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}namespace={namespace}"


def _drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class NbdurablePg(peers.Nbdurable):
    """nbdurable inside a ``%%step``, on the PostgreSQL store (a namespace per run of it)."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.name = "nbdurable (PostgreSQL)"
        self.url = url
        self.namespaces: list[str] = []

    def fresh(self) -> None:
        self.namespaces.append(f"bench_{uuid.uuid4().hex[:10]}")

    def _open(self, d: Path) -> Any:
        from nbdurable.durable import session as engine
        from nbdurable.store import open_store

        engine.reset_session()
        store = open_store(_with_namespace(self.url, self.namespaces[-1]))
        session = engine.get_session()
        session.set_store(store, peers.RUN_ID)
        session.current = engine.StepContext("bench-step", "bench-step")
        import nbdurable

        return nbdurable.step

    def _close(self, h: Any) -> None:
        from nbdurable.durable import session as engine

        session = engine.get_session()
        session.current = None
        session.release()
        if session._store is not None:
            session._store.close()
        engine.reset_session()

    def cleanup(self) -> None:
        for ns in self.namespaces:
            _drop_schema(self.url, ns)


class DbosPg(peers.Dbos):
    """DBOS with its system database on the same PostgreSQL server."""

    name = "DBOS (PostgreSQL)"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.databases: list[str] = []

    def fresh(self) -> None:
        self.databases.append(f"bench_dbos_{uuid.uuid4().hex[:10]}")

    def _launch(self, d: Path) -> None:
        from urllib.parse import urlsplit

        from dbos import DBOS

        sysdb = urlsplit(self.url)._replace(path="/" + self.databases[-1]).geturl()
        DBOS(
            config={
                "name": "nbdurable-bench",
                "system_database_url": sysdb,
                "log_level": "ERROR",
            }
        )
        if self._fns is None:
            self._fns = self._define()
        DBOS.launch()
        self._live = True

    def cleanup(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            for db in self.databases:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


class LangGraphPg(peers.LangGraph):
    """LangGraph's functional API with ``PostgresSaver`` on the same server."""

    def __init__(self, url: str, durability: str | None = None) -> None:
        super().__init__(durability)
        self.name = "LangGraph (PostgresSaver" + (f", {durability})" if durability else ")")
        self.url = url
        self.schemas: list[str] = []

    def check(self) -> None:
        peers._require("langgraph")
        peers._require("langgraph.checkpoint.postgres")

    def fresh(self) -> None:
        self.schemas.append(f"bench_lg_{uuid.uuid4().hex[:10]}")

    def _entrypoint(self, d: Path) -> tuple[Any, Any]:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.func import entrypoint, task

        schema = self.schemas[-1]
        conn = psycopg.connect(
            self.url, autocommit=True, prepare_threshold=0, options=f"-c search_path={schema}"
        )
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        saver = PostgresSaver(conn)
        saver.setup()
        state = self._state
        bench_task = task(name="bench_task")(peers.produce)

        def call(i: int) -> Any:
            return bench_task(i).result()

        @entrypoint(checkpointer=saver)
        def bench_entry(inp: dict[str, int]) -> int:
            limit = min(inp["n"], state["limit"])
            state["times"] = timed_loop(limit, call, state["deadline"])
            if state["crash"]:
                raise peers._Stop()
            return len(state["times"])

        return bench_entry, conn

    def cleanup(self) -> None:
        for schema in self.schemas:
            _drop_schema(self.url, schema)


class RawInsert(peers.SimplePeer):
    """The floor: one prepared ``INSERT`` per call, committing on its own (autocommit).

    What any system that makes each call durable before the next one pays
    the server at least: one round trip and one WAL flush, with no Python of
    its own around it.
    """

    name = "raw INSERT per call (the floor)"

    def __init__(self, url: str) -> None:
        self.url = url
        self.schemas: list[str] = []

    def fresh(self) -> None:
        self.schemas.append(f"bench_raw_{uuid.uuid4().hex[:10]}")

    def _open(self, d: Path) -> Any:
        import psycopg

        conn = psycopg.connect(self.url, autocommit=True, prepare_threshold=0)
        schema = self.schemas[-1]
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".kv (key text COLLATE "C" PRIMARY KEY, '
            "value bytea)"
        )
        return conn, f'INSERT INTO "{schema}".kv VALUES (%s, %b)', schema

    def _rec(self, h: Any, i: int) -> Any:
        conn, sql, _ = h
        return conn.execute(sql, (peers.step_id(i), peers.VALUES[i].encode()))

    def _rep(self, h: Any, i: int) -> Any:
        conn, _, schema = h
        row = conn.execute(
            f'SELECT value FROM "{schema}".kv WHERE key = %s', (peers.step_id(i),)
        ).fetchone()
        if row is None:
            raise RuntimeError(f"row {i} was not recorded")
        return row

    def _close(self, h: Any) -> None:
        h[0].close()

    def cleanup(self) -> None:
        for schema in self.schemas:
            _drop_schema(self.url, schema)


# -- 1. per step ---------------------------------------------------------------------


def _server_counts(url: str) -> tuple[int, int]:
    """``(transactions committed, WAL flushes)`` so far, server-wide.

    Backends report their counts when idle or when they exit, not at each
    commit: read until two readings agree (the systems measured have closed
    their connections by then). Each reading's own connection commits too
    (three transactions, reported when it exits), so it reads from the
    ``postgres`` database and leaves that database's count out: read from the
    measured database, every reading would differ from the one before by its
    own commits, the loop never agree (five seconds a call) and the counts
    carry those commits.
    """
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    own = "postgres"
    reader = make_conninfo(url, dbname=own)
    if conninfo_to_dict(url).get("dbname") == own:
        own = ""  # the systems measured write there too: count it, own commits and all
    try:
        psycopg.connect(reader, connect_timeout=10).close()
    except psycopg.OperationalError:  # no such database, or no right to connect to it
        reader, own = url, ""  # as before: readings carry their own commits

    def read() -> tuple[int, int]:
        with psycopg.connect(reader, autocommit=True) as conn:
            commits = conn.execute(
                "SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database"
                " WHERE datname IS DISTINCT FROM %s",
                (own,),
            ).fetchone()[0]
            flushes = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0]
        return int(commits), int(flushes)

    last = read()
    for _ in range(20):
        time.sleep(0.25)
        now = read()
        if now == last:
            break
        last = now
    return last


def per_step(url: str, steps: list[int], size: int, root: Path, rounds: int = 3) -> Table:
    """Each system at each ``n``, in ``rounds`` interleaved rounds (see the notes it adds)."""
    t = Table(
        "PostgreSQL 1. Sub-steps on one server: record and replay, per step",
        [
            "system",
            "n",
            "record median",
            "record p99",
            "replay median",
            "replay p99",
            "record ×nbd",
            "record ×nbd by round",
            "record last ÷ first tenth",
            "replay ×nbd",
            "commits/step",
            "WAL flushes/step",
        ],
        text_columns=2,
    )
    systems: list[Any] = [
        NbdurablePg(url),
        peers.Nbdurable(),
        DbosPg(url),
        LangGraphPg(url),
        LangGraphPg(url, durability="sync"),
    ]
    systems[1].name = "nbdurable (embedded, for reference)"
    live = []
    for system in systems:
        try:
            system.check()
            live.append(system)
        except peers.Unavailable as exc:
            t.skipped.append(f"{system.name}: {exc}")
    failed: dict[Any, str] = {}
    try:
        for n in steps:
            peers.VALUES[:] = peers.make_values(size, n)
            # per system: record times, replay times, (commits, flushes, steps) per round
            got: dict[Any, list[Any]] = {s: [[], [], []] for s in live}
            for r in range(rounds):
                # Each round in another order: no system is always the one measured
                # first (a cold server) or right after the heaviest.
                for system in live[r % len(live) :] + live[: r % len(live)]:
                    if system not in failed:
                        try:
                            _measure(system, url, n, root / f"{r}-{n}-{id(system)}", got[system])
                        except Exception as exc:  # a peer's failure is reported, not fatal
                            failed[system] = f"{system.name}: {type(exc).__name__}: {exc}"
                        finally:
                            system.close()
            if live and live[0] is systems[0] and systems[0] not in failed:
                _rows(t, n, [(s, got[s]) for s in live if s not in failed])
    finally:
        for system in systems:
            system.close()
            if hasattr(system, "cleanup"):
                system.cleanup()
    t.skipped += failed.values()
    t.notes.append(
        f"each row pools {rounds} rounds, the systems measured one after another in each, "
        "in a rotated order: a machine whose speed drifts (a VM's neighbours) weighs on "
        "every system alike; 'by round' gives the lowest and highest ratio of one round's "
        "medians"
    )
    t.notes.append(
        "last ÷ first tenth: the median of a record run's last tenth of calls over its first "
        "tenth's (pooled over the rounds): growth with the run's length, within one run, "
        "which a drift of the machine between the rows of different n does not move"
    )
    t.notes.append(
        "LangGraph (PostgresSaver) saves a task's write on a background thread, so its record "
        "time does not include the commit that nbdurable and DBOS wait for; durability='sync' "
        "waits only for the checkpoint between supersteps, not for a task's write (LangGraph "
        "has no setting that does): compare commits and WAL flushes per step instead"
    )
    t.notes.append(
        "commits and WAL flushes per recorded step are the server's own counts over the "
        "record run (pg_stat_database, pg_stat_wal): exact only when nothing else uses the "
        "server meanwhile; the embedded store's row is its own server-less reference"
    )
    t.notes.append(
        f"values of {size} B; ×nbd is a system's median over nbdurable (PostgreSQL)'s at the "
        "same n: above 1 means nbdurable is cheaper per step"
    )
    return t


def _measure(system: Any, url: str, n: int, d: Path, into: list[Any]) -> None:
    """One round of ``system`` at ``n``: record, then replay from a fresh instance."""
    if hasattr(system, "fresh"):
        system.fresh()
    quiesce()
    before = _server_counts(url)
    rec = system.record(d, n)
    after = _server_counts(url)
    quiesce()
    rep = system.replay(d, len(rec.times))
    shutil.rmtree(d, ignore_errors=True)
    if rep.calls:
        raise RuntimeError(f"did not replay: {rep.calls} calls made again")
    into[0].append(rec.times)
    into[1].append(rep.times)
    into[2].append((after[0] - before[0], after[1] - before[1], len(rec.times)))


def _tenth(times: list[int]) -> int:
    return max(1, len(times) // 10)


def _rows(t: Table, n: int, measured: list[tuple[Any, list[Any]]]) -> None:
    """One row per system at ``n``: pooled medians, ratios to nbdurable (the first)."""
    if not measured:
        return
    base = measured[0][1]
    base_rec = [Summary.of(x).median_us for x in base[0]]
    ref_r = Summary.of([x for times in base[0] for x in times])
    ref_p = Summary.of([x for times in base[1] for x in times])
    for system, (recs, reps, counts) in measured:
        r = Summary.of([x for times in recs for x in times])
        p = Summary.of([x for times in reps for x in times])
        by_round = [Summary.of(x).median_us / b for x, b in zip(recs, base_rec, strict=True)]
        first = Summary.of([x for times in recs for x in times[: _tenth(times)]])
        last = Summary.of([x for times in recs for x in times[-_tenth(times) :]])
        steps = sum(c[2] for c in counts)
        t.add(
            system.name,
            n,
            fmt_us(r.median_us),
            fmt_us(r.p99_us),
            fmt_us(p.median_us),
            fmt_us(p.p99_us),
            fmt_ratio(r.median_us / ref_r.median_us),
            f"{fmt_ratio(min(by_round))}–{fmt_ratio(max(by_round))}",
            fmt_ratio(last.median_us / first.median_us),
            fmt_ratio(p.median_us / ref_p.median_us),
            f"{sum(c[0] for c in counts) / steps:.2f}",
            f"{sum(c[1] for c in counts) / steps:.2f}",
        )


# -- 2. concurrent kernels -------------------------------------------------------------


def _writer(url: str, run: str, n: int, size: int, out: Any) -> None:
    from nbdurable.durable import session as engine
    from nbdurable.store import open_store

    peers.VALUES[:] = peers.make_values(size, n)
    engine.reset_session()
    session = engine.get_session()
    session.set_store(open_store(url), run)
    session.current = engine.StepContext("bench-step", "bench-step")
    import nbdurable

    out.put(
        (
            perf_ns(),
            timed_loop(n, lambda i: nbdurable.step(peers.step_id(i), peers.produce, i)),
            perf_ns(),
        )
    )
    session.current = None
    session.release()


def concurrent(url: str, writers: int, n: int, size: int) -> Table:
    t = Table(
        f"PostgreSQL 2. {writers} kernels recording into one store at once",
        ["writers", "steps each", "throughput", "median", "p99"],
    )
    ns = f"bench_{uuid.uuid4().hex[:10]}"
    target = _with_namespace(url, ns)
    from nbdurable.store import open_store

    open_store(target).close()  # create the namespace once, before the race
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(target, f"run-{k}", n, size, out)) for k in range(writers)
    ]
    try:
        for p in procs:
            p.start()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    finally:
        _drop_schema(url, ns)
    start = min(r[0] for r in results)
    end = max(r[2] for r in results)
    times = [x for r in results for x in r[1]]
    s = Summary.of(times)
    t.add(
        writers,
        n,
        f"{len(times) / ((end - start) / 1e9):,.0f} steps/s",
        fmt_us(s.median_us),
        fmt_us(s.p99_us),
    )
    t.notes.append(
        f"{os.cpu_count()} cores for the {writers} writers and the server: with fewer cores "
        "than writers, the figures measure the machine as much as the store"
    )
    return t


# -- 3. wall time per recorded call, quiet and under load -------------------------------


def _loader(url: str, run: str, size: int, go: Any, stop: Any, ready: Any) -> None:
    """One of the other kernels of the loaded condition: record sub-steps while ``go`` is set.

    Each call records a fresh step id (a value of ``size`` random characters),
    so every one is a commit on the server, as a kernel running a long
    recorded loop asks for.
    """
    from nbdurable.durable import session as engine
    from nbdurable.store import open_store

    engine.reset_session()
    session = engine.get_session()
    session.set_store(open_store(url), run)
    session.current = engine.StepContext("bench-load", "bench-load")
    import nbdurable

    def make(i: int) -> str:
        return os.urandom((size + 1) // 2).hex()[:size]

    # The process's one-off costs (imports, the first fingerprint of a library
    # function) are paid before the rounds, as the measured systems pay theirs.
    nbdurable.step("load:warm", make, -1)
    ready.put(run)
    i = 0
    while not stop.is_set():
        if not go.wait(0.1):
            continue
        nbdurable.step(f"load:{i}", make, i)
        i += 1
    session.current = None
    session.release()


class Load:
    """``count`` processes recording into ``url`` (one namespace, a run each) when switched on.

    Started once (a process takes a second or two to import nbdurable) and
    switched on and off between rounds, so the quiet and the loaded condition
    can alternate round by round.
    """

    def __init__(self, url: str, count: int, size: int) -> None:
        self.url, self.count = url, count
        self.namespace = f"bench_load_{uuid.uuid4().hex[:10]}"
        target = _with_namespace(url, self.namespace)
        ctx = multiprocessing.get_context("spawn")
        self.go, self.stop = ctx.Event(), ctx.Event()
        ready = ctx.Queue()
        self.procs = []
        if count:
            from nbdurable.store import open_store

            open_store(target).close()  # the namespace exists before the writers race
            self.procs = [
                ctx.Process(
                    target=_loader,
                    args=(target, f"load-{k}", size, self.go, self.stop, ready),
                    daemon=True,
                )
                for k in range(count)
            ]
            for p in self.procs:
                p.start()
            for _ in self.procs:
                ready.get(timeout=300)

    def on(self) -> None:
        self.go.set()
        time.sleep(0.2 if self.procs else 0)  # every writer recording again

    def off(self) -> None:
        self.go.clear()

    def close(self) -> None:
        self.stop.set()
        self.go.set()
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        if self.procs:
            _drop_schema(self.url, self.namespace)


def versus(
    url: str, n: int, size: int, rounds: int, load: int, root: Path
) -> tuple[Table, dict[tuple[str, str], list[float]]]:
    """nbdurable, LangGraph and DBOS by wall time per recorded call, quiet and under load.

    Wall time of the whole record run divided by its calls: every commit a
    system makes for them is inside it, LangGraph's background writes
    included (``invoke()`` returns only after they are saved). Each round
    measures each system once quiet and once with ``load`` other processes
    recording into the same server, in a rotated order, and the record is
    checked by a replay that must call nothing. Also returns each peer's
    ratios over nbdurable per round, by ``(condition, peer)``.
    """
    t = Table(
        f"PostgreSQL 3. Wall time per recorded call, quiet and under load ({load} other kernels)",
        [
            "condition",
            "system",
            "wall/call median",
            "by round",
            "per-call median",
            "×nbd median",
            "×nbd by round",
            "1-min load",
        ],
        text_columns=2,
    )
    systems: list[Any] = [NbdurablePg(url), LangGraphPg(url), DbosPg(url), RawInsert(url)]
    live = []
    for system in systems:
        try:
            system.check()
            live.append(system)
        except peers.Unavailable as exc:
            t.skipped.append(f"{system.name}: {exc}")
    conditions = ["quiet", f"load {load}"] if load else ["quiet"]
    # per condition, per system: per round (wall ns per call, per-call median µs)
    got: dict[str, dict[Any, list[tuple[float, float]]]] = {
        c: {s: [] for s in live} for c in conditions
    }
    loads: dict[str, list[float]] = {c: [] for c in conditions}
    failed: dict[Any, str] = {}
    found: dict[tuple[str, str], list[float]] = {}
    peers.VALUES[:] = peers.make_values(size, n)
    background = Load(url, load, size)
    try:
        # An untimed run of each first: a process's one-off costs (imports, a
        # library's version looked up for a function's first fingerprint, the
        # first connection) are not a recorded call's.
        for system in live:
            try:
                _wall(system, min(n, 5), root / f"warm-{id(system)}")
            except Exception as exc:  # a peer's failure is reported, not fatal
                failed[system] = f"{system.name}: {type(exc).__name__}: {exc}"
            finally:
                system.close()
        for r in range(rounds):
            for condition in conditions if r % 2 == 0 else conditions[::-1]:
                if condition != "quiet":
                    background.on()
                try:
                    for system in live[r % len(live) :] + live[: r % len(live)]:
                        if system in failed:
                            continue
                        try:
                            d = root / f"v{r}-{condition}-{id(system)}"
                            got[condition][system].append(_wall(system, n, d))
                        except Exception as exc:  # a peer's failure is reported, not fatal
                            failed[system] = f"{system.name}: {type(exc).__name__}: {exc}"
                        finally:
                            system.close()
                    loads[condition].append(os.getloadavg()[0])
                finally:
                    background.off()
    finally:
        background.close()
        for system in systems:
            system.close()
            if hasattr(system, "cleanup"):
                system.cleanup()
    base = systems[0]
    for condition in conditions:
        if base in failed or not got[condition].get(base):
            continue
        ref = got[condition][base]
        for system in live:
            if system in failed:
                continue
            mine = got[condition][system]
            walls = [w for w, _ in mine]
            ratios = [w / b for (w, _), (b, _) in zip(mine, ref, strict=True)]
            lo, hi = min(loads[condition]), max(loads[condition])
            if system is not base and not isinstance(system, RawInsert):
                found[(condition, system.name)] = ratios
            t.add(
                condition,
                system.name,
                fmt_us(_median(walls)),
                f"{fmt_us(min(walls))}–{fmt_us(max(walls))}",
                fmt_us(_median([m for _, m in mine])),
                fmt_ratio(_median(ratios)),
                f"{fmt_ratio(min(ratios))}–{fmt_ratio(max(ratios))}",
                f"{lo:.1f}–{hi:.1f}",
            )
    t.skipped += failed.values()
    t.notes.append(
        f"{n} recorded calls per run, values of {size} B; wall/call is the record run's wall "
        "time over its calls: every commit is in it, also LangGraph's, which its background "
        "thread makes while the next task runs and invoke() waits for before returning; "
        "per-call median is the caller's time of one call (LangGraph's leaves its commit out)"
    )
    t.notes.append(
        f"{rounds} rounds; each measures every system once per condition, the systems in a "
        "rotated order, the conditions alternating; 'by round' is the lowest and highest of "
        "the rounds; ×nbd is a system's wall/call over nbdurable's in the same round and "
        "condition (above 1: nbdurable is cheaper)"
    )
    if load:
        t.notes.append(
            f"load {load}: {load} other processes each record nbdurable sub-steps of {size} B "
            "into one namespace of the same server, as fast as they can, for the whole of the "
            f"condition (on {os.cpu_count()} cores); the 1-min load average is read at the end "
            "of each condition's round and counts the benchmark itself"
        )
    t.notes.append(
        "the floor is one prepared INSERT of the same value per call on a connection of its "
        "own, committing on its own: one round trip and one WAL flush, no Python around it; "
        "nbdurable's wall/call over it (1 / its ×nbd) is what nbdurable adds to what equal "
        "durability costs any system"
    )
    t.notes.append(
        "every record run is replayed by a fresh instance, which must call nothing: a record "
        "that did not reach the server fails the system's row instead of flattering it"
    )
    return t, found


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _wall(system: Any, n: int, d: Path) -> tuple[float, float]:
    """One record run of ``system``: (wall µs per call, per-call median µs); then its replay."""
    if hasattr(system, "fresh"):
        system.fresh()
    quiesce()
    rec = system.record(d, n)
    rep = system.replay(d, len(rec.times))
    shutil.rmtree(d, ignore_errors=True)
    if rep.calls or len(rec.times) != n:
        raise RuntimeError(f"did not replay: {rep.calls} calls made again")
    return rec.wall_ns / len(rec.times) / 1e3, Summary.of(rec.times).median_us


def _table(measured: tuple[Table, Any]) -> Table:
    return measured[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__)
    parser.add_argument("--url", default=DEFAULT_URL, help="a PostgreSQL server")
    parser.add_argument("--steps", default="100,1000,10000", help="step counts, comma-separated")
    parser.add_argument("--size", type=int, default=1000, help="bytes per recorded value")
    parser.add_argument("--writers", type=int, default=8, help="concurrent kernels")
    parser.add_argument("--writer-steps", type=int, default=500, help="steps per writer")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds of sections 1 and 3"
    )
    parser.add_argument(
        "--load", type=int, default=8, help="other kernels recording in section 3's loaded rounds"
    )
    parser.add_argument(
        "--calls", type=int, default=VERSUS_CALLS, help="recorded calls per run in section 3"
    )
    parser.add_argument(
        "--only", default="1,2,3", help="sections to run, comma-separated (default: 1,2,3)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("NBDURABLE_KEY", "bench-" + "k" * 16)
    steps = [int(s) for s in args.steps.split(",") if s]
    only = {s.strip() for s in args.only.split(",")}
    with tempfile.TemporaryDirectory(prefix="nbdurable-bench-pg-") as tmp:
        started = time.monotonic()
        # Each table is printed as soon as it is measured: a later section that
        # fails does not take an earlier one's figures with it.
        sections = {
            "1": lambda: per_step(args.url, steps, args.size, Path(tmp), args.rounds),
            "2": lambda: concurrent(args.url, args.writers, args.writer_steps, args.size),
            "3": lambda: _table(
                versus(args.url, args.calls, args.size, args.rounds, args.load, Path(tmp))
            ),
        }
        for name, section in sections.items():
            if name in only:
                print(section().text(), flush=True)
                print()
        print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
