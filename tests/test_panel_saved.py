"""The text a step panel leaves in the saved notebook follows the run (a real kernel).

Where no widget can be drawn (a viewer, a notebook reopened without its
kernel) the panel's output shows its ``text/plain``; it must be where the run
stood when the notebook was saved, not when the panel was first drawn.
"""

from __future__ import annotations

import pytest
from kernel_util import make_notebook, run_notebook

pytestmark = pytest.mark.kernel


def _panel_text(nb) -> str:
    outputs = [o for o in nb.cells[1].outputs if "text/plain" in o.get("data", {})]
    assert len(outputs) == 1, nb.cells[1].outputs
    assert "application/vnd.jupyter.widget-view+json" in outputs[0]["data"]
    return outputs[0]["data"]["text/plain"]


def test_saved_panel_text_follows_the_run(tmp_path):
    cells = [
        "%load_ext nbdurable",
        "%step panel",
        "%%step first\nx = 1",
        "%%step second\ny = x + 1",
    ]
    env = {"NBDURABLE_DIR": str(tmp_path / "store")}
    nb = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    text = _panel_text(nb)
    rows = {line.split()[1]: line.split()[2] for line in text.splitlines()[3:]}
    assert rows == {"first": "recorded", "second": "recorded"}, text
    assert "2 recorded · 0 pending" in text, text

    # Run again in a new kernel: the saved text says what replayed.
    nb = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
    text = _panel_text(nb)
    assert "replay saved" in text and "(2 steps)" in text, text
