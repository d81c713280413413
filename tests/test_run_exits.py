"""``nbdurable run``: when it writes the notebook, its exit codes, and its accounting.

Real kernels, real deaths (``os._exit``), the real command as a subprocess.
No ``NBDURABLE_DIR``: the store is the one beside the notebook.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from kernel_util import REPO_ROOT, kernel_name, make_notebook, private_sockets
from traitlets.config import Config

from nbdurable.run.result import EXIT_CODES

SETUP = (
    "%load_ext nbdurable\n"
    "import os, pathlib\n"
    "from nbdurable import step\n"
    "def call(i):\n"
    "    if str(i) in os.environ.get('ALWAYS', '').split(','):\n"
    "        os._exit(1)\n"
    "    marker = pathlib.Path(f'died-{i}')\n"
    "    if str(i) in os.environ.get('ONCE', '').split(',') and not marker.exists():\n"
    "        marker.write_text('x')\n"
    "        os._exit(1)\n"
    "    with open('calls.log', 'a') as f:\n"
    "        f.write(f'{i}\\n')\n"
    "    return i"
)
STEP_A = "%%step a\nxs = [step(f'a:{i}', call, i) for i in range(3)]"
STEP_B = "%%step b\ny = step('b', call, 100)"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("NBDURABLE_", "JPY_"))}
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), out.get("PYTHONPATH")) if p)
    out.update(extra)
    return out


def nbd(*args: object, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nbdurable", *map(str, args)],
        capture_output=True,
        text=True,
        env=env(**extra),
        timeout=300,
    )


def write(path: Path, cells: list[str]) -> Path:
    nbformat.write(make_notebook(cells), path)
    return path


def calls_log(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().split() if log.exists() else []


@pytest.fixture(scope="module", autouse=True)
def _kernel_spec() -> None:
    kernel_name()


# -- exit codes, listed where users look ------------------------------------------------------


def test_every_exit_code_is_listed_in_help_and_docs() -> None:
    top = nbd("--help")
    run = nbd("run", "--help")
    readme = (REPO_ROOT / "docs" / "cli.md").read_text()
    for code, _meaning in EXIT_CODES:
        for text, where in ((top.stdout, "nbdurable --help"), (run.stdout, "run --help")):
            assert re.search(rf"\b{code} [a-z]", " ".join(text.split())), (code, where)
        assert f"**{code}**" in readme, code


# -- the kernel died on every attempt; then resumed ---------------------------------------------


@pytest.mark.kernel
def test_deaths_on_every_attempt_leave_the_notebook_alone_and_count_replays(
    tmp_path: Path,
) -> None:
    nb = write(tmp_path / "nb.ipynb", [SETUP, STEP_A, STEP_B])
    before = nb.read_bytes()
    r = nbd("run", nb, "--retries", "1", "--json", ALWAYS="100")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "was not changed" in r.stderr, r.stderr
    assert nb.read_bytes() == before
    summary = json.loads(r.stdout)
    assert summary["output"] is None
    outcomes = [[(c["label"], c["outcome"]) for c in a["cells"]] for a in summary["attempts"]]
    assert outcomes == [
        [("a", "executed"), ("b", "kernel died")],
        [("a", "replayed"), ("b", "kernel died")],
    ]
    assert summary["calls"] == {"made": 3, "replayed": 3}, summary["calls"]
    assert calls_log(tmp_path) == ["0", "1", "2"]

    # Resumed: the kernel dies once more, after replaying a; replays add up over attempts.
    r = nbd("run", nb, "--retries", "1", "--json", ONCE="100")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout)
    assert [a["outcome"] for a in summary["attempts"]] == ["kernel died", "completed"]
    assert summary["calls"] == {"made": 1, "replayed": 6}, summary["calls"]
    # Each attempt replayed something (the seconds a replay saves can round to 0
    # for steps this quick, so the count of replayed calls says it).
    assert all(a["saved"]["calls"] > 0 for a in summary["attempts"]), summary["attempts"]
    per_attempt = [a["saved"]["seconds"] for a in summary["attempts"]]
    assert summary["seconds_saved"] == pytest.approx(sum(per_attempt), abs=0.002)
    assert calls_log(tmp_path) == ["0", "1", "2", "100"]
    assert nb.read_bytes() != before  # a run with results writes the notebook


# -- `%step run other` -------------------------------------------------------------------------


@pytest.mark.kernel
def test_a_step_executed_in_another_run_is_reported_as_executed_there(tmp_path: Path) -> None:
    nb = tmp_path / "nb.ipynb"
    write(nb, [SETUP, "pass", STEP_A])
    r = nbd("run", nb, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    write(nb, [SETUP, "%step run other", STEP_A])
    r = nbd("run", nb, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout)
    (a,) = summary["attempts"][-1]["cells"]
    assert (a["outcome"], a["calls_made"], a["calls_replayed"]) == ("executed", 3, 0), a
    assert summary["calls"] == {"made": 3, "replayed": 0}, summary["calls"]
    assert "invalidated" not in r.stderr


# -- timeouts ------------------------------------------------------------------------------------


@pytest.mark.kernel
def test_a_fractional_timeout_is_kept_and_has_its_exit_code(tmp_path: Path) -> None:
    # Under a 1 s limit (0.5 rounded up, as before) this cell would usually pass.
    nb = write(tmp_path / "nb.ipynb", ["import time\ntime.sleep(0.9)"])
    r = nbd("run", nb, "--timeout", "0.5", "--json")
    assert r.returncode == 5, r.stdout + r.stderr
    assert json.loads(r.stdout)["status"] == "timed out"
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .endswith(f"cell #1 timed out (--timeout 0.5); the executed notebook is in {nb}")
    ), r.stderr


# -- the lease: another kernel records into the run ------------------------------------------


@pytest.mark.kernel
def test_a_lease_refusal_is_one_line_exit_4_and_the_notebook_is_untouched(tmp_path: Path) -> None:
    # The open kernel ran a; the runner replays it, then must execute b: refused.
    nb = write(tmp_path / "nb.ipynb", [SETUP, STEP_A, STEP_B])
    before = nb.read_bytes()
    kernel_env = env(JPY_SESSION_NAME=str(nb))  # as JupyterLab starts the notebook's kernel
    with private_sockets() as sockets:
        km = KernelManager(kernel_name=kernel_name(), config=Config({"KernelManager": sockets}))
        km.start_kernel(cwd=str(tmp_path), env=kernel_env)
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            for source in (SETUP, STEP_A):
                reply = kc.execute_interactive(source, timeout=120)
                assert reply["content"]["status"] == "ok", reply["content"]
            r = nbd("run", nb)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert "is being recorded by" in r.stderr and "was not changed" in r.stderr, r.stderr
    assert nb.read_bytes() == before
    assert calls_log(tmp_path) == ["0", "1", "2"]  # only the open kernel's calls


# -- rough edges ---------------------------------------------------------------------------------


@pytest.mark.kernel
def test_a_notebook_that_never_loads_nbdurable_gets_a_hint(tmp_path: Path) -> None:
    nb = write(tmp_path / "nb.ipynb", ["x = 1", "%%step\ny = x"])
    r = nbd("run", nb)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "raised UsageError; add `%load_ext nbdurable` in a cell before the first" in last, last


@pytest.mark.kernel
def test_clear_all_with_names_and_unpin_of_an_unpinned_step_are_one_line_errors(
    tmp_path: Path,
) -> None:
    nb = write(tmp_path / "nb.ipynb", [SETUP, STEP_A])
    assert nbd("run", nb).returncode == 0
    r = nbd("clear", nb, "--all", "a")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "give step names to clear, or --all for the whole run (not both)" in r.stderr
    r = nbd("unpin", nb, "a")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "a: not pinned in run 'nb.ipynb', nothing to unpin" in r.stderr, r.stderr
    assert nbd("pin", nb, "a").returncode == 0
    r = nbd("unpin", nb, "a")
    assert r.returncode == 0 and r.stdout.strip() == "unpinned: a", r.stdout + r.stderr


@pytest.mark.kernel
def test_clear_names_dependants_by_their_labels(tmp_path: Path) -> None:
    nb = write(
        tmp_path / "nb.ipynb",
        [SETUP, "%%step answers\nv = 1", "%%step report\nw = v + 1", "%%step\nz = w + 1"],
    )
    assert nbd("run", nb).returncode == 0
    r = nbd("clear", nb, "answers")
    assert r.returncode == 0, r.stderr
    label = nbformat.read(nb, as_version=4).cells[3].id[:8]
    assert r.stdout.strip() == (
        f"cleared: answers; invalidated dependants: report, cell {label}"
    ) or r.stdout.strip() == (f"cleared: answers; invalidated dependants: cell {label}, report")


def test_a_step_the_kernel_invalidated_says_why_in_the_run(tmp_path: Path) -> None:
    """An input only the kernel sees changed (a plain cell's computed value): the run's
    line for the step names it, as the kernel judged it, not a generic reason."""
    cells = ["%load_ext nbdurable", "n = int('1')", "%%step uses\nm = n * 2\nprint(m)"]
    nb = write(tmp_path / "nb.ipynb", cells)
    assert nbd("run", nb).returncode == 0
    write(nb, [cells[0], "n = int('2')", cells[2]])
    r = nbd("run", nb, "--json")
    assert r.returncode == 0, r.stderr
    cells_run = json.loads(r.stdout)["attempts"][-1]["cells"]
    outcome = next(c for c in cells_run if c["label"] == "uses")
    assert outcome["outcome"] == "invalidated", outcome
    assert outcome["detail"] == "input 'n' changed", outcome
