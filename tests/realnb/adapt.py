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

STYLE = (
    "plt.style.use('seaborn-whitegrid')",
    "plt.style.use('seaborn-v0_8-whitegrid')",
    "matplotlib 3.6 renamed the seaborn styles (the old name raises OSError)",
)
PIP = "a `pip install` cell: the packages are in requirements.txt, and there is no network"
KEY = "asks for an API key interactively; the harness sets a dummy key and the fake server's URL"
HTTP = (
    "--http: the model calls are made deep inside the library, so the step records them at the "
    "transport (README, LLM clients) and a killed step's finished calls are not sent again"
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
