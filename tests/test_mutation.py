"""In-place mutation the syntax cannot see is still recorded (in-process shell).

``random.shuffle(xs)`` mutates ``xs`` through a function call, not a method
of ``xs``; the engine fingerprints every input again after the step runs and
records the ones that changed, so a replay restores the mutated value.
"""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

import nbdurable
from nbdurable.durable import session as engine


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDURABLE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("NBDURABLE_NOTEBOOK", str(tmp_path / "mut.ipynb"))
    sh = InteractiveShell.instance()
    engine.reset_session()
    nbdurable.load_ipython_extension(sh)
    yield sh
    nbdurable.unload_ipython_extension(sh)
    engine.reset_session()
    sh.reset(new_session=False)


def _fresh_kernel(sh):
    """What a kernel restart does to the namespace and the session."""
    engine.reset_session()
    sh.reset(new_session=False)
    nbdurable.load_ipython_extension(sh)


def test_mutation_through_a_call_is_recorded_and_replayed(shell):
    cells = [
        "%%step make\nxs = list(range(20))",
        "%%step mix\nimport random\nrandom.Random(7).shuffle(xs)\nrandom.shuffle(xs)",
    ]
    for cell in cells:
        assert shell.run_cell(cell).success
    mixed = list(shell.user_ns["xs"])
    assert mixed != list(range(20))

    _fresh_kernel(shell)
    for cell in cells:
        assert shell.run_cell(cell).success
    assert shell.user_ns["xs"] == mixed, "the replayed step restores the mutated list"
    status = engine.get_session().status
    assert {k: v[0] for k, v in status.items()} == {"name:make": "replayed", "name:mix": "replayed"}


def test_a_module_used_by_a_step_is_not_recorded_as_its_output(shell):
    assert shell.run_cell("import time").success
    assert shell.run_cell("%%step nap\ntime.sleep(0)\nt = 1").success
    session = engine.get_session()
    got = session.store.get(session.keys.step("name:nap"))
    names = [v["name"] for v in got[0]["variables"]]
    assert names == ["t"], names
