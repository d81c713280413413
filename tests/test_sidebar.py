"""The Steps side panel in a real JupyterLab and a real Notebook 7, driven by headless Chromium.

The notebook of the cell-marks test (recorded twice in real kernels, then
edited on disk) is opened; the side panel is opened as a user would (the
command palette in JupyterLab, the notebook toolbar's "Steps" button in
Notebook 7) and must show every step in the state its cell mark shows (one
reply, one function: the two never disagree). Its buttons act on the store
(checked by reading the store): Pin, then Clear of a step with sub-steps
(which asks first), the cell menu's "why" for an edited step, and Clear all
after the browser's kernel recorded a step, followed by running the steps
again in that kernel (the run records: clearing never costs the kernel its
lease). In JupyterLab it follows a switch to another notebook and back. Its
rows read at 360, 520, 800 and 1280 px in the light and the dark theme (no
button over a fact, no value split across lines). Screenshots go to
test-artifacts/, and to docs/sidebar.png and docs/sidebar-nb7.png (the
pictures docs/views.md shows) when missing or NBDURABLE_UPDATE_SCREENSHOT=1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

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
from test_cell_marks import (
    NOTEBOOK,
    REVISE,
    RUN_ID,
    SECOND,
    _expected,
    _record,
    _wait_idle_kernel,
)

from nbdurable import commands
from nbdurable.store import RunView, open_store

pytestmark = pytest.mark.browser

UPDATE_SCREENSHOT = os.environ.get("NBDURABLE_UPDATE_SCREENSHOT") == "1"
SHOTS = {
    "lab": REPO_ROOT / "docs" / "sidebar.png",
    "notebook": REPO_ROOT / "docs" / "sidebar-nb7.png",
}
OTHER = "other.ipynb"
OTHER_CELLS = ["%load_ext nbdurable", "%%step solo\nanswer = 42"]


@pytest.fixture(params=["lab", "notebook"])
def app(request, tmp_path):
    """A JupyterLab or Notebook 7 server with nbdurable's extensions, on 127.0.0.1."""
    require_chromium()
    kind = request.param
    root, store = tmp_path / "root", tmp_path / "root" / ".nbdurable"
    root.mkdir()
    settings = tmp_path / "lab-settings"
    write_settings(settings)
    data = tmp_path / "jupyter-data"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "nbdurable").symlink_to(REPO_ROOT / "nbdurable" / "labextension")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDURABLE_")}
    env.update(
        NBDURABLE_DIR=str(store),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p),
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        JUPYTER_CONFIG_PATH=str(REPO_ROOT / "jupyter-config"),
        JUPYTER_PATH=str(data),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
    )
    app_class = "LabApp" if kind == "lab" else "JupyterNotebookApp"
    args = [
        f"--{app_class}.user_settings_dir={settings}",
        f"--{app_class}.workspaces_dir={tmp_path / 'workspaces'}",
        f"--{app_class}.expose_app_in_browser=True",
    ]
    with jupyter_server(kind, tmp_path, root, env, args, f"sidebar-{kind}.log") as url:
        yield kind, url, root, store


def _check_rows(page, where: str) -> None:
    """Every row inside the side panel; its buttons under its facts; no value split."""
    side = page.locator("#nbdurable-steps")
    for row in side.locator(".nbd-side-row").all():
        row.scroll_into_view_if_needed()  # may scroll the page too: measure after it
        outer, box = side.bounding_box(), row.bounding_box()
        assert outer and outer["width"] > 0, where
        what = (where, row.get_attribute("data-nbd-key"), box, outer)
        assert (
            box["x"] >= outer["x"] - 1
            and box["x"] + box["width"] <= outer["x"] + outer["width"] + 1
        ), what
        texts = row.locator(".nbd-side-line, .nbd-side-facts, .nbd-side-detail").all()
        buttons = row.locator(".nbd-side-buttons")
        if buttons.count():
            top = buttons.bounding_box()["y"]
            for t in texts:
                b = t.bounding_box()
                assert b["y"] + b["height"] <= top + 1, (*what, t.inner_text())
        for part in row.locator(".nbd-mark-badge, .nbd-side-fact, .nbd-side-cell").all():
            h = part.bounding_box()["height"]
            assert h < 24, (where, part.inner_text(), h)


