"""``nbdurable diff`` and ``nbdurable.compare``: two runs of one notebook, step by step.

The notebook is run twice by ``nbdurable run`` into two named runs, the
second after one realistic edit (the style a plain cell sets, read by one
step only). The comparison must name exactly that step as differing (its
input, with the two values, its output as a text diff, its sub-step's
arguments) and every other step as the same; ``--json`` says the same for
scripts, and ``nbdurable.compare`` in a kernel returns it as a DataFrame.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from kernel_util import make_notebook, run_notebook, stream_text
from test_run_exits import nbd

pytestmark = pytest.mark.kernel

# Deterministic stand-ins: two runs of a real model differ everywhere it is asked,
# which is not what this test is about.
SETUP = (
    "%load_ext nbdurable\nfrom nbdurable import step\n"
    "def llm_plan(topic):\n    return {'title': topic.title(), 'subquestions': [topic + '?']}\n"
    "def search_web(q):\n    return [q, q.upper()]"
)


def cells(style: str) -> list[str]:
    return [
        SETUP,
        f"topic = 'durable execution'\nSTYLE = {style!r}",
        "%%step plan\nplan = step('plan', llm_plan, topic)\nprint(plan['title'])",
        "%%step styled\nline = step('say', lambda s: f'in a {s} voice', STYLE)\nprint(line)",
        "%%step research\ndocs = step('search', search_web, plan['subquestions'][0])\n"
        "print(len(docs))",
    ]


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    nb = root / "exp.ipynb"
    for run, style in (("plain", "plain"), ("bold", "bold")):
        nbformat.write(make_notebook(cells(style)), nb)
        done = nbd("run", "-q", "--run", run, nb)
        assert done.returncode == 0, done.stderr
    return root, nb


def test_diff_names_exactly_the_step_that_differs(two_runs):
    _root, nb = two_runs
    done = nbd("diff", nb, "plain", "bold")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "A = 'plain', B = 'bold': 3 steps, 1 differ", lines
    heads = [ln.split(" (cell")[0] for ln in lines if ln[:1] in "=≠"]
    assert heads == ["= plan", "≠ styled", "= research"], lines
    body = done.stdout
    assert "    input 'STYLE': 'plain' / 'bold'" in body
    assert "    outputs differ:" in body
    assert "      -in a plain voice" in body and "      +in a bold voice" in body
    assert "    sub-step 'say': called with other arguments" in body
    assert lines[-1].startswith("total: A "), lines[-1]


def test_diff_json_and_one_step(two_runs):
    _root, nb = two_runs
    doc = json.loads(nbd("diff", nb, "plain", "bold", "--json").stdout)
    assert doc["differ"] == ["styled"]
    assert [s["verdict"] for s in doc["steps"]] == ["same", "differs", "same"]
    assert doc["totals"]["a"]["calls"] == doc["totals"]["b"]["calls"] == 3
    one = json.loads(nbd("diff", nb, "plain", "bold", "--json", "--step", "plan").stdout)
    assert [s["label"] for s in one["steps"]] == ["plan"] and one["differ"] == []


def test_a_run_that_does_not_exist_is_one_line(two_runs):
    _root, nb = two_runs
    done = nbd("diff", nb, "plain", "nope")
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()
        == [
            f"nbdurable diff: error: no run 'nope' in the store at {nb.parent / '.nbdurable'} "
            "(runs: 'bold', 'plain')"
        ]
        or "no run 'nope'" in done.stderr
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_compare_in_a_kernel_is_a_table(two_runs):
    root, nb = two_runs
    code = (
        "import nbdurable\n"
        "t = nbdurable.compare('plain', 'bold')\n"
        "print(type(t).__name__, list(t['verdict']), list(t['step']))"
    )
    out = run_notebook(
        make_notebook([SETUP, code]),
        cwd=root,
        env={"NBDURABLE_NOTEBOOK": str(nb), "NBDURABLE_DIR": str(root / ".nbdurable")},
    )
    assert stream_text(out.cells[1].outputs) == (
        "DataFrame ['same', 'differs', 'same'] ['plan', 'styled', 'research']\n"
    )


def test_diff_reads_the_records_alike_on_both_engines(any_store):
    """At the store level, on either engine: same, differs (and what), only in one run."""
    from nbdurable import rundiff
    from nbdurable.store import RunKeys

    store = any_store
    a, b = RunKeys("a"), RunKeys("b")

    def step(rk, key, *, inputs, seen, out):
        header = {
            "run": rk.run_id,
            "key": key,
            "source_fp": "src",
            "inputs": inputs,
            "seen": seen,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": out}],
            "variables": [],
            "duration": 1.0,
            "substeps": 1,
        }
        return (rk.step(key), header, b"")

    store.apply(
        puts=[
            step(a, "name:one", inputs={"x": "1"}, seen={"x": "1"}, out="hi\n"),
            step(b, "name:one", inputs={"x": "1"}, seen={"x": "1"}, out="hi\n"),
            step(a, "name:two", inputs={"x": "1"}, seen={"x": "1"}, out="one\n"),
            step(b, "name:two", inputs={"x": "2"}, seen={"x": "2"}, out="two\n"),
            (a.sub("name:two", "q"), {"id": "q", "args_fp": "p"}, b"r1"),
            (b.sub("name:two", "q"), {"id": "q", "args_fp": "p"}, b"r2"),
            step(a, "name:three", inputs={}, seen={}, out=""),
        ]
    )
    rows = {r.key: r for r in rundiff.diff_runs(store, "a", "b")}
    assert rows["name:one"].verdict == "same" and rows["name:one"].lines == []
    assert rows["name:three"].verdict == "only in A"
    two = rows["name:two"]
    assert two.verdict == "differs"
    assert "input 'x': 1 / 2" in two.lines
    assert "sub-step 'q': returned another result" in two.lines
    assert "  -one" in two.lines and "  +two" in two.lines
