"""The cell marks in a real JupyterLab and a real Notebook 7, driven by headless Chromium.

A notebook is run twice in real kernels (the second run replays what the first
recorded and saves the replay notes among the outputs), then edited on disk
(one step's code changed, one pinned and changed). Each app opens it and must
mark every ``%%step`` cell with its state *without running anything*: the
states come from the server extension reading the store, with no kernel. The
marks must be there again after a reload, read well at 400 px and at a wide
width (no mark wider than its cell, no value split across lines), and an edit
not saved yet must show as edited; saving it shows what the next run will do.

The extension is loaded the way an installed package provides it: the server
switch from ``jupyter-config/`` (``JUPYTER_CONFIG_PATH``) and the prebuilt
frontend from ``nbdurable/labextension`` (under ``JUPYTER_PATH``), so the test
checks the committed build. A live step panel follows a save made in the
browser (an edited step turns invalidated with no cell run). Screenshots go
to test-artifacts/, and to docs/cell-marks.png (JupyterLab's) and
docs/cell-marks-nb7.png (Notebook 7's), the pictures docs/views.md shows, when missing or
NBDURABLE_UPDATE_SCREENSHOT=1. Chromium is Debian's; never ``playwright install``.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
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
from nbclient.exceptions import CellExecutionError

from nbdurable import commands
from nbdurable import status as ops
from nbdurable.store import open_store

pytestmark = pytest.mark.browser

SCREENSHOT = REPO_ROOT / "docs" / "cell-marks.png"
NB7_SCREENSHOT = REPO_ROOT / "docs" / "cell-marks-nb7.png"
UPDATE_SCREENSHOT = os.environ.get("NBDURABLE_UPDATE_SCREENSHOT") == "1"
NOTEBOOK = "marks.ipynb"
# XPath: an element whose classes include jp-Cell (not jp-CellHeader).
CELL = "contains(concat(' ', normalize-space(@class), ' '), ' jp-Cell ')"
RUN_ID = NOTEBOOK  # the notebook's path relative to the store's parent

SETUP = "%load_ext nbdurable\nfrom nbdurable import step\nimport time"
PLAN = "%%step plan\ntime.sleep(0.3)  # think\nplan = ['alpha', 'beta', 'gamma']"
RESEARCH = "%%step research\nfound = [step(f'ask:{q}', str.upper, q) for q in plan]"
HANDLE = "%%step handle\nimport threading\nlock = threading.Lock()"
UNNAMED = "%%step\nwords = sum(len(f) for f in found)"
REVISE = "%%step revise\ndraft = 'v1'"
PINME = "%%step pinme\nsummary = len(found)"
EXTRA = "%%step extra\nextra = draft * 2"
BROKEN = "%%step broken\nraise RuntimeError('the model timed out')"
LATER = "%%step later\nreport = draft.upper()"
SLOW = (
    "%%step slow\nticks = [step(f'tick:{i}', lambda i: (time.sleep(0.1), i)[1], i)\n"
    "         for i in range(30)]"
)
FIRST = [SETUP, PLAN, RESEARCH, HANDLE, UNNAMED, REVISE, PINME, BROKEN, LATER]
PANEL = "%step panel"
SECOND = [SETUP, PLAN, RESEARCH, HANDLE, UNNAMED, REVISE, PINME, EXTRA, BROKEN, LATER, SLOW, PANEL]


def _expected(unnamed_id: str) -> dict[str, tuple[str, str]]:
    """Step key -> (state, text the mark shows) for the notebook as saved."""
    return {
        "name:plan": ("replayed", "↻ replayed"),
        "name:research": ("replayed", "3 calls"),
        "name:handle": ("not replayable", "cannot save lock"),
        f"id:{unnamed_id}": ("replayed", "↻ replayed"),
        "name:revise": ("invalidated", "its code changed"),
        "name:pinme": ("pinned", "stale: its code changed"),
        # It read revise's draft, and revise will run with another literal for it ('v2').
        "name:extra": ("invalidated", "input 'draft' changes (step 'revise' runs first)"),
        "name:broken": ("failed", "the model timed out"),
        "name:later": ("pending", "○ pending"),
        "name:slow": ("pending", "○ pending"),
    }


def _run_until_broken(nb: nbformat.NotebookNode, root: Path, env: dict[str, str]) -> None:
    """Run ``nb`` (in place) as Run All does: it stops at the step that raises."""
    with pytest.raises(CellExecutionError, match="the model timed out"):
        run_notebook(nb, cwd=root, env=env)


def _record(root: Path, store: Path) -> str:
    """Run the notebook twice in real kernels, then edit it on disk; the unnamed step's id."""
    path = root / NOTEBOOK
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    nb = make_notebook(FIRST)
    nbformat.write(nb, path)  # the kernel keys the unnamed step by the saved cell id
    _run_until_broken(nb, root, env)
    second = make_notebook(SECOND)
    for cell, old in zip(second.cells, nb.cells[:7], strict=False):
        cell.id = old.id  # the same cells, as a user's notebook keeps them
    nbformat.write(second, path)
    _run_until_broken(second, root, env)
    with open_store(store) as s:
        commands.set_pin(s, RUN_ID, "name:pinme", True)
    # The warning names a file of this checkout: not in the docs' picture.
    second.cells[3].outputs = [o for o in second.cells[3].outputs if o.output_type != "stream"]
    second.cells[5].source = "%%step revise\ndraft = 'v2'"
    second.cells[6].source = "%%step pinme\nsummary = len(found) + 0"
    nbformat.write(second, path)
    return second.cells[4].id


