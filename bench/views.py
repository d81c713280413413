"""Section 7: views and sub-steps at scale (``--only views``; ``python -m bench.views`` alone).

Two runs are built through the engine, with no kernel (the session runs each
``%%step`` cell's body in-process, as ``bench.bytes_memory`` does), each for
a notebook file written first, so every view reads its cells:

- **many steps**: a notebook of N ``%%step`` cells, each reading the
  variable the one before it made (``v{i} = v{i-1} + 1``), every one
  recorded;
- **many sub-steps**: a notebook of a few ``%%step`` cells whose bodies call
  ``step(id, fetch, i)`` M times in all (100,000 at full size).

For the second run, each sub-step call is timed from the caller's side as it
is recorded, and again as it is replayed (a new session and ``Store`` on the
same directory, the step's body running again as it does after a crash:
``session.current`` set as the engine sets it while a body runs). *Flat*
compares the median of the last tenth of calls with the first tenth's: the
issue's target is within 10 %.

Then, on each run, the time to open each view, best of a few tries:

- ``nbdurable status NB``: the CLI's function in this process, and the
  command as a subprocess (its interpreter's start and imports included);
- the side panel and cell marks: the data ``GET /nbdurable/api/steps``
  answers with (:func:`nbdurable.server.marks.step_marks`);
- ``%step panel``: the widget panel's read of its rows
  (:meth:`nbdurable.ipython.panel.StepPanel.refresh`'s reread), in the
  session that replayed the run.

The target is 300 ms for each. Nothing here asserts a time.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from bench.report import Table
from bench.stats import fmt_us

#: The sub-steps' function and the loop the step bodies run, timing each call, in a
#: module without a file: nbdurable identifies it by its name, as a library (see
#: peers.py), and does not record its globals as process state the step changed. The
#: times go to a module of their own (``sink``): a global the loop reads is part of its
#: fingerprint, and a list of 100,000 times would be hashed whenever a view asks
#: whether the step's inputs changed (a cost of this harness, not of a view).
_SINK = types.ModuleType("bench_views_times")
_SINK.TIMES = []
_CALLS = types.ModuleType("bench_views_calls")
_CALLS.sink = _SINK
exec(
    "from time import perf_counter_ns\n"
    "from nbdurable import step\n"
    "def fetch(i):\n"
    "    return i * 2\n"
    "def timed_calls(start, count):\n"
    "    total, times = 0, sink.TIMES\n"
    "    for i in range(start, start + count):\n"
    "        t = perf_counter_ns()\n"
    "        total += step(f'c{i}', fetch, i)\n"
    "        times.append(perf_counter_ns() - t)\n"
    "    return total\n",
    _CALLS.__dict__,
)
timed_calls = _CALLS.timed_calls


def _notebook(path: Path, cells: list[str]) -> None:
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "id": f"c{k:06d}",
                "metadata": {},
                "source": src,
                "outputs": [],
                "execution_count": None,
            }
            for k, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def _session(notebook: Path) -> Any:
    """A fresh session on ``notebook``'s run (its store beside it), as a new kernel has."""
    from bench.bytes_memory import _Host
    from nbdurable import step
    from nbdurable.durable import session as sessions

    sessions.reset_session()
    ns: dict[str, Any] = {"__name__": "__main__", "__session__": str(notebook), "step": step}
    ns["timed_calls"] = timed_calls
    return sessions.get_session(_Host(ns))


def _run_cells(session: Any, cells: list[str]) -> None:
    for src in cells:
        head, body = src.split("\n", 1)
        session.steps.run_step(body, name=head.split()[1])


def many_steps(root: Path, n: int) -> tuple[Path, Any]:
    """A notebook of ``n`` recorded steps; ``(notebook, the session that recorded it)``."""
    nb = root / "steps" / "steps.ipynb"
    nb.parent.mkdir(parents=True)
    cells = ["%%step s0\nv0 = 0"] + [f"%%step s{i}\nv{i} = v{i - 1} + 1" for i in range(1, n)]
    _notebook(nb, cells)
    session = _session(nb)
    with contextlib.redirect_stdout(io.StringIO()):
        _run_cells(session, cells)
    return nb, session


def many_substeps(root: Path, total: int, steps: int) -> tuple[Path, Any, list[int], list[int]]:
    """A notebook of ``steps`` steps making ``total`` sub-step calls in all, recorded
    and then replayed: ``(notebook, the replaying session, record ns, replay ns)``."""
    from nbdurable.durable.context import StepContext

    nb = root / "subs" / "subs.ipynb"
    nb.parent.mkdir(parents=True)
    per = total // steps
    cells = [f"%%step b{k}\nr{k} = timed_calls({k * per}, {per})" for k in range(steps)]
    _notebook(nb, cells)
    _SINK.TIMES.clear()
    session = _session(nb)
    with contextlib.redirect_stdout(io.StringIO()):
        _run_cells(session, cells)
    record = list(_SINK.TIMES)
    session.store.close()
    _SINK.TIMES.clear()
    session = _session(nb)
    for k in range(steps):  # each body again, as after a crash: every call replays
        session.current = StepContext(f"name:b{k}", f"b{k}")
        timed_calls(k * per, per)
    session.current = None
    replay = list(_SINK.TIMES)
    return nb, session, record, replay


