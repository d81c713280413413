"""``%%step NAME --inputs PATTERN ...``: files declared as inputs, in real kernels.

The step reads its files through ``cat`` in a subprocess, which Python's
audit hook cannot see: only the declaration makes them inputs. Each run is a
fresh kernel on the same store; every real run of the body appends to
``calls.log`` (read, never emptied: it is an output of the step); the
reason a step was invalidated is taken from the events the panel shows. A
changed, added or removed matching file runs the step again and the reason
names the file; an unchanged set replays; a bad pattern is a one-line
UsageError that records nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_util import outputs_of, run_saved, stream_text

pytestmark = pytest.mark.kernel

PRELUDE = (
    "%load_ext nbdurable\n"
    "from nbdurable import events\n"
    "said = []\n"
    "def tick():\n"
    "    with open('calls.log', 'a') as fh:\n"
    "        fh.write('load\\n')\n"
    "_off = events.subscribe(\n"
    "    lambda e: said.append(e.data['reason']) if e.kind == 'step-invalidated' else None\n"
    ")"
)
STEP = (
    "%%step load --inputs 'data/*.csv' \"notes/**/*.txt\"\n"
    "import glob, subprocess\n"
    "tick()\n"
    "files = sorted(glob.glob('data/*.csv'))\n"
    "files += sorted(glob.glob('notes/**/*.txt', recursive=True))\n"
    "words = subprocess.run(['cat', *files], capture_output=True, text=True).stdout.split()\n"
    "print(words)"
)


def run(tmp: Path, step: str = STEP):
    return run_saved(tmp, [PRELUDE, step, "print(said)"], allow_errors=True)


def ran(tmp: Path) -> int:
    """Real runs of the body since the last look.

    The log is only read, never emptied: the body appends to it, so it is an
    output of the step, and emptying it would run the step again.
    """
    log, seen = tmp / "calls.log", tmp / "calls.seen"
    made = len(log.read_text().split()) if log.exists() else 0
    before = int(seen.read_text()) if seen.exists() else 0
    seen.write_text(str(made))
    return made - before


def test_a_changed_added_or_removed_declared_file_runs_the_step_again_naming_it(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "notes" / "deep").mkdir(parents=True)
    (tmp_path / "data" / "a.csv").write_text("a1\n")
    (tmp_path / "data" / "b.csv").write_text("b1\n")
    (tmp_path / "notes" / "deep" / "n.txt").write_text("n1\n")
    (tmp_path / "data" / "skip.txt").write_text("not matched\n")

    nb = run(tmp_path)
    assert ran(tmp_path) == 1
    assert stream_text(outputs_of(nb, 1)) == "['a1', 'b1', 'n1']\n"

    def step(expect_runs: int, words: list[str], reason: str | None) -> None:
        nb = run(tmp_path)
        assert ran(tmp_path) == expect_runs
        assert stream_text(outputs_of(nb, 1)) == f"{words}\n"
        assert stream_text(outputs_of(nb, 2)) == f"{[reason] if reason else []}\n"

    step(0, ["a1", "b1", "n1"], None)  # nothing changed: replayed
    (tmp_path / "data" / "skip.txt").write_text("changed, but not matched\n")
    step(0, ["a1", "b1", "n1"], None)
    (tmp_path / "data" / "a.csv").write_text("a2\n")
    step(1, ["a2", "b1", "n1"], "file 'a.csv' changed")
    (tmp_path / "data" / "c.csv").write_text("c1\n")
    step(1, ["a2", "b1", "c1", "n1"], "file 'c.csv' added")
    (tmp_path / "data" / "b.csv").unlink()
    step(1, ["a2", "c1", "n1"], "file 'b.csv' removed")
    (tmp_path / "notes" / "deep" / "n.txt").write_text("n2\n")  # `**`: any depth
    step(1, ["a2", "c1", "n2"], "file 'n.txt' changed")
    step(0, ["a2", "c1", "n2"], None)

    # Editing the patterns is a change too, even when they match the same files.
    nb = run(tmp_path, STEP.replace("--inputs 'data/*.csv'", "--inputs 'data/[a-z].csv'"))
    assert ran(tmp_path) == 1
    assert stream_text(outputs_of(nb, 2)) == "['its --inputs patterns changed']\n"


def test_without_the_declaration_the_change_is_not_seen(tmp_path):
    # The yardstick of the test above: `cat` reads outside the audit hook.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("a1\n")
    undeclared = STEP.replace(" --inputs 'data/*.csv' \"notes/**/*.txt\"", "")
    run(tmp_path, undeclared)
    assert ran(tmp_path) == 1
    (tmp_path / "data" / "a.csv").write_text("a2\n")
    nb = run(tmp_path, undeclared)
    assert ran(tmp_path) == 0
    assert stream_text(outputs_of(nb, 1)) == "['a1']\n"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("load --inputs", "%%step: --inputs needs at least one PATTERN; usage: %%step [NAME]"),
        ("load --inputs --force", "%%step: --inputs needs at least one PATTERN"),
        ("load --inputs 'data/[ab.csv'", "%%step: --inputs: bad PATTERN 'data/[ab.csv': '['"),
        ("load --inputs ''", "%%step: --inputs: an empty PATTERN matches nothing"),
        ("load --input 'x'", "%%step: unknown option '--input'"),
    ],
)
def test_a_bad_pattern_is_a_one_line_usage_error_and_records_nothing(tmp_path, line, message):
    nb = run(tmp_path, STEP.replace("load --inputs 'data/*.csv' \"notes/**/*.txt\"", line, 1))
    # IPython shows a UsageError as one line on stderr, without a traceback.
    outputs = outputs_of(nb, 1)
    assert [o["output_type"] for o in outputs] == ["stream"], outputs
    said = stream_text(outputs, "stderr")
    assert said.startswith(f"UsageError: {message}"), said
    assert said.count("\n") == 1, said
    assert ran(tmp_path) == 0  # the body never ran
    nb = run(tmp_path)  # and nothing was recorded under the name: the fixed cell runs
    assert ran(tmp_path) == 1
