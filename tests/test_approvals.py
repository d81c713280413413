"""approve() and @recorded(approve=True) on the engine, without a kernel, on both engines.

A host that answers (or records that it was asked) stands in for the
widget; the CLI's side is :func:`nbdurable.commands.decide`, called as
``nbdurable approve`` calls it. Real kernels and the CLI are in
tests/test_approval_kernels.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from nbdurable import approvals, commands
from nbdurable.durable import session as engine
from nbdurable.durable.approval import HEADLESS_ENV, approve
from nbdurable.durable.context import StepContext
from nbdurable.durable.host import PlainHost
from nbdurable.durable.substeps import recorded
from nbdurable.errors import ApprovalPending, NbdurableWarning, Rejected, UsageProblem

RUN = "nb.ipynb"


class AnsweringHost(PlainHost):
    """Decides every approval it is asked as told, and counts what it was asked."""

    def __init__(self, approved: bool = True, reason: str = "") -> None:
        super().__init__()
        self.approved, self.reason = approved, reason
        self.asked: list[approvals.Pending] = []

    def wait_approval(self, pending, elsewhere, decide):  # noqa: D102
        self.asked.append(pending)
        return decide(self.approved, self.reason)


def _session(store, monkeypatch, host=None, step="name:mail"):
    """A fresh session on ``store`` (as a kernel restart gives), inside step ``step``."""
    monkeypatch.setattr(engine, "_session", None)
    session = engine.get_session(host or PlainHost())
    session.set_store(store, RUN)
    if step:
        session.current = StepContext(step, step.removeprefix("name:"))
    return session


def test_a_decision_is_recorded_and_replayed_never_asked_again(any_store, monkeypatch):
    host = AnsweringHost()
    _session(any_store, monkeypatch, host)
    assert approve("send", "Send the draft to bob@example.com", {"body": "Hi"}) is True
    assert [p.id for p in host.asked] == ["send"]
    assert approvals.pending(any_store, RUN) == []  # decided: nothing waits
    again = AnsweringHost(approved=False)  # would reject: it must not be asked
    _session(any_store, monkeypatch, again)
    assert approve("send", "Send the draft to bob@example.com", {"body": "Hi"}) is True
    assert again.asked == []
    d = approvals.read_decision(any_store, engine.get_session().keys, "name:mail", "send")
    assert d is not None and d.approved and d.by == approvals.decider() and d.at > 0


def test_who_decides_names_nbdurable_host(store, monkeypatch):
    monkeypatch.setenv("NBDURABLE_HOST", "laptop-of-ann")
    _session(store, monkeypatch, AnsweringHost())
    approve("send", "Send it")
    d = approvals.read_decision(store, engine.get_session().keys, "name:mail", "send")
    assert d.by.endswith("@laptop-of-ann")


def test_a_rejection_returns_false_or_raises_rejected(store, monkeypatch):
    _session(store, monkeypatch, AnsweringHost(approved=False, reason="wrong recipient"))
    assert approve("send", "Send it") is False
    _session(store, monkeypatch, AnsweringHost())  # a rerun: the rejection replays
    with pytest.raises(Rejected, match="rejected by .*wrong recipient") as err:
        approve("send", "Send it", raises=True)
    assert err.value.approval == "send" and err.value.reason == "wrong recipient"


def test_headless_stops_with_the_approval_pending_and_the_cli_decides(any_store, monkeypatch):
    monkeypatch.setenv(HEADLESS_ENV, "1")
    _session(any_store, monkeypatch)
    with pytest.raises(ApprovalPending, match=r"approval 'send' of step 'mail' is waiting") as e:
        approve("send", "Send the draft to bob@example.com", "Hello Bob")
    assert "nbdurable approve" in str(e.value) and "send" in str(e.value)
    (p,) = approvals.pending(any_store, RUN)
    assert (p.id, p.step, p.summary, p.details) == (
        "send", "mail", "Send the draft to bob@example.com", "Hello Bob",
    )  # fmt: skip
    # A restart reaching it again: the same pending approval, as it was asked.
    _session(any_store, monkeypatch)
    with pytest.raises(ApprovalPending):
        approve("send", "Send the draft to bob@example.com", "Hello Bob")
    (again,) = approvals.pending(any_store, RUN)
    assert again == p
    done = commands.decide(any_store, RUN, "send", True, by="bob@other-host")
    assert "approved by bob@other-host" in done.message
    assert approvals.pending(any_store, RUN) == []
    _session(any_store, monkeypatch)
    assert approve("send", "Send the draft to bob@example.com", "Hello Bob") is True


def test_a_decision_made_elsewhere_ends_the_wait(store, monkeypatch):
    _session(store, monkeypatch)  # PlainHost: waits on the store alone

    def cli() -> None:
        deadline = time.monotonic() + 30
        while not approvals.pending(store, RUN) and time.monotonic() < deadline:
            time.sleep(0.05)
        commands.decide(store, RUN, "mail/send", False, "not today", by="ann@desk")

    t = threading.Thread(target=cli)
    t.start()
    try:
        assert approve("send", "Send it") is False
    finally:
        t.join()


def test_changed_details_ask_again_and_say_why(store, monkeypatch):
    _session(store, monkeypatch, AnsweringHost())
    approve("send", "Send the draft", {"to": "bob@example.com"})
    host = AnsweringHost(approved=False)
    _session(store, monkeypatch, host)
    with pytest.warns(NbdurableWarning, match=r"approval 'send' of step 'mail': asking again: "
                      r"its details changed since it was approved by "):  # fmt: skip
        assert approve("send", "Send the draft", {"to": "eve@example.com"}) is False
    assert len(host.asked) == 1 and "its details changed" in host.asked[0].again


def test_clearing_the_step_asks_again(store, monkeypatch):
    _session(store, monkeypatch, AnsweringHost())
    approve("send", "Send it")
    commands.clear(store, RUN, ["name:mail"])
    host = AnsweringHost(approved=False)
    _session(store, monkeypatch, host)
    assert approve("send", "Send it") is False and len(host.asked) == 1


def test_clearing_the_step_forgets_a_pending_approval(store, monkeypatch):
    monkeypatch.setenv(HEADLESS_ENV, "1")
    _session(store, monkeypatch)
    with pytest.raises(ApprovalPending):
        approve("send", "Send it")
    commands.clear(store, RUN, ["name:mail"])
    assert approvals.pending(store, RUN) == []


def test_details_are_redacted_like_every_record(store, monkeypatch):
    monkeypatch.setenv("MAIL_TOKEN", "s3cr3t-token-value-123")
    monkeypatch.setenv(HEADLESS_ENV, "1")
    _session(store, monkeypatch)
    with pytest.raises(ApprovalPending):
        approve("send", "Send it", "auth: s3cr3t-token-value-123")
    (p,) = approvals.pending(store, RUN)
    assert "s3cr3t" not in p.details and "[redacted $MAIL_TOKEN]" in p.details


def test_cli_names_unknown_and_ambiguous_approvals(store, monkeypatch):
    monkeypatch.setenv(HEADLESS_ENV, "1")
    for step in ("name:a", "name:b"):
        _session(store, monkeypatch, step=step)
        with pytest.raises(ApprovalPending):
            approve("send", "Send it")
    with pytest.raises(UsageProblem, match="2 pending approvals are named 'send'.*a/send"):
        commands.decide(store, RUN, "send", True)
    with pytest.raises(UsageProblem, match="no pending approval 'nope'"):
        commands.decide(store, RUN, "nope", True)
    commands.decide(store, RUN, "b/send", True)
    assert [p.step for p in approvals.pending(store, RUN)] == ["a"]


# -- @recorded(approve=True) ------------------------------------------------------------

SENT: list[str] = []


@recorded(approve=True)
def send_mail(to: str, body: str) -> str:
    SENT.append(to)
    return f"sent to {to}"


def test_recorded_approve_calls_once_approved_and_replays(store, monkeypatch):
    SENT.clear()
    host = AnsweringHost()
    _session(store, monkeypatch, host)
    assert send_mail("bob@example.com", "Hi") == "sent to bob@example.com"
    assert SENT == ["bob@example.com"] and len(host.asked) == 1
    assert "send_mail('bob@example.com', 'Hi')" in host.asked[0].summary
    host = AnsweringHost()
    _session(store, monkeypatch, host)
    assert send_mail("bob@example.com", "Hi") == "sent to bob@example.com"
    assert SENT == ["bob@example.com"] and host.asked == []  # replayed, never asked


def test_recorded_approve_rejected_calls_nothing(store, monkeypatch):
    SENT.clear()
    _session(store, monkeypatch, AnsweringHost(approved=False))
    with pytest.raises(Rejected):
        send_mail("bob@example.com", "Hi")
    assert SENT == []


def test_recorded_approve_with_another_recipient_asks_again(store, monkeypatch):
    SENT.clear()
    _session(store, monkeypatch, AnsweringHost(approved=False))
    with pytest.raises(Rejected):
        send_mail("bob@example.com", "Hi")
    host = AnsweringHost()
    _session(store, monkeypatch, host)
    with pytest.warns(NbdurableWarning, match=r"asking again: argument 0 changed since it was "
                      r"rejected by"):  # fmt: skip
        send_mail("eve@example.com", "Hi")
    assert SENT == ["eve@example.com"]


def test_each_approval_of_a_step_needs_its_own_id(store, monkeypatch):
    _session(store, monkeypatch, AnsweringHost())
    approve("send", "Send to bob", "Hi Bob")
    with pytest.raises(UsageProblem, match="approval 'send' of step 'mail' was already asked"):
        approve("send", "Send to eve", "Hi Eve")  # would overwrite bob's decision
    assert approve("send:eve", "Send to eve", "Hi Eve") is True


def test_an_approval_that_stopped_the_run_may_be_asked_again_in_the_step(store, monkeypatch):
    monkeypatch.setenv(HEADLESS_ENV, "1")
    session = _session(store, monkeypatch)
    for _ in range(2):  # a retry loop around approve() in one step
        with pytest.raises(ApprovalPending):
            approve("send", "Send it")
    commands.decide(store, RUN, "send", True)
    assert session.current is not None and approve("send", "Send it") is True


def test_approval_ids_are_reserved_for_decisions():
    from nbdurable.identity.keys import validate_sub_id

    with pytest.raises(UsageProblem, match="kept for the decisions of approve"):
        validate_sub_id("approval:send")


def test_a_question_cleared_while_a_kernel_waits_is_asked_again(store, monkeypatch):
    _session(store, monkeypatch)  # PlainHost: waits on the store alone
    asked_again = []

    def elsewhere() -> None:
        deadline = time.monotonic() + 30
        while not approvals.pending(store, RUN) and time.monotonic() < deadline:
            time.sleep(0.05)
        (question,) = approvals.pending(store, RUN)
        commands.clear(store, RUN, ["name:mail"])  # the question is gone, undecided
        deadline = time.monotonic() + 10
        while not approvals.pending(store, RUN) and time.monotonic() < deadline:
            time.sleep(0.05)  # asked again by the waiting session
        asked_again.append(approvals.pending(store, RUN) == [question])
        # Decided even if it was not asked again, so that the wait ends either way.
        puts, deletes, _ = approvals.decided(question, True, "ann@desk")
        store.apply(puts=puts, deletes=deletes)

    t = threading.Thread(target=elsewhere)
    t.start()
    try:
        assert approve("send", "Send it") is True
    finally:
        t.join()
    assert asked_again == [True]


def test_an_interrupt_while_the_wait_handles_a_message_comes_after_it():
    """A SIGINT while the wait reads the shell socket waits until the message is kept."""
    import os
    import signal

    from nbdurable.ipython.approvalview import _interrupt_deferred

    kept = []
    with pytest.raises(KeyboardInterrupt):
        with _interrupt_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # Python runs the handler between these lines
                time.sleep(0)
            kept.append("the next cell")
    assert kept == ["the next cell"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_message_the_wait_polled_but_did_not_read_reaches_the_kernels_loop():
    """The interrupt that ends a wait may come between the pump's poll and its recv.

    The kernel's loop reads the shell socket through a ``ZMQStream``, which wakes on the
    edge of the socket's file descriptor; the poll consumed that edge. Unless the wait
    reads the socket to empty when it ends, that message and every later one (the next
    cells) stay unread: the kernel looks hung. Real sockets and a real stream here.
    """
    import asyncio

    import zmq
    from zmq.eventloop.zmqstream import ZMQStream

    from nbdurable.ipython.approvalview import _ShellPump

    ctx = zmq.Context()
    frontend, shell = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    frontend.bind("inproc://shell")
    shell.connect("inproc://shell")
    delivered: list[bytes] = []

    async def kernel_loop() -> None:
        stream = ZMQStream(shell)
        stream.on_recv(lambda frames: delivered.append(frames[0]))

        async def until(n: int) -> None:
            deadline = time.monotonic() + 10
            while len(delivered) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        frontend.send(b"before the wait")
        await until(1)
        # The cell blocks the loop and waits for a decision: the pump reads the socket.
        pump = _ShellPump(None, shell, lambda frames: delivered.append(frames[0].bytes))
        pump.held.append([zmq.Frame(b"kept by the wait")])
        frontend.send(b"the next cell")
        assert shell.poll(1000)  # ... and the interrupt comes before the recv
        pump.close()  # the wait's finally
        frontend.send(b"the cell after")
        await until(4)
        stream.close()

    try:
        asyncio.run(kernel_loop())
    finally:
        ctx.destroy(linger=0)
    assert delivered == [
        b"before the wait",
        b"kept by the wait",
        b"the next cell",
        b"the cell after",
    ]
