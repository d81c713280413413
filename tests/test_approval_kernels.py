"""Approvals in real kernels and through the CLI: the email agent of docs/approvals.md.

A local mail server (a thread of this process) counts every message it is
asked to send: each approved email must arrive exactly once, across kernel
deaths, restarts and reruns. Headless runs are the real ``nbdurable run``
(exit 7 at a pending approval); decisions are the real ``nbdurable approve``
/ ``reject``, from the same directory or, through PostgreSQL, from another
"machine" (its own project directory and ``NBDURABLE_HOST``). The widget's
Approve button is clicked as a frontend clicks it: a ``comm_msg`` with the
button's click event, sent on the kernel's shell channel while the cell
still runs.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager
from kernel_util import REPO_ROOT, kernel_name, private_sockets
from test_run_exits import nbd, write

from nbdurable import approvals
from nbdurable.store import open_store

pytestmark = pytest.mark.kernel

SETUP = """\
%load_ext nbdurable
import json, os, urllib.request
from nbdurable import approve, step

def draft(to):  # the agent's model call, recorded as a sub-step
    return f"Dear {to}, the quarterly report is attached."

def send(to, body):  # the effect: one POST to the mail server
    req = urllib.request.Request(
        os.environ["MAIL_URL"], data=json.dumps({"to": to, "body": body}).encode(), method="POST"
    )
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())["id"]"""

EMAIL = """\
%%step email
to = os.environ.get("MAIL_TO", "bob@example.com")
body = step("draft", draft, to)
if approve("send", f"Send the draft to {to}", body):
    if os.environ.get("DIE_AFTER_APPROVAL") and not os.path.exists("died"):
        open("died", "w").close()
        os._exit(1)  # the kernel dies between the decision and the send
    receipt = step("send", send, to, body)
else:
    receipt = None
