"""Section 4: the research notebook rerun after a kernel restart, end to end under nbclient.

Three things are timed, each one whole ``NotebookClient.execute()`` (kernel
start, cells, shutdown):

- a bare kernel: a notebook with one ``pass`` cell;
- the research notebook's first run (every call made and recorded);
- the same notebook in a fresh kernel on the same store: everything replays.

The simulated model has no latency (``NBDURABLE_SIM_LATENCY=0``) so the
first run measures recording, not sleeping; its ledger proves the replays
made no call. The notebook is the bundled ``research_agent.ipynb`` when
present, else an equivalent built here from :mod:`nbdurable.demo.sim`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import Table
from bench.stats import fmt_us

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "nbdurable" / "notebooks" / "research_agent.ipynb"

#: The research notebook of the article, as nbdurable cells (used if the bundled one is absent).
CELLS = [
    "%load_ext nbdurable\n"
    "from nbdurable import step\n"
    "from nbdurable.demo.sim import llm_plan, search_web, llm_answer, llm_synthesize\n"
    "topic = 'durable notebooks'",
    '%%step plan\nplan = llm_plan(topic)\nprint(plan["title"])',
    "%%step research\n"
    "findings = []\n"
    'for i, q in enumerate(plan["subquestions"]):\n'
    '    docs = step(f"search:{i}", search_web, q)\n'
    '    findings.append(step(f"answer:{i}", llm_answer, q, docs))',
    "%%step synthesize\nreport = llm_synthesize(topic, findings)\nreport",
]


def _kernel_name() -> str:
    """A kernel spec running this interpreter (as tests/kernel_util.py does)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        spec = None
    if spec is not None:
        exe = spec.argv[0] if spec.argv else ""
        names = {"python", "python3", f"python3.{sys.version_info[1]}"}
        if exe in names or (os.path.exists(exe) and os.path.samefile(exe, sys.executable)):
            return "python3"
    from ipykernel.kernelspec import install

    install(user=True, kernel_name="python3")
    return "python3"


def _notebook(cells: list[str]) -> Any:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def _cells_time(nb: Any) -> float:
    """Seconds the kernel spent in cells, from nbclient's timing metadata."""
    from datetime import datetime

    total = 0.0
    for cell in nb.cells:
        ex = cell.get("metadata", {}).get("execution", {})
        a, b = ex.get("iopub.execute_input"), ex.get("shell.execute_reply")
        if a and b:
            fa = datetime.fromisoformat(a.replace("Z", "+00:00"))
            fb = datetime.fromisoformat(b.replace("Z", "+00:00"))
            total += (fb - fa).total_seconds()
    return total


def _execute(nb: Any, cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run ``nb`` in a fresh kernel; return (wall seconds, seconds spent in cells)."""
    from nbclient import NotebookClient

    kernel_env = dict(os.environ)
    kernel_env.update(env)
    kernel_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), kernel_env.get("PYTHONPATH", "")) if p
    )
    client = NotebookClient(
        nb, timeout=300, kernel_name=_kernel_name(), resources={"metadata": {"path": str(cwd)}}
    )
    t0 = time.perf_counter()
    client.execute(env=kernel_env)
    return time.perf_counter() - t0, _cells_time(nb)


def _ledger_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def _load_research() -> tuple[Any, str]:
    import nbformat

    if BUNDLED.exists():
        return nbformat.read(BUNDLED, as_version=4), f"bundled {BUNDLED.relative_to(REPO)}"
    return _notebook(CELLS), "built-in equivalent of the research notebook (bench/e2e.py)"


def e2e(cfg: Any, root: Path) -> tuple[Table, dict[str, float]]:
    """Section 4."""
    import copy

    work = root / "e2e"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ledger = work / "ledger.jsonl"
    env = {
        "NBDURABLE_DIR": str(work / "store"),
        "NBDURABLE_NOTEBOOK": str(work / "research_agent.ipynb"),
        "NBDURABLE_SIM_LEDGER": str(ledger),
        "NBDURABLE_SIM_LATENCY": "0",
        "NBDURABLE_SIM_MAILBOX": str(work / "mailbox.sqlite"),
    }
    research, which = _load_research()
    t = Table(
        "4. Restart and replay end to end (nbclient, real kernels)",
        ["run", "n", "median", "min", "max", "minus bare kernel", "in cells"],
    )
    bare_nb = _notebook(["pass"])
    if not cfg.quick:
        _execute(copy.deepcopy(bare_nb), work, {})  # warm the OS caches and the kernel spec
    first, first_cells = _execute(copy.deepcopy(research), work, env)
    calls = _ledger_lines(ledger)
    if calls == 0:
        raise RuntimeError("the first run made no simulated call: is the ledger set?")
    bare, replay, bare_cells, replay_cells = [], [], [], []
    for _ in range(cfg.e2e_reps):
        b_s, b_c = _execute(copy.deepcopy(bare_nb), work, {})
        r_s, r_c = _execute(copy.deepcopy(research), work, env)
        bare.append(b_s)
        bare_cells.append(b_c)
        replay.append(r_s)
        replay_cells.append(r_c)
        if _ledger_lines(ledger) != calls:
            raise RuntimeError("the rerun called the simulated model: it did not replay")
    b = statistics.median(bare)
    r = statistics.median(replay)
    t.add(
        "bare kernel (one `pass` cell)",
        len(bare),
        *(fmt_us(x * 1e6) for x in (b, min(bare), max(bare))),
        "",
        fmt_us(statistics.median(bare_cells) * 1e6),
    )
    t.add(
        "first run, all calls recorded",
        1,
        fmt_us(first * 1e6),
        "",
        "",
        fmt_us((first - b) * 1e6),
        fmt_us(first_cells * 1e6),
    )
    t.add(
        "rerun after restart, all replayed",
        len(replay),
        *(fmt_us(x * 1e6) for x in (r, min(replay), max(replay))),
        fmt_us((r - b) * 1e6),
        fmt_us(statistics.median(replay_cells) * 1e6),
    )
    t.notes += [
        f"notebook: {which}; {calls} simulated calls on the first run, none on the reruns",
        "each figure is one whole NotebookClient.execute(): kernel start, all cells, shutdown",
        "'in cells' = the kernel's time from each cell's execute_input to its execute_reply "
        "(nbclient's timing metadata), summed over the cells",
    ]
    shutil.rmtree(work, ignore_errors=True)
    return t, {
        "replay_minus_bare_s": r - b,
        "bare_s": b,
        "replay_s": r,
        "first_s": first,
        "replay_cells_s": statistics.median(replay_cells),
    }
