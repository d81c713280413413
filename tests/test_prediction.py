"""The panel, ``%step list`` and ``nbdurable status`` say what running a step does.

One decision (:func:`nbdurable.verdict.invalid_reason`) serves the step
runner and every view. Here an upstream step runs again in a real kernel
with a new value: before the downstream step runs, the panel and ``%step
list`` (in that kernel) and ``nbdurable status`` (no kernel) all say it is
invalidated, and running it (in a new kernel) indeed executes its body.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text

from nbdurable import cli

UP = "%%step up\nx = n + 1"
DOWN = "%%step down\ny = x * 10\nprint('computed', y)"


def _text(nb, index: int) -> str:
    return stream_text(outputs_of(nb, index))


@pytest.mark.kernel
def test_an_upstream_rerun_invalidates_downstream_everywhere(tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    path = tmp_path / "nb.ipynb"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(path)}
    cells = ["%load_ext nbdurable", "n = 1", UP, DOWN]
    nbformat.write(make_notebook(cells), path)
    first = make_notebook(
        cells
        + [
            # The upstream step runs again in this kernel, on a new value of n.
            "n = 5\nget_ipython().run_cell_magic('step', 'up', 'x = n + 1')",
            "%step list",
            "import json, nbdurable\np = nbdurable.panel()\n"
            "print(json.dumps({r.info.label: [r.state, r.info.detail] for r in p.rows.values()}))",
        ]
    )
    out = run_notebook(first, cwd=tmp_path, env=env, startup_timeout=180, timeout=300)
    assert _text(out, 3) == "computed 20\n"
    listed = {line.split()[1]: line.split(None, 3)[2] for line in _text(out, 5).splitlines()[2:]}
    assert listed == {"up": "recorded", "down": "invalidated"}, _text(out, 5)
    assert "input 'x' changed" in _text(out, 5)
    rows = json.loads(_text(out, 6))
    assert rows == {"up": ["recorded", ""], "down": ["invalidated", "input 'x' changed"]}, rows

    # No kernel: the store shows 'up' recorded after 'down' read its x.
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    assert cli.main(["status", str(path), "--json"]) == 0
    steps = {s["label"]: s for s in json.loads(capsys.readouterr().out)["steps"]}
    assert steps["up"]["state"] == "recorded", steps
    assert steps["down"]["state"] == "invalidated", steps
    assert steps["down"]["detail"] == "input 'x' changed (step 'up' ran again)", steps

    # What running does: in a new kernel with n = 5, 'up' replays and 'down' executes.
    second = make_notebook(["%load_ext nbdurable", "n = 5", UP, DOWN, "%step list"])
    out = run_notebook(second, cwd=tmp_path, env=env, startup_timeout=180, timeout=300)
    assert _text(out, 3).endswith("computed 60\n"), _text(out, 3)
    listed = {line.split()[1]: line.split()[2] for line in _text(out, 4).splitlines()[2:]}
    assert listed == {"up": "replayed", "down": "recorded"}, _text(out, 4)
