"""An approval in a real JupyterLab and Notebook 7, driven by headless Chromium: a person approves.

The email agent of tests/test_approval_kernels.py is opened and run all: the
``email`` cell shows the draft with Approve / Reject while its kernel is busy,
a click on Approve lets the cell go on, the next cell (queued by Run All) runs
after it, and the local mail server gets the email once. Once from the cell's
widget (JupyterLab), once from the Steps side panel (JupyterLab and Notebook
7), where the cell's mark says it is waiting and the panel lists the approval.
A screenshot of the widget goes to test-artifacts/approval.png, and to
docs/approval.png (the picture docs/approvals.md shows) when missing or
NBDURABLE_UPDATE_SCREENSHOT=1.
"""

from __future__ import annotations

import os
import shutil

import nbformat
import pytest
from jupyter_util import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, require_chromium
from kernel_util import REPO_ROOT, make_notebook
from test_approval_kernels import EMAIL, SETUP, MailServer
from test_browser import APPS, jupyterlab

from nbdurable import approvals
from nbdurable.store import open_store

pytestmark = pytest.mark.browser

SCREENSHOT = REPO_ROOT / "docs" / "approval.png"
UPDATE_SCREENSHOT = os.environ.get("NBDURABLE_UPDATE_SCREENSHOT") == "1"


def _open_and_run_all(page, url: str, kind: str) -> None:
    """Open agent.ipynb, wait for its kernel, and Run All."""
    with page.expect_websocket(lambda ws: "/api/kernels/" in ws.url, timeout=60_000):
        page.goto(f"{url}{APPS[kind][1]}agent.ipynb", timeout=60_000)
    page.wait_for_function(
        """() => {
            const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const k = nb && nb.sessionContext && nb.sessionContext.session
                && nb.sessionContext.session.kernel;
            return k && k.connectionStatus === 'connected' && k.status === 'idle';
        }""",
        timeout=60_000,
    )
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


#: POST an action to the side panel's endpoint from the page, as its buttons do
#: (the server's XSRF check included); the answer's status and message.
_POST = """async ([action, key]) => {
    const xsrf = (document.cookie.match(/(?:^|; )_xsrf=([^;]*)/) || [])[1] || '';
    const r = await fetch('/nbdurable/api/steps', {
        method: 'POST', credentials: 'same-origin',
        headers: {'Content-Type': 'application/json', 'X-XSRFToken': decodeURIComponent(xsrf)},
        body: JSON.stringify({path: 'agent.ipynb', action, key}),
    });
    return [r.status, (await r.json()).message];
}"""