print("receipt:", receipt)"""


class MailServer:
    """Counts every message it is asked to send (``sent``: the recipients, in order)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.sent.append(body["to"])
                reply = json.dumps({"id": f"msg-{len(outer.sent)}"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/send"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def mail():
    server = MailServer()
    yield server
    server.close()


@pytest.fixture(scope="module", autouse=True)
def _kernel_spec() -> None:
    kernel_name()


def _run(nb: Path, mail: MailServer, *args: str, **env: str):
    return nbd("run", nb, *args, MAIL_URL=mail.url, **env)


# -- headless: exit 7, the CLI decides, the next run resumes -----------------------------------


def test_headless_stops_at_the_approval_and_resumes_once_approved(tmp_path, mail):
    nb = write(tmp_path / "nb.ipynb", [SETUP, EMAIL])
    r = _run(nb, mail)
    assert r.returncode == 7, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("nbdurable run: stopped at approval 'send' of step 'email'"), last
    assert "Send the draft to bob@example.com" in last
    assert f"nbdurable approve {nb} send" in last, last
    assert mail.sent == []
    # Waiting, not failed: the views name the approval and how to decide it.
    state = nbd("status", nb).stdout
    assert "waiting" in state and "ApprovalPending" not in state, state
    assert "approval 'send' of step 'email' waits for a decision" in state, state
    (email,) = [s for s in json.loads(nbd("status", nb, "--json").stdout)["steps"]]
    assert email["state"] == "waiting" and f"nbdurable approve {nb.name} send" in email["detail"]

    listed = nbd("approvals", nb)
    assert listed.returncode == 0, listed.stderr
    assert "send  (email, asked " in listed.stdout
    assert "Dear bob@example.com, the quarterly report" in listed.stdout

    done = nbd("approve", nb, "send", NBDURABLE_HOST="review-desk")
    assert done.returncode == 0, done.stderr
    assert "approval 'send' of step 'email': approved by " in done.stdout
    assert "@review-desk" in done.stdout
    assert "no approval" in nbd("approvals", nb).stdout
    (email,) = [s for s in json.loads(nbd("status", nb, "--json").stdout)["steps"]]
    assert (email["state"], email["detail"]) == (
        "pending", "its approval was decided: the next run goes on from the decision",
    )  # fmt: skip

    # Resumed; the kernel dies after the decision and before the send: the retry
    # replays the draft and the decision, and sends once.
    r = _run(nb, mail, "--json", DIE_AFTER_APPROVAL="1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [a["outcome"] for a in json.loads(r.stdout)["attempts"]] == [
        "kernel died",
        "completed",
    ]
    assert mail.sent == ["bob@example.com"]

    # Every later run replays: nothing is asked, nothing sent again.
    r = _run(nb, mail)
    assert r.returncode == 0, r.stdout + r.stderr
    assert mail.sent == ["bob@example.com"]


def test_a_rejection_from_the_cli_sends_nothing(tmp_path, mail):
    nb = write(tmp_path / "nb.ipynb", [SETUP, EMAIL])
    stopped = _run(nb, mail, "--json")
    assert stopped.returncode == 7, stopped.stdout + stopped.stderr
    summary = json.loads(stopped.stdout)
    assert summary["status"] == "pending approval" and summary["steps"]["waiting"] == 1
    (cell,) = summary["attempts"][-1]["cells"]
    assert (cell["label"], cell["outcome"]) == ("email", "waiting")
    assert cell["detail"].startswith("approval 'send' of step 'email' is waiting")
    assert [a["id"] for a in summary["approvals"]] == ["send"]
    done = nbd("reject", nb, "send", "--reason", "wrong quarter")
    assert done.returncode == 0 and "rejected by " in done.stdout and "wrong quarter" in done.stdout
    r = _run(nb, mail)
    assert r.returncode == 0, r.stdout + r.stderr
    assert mail.sent == []
    # Deciding again is refused, naming the decision that stands.
    again = nbd("approve", nb, "send")
    assert again.returncode == 2, again.stderr
    assert "approval 'send' was already rejected by " in again.stderr, again.stderr
    unknown = nbd("approve", nb, "sned")
    assert unknown.returncode == 2 and "no pending approval 'sned'" in unknown.stderr


def test_another_recipient_asks_again_and_says_why(tmp_path, mail):
    nb = write(tmp_path / "nb.ipynb", [SETUP, EMAIL])
    assert _run(nb, mail).returncode == 7
    assert nbd("approve", nb, "send").returncode == 0
    assert _run(nb, mail).returncode == 0
    assert mail.sent == ["bob@example.com"]

    r = _run(nb, mail, MAIL_TO="eve@example.com")
    assert r.returncode == 7, r.stdout + r.stderr
    assert "Send the draft to eve@example.com" in r.stderr
    listed = nbd("approvals", nb).stdout
    assert "asked again: its summary, its details changed since it was approved by" in listed
    assert mail.sent == ["bob@example.com"]  # the old decision sent nothing to eve


# -- PostgreSQL: a second machine approves --------------------------------------------------


@pytest.mark.postgres
def test_a_second_machine_approves_through_postgres_and_the_first_resumes(tmp_path, pg_url, mail):
    key = {"NBDURABLE_KEY": os.environ["NBDURABLE_KEY"]}
    machines = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        machines[name] = write(tmp_path / name / "nb.ipynb", [SETUP, EMAIL])
    r = _run(machines["a"], mail, "--store", pg_url, NBDURABLE_HOST="host-a", **key)
    assert r.returncode == 7, r.stdout + r.stderr
    assert "--store 'postgresql://postgres@" in r.stderr  # quoted for a shell

    listed = nbd("approvals", machines["b"], "--store", pg_url, **key)
    assert "Send the draft to bob@example.com" in listed.stdout, listed.stdout + listed.stderr
    done = nbd("approve", machines["b"], "send", "--store", pg_url, NBDURABLE_HOST="host-b", **key)
    assert done.returncode == 0 and "@host-b" in done.stdout, done.stdout + done.stderr

    r = _run(machines["a"], mail, "--store", pg_url, NBDURABLE_HOST="host-a", **key)
    assert r.returncode == 0, r.stdout + r.stderr
    assert mail.sent == ["bob@example.com"]
    with open_store(pg_url) as store:
        from nbdurable.identity.locate import run_id_for

        run = run_id_for(machines["a"], tmp_path / "a" / ".nbdurable")
        d = approvals.read_decision(store, approvals.RunKeys(run), "name:email", "send")
    assert d is not None and d.approved and d.by.endswith("@host-b")


# -- a kernel waiting: restart, the widget's button, the CLI --------------------------------


class Waiting:
    """A kernel of a notebook tab: cells sent without blocking, iopub read as it comes."""

    def __init__(self, tmp_path: Path, mail: MailServer) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NBDURABLE_", "JPY_"))}
        env.update(
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
            NBDURABLE_NOTEBOOK=str(tmp_path / "nb.ipynb"),
            MAIL_URL=mail.url,
            JPY_SESSION_NAME="",
        )
        self._sockets = private_sockets()
        self.km = KernelManager(kernel_name=kernel_name(), **self._sockets.__enter__())
        self.km.start_kernel(env=env, cwd=str(tmp_path))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.buttons: dict[str, str] = {}  # description -> comm id
        self.text: list[str] = []
        self.shown: list[str] = []  # the HTML widgets' values, as they came

    def execute(self, code: str) -> str:
        return self.kc.execute(code)

    def read(self, until: Any, timeout: float = 60) -> None:
        """Read iopub until ``until()`` holds (widgets and text noted on the way)."""
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; printed so far: {''.join(self.text)!r}"
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 1))
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                self.text.append(content["text"])
            elif kind in ("comm_open", "comm_msg"):
                state = (content.get("data") or {}).get("state") or {}
                if state.get("_model_name") == "ButtonModel":
                    self.buttons[state.get("description", "")] = content["comm_id"]
                if isinstance(state.get("value"), str):
                    self.shown.append(state["value"])
            elif kind == "status" and content["execution_state"] == "idle":
                self.idle.add(msg["parent_header"].get("msg_id"))

    idle: set = set()

    def done(self, msg_id: str) -> bool:
        return msg_id in self.idle

    def click(self, description: str) -> None:
        """Click a button as a frontend does: its click event, on the shell channel."""
        content = {
            "comm_id": self.buttons[description],
            "data": {"method": "custom", "content": {"event": "click"}},
        }
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", content))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self._sockets.__exit__(None, None, None)


