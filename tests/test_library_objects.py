"""Library objects as real notebooks hold them, replayed exactly, in real kernels.

Each test is a minimal reproduction of one way real notebooks replayed
wrongly, through the public API only (``%load_ext nbdurable``, ``%%step``,
``nbdurable.step``): a notebook is run in a fresh kernel, then again in
another fresh kernel on the same store, and what a user sees is compared
with what a plain run shows or with what the first run showed. Each failed
before its mechanism was fixed (see docs/steps.md, "Library objects"):

- a model client made in a plain cell and called by a helper counts as changed
  (``client.chat`` is a ``cached_property`` filled on first use), so the step
  is never replayed and its requests are sent on every run;
- a step whose body reruns claims that no recorded call repeats while its
  direct SDK calls are sent again, and what its replayed ``step()`` calls
  printed is not shown again;
- a LangGraph app whose in-memory checkpointer a step filled through a helper
  comes back empty;
- scikit-learn reads ``/proc`` and ``/sys`` files and sets environment
  variables when imported: they count as the step's inputs, so it never replays;
- a library class imported by one step changes, for the steps that use it,
  whenever that step is edited;
- warnings and log records that an object's ``__getstate__`` emits while
  nbdurable pickles or fingerprints it appear in the cell;
- smaller ones: a warning's line number, a plain cell's class attribute a step
  appended to, ``__slots__``, ``__init__`` run again by ``__reduce__``, and an
  exception's ``__cause__`` and ``__traceback__``.

The optional packages (scikit-learn, LangGraph, the model SDKs) are skipped
where they are not installed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text

pytestmark = pytest.mark.kernel

HEAD = "%load_ext nbdurable\nfrom nbdurable import step"


class Notebook:
    """One notebook's store and working directory; each :meth:`run` is a fresh kernel."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            "NBDURABLE_DIR": str(root / "store"),
            "NBDURABLE_NOTEBOOK": str(root / "lib.ipynb"),
        }

    def run(self, cells: list[str], allow_errors: bool = False):
        nb = make_notebook(cells)
        return run_notebook(nb, cwd=self.root, env=self.env, timeout=180, allow_errors=allow_errors)


def replayed(nb, index: int) -> bool:
    """Whether code cell ``index`` shows nbdurable's note that its step was replayed."""
    return any(
        o.get("metadata", {}).get("nbdurable", {}).get("note") == "replayed"
        for o in outputs_of(nb, index)
    )


def stderr(nb, index: int) -> str:
    return stream_text(outputs_of(nb, index), "stderr")


def said(nb, index: int) -> str:
    """The stderr of a cell on one line (nbdurable's warnings wrap)."""
    return " ".join(stderr(nb, index).split())


# -- 1. model clients made in a plain cell, called by a helper ------------------------


@pytest.fixture
def server(tmp_path):
    from llm_server import LLMServer

    with LLMServer(log=tmp_path / "requests.jsonl", lifetime=600) as s:
        yield s


