"""A newcomer's first steps, timed: clone, install the ``[lab]`` extra, replay a step in JupyterLab.

What the README's "Get it" and "Quickstart in JupyterLab" tell a new user,
done by a script on this machine, each stage timed by the wall clock:

1. ``git clone`` of this repository into a new folder;
2. a new virtual environment and ``python -m pip install -e '.[lab]'`` in it
   (the network and pip's cache decide most of this figure: say which);
3. ``jupyter lab`` from that environment (with what a headless machine
   needs: ``--allow-root --ip 127.0.0.1``, no token), and
   ``notebooks/quickstart.ipynb`` opened in Debian's Chromium;
4. Run All: the ``squares`` step runs its five slow calls;
5. Restart the kernel and Run All again: ``squares`` must *replay* (its grey
   ``replayed step 'squares'`` line, its printed list back, no call made).

Run it from a clone, with Playwright importable (the test extra has it)::

    python bench/newcomer.py            # clones this repository's HEAD
    python bench/newcomer.py --keep DIR # ... into DIR, kept afterwards

It prints each stage's seconds and the total; it exits 1, naming the stage,
if any stage fails. Not a test: it installs from the package index, which a
test must not depend on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from jupyter_util import CHROMIUM, CHROMIUM_ARGS, free_port  # noqa: E402

KERNEL_READY = """() => {
    const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = nb && nb.sessionContext && nb.sessionContext.session
        && nb.sessionContext.session.kernel;
    return k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""
RESTART = "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.restart()"
CLEAR = "() => { window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs'); }"


def _stage(name: str, times: dict[str, float], fn):
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - one line naming the stage, as the CLI does
        print(f"newcomer: stage {name!r} failed: {exc}".splitlines()[0], file=sys.stderr)
        raise SystemExit(1) from None
    times[name] = time.monotonic() - t0
    print(f"  {name:<34} {times[name]:7.1f} s", flush=True)
    return out


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        raise RuntimeError(f"{' '.join(cmd[:4])} exited {proc.returncode}: {tail[0]}")


def _lab(venv: Path, clone: Path, home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NBDURABLE_", "PYTHON"))}
    env.update(HOME=str(home), JUPYTER_CONFIG_DIR=str(home / ".jupyter"))
    proc = subprocess.Popen(
        [str(venv / "bin" / "jupyter"), "lab", "--allow-root", "--no-browser",
         "--ip=127.0.0.1", f"--port={port}", "--IdentityProvider.token=",
         "--LabApp.expose_app_in_browser=True"],
        cwd=clone, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/api/status", timeout=2):
                return proc, url
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.3)
    raise RuntimeError("jupyter lab did not answer within 120 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="clone into this folder and keep it")
    args = ap.parse_args()
    from playwright.sync_api import expect, sync_playwright

    work = args.keep or Path(tempfile.mkdtemp(prefix="nbd-newcomer-"))
    work.mkdir(parents=True, exist_ok=True)
    clone, venv, home = work / "nbdurable", work / "venv", work / "home"
    home.mkdir(exist_ok=True)
    times: dict[str, float] = {}
    print(f"newcomer: {os.uname().nodename}, load {os.getloadavg()[0]:.2f}", flush=True)
    _stage("git clone", times, lambda: _run(["git", "clone", "-q", str(ROOT), str(clone)], work))

    def install() -> None:
        _run([sys.executable, "-m", "venv", str(venv)], work)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        _run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", ".[lab]"], clone, env
        )

    _stage("pip install -e '.[lab]'", times, install)
    proc, url = _stage("jupyter lab answers", times, lambda: _lab(venv, clone, home))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            squares = page.locator(".jp-OutputArea-output").filter(has_text="[0, 1, 4, 9, 16]")

            def open_nb() -> None:
                page.goto(f"{url}/lab/tree/notebooks/quickstart.ipynb", timeout=60_000)
                page.wait_for_function(KERNEL_READY, timeout=120_000)

            def run_all(expect_text: str) -> None:
                page.evaluate(
                    "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"
                )
                expect(
                    page.locator(".jp-OutputArea").filter(has_text=expect_text).first
                ).to_be_visible(timeout=120_000)
                expect(squares.first).to_be_visible(timeout=120_000)

            _stage("open quickstart, kernel idle", times, open_nb)
            _stage("Run All (records)", times, lambda: run_all("scratch ran at"))

            def restart_and_replay() -> None:
                page.evaluate(RESTART)
                page.wait_for_function(KERNEL_READY, timeout=120_000)
                page.evaluate(CLEAR)
                run_all("replayed step 'squares'")

            _stage("restart, Run All (replays)", times, restart_and_replay)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(15)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"  {'total':<34} {sum(times.values()):7.1f} s (load now {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
