"""What a user sees when an old record is written back into a store, in a real kernel.

A step with a sub-step is recorded, cleared with ``%step clear``, and its old
rows are then written back by someone with write access to the store. The
next run says in one line, per record, that it is not current, and runs the
step again (its call too): never the cleared result, never a traceback.
"""

from __future__ import annotations

import pytest
from kernel_util import outputs_of, ran, run_saved, stream_text

from nbdurable.store import open_store

pytestmark = pytest.mark.kernel

SETUP = (
    "%load_ext nbdurable\n"
    "from nbdurable import step\n"
    "def ran(name):\n"
    "    with open('ran.log', 'a') as f:\n"
    "        f.write(name + '\\n')\n"
    "def ask():\n"
    "    ran('call')\n"
    "    return {'approved': not __import__('os').path.exists('revoked')}"
)
STEP = "%%step decide\nran('body')\ndecision = step('ask', ask)\nprint(decision)"


def _rows(store_dir):
    """Every step and sub-step row of the store, as stored (signed bytes)."""
    with open_store(store_dir) as s:
        keys = [k for k in s.scan("r/") if k.split("/")[2] in ("s", "u")]
        return {k: s.read(k) for k in keys}


def test_a_cleared_step_written_back_is_said_and_runs_again(tmp_path):
    nb = run_saved(tmp_path, [SETUP, STEP])
    assert stream_text(outputs_of(nb, 1)) == "{'approved': True}\n"
    old = _rows(tmp_path / "store")
    assert len(old) == 2, old

    (tmp_path / "revoked").touch()  # what the call answers now
    nb = run_saved(tmp_path, [SETUP, "%step clear decide"])
    assert "cleared: decide" in stream_text(outputs_of(nb, 1))
    with open_store(tmp_path / "store") as s:
        s.write(old)  # the cleared rows, put back

    nb = run_saved(tmp_path, [SETUP, STEP])
    outputs = outputs_of(nb, 1)
    assert stream_text(outputs) == "{'approved': False}\n", outputs
    said = stream_text(outputs, "stderr")
    assert "is not current" in said and "the step runs again" in said, said
    assert "Traceback" not in said
    assert ran(tmp_path) == {"body": 2, "call": 2}
