"""Make ``adapted/<name>.ipynb`` from ``original/<name>.ipynb``, and SOURCES.md, from one table.

``python tests/realnb/adapt.py`` rewrites every adapted notebook and SOURCES.md
from :data:`NOTEBOOKS`: each entry names where the original came from and
lists every change made to it, each with its reason, so SOURCES.md cannot
drift from what the adapted notebooks hold. Cell numbers are the original's
(0-based, markdown cells counted). Every adapted notebook also gets a first
code cell ``%load_ext nbdurable`` and has its outputs cleared; those two are
not repeated per notebook.

Changes:

- ``("step", i, "NAME [--http]", why)``: put ``%%step NAME`` on cell i;
- ``("sub", i, old, new, why)``: replace the text `old` (which must occur) in cell i;
- ``("drop", i, why)``: remove cell i;
- ``("insert", i, source, why)``: a new code cell before cell i.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

PDSH = ("jakevdp/PythonDataScienceHandbook", "d66231454ef753818dc9213c9b5942e067266966")
ANTH = ("anthropics/anthropic-cookbook", "4b36a1e1f64361397f4cbe4fbc7cdace338f16f8")
LG = "langchain-ai/langgraph"
WF = ("run-llama/workflows-py", "0b2098b762f4f49994c7877a40f2060f419dcae7")
DSPY = ("stanfordnlp/dspy", "4ed377ee9110e912d4f5e1be43b317b87455053c")
OACB = "zbeaver4/openai-cookbook"
OACB_NOTE = (
    "Read from zbeaver4/openai-cookbook, a fork holding openai/openai-cookbook's history "
    "unchanged up to 2024-01-08 (the upstream repository's snapshot is over the search tool's "
    "size limit); the commit is upstream's own, the last one that changed the file there."
)
AGENTS = ("openai/openai-agents-python", "6b94ad0f85a79eded117b698154e3109d5300928")
ACADEMY = ("langchain-ai/langchain-academy", "692aed73fac8e1b399614f361fe753d63e84d5a1")
LITELLM = (
    "llama-index-llms-openai (every release) requires openai<3, so it cannot be installed "
    "beside openai 3.x; llama-index's LiteLLM class is the same FunctionCallingLLM over "
    "OpenAI's API (litellm reads OPENAI_BASE_URL and OPENAI_API_KEY)"
)
DSPY_CACHE = (
    "DSPy caches every model reply on disk (~/.dspy_cache, shared by every run on the machine) "
    "and in memory: a second run would not send its requests at all; off, so runs can be compared"
)
TRILCE = "TrilceAC/colab-langchain"
TRILCE_NOTE = (
    "LangChain's own tutorial (docs/docs/tutorials of langchain-ai/langchain, whose snapshot is "
    "over the search tool's size limit), as a user saved it from Colab after running it, with "
    "ChatOpenAI chosen in its model tabs."
)
COLAB = "reads the key from Colab's secrets (google.colab); the harness sets a dummy key"
HF_MODEL = (
    "InferenceClientModel calls Hugging Face's hosted inference (network, a token); "
    "OpenAIServerModel is smolagents' model for an OpenAI-compatible server, here the fake one"
)
MERMAID = "draw_mermaid_png() renders the graph on the mermaid.ink web service; there is no network"
CHINOOK = """# a small stand-in for the Chinook sample database
import os, sqlite3
os.makedirs("data", exist_ok=True)
if os.path.exists("data/Chinook.db"):
    os.remove("data/Chinook.db")
