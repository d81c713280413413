"""Real kernels on the team store: record, crash, resume and replay through PostgreSQL.

The simulated model (nbdurable.demo.sim) appends every real call to a ledger
outside the store, and kills its kernel for real inside the 41st answer call.
Two "machines" are two project directories with their own NBDURABLE_DIR and
NBDURABLE_HOST, sharing one store URL and one ledger.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter

import nbformat
import pytest
from kernel_util import make_notebook, outputs_of, run_notebook
from nbclient.exceptions import CellExecutionError, DeadKernelError
from pg_util import namespace, pg_sql
from test_cli import CRASHY, inproc, write
from test_faults import FIXED_KILLS, run_scenario
from test_lease import Kernel
from test_story import CELLS

from nbdurable.cli import main
from nbdurable.demo.sim import ledger_calls
from nbdurable.durable import lease
from nbdurable.store import RunKeys, open_store, values
from nbdurable.store.postgres import display

pytestmark = [pytest.mark.postgres, pytest.mark.kernel]

EXPIRY = 4.0  # seconds without a heartbeat before another machine's lease lapses


def _machine(tmp_path, name: str, url: str, **extra: str) -> dict[str, str]:
    """The environment of a kernel on machine ``name``: its own project directory."""
    project = tmp_path / name
    project.mkdir(exist_ok=True)
    nbformat.write(make_notebook(CELLS), project / "story.ipynb")
    return {
        "NBDURABLE_STORE": url,
        "NBDURABLE_DIR": str(project / ".nbdurable"),
        "NBDURABLE_NOTEBOOK": str(project / "story.ipynb"),
        "NBDURABLE_HOST": f"host-{name}",
        "NBDURABLE_LEASE_EXPIRY": str(EXPIRY),
        "NBDURABLE_SIM_LEDGER": str(tmp_path / "ledger.jsonl"),
        "NBDURABLE_SIM_LATENCY": "0",
        "JPY_SESSION_NAME": "",
        **extra,
    }


def _kinds(calls: list[dict]) -> Counter:
    return Counter(c["kind"] for c in calls)


def test_a_notebook_recorded_on_postgres_resumes_and_replays_in_fresh_kernels(
    tmp_path, pg_url, capsys
):
    env = _machine(tmp_path, "a", pg_url, NBDURABLE_SIM_CRASH_AT="41")
    ledger = tmp_path / "ledger.jsonl"
    cwd = tmp_path / "a"
    with pytest.raises(DeadKernelError):
        run_notebook(make_notebook(CELLS), cwd=cwd, env=env)
    before = ledger_calls(ledger)
    assert _kinds(before) == {"plan": 1, "search": 41, "answer": 41}

    second = run_notebook(make_notebook(CELLS), cwd=cwd, env=env)
    resumed = ledger_calls(ledger)[len(before) :]
    returned = {(c["kind"], c["arg"]) for c in before[:-1]}
    assert not returned & {(c["kind"], c["arg"]) for c in resumed}, "a recorded call repeated"
    assert _kinds(resumed) == {"answer": 20, "search": 19, "synthesize": 1}

    third = run_notebook(make_notebook(CELLS), cwd=cwd, env=env)
    assert len(ledger_calls(ledger)) == len(before) + len(resumed), "replay made a call"
    assert outputs_of(third, 4)[0]["text"] == outputs_of(second, 4)[0]["text"]

    # The CLI sees the run through the same URL (the run id is the notebook's own).
    capsys.readouterr()
    assert main(["status", str(cwd / "story.ipynb"), "--store", pg_url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [s["label"] for s in status["steps"]] == ["plan", "research", "synthesize"]
    assert {s["state"] for s in status["steps"]} == {"recorded"}, status["steps"]


def test_cli_status_export_pin_and_clear_through_a_url(tmp_path, pg_url, capsys):
    env = _machine(tmp_path, "a", pg_url)
    cells = CELLS[:2]
    nbformat.write(make_notebook(cells), tmp_path / "a" / "story.ipynb")
    run_notebook(make_notebook(cells), cwd=tmp_path / "a", env=env)
    notebook = str(tmp_path / "a" / "story.ipynb")
    capsys.readouterr()
    assert main(["status", notebook, "--store", pg_url, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["run"] == "story.ipynb" and status["store"] == display(pg_url)
    assert [s["state"] for s in status["steps"]] == ["recorded"]
    assert main(["export", notebook, "--store", pg_url, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["run"] == "story.ipynb" and [s["label"] for s in doc["steps"]] == ["plan"]

    # pin, unpin and clear: the same commands, through the URL.
    def state() -> str:
        capsys.readouterr()
        assert main(["status", notebook, "--store", pg_url, "--json"]) == 0
        (step,) = json.loads(capsys.readouterr().out)["steps"]
        return step["state"]

    assert main(["pin", notebook, "plan", "--store", pg_url]) == 0
    assert state() == "pinned"
    assert main(["unpin", notebook, "plan", "--store", pg_url]) == 0
    assert state() == "recorded"
    assert main(["clear", notebook, "plan", "--store", pg_url]) == 0
    assert state() == "pending"
    with open_store(pg_url) as store:
        assert store.scan("r/story.ipynb/") == [], "the step and its sub-steps are gone"


def test_two_machines_share_a_run_one_at_a_time(tmp_path, pg_url):
    ledger = tmp_path / "ledger.jsonl"
    env_a = _machine(tmp_path, "a", pg_url, NBDURABLE_SIM_CRASH_AT="41")
    env_b = _machine(tmp_path, "b", pg_url, NBDURABLE_SIM_CRASH_AT="41")

    # While A is alive and holds the run, B is refused with one line naming A.
    a = Kernel(tmp_path / "a", env_a)
    try:
        assert a.run(CELLS[0])["status"] == "ok"
        assert a.run(CELLS[1])["status"] == "ok"
        pid_a = int(a.run("import os\nprint(os.getpid())")["stdout"])
        with pytest.raises(CellExecutionError) as info:
            run_notebook(make_notebook(CELLS), cwd=tmp_path / "b", env=env_b)
        assert info.value.ename == "UsageError"
        assert f"process {pid_a} on host-a" in info.value.evalue
        assert "\n" not in info.value.evalue
        assert _kinds(ledger_calls(ledger)) == {"plan": 1}, "B must not have made a call"
    finally:
        a.close()

    # A (a new kernel on machine A) is killed half way through the research loop.
    with pytest.raises(DeadKernelError):
        run_notebook(make_notebook(CELLS), cwd=tmp_path / "a", env=env_a)
    before = ledger_calls(ledger)
    assert _kinds(before) == {"plan": 1, "search": 41, "answer": 41}

    # B cannot see whether A's process lives: it waits for A's lease to lapse.
    with open_store(pg_url) as store:
        holder = lease.read(store, "story.ipynb")
        assert holder is not None and holder.host == "host-a"
        deadline = time.monotonic() + 60
        while time.time() - lease.read(store, "story.ipynb").heartbeat < EXPIRY + 0.5:
            assert time.monotonic() < deadline, "A's lease never lapsed"
            time.sleep(0.2)

    second = run_notebook(make_notebook(CELLS), cwd=tmp_path / "b", env=env_b)
    resumed = ledger_calls(ledger)[len(before) :]
    returned = {(c["kind"], c["arg"]) for c in before[:-1]}
    assert not returned & {(c["kind"], c["arg"]) for c in resumed}, "a recorded call repeated"
    assert _kinds(resumed) == {"answer": 20, "search": 19, "synthesize": 1}
    hashes = json.loads(outputs_of(second, 4)[0]["text"].splitlines()[0])
    assert hashes[:40] == [c["out"] for c in before[:-1] if c["kind"] == "answer"]


@pytest.mark.parametrize("kill", FIXED_KILLS, ids=lambda k: "-".join(map(str, k)))
def test_survives_a_kill_on_postgres(kill, tmp_path, pg_url):
    """The fault-injection suite of tests/test_faults.py, on the team store."""
    print(run_scenario(tmp_path / "run", kill, random.Random(f"pg-{kill}"), pg_url))


def test_nbdurable_run_resumes_through_a_url(tmp_path, pg_url, capsys, monkeypatch):
    nb = write(tmp_path, CRASHY)
    monkeypatch.setenv("DIE_AT", "3,6")
    code, out, err = inproc(capsys, monkeypatch, tmp_path, "run", nb, "--store", pg_url, "--json")
    assert code == 0, out + err
    summary = json.loads(out)
    assert summary["kernel_deaths"] == 2 and summary["calls"] == {"made": 8, "replayed": 6}
    assert summary["store"] == display(pg_url)
    assert (tmp_path / "calls.log").read_text().split() == [str(i) for i in range(8)]
    assert not (tmp_path / "store").exists(), "nothing was recorded in the directory"
    code, out, err = inproc(
        capsys, monkeypatch, tmp_path, "status", nb, "--store", pg_url, "--json"
    )
    assert code == 0, out + err
    # Both recorded; with no kernel `call` (a plain cell's function) is not seen: may run.
    steps = json.loads(out)["steps"]
    assert {s["state"] for s in steps} == {"may run"} and all(s["recorded_at"] for s in steps)


def test_a_server_that_is_down_is_one_line_in_the_notebook(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("NBDURABLE_KEY", "k" * 20)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://postgres:pw@127.0.0.1:{port}/test"
    nb = make_notebook(["%load_ext nbdurable", "%%step one\nx = 1"])
    env = {"NBDURABLE_STORE": url, "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb")}
    done = run_notebook(nb, cwd=tmp_path, env=env, allow_errors=True)
    # A UsageError: IPython prints its one line, no traceback.
    (out,) = done.cells[1].outputs
    assert out["output_type"] == "stream" and out["name"] == "stderr", out
    text = out["text"].rstrip("\n")
    assert text.startswith("UsageError: cannot reach the nbdurable store at ")
    assert f"postgresql://postgres@127.0.0.1:{port}/test" in text and ":pw@" not in text
    assert "\n" not in text and "start the PostgreSQL server" in text


# -- the server restarted mid-step (a server of the test's own) -------------------------------

# Six sub-steps; the fourth call waits, as a slow model call would, until the test
# has done to the server what it does, and tells it where it is through files.
MID_STEP = [
    "%load_ext nbdurable\nfrom nbdurable import step",
    "%%step calls\n"
    "import os, pathlib, time\n"
    "sync = pathlib.Path(os.environ['SYNC_DIR'])\n"
    "def call(i):\n"
    "    with open(sync / 'ledger', 'a') as f:\n"
    "        f.write(f'{i}\\n')  # every real call\n"
    "    if i == 3:\n"
    "        (sync / 'in-call').touch()\n"
    "        deadline = time.monotonic() + 120\n"
    "        while not (sync / 'go').exists():\n"
    "            assert time.monotonic() < deadline, 'the test never let the call return'\n"
    "            time.sleep(0.02)\n"
    "        (sync / 'go').unlink()  # returning now: the record is written next\n"
    "    return i * i\n"
    "squares = [step(f'c{i}', call, i) for i in range(6)]\n"
    "print(squares)",
]


def _wait_for(condition, what: str, kernel: Kernel) -> None:
    deadline = time.monotonic() + 120
    while not condition():
        assert kernel.km.is_alive(), f"the kernel died before it {what}"
        assert time.monotonic() < deadline, f"the kernel never {what}"
        time.sleep(0.02)


def _reply(kernel: Kernel, msg_id: str) -> tuple[str, str]:
    """Wait for the cell ``msg_id`` to finish: its status and what it printed."""
    out = []
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=180)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kernel.kc.get_shell_msg(timeout=60)
    assert reply["parent_header"]["msg_id"] == msg_id
    return reply["content"]["status"], "".join(out)


@pytest.mark.parametrize("fault", ["restarted", "down-while-recording"])
def test_a_server_restarted_mid_step_loses_nothing_and_repeats_nothing(fault, tmp_path, private_pg):
    """The server goes away while a call runs; the kernel reconnects and records it once.

    ``restarted``: a fast restart while the fourth call runs ends every session
    of the kernel (its pooled connections, its lease's); the record after the
    call finds its connection dead and reconnects. ``down-while-recording``:
    the server crashes (immediate stop) during the call and is started again
    only once the call has returned, while the kernel is recording it.
    """
    url = private_pg.url + "?namespace=team"
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {
        "NBDURABLE_STORE": url,
        "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb"),
        "SYNC_DIR": str(sync),
    }
    kernel = Kernel(tmp_path, env)
    try:
        assert kernel.run(MID_STEP[0])["status"] == "ok"
        msg_id = kernel.kc.execute(MID_STEP[1])
        _wait_for((sync / "in-call").exists, "reached the fourth call", kernel)
        if fault == "restarted":
            private_pg.restart()
            (sync / "go").touch()
        else:
            private_pg.stop("immediate")
            (sync / "go").touch()
            _wait_for(lambda: not (sync / "go").exists(), "returned from the call", kernel)
            private_pg.start()
        status, printed = _reply(kernel, msg_id)
    finally:
        kernel.close()
    assert (status, printed) == ("ok", "[0, 1, 4, 9, 16, 25]\n")
    assert (sync / "ledger").read_text().split() == ["0", "1", "2", "3", "4", "5"]
    rows = pg_sql(url, "SELECT count(*) FROM team.kv WHERE key LIKE 'r/%%/u/%%'")
    assert rows == [(6,)], "each sub-step recorded once"

    # A fresh kernel replays the step: no call is made again.
    again = run_notebook(make_notebook(MID_STEP), cwd=tmp_path, env=env)
    assert outputs_of(again, 1)[0]["text"] == "[0, 1, 4, 9, 16, 25]\n"
    assert (sync / "ledger").read_text().split() == ["0", "1", "2", "3", "4", "5"]


def test_the_magics_and_the_panel_on_the_team_store(tmp_path, pg_url):
    cells = [
        "%load_ext nbdurable",
        "%%step greet\nword = 'hi'",
        "%step pin greet",
        "%step list",
        "%step unpin greet",
        "%step panel",
        "%step clear greet",
        "%step list",
    ]
    nbformat.write(make_notebook(cells), tmp_path / "nb.ipynb")
    env = {"NBDURABLE_STORE": pg_url, "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb")}
    out = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    pinned = outputs_of(out, 3)[0]["text"]
    # The first line names the run and its store, then what replay saved so far.
    head = pinned.splitlines()[0]
    assert head == f"run 'nb.ipynb' in {display(pg_url)} — nothing replayed in this kernel yet"
    assert pinned.splitlines()[2].split()[1:3] == ["greet", "pinned"], pinned
    (panel,) = outputs_of(out, 5)
    assert panel["output_type"] == "display_data"
    assert panel["data"]["text/plain"].splitlines()[0] == (
        f"nbdurable run 'nb.ipynb' in {display(pg_url)}"
    )
    after = outputs_of(out, 7)[0]["text"].splitlines()
    assert after[2].split()[1:3] == ["greet", "pending"], after
    with open_store(pg_url) as store:
        assert store.scan("r/nb.ipynb/s/") == [], "cleared in the team store"


def test_configure_store_in_a_running_kernel_moves_the_run_and_its_lease(tmp_path, pg_url):
    """``configure(store=URL)`` after steps ran on the directory store: the run moves there.

    A URL whose server is down is refused at the configure line, in one line,
    and the kernel goes on recording where it was.
    """
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"postgresql://postgres@127.0.0.1:{sock.getsockname()[1]}/test"
    directory = tmp_path / "store"
    env = {
        "NBDURABLE_DIR": str(directory),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb"),
        "RUNS": str(tmp_path / "runs.log"),
        "JPY_SESSION_NAME": "",
    }
    count = "open(os.environ['RUNS'], 'a').write('{}\\n')"
    a = "%%step a\nimport os\n" + count.format("a") + "\nx = 1"
    b = "%%step b\n" + count.format("b") + "\ny = x + 1"
    k = Kernel(tmp_path, env)
    try:
        assert k.run("%load_ext nbdurable\nimport nbdurable, os")["status"] == "ok"
        assert k.run(a)["status"] == "ok"
        bad = k.run(f"nbdurable.configure(store={down!r})")
        assert bad["ename"] == "SettingError", bad
        # IPython's one-line UsageError display, no traceback.
        assert bad["stdout"].startswith("UsageError: store not changed: cannot reach"), bad
        assert bad["stdout"].count("\n") == 1 and down.split("//")[1] in bad["stdout"]
        assert k.run("print(nbdurable.configure().store)")["stdout"] == "None\n"

        assert k.run(f"nbdurable.configure(store={pg_url!r})")["status"] == "ok"
        moved = k.run(b)
        assert moved["status"] == "ok", moved
        (line,) = moved["stdout"].splitlines()
        assert line.startswith(f"nbdurable: run 'nb.ipynb' now records in {display(pg_url)} ")
        assert f"--from {directory} --to {display(pg_url)}" in line
        pid = k.pid
        again = k.run(b)  # replays from the team store: the body does not run
        assert again["status"] == "ok" and again["stdout"] == "", again
        with open_store(pg_url) as team, open_store(directory) as local:
            holder = lease.read(team, "nb.ipynb")
            assert holder is not None and holder.pid == pid, "the lease moved with the run"
            assert lease.read(local, "nb.ipynb") is None, "the old store's lease was given back"
            rk = RunKeys("nb.ipynb")
            assert team.has(rk.step("name:b")) and not team.has(rk.step("name:a"))
            assert local.has(rk.step("name:a")) and not local.has(rk.step("name:b"))
    finally:
        k.close()
    assert (tmp_path / "runs.log").read_text().split() == ["a", "b"], "each body ran once"


# -- a value above PostgreSQL's 1 GB limit on one field ---------------------------------------

BIG_ENV = "NBDURABLE_TEST_BIG"


def _record_and_replay(tmp_path, url: str, n: int) -> dict:
    """Record an ``n``-byte array in a real kernel, replay it in a fresh one; the figures.

    The array is random bytes from a fixed seed: the replaying kernel draws it
    again and compares it with what replay restored, byte for byte.
    """
    env = {
        "NBDURABLE_STORE": url,
        "NBDURABLE_DIR": str(tmp_path / "local"),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb"),
        "JPY_SESSION_NAME": "",
    }
    setup = "%load_ext nbdurable\nimport numpy as np, resource, time\nt0 = time.perf_counter()"
    body = (
        "%%step big\n"
        "body_started = time.perf_counter()\n"
        f"big = np.random.default_rng(7).integers(0, 256, size={n}, dtype=np.uint8)\n"
        "body_seconds = time.perf_counter() - body_started"
    )
    report = (
        "import json\n"
        "print(json.dumps({'seconds': time.perf_counter() - t0, 'body': body_seconds,\n"
        "  'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))"
    )
    figures = {}
    for attempt in ("record", "replay"):
        k = Kernel(tmp_path, env)
        try:
            assert k.run(setup)["status"] == "ok"
            done = k.run(body, timeout=1800)
            assert done["status"] == "ok", done
            figures[attempt] = json.loads(k.run(report)["stdout"])
            if attempt == "replay":
                same = k.run(
                    f"again = np.random.default_rng(7).integers(0, 256, size={n}, dtype=np.uint8)\n"
                    "print(big.nbytes, big.dtype, bool(np.array_equal(big, again)))",
                    timeout=600,
                )
                assert same["stdout"] == f"{n} uint8 True\n", same
        finally:
            k.close()
    # The replaying kernel did not run the body: it kept the recorded body time.
    assert figures["replay"]["body"] == figures["record"]["body"]
    return figures


@pytest.mark.skipif(
    os.environ.get(BIG_ENV) != "1",
    reason=f"records 1.1 GB (1-2 minutes, 3.5 GB of memory): set {BIG_ENV}=1 to run it",
)
def test_a_value_above_1_gb_records_and_replays_byte_for_byte(tmp_path, pg_url):
    n = 1_100_000_000  # above PostgreSQL's 1 GB per field: only chunk rows can hold it
    figures = _record_and_replay(tmp_path, pg_url, n)
    ns = namespace(pg_url)
    (row,) = pg_sql(pg_url, f"SELECT count(*), sum(length(data)) FROM {ns}.chunks")
    assert row[0] >= n // (8 * 1024 * 1024) and row[1] > n
    print(json.dumps(figures))


def test_a_value_of_many_chunks_records_and_replays_byte_for_byte(tmp_path, pg_url):
    """The path of the 1 GB test in the default run: 24 MB in 64 KB chunk rows."""
    url = pg_url + "&chunk_size=65536"
    n = 24_000_000
    _record_and_replay(tmp_path, url, n)
    (row,) = pg_sql(url, f"SELECT count(*), sum(length(data)) FROM {namespace(url)}.chunks")
    assert row[0] >= n // 65536 > 300 and row[1] > n


# -- a heartbeat that stalls past the expiry ---------------------------------------------------

# Machine A's heartbeat thread stalls (injected: each beat blocks, as one would on
# a hung connection or a stopped VM) while its step waits inside its fourth call;
# machine B takes the run over once A's lease has lapsed, and runs it to the end.
STALL = [
    "%load_ext nbdurable\n"
    "import os, pathlib, threading, time\n"
    "from nbdurable import step\n"
    "from nbdurable.durable import lease\n"
    "sync = pathlib.Path(os.environ['SYNC_DIR'])\n"
    "if os.environ['WHO'] == 'a':\n"
    "    never = threading.Event()\n"
    "    lease.Lease._beat = lambda self: never.wait()",
    # Told apart by process id: a name in the function's globals would change its
    # fingerprint, and B would rightly call again instead of replaying A's records.
    "%%step calls\n"
    "def call(i):\n"
    "    with open(sync / 'ledger', 'a') as f:\n"
    "        f.write(f'{os.getpid()} {i}\\n')  # every real call\n"
    "    hold = sync / 'hold'\n"
    "    if i == 3 and hold.exists() and hold.read_text() == str(os.getpid()):\n"
    "        (sync / 'in-call').touch()\n"
    "        deadline = time.monotonic() + 120\n"
    "        while hold.exists():\n"
    "            assert time.monotonic() < deadline, 'the test never let the call return'\n"
    "            time.sleep(0.02)\n"
    "    return os.getpid(), i * i\n"
    "squares = [step(f'c{i}', call, i) for i in range(6)]\n"
    "print([(1 if pid == os.getpid() else 0, n) for pid, n in squares])",
]


def test_a_holder_whose_heartbeat_stalled_past_expiry_stops_at_its_next_record(tmp_path, pg_url):
    sync = tmp_path / "sync"
    sync.mkdir()

    def machine(name: str) -> dict[str, str]:
        env = _machine(tmp_path, name, pg_url, WHO=name, SYNC_DIR=str(sync))
        env["NBDURABLE_NOTEBOOK"] = str(tmp_path / name / "stall.ipynb")
        nbformat.write(make_notebook(STALL), tmp_path / name / "stall.ipynb")
        return env

    a = Kernel(tmp_path / "a", machine("a"))
    try:
        assert a.run(STALL[0])["status"] == "ok"
        pid_a = a.pid
        (sync / "hold").write_text(str(pid_a))
        msg_id = a.kc.execute(STALL[1])
        _wait_for((sync / "in-call").exists, "reached its fourth call", a)
        # A is alive, but its lease lapses: no heartbeat for longer than the expiry.
        with open_store(pg_url) as store:
            deadline = time.monotonic() + 60
            while time.time() - lease.read(store, "stall.ipynb").heartbeat < EXPIRY + 0.5:
                assert time.monotonic() < deadline, "A's lease never lapsed"
                time.sleep(0.2)
        # B, a live kernel on machine B, takes the run over and runs the step to the end.
        b = Kernel(tmp_path / "b", machine("b"))
        try:
            assert b.run(STALL[0])["status"] == "ok"
            pid_b = b.pid
            done = b.run(STALL[1])
            # B replayed A's three calls and made the other three (1: made by B itself).
            assert done["stdout"] == "[(0, 0), (0, 1), (0, 4), (1, 9), (1, 16), (1, 25)]\n"
            (sync / "hold").unlink()  # A's fourth call returns; A records it next
            status, printed = _reply(a, msg_id)
        finally:
            b.close()
    finally:
        a.close()
    assert status == "error", printed
    (line,) = [x for x in printed.splitlines() if x.strip()]
    assert f"was taken over by process {pid_b} on host-b" in line, printed
    assert "this record was NOT written" in line and "%step takeover" in line
    # A's fourth call returned after B had recorded it, and was refused: each call
    # is recorded once, B's records are intact, A noted nothing in B's run.
    calls = [line.split() for line in (sync / "ledger").read_text().splitlines()]
    assert calls == [[str(pid_a), str(i)] for i in range(4)] + [
        [str(pid_b), str(i)] for i in range(3, 6)
    ]
    scope = "name:calls"
    rk = RunKeys("stall.ipynb")
    with open_store(pg_url) as store:
        got = [values.loads(store.get(rk.sub(scope, f"c{i}"))[1]) for i in range(6)]
        assert got == [(pid_a if i < 3 else pid_b, i * i) for i in range(6)]
        assert store.get(rk.step(scope))[0]["name"] == "calls", "B's step record is there"
        assert not store.has(rk.state(scope)), "A noted no failure in B's run"
