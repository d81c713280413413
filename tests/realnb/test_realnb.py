"""Real public notebooks, run plain and durable, replayed, killed and edited.

See harness.py for the five checks and SOURCES.md for where each notebook
comes from and what was changed to run it here (against the fake model server
of fake_server.py). One plain run per notebook is shared by its checks; the
notebooks are judged on a small thread pool (``REALNB_JOBS``, default 2:
each judgement waits on kernels, which are separate processes), CI_SET's
first (see :func:`judging_order`), so the first tests wait while the others
run on.

Every (notebook, check) that fails against the library today is listed in
:data:`FAILS_TODAY` with its one-line cause, as a strict xfail: a fix makes
its test XPASS, which fails the run until the entry is removed. Never make a
check pass by changing what it expects.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CHECKS, Result, Spec, judge  # noqa: E402

# Opt-in: NBDURABLE_REALNB=1 judges the whole corpus (33 notebooks: about 12 minutes
# on two cores, with tests/realnb/requirements.txt installed); NBDURABLE_REALNB=ci judges
# CI_SET only.
#
# CI (.ci/run) judges the whole corpus within its time: REALNB_DEADLINE (seconds since
# the epoch) is when judging must be over. CI_SET is judged first and always; each other
# notebook only if it can be done by then (SECONDS says how long each takes), in an order
# that turns with REALNB_TURN (CI passes its commit's hash), so that when a slow machine
# runs out of time, the notebooks left unjudged (skipped, each saying so) differ from one
# CI run to the next instead of being the same ones every time.
MODE = os.environ.get("NBDURABLE_REALNB", "")
DEADLINE = float(os.environ.get("REALNB_DEADLINE") or "inf")
TURN = os.environ.get("REALNB_TURN", "")
pytestmark = pytest.mark.skipif(
    MODE not in ("1", "ci"),
    reason="the real-notebook corpus runs with NBDURABLE_REALNB=1 (all) or =ci (CI_SET) "
    "(pip install -r tests/realnb/requirements.txt)",
)

#: What CI judges: one notebook per model SDK and agent framework the test extra and
#: CI's share of requirements.txt install, each among the quickest of its kind, so the
#: corpus' share of a CI run stays a few minutes on two cores. Each is judged by all
#: five checks, as the full corpus is.
CI_SET = (
    "an_calculator",  # the Anthropic SDK, tool use
    "oa_guardrails",  # the OpenAI SDK, concurrent calls
    "la_agent_memory",  # LangChain over the OpenAI SDK, a LangGraph agent with a MemorySaver
    "lg_persistence_functional",  # LangGraph's functional API, an InMemorySaver
    "ag_hello_world",  # the OpenAI Agents SDK
)

#: Seconds to judge each notebook (all five checks), three at a time on a loaded 2-core
#: machine (1-min load about 12): the whole corpus run of this file, rounded up to tens.
#: An upper bound on a quiet machine, where the corpus takes about half as long.
SECONDS = {
    "pdsh_gmm": 390, "li_agent": 240, "pdsh_kde": 220, "pdsh_random_forests": 190,
    "dspy_custom_module": 190, "pdsh_intro_sklearn": 160, "lg_persistence": 130,
    "lg_persistence_functional": 120, "smol_text_to_sql": 120, "pdsh_kmeans": 120,
    "ag_getting_started": 120, "pdsh_svm": 110, "lg_summary": 110, "lg_react_scratch": 100,
    "lg_structured_output": 100, "ag_hello_world": 100, "lg_react_memory": 90,
    "lc_chatbot": 80, "la_agent_memory": 80, "lc_llm_chain": 80, "pdsh_hyperparams": 80,
    "la_basics": 70, "pdsh_pca": 70, "an_moderation": 60, "an_tool_choice": 60,
    "oa_function_calling": 60, "an_structured_json": 50, "an_customer_service": 50,
    "an_pydantic": 50, "an_calculator": 50, "oa_guardrails": 50, "oa_stream": 50,
    "li_durable_workflows": 30,
}  # fmt: skip

LG = ("langgraph", "langchain_core")
SPECS = [
    # Python Data Science Handbook: model fits as steps
    Spec(
        "pdsh_kmeans",
        edit=(
            "KMeans(n_clusters=10, random_state=0)\nclusters = kmeans.fit_predict(digits.data)",
            "KMeans(n_clusters=10, random_state=1)\nclusters = kmeans.fit_predict(digits.data)",
        ),
        needs=("sklearn", "seaborn", "scipy"),
    ),
    Spec(
        "pdsh_hyperparams",
        edit=("X2, y2 = make_data(200)", "X2, y2 = make_data(300)"),
        reruns=("validation_curve_200",),
        needs=("sklearn",),
    ),
    Spec(
        "pdsh_intro_sklearn",
        edit=("random_state=1)", "random_state=2)"),
        reruns=("naive_bayes",),
        needs=("sklearn", "seaborn"),
    ),
    Spec(
        "pdsh_pca",
        edit=("noisy = rng.normal(digits.data, 4)", "noisy = rng.normal(digits.data, 3)"),
        reruns=("pca_noisy",),
        needs=("sklearn",),
    ),
    # Anthropic cookbook: the SDK's messages and tool use
    Spec(
        "an_calculator",
        edit=("Calculate (12851 - 593) * 301 + 76", "Calculate (12851 - 594) * 301 + 76"),
        needs=("anthropic",),
    ),
    Spec(
        "an_customer_service",
        edit=("What is the status of order O2?", "What is the status of order O1?"),
        needs=("anthropic",),
    ),
    Spec(
        "an_pydantic",
        edit=("Priority: 4", "Priority: 5"),
        needs=("anthropic", "email_validator"),
    ),
    Spec(
        "an_structured_json",
        edit=("The product was okay", "The product was great"),
        needs=("anthropic", "bs4"),
    ),
    Spec(
        "an_tool_choice",
        edit=("What color is the sky?", "What color is the sea?"),
        needs=("anthropic",),
    ),
    Spec(
        "an_moderation",
        edit=("Thanks for the helpful information!", "Thanks for the useful information!"),
        needs=("anthropic",),
    ),
    # Python Data Science Handbook, more chapters
    Spec(
        "pdsh_random_forests",
        edit=(
            "RandomForestClassifier(n_estimators=1000, random_state=0)",
            "RandomForestClassifier(n_estimators=500, random_state=0)",
        ),
        needs=("sklearn", "seaborn"),
    ),
    Spec(
        "pdsh_gmm",
        edit=("n_components = np.arange(1, 21)", "n_components = np.arange(1, 16)"),
        needs=("sklearn", "scipy"),
    ),
    Spec(
        "pdsh_svm",
        edit=("for axi, C in zip(ax, [10.0, 0.1]):", "for axi, C in zip(ax, [10.0, 0.5]):"),
        needs=("sklearn", "scipy"),
    ),
    Spec(
        "pdsh_kde",
        edit=("x = make_data(20)", "x = make_data(30)"),
        reruns=("kde", "bandwidth_loo"),
        needs=("sklearn", "scipy"),
    ),
    # OpenAI cookbook (chat completions, function calling, streaming) and Agents SDK
    Spec(
        "oa_function_calling",
        edit=("who are the top 5 artists", "who are the top 3 artists"),
        reruns=("top_album",),
        needs=("requests", "tenacity", "termcolor"),
    ),
    Spec(
        "oa_stream",
        edit=("What's 1+1? Answer in one word.", "What's 2+2? Answer in one word."),
    ),
    Spec(
        "oa_guardrails",
        edit=("for people that like cats?", "for people that like birds?"),
        reruns=("good_request",),
    ),
    Spec(
        "ag_hello_world",
        edit=("haiku about recursion", "haiku about iteration"),
        needs=("agents",),
    ),
    Spec(
        "ag_getting_started",
        edit=("What is the capital of France?", "What is the capital of Spain?"),
        needs=("agents",),
        concurrent=True,  # an input guardrail runs beside its agent
    ),
    # DSPy tutorials: a custom module
    Spec(
        "dspy_custom_module",
        edit=("Is Lebron James the basketball GOAT?", "Is Michael Jordan the basketball GOAT?"),
        needs=("dspy",),
    ),
    # LangChain Academy: chat models, and a LangGraph agent with memory
    Spec(
        "la_basics",
        edit=('content="Hello world"', 'content="Hello there"'),
        needs=("langchain_openai", "langchain_core"),
    ),
    Spec(
        "la_agent_memory",
        edit=("performing arithmetic on a set of inputs.", "performing arithmetic on two inputs."),
        reruns=("add", "multiply", "add_memory", "multiply_memory"),
        needs=(*LG, "langchain_openai"),
    ),
    # LangChain's tutorials, as a user ran them: a chain, a chatbot with history
    Spec(
        "lc_llm_chain",
        edit=("from English into Italian", "from English into French"),
        reruns=("stream",),  # it streams the edited messages
        needs=("langchain_openai", "langchain_core"),
    ),
    Spec(
        "lc_chatbot",
        edit=('query = "Hi! I\'m Jim."', 'query = "Hi! I\'m Jane."'),
        reruns=("pirate_name",),
        needs=(*LG, "langchain_openai"),
    ),
    Spec(
        "li_durable_workflows",
        edit=("for _ in range(3):", "for _ in range(4):"),
        needs=("workflows",),
    ),
    # smolagents: a code agent over SQL
    Spec(
        "smol_text_to_sql",
        edit=("Which waiter got more total money from tips?", "Which waiter got the most tips?"),
        needs=("smolagents", "sqlalchemy"),
        timeout=300,
    ),
    # LlamaIndex workflows: a function-calling agent
    Spec(
        "li_agent",
        edit=("What is (2123 + 2321) * 312?", "What is (2123 + 2321) * 313?"),
        needs=("llama_index.core", "llama_index.llms.litellm", "litellm"),
    ),
    # LangGraph docs: graphs, agents and checkpointers
    Spec(
        "lg_persistence",
        edit=("hi! I'm bob", "hi! I'm alice"),
        needs=(*LG, "langchain", "langchain_anthropic"),
    ),
    Spec(
        "lg_react_memory",
        edit=("What's it known for?", "What's it famous for?"),
        needs=(*LG, "langchain_openai"),
    ),
    Spec(
        "lg_react_scratch",
        edit=("what is the weather in sf", "what is the weather in nyc"),
        needs=(*LG, "langchain_openai"),
    ),
    Spec(
        "lg_persistence_functional",
        edit=("hi! I'm bob", "hi! I'm alice"),
        # other_thread reads `workflow`, whose checkpointer the two steps before it
        # filled (thread "1"): that input changed, whatever thread it asks about
        reruns=("whats_my_name", "other_thread"),
        needs=(*LG, "langchain_anthropic"),
    ),
    Spec(
        "lg_structured_output",
        edit=(
            "Always return capitalized weather conditions",
            "Always return weather conditions in capitals",
        ),
        needs=(*LG, "langchain_openai"),
    ),
    Spec(
        "lg_summary",
        edit=("i like the celtics!", "i like the lakers!"),
        reruns=("celtics_win", "whats_my_name", "nfl_team", "patriots"),
        needs=(*LG, "langchain_anthropic"),
    ),
]

#: (notebook, check) -> why it fails today. Strict: remove an entry when its check passes.
FAILS_TODAY: dict[tuple[str, str], str] = {}

BY_NAME = {s.name: s for s in SPECS}
assert set(CI_SET) <= {s.name for s in SPECS}, "CI_SET names an unknown notebook"
assert len(BY_NAME) == len(SPECS), "two specs share a name"
assert set(SECONDS) == set(BY_NAME), "SECONDS must time every notebook of SPECS"
assert {n for n, _ in FAILS_TODAY} <= set(BY_NAME), "FAILS_TODAY names an unknown notebook"
assert {c for _, c in FAILS_TODAY} <= set(CHECKS), "FAILS_TODAY names an unknown check"


def _missing(spec: Spec) -> list[str]:
    return [m for m in spec.needs if not _importable(m)]


def _importable(module: str) -> bool:
    try:  # a dotted name imports its parent, which may itself be missing
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _params():
    out = []
    for spec in SPECS:
        if MODE == "ci" and spec.name not in CI_SET:
            continue
        for check in CHECKS:
            marks = [
                pytest.mark.kernel,
                pytest.mark.fidelity,
                # nbclient's event loops and sockets, left to the collector in the pool's threads
                pytest.mark.filterwarnings("ignore::ResourceWarning"),
                pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
            ]
            reason = FAILS_TODAY.get((spec.name, check))
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            out.append(pytest.param(spec.name, check, id=f"{spec.name}-{check}", marks=marks))
    return out


def judging_order(names: list[str], turn: str) -> list[str]:
    """``names`` with CI_SET's first, then the rest turned by ``turn`` (a commit's hash).

    The turn is a rotation, not a shuffle: every notebook keeps its neighbours, and
    each value of ``turn`` starts the rest at another place.
    """
    first = [n for n in names if n in CI_SET]
    rest = [n for n in names if n not in CI_SET]
    if rest and turn:
        k = int(hashlib.sha256(turn.encode()).hexdigest(), 16) % len(rest)
        rest = rest[k:] + rest[:k]
    return first + rest


class Corpus:
    """Judges the selected notebooks in the background, each once.

    A notebook outside CI_SET that cannot be judged by ``deadline`` (seconds since
    the epoch) when its turn comes, by :data:`SECONDS`, is not judged: its result is None.
    """

    def __init__(self, names: list[str], deadline: float = DEADLINE) -> None:
        jobs = int(os.environ.get("REALNB_JOBS", "2"))
        self.pool = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="realnb")
        self.futures: dict[str, Future[Result | None]] = {}
        self.deadline = deadline
        for name in judging_order(names, TURN):
            if not _missing(BY_NAME[name]):
                self.futures[name] = self.pool.submit(self._judge, name)

    def _judge(self, name: str) -> Result | None:
        if name not in CI_SET and time.time() + SECONDS.get(name, 300) > self.deadline:
            return None
        return judge(BY_NAME[name])

    def result(self, name: str) -> Result | None:
        return self.futures[name].result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def corpus(request):
    names: list[str] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None:
            name = callspec.params.get("name")
            if name not in names:
                names.append(name)
    c = Corpus(names)
    yield c
    c.close()
    report = os.environ.get("REALNB_REPORT")
    if report:
        import json

        done = {
            n: f.result()
            for n, f in c.futures.items()
            if f.done() and not f.exception() and f.result() is not None
        }
        Path(report).write_text(
            json.dumps(
                {
                    n: {
                        "problems": r.problems,
                        "reran": r.reran,
                        "seconds": r.seconds,
                        "total": r.total,
                    }
                    for n, r in done.items()
                },
                indent=1,
            )
        )


@pytest.mark.parametrize(("name", "check"), _params())
def test_realnb(corpus, name, check):
    missing = _missing(BY_NAME[name])
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install -r tests/realnb/requirements.txt")
    result = corpus.result(name)
    if result is None:
        pytest.skip(
            "not judged: CI's time for the corpus (REALNB_DEADLINE) was too short when its "
            "turn came; "
            "NBDURABLE_REALNB=1 without a deadline judges every notebook"
        )
    problem = result.problems.get(check, "not judged")
    assert problem is None, problem
