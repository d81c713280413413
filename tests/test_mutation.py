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


AGENT = (
    "class Agent:\n"
    "    def __init__(self):\n"
    "        self.pending = (i for i in ())  # a generator: so the agent cannot be saved\n"
    "        self.factor = 2\n"
    "    def run(self, x):\n"
    "        return x * self.factor\n"
)


# `agent` cannot be saved: the step that binds it says so (its one line)
@pytest.mark.filterwarnings("ignore::nbdurable.NbdurableWarning")
def test_a_method_call_that_changes_nothing_leaves_the_object_where_it_came_from(shell):
    # `agent` cannot be saved; `ask` calls its method and changes nothing, so it is
    # left out of ask's record. It must also stay the object `make` made (its
    # origin), as on replay, where ask's record does not mention it: otherwise
    # `read` compared `agent` one way when recorded and another when replayed,
    # and ran again in every fresh kernel ("input 'agent' changed").
    cells = [
        AGENT,
        "%%step make\nagent = Agent()",
        "%%step ask\nr = agent.run(2)",
        "%%step read\ns = agent.run(3)",
    ]
    for cell in cells:
        assert shell.run_cell(cell).success
    session = engine.get_session()
    read = session.store.get(session.keys.step("name:read"))[0]
    assert read["input_from"] == {"agent": "name:make"}

    _fresh_kernel(shell)
    for cell in cells:
        assert shell.run_cell(cell).success
    status = {k: v[0] for k, v in engine.get_session().status.items()}
    # make's agent cannot be saved: its body runs again (its one line); the rest replay
    assert status == {"name:make": "recorded", "name:ask": "replayed", "name:read": "replayed"}
    assert shell.user_ns["s"] == 6


# `agent` cannot be saved: the step that binds it says so (its one line)
@pytest.mark.filterwarnings("ignore::nbdurable.NbdurableWarning")
def test_a_method_call_that_changes_the_object_still_counts(shell):
    cells = [
        AGENT,
        "%%step make\nagent = Agent()",
        "%%step tune\nagent.factor = 5",
        "%%step read\ns = agent.run(3)",
    ]
    for cell in cells:
        assert shell.run_cell(cell).success
    session = engine.get_session()
    read = session.store.get(session.keys.step("name:read"))[0]
    assert read["input_from"] == {"agent": "name:tune"}
    shell.run_cell("%%step tune\nagent.factor = 7")
    assert shell.run_cell("%%step read\ns = agent.run(3)").success
    assert shell.user_ns["s"] == 21, "read used the changed agent"
