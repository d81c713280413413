"""Forking a run: ``nbdurable fork`` and ``%step fork``.

In real kernels: a notebook is recorded (a model call, a step holding a
32 MB array, a step that reads a style a plain cell sets, a last step); its
run is forked from the styled step, the style is edited, and the fork is
run. The fork's first steps replay with no call made, the styled step and
the one after it run; the parent's records are byte for byte what they
were; the store grows by the fork's records, not by a second copy of the
array; ``nbdurable diff`` names the steps that differ; ``nbdurable ls``
shows the lineage. ``%step fork`` does the same from a kernel. At the store
level, on both engines, a fork holds exactly the records asked for.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from kernel_util import make_notebook, run_notebook, stream_text
from test_run_exits import nbd

from nbdurable.store import RUN_SCOPE, RunKeys, open_store
from nbdurable.store.copy import fork_run

SETUP = (
    "%load_ext nbdurable\nimport numpy as np\nfrom nbdurable import step\n"
    "def ask(q):\n"
    "    with open('calls.log', 'a') as f:\n"
    "        f.write(q + '\\n')\n"
    "    return q.upper()"
)


def cells(style: str) -> list[str]:
    return [
        SETUP,
        f"STYLE = {style!r}",
        "%%step plan\nplan = step('plan', ask, 'plan the report')",
        "%%step data\nbig = np.arange(4_000_000, dtype='float64')  # 32 MB",
        "%%step styled\nline = step('write', ask, f'write it in a {STYLE} voice')\nprint(line)",
        "%%step final\nreport = step('final', ask, line + ' / ' + plan)\nprint(len(report))",
    ]


def calls(root) -> list[str]:
    log = root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def records(store_dir, run: str) -> dict[str, bytes]:
    with open_store(store_dir) as store:
        rk = RunKeys(run)
        return {k: bytes(store.get(k)[1]) for k in store.scan(rk.base) if k != rk.lease}


def size(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.kernel
def test_a_fork_replays_what_came_before_and_leaves_its_parent_alone(tmp_path):
    nb = tmp_path / "exp.ipynb"
    nbformat.write(make_notebook(cells("plain")), nb)
    assert nbd("run", "-q", nb).returncode == 0
    assert calls(tmp_path) == [
        "plan the report",
        "write it in a plain voice",
        "WRITE IT IN A PLAIN VOICE / PLAN THE REPORT",
    ]
    made = len(calls(tmp_path))
    store_dir = tmp_path / ".nbdurable"
    parent = records(store_dir, "exp.ipynb")
    grown = size(store_dir)

    done = nbd("fork", nb, "bold", "--from", "styled")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "forked run 'exp.ipynb' into 'bold' from step 'styled': the records of 2 steps shared "
        "('plan', 'data'; "
    ), done.stdout
    # The 32 MB array is not stored twice: the fork wrote only its records.
    assert size(store_dir) - grown < 1_000_000, size(store_dir) - grown

    nbformat.write(make_notebook(cells("bold")), nb)
    again = nbd("run", "--run", "bold", nb)
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert any(ln.strip().startswith("↻ plan") and "replayed" in ln for ln in lines), lines
    assert any(ln.strip().startswith("↻ data") and "replayed" in ln for ln in lines), lines
    assert any(ln.strip().startswith("✓ styled") for ln in lines), lines
    new = calls(tmp_path)[made:]
    assert new[0] == "write it in a bold voice" and len(new) == 2, new  # plan: no call
    assert records(store_dir, "exp.ipynb") == parent, "the parent was written"

    doc = json.loads(nbd("diff", nb, "exp.ipynb", "bold", "--json").stdout)
    assert doc["differ"] == ["styled", "final"], doc["differ"]
    ls = nbd("ls", "--store", store_dir, "--json")
    lineage = {r["run"]: r["parent"] for r in json.loads(ls.stdout)["runs"]}
    assert lineage == {"exp.ipynb": None, "bold": "exp.ipynb"}, lineage


@pytest.mark.kernel
def test_step_fork_in_a_kernel_switches_to_the_fork(tmp_path):
    nb = tmp_path / "exp.ipynb"
    nbformat.write(make_notebook(cells("plain")), nb)
    env = {"NBDURABLE_NOTEBOOK": str(nb)}
    run_notebook(nbformat.read(nb, 4), cwd=tmp_path, env=env)
    made = len(calls(tmp_path))
    later = [
        "%step fork bold --from styled",
        "STYLE = 'bold'",
        *cells("bold")[2:],
        "%step list",
        "import nbdurable\nprint(nbdurable.panel().text().splitlines()[0])",
        "%step fork bold",
        "%step fork",
    ]
    out = run_notebook(make_notebook([SETUP, *later]), cwd=tmp_path, env=env, allow_errors=True)
    said = stream_text(out.cells[1].outputs)
    assert said.startswith("forked run 'exp.ipynb' into 'bold' from step 'styled'"), said
    listed = stream_text(out.cells[-4].outputs)
    assert listed.startswith("run 'bold' (forked from 'exp.ipynb') in "), listed
    panel = stream_text(out.cells[-3].outputs)
    assert panel.startswith("nbdurable run 'bold' (forked from 'exp.ipynb') in "), panel
    assert said.endswith("nbdurable run: 'bold'\n"), said
    assert calls(tmp_path)[made:] == [
        "write it in a bold voice",
        "WRITE IT IN A BOLD VOICE / PLAN THE REPORT",
    ]
    # The kernel now records into the fork: forking it into its own name is refused.
    assert stream_text(out.cells[-2].outputs, "stderr") == (
        "UsageError: run 'bold' cannot be forked into itself; give a new name\n"
    )
    assert stream_text(out.cells[-1].outputs, "stderr") == (
        "UsageError: usage: %step fork NEW [--from STEP]\n"
    )


def test_a_fork_holds_exactly_the_steps_asked_for_on_both_engines(any_store):
    store = any_store
    a = RunKeys("a")
    sha, _ = store.put_blob(b"x" * 100_000, [])
    puts = [
        (a.meta, {"run": "a", "notebook": "nb.ipynb"}, b""),
        (
            a.step("s1"),
            {"run": "a", "variables": [{"name": "v", "kind": "value", "ref": sha}]},
            b"",
        ),
        (a.sub("s1", "q"), {"run": "a", "id": "q"}, b"one"),
        (a.state("s1"), {"pinned": True}, b""),
        (a.step("s2"), {"run": "a"}, b""),
        (a.sub("s2", "q"), {"run": "a", "id": "q"}, b"two"),
        (a.sub(RUN_SCOPE, "setup"), {"run": "a", "id": "setup"}, b"three"),
        (a.lease, {"pid": 1}, b""),
    ]
    store.apply(puts=puts)
    before = {k: store.get(k) for k in store.scan(a.base)}
    report = fork_run(store, "a", "b", {"s1"})
    b = RunKeys("b")
    got = {k[len(b.base) :]: store.get(k) for k in store.scan(b.base)}
    assert sorted(got) == ["fork", "manifest", "meta", "s/s1", "t/s1", "u/s1/q", "u/~run/setup"], (
        sorted(got)
    )
    assert report.records == 5
    assert got["fork"][0]["parent"] == "a" and got["meta"][0]["run"] == "b"
    assert bytes(got["u/s1/q"][1]) == b"one" and got["s/s1"][0]["run"] == "b"
    assert got["t/s1"][0]["pinned"] is True
    assert {k: store.get(k) for k in store.scan(a.base)} == before, "the parent changed"
    with pytest.raises(Exception, match="already has records"):
        fork_run(store, "a", "b", None)
    everything = fork_run(store, "a", "c", None)
    assert everything.records == 7  # all but the lease


def test_removing_the_parent_keeps_what_the_fork_shares(any_store):
    """The parent cleared and collected: the fork's record and its saved value stay."""
    from nbdurable import commands
    from nbdurable.store import admin

    store = any_store
    a, b = RunKeys("a"), RunKeys("b")
    sha, _ = store.put_blob(b"y" * 200_000, [])
    var = {"name": "v", "kind": "value", "ref": sha, "fp": "f"}
    store.apply(
        puts=[
            (a.meta, {"run": "a", "last": 1.0}, b""),
            (a.step("s1"), {"run": "a", "started": 1.0, "duration": 0, "variables": [var]}, b""),
        ]
    )
    fork_run(store, "a", "b", None)
    commands.clear_run(store, "a")
    never_idle = 1e12  # no run is old enough: only unreferenced values go
    admin.gc(store, older_than=never_idle)
    assert store.get(b.step("s1")) is not None
    assert store.get_blob(sha) is not None, "a value the fork refers to was removed"
    commands.clear_run(store, "b")  # the control: unreferenced now, so it goes
    admin.gc(store, older_than=never_idle)
    assert store.get_blob(sha) is None
