"""Section 3 and part of 5: ``%%step`` cells in an in-process IPython shell.

For each case a cell body is run three ways: plainly (``run_cell(body)``),
under ``%%step`` the first time (it executes and records), and under
``%%step`` again from a fresh session on the same store (it replays: the
body does not run). Overheads are taken against IPython's own cost:

- record overhead = ``%%step`` first run − the plain cell;
- replay overhead = ``%%step`` replay − an empty cell (``pass``);

and compared with ``pickle.dump`` / ``pickle.load`` of the same values to a
file (protocol 5, which nbdurable also uses).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import shutil
import statistics
import sys
import types
from pathlib import Path
from typing import Any

from bench.peers import disk_usage
from bench.report import Table
from bench.stats import Summary, fmt_bytes, fmt_ratio, fmt_us, perf_ns, quiesce


def _shell() -> Any:
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    import nbdurable

    # IPython's history database is written (and fsynced) by a background thread
    # that holds a lock the next cell's store_inputs waits on: several ms of
    # noise per cell that has nothing to do with nbdurable. Keep it in memory.
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    if "step" not in shell.magics_manager.magics["cell"]:
        nbdurable.load_ipython_extension(shell)
    return shell


def _session(shell: Any, d: Path) -> Any:
    """A fresh nbdurable session on the store at ``d`` (what a kernel restart gives)."""
    from nbdurable.durable import session as engine
    from nbdurable.ipython.host import session_for
    from nbdurable.store import open_store

    engine.reset_session()
    session = session_for(shell)
    session.set_store(open_store(d), "bench-cells")
    return session


def _run(shell: Any, src: str) -> int:
    """Run one cell; return its wall time in ns. Raises if the cell failed."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        t0 = perf_ns()
        res = shell.run_cell(src, store_history=True)
        dt = perf_ns() - t0
    if not res.success:
        err = res.error_in_exec or res.error_before_exec
        raise RuntimeError(f"bench cell failed: {err!r}\n{src}\n{sink.getvalue()[-2000:]}")
    return dt


def _pickle_times(value: Any, path: Path) -> tuple[int, int]:
    t0 = perf_ns()
    with open(path, "wb") as f:
        pickle.dump(value, f, protocol=5)
    t1 = perf_ns()
    with open(path, "rb") as f:
        pickle.load(f)
    t2 = perf_ns()
    return t1 - t0, t2 - t1


def _case(
    shell: Any, d: Path, reps: int, body: Any, names: list[str], tag: str
) -> dict[str, list[int]]:
    """Time the plain, record and replay runs of ``body(k)`` for k in 0..reps-1."""
    out: dict[str, list[int]] = {
        k: [] for k in ("plain", "record", "replay", "empty", "dump", "load")
    }
    session = _session(shell, d)
    for k in range(reps):
        quiesce()
        out["empty"].append(_run(shell, "pass"))
        out["plain"].append(_run(shell, body(k)))
        quiesce()
        out["record"].append(_run(shell, f"%%step {tag}{k}\n{body(k)}"))
        value = {n: shell.user_ns[n] for n in names} if len(names) > 1 else shell.user_ns[names[0]]
        # A new file per run, kept until the case ends, as nbdurable keeps each record.
        dump, load = _pickle_times(value, d.parent / f"{tag}-{k}.pickle")
        out["dump"].append(dump)
        out["load"].append(load)
        del value
    recorded = sum(1 for s in session.status.values() if s[0] == "recorded")
    if recorded != reps:
        raise RuntimeError(f"{tag}: {recorded} of {reps} steps were recorded")
    session = _session(shell, d)
    for k in range(reps):
        for n in names:
            shell.user_ns.pop(n, None)
        quiesce()
        out["replay"].append(_run(shell, f"%%step {tag}{k}\n{body(k)}"))
        missing = [n for n in names if n not in shell.user_ns]
        if missing:
            raise RuntimeError(f"{tag}{k}: replay did not restore {missing}")
    if session.saved.steps != reps:
        raise RuntimeError(f"{tag}: {session.saved.steps} of {reps} steps replayed (want all)")
    for k in range(reps):
        os.unlink(d.parent / f"{tag}-{k}.pickle")
    return out