@pytest.fixture(params=["lab", "notebook"])
def app(request, tmp_path):
    """A JupyterLab or Notebook 7 server with nbdurable's extensions, on 127.0.0.1."""
    require_chromium()
    kind = request.param
    root, store = tmp_path / "root", tmp_path / "root" / ".nbdurable"
    root.mkdir()
    settings = tmp_path / "lab-settings"
    write_settings(settings)
    # The prebuilt frontend as an installed package puts it: <data dir>/labextensions/nbdurable.
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
    ]
    with jupyter_server(kind, tmp_path, root, env, args, f"cell-marks-{kind}.log") as url:
        yield kind, url, root, store


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _wait_idle_kernel(url: str) -> None:
    """Until the notebook's kernel (the server's only one) is started and idle."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, kernels = _get(f"{url}/api/kernels")
        if kernels and all(k["execution_state"] == "idle" for k in kernels):
            return
        time.sleep(0.2)
    raise AssertionError(f"no idle kernel after 60 s: {kernels}")


def test_cell_marks(app):
    from playwright.sync_api import expect, sync_playwright

    kind, url, root, store = app
    unnamed = _record(root, store)
    expected = _expected(unnamed)
    ARTIFACTS.mkdir(exist_ok=True)

    # The endpoint alone: the same states as `nbdurable status`, with no kernel.
    status, reply = _get(f"{url}/nbdurable/api/steps?path={NOTEBOOK}")
    assert status == 200, reply
    with open_store(store) as s:
        rows = {i.key: i.state for i in ops.step_infos(s, RUN_ID, root / NOTEBOOK)}
    assert {c["key"]: c["state"] for c in reply["cells"]} == {k: rows[k] for k in expected}
    assert reply["run"] == RUN_ID
    status, reply = _get(f"{url}/nbdurable/api/steps?path=../etc/passwd")
    assert status == 400 and "not a notebook path" in reply["message"], reply
    status, reply = _get(f"{url}/nbdurable/api/steps?path=missing.ipynb")
    assert status == 404 and reply["message"] == "no notebook at 'missing.ipynb'", reply

    page_url = f"{url}/lab/tree/{NOTEBOOK}" if kind == "lab" else f"{url}/notebooks/{NOTEBOOK}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        console: list[str] = []
        page.on("console", lambda m: console.append(m.text))
        try:

            def mark(key: str):
                return page.locator(f'.nbd-mark[data-nbd-key="{key}"]')

            def check_all(where: str) -> None:
                for key, (state, text) in expected.items():
                    expect(mark(key), f"{key} {where}").to_have_attribute(
                        "data-nbd-state", state, timeout=30_000
                    )
                    expect(mark(key), f"{key} {where}").to_contain_text(text)
                assert page.locator(".nbd-mark").count() == len(expected), where
                # Each mark sits in the cell it describes.
                for key, source in (("name:plan", PLAN), ("name:later", LATER)):
                    cell = page.locator(".jp-Cell", has=mark(key))
                    expect(cell.locator(".jp-InputArea-editor")).to_contain_text(
                        source.splitlines()[1]
                    )
                # No mark is wider than its cell; no value is split across lines.
                for m in page.locator(".nbd-mark").all():
                    m.scroll_into_view_if_needed()
                    box = m.bounding_box()
                    cell = m.locator(f"xpath=ancestor::div[{CELL}][1]")
                    outer = cell.bounding_box()
                    code = cell.locator(".jp-InputArea-editor").bounding_box()
                    what = (where, m.get_attribute("data-nbd-key"), box, outer, code)
                    assert box and outer and code and box["height"] >= 12, what
                    assert box["x"] + box["width"] <= outer["x"] + outer["width"] + 1, what
                    assert box["y"] + box["height"] <= code["y"] + 1, what  # above the code
                    for part in m.locator(".nbd-mark-badge, .nbd-mark-fact").all():
                        h = part.bounding_box()["height"]
                        assert h < 24, (where, part.inner_text(), h)

            page.goto(page_url, timeout=60_000)
            check_all("on open")
            page.mouse.move(0, 0)
            notebook = page.locator(".jp-Notebook")
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-wide.png"))
            doc = SCREENSHOT if kind == "lab" else NB7_SCREENSHOT
            if UPDATE_SCREENSHOT or not doc.exists():
                page.set_viewport_size({"width": 1100, "height": 1500})
                page.locator(".jp-Cell").first.scroll_into_view_if_needed()
                page.wait_for_timeout(300)  # the layout settles
                notebook.screenshot(path=str(doc))
                page.set_viewport_size({"width": 1400, "height": 1400})

            page.reload()
            check_all("after a reload")

            page.set_viewport_size({"width": 400, "height": 1400})
            if kind == "lab":  # as a user would on a phone: the file browser closed
                page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()
            check_all("at 400 px")
            page.locator(".jp-Cell", has=mark("name:broken")).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-400.png"))
            page.set_viewport_size({"width": 1400, "height": 1400})

            # An edit not saved yet: the mark says so; saving shows what the next run does.
            editor = page.locator(".jp-Cell", has=mark("name:plan")).locator(".cm-content")
            editor.click()
            page.keyboard.press("ControlOrMeta+End")
            page.keyboard.type("  # edited")
            expect(mark("name:plan")).to_have_attribute("data-nbd-state", "edited")
            expect(mark("name:plan")).to_contain_text("not saved")
            expect(mark("name:research")).to_have_attribute("data-nbd-state", "replayed")
            page.keyboard.type("\nplan.append('delta')")
            page.keyboard.press("ControlOrMeta+s")
            expect(mark("name:plan")).to_have_attribute("data-nbd-state", "invalidated")
            expect(mark("name:plan")).to_contain_text("its code changed")
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-saved.png"))

            # Running: the mark says so, and its sub-step counter moves.
            _wait_idle_kernel(url)
            page.locator(".jp-Cell").first.locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            slow = mark("name:slow")
            page.locator(".jp-Cell", has=slow).locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            expect(slow).to_have_attribute("data-nbd-state", "running", timeout=30_000)
            counter = slow.locator(".nbd-mark-fact")
            expect(counter).to_have_text(re.compile(r"\d+ sub-steps? recorded"), timeout=10_000)
            first = counter.text_content()
            expect(counter).not_to_have_text(first, timeout=10_000)
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-running.png"))
            expect(slow).to_have_attribute("data-nbd-state", "recorded", timeout=30_000)
            expect(slow).to_contain_text("30 calls")

            # The step panel, then a kernel restart: the dead panel says so in one line,
            # offers no button, and shows the steps as the store holds them.
            panel_cell = page.locator(".jp-Cell").nth(SECOND.index(PANEL))
            panel_cell.locator(".cm-content").click()
            page.keyboard.press("Shift+Enter")
            live = panel_cell.locator(".nbd-panel")
            expect(live.locator('.nbd-step[data-step="slow"]')).to_have_attribute(
                "data-state", "recorded", timeout=30_000
            )
            # A save shows in the live panel with no cell run: research's code edited
            # and saved, its row turns invalidated (the kernel stays idle meanwhile).
            _wait_idle_kernel(url)
            research = live.locator('.nbd-step[data-step="research"]')
            expect(research).to_have_attribute("data-state", "may run")  # plan was edited
            editor = page.locator(".jp-Cell", has=mark("name:research")).locator(".cm-content")
            editor.click()
            page.keyboard.press("ControlOrMeta+End")
            page.keyboard.type("\nfound.sort()")  # code: a comment alone changes nothing
            page.keyboard.press("ControlOrMeta+s")
            expect(research).to_have_attribute("data-state", "invalidated", timeout=15_000)
            expect(research.locator(".nbd-detail")).to_have_text("its code changed")
            expect(research.locator(".nbd-why")).to_have_text("+ found.sort()")
            expect(mark("name:research")).to_have_attribute("data-nbd-state", "invalidated")
            _, kernels = _get(f"{url}/api/kernels")
            assert [k["execution_state"] for k in kernels] == ["idle"], kernels
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-panel-saved.png"))
            page.get_by_role("menuitem", name="Kernel", exact=True).click()
            page.get_by_role("menuitem", name=re.compile(r"^Restart Kernel…")).first.click()
            page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click()
            note = panel_cell.locator(".nbd-snapshot-note")
            expect(note).to_have_text(
                re.compile(r"^The kernel restarted: this panel is not live\."), timeout=30_000
            )
            expect(live).to_be_hidden()
            expect(panel_cell.get_by_role("button")).to_have_count(0)
            snap_slow = panel_cell.locator('.nbd-snapshot [data-nbd-key="name:slow"]')
            expect(snap_slow).to_have_attribute("data-nbd-state", "recorded")
            expect(snap_slow).to_contain_text("30 calls")
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-restarted.png"))

            # Saved and reloaded: neither "model not found" nor the text saved when the
            # panel was drawn, but the store's steps now.
            page.keyboard.press("ControlOrMeta+s")
            page.wait_for_timeout(1000)
            _wait_idle_kernel(url)
            console.clear()
            page.reload()
            panel_cell = page.locator(".jp-Cell").nth(SECOND.index(PANEL))
            panel_cell.scroll_into_view_if_needed()  # long notebooks render lazily
            note = panel_cell.locator(".nbd-snapshot-note")
            expect(note).to_have_text(
                re.compile(r"^The notebook was reopened: this panel is not live\."), timeout=30_000
            )
            expect(panel_cell.get_by_text("model not found")).to_be_hidden()
            # Its output forgot the dead widget at the restart: saved so, the widget
            # manager has nothing to look for, and says nothing in the console either.
            page.wait_for_timeout(1000)  # the widget manager renders asynchronously
            assert not [m for m in console if "model not found" in m], console
            snap_slow = panel_cell.locator('.nbd-snapshot [data-nbd-key="name:slow"]')
            expect(snap_slow).to_have_attribute("data-nbd-state", "recorded")
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-reloaded-panel.png"))
        finally:
            page.screenshot(path=str(ARTIFACTS / f"cell-marks-{kind}-final.png"), full_page=True)
            browser.close()