def reply_to(k: Waiting, msg_id: str) -> dict[str, Any]:
    """The shell reply to request ``msg_id`` (replies to earlier requests are passed over)."""
    reply = k.kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = k.kc.get_shell_msg(timeout=30)
    return reply


def _pending(tmp_path: Path) -> list[approvals.Pending]:
    if not (tmp_path / ".nbdurable").exists():
        return []
    with open_store(tmp_path / ".nbdurable") as store:
        from nbdurable.identity.locate import run_id_for

        return approvals.pending(store, run_id_for(tmp_path / "nb.ipynb", tmp_path / ".nbdurable"))


def test_a_restarted_kernel_shows_the_same_approval_and_the_button_decides(tmp_path, mail):
    write(tmp_path / "nb.ipynb", [SETUP, EMAIL])
    first = Waiting(tmp_path, mail)
    first.idle = set()
    try:
        setup = first.execute(SETUP)
        first.read(lambda: first.done(setup))
        first.execute(EMAIL)
        first.read(lambda: "Approve" in first.buttons and _pending(tmp_path))
        (asked,) = _pending(tmp_path)
    finally:
        first.close()  # the kernel restarts while the approval waits
    assert mail.sent == []

    second = Waiting(tmp_path, mail)
    second.idle = set()
    try:
        setup = second.execute(SETUP)
        second.read(lambda: second.done(setup))
        cell = second.execute(EMAIL)
        second.read(lambda: "Approve" in second.buttons)
        assert _pending(tmp_path) == [asked]  # the same question, asked when it was first
        # The next cell is sent while the approval waits (Run All): it runs after it.
        after = second.execute("print('next cell', receipt)")
        second.click("Approve")
        second.read(lambda: second.done(cell) and second.done(after))
        printed = "".join(second.text)
        assert "receipt: msg-1" in printed and "next cell msg-1" in printed, printed
        assert printed.index("receipt: msg-1") < printed.index("next cell msg-1")
        assert any("approved by " in v for v in second.shown), second.shown
    finally:
        second.close()
    assert mail.sent == ["bob@example.com"]
    assert _pending(tmp_path) == []


def test_a_decision_from_the_cli_ends_a_kernel_s_wait(tmp_path, mail):
    nb = write(tmp_path / "nb.ipynb", [SETUP, EMAIL])
    k = Waiting(tmp_path, mail)
    k.idle = set()
    try:
        setup = k.execute(SETUP)
        k.read(lambda: k.done(setup))
        cell = k.execute(EMAIL)
        k.read(lambda: bool(_pending(tmp_path)))
        # The kernel is busy, but not computing: its step is waiting.
        (email,) = [s for s in json.loads(nbd("status", nb, "--json").stdout)["steps"]]
        assert email["state"] == "waiting", email
        # One runner: the waiting kernel holds the run; a headless run is refused.
        second = nbd("run", nb, MAIL_URL=mail.url)
        assert second.returncode == 4, second.stdout + second.stderr
        done = nbd("reject", nb, "send", "--reason", "not today")
        assert done.returncode == 0, done.stderr
        k.read(lambda: k.done(cell))
        assert "receipt: None" in "".join(k.text)
        assert any("rejected by " in v and "not today" in v for v in k.shown), k.shown
    finally:
        k.close()
    assert mail.sent == []


def test_an_interrupt_while_waiting_leaves_the_approval_pending_and_the_kernel_usable(
    tmp_path, mail
):
    write(tmp_path / "nb.ipynb", [SETUP, EMAIL])
    k = Waiting(tmp_path, mail)
    k.idle = set()
    try:
        setup = k.execute(SETUP)
        k.read(lambda: k.done(setup))
        cell = k.execute(EMAIL)
        k.read(lambda: "Approve" in k.buttons and bool(_pending(tmp_path)))
        after = k.execute("print('still here')")  # queued behind the waiting cell
        k.km.interrupt_kernel()
        k.read(lambda: k.done(cell))
        reply = reply_to(k, cell)
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        # ipykernel aborts what was queued behind an interrupted cell; what comes next runs.
        k.read(lambda: k.done(after))
        # ipykernel 6 ends that abort on its event loop some moments after the aborted
        # replies (stop_on_error_timeout), so a cell sent at once may be aborted too:
        # sent again until it runs (ipykernel 7 runs the first).
        for _attempt in range(20):
            later = k.execute("print('still here')")
            k.read(lambda later=later: k.done(later))
            status = reply_to(k, later)["content"]["status"]
            if status != "aborted":
                break
            time.sleep(0.1)
        assert status == "ok" and "still here" in "".join(k.text), (status, k.text)
    finally:
        k.close()
    assert [p.id for p in _pending(tmp_path)] == ["send"]
    assert mail.sent == []