_ARRAYS = "nbdurable_bench_arrays"


def _prepare_arrays(count: int, n: int) -> None:
    """A module the large cell gets its arrays from: ``get(k)`` is array k, made now."""
    import numpy as np

    mod = types.ModuleType(_ARRAYS)
    arrays = [np.random.default_rng(k).random(n) for k in range(count)]
    mod.get = arrays.__getitem__  # type: ignore[attr-defined]
    sys.modules[_ARRAYS] = mod


def _med(ns: list[int]) -> float:
    return statistics.median(ns) / 1e3


def cells(cfg: Any, root: Path) -> tuple[Table, Table, dict[str, float]]:
    """Section 3 (and 5b: a 100 MB input restored into ten steps)."""
    import numpy as np  # noqa: F401  (the cells import it; fail here if missing)

    shell = _shell()
    shell.run_cell("import numpy as np")
    t = Table(
        "3. Cell-level %%step: overhead against plain pickle.dump/load of the same values",
        [
            "cell",
            "n",
            "plain cell",
            "%%step record",
            "record overhead",
            "pickle.dump",
            "overhead/dump",
            "%%step replay",
            "empty cell",
            "replay overhead",
            "pickle.load",
            "overhead/load",
        ],
    )
    found: dict[str, float] = {}
    n_big = cfg.big_bytes // 8
    cases = [
        (
            "small variables",
            cfg.cell_reps_small,
            lambda k: (
                f"a = {k}\nb = 'text {k} ' * 10\nc = list(range({k}, {k} + 20))\n"
                f"d = {{'k': {k}, 'name': 'run {k}'}}"
            ),
            ["a", "b", "c", "d"],
            "small",
        ),
        (
            f"{fmt_bytes(cfg.big_bytes)} numpy array",
            cfg.cell_reps_big,
            # The cell binds an array made before timing (distinct per run, so each
            # record is a new blob): making 100 MB costs 300-450 ms here and varies
            # by more than the overhead being measured.
            lambda k: f"import {_ARRAYS}\nbig = {_ARRAYS}.get({k})",
            ["big"],
            "big",
        ),
    ]
    _prepare_arrays(cfg.cell_reps_big, n_big)
    for label, reps, body, names, tag in cases:
        d = root / f"cells-{tag}"
        r = _case(shell, d, reps, body, names, tag)
        # Medians of paired differences: run k's record against run k's plain cell
        # (making a 100 MB array varies by ±50 ms from run to run on this VM).
        rec_over = _med([a - b for a, b in zip(r["record"], r["plain"], strict=True)])
        rep_over = _med([a - b for a, b in zip(r["replay"], r["empty"], strict=True)])
        t.add(
            label,
            reps,
            fmt_us(_med(r["plain"])),
            fmt_us(_med(r["record"])),
            fmt_us(rec_over),
            fmt_us(_med(r["dump"])),
            fmt_ratio(rec_over / _med(r["dump"])),
            fmt_us(_med(r["replay"])),
            fmt_us(_med(r["empty"])),
            fmt_us(rep_over),
            fmt_us(_med(r["load"])),
            fmt_ratio(rep_over / _med(r["load"])),
        )
        found[f"{tag}.record_over_dump"] = rec_over / _med(r["dump"])
        found[f"{tag}.replay_over_load"] = rep_over / _med(r["load"])
        found[f"{tag}.record_over_us"] = rec_over
        found[f"{tag}.replay_over_us"] = rep_over
        found[f"{tag}.record_p99_us"] = Summary.of(r["record"]).p99_us
        shutil.rmtree(d, ignore_errors=True)
        shell.run_cell("big = None")
    warm = _through_the_store(cfg, root, found)
    sys.modules.pop(_ARRAYS, None)
    t.notes += [
        "medians over n runs of each cell, each record a new step; record overhead = median "
        "over k of (%%step record k − plain cell k); replay overhead = median over k of "
        "(%%step replay k − empty cell k)",
        "replay = a fresh session on the same store (as after a kernel restart); the body "
        "does not run, its variables are restored",
        "pickle.dump/load: protocol 5, to and from a new file on the same disk per run, kept "
        "until the case ends as nbdurable keeps its records; no fsync (nbdurable's default "
        "durability does not fsync either)",
    ]
    size = _restored_into_ten(cfg, shell, root)
    return t, warm, size, found