def _best(fn: Any, tries: int) -> tuple[float, float]:
    """The fastest of ``tries`` calls of ``fn``: ``(wall s, CPU s)``, CPU this process's
    own and its finished children's (the subprocess row)."""
    out = []
    for _ in range(tries):
        cpu = _cpu()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t, _cpu() - cpu))
    return min(out)


def _cpu() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _forget() -> None:
    """Empty this process's caches of saved cells (as a new process has them)."""
    from nbdurable import status
    from nbdurable.identity import cellpython, locate

    cellpython.python_of.cache_clear()
    status._written.cache_clear()
    status._python_source_fp.cache_clear()
    locate._SAVED.clear()


def _status_inprocess(nb: Path) -> None:
    from nbdurable import cli

    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(["status", str(nb)])


def _status_subprocess(nb: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "nbdurable", "status", str(nb)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _panel_reread(session: Any) -> Any:
    from nbdurable.ipython.panel import StepPanel

    panel = StepPanel(session)
    return lambda: panel._reread()


def view_times(nb: Path, session: Any, tries: int) -> dict[str, tuple[float, float]]:
    """``(wall s, CPU s)`` to open each view of ``nb``'s run (best of ``tries``)."""
    from nbdurable.server.marks import step_marks

    def first() -> None:
        _forget()
        _status_inprocess(nb)

    reread = _panel_reread(session)
    return {
        "status, in process, first look (no cell seen yet)": _best(first, tries),
        "status, in process, again": _best(lambda: _status_inprocess(nb), tries),
        "status, subprocess (start and imports included)": _best(
            lambda: _status_subprocess(nb), tries
        ),
        "side panel: GET /nbdurable/api/steps (step_marks)": _best(lambda: step_marks(nb), tries),
        "%step panel: its rows (StepPanel reread)": _best(reread, tries),
    }


def _ms(secs: tuple[float, float]) -> str:
    return f"{secs[0] * 1e3:,.0f} ms ({secs[1] * 1e3:,.0f} ms CPU)"


def _tenth(times: list[int]) -> tuple[float, float]:
    k = max(len(times) // 10, 1)
    return statistics.median(times[:k]) / 1e3, statistics.median(times[-k:]) / 1e3


def views(cfg: Any, root: Path) -> tuple[Table, dict[str, Any]]:
    """Section 7: the table and the figures."""
    n_steps, n_subs, sub_steps = cfg.view_steps, cfg.view_substeps, cfg.view_substep_steps
    t = Table(
        "7. Views and sub-steps at scale",
        ["run", "what", "figure", "target"],
        text_columns=2,
    )
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=root, prefix="views-") as d:
        nb, session = many_steps(Path(d), n_steps)
        for what, secs in view_times(nb, session, cfg.view_tries).items():
            t.add(f"{n_steps:,} steps", what, _ms(secs), "< 300 ms")
            found[f"steps: {what}"] = secs
        session.store.close()
        nb, session, record, replay = many_substeps(Path(d), n_subs, sub_steps)
        run = f"{n_subs:,} sub-steps in {sub_steps} steps"
        for label, times in (("record", record), ("replay", replay)):
            first, last = _tenth(times)
            t.add(
                run,
                f"{label} per call: first tenth → last tenth (median)",
                f"{fmt_us(first)} → {fmt_us(last)} ({last / first:.2f}×)",
                "≤ 1.10×",
            )
            found[f"sub-steps: {label}"] = (first, last)
        for what, secs in view_times(nb, session, cfg.view_tries).items():
            t.add(run, what, _ms(secs), "< 300 ms")
            found[f"sub-steps: {what}"] = secs
        session.store.close()
    t.notes.append(
        f"views: wall time (CPU time in brackets: this process's and its children's), best "
        f"of {cfg.view_tries}; 'first look' empties the process's caches of saved cells first"
    )
    return t, found


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m bench.views", description=__doc__)
    p.add_argument("--steps", type=int, default=2_000)
    p.add_argument("--substeps", type=int, default=100_000)
    p.add_argument("--substep-steps", type=int, default=4)
    p.add_argument("--tries", type=int, default=3)
    a = p.parse_args(argv)
    cfg = types.SimpleNamespace(
        view_steps=a.steps,
        view_substeps=a.substeps,
        view_substep_steps=a.substep_steps,
        view_tries=a.tries,
    )
    with tempfile.TemporaryDirectory() as root:
        table, _ = views(cfg, Path(root))
    print(table.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
