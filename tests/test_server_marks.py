"""The cell marks' server side without a browser: the path check and the data with no store."""

from __future__ import annotations

import nbformat
import pytest
from kernel_util import make_notebook

from nbdurable.server import notebook_path
from nbdurable.server.marks import step_marks
from nbdurable.store import open_store


def test_notebook_path_stays_under_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "link").symlink_to(tmp_path)
    assert notebook_path(root, "sub/a.ipynb") == root / "sub" / "a.ipynb"
    assert notebook_path(root, "/sub/a.ipynb") == root / "sub" / "a.ipynb"
    for bad, why in (
        ("../a.ipynb", "not a notebook path"),
        ("sub/../../a.ipynb", "not a notebook path"),
        ("", "not a notebook path"),
        ("sub//a.ipynb", "not a notebook path"),
        ("link/a.ipynb", "outside the server root"),  # a symlink out of the root
    ):
        with pytest.raises(ValueError, match=why):
            notebook_path(root, bad)


def test_every_step_is_pending_before_a_store_exists(tmp_path, monkeypatch):
    monkeypatch.delenv("NBDURABLE_DIR", raising=False)
    nb = make_notebook(["%load_ext nbdurable", "%%step plan\nx = 1", "%%step\ny = 2", "z = 3"])
    nbformat.write(nb, tmp_path / "a.ipynb")
    data = step_marks(tmp_path / "a.ipynb")
    assert data["run"] == "a.ipynb"
    assert data["store"] == str(tmp_path / ".nbdurable")
    assert data["store_exists"] is False
    assert not (tmp_path / ".nbdurable").exists()  # reading never creates a store
    cells = data["cells"]
    assert [(c["key"], c["state"], c["index"]) for c in cells] == [
        ("name:plan", "pending", 1),
        (f"id:{nb.cells[2].id}", "pending", 2),
    ]
    assert [c["body"] for c in cells] == ["x = 1", "y = 2"]
    assert [c["cell_id"] for c in cells] == [nb.cells[1].id, nb.cells[2].id]
    assert data["others"] == []


def test_an_empty_store_reads_like_no_store(tmp_path):
    nb = make_notebook(["%%step plan\nx = 1"])
    nbformat.write(nb, tmp_path / "a.ipynb")
    open_store(tmp_path / "store").close()
    data = step_marks(tmp_path / "a.ipynb", tmp_path / "store")
    assert data["store_exists"] is True
    assert [(c["key"], c["state"]) for c in data["cells"]] == [("name:plan", "pending")]


def test_pending_approvals_are_listed_for_a_sidebar(tmp_path):
    from nbdurable import approvals

    nb = make_notebook(["%%step email\nx = 1"])
    nbformat.write(nb, tmp_path / "a.ipynb")
    asked = approvals.Pending(
        run="a.ipynb", scope="name:email", id="send", step="email",
        summary="Send the draft to bob", details="Dear Bob", args_fp="f" * 32, asked=1.0,
    )  # fmt: skip
    with open_store(tmp_path / "store") as store:
        store.apply(puts=[approvals.asked(asked)])
    data = step_marks(tmp_path / "a.ipynb", tmp_path / "store")
    assert [(a["id"], a["step"], a["summary"]) for a in data["approvals"]] == [
        ("send", "email", "Send the draft to bob")
    ]
    assert "args_fp" not in data["approvals"][0]
    assert step_marks(tmp_path / "a.ipynb", tmp_path / "none")["approvals"] == []


@pytest.mark.kernel
def test_actions_act_on_the_store_as_the_cli_does(tmp_path):
    """The sidebar's buttons: pin, unpin, clear, clear all; bad ones are one line each."""
    from kernel_util import run_notebook

    from nbdurable.errors import UsageProblem
    from nbdurable.server.marks import act
    from nbdurable.store import RunKeys

    path, store = tmp_path / "a.ipynb", tmp_path / "store"
    cells = ["%load_ext nbdurable", "%%step plan\nx = 1", "%%step use\ny = x + 1"]
    nbformat.write(make_notebook(cells), path)
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    run_notebook(make_notebook(cells), cwd=tmp_path, env=env)

    def states(data: dict) -> dict[str, str]:
        return {c["label"]: c["state"] for c in data["cells"]}

    with pytest.raises(UsageProblem, match="unknown action 'frob'; one of: pin, unpin"):
        act(path, "frob", "name:plan", store)
    with pytest.raises(UsageProblem, match="no step 'nope'"):
        act(path, "pin", "nope", store)
    with pytest.raises(UsageProblem, match="pin: which step"):
        act(path, "pin", None, store)
    with pytest.raises(UsageProblem, match="not pinned"):
        act(path, "unpin", "name:plan", store)
    data = act(path, "pin", "name:plan", store)
    assert data["message"] == "pinned: plan" and states(data)["plan"] == "pinned", data
    assert states(act(path, "unpin", "name:plan", store))["plan"] == "recorded"
    data = act(path, "clear", "name:plan", store)
    assert data["message"] == "cleared: plan; invalidated dependants: use", data
    assert states(data) == {"plan": "pending", "use": "invalidated"}
    data = act(path, "clear-all", None, store)
    assert data["message"].startswith("cleared run 'a.ipynb'"), data
    assert states(data) == {"plan": "pending", "use": "pending"}
    with open_store(store) as s:  # nothing left but the lease the kernel held
        rk = RunKeys("a.ipynb")
        left = sorted(set(s.scan(rk.base)) - {rk.lease})
        # the lease (if held), the change mark and the manifest (it refuses what was cleared)
        assert left == sorted([rk.changed, rk.manifest]), left
    with pytest.raises(UsageProblem, match="nothing is recorded for b.ipynb yet"):
        nbformat.write(make_notebook(cells), tmp_path / "b.ipynb")
        act(tmp_path / "b.ipynb", "pin", "name:plan", tmp_path / "none")