def _through_the_store(cfg: Any, root: Path, found: dict[str, float]) -> Table:
    """One large variable through the store and through pickle, freed memory reused.

    On this VM a write into page cache the guest never touched costs ~3 ms
    per MB (first-touch faults), more than the write itself, and how much of
    it a run pays depends on what ran before: table 3 shows it, for both
    sides. Here each write's file is deleted right after it is read back, so
    the next write reuses that memory and the figures compare the work each
    does: ``Store.put_blob`` (what recording a variable writes) against
    ``pickle.dump``, and ``Store.get_blob`` + unpickle against ``pickle.load``.
    """
    from nbdurable.store import open_store, values

    t = Table(
        f"3b. One {fmt_bytes(cfg.big_bytes)} variable through the store, freed memory reused",
        [
            "n",
            "record (put_blob)",
            "pickle.dump",
            "ratio",
            "restore (get_blob + loads)",
            "pickle.load",
            "ratio",
        ],
    )
    get = sys.modules[_ARRAYS].get
    d = root / "cells-through"
    store = open_store(d / "store")
    times: dict[str, list[int]] = {k: [] for k in ("put", "get", "dump", "load")}
    for k in range(cfg.cell_reps_big):
        value = get(k)
        quiesce()
        t0 = perf_ns()
        sha, _ = store.put_blob(*values.dumps_parts(value))
        t1 = perf_ns()
        blob = store.get_blob(sha)
        assert blob is not None
        back = values.loads(blob.stream, {}, blob.buffers)
        t2 = perf_ns()
        del back, blob
        store.delete("b/" + sha)
        path = d / f"p{k}.pickle"
        dump, load = _pickle_times(value, path)
        os.unlink(path)
        times["put"].append(t1 - t0)
        times["get"].append(t2 - t1)
        times["dump"].append(dump)
        times["load"].append(load)
    store.close()
    shutil.rmtree(d, ignore_errors=True)
    rec, dmp = _med(times["put"]), _med(times["dump"])
    res, lod = _med(times["get"]), _med(times["load"])
    t.add(
        cfg.cell_reps_big,
        fmt_us(rec),
        fmt_us(dmp),
        fmt_ratio(rec / dmp),
        fmt_us(res),
        fmt_us(lod),
        fmt_ratio(res / lod),
    )
    t.notes.append(
        "medians; each write's file is deleted after it is read back, so the next write "
        "reuses its memory (see table 3 for writes into memory never touched before)"
    )
    found["big_warm.record_over_dump"] = rec / dmp
    found["big_warm.replay_over_load"] = res / lod
    return t


def _restored_into_ten(cfg: Any, shell: Any, root: Path) -> Table:
    """A large input restored into ten steps: stored once by content, not ten times."""
    t = Table(
        "5b. Store size: one large value held by ten steps",
        ["case", "value", "store on disk", "per step", "vs ten pickles"],
    )
    d = root / "cells-ten"
    _session(shell, d)
    base = disk_usage(d)
    n_big = cfg.big_bytes // 8
    _run(shell, f"data = np.random.default_rng(7).random({n_big})")
    for k in range(10):
        _run(shell, f"%%step hold{k}\nx{k} = data")
    from nbdurable.durable import session as engine

    engine.reset_session()  # closes the store, so SQLite's WAL is folded in
    used = disk_usage(d) - base
    pickled = 10 * len(pickle.dumps(shell.user_ns["data"], protocol=5))
    t.add(
        "hold0..hold9",
        fmt_bytes(cfg.big_bytes),
        fmt_bytes(used),
        fmt_bytes(used / 10),
        fmt_ratio(used / pickled),
    )
    t.notes.append(
        "a plain cell makes the array; ten steps `%%step holdK` bind it (xK = data) and "
        "record it; variables are stored once by content, so the store holds one copy, not ten"
    )
    for k in range(10):
        shell.user_ns.pop(f"x{k}", None)
    shell.run_cell("data = None")
    shutil.rmtree(d, ignore_errors=True)
    return t
