"""A real Jupyter server and Debian's Chromium for the browser tests.

Shared by every test that drives JupyterLab 4 or Notebook 7 (mark them
``@pytest.mark.browser``)::

    with jupyter_server("lab", tmp_path, root, env, ["--LabApp.expose_app_in_browser=True"]) as url:
        ...  # open url + "/lab/tree/nb.ipynb" in Chromium (CHROMIUM, CHROMIUM_ARGS)

The server listens on 127.0.0.1 only, with no token; it and the kernels it
started are ended together (one process group), and its log is kept in
``test-artifacts/`` for a failure to be read after the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from kernel_util import REPO_ROOT

CHROMIUM = os.environ.get("NBDURABLE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO_ROOT / "test-artifacts"


def require_chromium() -> None:
    """Fail the test (not its setup) with one line saying what to install."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"chromium not found at {CHROMIUM}: the browser test needs Debian's chromium "
            "(`apt-get install chromium`, as .ci/run does) or NBDURABLE_CHROMIUM=/path",
            pytrace=False,
        )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_settings(settings: Path, theme: str = "JupyterLab Light") -> None:
    """Lab user settings: a fixed theme and no news / update toasts over the screenshot."""
    apputils = settings / "@jupyterlab" / "apputils-extension"
    apputils.mkdir(parents=True, exist_ok=True)
    (apputils / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))
    (apputils / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )


def tail(path: Path, n: int = 40) -> str:
    """The last ``n`` lines of a log."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@contextlib.contextmanager
def jupyter_server(
    kind: str,
    tmp_path: Path,
    root: Path,
    env: dict[str, str],
    args: Sequence[str] = (),
    log_name: str | None = None,
) -> Iterator[str]:
    """``jupyter lab`` or ``jupyter notebook`` serving ``root``; yields its URL once it answers.

    ``env`` is the server's whole environment; ``args`` are added to its
    command line. Fails with the log's tail if it has not answered
    ``/api/status`` within 60 s or exits first.
    """
    log_path = tmp_path / f"{kind}.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in the teardown
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            kind,
            "--allow-root",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--IdentityProvider.token=",
            "--ServerApp.password=",
            f"--ServerApp.root_dir={root}",
            *args,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"jupyter {kind} did not start:\n" + tail(log_path))
            time.sleep(0.2)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(log_path, ARTIFACTS / (log_name or f"{kind}.log"))
