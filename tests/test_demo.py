"""``nbdurable demo``: it completes, and every number it prints matches the call counters.

The simulator's ledger (one line per call that reached the model or search
"provider", fsynced, across kernel deaths) and its mailbox are the counters;
the demo's table and JSON are checked against them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

import pytest
from kernel_util import REPO_ROOT, kernel_name

from nbdurable import cli
from nbdurable.demo.sim import MailProvider, cost, ledger_calls


@pytest.fixture(scope="module", autouse=True)
def _kernel_spec():
    kernel_name()  # make sure `python3` runs this interpreter


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NBDURABLE_"):
            monkeypatch.delenv(name)
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    return dict(os.environ)


def split_ledger(directory):
    """``(first attempt's calls, the resume's calls)``, split after the call the crash cut."""
    calls = ledger_calls(directory / "ledger.jsonl")
    cut = next(i for i, c in enumerate(calls) if not c["out"])  # the crashed call returned nothing
    return calls[: cut + 1], calls[cut + 1 :]


def spent(calls):
    tokens = sum(c["tokens"] for c in calls)
    return len(calls), tokens, cost(tokens)


@pytest.mark.kernel
def test_demo_prints_numbers_that_match_the_ledger(tmp_path, clean_env):
    work = tmp_path / "demo"
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "nbdurable", "demo", "--dir", str(work), "--latency", "0"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=240,
    )
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    # How long the demo takes is a figure (bench/e2e.py), not a test: printed, never asserted.
    print(f"the demo took {elapsed:.0f} s")

    first, resume = split_ledger(work)
    assert Counter(c["kind"] for c in first) == {"plan": 1, "search": 41, "answer": 41}
    assert first[-1]["arg"].startswith("Q41:"), "killed in answer:40 (0-based)"
    assert Counter(c["kind"] for c in resume) == {"answer": 20, "search": 19, "synthesize": 1}
    returned = [c for c in first if c["out"]]
    expected = [spent(first), spent(resume), spent(returned + resume)]

    rows = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^(model \+ search calls|tokens|cost)\s{2,}(.+)$", line)
        if m:
            rows[m.group(1)] = m.group(2).split()
    assert set(rows) == {"model + search calls", "tokens", "cost"}, r.stdout
    for column, (calls, tokens, dollars) in enumerate(expected):
        assert int(rows["model + search calls"][column].replace(",", "")) == calls, r.stdout
        assert int(rows["tokens"][column].replace(",", "")) == tokens, r.stdout
        assert rows["cost"][column] == f"${dollars:.3f}", r.stdout
    assert expected[2][0] == 122, "restart from zero = every call of a complete run"

    box = MailProvider(work / "mailbox.sqlite")
    assert box.delivered() == 1 and box.attempts() == 1
    assert "notification delivered: 1 (send attempts: 1;" in r.stdout
    assert "kernel died in cell #7" in r.stdout and "replayed" in r.stdout
    # The death is said once: on the cell's own line, then once where the attempt ends.
    assert r.stdout.count("kernel died in") == 1, r.stdout
    assert r.stdout.count("kernel died") == 2, r.stdout


@pytest.mark.kernel
def test_demo_json_matches_the_ledger(tmp_path, clean_env, capsys):
    work = tmp_path / "demo"
    code = cli.main(["demo", "--dir", str(work), "--crash-at", "0", "--latency", "0", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    s = json.loads(out)

    first, resume = split_ledger(work)
    assert s["first_attempt"]["by_kind"] == {"plan": 1, "search": 1, "answer": 1}
    assert s["resume"]["by_kind"] == {"search": 59, "answer": 60, "synthesize": 1}
    for key, calls in (("first_attempt", first), ("resume", resume)):
        n, tokens, dollars = spent(calls)
        assert (s[key]["calls"], s[key]["tokens"]) == (n, tokens), key
        assert s[key]["cost"] == pytest.approx(dollars), key
    returned = [c for c in first if c["out"]]
    assert s["restart_from_zero"]["calls"] == len(returned) + len(resume) == 122
    assert s["with_nbdurable"]["calls"] == len(first) + len(resume)
    assert s["saved"]["calls"] == len(returned) == 2
    # The resumed kernel replayed exactly the calls that had returned: plan and search:0.
    assert s["replayed"] == {"steps": 1, "calls": 2}
    assert s["kernel_deaths"] == 1
    assert s["notification"]["delivered"] == 1 and s["notification"]["attempts"] == 1


def test_demo_dir_is_reset_only_when_it_holds_an_earlier_demo(tmp_path):
    from nbdurable.demo.crash_resume import _workdir

    work = _workdir(tmp_path / "demo")
    for name in ("ledger.jsonl", "mailbox.sqlite", "research_agent.ipynb"):
        (work / name).write_text("from an earlier demo")
    (work / ".nbdurable").mkdir()
    assert _workdir(work) == work
    assert sorted(p.name for p in work.iterdir()) == [".nbdurable-demo"]


def test_demo_bad_input_is_exit_2(tmp_path, clean_env, capsys):
    assert cli.main(["demo", "--crash-at", "60"]) == 2
    assert "expected 0 to 59" in capsys.readouterr().err
    (tmp_path / "precious.txt").write_text("keep me")
    assert cli.main(["demo", "--dir", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_on_a_team_store_without_a_key_uses_a_demo_key_in_its_own_namespace(monkeypatch):
    from nbdurable.demo.crash_resume import DEMO_KEY, _on_store

    monkeypatch.delenv("NBDURABLE_KEY", raising=False)
    where = _on_store("postgresql://me@db.example/team")
    assert where.store == "postgresql://me@db.example/team?namespace=nbdurable_demo"
    assert where.env == {"NBDURABLE_KEY": DEMO_KEY} and "NBDURABLE_KEY is not set" in where.note
    assert where.run.startswith("demo-")
    # A namespace the user named is theirs to use; with the team's key, the URL as given.
    assert _on_store("postgresql://me@db/team?namespace=try").store.endswith("namespace=try")
    monkeypatch.setenv("NBDURABLE_KEY", "the-team-key-of-sixteen+")
    where = _on_store("postgresql://me@db.example/team")
    assert (where.store, where.env, where.note) == ("postgresql://me@db.example/team", {}, None)
    assert _on_store("postgresql://a@b/c").run != where.run, "a run of its own each time"


@pytest.mark.kernel
@pytest.mark.postgres
def test_demo_runs_on_a_team_store(tmp_path, clean_env, capsys, pg_server):
    import uuid

    import psycopg

    from nbdurable.demo.crash_resume import DEMO_KEY
    from nbdurable.store import admin, open_store
    from nbdurable.store.postgres import display

    ns = f"t_{uuid.uuid4().hex[:12]}"
    url = f"{pg_server}{'&' if '?' in pg_server else '?'}namespace={ns}"
    work = tmp_path / "demo"
    try:
        argv = ["demo", "--dir", str(work), "--crash-at", "0", "--latency", "0", "--json"]
        code = cli.main([*argv, "--store", url])
        out, err = capsys.readouterr()
        assert code == 0, out + err
        assert err.startswith("nbdurable demo: NBDURABLE_KEY is not set") and err.count("\n") == 1
        assert "NBDURABLE_KEY" not in os.environ, "the demo key is the demo's only"
        s = json.loads(out)
        assert s["store"] == display(url) and s["demo_key"] is True
        assert s["run"].startswith("demo-")
        assert s["resume"]["by_kind"] == {"search": 59, "answer": 60, "synthesize": 1}
        assert s["replayed"] == {"steps": 1, "calls": 2} and s["kernel_deaths"] == 1
        assert not (work / ".nbdurable").exists(), "nothing was recorded beside the notebook"
        os.environ["NBDURABLE_KEY"] = DEMO_KEY
        with open_store(url) as store:
            assert admin.known_run(store, s["run"])
        # The team's own key cannot open what the demo key signed: one line, exit 2.
        os.environ["NBDURABLE_KEY"] = "the-team-key-of-sixteen+"
        assert cli.main([*argv, "--store", url]) == 2
        err = capsys.readouterr().err
        assert "cannot be verified" in err and err.count("\n") == 1
    finally:
        os.environ.pop("NBDURABLE_KEY", None)
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{ns}" CASCADE')