def test_sidebar(app):
    from playwright.sync_api import expect, sync_playwright

    kind, url, root, store = app
    unnamed = _record(root, store)
    expected = _expected(unnamed)
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(root / OTHER)}
    nbformat.write(make_notebook(OTHER_CELLS), root / OTHER)
    run_notebook(make_notebook(OTHER_CELLS), cwd=root, env=env)
    ARTIFACTS.mkdir(exist_ok=True)

    page_url = f"{url}/lab/tree/{NOTEBOOK}" if kind == "lab" else f"{url}/notebooks/{NOTEBOOK}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        side = page.locator("#nbdurable-steps")

        def row(key: str):
            return side.locator(f'.nbd-side-row[data-nbd-key="{key}"]')

        def mark(key: str):
            return page.locator(f'.nbd-mark[data-nbd-key="{key}"]')

        def same_as_marks(where: str) -> None:
            for key in expected:
                state = mark(key).get_attribute("data-nbd-state")
                expect(row(key), f"{key} {where}").to_have_attribute("data-nbd-state", state)

        def view():
            s = open_store(store)
            return s, RunView(s, RUN_ID)

        def started() -> dict[str, float]:
            s, v = view()
            with s:
                return {k: r.started for k, r in v.records().items() if r is not None}

        def failed_at(key: str) -> float | None:
            s, v = view()
            with s:
                return v.state(key).failed_at

        def agree(where: str) -> dict[str, str]:
            """Every step's state, as the side panel, the marks and `nbdurable status`
            (another process, no kernel) all show it once the marks caught up."""
            cli = subprocess.run(
                [sys.executable, "-m", "nbdurable", "status", str(root / NOTEBOOK), "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "NBDURABLE_DIR": str(store), "PYTHONPATH": str(REPO_ROOT)},
            )
            assert cli.returncode == 0, cli.stdout + cli.stderr
            status = {s["key"]: s["state"] for s in json.loads(cli.stdout)["steps"]}
            for key, state in status.items():
                if key not in expected:
                    continue
                # This kernel replayed it: the frontend says so; the store says recorded.
                shown = re.compile(f"^({state}|replayed)$" if state == "recorded" else f"^{state}$")
                expect(mark(key), f"{key} {where}").to_have_attribute(
                    "data-nbd-state", shown, timeout=15_000
                )
            same_as_marks(where)
            return {k: v for k, v in status.items() if k in expected}

        try:
            page.goto(page_url, timeout=60_000)
            for key, (state, _text) in expected.items():
                expect(mark(key)).to_have_attribute("data-nbd-state", state, timeout=30_000)
            if kind == "lab":  # the command palette
                palette = page.locator(".lm-CommandPalette-input")
                deadline = time.monotonic() + 30
                while not palette.is_visible() and time.monotonic() < deadline:
                    page.locator(".jp-Notebook .jp-Cell").first.click()  # the page has focus
                    page.keyboard.press("ControlOrMeta+Shift+c")
                    page.wait_for_timeout(500)
                palette.fill("Show nbdurable Steps")
                page.keyboard.press("Enter")
            else:  # the notebook's toolbar
                page.locator(".jp-Toolbar-item", has_text="Steps").click()
            expect(side).to_be_visible(timeout=15_000)
            for key, (state, _text) in expected.items():
                expect(row(key), key).to_have_attribute("data-nbd-state", state, timeout=15_000)
            same_as_marks("on open")
            expect(side.locator(".nbd-side-head")).to_contain_text(f"run {RUN_ID}")
            expect(row("name:revise").locator(".nbd-side-detail")).to_have_text("its code changed")
            # ... and what exactly: the lines of code, and a value the rerun will change
            # as the upstream's saved code binds it (nbdurable.why).
            expect(row("name:revise").locator(".nbd-side-why")).to_have_text(
                "- draft = 'v1'\n+ draft = 'v2'"
            )
            expect(row("name:extra").locator(".nbd-side-why")).to_have_text(
                "'draft': was 'v1', now 'v2'"
            )
            page.mouse.move(0, 0)
            page.screenshot(path=str(ARTIFACTS / f"sidebar-{kind}-open.png"))
            if UPDATE_SCREENSHOT or not SHOTS[kind].exists():
                page.wait_for_timeout(300)
                page.screenshot(path=str(SHOTS[kind]))

            # Pin: the store says pinned; the row and the cell's mark both.
            row("name:research").get_by_role("button", name="Pin").click()
            expect(row("name:research")).to_have_attribute("data-nbd-state", "pinned")
            expect(mark("name:research")).to_have_attribute("data-nbd-state", "pinned")
            expect(side.locator(".nbd-side-message")).to_have_text("pinned: research")
            s, v = view()
            with s:
                assert v.state("name:research").pinned
            row("name:research").get_by_role("button", name="Unpin").click()
            expect(row("name:research")).to_have_attribute("data-nbd-state", "replayed")

            # Runs…: the store's runs, a fork named with its parent, and a comparison.
            s, _v = view()
            with s:
                commands.fork(s, RUN_ID, "variant", root / NOTEBOOK, "extra")
            side.get_by_role("button", name="Runs…").click()
            variant = side.locator('.nbd-side-run-row[data-nbd-run="variant"]')
            expect(variant).to_contain_text(f"forked from {RUN_ID}")
            expect(side.locator(f'.nbd-side-run-row[data-nbd-run="{RUN_ID}"]')).to_contain_text(
                "this notebook's run"
            )
            variant.get_by_role("button", name="Compare").click()
            compared = side.locator(".nbd-side-compare")
            expect(compared.locator(".nbd-side-compare-head")).to_contain_text(
                f"A {RUN_ID} · B variant: "
            )
            # Steps from 'extra' on were not forked: only in A; the ones before are the same.
            expect(compared.locator('[data-nbd-verdict="only in A"]').first).to_be_visible()
            expect(compared.locator('[data-nbd-verdict="same"]').first).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / f"sidebar-{kind}-runs.png"))
            side.get_by_role("button", name="Close runs").click()
            expect(side.locator(".nbd-side-runs")).to_have_count(0)

            # Clear a step with sub-steps: it asks first; cancelled, nothing changes.
            row("name:research").get_by_role("button", name="Clear").click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog).to_contain_text("3 recorded sub-steps")
            dialog.get_by_role("button", name="Cancel").click()
            expect(row("name:research")).to_have_attribute("data-nbd-state", "replayed")
            row("name:research").get_by_role("button", name="Clear").click()
            dialog.get_by_role("button", name="Clear").click()
            expect(row("name:research")).to_have_attribute("data-nbd-state", "pending")
            expect(mark("name:research")).to_have_attribute("data-nbd-state", "pending")
            s, v = view()
            with s:
                assert "name:research" not in v.records() and v.sub_stats("name:research")[0] == 0
            same_as_marks("after a clear")

            # The cell menu: why the edited step runs.
            page.locator(".jp-Cell", has=mark("name:revise")).locator(".cm-content").click(
                button="right"
            )
            page.get_by_role("menuitem", name="Why Does This Step Run?").click()
            expect(dialog).to_contain_text("its code changed")
            expect(dialog).to_contain_text("+ draft = 'v2'")
            dialog.get_by_role("button", name="Ok").click()

            # Widths and themes: rows inside the panel, buttons under the facts.
            for theme in ("JupyterLab Light", "JupyterLab Dark"):
                page.evaluate(
                    "t => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})",
                    theme,
                )
                light = "true" if theme.endswith("Light") else "false"
                page.wait_for_function(
                    f"() => document.body.dataset.jpThemeLight === '{light}'", timeout=20_000
                )
                for width in (360, 520, 800, 1280):
                    page.set_viewport_size({"width": width, "height": 1100})
                    page.wait_for_timeout(200)
                    if not side.is_visible():  # a narrow window may fold the side area
                        page.evaluate("window.jupyterapp.commands.execute('nbdurable:show-steps')")
                    expect(side).to_be_visible()
                    _check_rows(page, f"{theme} at {width} px")
                    page.screenshot(path=str(ARTIFACTS / f"sidebar-{kind}-{light}-{width}.png"))
            page.set_viewport_size({"width": 1280, "height": 1100})

            if kind == "lab":  # it follows the active notebook, and back
                page.locator(".jp-DirListing-item", has_text=OTHER).dblclick()
                expect(row("name:solo")).to_have_attribute(
                    "data-nbd-state", "recorded", timeout=20_000
                )
                expect(row("name:plan")).to_have_count(0)
                page.locator(".lm-DockPanel .lm-TabBar-tab", has_text=NOTEBOOK).click()
                expect(row("name:plan")).to_be_visible(timeout=20_000)
                expect(row("name:solo")).to_have_count(0)

            # An upstream step edited and saved in the browser, then Run All: before it,
            # the side panel, the marks and `nbdurable status` say the same of every
            # step; the run does what they said (read from the store: a step that ran has
            # a new record); after it, all three agree again.
            _wait_idle_kernel(url)
            cells = page.locator(".jp-Notebook .jp-Cell")
            revise_cell = cells.nth(SECOND.index(REVISE))
            revise_cell.locator(".cm-content").click()
            page.keyboard.press("ControlOrMeta+End")
            page.keyboard.type("\nnote = 'edited here'")
            page.keyboard.press("ControlOrMeta+s")
            expect(row("name:revise").locator(".nbd-side-why")).to_contain_text(
                "+ note = 'edited here'", timeout=15_000
            )
            predicted = agree("after an edit in the browser, saved")
            assert predicted["name:revise"] == "invalidated", predicted
            assert predicted["name:extra"] == "invalidated", predicted
            before, t0 = started(), time.time()
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            # Run All stops at the failing step, which fails again: then it is over.
            deadline = time.monotonic() + 120
            while (failed_at("name:broken") or 0) < t0 and time.monotonic() < deadline:
                time.sleep(0.3)
            assert (failed_at("name:broken") or 0) >= t0, "Run All did not reach 'broken'"
            _wait_idle_kernel(url)
            after = started()
            for key, state in predicted.items():
                if key in ("name:later", "name:slow") or state in ("may run", "failed"):
                    continue  # after the failing step (not run), or either outcome
                ran = after.get(key) != before.get(key)
                runs = state in ("invalidated", "pending", "not replayable")
                assert ran == runs, (key, state, before.get(key), after.get(key))
            done = agree("after Run All")
            assert done["name:revise"] == "recorded" and done["name:extra"] == "recorded", done

            # The browser's kernel records a step, then Clear all, then the steps again:
            # they record (the kernel kept its lease), and every view says so.
            _wait_idle_kernel(url)
            for i in (0, 1, SECOND.index(REVISE)):
                cells.nth(i).locator(".cm-content").click()
                page.keyboard.press("Shift+Enter")
                _wait_idle_kernel(url)
            # Run All above recorded it: it replays now.
            expect(row("name:revise")).to_have_attribute(
                "data-nbd-state", re.compile("^(recorded|replayed)$"), timeout=20_000
            )
            side.get_by_role("button", name="Clear all…").click()
            expect(dialog).to_contain_text("Every step and sub-step")
            dialog.get_by_role("button", name="Clear").click()
            for key in ("name:plan", "name:revise"):
                expect(row(key)).to_have_attribute("data-nbd-state", "pending")
            for i in (1, SECOND.index(REVISE)):
                cells.nth(i).locator(".cm-content").click()
                page.keyboard.press("Shift+Enter")
                _wait_idle_kernel(url)
            for key in ("name:plan", "name:revise"):
                expect(row(key)).to_have_attribute("data-nbd-state", "recorded", timeout=20_000)
            expect(cells.nth(1)).not_to_contain_text("taken over")
            s, v = view()
            with s:
                assert {"name:plan", "name:revise"} <= set(v.records())
            same_as_marks("after Clear all and a run")
        finally:
            page.screenshot(path=str(ARTIFACTS / f"sidebar-{kind}-final.png"), full_page=True)
            browser.close()