def test_the_side_panel_lists_runs_with_parents_and_compares_them(tmp_path):
    """runs_of and compare_with: what the side panel's Runs section draws."""
    from IPython.core.interactiveshell import InteractiveShell

    from nbdurable import commands
    from nbdurable.durable import session as engine
    from nbdurable.errors import UsageProblem
    from nbdurable.ipython.host import session_for
    from nbdurable.server.marks import compare_with, runs_of

    nb = tmp_path / "a.ipynb"
    nbformat.write(make_notebook(["%load_ext nbdurable", "%%step plan\nx = 1"]), nb)
    assert runs_of(nb) == {"run": "a.ipynb", "runs": []}
    engine.reset_session()
    try:
        s = session_for(InteractiveShell.instance())
        s.set_store(open_store(tmp_path / ".nbdurable"), "a.ipynb")
        s.notebook = nb
        s.steps.run_step("x = 1", name="plan")
        commands.fork(s.store, "a.ipynb", "bold", nb)
        s.set_run("bold")
        s.steps.run_step("x = 1", name="plan", force=True)
    finally:
        engine.reset_session()
    got = runs_of(nb)
    assert {r["run"]: r["parent"] for r in got["runs"]} == {"a.ipynb": None, "bold": "a.ipynb"}
    doc = compare_with(nb, "bold")
    assert doc["a"] == "a.ipynb" and doc["b"] == "bold"
    assert [(s["label"], s["verdict"]) for s in doc["steps"]] == [("plan", "same")]
    with pytest.raises(UsageProblem, match="no run 'nope'"):
        compare_with(nb, "nope")


def test_a_step_at_a_pending_approval_is_waiting_and_the_sidebar_decides_it(tmp_path):
    """Approve / Reject of the side panel: the CLI's decide(), its errors one line each."""
    import dataclasses

    from nbdurable import approvals, status
    from nbdurable.errors import NotPending, UnknownApproval, UsageProblem
    from nbdurable.server.marks import act
    from nbdurable.store import RunKeys
    from nbdurable.store.records import StepState

    path, store = tmp_path / "a.ipynb", tmp_path / "store"
    nbformat.write(make_notebook(["%%step email\nx = 1", "%%step other\ny = 2"]), path)
    asked = approvals.Pending(
        run="a.ipynb", scope="name:email", id="send", step="email",
        summary="Send the draft to bob", details="Dear Bob", args_fp="f" * 32, asked=1.0,
    )  # fmt: skip
    # As `nbdurable run` leaves it: the question pending, the step failed with ApprovalPending.
    stopped = dataclasses.replace(
        StepState(), failed="ApprovalPending: approval 'send' ...", failed_at=2.0, name="email"
    )
    with open_store(store) as s:
        failure = (RunKeys("a.ipynb").state("name:email"), stopped.to_header(), b"")
        s.apply(puts=[approvals.asked(asked), failure])
        (row, _other) = status.step_infos(s, "a.ipynb", path)
    assert row.state == "waiting", row
    assert row.detail.startswith("approval 'send' of step 'email' waits for a decision"), row
    assert "`nbdurable approve a.ipynb send`" in row.detail, row
    assert "waiting" in status.format_table([row])
    data = step_marks(path, store)
    cells = {c["label"]: (c["state"], c["detail"]) for c in data["cells"]}
    assert cells["email"] == ("waiting", row.detail) and cells["other"][0] == "pending", cells

    with pytest.raises(UsageProblem, match="approve: which approval"):
        act(path, "approve", None, store)
    with pytest.raises(UnknownApproval, match="no pending approval 'nope'.*pending: 'send'"):
        act(path, "approve", "nope", store)
    with pytest.raises(UsageProblem, match="the reason must be text"):
        act(path, "reject", "send", store, reason=["no"])  # type: ignore[arg-type]
    data = act(path, "reject", "send", store, reason="wrong quarter")
    assert data["message"].startswith("approval 'send' of step 'email': rejected by "), data
    assert "(wrong quarter)" in data["message"] and data["approvals"] == [], data
    # Decided: no longer waiting, nor failed; the next run goes on from the decision.
    email = next(c for c in data["cells"] if c["label"] == "email")
    assert email["state"] == "pending", email
    assert email["detail"] == "its approval was decided: the next run goes on from the decision"
    with pytest.raises(NotPending, match="approval 'send' was already rejected by .*wrong quarter"):
        act(path, "approve", "send", store)
    with pytest.raises(NotPending):
        act(path, "approve", "email/send", store)
    with open_store(store) as s:
        d = approvals.read_decision(s, RunKeys("a.ipynb"), "name:email", "send")
    assert d is not None and not d.approved and d.by == approvals.decider()