@pytest.mark.parametrize("kind", ["lab", "notebook"])
def test_approve_from_the_side_panel(tmp_path, monkeypatch, kind):
    from playwright.sync_api import expect, sync_playwright

    require_chromium()
    mail = MailServer()
    monkeypatch.setenv("MAIL_URL", mail.url)  # the server's kernels inherit it
    try:
        with jupyterlab(tmp_path, kind) as (url, root, _store, _tmp, _kind):
            cells = [SETUP, EMAIL, "print('after the approval:', receipt)"]
            nbformat.write(make_notebook(cells), root / "agent.ipynb")
            ARTIFACTS.mkdir(exist_ok=True)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                try:
                    _open_and_run_all(page, url, kind)
                    page.evaluate(
                        "() => { window.jupyterapp.commands.execute('nbdurable:show-steps'); }"
                    )
                    side = page.locator("#nbdurable-steps")
                    expect(side).to_be_visible(timeout=30_000)
                    asked = side.locator('.nbd-side-approval[data-nbd-approval="send"]')
                    expect(asked).to_contain_text(
                        "Send the draft to bob@example.com", timeout=60_000
                    )
                    expect(asked).to_contain_text("Dear bob@example.com")
                    expect(asked).to_contain_text("step email")
                    # The cell waits for a person, and says so: its mark, its row.
                    mark = page.locator('.nbd-mark[data-nbd-key="name:email"]')
                    expect(mark).to_have_attribute("data-nbd-state", "waiting", timeout=30_000)
                    expect(mark).to_contain_text("◷")
                    row = side.locator('.nbd-side-row[data-nbd-key="name:email"]')
                    expect(row).to_have_attribute("data-nbd-state", "waiting")
                    expect(row).to_contain_text("nbdurable approve agent.ipynb send")
                    assert page.evaluate(_POST, ["approve", "nope"])[0] == 404
                    assert mail.sent == []
                    side.screenshot(path=str(ARTIFACTS / f"approval-side-{kind}.png"))
                    asked.get_by_role("button", name="Approve").click()
                    expect(side.locator(".nbd-side-message")).to_contain_text(
                        "approval 'send' of step 'email': approved by ", timeout=30_000
                    )
                    outputs = page.locator(".jp-OutputArea-output")
                    expect(outputs.filter(has_text="receipt: msg-1")).to_have_count(
                        1, timeout=30_000
                    )
                    expect(outputs.filter(has_text="after the approval: msg-1")).to_have_count(
                        1, timeout=30_000
                    )
                    # The cell's widget learnt the decision made elsewhere.
                    expect(page.locator(".nbdurable-approval")).to_contain_text("approved by ")
                    expect(side.locator(".nbd-side-approval")).to_have_count(0, timeout=30_000)
                    expect(mark).not_to_have_attribute("data-nbd-state", "waiting", timeout=30_000)
                    status, message = page.evaluate(_POST, ["approve", "send"])
                    assert status == 409 and "already approved by " in message, message
                finally:
                    page.screenshot(path=str(ARTIFACTS / f"approval-side-{kind}-page.png"))
                    browser.close()
    finally:
        mail.close()
    assert mail.sent == ["bob@example.com"]


def test_approve_from_the_widget_in_jupyterlab(tmp_path, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    require_chromium()
    mail = MailServer()
    monkeypatch.setenv("MAIL_URL", mail.url)  # the server's kernels inherit it
    try:
        with jupyterlab(tmp_path) as (url, root, _store, _tmp, kind):
            cells = [SETUP, EMAIL, "print('after the approval:', receipt)"]
            nbformat.write(make_notebook(cells), root / "agent.ipynb")
            ARTIFACTS.mkdir(exist_ok=True)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                try:
                    _open_and_run_all(page, url, kind)
                    widget = page.locator(".nbdurable-approval")
                    asked = "Send the draft to bob@example.com"
                    expect(widget).to_contain_text(asked, timeout=60_000)
                    expect(widget).to_contain_text("Dear bob@example.com")
                    widget.screenshot(path=str(ARTIFACTS / "approval.png"))
                    if UPDATE_SCREENSHOT or not SCREENSHOT.exists():
                        shutil.copy(ARTIFACTS / "approval.png", SCREENSHOT)
                    assert mail.sent == []
                    widget.get_by_role("button", name="Approve").click()
                    expect(widget).to_contain_text("approved by ", timeout=30_000)
                    outputs = page.locator(".jp-OutputArea-output")
                    expect(outputs.filter(has_text="receipt: msg-1")).to_have_count(
                        1, timeout=30_000
                    )
                    expect(outputs.filter(has_text="after the approval: msg-1")).to_have_count(
                        1, timeout=30_000
                    )
                    expect(widget.get_by_role("button", name="Approve")).to_be_disabled()
                finally:
                    page.screenshot(path=str(ARTIFACTS / "approval-page.png"))
                    browser.close()
    finally:
        mail.close()
    assert mail.sent == ["bob@example.com"]
    with open_store(root / ".nbdurable") as store:
        keys = approvals.RunKeys("agent.ipynb")  # the run id: the notebook beside the store
        decision = approvals.read_decision(store, keys, "name:email", "send")
    assert decision is not None and decision.approved and decision.by == approvals.decider()
