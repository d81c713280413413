"""The benchmark runs at tiny sizes, so it cannot rot. No timing is asserted.

``python -m bench --quick`` runs in a subprocess (the peers bring their own
threads, loggers and warnings, none of which belong in this process), and
every section must print its table with a row for each system, or say why a
system could not run. nbdurable and the raw floors must always run; only the
optional peers of the ``bench`` extra may be reported as not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.kernel  # section 4 starts real kernels

ALWAYS = [
    "nbdurable",
    "raw diskcache set/get",
    "raw SQLite WAL insert/select",
    "seed JSON checkpoint",
    "diskcache memoize",
]
OPTIONAL = ["joblib.Memory", "DBOS (SQLite)", "LangGraph (SqliteSaver)"]
SECTIONS = [
    "1. Sub-steps",
    "2. Growth",
    "3. Cell-level %%step",
    "3b. One ",
    "4. Restart and replay",
    "5a. Store size",
    "5b. Store size",
    "6. Costs against the floor",
    "7. Views and sub-steps at scale",
    "Targets (issue #6)",
]


def _bench(module: str, *args: str) -> str:
    """``python -m module args`` in a subprocess (the peers bring their own threads); its output."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="default")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + "\n--- stderr ---\n" + proc.stderr[-4000:]
    return out


def _section(out: str, title: str) -> str:
    start = out.index("== " + title)
    end = out.find("\n== ", start + 1)
    return out[start:] if end < 0 else out[start:end]


def test_bench_quick_runs_every_section_and_system(tmp_path):
    out = _bench("bench", "--quick", "--dir", str(tmp_path))
    for title in SECTIONS:
        assert "== " + title in out, f"section {title!r} missing:\n{out[-4000:]}"

    substeps = _section(out, "1. Sub-steps")
    rows = [line for line in substeps.splitlines()]
    for name in ALWAYS:
        assert any(r.startswith(name + " ") for r in rows), f"no row for {name}:\n{substeps}"
    for name in OPTIONAL:
        ran = any(r.startswith(name + " ") for r in rows)
        told = any(r.startswith(f"could not run: {name}: ") for r in rows)
        assert ran or told, f"{name} neither ran nor said why:\n{substeps}"
        if not ran:
            print(f"optional peer skipped: {[r for r in rows if name in r]}")

    growth = _section(out, "2. Growth")
    for name in ("nbdurable", "seed JSON checkpoint"):
        assert sum(1 for r in growth.splitlines() if r.startswith(name + " ")) == 3, growth

    cells = _section(out, "3. Cell-level %%step")
    assert "small variables" in cells and "numpy array" in cells, cells
    through = _section(out, "3b. One ")
    assert "put_blob" in through and "pickle.dump" in through, through
    assert "memory reused" in _section(out, "Targets (issue #6)")  # judged on both tables

    e2e = _section(out, "4. Restart and replay")
    for row in ("bare kernel", "first run", "rerun after restart"):
        assert row in e2e, e2e
    assert "none on the reruns" in e2e, e2e

    costs = _section(out, "6. Costs against the floor")
    for row in (
        "-object step: record ",
        "-object step: replay ",
        "%load_ext nbdurable",
        "first %%step",
        "store bytes per recorded 100 B sub-step",
    ):
        assert sum(1 for r in costs.splitlines() if row in r) == 1, costs


@pytest.mark.postgres
def test_bench_postgres_runs_every_section_at_tiny_sizes(pg_server):
    """``python -m bench.postgres`` at tiny sizes: nbdurable's rows always, the peers or why not."""
    tiny = ["--steps", "5", "--rounds", "2", "--writers", "2", "--writer-steps", "5"]
    tiny += ["--calls", "5", "--load", "1"]
    out = _bench("bench.postgres", "--url", pg_server, *tiny)
    per_step = _section(out, "PostgreSQL 1. Sub-steps")
    rows = per_step.splitlines()
    for name in ("nbdurable (PostgreSQL)", "nbdurable (embedded, for reference)"):
        assert sum(1 for r in rows if r.startswith(name + " ")) == 1, per_step
    for name in ("DBOS (PostgreSQL)", "LangGraph (PostgresSaver)"):
        ran = sum(1 for r in rows if r.startswith(name + " ")) == 1
        assert ran or any(r.startswith(f"could not run: {name}") for r in rows), per_step
    assert "pools 2 rounds" in per_step
    writers = _section(out, "PostgreSQL 2. 2 kernels")
    assert "steps/s" in writers, writers
    walls = _section(out, "PostgreSQL 3. Wall time per recorded call")
    rows = walls.splitlines()
    for condition in ("quiet", "load 1"):
        assert sum(1 for r in rows if r.startswith(f"{condition} ")) >= 1, walls
        mine = [r for r in rows if r.startswith(f"{condition} ") and "nbdurable" in r]
        assert len(mine) == 1, walls
        floor = [r for r in rows if r.startswith(f"{condition} ") and "(the floor)" in r]
        assert len(floor) == 1, walls
    for name in ("DBOS (PostgreSQL)", "LangGraph (PostgresSaver)"):
        ran = sum(1 for r in rows if name in r and not r.startswith("could not run")) == 2
        assert ran or any(r.startswith(f"could not run: {name}") for r in rows), walls


@pytest.mark.postgres
def test_bench_only_postgres_judges_the_team_store_targets(pg_server, tmp_path):
    """``python -m bench --only postgres`` runs section 3 alone and says met or missed."""
    out = _bench("bench", "--quick", "--only", "postgres", "--url", pg_server, "--load", "1")
    assert "== PostgreSQL 3. Wall time per recorded call" in out, out[-4000:]
    assert "== 1. Sub-steps" not in out
    targets = _section(out, "Targets")
    for peer in ("LangGraph (PostgresSaver)", "DBOS (PostgreSQL)"):
        judged = [r for r in targets.splitlines() if f"cheaper than {peer}, by wall time" in r]
        installed = f"could not run: {peer}" not in out
        assert len(judged) == (1 if installed else 0), targets