def client_cells(server, sdk: str) -> list[str]:
    """A client in a plain cell, a helper calling it directly, a history list."""
    if sdk == "openai":
        make = f"client = openai.OpenAI(api_key='sk-test', base_url={server.openai_base_url!r})"
        call = (
            "    r = client.chat.completions.create(model='m', messages=msgs)\n"
            "    return r.choices[0].message.content"
        )
    else:
        make = (
            "client = anthropic.Anthropic(api_key='sk-ant-test', "
            f"base_url={server.anthropic_base_url!r})"
        )
        call = (
            "    r = client.messages.create(model='m', max_tokens=20, messages=msgs)\n"
            "    return r.content[0].text"
        )
    return [
        f"{HEAD}\nimport {sdk}",
        make,
        f"messages = [{{'role': 'user', 'content': 'hello'}}]\ndef ask(msgs):\n{call}",
    ]


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_client_called_by_a_helper_is_not_changed_by_the_call(tmp_path, server, sdk):
    # `client.chat` / `client.messages` are cached_property: the helper's first
    # call adds them to the client's __dict__, which the change detection takes for
    # a change of `client`; `client` cannot be pickled (an RLock), so the step is
    # recorded "not replayable" and its request is sent again on every run. The
    # history the step extended, and the step reading it, then change on every run.
    pytest.importorskip(sdk)
    cells = [
        *client_cells(server, sdk),
        "%%step chat\nanswer = ask(messages)\n"
        "messages.append({'role': 'assistant', 'content': answer})\nprint(answer)",
        "%%step summary\nprint(len(messages), messages[-1]['content'])",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert server.total == 1
    assert "cannot be saved" not in said(first, 3), said(first, 3)
    again = book.run(cells)
    assert server.total == 1, "the step sent its request again"
    assert replayed(again, 3) and replayed(again, 4)
    for i in (3, 4):
        assert stream_text(outputs_of(again, i)) == stream_text(outputs_of(first, i))


def test_a_body_that_runs_again_does_not_claim_no_call_repeats(tmp_path, server):
    # `holder` cannot be saved, so the body runs again on every run; its direct
    # SDK call is sent again, yet the warning says "no recorded call repeats".
    pytest.importorskip("openai")
    o = server.openai_base_url
    cells = [
        f"{HEAD}\nimport openai, threading",
        f"client = openai.OpenAI(api_key='sk-test', base_url={o!r})",
        "%%step direct\nholder = threading.Lock()\n"
        "r = client.chat.completions.create(model='m', messages=[{'role': 'user', "
        "'content': 'direct'}])\nprint(r.choices[0].message.content)",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    warned = said(first, 2)
    assert "cannot be saved: holder" in warned, warned
    sent = server.total
    again = book.run(cells)
    resent = server.total - sent
    # The step's HTTP is recorded (the default): the rerun body's direct call is
    # answered from the record, and the warning says exactly that.
    assert resent == 0, f"{resent} direct call(s) sent again on the rerun"
    assert "its HTTP requests replay; what else it does" in warned, warned
    # And the rerun says why, in one line, each time (before: only the run that
    # recorded it did, so a fresh kernel's cell ran its body without a word).
    for run in (again, book.run(cells)):
        assert said(run, 2).count("NbdurableWarning") == 1, said(run, 2)
        assert "step 'direct' runs again: its variables holder cannot be restored" in said(
            run, 2
        ), said(run, 2)


def test_what_replayed_substeps_printed_is_shown_when_the_body_runs_again(tmp_path):
    # The body runs again (`holder`); its step() call replays, so the print inside
    # the function is not made: the cell's output differs from the first run's.
    cells = [
        f"{HEAD}\nimport threading",
        "def ask(q):\n    print('asking', q)\n    return q.upper()",
        "%%step talk\nholder = threading.Lock()\nanswer = step('q', ask, 'hi')\nprint(answer)",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert stream_text(outputs_of(first, 2)) == "asking hi\nHI\n"
    again = book.run(cells)
    assert stream_text(outputs_of(again, 2)) == "asking hi\nHI\n"


# -- 2. LangGraph: an in-memory checkpointer filled through a helper ------------------

GRAPH = (
    "import operator\n"
    "from typing import Annotated, TypedDict\n"
    "from langgraph.graph import END, START, StateGraph\n"
    "from langgraph.checkpoint.memory import {saver}\n"
    "class State(TypedDict):\n"
    "    messages: Annotated[list, operator.add]\n"
    "def reply(state):\n"
    "    return {{'messages': ['reply to ' + state['messages'][-1]]}}\n"
    "graph = StateGraph(State)\n"
    "graph.add_node('reply', reply)\n"
    "graph.add_edge(START, 'reply')\n"
    "graph.add_edge('reply', END)\n"
    "app = graph.compile(checkpointer={saver}())\n"
    "config = {{'configurable': {{'thread_id': '1'}}}}\n"
    "def chat(text):\n"
    "    return app.invoke({{'messages': [text]}}, config=config)"
)


@pytest.mark.parametrize("saver", ["MemorySaver", "InMemorySaver"])
def test_a_langgraph_checkpointer_filled_by_a_step_is_restored(tmp_path, saver):
    # The step changes `app` only inside its checkpointer (a library object the
    # change detection does not enter) and through a helper (no method call on
    # `app` in its syntax): nothing is recorded, and after the replay the thread's
    # state is empty.
    pytest.importorskip("langgraph")
    cells = [
        HEAD,
        GRAPH.format(saver=saver),
        "%%step talk\nout = chat('hi')\nprint(out['messages'])",
        "print(app.get_state(config).values)",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    state = "{'messages': ['hi', 'reply to hi']}\n"
    assert stream_text(outputs_of(first, 3)) == state
    again = book.run(cells)
    assert stream_text(outputs_of(again, 3)) == state, "the checkpointer came back empty"


# -- 3. scikit-learn: files and environment variables a library reads ----------------

DATA = "import numpy as np\nX = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])"


def test_a_kmeans_step_replays_in_a_fresh_kernel(tmp_path):
    # threadpoolctl reads /proc/self/maps on the first fit, and sklearn /proc/stat
    # and /sys/fs/cgroup files: each is noted as an input file, and differs in every
    # process, so the step runs again on every run ("files 'stat', 'maps' changed").
    pytest.importorskip("sklearn")
    cells = [
        HEAD + "\n" + DATA,
        "%%step cluster\nfrom sklearn.cluster import KMeans\n"
        "km = KMeans(n_clusters=2, n_init=1, random_state=0).fit(X)\n"
        "print(sorted(km.labels_.tolist()))",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert stream_text(outputs_of(first, 1)) == "[0, 0, 1, 1]\n"
    again = book.run(cells)
    assert replayed(again, 1), "the step ran again: " + stream_text(outputs_of(again, 1))


def test_environment_variables_an_import_sets_are_not_inputs(tmp_path, monkeypatch):
    # Importing sklearn runs os.environ.setdefault('KMP_DUPLICATE_LIB_OK', ...) and
    # ('KMP_INIT_AT_FORK', ...): read while unset, they are recorded as inputs
    # "unset". Once sklearn is imported (by the step itself, or by a cell before
    # it) they are set, and the step counts as invalidated.
    pytest.importorskip("sklearn")
    for name in ("KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"):  # set by importorskip here
        monkeypatch.delenv(name, raising=False)
    step_cell = "%%step imports\nfrom sklearn.cluster import KMeans"
    book = Notebook(tmp_path)
    first = book.run([HEAD, step_cell, "%step list"])
    listed = stream_text(outputs_of(first, 2))
    assert "invalidated" not in listed, listed
    again = book.run([HEAD, "import sklearn", step_cell])
    assert replayed(again, 2), said(again, 2)


def test_an_environment_variable_the_step_sets_before_reading_it_is_not_an_input(
    tmp_path, monkeypatch
):
    # DSPy's tutorial sets OPENAI_API_KEY in the step, then the library reads it:
    # the read was recorded as an input holding that value, so in a fresh kernel,
    # where the variable is unset (or another value) until the step sets it, the
    # step never replayed.
    monkeypatch.delenv("NBD_TUTORIAL_KEY", raising=False)
    cells = [
        HEAD,
        "%%step setup\nimport os\nos.environ['NBD_TUTORIAL_KEY'] = 'k-1'\n"
        "print(os.environ['NBD_TUTORIAL_KEY'], os.getenv('NBD_TUTORIAL_KEY'))",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert stream_text(outputs_of(first, 1)) == "k-1 k-1\n"
    again = book.run(cells)
    assert replayed(again, 1), said(again, 1)
    book.env["NBD_TUTORIAL_KEY"] = "other"  # what it held before the step does not matter
    assert replayed(book.run(cells), 1)


@pytest.mark.parametrize(
    ("module", "name", "make"),
    [
        ("sklearn.cluster", "KMeans", "KMeans(n_clusters=2)"),
        ("fractions", "Fraction", "Fraction(1, 3)"),
    ],
)
def test_a_library_class_a_step_imports_is_unchanged_when_that_step_is_edited(
    tmp_path, module, name, make
):
    # `uses` reads only the class; editing `imports` (another variable, `k`) makes
    # `uses` run again: "input 'KMeans' changed", because the class's input
    # fingerprint is mixed with the digest of the blob holding all of `imports`'s
    # variables.
    if module.startswith("sklearn"):
        pytest.importorskip("sklearn")

    def cells(k: int) -> list[str]:
        return [
            HEAD,
            f"%%step imports\nfrom {module} import {name}\nk = {k}",
            f"%%step uses\nobj = {make}\nprint(type(obj).__name__)",
        ]

    book = Notebook(tmp_path)
    book.run(cells(2))
    edited = book.run(cells(3))
    assert not replayed(edited, 1)  # the edited step runs again
    assert replayed(edited, 2), f"'uses' ran again: {said(edited, 2)}"


# -- 5. library warnings and logging while nbdurable pickles a value -----------------

CHATTY = (
    "import logging, warnings\n"
    "class Chatty:\n"
    "    def __init__(self, n):\n"
    "        self.n = n\n"
    "    def __getstate__(self):\n"
    "        warnings.warn('Chatty is being pickled', UserWarning)\n"
    "        logging.getLogger('chatty').warning('Chatty pickled')\n"
    "        return self.__dict__"
)


def test_warnings_and_logs_of_pickling_stay_out_of_the_cell(tmp_path):
    # As LlamaIndex objects do: recording (pickling, fingerprinting) a value calls
    # its __getstate__, whose warning and log record show in the cell; a plain run
    # pickles nothing and shows neither.
    cells = [
        HEAD,
        CHATTY,
        "%%step make\nc = Chatty(3)\nprint('made', c.n)",
        "%%step use\nm = c.n * 2\nprint('used', m)",
    ]
    book = Notebook(tmp_path)
    runs = [book.run(cells), book.run(cells)]
    for nb in runs:
        for i in (2, 3):
            assert "Chatty" not in stderr(nb, i), stderr(nb, i)
    assert stream_text(outputs_of(runs[1], 3)) == "used 6\n"


# -- 6. smaller ones ---------------------------------------------------------------

_WARNING_AT = re.compile(r":(\d+): UserWarning: careful")


def test_a_warning_and_a_traceback_in_a_step_name_the_line_the_cell_shows(tmp_path):
    # A plain cell of the same code says line 2; the %%step cell shows the call on
    # its line 3 (the `%%step` line is the cell's first), and its warnings and its
    # tracebacks both name that line: the one a user finds in the cell's gutter.
    # (Decided against numbering from the body: a traceback and a warning of the
    # same cell would then disagree with each other and with the cell as shown.)
    body = "import warnings\nwarnings.warn('careful')\nx = 1"
    failing = "%%step boom\nx = 1\nraise ValueError('here')"
    nb = Notebook(tmp_path).run([HEAD, body, "%%step w\n" + body, failing], allow_errors=True)
    plain, durable = _WARNING_AT.findall(stderr(nb, 1)), _WARNING_AT.findall(stderr(nb, 2))
    assert plain == ["2"]
    assert durable == ["3"], stderr(nb, 2)
    (error,) = [o for o in outputs_of(nb, 3) if o["output_type"] == "error"]
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "".join(error["traceback"]))
    # IPython 9 says "line 3"; 8.x marks the line "----> 3": the cell's line 3 either way.
    assert re.search(r"line 3\b|----> 3 ", shown), shown


def test_a_class_attribute_a_step_appends_to_is_restored(tmp_path):
    # `Registry` is a class of a plain cell; the step appends to its `items` list
    # in place. The class patch recorded holds the attributes rebound, not the ones
    # mutated, so after the replay `items` is the plain cell's empty list.
    cells = [
        HEAD,
        "class Registry:\n    items = []",
        "%%step register\nRegistry.items.append('a')",
        "print(Registry.items)",
    ]
    book = Notebook(tmp_path)
    assert stream_text(outputs_of(book.run(cells), 3)) == "['a']\n"
    again = book.run(cells)
    assert replayed(again, 2)
    assert stream_text(outputs_of(again, 3)) == "['a']\n"


def test_a_class_with_slots_comes_back_with_slots(tmp_path):
    # cloudpickle rebuilds a notebook class without its __slots__ (the slot
    # descriptors are dropped from its state, the skeleton is made without them).
    cells = [
        HEAD,
        "%%step slots\nclass P:\n    __slots__ = ('x',)\np = P()\np.x = 1",
        "print(hasattr(p, '__dict__'), hasattr(P(), '__dict__'), type(vars(P).get('x')).__name__)",
    ]
    book = Notebook(tmp_path)
    shown = "False False member_descriptor\n"
    assert stream_text(outputs_of(book.run(cells), 2)) == shown
    again = book.run(cells)
    assert replayed(again, 1)
    assert stream_text(outputs_of(again, 2)) == shown


def test_a_dataclass_a_step_defines_is_unchanged_once_restored(tmp_path):
    # A dataclass's __repr__ is dataclasses' recursion guard wrapping the generated
    # method, given the notebook's __module__ by functools.wraps: pickled by value, it
    # lost its library file name (read as notebook code, with its globals), and
    # adopting the restored class split the wrapped method from its __wrapped__. The
    # class restored from the record then fingerprinted otherwise, so the step that
    # changes its instance ran again.
    cells = [
        HEAD + "\nimport dataclasses",
        "%%step make\n@dataclasses.dataclass\nclass Conf:\n    lr: float = 0.1\nc = Conf()",
        "%%step change\nc.lr = 0.01",
        "print(c, isinstance(c, Conf))",
    ]
    book = Notebook(tmp_path)
    shown = "Conf(lr=0.01) True\n"
    assert stream_text(outputs_of(book.run(cells), 3)) == shown
    again = book.run(cells)
    assert replayed(again, 1)
    assert replayed(again, 2), said(again, 2)
    assert stream_text(outputs_of(again, 3)) == shown


def test_restoring_an_object_does_not_run_its_init_again(tmp_path):
    # The class's __reduce__ rebuilds it by calling the class: nbdurable's check that
    # the value loads back (at record time) and the replay each run __init__, whose
    # print shows in the cell.
    cells = [
        HEAD,
        "class Tracker:\n"
        "    def __init__(self, name):\n"
        "        print('init', name)\n"
        "        self.name = name\n"
        "    def __reduce__(self):\n"
        "        return (Tracker, (self.name,))",
        "%%step track\nt = Tracker('a')",
    ]
    book = Notebook(tmp_path)
    assert stream_text(outputs_of(book.run(cells), 2)) == "init a\n"
    again = book.run(cells)
    assert replayed(again, 2)
    assert stream_text(outputs_of(again, 2)) == "init a\n"


def test_an_exception_kept_in_a_variable_keeps_its_cause_and_traceback(tmp_path):
    # Pickling an exception keeps its args only: __cause__, __context__ and
    # __traceback__ are None after the replay.
    cells = [
        HEAD,
        "%%step keep\n"
        "try:\n"
        "    try:\n"
        "        1 / 0\n"
        "    except ZeroDivisionError as e:\n"
        "        raise ValueError('bad') from e\n"
        "except ValueError as err:\n"
        "    kept = err",
        "print(repr(kept), repr(kept.__cause__), kept.__traceback__ is not None)",
    ]
    book = Notebook(tmp_path)
    shown = "ValueError('bad') ZeroDivisionError('division by zero') True\n"
    assert stream_text(outputs_of(book.run(cells), 2)) == shown
    assert stream_text(outputs_of(book.run(cells), 2)) == shown


# -- 4. an agent framework's state, followed wherever it was made ----------------------

#: A stand-in for an installed agent framework: its file lies in a ``site-packages``
#: folder, so nbdurable takes it for library code, as it takes LangGraph. Its shapes
#: are LangGraph's: a model holding a transport with a lock (made eagerly, as
#: ChatOpenAI does, or on first use, as ChatAnthropic's ``_client``), an in-memory
#: checkpointer whose storage is a defaultdict of a library lambda, a store keeping its
#: data in ``__slots__``, and a bare ``object()`` sentinel tested by identity.
AGENTLIB = """
import threading
from collections import defaultdict
from functools import cached_property

MISSING = object()


class Transport:
    def __init__(self):
        self.lock = threading.RLock()


class Model:
    def __init__(self, name):
        self.name = name
        self.transport = Transport()

    def reply(self, text):
        return f"{self.name}: hi {text}"


class LazyModel:
    def __init__(self, name):
        self.name = name

    @cached_property
    def transport(self):
        return Transport()

    def reply(self, text):
        self.transport
        return f"{self.name}: hi {text}"


class Saver:
    def __init__(self):
        self.storage = defaultdict(lambda: defaultdict(dict))


class Store:
    __slots__ = ("_data",)

    def __init__(self):
        self._data = defaultdict(dict)


class Bunch(dict):
    # scikit-learn's: a private dict that __setstate__ does not bring back
    def __init__(self, **kwargs):
        super().__init__(kwargs)
        self.__dict__["_deprecated"] = {}

    def __setstate__(self, state):
        pass


class App:
    def __init__(self, node, saver, store):
        self.node, self.saver, self.store = node, saver, store
        self.pending = MISSING

    def invoke(self, thread, text):
        if self.pending is not MISSING:
            raise RuntimeError("a write is pending")
        messages = self.saver.storage[thread].setdefault("messages", [])
        messages.append(text)
        out = self.node(messages)
        messages.append(out)
        self.store._data[thread][len(messages)] = out
        return out
"""


@pytest.fixture
def agentlib(tmp_path) -> str:
    """The first cell: nbdurable, and ``agentlib`` importable from a site-packages folder."""
    lib = tmp_path / "site-packages" / "agentlib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(AGENTLIB)
    return f"{HEAD}\nimport sys\nsys.path.insert(0, {str(lib.parent)!r})\nimport agentlib"


def test_state_a_step_changes_inside_library_objects_made_in_plain_cells_replays(
    tmp_path, agentlib
):
    # The step changes `app` only through a helper, inside its checkpointer and
    # its store (made in a plain cell and bound to their own names). Before: `app`
    # could not be saved (its node function reads `model`, pickled by value, and
    # the model's transport holds a lock), so the step was recorded not
    # replayable and ran again on every run; the checkpointer (its storage a
    # defaultdict) and the store (its data in __slots__) were not seen to change;
    # the checkpointer's lambda, restored by value, made the next step's input
    # `app` differ; and the sentinel came back as another object.
    cells = [
        agentlib,
        "model = agentlib.Model('m')\n"
        "def node(messages):\n"
        "    return model.reply(messages[-1])\n"
        "saver, store = agentlib.Saver(), agentlib.Store()\n"
        "app = agentlib.App(node, saver, store)\n"
        "def chat(text):\n"
        "    return app.invoke('1', text)",
        "%%step hello\nprint(chat('bob'))",
        "%%step again\nprint(chat('bye'))",
        "print(dict(saver.storage['1']), dict(store._data['1']))\n"
        "print(app.saver is saver, app.store is store, app.node is node, "
        "app.pending is agentlib.MISSING)",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    shown = (
        "{'messages': ['bob', 'm: hi bob', 'bye', 'm: hi bye']} {2: 'm: hi bob', 4: 'm: hi bye'}\n"
        "True True True True\n"
    )
    assert stream_text(outputs_of(first, 4)) == shown
    assert "cannot be saved" not in said(first, 2), said(first, 2)
    again = book.run(cells)
    assert replayed(again, 2), said(again, 2)
    assert replayed(again, 3), said(again, 3)
    assert stream_text(outputs_of(again, 4)) == shown


def test_a_library_object_is_saved_without_what_it_built_on_first_use(tmp_path, agentlib):
    # `LazyModel.transport` is a cached_property holding a lock: after the
    # model's first call it could not be pickled, so a step that made and used
    # a model ran again on every run. Saved as before its first use, the model
    # makes its transport again when next used, as it did the first time.
    cells = [
        agentlib,
        "%%step make\nlazy = agentlib.LazyModel('m')\nprint(lazy.reply('x'))",
        "print(lazy.reply('y'), 'transport' in vars(lazy))",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert "cannot be saved" not in said(first, 1), said(first, 1)
    again = book.run(cells)
    assert replayed(again, 1), said(again, 1)
    assert stream_text(outputs_of(again, 1)) == "m: hi x\n"
    assert stream_text(outputs_of(again, 2)) == "m: hi y True\n"


def test_a_thread_a_step_leaves_running_is_started_again_by_running_the_body(tmp_path):
    # The thread's object is not kept in a variable, so nothing the step bound
    # said it could not be restored: the replay showed "started" while no
    # poller ran, without a word.
    cells = [
        HEAD,
        "import threading\nstop = threading.Event()\n"
        "def poll():\n    while not stop.wait(0.01):\n        pass",
        "%%step start\nthreading.Thread(target=poll, name='poller', daemon=True).start()\n"
        "print('started')",
        "print([t.name for t in threading.enumerate() if t.name == 'poller'])",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert "it left thread 'poller' running" in said(first, 2), said(first, 2)
    assert stream_text(outputs_of(first, 3)) == "['poller']\n"
    again = book.run(cells)
    assert not replayed(again, 2)
    assert "it left thread 'poller' running" in said(again, 2), said(again, 2)
    assert stream_text(outputs_of(again, 3)) == "['poller']\n"


def test_a_library_object_restored_otherwise_than_recorded_is_unchanged_for_its_readers(
    tmp_path, agentlib
):
    # scikit-learn's Bunch (load_digits) comes back from its pickle without a private
    # dict: its fingerprint differs from the recorded object's, so every step reading
    # it ran again after the step that made it replayed ("input 'digits' changed").
    cells = [
        agentlib,
        "%%step make\ndigits = agentlib.Bunch(data=[1, 2, 3])",
        "%%step use\nprint(len(digits['data']))",
        "digits['data'].append(4)",
        "%%step after\nprint(len(digits['data']))",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    again = book.run(cells)
    assert replayed(again, 1) and replayed(again, 2), said(again, 2)
    assert stream_text(outputs_of(again, 2)) == "3\n"
    # A change after the restore is still a change for the steps reading it.
    assert not replayed(first, 4)
    assert stream_text(outputs_of(again, 4)) == "4\n"


def test_a_step_that_wrote_to_an_in_memory_sqlite_database_runs_again_on_replay(tmp_path):
    # The OpenAI Agents SDK's SQLiteSession and LlamaIndex's Memory keep their rows in
    # an in-memory SQLite database the plain cells made. Replayed, the steps that
    # added to it left it empty and the next cell printed [] without a word.
    cells = [
        HEAD,
        "import sqlite3\nsession = sqlite3.connect(':memory:')\n"
        "session.execute('create table items (text)')\n"
        "def add(text):\n    session.execute('insert into items values (?)', (text,))\n"
        "def items():\n    return session.execute('select text from items').fetchall()",
        "%%step add\nadd('my name is Ann')\nprint('added')",
        "%%step count\nn = len(items())\nprint(n)",
        "print(items())",
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert "in-memory SQLite database" in said(first, 2), said(first, 2)
    again = book.run(cells)
    assert not replayed(again, 2)
    assert "in-memory SQLite database" in said(again, 2), said(again, 2)
    assert replayed(again, 3)  # a step that only read it replays
    assert stream_text(outputs_of(again, 4)) == "[('my name is Ann',)]\n"


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_langgraph_sqlite_checkpointer_is_followed(tmp_path, where):
    # LangGraph's SqliteSaver, made in a plain cell over the notebook's connection.
    # Its file keeps what a step wrote: the steps replay (before: the saver holds a
    # lock and sets `is_setup` on first use, so it "changed" and could not be saved,
    # and turn 1 ran again on replay, writing its messages into the file a second
    # time: 6 messages where a plain run has 4). In memory, the rows are gone with
    # the kernel: the steps that wrote them run again, saying so, and rebuild them.
    pytest.importorskip("langgraph.checkpoint.sqlite")
    database = "cp.sqlite" if where == "file" else ":memory:"
    cells = [
        HEAD,
        "import sqlite3\nfrom langgraph.checkpoint.sqlite import SqliteSaver\n"
        "from langgraph.graph import START, MessagesState, StateGraph\n"
        f"conn = sqlite3.connect({database!r}, check_same_thread=False)\n"
        "saver = SqliteSaver(conn)\n"
        "def node(s):\n    return {'messages': [('ai', f'n={len(s[\"messages\"])}')]}\n"
        "g = StateGraph(MessagesState)\ng.add_node('n', node)\ng.add_edge(START, 'n')\n"
        "app = g.compile(checkpointer=saver)\ncfg = {'configurable': {'thread_id': 't1'}}",
        "%%step turn1\nout1 = app.invoke({'messages': [('user', 'hi')]}, cfg)\n"
        "print(len(out1['messages']))",
        "%%step turn2\nout2 = app.invoke({'messages': [('user', 'again')]}, cfg)\n"
        "print(len(out2['messages']))",
        "print(len(app.get_state(cfg).values['messages']))",
    ]
    book = Notebook(tmp_path)
    book.run(cells)
    again = book.run(cells)
    assert stream_text(outputs_of(again, 2)) == "2\n"
    assert stream_text(outputs_of(again, 3)) == "4\n"
    assert stream_text(outputs_of(again, 4)) == "4\n", "as a plain run leaves it"
    if where == "file":
        assert replayed(again, 2) and replayed(again, 3), said(again, 2)
    else:
        assert not replayed(again, 2) and not replayed(again, 3)
        assert "in-memory SQLite database" in said(again, 2), said(again, 2)


def test_a_state_dict_keeps_sharing_the_model_parameters_after_a_replay(tmp_path):
    # `sd = model.state_dict()` holds tensors on the parameters' memory: training
    # the model afterwards changes sd too. Replayed, sd's tensors were copies, so
    # after the same training it still showed the weights of before.
    pytest.importorskip("torch")
    probe = (
        "w = model.weight.detach()\n"
        "print(torch.equal(sd['weight'], w), sd['weight'].data_ptr() == w.data_ptr(),\n"
        "      torch.equal(both[1]['bias'], both[0].bias.detach()),\n"
        "      both[1]['bias'].data_ptr() == both[0].bias.data_ptr())"
    )
    cells = [
        f"{HEAD}\nimport torch",
        "%%step make\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(3, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
        "%%step snap\nsd = model.state_dict()",
        # made and snapshot in one step: shared within the step's own values
        "%%step pair\ntorch.manual_seed(1)\nm2 = torch.nn.Linear(3, 1)\n"
        "both = (m2, m2.state_dict())",
        "%%step train\nopt.zero_grad()\nmodel(torch.ones(2, 3)).pow(2).sum().backward()\n"
        "opt.step()",
        "opt.zero_grad()\nmodel(torch.ones(2, 3)).pow(2).sum().backward()\nopt.step()\n"
        "with torch.no_grad():\n    both[0].bias += 1",
        probe,
    ]
    book = Notebook(tmp_path)
    first = book.run(cells)
    assert stream_text(outputs_of(first, 6)) == "True True True True\n"
    again = book.run(cells)
    assert all(replayed(again, i) for i in (1, 2, 3, 4)), [said(again, i) for i in (1, 2, 3, 4)]
    assert stream_text(outputs_of(again, 6)) == "True True True True\n"
