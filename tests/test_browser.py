"""The step panel in a real JupyterLab and a real Notebook 7, driven by headless Chromium.

A first notebook is run in a real kernel to record some steps; then the notebook is
edited (one step changed, one pinned and changed, one deleted, new ones added), opened
in JupyterLab (and, in a second test, in Notebook 7) and run all. The panel,
displayed in the second cell, must show each step's state in the DOM, live while
cells run, and its Pin and Clear buttons must change the store, and a pin made by
the CLI must show by itself (the panel reads the run's change mark once a second).
At window widths from 360 to 1280 px, in the light and the dark theme, no value
of a row may lie under a button, be cut or split across lines. Screenshots go to
test-artifacts/, and to docs/panel.png, docs/panel-narrow.png and
docs/panel-dark.png (JupyterLab's) and docs/panel-nb7.png (Notebook 7's), the
pictures docs/views.md shows, when missing or NBDURABLE_UPDATE_SCREENSHOT=1.

Chromium is Debian's (``.ci/run`` installs it); the test fails, never skips,
when it is missing. Never ``playwright install``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_util import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    jupyter_server,
    require_chromium,
    write_settings,
)
from kernel_util import REPO_ROOT, make_notebook, run_notebook

from nbdurable import commands, status
from nbdurable.store import RunView, open_store

pytestmark = pytest.mark.browser

SCREENSHOT = REPO_ROOT / "docs" / "panel.png"
NARROW_SCREENSHOT = REPO_ROOT / "docs" / "panel-narrow.png"  # a 360 px window
DARK_SCREENSHOT = REPO_ROOT / "docs" / "panel-dark.png"
NB7_SCREENSHOT = REPO_ROOT / "docs" / "panel-nb7.png"
# docs/panel.png is committed (the README shows it), so a test run does not rewrite
# it unless asked: NBDURABLE_UPDATE_SCREENSHOT=1 python -m pytest tests/test_browser.py
UPDATE_SCREENSHOT = os.environ.get("NBDURABLE_UPDATE_SCREENSHOT") == "1"
RUN_ID = "panel.ipynb"  # the notebook's path relative to the store's parent

SETUP = "%load_ext nbdurable\nfrom nbdurable import step\nimport time"
FIRST = [  # recorded by a first kernel, before JupyterLab starts
    SETUP,
    "%%step plan\ntime.sleep(0.4)  # think\nplan = ['alpha', 'beta', 'gamma']",
    "%%step research\nfindings = [step(f'ask:{q}', lambda q: (time.sleep(0.2), q.upper())[1], q)\n"
    "            for q in plan]",
    "%%step pinned\nsummary = len(findings)",
    "%%step old_step\nleft_over = 1",
    "%%step revise\ndraft = 'v1'",
]
SECOND = [  # what JupyterLab opens and runs
    SETUP,
    "%step panel",
    FIRST[1],
    FIRST[2],
    "%%step pinned\nsummary = len(findings) + 0  # edited, but pinned",
    "%%step slow\nticks = [step(f'tick:{i}', lambda i: (time.sleep(0.1), i)[1], i)\n"
    "         for i in range(30)]",
    "%%step handle\nimport threading\nlock = threading.Lock()",
    "%%step broken\nraise RuntimeError('the model timed out')",
    "%%step revise\ndraft = 'v2'",
    "%%step report\nreport = draft.upper()",
]
EXPECTED = {  # after run all, which stops at 'broken'
    "plan": "replayed",
    "research": "replayed",
    "pinned": "pinned-stale",
    "slow": "recorded",
    "handle": "not replayable",
    "broken": "failed",
    "revise": "invalidated",
    "report": "pending",
    "old_step": "orphaned",
}


#: The server application of each frontend, and where it opens a notebook.
APPS = {
    "lab": ("LabApp", "/lab/tree/"),
    "notebook": ("JupyterNotebookApp", "/notebooks/"),
}


@contextlib.contextmanager
def jupyterlab(tmp_path, kind: str = "lab"):
    """A JupyterLab (or, ``kind="notebook"``, Notebook 7) server on 127.0.0.1.

    Its kernels record to root/.nbdurable in tmp_path; its app is exposed as
    ``window.jupyterapp``.
    """
    app = APPS[kind][0]
    root = tmp_path / "root"
    store = root / ".nbdurable"  # where it would be by default: beside the notebook
    root.mkdir()
    settings = tmp_path / "lab-settings"
    write_settings(settings)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDURABLE_")}
    env.update(
        NBDURABLE_DIR=str(store),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
    )
    args = [
        f"--{app}.expose_app_in_browser=True",
        f"--{app}.user_settings_dir={settings}",
        f"--{app}.workspaces_dir={tmp_path / 'lab-workspaces'}",
    ]
    with jupyter_server(kind, tmp_path, root, env, args, f"browser-{kind}.log") as url:
        yield url, root, store, tmp_path, kind


def _infos(store_dir: Path, notebook: Path) -> dict[str, status.StepInfo]:
    with open_store(store_dir) as store:
        return {i.label: i for i in status.step_infos(store, RUN_ID, notebook)}


def test_panel_in_jupyterlab(tmp_path):
    require_chromium()
    with jupyterlab(tmp_path) as lab:
        _check_panel(lab)


def test_panel_in_notebook_7(tmp_path):
    require_chromium()
    with jupyterlab(tmp_path, "notebook") as app:
        _check_panel(app)


def _check_panel(lab):
    from playwright.sync_api import expect, sync_playwright

    url, root, store, tmp_path, kind = lab
    # Notebook 7's pictures are artifacts of their own; the README shows JupyterLab's
    # three and Notebook 7's panel.
    shot = "" if kind == "lab" else f"{kind}-"
    notebook = root / "panel.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(notebook)}
    run_notebook(make_notebook(FIRST), cwd=root, env=env)
    with open_store(store) as s:
        commands.set_pin(s, RUN_ID, "name:pinned", True)
    nbformat.write(make_notebook(SECOND), notebook)
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        try:
            with page.expect_websocket(lambda ws: "/api/kernels/" in ws.url, timeout=60_000):
                page.goto(f"{url}{APPS[kind][1]}panel.ipynb", timeout=60_000)
            page.wait_for_function(
                """() => {
                    const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                    const k = nb && nb.sessionContext && nb.sessionContext.session
                        && nb.sessionContext.session.kernel;
                    return k && k.connectionStatus === 'connected' && k.status === 'idle';
                }""",
                timeout=60_000,
            )
            # Not awaited: the command's promise settles only when every cell has run.
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

            def line(step: str):
                return page.locator(f'.nbd-step[data-step="{step}"]')

            # Live: the slow step shows running while its loop records sub-steps.
            expect(line("slow")).to_have_attribute("data-state", "running", timeout=30_000)
            progress = line("slow").locator(".nbd-progress")
            expect(progress).to_contain_text(re.compile(r"\d+ (of 30 )?sub-steps?"))
            first = progress.inner_text()
            expect(progress).not_to_have_text(first, timeout=5_000)
            expect(line("slow")).to_have_attribute("data-state", "recorded", timeout=30_000)

            for step, state in EXPECTED.items():
                expect(line(step)).to_have_attribute("data-state", state, timeout=20_000)
            expect(line("slow").locator(".nbd-progress")).to_have_text("30 of 30 sub-steps")
            expect(line("revise").locator(".nbd-detail")).to_have_text("its code changed")
            expect(line("broken").locator(".nbd-detail")).to_contain_text("the model timed out")
            expect(line("pinned").locator(".nbd-badge")).to_have_text("⚑ pinned · stale")
            header = page.locator(".nbd-header")
            expect(header).to_contain_text(f"run {RUN_ID} in .nbdurable/")
            expect(header).to_contain_text(
                "5 recorded · 1 pending · 1 invalidated · 1 failed · 1 orphaned"
            )
            expect(header).to_contain_text("replay saved")

            _check_layout(page, "light", shot)
            page.set_viewport_size({"width": 1280, "height": 1000})
            panel = page.locator(".nbd-panel")
            panel.scroll_into_view_if_needed()
            page.mouse.move(0, 0)  # no hover highlight in the picture
            panel.screenshot(path=str(ARTIFACTS / f"{shot}panel.png"))
            if kind == "lab" and (UPDATE_SCREENSHOT or not SCREENSHOT.exists()):
                shutil.copy(ARTIFACTS / "panel.png", SCREENSHOT)
                shutil.copy(ARTIFACTS / "panel-light-360.png", NARROW_SCREENSHOT)
            if kind == "notebook" and (UPDATE_SCREENSHOT or not NB7_SCREENSHOT.exists()):
                shutil.copy(ARTIFACTS / f"{shot}panel.png", NB7_SCREENSHOT)

            # Pin from the panel: the store has the pin.
            def row(step: str):
                return page.locator(".nbd-row", has=line(step))

            row("slow").get_by_role("button", name="Pin", exact=True).click()
            expect(line("slow")).to_have_attribute("data-state", "pinned")
            expect(row("slow").get_by_role("button", name="Unpin", exact=True)).to_be_visible()
            assert _infos(store, notebook)["slow"].pinned

            # Clear a step with sub-steps: it asks first, then the store forgets it.
            row("research").get_by_role("button", name="Clear", exact=True).click()
            confirm = page.locator(".nbd-confirm")
            expect(confirm).to_contain_text("3 recorded sub-steps")
            assert _infos(store, notebook)["research"].recorded_at is not None
            confirm.get_by_role("button", name="Confirm", exact=True).click()
            expect(line("research")).to_have_attribute("data-state", "pending")
            after = _infos(store, notebook)
            assert after["research"].recorded_at is None and after["research"].substeps == 0
            # Its dependant is marked stale in the store; the row keeps the first reason
            # the step runner would give (its code changed: checked before stale marks).
            with open_store(store) as s:
                assert (
                    "upstream step 'research' was cleared"
                    in RunView(s, RUN_ID).state("name:pinned").stale
                )
            expect(line("pinned").locator(".nbd-detail")).to_have_text("its code changed")

            # The CLI, from another process, on the same store: the panel shows it by itself.
            cli = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "nbdurable",
                    "pin",
                    str(notebook),
                    "revise",
                    "--store",
                    str(store),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
            assert cli.returncode == 0, cli.stdout + cli.stderr
            expect(line("revise")).to_have_attribute("data-state", "pinned-stale", timeout=10_000)
            page.screenshot(
                path=str(ARTIFACTS / f"browser-{shot}after-actions.png"), full_page=True
            )

            # The dark theme, for the eye (an artifact, not an assertion).
            page.evaluate(
                "window.jupyterapp.commands.execute('apputils:change-theme',"
                " {theme: 'JupyterLab Dark'})"
            )
            page.wait_for_function(
                "() => document.body.dataset.jpThemeLight === 'false'", timeout=20_000
            )
            _check_layout(page, "dark", shot)
            page.set_viewport_size({"width": 1280, "height": 1000})
            panel.scroll_into_view_if_needed()
            page.mouse.move(0, 0)
            panel.screenshot(path=str(ARTIFACTS / f"{shot}panel-dark.png"))
            if kind == "lab" and (UPDATE_SCREENSHOT or not DARK_SCREENSHOT.exists()):
                shutil.copy(ARTIFACTS / "panel-dark.png", DARK_SCREENSHOT)
        finally:
            page.screenshot(path=str(ARTIFACTS / f"browser-{shot}final.png"), full_page=True)
            browser.close()


#: Browser widths the panel must read well at: a phone, JupyterLab at ~950 px with the
#: file browser open (a 520 px panel), a laptop, a wide screen.
WIDTHS = (360, 520, 800, 1280)

# Every problem of the panel's layout, as text: a value drawn under a button, a value
# cut by its row's box, a value split across lines, a row's buttons on two lines. Values
# are the name, the badge and each fact; the detail line may wrap (it is prose) but must
# stay clear of the buttons.
_LAYOUT_PROBLEMS = """() => {
    const problems = [];
    for (const b of document.querySelectorAll('.nbd-panel button'))
        if (getComputedStyle(b).visibility !== 'hidden' && b.scrollWidth > b.clientWidth + 1)
            problems.push(`button '${b.innerText}' is cut`);
    const hit = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5
        && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
    for (const row of document.querySelectorAll('.nbd-row')) {
        const step = row.querySelector('.nbd-step');
        if (!step) continue;
        const name = step.dataset.step;
        const box = step.parentElement.getBoundingClientRect();
        const buttons = [...row.querySelectorAll('button')]
            .filter(b => getComputedStyle(b).visibility !== 'hidden')
            .map(b => [b.innerText, b.getBoundingClientRect()]);
        const tops = new Set(buttons.map(([, b]) => Math.round(b.top)));
        if (tops.size > 1)
            problems.push(`${name}: its buttons are split across lines`);
        const values = step.querySelectorAll('.nbd-name, .nbd-badge, .nbd-fact');
        for (const v of values) {
            const r = v.getBoundingClientRect();
            const what = `${name}: ${v.className} '${v.innerText}'`;
            if (r.right > box.right + 0.5 || r.left < box.left - 0.5)
                problems.push(`${what} is cut by its box`);
            if (v.scrollWidth > v.clientWidth + 1 && getComputedStyle(v).display !== 'inline')
                problems.push(`${what} is cut (${v.scrollWidth} > ${v.clientWidth})`);
            const lh = parseFloat(getComputedStyle(v).lineHeight) || 20;
            if (v.getClientRects().length > 1 || r.height > lh * 1.5)
                problems.push(`${what} is split across lines`);
            for (const [label, b] of buttons)
                if (hit(r, b)) problems.push(`${what} is under button ${label}`);
        }
        const detail = step.querySelector('.nbd-detail');
        if (detail)
            for (const [label, b] of buttons)
                if (hit(detail.getBoundingClientRect(), b))
                    problems.push(`${name}: detail is under button ${label}`);
    }
    return problems;
}"""


def _check_layout(page, theme: str, shot: str) -> None:
    """At every width of WIDTHS: no value under a button, cut, or split across lines."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    # The side bars closed, so the notebook (and the panel) get the window's width less
    # their margins; with the file browser open at 360 px no notebook is readable at all.
    page.evaluate(
        "() => { const s = window.jupyterapp.shell;"
        " if (s.collapseLeft) s.collapseLeft(); if (s.collapseRight) s.collapseRight(); }"
    )
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        # Relayout is asynchronous (Lumino): wait until the rows fit this window.
        page.wait_for_function(
            "w => [...document.querySelectorAll('.nbd-row')].every("
            "r => r.getBoundingClientRect().right <= w)",
            arg=width,
            timeout=20_000,
        )
        with contextlib.suppress(PlaywrightTimeout):  # what is wrong is reported below
            page.wait_for_function(f"({_LAYOUT_PROBLEMS})().length === 0", timeout=5_000)
        problems = page.evaluate(_LAYOUT_PROBLEMS)
        if problems or width == 360:
            page.locator(".nbd-panel").screenshot(
                path=str(ARTIFACTS / f"{shot}panel-{theme}-{width}.png")
            )
            page.screenshot(path=str(ARTIFACTS / f"browser-{shot}{theme}-{width}.png"))
        assert not problems, f"{theme} theme at {width} px:\n" + "\n".join(problems)
