"""One runner per run: two real kernels on the same run never both execute a step.

Kernel A is a long-lived kernel driven through jupyter_client (like an open
browser tab); kernel B runs the same notebook through nbclient (like
``nbdurable run`` started beside it).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest
from jupyter_client.manager import KernelManager
from kernel_util import REPO_ROOT, kernel_name, make_notebook, private_sockets, run_notebook
from nbclient.exceptions import CellExecutionError

from nbdurable.durable import lease
from nbdurable.store import open_store

pytestmark = pytest.mark.kernel

SETUP = (
    "%load_ext nbdurable\n"
    "import os, time\n"
    "from nbdurable import step\n"
    "def tick(i):\n"
    "    with open(os.environ['TICKS'], 'a') as f:\n"
    "        f.write(f'{os.getpid()} {i}\\n')\n"
    "    time.sleep(float(os.environ.get('TICK_SLEEP', '0')))\n"
    "    return i"
)
STEP = "%%step work\ndone = [step(f'tick:{i}', tick, i) for i in range(N)]\nprint(len(done))"


def _env(tmp_path, **extra):
    return {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "shared.ipynb"),
        "TICKS": str(tmp_path / "ticks.log"),
        **extra,
    }


class Kernel:
    """A kernel kept open between calls, as a notebook tab keeps its kernel."""

    def __init__(self, tmp_path, env):
        full = dict(os.environ)
        full.update(env)
        full["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), full.get("PYTHONPATH", "")) if p
        )
        self._sockets = private_sockets()
        self.km = KernelManager(kernel_name=kernel_name(), **self._sockets.__enter__())
        self.km.start_kernel(env=full, cwd=str(tmp_path))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 60) -> dict:
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        content = reply["content"]
        return {
            "status": content["status"],
            "ename": content.get("ename"),
            "evalue": content.get("evalue", ""),
            "stdout": "".join(out),
        }

    @property
    def pid(self) -> int:
        return int(self.run("print(os.getpid())")["stdout"])

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._sockets.__exit__(None, None, None)


def _ticks(tmp_path) -> list[tuple[int, int]]:
    path = tmp_path / "ticks.log"
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def _error_of(exc: CellExecutionError) -> str:
    return f"{exc.ename}: {exc.evalue}"


def test_second_kernel_is_refused_while_the_first_holds_the_run(tmp_path):
    a = Kernel(tmp_path, _env(tmp_path))
    try:
        assert a.run(SETUP + "\nN = 3")["status"] == "ok"
        first = a.run(STEP)
        assert first["status"] == "ok", first
        pid_a = a.pid

        # B is refused before it executes anything, with the holder named.
        nb = make_notebook([SETUP + "\nN = 5", STEP])
        with pytest.raises(CellExecutionError) as info:
            run_notebook(nb, cwd=tmp_path, env=_env(tmp_path))
        message = _error_of(info.value)
        assert info.value.ename == "UsageError", message
        assert f"process {pid_a} on {socket.gethostname()}" in message
        assert "%step takeover" in message
        assert "\n" not in info.value.evalue
        assert {pid for pid, _ in _ticks(tmp_path)} == {pid_a}, "B must not have run a call"

        # An explicit takeover from a third kernel wins; A then stops recording.
        c = make_notebook([SETUP + "\nN = 4", "%step takeover", STEP])
        done = run_notebook(c, cwd=tmp_path, env=_env(tmp_path))
        took = "".join(o.get("text", "") for o in done.cells[1].outputs)
        assert f"from process {pid_a}" in took
        again = a.run("%%step other\nx = step('x', tick, 99)")
        assert again["status"] == "error" and again["ename"] == "UsageError", again
        assert "was taken over by" in again["evalue"]
        assert 99 not in [i for _, i in _ticks(tmp_path)], "A must not run after losing the run"
    finally:
        a.close()


def test_a_dead_holder_is_taken_over_automatically(tmp_path):
    a = Kernel(tmp_path, _env(tmp_path, TICK_SLEEP="0.2"))
    try:
        assert a.run(SETUP + "\nN = 30")["status"] == "ok"
        pid_a = a.pid
        # Kill A for real in the middle of its step, from outside.
        threading.Timer(1.5, os.kill, (pid_a, signal.SIGKILL)).start()
        with pytest.raises(TimeoutError):  # the kernel dies under the request
            a.run(STEP, timeout=4)
        deadline = time.monotonic() + 10
        while a.km.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not a.km.is_alive()
    finally:
        a.close()
    ticks_a = [i for pid, i in _ticks(tmp_path) if pid == pid_a]
    assert 0 < len(ticks_a) < 30
    with open_store(tmp_path / "store") as store:
        holder = lease.read(store, "shared.ipynb")
    assert holder is not None and holder.pid == pid_a, "the dead kernel still holds the lease"

    nb = make_notebook([SETUP + "\nN = 30", STEP])
    done = run_notebook(nb, cwd=tmp_path, env=_env(tmp_path))
    assert "30" in "".join(o.get("text", "") for o in done.cells[1].outputs)
    ticks = _ticks(tmp_path)
    again = [i for pid, i in ticks if pid != pid_a]
    recorded_by_a = set(ticks_a[:-1])  # A's last tick may have died before its record
    assert not recorded_by_a & set(again), "a call recorded by the dead kernel ran again"
    assert sorted(set(ticks_a) | set(again)) == list(range(30))


def test_clear_all_in_the_holding_kernel_keeps_it_recording(tmp_path):
    """``%step clear --all`` forgets the records, not who records: the same kernel runs
    the step again and records it (the lease was deleted with the records, and the
    next record was refused as if another process had taken the run over)."""
    a = Kernel(tmp_path, _env(tmp_path))
    try:
        assert a.run(SETUP + "\nN = 2")["status"] == "ok"
        assert a.run(STEP)["status"] == "ok"
        cleared = a.run("%step clear --all")
        assert cleared["status"] == "ok" and "cleared run" in cleared["stdout"], cleared
        again = a.run(STEP)
        assert again["status"] == "ok", again
        listed = a.run("%step list")["stdout"]
        assert "work" in listed and "recorded" in listed, listed
        replay = a.run(STEP)
        assert replay["status"] == "ok", replay
        pid = a.pid
        assert [i for p, i in _ticks(tmp_path) if p == pid] == [0, 1, 0, 1], (
            "the step ran twice (before and after the clear), then replayed"
        )
    finally:
        a.close()
