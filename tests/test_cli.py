"""The ``nbdurable`` command, end to end: real kernels, real crashes, real exit codes.

Commands that start kernels run as ``python -m nbdurable`` subprocesses (so
exit codes and stderr are the real ones); commands that only read the store
also run in-process through ``cli.main`` where that is faster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from kernel_util import REPO_ROOT, kernel_name, make_notebook

from nbdurable import cli

NOTEBOOKS = REPO_ROOT / "nbdurable" / "notebooks"

# A notebook whose kernel dies (os._exit) inside the sub-steps listed in DIE_AT,
# once each: a marker file remembers that the crash happened.
CRASHY = [
    "%load_ext nbdurable\n"
    "import os, pathlib\n"
    "from nbdurable import step\n"
    "DIE_AT = {int(x) for x in os.environ.get('DIE_AT', '').split(',') if x}\n"
    "def call(i):\n"
    "    marker = pathlib.Path(f'died-{i}')\n"
    "    if i in DIE_AT and not marker.exists():\n"
    "        marker.write_text('x')\n"
    "        os._exit(1)\n"
    "    with open('calls.log', 'a') as f:\n"
    "        f.write(f'{i}\\n')\n"
    "    return i * i",
    "%%step loop\nsquares = [step(f'sq:{i}', call, i) for i in range(8)]",
    "%%step total\ntotal = sum(squares)\nprint('total', total)",
    "import json, os\n"
    "print(json.dumps({'notebook': os.environ.get('NBDURABLE_NOTEBOOK'),\n"
    "                  'md': get_ipython().kernel.get_parent('shell')['metadata']}))",
]


@pytest.fixture(scope="module", autouse=True)
def _kernel_spec():
    kernel_name()  # make sure `python3` runs this interpreter


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NBDURABLE_") and k != "JPY_SESSION_NAME"
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["NBDURABLE_DIR"] = str(tmp_path / "store")
    env["NBDURABLE_SIM_LATENCY"] = "0"
    env.update(extra)
    return env


def nbd(*args: object, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nbdurable", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def inproc(capsys, monkeypatch, tmp_path: Path, *args: object) -> tuple[int, str, str]:
    """Run ``cli.main`` in this process, with the environment the subprocesses get.

    In-process ``run`` saves the subprocess's imports (nbformat alone takes
    seconds); the kernels it starts are as real as ever.
    """
    for name, value in _env(tmp_path).items():
        if name.startswith("NBDURABLE_") or name == "PYTHONPATH":
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, cells: list[str], name: str = "nb.ipynb", minor: int = 5) -> Path:
    path = tmp_path / name
    nbformat.write(make_notebook(cells, nbformat_minor=minor), path)
    return path


def by_key(status: dict) -> dict[str, dict]:
    return {s["key"]: s for s in status["steps"]}


def last_cells(summary: dict) -> dict[str, dict]:
    return {c["label"]: c for c in summary["attempts"][-1]["cells"]}


# -- exit 0: two kernel deaths, nothing repeated ------------------------------------


@pytest.mark.kernel
def test_run_survives_two_kernel_deaths_and_repeats_no_call(tmp_path, capsys, monkeypatch):
    nb = write(tmp_path, CRASHY)
    monkeypatch.setenv("DIE_AT", "3,6")
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "run", nb, "--json")
    assert code == 0, out + err
    summary = json.loads(out)
    assert summary["status"] == "ok" and summary["kernel_deaths"] == 2, summary
    outcomes = [[(c["label"], c["outcome"]) for c in a["cells"]] for a in summary["attempts"]]
    assert outcomes == [
        [("loop", "kernel died")],
        [("loop", "kernel died")],
        [("loop", "executed"), ("total", "executed")],
    ]
    assert [a["calls_made"] for a in summary["attempts"]] == [3, 3, 2]
    assert summary["calls"] == {"made": 8, "replayed": 6}
    # Every call ran exactly once across three kernels.
    assert (tmp_path / "calls.log").read_text().split() == [str(i) for i in range(8)]

    # The executed notebook was written in place, with the kernel's view of itself.
    done = nbformat.read(nb, as_version=4)
    assert "total 140" in done.cells[2].outputs[0]["text"]
    seen = json.loads(done.cells[3].outputs[0]["text"])
    assert seen["notebook"] == str(nb)
    assert seen["md"]["cellId"] == done.cells[3].id
    assert seen["md"]["nbdurable"] == {"position": 3}

    # status reads the same run (the run id matches) and sees both steps recorded. With
    # no kernel it cannot see `call`, which a plain cell makes: 'loop' may run, and so
    # may 'total', which reads what 'loop' makes.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb, "--json")
    assert code == 0, out + err
    steps = by_key(json.loads(out))
    loop, total = steps["name:loop"], steps["name:total"]
    assert (loop["state"], loop["substeps"]) == ("may run", 8) and loop["version"], loop
    assert "reads 'call' from plain cells" in loop["detail"], loop
    assert total["state"] == "may run" and total["recorded_at"], total


# -- exit 3: more deaths than --retries ----------------------------------------------------


@pytest.mark.kernel
def test_exit_3_when_the_kernel_dies_more_than_retries(tmp_path, capsys, monkeypatch):
    nb = write(tmp_path, CRASHY)
    r = nbd("run", nb, "--retries", "0", "--run", "crashy", "--json",
            env=_env(tmp_path, DIE_AT="3"))  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "died 1 time, more than --retries 0" in r.stderr
    summary = json.loads(r.stdout)
    assert summary["status"] == "kernel died" and summary["attempts"][0]["died_in"] == 1

    # The named run holds the three sub-steps that returned before the crash.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb, "--run", "crashy",
                            "--json")  # fmt: skip
    assert code == 0, out + err
    steps = by_key(json.loads(out))
    assert steps["name:loop"]["state"] == "pending" and steps["name:loop"]["substeps"] == 3
    # ... and the notebook's own run holds nothing.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb, "--json")
    assert code == 0, out + err
    assert {s["substeps"] for s in json.loads(out)["steps"]} == {0}


# -- exit 1: a cell raised -------------------------------------------------------------------


@pytest.mark.kernel
def test_exit_1_shows_the_cell_and_the_error(tmp_path, capsys, monkeypatch):
    # nbformat 4.4: no cell ids on disk, so steps are keyed by position.
    cells = ["%load_ext nbdurable", "%%step\nx = 41\nprint('x is', x)", "%%step\ny = x / 0"]
    nb = write(tmp_path, cells, minor=4)
    out_nb = tmp_path / "out.ipynb"
    r = nbd("run", nb, "-o", out_nb, env=_env(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "y = x / 0" in r.stderr and "ZeroDivisionError" in r.stderr, r.stderr
    assert "cell #3" in r.stderr.splitlines()[-1]
    assert "failed" in r.stdout and "ZeroDivisionError" in r.stdout  # the step's progress line
    done = nbformat.read(out_nb, as_version=4)
    assert done.cells[2].outputs[-1]["ename"] == "ZeroDivisionError"
    assert not nbformat.read(nb, as_version=4).cells[1].outputs, "-o leaves the input alone"

    code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb, "--json")
    assert code == 0, out + err
    steps = by_key(json.loads(out))
    assert steps["pos:1"]["state"] == "recorded"
    assert steps["pos:2"]["state"] == "failed" and "ZeroDivisionError" in steps["pos:2"]["detail"]


# -- exit 2: bad usage, one line, no traceback ------------------------------------------------


def test_bad_usage_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    env = _env(tmp_path)
    for args in (("run", tmp_path / "missing.ipynb"), ("run", "--retries", "-1", "x.ipynb")):
        r = nbd(*args, env=env, timeout=60)
        assert r.returncode == 2, (args, r.stdout + r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (args, r.stderr)

    nb = write(tmp_path, ["%load_ext nbdurable", "%%step a\na = 1"])
    (tmp_path / "junk.ipynb").write_text("{not json")
    for args, expected in (
        (("status", tmp_path / "missing.ipynb"), "no notebook at"),
        (("clear", nb, "a"), "nothing is recorded"),
        (("status", tmp_path / "junk.ipynb"), "junk.ipynb is not a notebook ("),
        (("run", tmp_path / "junk.ipynb"), "junk.ipynb is not a notebook ("),
        (("run", tmp_path / "sub" / ".."), f"error: {tmp_path} is a directory: give the"),
        (("status", tmp_path), "is a directory: give the .ipynb file to use (junk.ipynb, nb"),
        (("ls", "--store", tmp_path / "nowhere"), "no nbdurable store"),
        (("clear", nb), "give step names"),
        (("gc", "--older-than", "soon", "--store", tmp_path), "is not an age"),
    ):
        code, out, err = inproc(capsys, monkeypatch, tmp_path, *args)
        assert code == 2 and expected in err and err.count("\n") == 1, (args, out, err)


def test_status_before_any_run_lists_pending_steps_and_creates_no_store(
    tmp_path, capsys, monkeypatch
):
    nb = write(tmp_path, ["%load_ext nbdurable", "%%step a\na = 1", "x = 2", "%%step\nb = a"])
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb)
    assert code == 0, out + err
    rows = out.splitlines()
    assert "pending" in rows[2] and " a " in rows[2], out
    assert "pending" in rows[3] and "cell " in rows[3], out
    assert len(rows) == 4, out
    assert not (tmp_path / "store").exists()


# -- status, export, pin, clear, gc on one run, seen by kernels --------------------------------

LIFECYCLE = [
    "%load_ext nbdurable\n"
    "from nbdurable import step\n"
    "def call(name):\n"
    "    with open('calls.log', 'a') as f:\n"
    "        f.write(name + '\\n')\n"
    "    return {'name': name, 'n': len(name)}",
    "%%step a\na = step('fetch', call, 'alpha')",
    "%%step\nb = [step(f'b:{i}', call, f'b{i}') for i in range(3)]",
    "%%step c\nc = a['n'] + len(b)\nprint('c is', c)",
]


@pytest.mark.kernel
def test_status_export_pin_clear_gc_through_the_cli(tmp_path, capsys, monkeypatch):
    nb = write(tmp_path, LIFECYCLE)
    calls = tmp_path / "calls.log"
    b_key = f"id:{nbformat.read(nb, as_version=4).cells[2].id}"

    def status() -> dict[str, dict]:
        code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb, "--json")
        assert code == 0, out + err
        return by_key(json.loads(out))

    assert [s["state"] for s in status().values()] == ["pending"] * 3
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "run", nb)
    assert code == 0, out + err
    assert calls.read_text().split() == ["alpha", "b0", "b1", "b2"]
    steps = status()
    assert list(steps) == ["name:a", b_key, "name:c"]
    # With no kernel, `call` (a plain cell's function) is known by its saved `def`.
    assert [s["state"] for s in steps.values()] == ["recorded"] * 3, steps
    assert [s["substeps"] for s in steps.values()] == [1, 3, 0]

    # export: the log, in order, with fingerprints and values.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "export", nb, "--values")
    assert code == 0, out + err
    log = json.loads(out)
    assert [s["key"] for s in log["steps"]] == ["name:a", b_key, "name:c"]
    a, b, c = log["steps"]
    assert a["substeps"][0]["id"] == "fetch"
    assert a["substeps"][0]["value"] == {"name": "alpha", "n": 5}
    assert [s["id"] for s in b["substeps"]] == ["b:0", "b:1", "b:2"]
    assert [v["name"] for v in c["variables"]] == ["c"] and c["variables"][0]["value"] == 8
    assert c["input_from"] == {"a": "name:a", "b": b_key}
    for step in (a, b, c):
        assert len(step["source_fp"]) == 32 and step["duration"] >= 0
        for sub in step["substeps"]:
            assert sub["args_fp"] and len(sub["sha256"]) == 64 and sub["started"] > 0
    # One numbering of cells, from 1 as frontends show them: status's table, its JSON, export.
    assert [s["cell"] for s in log["steps"]] == [s["cell"] for s in steps.values()] == [2, 3, 4]
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "status", nb)
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["2", "3", "4"], out
    assert all("position" not in s for s in [*log["steps"], *steps.values()])
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "export", nb, "--format", "jsonl")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [x["kind"] for x in lines] == ["run", "step", "sub", "step", "sub", "sub", "sub", "step"]
    assert "value" not in lines[2], "values only with --values"

    # pin c, then edit its code: status shows it pinned and stale.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "pin", nb, "c")
    assert code == 0, out + err
    edited = nbformat.read(nb, as_version=4)
    edited.cells[3].source = "%%step c\nc = a['n'] + len(b)\nprint('c is now', c)"
    nbformat.write(edited, nb)
    steps = status()
    assert steps["name:c"]["state"] == "pinned" and steps["name:c"]["stale"]
    assert steps["name:c"]["detail"] == "its code changed"

    # clear a (and edit b): the next kernel executes a and b again, and replays pinned c.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "clear", nb, "a")
    # Steps are named by their labels, as %step clear names them (not by their keys).
    assert code == 0 and out.strip() == "cleared: a; invalidated dependants: c", out + err
    assert status()["name:a"]["state"] == "pending"
    edited.cells[2].source = "%%step\nb = [step(f'b:{i}', call, f'b{i}') for i in range(5)]"
    nbformat.write(edited, nb)
    assert status()[b_key]["state"] == "invalidated"
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "run", nb, "--json")
    assert code == 0, out + err
    cells = last_cells(json.loads(out))
    assert cells["a"]["outcome"] == "executed" and cells["a"]["calls_made"] == 1
    assert cells[f"cell {b_key[3:11]}"]["outcome"] == "invalidated"
    assert cells[f"cell {b_key[3:11]}"]["calls_made"] == 2  # b:3, b:4; b:0..2 replayed
    assert cells["c"]["outcome"] == "replayed" and "pinned" in cells["c"]["detail"]
    assert calls.read_text().split() == ["alpha", "b0", "b1", "b2", "alpha", "b3", "b4"]
    out_nb = nbformat.read(nb, as_version=4)
    assert "c is 8" in out_nb.cells[3].outputs[0]["text"], "the pinned record, not the edit"

    # gc: a dry run changes nothing; then everything goes except the pinned step.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "gc", "--older-than", "0",
                            "--dry-run", "--json")  # fmt: skip
    assert code == 0, out + err
    dry = json.loads(out)
    assert dry["dry_run"] and dry["keys"] > 0 and dry["kept_pinned"]
    assert [s["state"] for s in status().values()] == ["recorded", "recorded", "pinned"]
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "gc", "--older-than", "0")
    assert code == 0 and "kept pinned steps" in out, out + err
    assert [s["state"] for s in status().values()] == ["pending", "pending", "pinned"]
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "ls", "--json")
    (run,) = json.loads(out)["runs"]
    assert run["run"] == "nb.ipynb" and run["steps"] == 1 and run["pinned"] == 1

    # A kernel still replays the pinned step: its record and saved variable survived gc.
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "run", nb, "--json")
    assert code == 0, out + err
    cells = last_cells(json.loads(out))
    assert cells["c"]["outcome"] == "replayed"
    assert cells["a"]["outcome"] == "executed"
    assert "c is 8" in nbformat.read(nb, as_version=4).cells[3].outputs[0]["text"]


def test_gc_keeps_every_blob_when_a_step_record_is_unreadable(tmp_path):
    from nbdurable.store import admin as runs
    from nbdurable.store import open_store

    with open_store(tmp_path / "store") as store:
        sha, _ = store.put_blob(b"some value")
        # A record that fails its signature check: it might reference any blob.
        store._rows.cache.set("r/0123456789abcdef/s/name:x", b"not a signed record")
        report = runs.gc(store, older_than=0)
        assert report.blobs == 0 and report.keys == 0 and len(report.notes) == 2, report
        assert bytes(store.get_blob(sha).stream) == b"some value"
        assert store.has("r/0123456789abcdef/s/name:x")


def test_parse_age():
    from nbdurable.errors import UsageProblem
    from nbdurable.store.admin import parse_age

    assert parse_age("30d") == parse_age("30") == 30 * 86400
    assert (
        parse_age("12h") == 12 * 3600 and parse_age("90m") == 5400 and parse_age("2w") == 14 * 86400
    )
    assert parse_age("0") == 0
    for bad in ("", "soon", "-1d", "inf"):
        with pytest.raises(UsageProblem):
            parse_age(bad)


# -- the bundled quickstart runs top to bottom --------------------------------------------------


@pytest.mark.kernel
def test_quickstart_notebook_runs_top_to_bottom(tmp_path, capsys, monkeypatch):
    out_nb = tmp_path / "quickstart.ipynb"
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "run", NOTEBOOKS / "quickstart.ipynb",
                            "-o", out_nb, "--cwd", tmp_path, "--json")  # fmt: skip
    assert code == 0, out + err
    summary = json.loads(out)
    assert summary["steps"]["executed"] == 3 and summary["calls"]["made"] == 5, summary
    done = nbformat.read(out_nb, as_version=4)
    printed = "".join(o.get("text", "") for c in done.cells if c.cell_type == "code"
                      for o in c.outputs)  # fmt: skip
    assert "[0, 1, 4, 9, 16]" in printed and "pinned: total" in printed


def test_check_says_what_it_found_and_what_it_repaired(tmp_path, capsys, monkeypatch):
    import shutil

    from test_hostile import age_files

    from nbdurable.store import open_store

    big = os.urandom(64 * 1024)  # kept in value files, not in the database
    with open_store(tmp_path / "store") as store:
        store.put("r/x/s/a", {"n": 1}, big)
        store.put("r/x/s/b", {"n": 2}, big)

        def file_of(key):
            (name,) = store._rows.cache._sql("SELECT filename FROM Cache WHERE key = ?", (key,))
            return store.cache_dir / name[0]

        # b loses its value file; a file no record points to is left (as a killed write does).
        file_of("r/x/s/b").unlink()
        orphan = store.cache_dir / "ab" / "cd" / ("e" * 28 + ".val")
        orphan.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(file_of("r/x/s/a"), orphan)
        age_files(store.cache_dir)
    where = tmp_path / "store"

    code, out, err = inproc(capsys, monkeypatch, tmp_path, "check", "--store", where, "--dry-run")
    assert code == 1, out + err
    lines = out.splitlines()
    assert (
        lines[0] == f"store {where}: 2 problems found, 0 repaired (--dry-run: nothing was changed)"
    )
    assert "  found: record 'r/x/s/b' has lost its value file" in lines
    assert f"  found: file {orphan} belongs to no record" in lines
    assert orphan.exists(), "a dry run changes nothing"

    code, out, err = inproc(capsys, monkeypatch, tmp_path, "check", "--store", where, "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert not report["sound"] and report["left"] == [] and len(report["repaired"]) == 2, report
    assert not orphan.exists()

    nb = write(tmp_path, ["x = 1"])  # its store is NBDURABLE_DIR, the same one
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "check", nb)
    assert code == 0 and out.strip() == f"store {where}: sound, nothing to repair", out + err
    with open_store(where) as store:
        assert store.get("r/x/s/a") == ({"n": 1}, big) and store.get("r/x/s/b") is None

    code, out, err = inproc(capsys, monkeypatch, tmp_path, "check", "--store", tmp_path / "none")
    assert code == 2 and "no nbdurable store at" in err and out == "", out + err


def test_paths_a_command_cannot_use_are_one_line_errors(tmp_path, capsys):
    """A file where a directory must be: one line saying so, exit 2, no traceback."""
    afile = tmp_path / "afile"
    afile.write_text("")
    nb = tmp_path / "nb.ipynb"
    nbformat.write(make_notebook(["1 + 1"]), nb)
    for argv, said in [
        (["demo", "--dir", str(afile / "sub")], "cannot make the demo's directory there"),
        (["run", str(nb), "-o", str(afile / "out.ipynb")], f"{afile} is not a directory"),
    ]:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "Traceback" not in err, err
    assert afile.read_text() == ""


def test_clip_cuts_at_a_sentence_or_a_word():
    from nbdurable.text import clip

    assert clip("short", 10) == "short"
    text = "The run is held by process 12. Stop the other kernel, or take the lease over."
    assert clip(text, 40) == "The run is held by process 12. …"
    assert clip("word " * 20, 23) == "word word word word…"
