"""The durable engine runs steps with no IPython at all: a Host is all it needs.

A script host (``ScriptHost`` below: exec for a body, stdout for a capture)
drives ``Session`` and ``StepRunner`` through a step's record, its replay in
a new session (a "restart"), an input change and sub-steps, in a fresh
Python process that never imports IPython, ipykernel or ipywidgets. What the
kernel adds (cell ids, display hooks, ipykernel's streams) is tested with real
kernels elsewhere; what is the engine's alone is tested here, in seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from kernel_util import REPO_ROOT

SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from nbdurable.durable import session as sessions
    from nbdurable.store import open_store


    class Capture:
        def __init__(self):
            self.outputs, self.unfaithful, self._buf = [], [], io.StringIO()
            self._redirect = contextlib.redirect_stdout(self._buf)

        def __enter__(self):
            self._redirect.__enter__()
            return self

        def __exit__(self, *exc):
            self._redirect.__exit__(*exc)
            if self._buf.getvalue():
                self.outputs.append(
                    {"output_type": "stream", "name": "stdout", "text": self._buf.getvalue()}
                )


    class ScriptHost:
        def __init__(self, ns):
            self.user_ns, self.shown = ns, []

        def hidden(self):
            return {}

        def transform(self, body):
            return body

        def run_body(self, py, has_await):
            exec(compile(py, "<step>", "exec"), self.user_ns)

        def capture(self):
            return Capture()

        def show(self, outputs):
            self.shown.extend(o.get("text", "") for o in outputs)

        def publish(self, data, metadata):
            self.shown.append("note: " + data["text/plain"])

        def executed(self):
            return []

        def frontend_cell(self):
            return None, None

        def describe(self):
            return "script"


    LOG = "calls.log"

    def ask(q):
        with open(LOG, "a") as f:  # a real call: logged where no fingerprint looks
            f.write(q + "\\n")
        return q.upper()

    BODY = "answer = step('ask', ask, topic)\\nprint('answered', answer)"


    def run(store_dir, topic):
        # A new session each time: what a kernel restart gives.
        sessions.reset_session()
        ns = {"ask": ask, "topic": topic}
        from nbdurable import step
        ns["step"] = step
        host = ScriptHost(ns)
        session = sessions.get_session(host)
        session.set_store(open_store(store_dir), "script-run")
        session.steps.run_step(BODY, name="research")
        state = session.status["name:research"][0]
        return {"answer": ns["answer"], "shown": host.shown, "state": state}


    store_dir = sys.argv[1]
    first = run(store_dir, "durability")
    again = run(store_dir, "durability")
    edited = run(store_dir, "replay")
    shell = sorted(m for m in sys.modules if m.split(".")[0] in ("IPython", "ipykernel"))
    shell += sorted(m for m in sys.modules if m.split(".")[0] == "ipywidgets")
    calls = open(LOG).read().split()
    print(json.dumps(dict(first=first, again=again, edited=edited, calls=calls, shell=shell)))
    """
)


def test_a_step_records_replays_and_reruns_without_ipython(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "NBDURABLE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["shell"] == [], "the engine imported the shell side"
    assert got["first"]["state"] == "recorded" and got["first"]["answer"] == "DURABILITY"
    # Replayed in a new session: the body did not run, its output was shown again.
    assert got["again"]["state"] == "replayed" and got["again"]["answer"] == "DURABILITY"
    assert got["again"]["shown"][0] == "answered DURABILITY\n"
    assert any(
        s.startswith("note: ↻ nbdurable: replayed step 'research'") for s in got["again"]["shown"]
    )
    # An input changed: the body ran again and its new call was made; nothing else repeated.
    assert got["edited"]["state"] == "recorded" and got["edited"]["answer"] == "REPLAY"
    assert got["calls"] == ["durability", "replay"]
