"""What a kernel prints to its own terminal (the server's console, nbconvert's log).

ipykernel copies everything written to file descriptors 1 and 2 to the
kernel's original terminal as well as to the frontend. nbdurable writes a
marker through those descriptors to know when a step's output has all
arrived (``nbdurable.ipython.kernelio``): the copy must carry the step's text
and never the marker's control bytes, or ``grep`` calls a server log binary
and a terminal shows ``^@^F^U``.
"""

from __future__ import annotations

import os
import re

import pytest
from jupyter_client import KernelManager
from kernel_util import REPO_ROOT, kernel_name, private_sockets

pytestmark = pytest.mark.kernel

STEP = (
    "%%step noisy\nimport os, sys\n"
    "os.system('echo from-system')\n"
    "os.write(2, b'to-fd-2\\n')\n"
    "os.write(1, b'x' * 70000 + b'\\n')  # more than one pipe read\n"
    "print('printed')"
)


def test_no_control_bytes_reach_the_kernels_terminal(tmp_path):
    # Apart, so the two descriptors' copies cannot interleave in one file.
    out_path, err_path = tmp_path / "kernel.out", tmp_path / "kernel.err"
    env = {**os.environ, "NBDURABLE_DIR": str(tmp_path / "store"), "JPY_SESSION_NAME": ""}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.pop("PYTEST_CURRENT_TEST", None)  # with it, ipykernel does not watch fd 1 and 2
    shown: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            shown.append(msg["content"]["text"])

    with private_sockets() as sockets, open(out_path, "wb") as out, open(err_path, "wb") as err:
        km = KernelManager(kernel_name=kernel_name(), **sockets)
        km.start_kernel(cwd=str(tmp_path), env=env, stdout=out, stderr=err)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=180)
            for code in (
                "%load_ext nbdurable\n%step run terminal",
                STEP,
                STEP,
            ):  # recorded, then replayed
                reply = kc.execute_interactive(code, output_hook=hook, timeout=120)
                assert reply["content"]["status"] == "ok", reply["content"]
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    stdout, stderr = out_path.read_bytes(), err_path.read_bytes()
    terminal = stdout + stderr
    # The copy still reaches the terminal: what the step wrote through its descriptors.
    assert b"from-system" in stdout and b"to-fd-2" in stderr, (stdout[-500:], stderr[-2000:])
    assert stdout.count(b"x" * 70000) == 1, "the long line, copied once (the replay: not)"
    controls = re.findall(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", terminal)
    assert not controls, f"control bytes in the kernel's terminal: {sorted(set(controls))}"
    # ... and the frontend got the text, without them either.
    text = "".join(shown)
    assert text.count("from-system") == 2 and "printed" in text, text[:500]
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", text)
