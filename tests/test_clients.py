"""One notebook file, one run, whatever executes it.

Each client users really use executes the same notebook file in a real
kernel: nbclient (no path, no cell ids), ``jupyter nbconvert --execute``,
``jupyter execute``, papermill, ``nbdurable run``, and the messages
JupyterLab / Notebook 7 (``JPY_SESSION_NAME`` and ``cellId``) and VS Code
(``__vsc_ipynb_file__``) send. A run recorded by one replays under every
other with zero calls made, counted in the simulated services' ledger. No
``NBDURABLE_*`` variable is set: the store must land beside the notebook.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from kernel_util import REPO_ROOT, kernel_name, make_notebook, private_sockets, run_notebook
from traitlets.config import Config

from nbdurable.identity import locate

pytestmark = pytest.mark.kernel

BIN = Path(sys.executable).parent


def agent_cells(topic: str = "cats") -> list[str]:
    return [
        "%load_ext nbdurable",
        "from nbdurable.demo import sim",
        f"topic = {topic!r}",
        "%%step plan\nplan = sim.llm_plan(topic, n=5)\nprint(len(plan))",
        "%%step\nanswer = sim.llm_answer(topic, ['doc'])\nprint(len(answer) > 0)",
    ]


def write_notebook(path: Path, cells: list[str]) -> Path:
    nb = make_notebook(cells)
    if len(nb.cells) > 2:
        nb.cells[2].metadata["tags"] = ["parameters"]  # papermill's parameters cell
    nbformat.write(nb, path)
    return path


def clean_env(ledger: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NBDURABLE_", "JPY_"))}
    env["NBDURABLE_SIM_LEDGER"] = str(ledger)
    env["NBDURABLE_SIM_LATENCY"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def calls(ledger: Path) -> int:
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def by_nbclient(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    run_notebook(nbformat.read(nb, as_version=4), cwd=nb.parent, env=env)


def by_nbconvert(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    _cli(
        [str(BIN / "jupyter-nbconvert"), "--execute", "--to", "notebook", str(nb)],
        cwd,
        env,
    )


def by_jupyter_execute(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    _cli([str(BIN / "jupyter-execute"), str(nb)], cwd, env)


def by_papermill(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    # Started from another directory, as papermill users do: the kernel's cwd is that one.
    out = cwd / "out.ipynb"
    _cli([str(BIN / "papermill"), str(nb), str(out), "-k", kernel_name()], cwd, env)


def by_nbdurable_run(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    _cli([sys.executable, "-m", "nbdurable", "run", str(nb)], cwd, env)


@contextlib.contextmanager
def frontend_kernel(
    nb: Path, env: dict[str, str], *, lab: bool
) -> Iterator[Callable[[str, str], dict]]:
    """A kernel as JupyterLab (path and cell ids) or VS Code (a name) runs it.

    Yields ``execute(code, cell_id)``, which sends one cell as that frontend
    does and returns its reply's content once it is done.
    """
    kernel_env = dict(env)
    if lab:
        kernel_env["JPY_SESSION_NAME"] = str(nb)
    with private_sockets() as sockets:
        km = KernelManager(kernel_name=kernel_name(), config=Config({"KernelManager": sockets}))
        km.start_kernel(cwd=str(nb.parent), env=kernel_env)
        kc = km.blocking_client()
        kc.start_channels()

        def execute(code: str, cell_id: str) -> dict:
            content = {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            }
            msg = kc.session.msg(
                "execute_request", content, metadata={"cellId": cell_id} if lab else {}
            )
            kc.shell_channel.send(msg)
            while True:
                reply = kc.get_shell_msg(timeout=120)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    return reply["content"]

        try:
            kc.wait_for_ready(timeout=60)
            if not lab:  # VS Code's setup code, run before the user's cells
                kc.execute_interactive(f"__vsc_ipynb_file__ = {str(nb)!r}", store_history=False)
            yield execute
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def _frontend(nb: Path, env: dict[str, str], *, lab: bool) -> None:
    """Execute the saved cells as JupyterLab (path and cell ids) or VS Code (a name) does."""
    saved = nbformat.read(nb, as_version=4)
    with frontend_kernel(nb, env, lab=lab) as execute:
        for cell in saved.cells:
            reply = execute(cell.source, cell.id)
            assert reply["status"] == "ok", reply


def by_jupyterlab(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    _frontend(nb, env, lab=True)


def by_vscode(nb: Path, cwd: Path, env: dict[str, str]) -> None:
    _frontend(nb, env, lab=False)


CLIENTS = {
    "nbclient": by_nbclient,
    "nbconvert": by_nbconvert,
    "jupyter-execute": by_jupyter_execute,
    "papermill": by_papermill,
    "nbdurable-run": by_nbdurable_run,
    "jupyterlab": by_jupyterlab,
    "vscode": by_vscode,
}


@pytest.mark.parametrize("recorder", ["nbclient", "jupyterlab", "papermill"])
def test_recorded_by_one_client_replays_under_every_other(tmp_path: Path, recorder: str) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    nb = write_notebook(project / "agent.ipynb", agent_cells())
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(ledger)
    CLIENTS[recorder](nb, elsewhere, env)
    assert calls(ledger) == 2
    for name, client in CLIENTS.items():
        if name == recorder:
            continue
        client(nb, elsewhere, env)
        assert calls(ledger) == 2, f"{name} made calls replaying a run {recorder} recorded"
    # One store, beside the notebook, holding one run named after the file.
    assert (project / ".nbdurable").is_dir()
    assert not (elsewhere / ".nbdurable").exists()
    status = subprocess.run(
        [sys.executable, "-m", "nbdurable", "status", str(nb), "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert '"pending"' not in status.stdout, status.stdout


def test_two_notebooks_in_one_directory_stay_separate(tmp_path: Path) -> None:
    a = write_notebook(tmp_path / "a.ipynb", agent_cells("cats"))
    b = write_notebook(tmp_path / "b.ipynb", agent_cells("dogs"))
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(ledger)
    for nb in (a, b, a, b):
        by_nbconvert(nb, tmp_path, env)
    assert calls(ledger) == 4  # a's two calls and b's, once each
    topics = {json.loads(line)["arg"] for line in ledger.read_text().splitlines()}
    assert any("cats" in t for t in topics) and any("dogs" in t for t in topics)


def test_a_kernel_without_a_notebook_file_says_in_one_line_which_run_it_uses(
    tmp_path: Path,
) -> None:
    nb = run_notebook(
        make_notebook(["%load_ext nbdurable", "%%step\nx = 1"]),
        cwd=tmp_path,
        env={"NBDURABLE_RUN": "cats"},
    )
    err = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.get("name") == "stderr")
    assert err.count("\n") == 1 and "run 'cats'" in err, err
    assert "Warning" not in err


# -- finding the notebook by its cells (no kernel) ------------------------------------------


def test_copies_give_way_to_their_input_and_true_twins_are_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cells = agent_cells()
    executed = [cells[0], cells[1], cells[3]]
    write_notebook(tmp_path / "agent.ipynb", cells)
    other = write_notebook(tmp_path / "other.ipynb", ["print('unrelated')"])
    assert locate.find_by_cells(executed)[0] == tmp_path / "agent.ipynb"
    # nbconvert's output copy, and papermill's (which names its input)
    write_notebook(tmp_path / "agent.nbconvert.ipynb", cells)
    out = make_notebook(["topic = 'dogs'", *cells])
    out.metadata["papermill"] = {"input_path": "agent.ipynb", "output_path": "out.ipynb"}
    nbformat.write(out, tmp_path / "out.ipynb")
    assert locate.find_by_cells(executed)[0] == tmp_path / "agent.ipynb"
    # a parameter cell only one file holds decides between two notebooks
    write_notebook(tmp_path / "twin.ipynb", agent_cells("dogs"))
    assert locate.find_by_cells([*executed[:2], cells[2], cells[3]])[0] == (
        tmp_path / "agent.ipynb"
    )
    # a true copy: one line saying what to do
    write_notebook(tmp_path / "copy.ipynb", cells)
    with pytest.raises(locate.UsageProblem) as info:
        locate.find_by_cells(executed)
    assert "\n" not in str(info.value) and "NBDURABLE_NOTEBOOK" in str(info.value)
    assert other.exists()
    assert locate.find_by_cells(["print('nowhere')"]) == (None, "")


def test_identical_cells_are_told_apart_by_occurrence(tmp_path: Path) -> None:
    same = "%%step\nx = sim.llm_answer('q', ['d'])"
    nb = write_notebook(
        tmp_path / "twice.ipynb",
        ["%load_ext nbdurable", "from nbdurable.demo import sim", same, same],
    )
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(ledger)
    by_nbclient(nb, tmp_path, env)
    assert calls(ledger) == 2  # the second cell is a step of its own, not a replay of the first
    by_jupyterlab(nb, tmp_path, env)  # cell ids: the keys nbclient's run recorded
    by_nbconvert(nb, tmp_path, env)
    assert calls(ledger) == 2


# -- records per input version -------------------------------------------------------------


def sweep_cells(topic: str = "cats") -> list[str]:
    """A replayable step, and a dependant whose body always reruns (a lock cannot be saved)."""
    return [
        "%load_ext nbdurable",
        "import threading\nfrom nbdurable import step\nfrom nbdurable.demo import sim",
        f"topic = {topic!r}",
        "%%step plan\nplan = step('plan', sim.llm_plan, topic, n=3)\nprint(plan['title'][:4])",
        "%%step answer\nlock = threading.Lock()\n"
        "answer = step('answer', sim.llm_answer, plan['title'], ['doc'])\nprint(len(answer))",
    ]


def _status(nb: Path, env: dict[str, str]) -> list[dict]:
    out = _cli([sys.executable, "-m", "nbdurable", "status", str(nb), "--json"], nb.parent, env)
    return json.loads(out)["steps"]


def test_a_papermill_sweep_back_to_an_earlier_parameter_replays_it(tmp_path: Path) -> None:
    nb = write_notebook(tmp_path / "sweep.ipynb", sweep_cells())
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(ledger)
    made = []
    for topic in ("cats", "dogs", "cats", "dogs"):
        out = tmp_path / f"out-{topic}.ipynb"
        papermill = [str(BIN / "papermill"), str(nb), str(out), "-k", kernel_name()]
        _cli([*papermill, "-p", "topic", topic], tmp_path, env)
        made.append(calls(ledger))
        printed = nbformat.read(out, as_version=4).cells[-2].outputs  # the plan step's
        assert topic[:4] in "".join(o.get("text", "") for o in printed), printed
    assert made == [2, 4, 4, 4], made  # each topic's calls made once, whatever the order
    rows = {r["label"]: r for r in _status(nb, env)}
    # The saved notebook binds topic = 'cats'; the last run's record is of 'dogs', and
    # one of 'cats' is kept: with no kernel, which version replays is not known.
    assert rows["plan"]["state"] == "may run" and rows["plan"]["versions"] == 1, rows
    assert "input 'topic' changed (a plain cell binds it" in rows["plan"]["detail"], rows
    assert len(rows["plan"]["version"]) == 8 and rows["answer"]["versions"] == 1, rows


@pytest.mark.parametrize("engine", ["directory", "postgresql"])
def test_in_one_kernel_an_input_set_back_replays_its_version(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    nb = write_notebook(tmp_path / "sweep.ipynb", sweep_cells())
    ledger = tmp_path / "ledger.jsonl"
    env = clean_env(ledger)
    if engine == "postgresql":
        env["NBDURABLE_STORE"] = request.getfixturevalue("pg_url")
        env["NBDURABLE_KEY"] = os.environ["NBDURABLE_KEY"]
    saved = nbformat.read(nb, as_version=4).cells
    made = []
    with frontend_kernel(nb, env, lab=True) as execute:
        for topic in ("cats", "dogs", "cats"):
            for i, cell in enumerate(saved):
                # The input cell edited and run again, then the steps below it.
                code = f"topic = {topic!r}" if i == 2 else cell.source
                assert execute(code, cell.id)["status"] == "ok"
            made.append(calls(ledger))
        versions = _status(nb, env)
    # Back to cats: the plan's record of cats, and the answer's (its input, plan, is
    # cats's again), whose body reruns and replays its own call of cats.
    assert made == [2, 4, 4], made
    topics = [json.loads(line)["arg"] for line in ledger.read_text().splitlines()]
    assert [t.split(":")[0] for t in topics] == ["cats", "cats", "dogs", "dogs"], topics
    rows = {r["label"]: r for r in versions}
    assert rows["plan"]["versions"] == 1 and rows["answer"]["versions"] == 1, rows
