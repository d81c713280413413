"""Library coverage: objects of installed packages, declared by one step, changed by the next.

Specification. For each case of ``cases.CASES`` (one class of scikit-learn,
statsmodels, matplotlib, plotly, seaborn, torch, astropy, pandas, polars,
pydantic, dataclasses/attrs, the standard library, langchain-core,
langgraph or llama-index-core):

* ``%%step make_<case>`` declares an object of the class;
* ``%%step change_<case>`` changes it: fits it, sets a parameter, appends,
  updates, draws on it, or rebinds the name to a changed copy;
* a plain cell after them reads it (prints what it holds, shows it).

The cases of one library make one notebook (``harness.build``): a plain setup
cell (``%load_ext nbdurable`` and the library's imports), then each case's
three cells, then a probe cell that prints every user variable in a canonical
text (data by value, arrays, tensors and frames by a digest of their bytes,
estimators by their parameters and fitted attributes, figures by what they
draw, models by their dump, other objects by their own attributes). Every
name a case binds starts with ``<case>_``, so the cases do not share state and
the probe's lines are told apart per case.

The notebook runs three times, each in a fresh kernel (``PYTHONHASHSEED=0``,
one thread per BLAS/OpenMP pool):

``plain``
    without nbdurable (its ``%load_ext nbdurable`` line and ``%%step``
    headers removed): the oracle;
``durable``
    in a fresh store: every step runs its body and is recorded;
``replay``
    again, in a fresh kernel on the same store.

A case passes when all of these hold:

1. no hang: none of its cells runs longer than ``harness.CELL_TIMEOUT``
   seconds in any run (such a cell is interrupted), and no run stops before
   its cells ran (a dead kernel, the notebook over ``harness.NOTEBOOK_TIMEOUT``);
2. its cells run without error in the plain run (else the case itself is
   broken, reported as such) and its variables are in the plain probe;
3. fidelity: in the durable and the replay runs, each of its cells shows
   what the plain run showed (outputs normalized: execution counts,
   nbdurable's own notes and ``NbdurableWarning`` lines, memory addresses,
   UUIDs and cell file names removed; images compared by a digest of their
   bytes), and each of its variables has the plain run's canonical text;
4. no spurious rerun: in the replay run both of its steps replay (their
   ``replayed`` note is shown); a step that ran its body again is reported
   with nbdurable's reason (its ``step-invalidated`` event, logged by an
   IPython startup file, or the warning it gave when it recorded the step).

The three runs of a notebook are shared by its cases (a module fixture
judges each notebook once, when its first case asks). Every case that fails
against the library today is listed in :data:`FAILS_TODAY` with its one-line
cause, as a strict xfail: a fix makes its test XPASS, which fails the run
until the entry is removed. Never make a case pass by changing what it
expects.

Opt-in (``NBDURABLE_LIBCOV=1``): it needs the packages of
``tests/libcov/requirements.txt`` and takes a few minutes on two cores::

    python -m pip install -r tests/libcov/requirements.txt
    NBDURABLE_LIBCOV=1 python -m pytest tests/libcov
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from libcov_cases import BY_NAME, CASES, NEEDS  # noqa: E402
from libcov_harness import LibResult, judge_lib  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("NBDURABLE_LIBCOV") != "1",
    reason="the library-coverage corpus runs with NBDURABLE_LIBCOV=1 "
    "(pip install -r tests/libcov/requirements.txt)",
)

# Each entry's cause is one of a few mechanisms of nbdurable (or of the library's own pickle
# round trip); the strings below name them once.
_REF = (
    "step reran: 'cannot restore its variables ({name} is not the object it was)': the change "
    "step's values share {what} with the namespace, recorded as a reference, and in the "
    "replaying kernel the live one is judged another object"
)

#: case -> why it fails today. Strict: remove an entry when its case passes.
FAILS_TODAY: dict[str, str] = {
    # llama-index-core
    "li_splitter": (
        "the case is broken on an install where the corpus' nltk (3.10's pathsec) refuses "
        "llama-index's bundled stopwords file because the installer hard-linked it "
        "(st_nlink=2): its read cell fails, or passes the cell timeout, in the plain run. "
        "nbdurable's part (the splitter's tiktoken encoding restored without the network) "
        "replays: tests/test_values.py"
    ),
}

assert set(FAILS_TODAY) <= set(BY_NAME), "FAILS_TODAY names an unknown case"


def _missing(lib: str) -> list[str]:
    out = []
    for module in NEEDS[lib]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(module)
    return out


def _params():
    out = []
    for case in CASES:
        marks = [
            pytest.mark.kernel,
            pytest.mark.fidelity,
            # nbclient's event loops and sockets, left to the collector
            pytest.mark.filterwarnings("ignore::ResourceWarning"),
            pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
        ]
        reason = FAILS_TODAY.get(case.name)
        if reason:
            marks.append(pytest.mark.xfail(strict=True, reason=reason))
        out.append(pytest.param(case.name, id=f"{case.lib}-{case.name}", marks=marks))
    return out


class Corpus:
    """Judges each library's notebook once, the first time one of its cases asks."""

    def __init__(self) -> None:
        self.results: dict[str, LibResult] = {}

    def result(self, lib: str) -> LibResult:
        if lib not in self.results:
            self.results[lib] = judge_lib(lib)
        return self.results[lib]


@pytest.fixture(scope="module")
def corpus():
    c = Corpus()
    yield c
    report = os.environ.get("LIBCOV_REPORT")
    if report:
        import json

        Path(report).write_text(
            json.dumps(
                {
                    lib: {"problems": r.problems, "seconds": r.seconds}
                    for lib, r in c.results.items()
                },
                indent=1,
            )
        )


@pytest.mark.parametrize("name", _params())
def test_libcov(corpus, name):
    case = BY_NAME[name]
    missing = _missing(case.lib)
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install -r tests/libcov/requirements.txt")
    problem = corpus.result(case.lib).problems[name]
    assert problem is None, problem
