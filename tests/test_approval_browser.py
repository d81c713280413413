"""An approval's widget in a real JupyterLab, driven by headless Chromium: a person clicks Approve.

The email agent of tests/test_approval_kernels.py is opened in JupyterLab and
run all: the ``email`` cell shows the draft with Approve / Reject while its
kernel is busy, a click on Approve lets the cell go on, the next cell (queued
by Run All) runs after it, and the local mail server gets the email once.
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
                    with page.expect_websocket(
                        lambda ws: "/api/kernels/" in ws.url, timeout=60_000
                    ):
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
                    page.evaluate(
                        "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
                    )
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