_db = sqlite3.connect("data/Chinook.db")
_db.executescript(
    "CREATE TABLE Artist (ArtistId INTEGER PRIMARY KEY, Name TEXT);"
    "CREATE TABLE Album (AlbumId INTEGER PRIMARY KEY, Title TEXT, ArtistId INTEGER);"
    "CREATE TABLE Track (TrackId INTEGER PRIMARY KEY, Name TEXT, AlbumId INTEGER);"
    "INSERT INTO Artist VALUES (1, 'AC/DC'), (2, 'Accept'), (3, 'Aerosmith');"
    "INSERT INTO Album VALUES (1, 'For Those About To Rock', 1), (2, 'Balls to the Wall', 2),"
    " (3, 'Big Ones', 3);"
    "INSERT INTO Track VALUES (1, 'For Those About To Rock', 1), (2, 'Put The Finger On You', 1),"
    " (3, 'Balls to the Wall', 2), (4, 'Walk On Water', 3);"
)
_db.commit()
_db.close()"""

STYLE = (
    "plt.style.use('seaborn-whitegrid')",
    "plt.style.use('seaborn-v0_8-whitegrid')",
    "matplotlib 3.6 renamed the seaborn styles (the old name raises OSError)",
)
PIP = "a `pip install` cell: the packages are in requirements.txt, and there is no network"
KEY = "asks for an API key interactively; the harness sets a dummy key and the fake server's URL"
HTTP = (
    "--http: the model calls are made deep inside the library, so the step records them at the "
    "transport (docs: LLM clients) and a killed step's finished calls are not sent again"
)


def _sub(i, old, new, why):
    return ("sub", i, old, new, why)


NOTEBOOKS: dict[str, dict] = {
    # -- Python Data Science Handbook ------------------------------------------------------
    "pdsh_kmeans": {
        "source": (*PDSH, "notebooks/05.11-K-Means.ipynb"),
        "changes": [
            _sub(2, *STYLE),
            _sub(
                7,
                "kmeans = KMeans(n_clusters=4)",
                "kmeans = KMeans(n_clusters=4, random_state=0)",
                "seeded: unseeded k-means numbers its clusters differently run to run, so "
                "two plain runs colour the next figure differently",
            ),
            _sub(
                28,
                "assign_labels='kmeans')",
                "assign_labels='kmeans', random_state=0)",
                "seeded, for the same reason (its labels come from k-means)",
            ),
            _sub(
                57,
                "kmeans = MiniBatchKMeans(16)",
                "kmeans = MiniBatchKMeans(16, random_state=0)",
                "seeded, for the same reason",
            ),
            ("step", 7, "kmeans_blobs", "a model fit"),
            ("step", 28, "spectral", "a model fit"),
            ("step", 35, "kmeans_digits", "a model fit"),
            (
                "drop",
                45,
                "t-SNE on 1,797 digits: over 120 s on a loaded 2-core machine, too slow to run "
                "seven times per corpus run",
            ),
            ("step", 57, "color_quantization", "a model fit on 273,280 pixels"),
        ],
    },
    "pdsh_hyperparams": {
        "source": (*PDSH, "notebooks/05.03-Hyperparameters-and-Model-Validation.ipynb"),
        "changes": [
            _sub(33, *STYLE),
            ("step", 20, "leave_one_out", "150 fits"),
            ("step", 35, "validation_curve", "147 fits"),
            ("step", 42, "validation_curve_200", "147 fits"),
            ("step", 47, "learning_curves", "350 fits"),
            ("step", 52, "grid_search", "294 fits"),
        ],
    },
    "pdsh_intro_sklearn": {
        "source": (*PDSH, "notebooks/05.02-Introducing-Scikit-Learn.ipynb"),
        "changes": [
            _sub(
                5,
                "iris = sns.load_dataset('iris')",
                "from sklearn.datasets import load_iris\n"
                "iris = load_iris(as_frame=True).frame\n"
                "iris.columns = ['sepal_length', 'sepal_width', 'petal_length', 'petal_width',"
                " 'species']\n"
                "iris['species'] = iris['species'].map(dict(enumerate(['setosa', 'versicolor',"
                " 'virginica'])))",
                "sns.load_dataset downloads the table; the same iris data ships with scikit-learn",
            ),
            _sub(73, "plt.cm.get_cmap(", "plt.get_cmap(", "matplotlib 3.9 removed cm.get_cmap"),
            ("step", 46, "naive_bayes", "a model fit"),
            _sub(
                56,
                "covariance_type='full')",
                "covariance_type='full', random_state=0)",
                "unseeded, the mixture's clusters differ from run to run (so would the figure "
                "of cell 58 between two plain runs); seeded, runs can be compared",
            ),
            ("step", 56, "gmm", "a model fit"),
            _sub(
                71,
                "Isomap(n_components=2)",
                "Isomap(n_components=2, eigen_solver='dense')",
                "the default eigen solver (arpack, random start) gives other coordinates from "
                "run to run, so two plain runs differ; the dense solver is deterministic",
            ),
            ("step", 71, "isomap", "a manifold fit on 1,797 digits"),
            ("step", 77, "digits_nb", "a model fit"),
        ],
    },
    "pdsh_pca": {
        "source": (*PDSH, "notebooks/05.09-Principal-Component-Analysis.ipynb"),
        "changes": [
            _sub(2, *STYLE),
            _sub(25, "plt.cm.get_cmap(", "plt.get_cmap(", "matplotlib 3.9 removed cm.get_cmap"),
            ("step", 6, "pca2", "a model fit"),
            ("step", 23, "pca_digits", "a model fit"),
            ("step", 34, "pca_full", "a model fit"),
            ("step", 42, "pca_noisy", "a model fit"),
            *[
                ("drop", i, "fetch_lfw_people downloads 200 MB of faces; no network here")
                for i in (47, 49, 51, 53, 55, 56)
            ],
        ],
    },
    # -- Anthropic cookbook ---------------------------------------------------------------
    "an_calculator": {
        "source": (*ANTH, "tool_use/calculator_tool.ipynb"),
        "changes": [
            ("drop", 2, PIP),
            ("step", 10, "chat --http", "three tool-use exchanges; " + HTTP),
        ],
    },
    "an_customer_service": {
        "source": (*ANTH, "tool_use/customer_service_agent.ipynb"),
        "changes": [("drop", 2, PIP), ("step", 13, "chat --http", "three agent loops; " + HTTP)],
    },
    "an_pydantic": {
        "source": (*ANTH, "tool_use/tool_use_with_pydantic.ipynb"),
        "changes": [("drop", 2, PIP), ("step", 15, "save_note --http", "a tool-use exchange")],
    },
    "an_structured_json": {
        "source": (*ANTH, "tool_use/extracting_structured_json.ipynb"),
        "changes": [
            ("drop", 2, PIP),
            _sub(
                5,
                'url = "https://www.anthropic.com/news/third-party-testing"\n'
                "response = requests.get(url)\n"
                'soup = BeautifulSoup(response.text, "html.parser")',
                'html = "<html><body><p>We believe that the AI sector needs effective third-party'
                " testing for frontier AI systems.</p><p>Developing a testing regime will help"
                ' society.</p></body></html>"\n'
                'soup = BeautifulSoup(html, "html.parser")',
                "the article is downloaded; a small local page stands in for it",
            ),
            ("step", 5, "summary", "a model call"),
            ("step", 7, "entities", "a model call"),
            ("step", 9, "sentiment", "a model call"),
            ("step", 11, "classification", "a model call"),
            ("step", 13, "characteristics", "a model call"),
        ],
    },
    "an_tool_choice": {
        "source": (*ANTH, "tool_use/tool_choice.ipynb"),
        "changes": [
            *[
                ("step", i, f"q{i}", "a model call")
                for i in (8, 10, 12, 13, 20, 22, 27, 29, 35, 37, 39, 41)
            ],
        ],
    },
    "an_moderation": {
        "source": (*ANTH, "misc/building_moderation_filter.ipynb"),
        "changes": [
            ("drop", 3, PIP),
            *[
                ("step", i, f"moderate{i} --http", "a loop of model calls; " + HTTP)
                for i in (6, 8, 10, 12)
            ],
        ],
    },
    "pdsh_random_forests": {
        "source": (*PDSH, "notebooks/05.08-Random-Forests.ipynb"),
        "changes": [
            _sub(2, *STYLE),
            _sub(
                17,
                "visualize_classifier(DecisionTreeClassifier(), X, y)",
                "visualize_classifier(DecisionTreeClassifier(random_state=0), X, y)",
                "seeded: an unseeded tree breaks ties between splits at random, so two plain "
                "runs can draw other boundaries",
            ),
            (
                "drop",
                19,
                "an ipywidgets `interact` demo (helpers_05_08): interactive, nothing to run "
                "headless",
            ),
            ("drop", 25, "the same interactive demo"),
            ("step", 28, "bagging", "100 tree fits"),
            ("step", 30, "random_forest", "a forest of 100 trees"),
            _sub(
                35,
                "RandomForestRegressor(200)",
                "RandomForestRegressor(200, random_state=0)",
                "seeded: an unseeded forest fits other trees on every run, so two plain runs "
                "draw other curves",
            ),
            ("step", 35, "forest_regression", "a forest of 200 trees"),
            _sub(
                42,
                "RandomForestClassifier(n_estimators=1000)",
                "RandomForestClassifier(n_estimators=1000, random_state=0)",
                "seeded, for the same reason (its report and confusion matrix follow)",
            ),
            ("step", 42, "digits_forest", "a forest of 1,000 trees on 1,347 digits"),
        ],
    },
    "pdsh_gmm": {
        "source": (*PDSH, "notebooks/05.12-Gaussian-Mixtures.ipynb"),
        "changes": [
            _sub(2, *STYLE),
            _sub(
                13,
                "GaussianMixture(n_components=4).fit(X)",
                "GaussianMixture(n_components=4, random_state=0).fit(X)",
                "seeded: an unseeded mixture numbers its components differently run to run, "
                "so two plain runs colour the figures differently",
            ),
            ("step", 13, "gmm4", "a model fit"),
            _sub(
                19,
                "nsig * height,\n                             angle, **kwargs))",
                "nsig * height,\n                             angle=angle, **kwargs))",
                "matplotlib 3.6 made Ellipse's angle keyword-only (positionally it raises "
                "TypeError)",
            ),
            ("step", 21, "gmm_ellipses", "a model fit"),
            ("step", 23, "gmm_stretched", "a model fit"),
            ("step", 30, "gmm_moons", "a model fit"),
            ("step", 32, "gmm16", "a 16-component fit"),
            ("step", 37, "bic_aic", "20 fits"),
            (
                "drop",
                46,
                "16 fits of 50 to 200 components on the digits: about 3 minutes on a loaded "
                "2-core machine, too slow to run seven times per corpus run",
            ),
            ("step", 48, "gmm_digits", "a 140-component fit on the digits (about 12 s)"),
        ],
    },
    "pdsh_svm": {
        "source": (*PDSH, "notebooks/05.07-Support-Vector-Machines.ipynb"),
        "changes": [
            _sub(2, *STYLE),
            ("step", 13, "svc_linear", "a model fit"),
            ("step", 20, "svm_sizes", "two fits and their figure"),
            ("drop", 23, "an ipywidgets `interact` slider: interactive, nothing to run headless"),
            _sub(
                25,
                "make_circles(100, factor=.1, noise=.1)",
                "make_circles(100, factor=.1, noise=.1, random_state=0)",
                "seeded: unseeded noise draws other points on every run, so two plain runs differ",
            ),
            ("step", 25, "circles_linear", "a model fit"),
            ("step", 31, "svc_rbf", "a model fit"),
            ("step", 38, "soft_margin", "two fits and their figure"),
            *[
                ("drop", i, "fetch_lfw_people downloads 200 MB of faces; no network here")
                for i in (41, 43, 45, 47, 49, 51, 53, 55, 57)
            ],
        ],
    },
    "pdsh_kde": {
        "source": (*PDSH, "notebooks/05.13-Kernel-Density-Estimation.ipynb"),
        "changes": [
            _sub(2, *STYLE),
            ("step", 20, "kde", "a model fit"),
            ("step", 23, "bandwidth_loo", "2,000 fits (100 bandwidths, leave-one-out)"),
            _sub(
                35,
                "{'bandwidth': np.logspace(0, 2, 100)}",
                "{'bandwidth': np.logspace(0, 2, 10)}",
                "100 bandwidths times 5 folds of a 10-class KDE on 1,797 digits take over 2 "
                "minutes on a loaded 2-core machine, too slow to run seven times per corpus run; "
                "10 bandwidths keep the search",
            ),
            ("step", 35, "kde_classifier", "50 fits of the notebook's KDEClassifier"),
            ("step", 39, "naive_bayes", "5 fits"),
        ],
    },
    # -- OpenAI cookbook and Agents SDK ----------------------------------------------------
    "oa_function_calling": {
        "source": (
            OACB,
            "a1747ab3885a9afe3662c24edae6cc0ed9215cba",
            "examples/How_to_call_functions_with_chat_models.ipynb",
        ),
        "notes": [OACB_NOTE],
        "changes": [
            ("drop", 2, PIP),
            _sub(3, "import json\n", "import json\nimport os\n", "for the two changes of cell 5"),
            _sub(
                5,
                '"Bearer " + openai.api_key',
                '"Bearer " + os.environ["OPENAI_API_KEY"]',
                "openai 1.x no longer sets the module's api_key from the environment (it is "
                "None, and the string concatenation raises)",
            ),
            _sub(
                5,
                '"https://api.openai.com/v1/chat/completions"',
                'os.environ["OPENAI_BASE_URL"] + "/chat/completions"',
                "the URL is written out; the harness's fake server stands in for it",
            ),
            *[("step", i, f"ask{i}", "a model call") for i in (10, 12, 14, 16, 19, 20, 22, 24)],
            (
                "insert",
                27,
                CHINOOK,
                "the cookbook ships the Chinook sample database (1 MB, binary) beside the "
                "notebook as data/Chinook.db; this cell makes a small one with its Artist, Album "
                "and Track tables",
            ),
            ("step", 35, "top_artists", "a model call and the query it asks for"),
            ("step", 36, "top_album", "a model call and the query it asks for"),
        ],
    },
    "oa_stream": {
        "source": (
            OACB,
            "46bbf75000c8a5284fc131ee0539e079b4629348",
            "examples/How_to_stream_completions.ipynb",
        ),
        "notes": [OACB_NOTE],
        "changes": [
            ("step", 4, "count_to_100", "a model call"),
            ("step", 8, "one_plus_one", "a streamed model call"),
            ("step", 11, "count_streamed", "a streamed model call"),
            (
                "insert",
                12,
                "del start_time, response_time, chunk_time",
                "the notebook keeps its timings (time.time() differences) in variables, which "
                "differ between any two runs, plain ones too; deleted last, so the values "
                "compared are the program's results",
            ),
        ],
    },
    "oa_guardrails": {
        "source": (
            OACB,
            "1bae324bace0f49e67b1ef94aa20f50e3a247160",
            "examples/How_to_use_guardrails.ipynb",
        ),
        "notes": [OACB_NOTE],
        "changes": [
            ("step", 5, "good_request", "a chat call and its guardrail's, run as two tasks"),
            ("step", 6, "bad_request", "the same for the off-topic request"),
            (
                "drop",
                12,
                "the moderation guardrail reads the model's reply as an integer score "
                "(`int(moderation_response)`); the fake server answers text, so it raises",
            ),
        ],
    },
    "ag_hello_world": {
        "source": (*AGENTS, "examples/basic/hello_world_jupyter.ipynb"),
        "changes": [("step", 0, "haiku --http", "an agent run; " + HTTP)],
    },
    "ag_getting_started": {
        "source": (
            "openai/openai-cookbook",
            "3aa8c9f92a04c4cec1f2c691725d7139c178f63c",
            "examples/agents_sdk/getting_started_with_agents_sdk.ipynb",
        ),
        "notes": [
            "Read with the search tool's read_file (the repository's snapshot is over the size "
            "limit for a fetch) and written out as nbformat writes it (sorted keys, one-space "
            "indent); its length, 14,136 characters, is the stored file's."
        ],
        "changes": [
            ("drop", 2, PIP),
            ("step", 5, "first_agent --http", "an agent run; " + HTTP),
            ("step", 7, "tools --http", "an agent run with tool calls; " + HTTP),
            ("step", 9, "structured --http", "an agent run with a structured output; " + HTTP),
            (
                "sub",
                11,
                'async with Runner.run_streamed(writer_agent, "Write a short poem about the '
                'ocean.") as stream:\n'
                "    async for event in stream.stream_events():\n"
                "        if isinstance(event, RawResponsesStreamEvent):\n"
                "            if isinstance(event.data, ResponseTextDeltaEvent):\n"
                '                print(event.data.delta, end="", flush=True)',
                "stream = Runner.run_streamed(\n"
                '    writer_agent, "Write a short poem about the ocean."\n'
                ")\n"
                "async for event in stream.stream_events():\n"
                "    if isinstance(event, RawResponsesStreamEvent):\n"
                "        if isinstance(event.data, ResponseTextDeltaEvent):\n"
                '            print(event.data.delta, end="", flush=True)',
                "RunResultStreaming is not an async context manager (openai-agents 0.24: the "
                "`async with` raises TypeError); the SDK's documented form",
            ),
            ("step", 11, "streaming --http", "a streamed agent run; " + HTTP),
            ("step", 13, "handoffs --http", "an agent run with a handoff; " + HTTP),
            (
                "sub",
                15,
                "from agents import GuardrailTripwireTriggered, InputGuardrailTripwireTriggered",
                "from agents import InputGuardrailTripwireTriggered",
                "agents has no GuardrailTripwireTriggered (the import raises ImportError); the "
                "cell uses only the other name",
            ),
            ("step", 15, "guardrails --http", "two guarded agent runs; " + HTTP),
            ("step", 17, "pipeline --http", "an agent run with tools and a handoff; " + HTTP),
        ],
    },
    # -- DSPy tutorials ---------------------------------------------------------------------
    "dspy_custom_module": {
        "source": (
            "stanfordnlp/dspy",
            "6ae6736d80b8c59550eddba61baa866be2e6712b",
            "docs/docs/tutorials/custom_module/index.ipynb",
        ),
        "changes": [
            _sub(
                5,
                "    results = dspy.ColBERTv2(url='http://20.102.90.50:2017/wiki17_abstracts')"
                "(query, k=1)",
                '    results = [{"text": "LeBron James | LeBron Raymone James Sr. (born 1984) is '
                'an American professional basketball player."}]',
                "the search asks a ColBERTv2 server on the network; one local abstract stands in "
                "for its answer",
            ),
            _sub(
                8,
                'dspy.LM("openai/gpt-4o-mini")',
                'dspy.LM("openai/gpt-4o-mini", cache=False)',
                DSPY_CACHE,
            ),
            ("step", 8, "rag --http", "a module run (two model calls); " + HTTP),
        ],
    },
    # -- LangChain Academy ------------------------------------------------------------------
    "la_basics": {
        "source": (*ACADEMY, "module-0/basics.ipynb"),
        "changes": [
            ("drop", 2, PIP),
            ("step", 7, "hello_lance --http", "a chat model call; " + HTTP),
            ("step", 9, "hello_gpt4o --http", "a chat model call; " + HTTP),
            ("step", 10, "hello_gpt35 --http", "a chat model call; " + HTTP),
            (
                "drop",
                13,
                "asks for a Tavily API key interactively (getpass); Tavily is a web search, and "
                "there is no network",
            ),
            ("drop", 14, "a Tavily web search; there is no network"),
            ("drop", 15, "shows the search's results (cell 14)"),
        ],
    },
    "la_agent_memory": {
        "source": (*ACADEMY, "module-1/agent-memory.ipynb"),
        "changes": [
            ("drop", 2, PIP),
            (
                "drop",
                5,
                "asks for a LangSmith API key interactively (getpass) and turns on tracing to "
                "LangSmith; there is no network",
            ),
            _sub(
                9,
                "\n# Show\ndisplay(Image(react_graph.get_graph(xray=True).draw_mermaid_png()))",
                "",
                MERMAID,
            ),
            ("step", 11, "add --http", "an agent run; " + HTTP),
            ("step", 13, "multiply --http", "an agent run; " + HTTP),
            ("step", 17, "add_memory --http", "an agent run on a thread; " + HTTP),
            ("step", 19, "multiply_memory --http", "an agent run on the same thread; " + HTTP),
        ],
    },
    # -- LangChain docs tutorials, as a user ran them in Colab --------------------------------
    "lc_llm_chain": {
        "source": (
            TRILCE,
            "521ce2c91164bb16484990b0dc81f6431202bc65",
            "docs/docs/tutorials/llm_chain.ipynb",
        ),
        "notes": [TRILCE_NOTE],
        "changes": [
            ("drop", 3, PIP),
            ("drop", 4, COLAB),
            ("step", 7, "translate --http", "a chat model call; " + HTTP),
            ("step", 9, "stream --http", "a streamed chat model call; " + HTTP),
            ("step", 19, "chain --http", "a prompt template's messages to the model; " + HTTP),
        ],
    },
    "lc_chatbot": {
        "source": (
            TRILCE,
            "e03e178f35440948b93c4de136faedfe37facdd8",
            "docs/docs/tutorials/chatbot.ipynb",
        ),
        "notes": [TRILCE_NOTE],
        "changes": [
            ("drop", 3, PIP),
            ("drop", 4, COLAB + "; it also turns on tracing to LangSmith, and there is no network"),
            ("step", 7, "hi_bob --http", "a chat model call; " + HTTP),
            ("step", 9, "whats_my_name --http", "a chat model call; " + HTTP),
            ("step", 11, "with_history --http", "a chat model call with the history; " + HTTP),
            ("step", 18, "thread_hi_bob --http", "a graph run on a thread; " + HTTP),
            ("step", 19, "thread_name --http", "a graph run on the same thread; " + HTTP),
            ("step", 21, "other_thread --http", "a graph run on another thread; " + HTTP),
            ("step", 24, "back_to_thread --http", "a graph run on the first thread; " + HTTP),
            ("step", 31, "pirate_jim --http", "a graph run with a prompt template; " + HTTP),
            ("step", 32, "pirate_name --http", "a graph run on the same thread; " + HTTP),
            ("step", 37, "spanish_bob --http", "a graph run with a language; " + HTTP),
            ("step", 39, "spanish_name --http", "a graph run on the same thread; " + HTTP),
            *[
                (
                    "drop",
                    i,
                    "trim_messages(token_counter=model) counts tokens with tiktoken, which "
                    "downloads its encoding on first use; there is no network",
                )
                for i in (42, 44, 46, 48)
            ],
            ("step", 51, "stream_todd --http", "a streamed graph run; " + HTTP),
        ],
    },
    # -- LlamaIndex workflows -----------------------------------------------------------------
    "li_agent": {
        "source": (
            "run-llama/workflows-py",
            "b32ec53ef91825f71429e8cecc0bed40e6e71002",
            "examples/agent.ipynb",
        ),
        "changes": [
            ("drop", 1, PIP),
            _sub(
                6,
                "from llama_index.llms.openai import OpenAI",
                "from llama_index.llms.litellm import LiteLLM as OpenAI",
                LITELLM,
            ),
            ("step", 9, "hello --http", "an agent workflow run; " + HTTP),
            ("step", 11, "arithmetic --http", "an agent workflow run with tool calls; " + HTTP),
            ("step", 13, "chat_history --http", "two runs on one context; " + HTTP),
            ("step", 15, "story --http", "a streamed agent workflow run; " + HTTP),
        ],
    },
    "li_durable_workflows": {
        "source": (
            "run-llama/workflows-py",
            "300fd0541603d2496e6080bf9499205a0058df1c",
            "examples/durable_workflows.ipynb",
        ),
        "changes": [
            ("drop", 1, PIP),
            ("step", 3, "instance_state", "three workflow runs"),
            ("step", 5, "context_state", "two workflow runs on one context"),
            (
                "drop",
                7,
                "calls ctx.to_dict() inside a step, which llama-index-workflows 2.26 refuses "
                "(ContextStateError: to_dict is only available from handler code)",
            ),
        ],
    },
    # -- smolagents (Hugging Face cookbook) ---------------------------------------------------
    "smol_text_to_sql": {
        "source": (
            "huggingface/cookbook",
            "31b89f16ac72bd07b2dec3944ca26558bc822f29",
            "notebooks/en/agent_text_to_sql.ipynb",
        ),
        "changes": [
            _sub(9, "InferenceClientModel", "OpenAIServerModel", HF_MODEL),
            _sub(
                9,
                'OpenAIServerModel("meta-llama/Meta-Llama-3-8B-Instruct")',
                'OpenAIServerModel("gpt-4o-mini")',
                HF_MODEL,
            ),
            (
                "step",
                10,
                "most_expensive --http",
                "a code agent run (a loop of model calls); " + HTTP,
            ),
            _sub(
                16,
                'model=InferenceClientModel("Qwen/Qwen2.5-72B-Instruct")',
                'model=OpenAIServerModel("gpt-4o")',
                HF_MODEL,
            ),
            ("step", 16, "tips --http", "a code agent run; " + HTTP),
        ],
    },
    # -- LangGraph docs ---------------------------------------------------------------------
    "lg_persistence": {
        "source": (
            LG,
            "85c809a6512f72399af409362112583767304984",
            "docs/docs/how-tos/persistence.ipynb",
        ),
        "changes": [
            ("drop", 1, PIP),
            ("step", 5, "chat --http", "two graph runs (model calls); " + HTTP),
            ("step", 16, "memory_store --http", "two graph runs; " + HTTP),
        ],
    },
    "lg_react_memory": {
        "source": (
            LG,
            "190b42850f227fa347da65dc3573622675b1f2bd",
            "docs/docs/how-tos/create-react-agent-memory.ipynb",
        ),
        "changes": [
            ("drop", 2, PIP),
            ("step", 9, "weather --http", "an agent run; " + HTTP),
            ("step", 11, "known_for --http", "an agent run on the same thread; " + HTTP),
        ],
    },
    "lg_react_scratch": {
        "source": (
            LG,
            "77935100b06ff3e95b2ac3f2636a43bce9c0461c",
            "docs/docs/how-tos/react-agent-from-scratch.ipynb",
        ),
        "changes": [
            ("drop", 1, PIP),
            (
                "step",
                13,
                "agent_run --http",
                "an agent run (a step cannot be named `run`: that is a `%step` command); " + HTTP,
            ),
        ],
    },
    "lg_persistence_functional": {
        "source": (
            LG,
            "249f3bcf296ec378d90cd03a63d52075cc1a6ba2",
            "docs/docs/how-tos/persistence-functional.ipynb",
        ),
        "changes": [
            ("drop", 2, PIP),
            _sub(
                9,
                "InMemoryCheckpointer",
                "InMemorySaver",
                "langgraph renamed the in-memory checkpointer (the old name no longer imports)",
            ),
            ("step", 13, "hi_bob --http", "a workflow run; " + HTTP),
            ("step", 15, "whats_my_name --http", "a workflow run on the same thread; " + HTTP),
            ("step", 17, "other_thread --http", "a workflow run on another thread; " + HTTP),
        ],
    },
    "lg_structured_output": {
        "source": (
            LG,
            "3c3428da7850b3299b7a0529703d1af2a534d874",
            "docs/docs/how-tos/create-react-agent-structured-output.ipynb",
        ),
        "changes": [
            ("drop", 2, PIP),
            ("step", 8, "weather --http", "an agent run with a structured response; " + HTTP),
            ("step", 13, "weather_prompt --http", "the same with a prompt; " + HTTP),
        ],
    },
    "lg_summary": {
        "source": (
            LG,
            "22e4bf74fc49cf02ad2b482e9689b83ebc03ab43",
            "docs/docs/how-tos/memory/add-summary-conversation-history.ipynb",
        ),
        "changes": [
            ("drop", 2, PIP),
            ("step", 10, "chat --http", "three graph runs on one thread; " + HTTP),
            ("step", 14, "celtics_win --http", "a graph run that summarizes; " + HTTP),
            ("step", 18, "whats_my_name --http", "a graph run; " + HTTP),
            ("step", 19, "nfl_team --http", "a graph run; " + HTTP),
            ("step", 20, "patriots --http", "a graph run; " + HTTP),
        ],
    },
}


def adapt(name: str, entry: dict) -> nbformat.NotebookNode:
    """The adapted notebook of `name` (see the module docstring)."""
    nb = nbformat.read(HERE / "original" / f"{name}.ipynb", as_version=4)
    sources = {i: c.source for i, c in enumerate(nb.cells)}
    drops, inserts = set(), {}
    for change in entry["changes"]:
        kind, i = change[0], change[1]
        assert 0 <= i < len(nb.cells), (name, change)
        if kind == "step":
            assert nb.cells[i].cell_type == "code", (name, change)
            sources[i] = f"%%step {change[2]}\n" + sources[i]
        elif kind == "sub":
            assert change[2] in sources[i], (name, change)
            sources[i] = sources[i].replace(change[2], change[3])
        elif kind == "drop":
            drops.add(i)
        elif kind == "insert":
            inserts.setdefault(i, []).append(change[2])
        else:
            raise ValueError(change)
    cells = [nbformat.v4.new_code_cell("%load_ext nbdurable")]
    for i, cell in enumerate(nb.cells):
        for source in inserts.get(i, []):
            cells.append(nbformat.v4.new_code_cell(source))
        if i in drops:
            continue
        cell = nbformat.from_dict(json.loads(json.dumps(cell)))
        cell.source = sources[i]
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cells.append(cell)
    nb.cells = cells
    nb.nbformat = 4
    nb.nbformat_minor = 5
    for k, cell in enumerate(nb.cells):
        cell["id"] = f"realnb-{k}"
        cell.pop("attachments", None) if cell.cell_type == "code" else None
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def sources_md() -> str:
    """The text of SOURCES.md."""
    out = [
        "# The real-notebook corpus: where each notebook comes from, and what was changed",
        "",
        "Generated by `python tests/realnb/adapt.py` from its table `NOTEBOOKS` (edit there, not",
        "here). `original/<name>.ipynb` is the file exactly as stored in the repository at the",
        "commit (read with `git show COMMIT:PATH` from the search tool's snapshot of the",
        "repository); `adapted/<name>.ipynb` is made from it by the changes listed. Cell numbers",
        "are the original's, 0-based, markdown cells counted. Every adapted notebook also has a",
        "first cell `%load_ext nbdurable` and no outputs.",
        "",
        "| name | repository | commit | path |",
        "|---|---|---|---|",
    ]
    for name, entry in NOTEBOOKS.items():
        repo, commit, path = entry["source"]
        out.append(f"| `{name}` | {repo} | `{commit}` | `{path}` |")
    out.append("")
    for name, entry in NOTEBOOKS.items():
        repo, commit, path = entry["source"]
        out += [f"## `{name}`", "", f"{repo} `{path}` at `{commit[:12]}`.", ""]
        for note in entry.get("notes", []):
            out += [note, ""]
        for change in entry["changes"]:
            kind, i = change[0], change[1]
            if kind == "step":
                out.append(f"- cell {i}: `%%step {change[2]}` ({change[3]})")
            elif kind == "sub":
                old = change[2].replace("\n", "⏎")
                new = change[3].replace("\n", "⏎")
                out.append(f"- cell {i}: `{old}` → `{new}` ({change[4]})")
            elif kind == "drop":
                out.append(f"- cell {i}: removed ({change[2]})")
            elif kind == "insert":
                src = change[2].replace("\n", "⏎")
                out.append(f"- before cell {i}: new cell `{src}` ({change[3]})")
        out.append("")
    return "\n".join(out)


def main() -> None:
    for name, entry in NOTEBOOKS.items():
        nbformat.write(adapt(name, entry), str(HERE / "adapted" / f"{name}.ipynb"))
    (HERE / "SOURCES.md").write_text(sources_md())


if __name__ == "__main__":
    main()
