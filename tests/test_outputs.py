"""Files a step writes are its outputs, in real kernels, against plain runs.

A step writes files (``pathlib``, ``np.save``, ``DataFrame.to_csv``, a file moved into place with
``os.replace``), a later plain cell reads them. Each notebook runs plain (no
nbdurable), then durable in fresh kernels on one store, with the files
deleted, changed or appended to between runs the way users and ``git clean``
do. Step bodies append their name to ``ran.log`` (so that log is an output
of every step, appended to); the costly call, a sub-step, appends to
``calls.log``. The reading cell must print what the plain run printed; a
step whose output file is missing or changed runs again with one line naming
the file, while its sub-steps replay (``calls.log`` does not grow).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from kernel_util import outputs_of, run_saved, stream_text

from nbdurable.durable import fileio
from nbdurable.identity import verdict
from nbdurable.store import open_store
from nbdurable.store.records import StepRecord

SETUP = (
    "%load_ext nbdurable\n"
    "import os, tempfile\n"
    "from pathlib import Path\n"
    "import numpy as np\n"
    "from nbdurable import step\n"
    "def ran(name):\n"
    "    with open('ran.log', 'a') as f:\n"
    "        f.write(name + '\\n')\n"
    "def ask(i):\n"
    "    with open('calls.log', 'a') as f:\n"
    "        f.write(f'ask{i}\\n')\n"
    "    return f'row {i}: {i * i}'"
)

EXPORT = (
    "%%step export\n"
    "rows = [step(f'ask:{i}', ask, i) for i in range(3)]\n"
    "os.makedirs('out', exist_ok=True)\n"
    "Path('out/result.csv').write_text('\\n'.join(rows) + '\\n')\n"
    "np.save('out/arr.npy', np.arange(4) * len(rows))\n"
    "Path('out/summary.tmp').write_text(f'{len(rows)} rows\\n')\n"
    "os.replace('out/summary.tmp', 'out/summary.txt')\n"
    "with tempfile.TemporaryDirectory() as scratch:\n"
    "    Path(scratch, 'scratch.txt').write_text('gone by the end of the step')\n"
    "ran('export')"
)

READ = (
    "print(open('out/result.csv').read(), end='')\n"
    "print(np.load('out/arr.npy').tolist())\n"
    "print(open('out/summary.txt').read(), end='')"
)

LATER = "%%step later\nfor k in range(3):\n    ran('later')"

CELLS = [SETUP, EXPORT, READ, LATER]


def plain(cells: list[str]) -> list[str]:
    """The same notebook without nbdurable: no extension, ``%%step`` lines gone, plain step()."""
    out = []
    for cell in cells:
        lines = [
            ln for ln in cell.split("\n") if not ln.startswith(("%%step", "%load_ext nbdurable"))
        ]
        text = "\n".join(lines).replace(
            "from nbdurable import step\n", "def step(_id, fn, *a):\n    return fn(*a)\n"
        )
        out.append(text)
    return out


def execute(tmp: Path, cells: list[str], allow_errors: bool = False):
    """Save the notebook where NBDURABLE_NOTEBOOK says and run it in a fresh kernel."""
    return run_saved(tmp, cells, allow_errors=allow_errors)


def counts(path: Path) -> Counter:
    return Counter(path.read_text().split() if path.exists() else ())


def warnings_of(nb, index: int) -> list[str]:
    err = stream_text(outputs_of(nb, index), "stderr")
    return [ln for ln in err.splitlines() if "NbdurableWarning" in ln]


def replayed(nb, index: int) -> bool:
    return any(
        (o.get("metadata") or {}).get("nbdurable", {}).get("note") == "replayed"
        for o in outputs_of(nb, index)
    )


def step_records(store_dir: Path) -> dict[str, StepRecord]:
    """The step records in the store, by step name."""
    out = {}
    with open_store(store_dir) as store:
        for key in store.scan("r/"):
            if "/s/" in key:
                rec = StepRecord.from_header(store.get(key)[0])
                out[rec.name] = rec
    return out


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "durable").mkdir()
    return tmp_path / "plain", tmp_path / "durable"


@pytest.mark.kernel
def test_deleted_outputs_run_the_step_again_and_its_calls_replay(dirs):
    plain_dir, wd = dirs
    want = stream_text(outputs_of(execute(plain_dir, plain(CELLS)), 2))
    assert want == "row 0: 0\nrow 1: 1\nrow 2: 4\n[0, 3, 6, 9]\n3 rows\n"

    first = execute(wd, CELLS)
    assert stream_text(outputs_of(first, 2)) == want
    assert counts(wd / "calls.log") == {"ask0": 1, "ask1": 1, "ask2": 1}
    # What the step wrote and left, and nothing else: not the file renamed away, not
    # the temporary directory's, not calls.log (written by its sub-step calls).
    written = step_records(wd / "store")["export"].written
    assert sorted(os.path.relpath(p, wd) for p in written) == [
        "out/arr.npy",
        "out/result.csv",
        "out/summary.txt",
        "ran.log",
    ]
    assert len(written[str(wd / "ran.log")]) == 4  # appended to: its own part is checked
    # Opened three times to append, by the next step: its part is the three lines.
    end, _mtime, digest, start = step_records(wd / "store")["later"].written[str(wd / "ran.log")]
    assert (start, end) == (len("export\n"), len("export\n" + "later\n" * 3))
    assert digest == hashlib.sha256(b"later\n" * 3).hexdigest()[:32]

    # Appends by others to a log the step appended to, and the sub-steps' own file
    # gone: no change to the step's outputs, everything replays.
    with open(wd / "ran.log", "a") as f:
        f.write("by-hand\n")
    (wd / "calls.log").unlink()
    second = execute(wd, CELLS)
    assert replayed(second, 1) and replayed(second, 3)
    assert warnings_of(second, 1) == []
    assert stream_text(outputs_of(second, 2)) == want
    assert counts(wd / "ran.log")["export"] == 1

    # `git clean`: the output directory is gone. The step runs again (one line
    # naming its files), its calls replay, and the reading cell reads as in a plain run.
    shutil.rmtree(wd / "out")
    third = execute(wd, CELLS)
    said = warnings_of(third, 1)
    assert len(said) == 1, said
    assert "step 'export' runs again: its output files 'out/arr.npy' is missing" in said[0]
    assert "'out/result.csv' is missing" in said[0] and "its HTTP requests replay" in said[0]
    assert not replayed(third, 1) and replayed(third, 3)
    assert counts(wd / "ran.log")["export"] == 2
    assert not (wd / "calls.log").exists(), "a recorded call was made again"
    assert stream_text(outputs_of(third, 2)) == want

    fourth = execute(wd, CELLS)
    assert replayed(fourth, 1) and warnings_of(fourth, 1) == []
    assert counts(wd / "ran.log")["export"] == 2
    assert stream_text(outputs_of(fourth, 2)) == want


@pytest.mark.kernel
def test_an_output_changed_by_hand_runs_the_step_again(dirs):
    plain_dir, wd = dirs
    want = stream_text(outputs_of(execute(plain_dir, plain(CELLS)), 2))
    execute(wd, CELLS)
    (wd / "out" / "result.csv").write_text("edited by hand\n")
    nb = execute(wd, CELLS)
    said = warnings_of(nb, 1)
    assert len(said) == 1 and "its output file 'out/result.csv' changed" in said[0], said
    assert stream_text(outputs_of(nb, 2)) == want
    assert counts(wd / "ran.log")["export"] == 2
    assert counts(wd / "calls.log") == {"ask0": 1, "ask1": 1, "ask2": 1}

    # The step's own part of a log cut away (the log truncated): it runs again too.
    (wd / "ran.log").write_text("")
    nb = execute(wd, CELLS)
    assert not replayed(nb, 1) and not replayed(nb, 3)
    assert "its output file 'ran.log' changed" in " ".join(warnings_of(nb, 1))
    assert counts(wd / "ran.log") == {"export": 1, "later": 3}
    assert counts(wd / "calls.log") == {"ask0": 1, "ask1": 1, "ask2": 1}

    # Pinned, it replays anyway (the user froze it), and its note names the file.
    (wd / "out" / "result.csv").unlink()
    nb = execute(wd, [SETUP + "\n%step pin export", *CELLS[1:]], allow_errors=True)
    notes = [o["data"]["text/plain"] for o in outputs_of(nb, 1) if "data" in o]
    assert len(notes) == 1, notes
    assert notes[0].endswith("pinned, stale: output file 'out/result.csv' is missing"), notes
    assert counts(wd / "ran.log") == {"export": 1, "later": 3}


def pipeline(words: str) -> list[str]:
    """A step writing a CSV with pandas, another reading it: they talk through the file."""
    return [
        SETUP + "\nimport pandas as pd",
        f"%%step writer\npd.DataFrame({{'w': ({words}).split()}}).to_csv('data.csv', index=False)\n"
        "ran('writer')",
        "%%step reader\nn = len(pd.read_csv('data.csv'))\nran('reader')",
        "print(n)",
    ]


@pytest.mark.kernel
def test_a_step_reading_a_file_another_step_wrote_follows_the_writer(dirs):
    plain_dir, wd = dirs
    execute(wd, pipeline("'a b c'"))
    assert counts(wd / "ran.log") == {"writer": 1, "reader": 1}

    # The writer edited to write more words: the reader must not replay the old count.
    edited = pipeline("'a b c d e'")
    want = stream_text(outputs_of(execute(plain_dir, plain(edited)), 3))
    assert want == "5\n"
    nb = execute(wd, edited)
    assert not replayed(nb, 2)
    assert stream_text(outputs_of(nb, 3)) == want
    assert counts(wd / "ran.log") == {"writer": 2, "reader": 2}

    # An edit that writes the same bytes: the writer runs, the reader replays.
    same = pipeline("'a b c ' + 'd e'")
    nb = execute(wd, same)
    assert not replayed(nb, 1) and replayed(nb, 2)
    assert stream_text(outputs_of(nb, 3)) == want
    assert counts(wd / "ran.log") == {"writer": 3, "reader": 2}


# -- the checks themselves, on files in tmp_path ----------------------------------------


def test_a_file_written_whole_is_hashed_once_by_streaming(tmp_path):
    path = tmp_path / "big.bin"
    data = os.urandom(3 << 20) + b"tail"  # over the 1 MiB chunk, not a multiple of it
    path.write_bytes(data)
    got = fileio.outputs({str(path): None})
    assert got[str(path)][0] == len(data)
    assert got[str(path)][2] == hashlib.sha256(data).hexdigest()[:32]
    assert verdict.files_changed(got) == []
    path.write_bytes(data[:-1] + b"!")
    assert verdict.files_changed(got) == [str(path)]
    path.write_bytes(data + b"more")  # a file written whole that grew has changed
    assert verdict.files_changed(got) == [str(path)]
    path.unlink()
    assert verdict.files_changed(got) == [str(path)]


def test_an_appended_file_is_its_own_part(tmp_path):
    log = tmp_path / "log.txt"
    log.write_bytes(b"before\n")
    start = log.stat().st_size
    with open(log, "ab") as f:
        f.write(b"mine\n")
    got = fileio.outputs({str(log): start})
    assert got[str(log)][3] == start
    assert got[str(log)][2] == hashlib.sha256(b"mine\n").hexdigest()[:32]
    with open(log, "ab") as f:
        f.write(b"after\n")
    assert verdict.files_changed(got) == []  # others appending later is no change
    log.write_bytes(b"before\nMINE\nafter\n")
    assert verdict.files_changed(got) == [str(log)]
    log.write_bytes(b"before\n")  # cut back to what was there before the step
    assert verdict.files_changed(got) == [str(log)]


def test_files_gone_by_the_end_of_the_step_are_not_outputs(tmp_path):
    kept, gone = tmp_path / "kept.txt", tmp_path / "gone.txt"
    kept.write_text("x")
    noted = {str(kept): None, str(gone): None, str(tmp_path): None, os.devnull: None}
    if os.path.exists("/proc/self/oom_score_adj"):  # a settings file of the OS, not content
        noted["/proc/self/oom_score_adj"] = None
    assert list(fileio.outputs(noted)) == [str(kept)]


def test_the_reason_names_each_file_as_the_user_wrote_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "b.csv").write_text("x")
    paths = [str(tmp_path / "out" / "a.csv"), str(tmp_path / "out" / "b.csv")]
    assert verdict.output_reason(paths[:1]) == "output file 'out/a.csv' is missing"
    both = verdict.output_reason(paths)
    assert both == "output files 'out/a.csv' is missing, 'out/b.csv' changed"
    outside = os.path.join(os.path.dirname(tmp_path), "elsewhere.csv")
    said = verdict.output_reason([outside])
    assert re.fullmatch(r"output file '/.*elsewhere\.csv' is missing", said)
