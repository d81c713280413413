"""The library-coverage cases: one class each, declared by a step, changed by the next, then read.

``LIBS[lib]`` is the plain setup cell of library ``lib``'s notebook (its
imports and shared inputs; ``%load_ext nbdurable`` goes before it). Each
:class:`Case` becomes three cells of that notebook, in the order of
``CASES``::

    %%step make_<name>        declare: binds an object of `cls`
    %%step change_<name>      change: changes it (fit, set, append, draw...)
    <read>                    a plain cell reading it

In the sources ``P_`` stands for the case's own prefix ``<name>_``
(``P_model`` is ``sk_kmeans_model``): every variable a case binds starts with
it, so the probe's lines are told apart per case and no two cases share a
name. A case reads only the setup cell's names and its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    lib: str
    #: the class of the object the case declares and changes, by qualified name
    cls: str
    declare: str
    change: str
    read: str


#: library -> its setup cell
LIBS: dict[str, str] = {}
#: library -> the modules its notebook imports (a missing one skips its cases)
NEEDS: dict[str, tuple[str, ...]] = {}
CASES: list[Case] = []


def lib(name: str, needs: tuple[str, ...], setup: str) -> None:
    LIBS[name] = setup
    NEEDS[name] = needs


def case(name: str, cls: str, declare: str, change: str, read: str) -> None:
    library = next(reversed(LIBS))
    CASES.append(Case(name, library, cls, declare, change, read))


# -- scikit-learn -----------------------------------------------------------------------------

lib(
    "sklearn",
    ("sklearn",),
    """
import numpy as np
import pandas as pd
from sklearn.cluster import KMeans
from sklearn.compose import ColumnTransformer
from sklearn.datasets import make_blobs, make_classification
from sklearn.decomposition import PCA
from sklearn.ensemble import RandomForestClassifier
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LinearRegression, LogisticRegression, SGDClassifier
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import LabelEncoder, OneHotEncoder, StandardScaler
from sklearn.tree import DecisionTreeClassifier
Xb, yb = make_blobs(n_samples=60, centers=3, random_state=0)
Xc, yc = make_classification(n_samples=80, n_features=5, random_state=0)
""",
)
case(
    "sk_kmeans",
    "sklearn.cluster.KMeans",
    "P_m = KMeans(n_clusters=3, n_init=3, random_state=0)",
    "P_m.fit(Xb)",
    "print(round(P_m.inertia_, 6), P_m.predict(Xb[:6]))",
)
case(
    "sk_linreg",
    "sklearn.linear_model.LinearRegression",
    "P_m = LinearRegression()",
    "P_m.fit(Xc, yc)",
    "print(P_m.coef_.round(6), round(P_m.intercept_, 6))",
)
case(
    "sk_logreg",
    "sklearn.linear_model.LogisticRegression",
    "P_m = LogisticRegression(max_iter=300)",
    "P_m.set_params(C=0.5)\nP_m.fit(Xc, yc)",
    "print(P_m.C, P_m.predict_proba(Xc[:3]).round(6))",
)
case(
    "sk_forest",
    "sklearn.ensemble.RandomForestClassifier",
    "P_m = RandomForestClassifier(n_estimators=5, random_state=0)",
    "P_m.fit(Xc, yc)",
    "print(P_m.feature_importances_.round(6), len(P_m.estimators_))",
)
case(
    "sk_scaler",
    "sklearn.preprocessing.StandardScaler",
    "P_s = StandardScaler()",
    "P_s.partial_fit(Xc[:40])\nP_s.partial_fit(Xc[40:])",
    "print(P_s.n_samples_seen_, P_s.mean_.round(6), P_s.var_.round(6))",
)
case(
    "sk_pca",
    "sklearn.decomposition.PCA",
    "P_m = PCA(n_components=2)",
    "P_z = P_m.fit_transform(Xc)\nprint(P_z.shape)",
    "print(P_m.explained_variance_ratio_.round(6))",
)
case(
    "sk_pipeline",
    "sklearn.pipeline.Pipeline",
    'P_m = Pipeline([("sc", StandardScaler()), ("lr", LogisticRegression())])',
    "P_m.set_params(lr__C=2.0)\nP_m.fit(Xc, yc)",
    'print(P_m.score(Xc, yc), P_m.named_steps["lr"].coef_.round(6))',
)
case(
    "sk_grid",
    "sklearn.model_selection.GridSearchCV",
    'P_m = GridSearchCV(DecisionTreeClassifier(random_state=0), {"max_depth": [1, 2, 3]}, cv=3)',
    "P_m.fit(Xc, yc);  # its HTML repr shows the fit times",
    'print(P_m.best_params_, P_m.cv_results_["mean_test_score"].round(6))',
)
case(
    "sk_tfidf",
    "sklearn.feature_extraction.text.TfidfVectorizer",
    "P_v = TfidfVectorizer()",
    'P_x = P_v.fit_transform(["the cat sat", "the dog ran", "a cat ran"])',
    "print(sorted(P_v.vocabulary_.items()), P_x.nnz)",
)
case(
    "sk_onehot",
    "sklearn.preprocessing.OneHotEncoder",
    'P_e = OneHotEncoder(handle_unknown="ignore")',
    'P_e.fit([["a"], ["b"], ["a"]])',
    'print(P_e.categories_, P_e.transform([["b"], ["c"]]).toarray())',
)
case(
    "sk_gmm",
    "sklearn.mixture.GaussianMixture",
    "P_m = GaussianMixture(n_components=3, random_state=0)",
    "P_m.fit(Xb)",
    "print(P_m.means_.round(4), P_m.converged_)",
)
case(
    "sk_knn",
    "sklearn.neighbors.KNeighborsClassifier",
    "P_m = KNeighborsClassifier(n_neighbors=3)",
    "P_m.fit(Xc, yc)",
    "print(P_m.predict(Xc[:10]), P_m.n_samples_fit_)",
)
case(
    "sk_sgd",
    "sklearn.linear_model.SGDClassifier",
    "P_m = SGDClassifier(random_state=0)",
    "for P_i in range(3):\n    P_m.partial_fit(Xc, yc, classes=[0, 1])",
    "print(P_m.t_, P_m.coef_.round(6))",
)
case(
    "sk_coltrans",
    "sklearn.compose.ColumnTransformer",
    'P_df = pd.DataFrame({"n": [1.0, 2.0, 3.0], "c": ["x", "y", "x"]})\n'
    'P_m = ColumnTransformer([("num", StandardScaler(), ["n"]), ("cat", OneHotEncoder(), ["c"])])',
    "P_out = P_m.fit_transform(P_df)",
    "print(P_m.get_feature_names_out(), P_out.round(6))",
)
case(
    "sk_labelenc",
    "sklearn.preprocessing.LabelEncoder",
    "P_e = LabelEncoder()",
    'P_e.fit(["b", "a", "c", "a"])',
    'print(P_e.classes_, P_e.transform(["c", "a"]))',
)
case(
    "sk_mlp",
    "sklearn.neural_network.MLPClassifier",
    "P_m = MLPClassifier(hidden_layer_sizes=(4,), max_iter=20, random_state=0)",
    "P_m.fit(Xc, yc)",
    "print(P_m.n_iter_, round(P_m.loss_, 6))",
)

# -- statsmodels ------------------------------------------------------------------------------

lib(
    "statsmodels",
    ("statsmodels",),
    """
import numpy as np
import pandas as pd
import statsmodels.api as sm
import statsmodels.formula.api as smf
from statsmodels.tsa.arima.model import ARIMA
from statsmodels.tsa.holtwinters import ExponentialSmoothing
rng = np.random.default_rng(0)
x = rng.normal(size=50)
y = 2 * x + 1 + rng.normal(scale=0.5, size=50)
counts = rng.poisson(np.exp(0.3 * x + 1))
binary = (y > 1).astype(int)
df = pd.DataFrame({"x": x, "y": y})
walk = np.cumsum(rng.normal(size=40)) + 10
days = pd.date_range("2020-01-01", periods=40, freq="D")
# one series per case: a model's fit fills caches inside the series it is given
series_arima = pd.Series(walk, index=days)
series_ets = pd.Series(walk, index=days.copy())
""",
)
case(
    "sm_ols",
    "statsmodels.regression.linear_model.OLS",
    "P_model = sm.OLS(y, sm.add_constant(x))",
    "P_res = P_model.fit()",
    "print(P_res.params.round(6), round(P_res.rsquared, 6))\nprint(P_res.summary().tables[1])",
)
case(
    "sm_glm",
    "statsmodels.genmod.generalized_linear_model.GLM",
    "P_model = sm.GLM(counts, sm.add_constant(x), family=sm.families.Poisson())",
    "P_res = P_model.fit()",
    "print(P_res.params.round(6), round(P_res.deviance, 6))",
)
case(
    "sm_logit",
    "statsmodels.discrete.discrete_model.Logit",
    "P_model = sm.Logit(binary, sm.add_constant(x))",
    "P_res = P_model.fit(disp=0)",
    "print(P_res.params.round(6), round(P_res.llf, 6))",
)
case(
    "sm_wls",
    "statsmodels.regression.linear_model.WLS",
    "P_model = sm.WLS(y, sm.add_constant(x), weights=np.linspace(1, 2, 50))",
    "P_res = P_model.fit()",
    "print(P_res.params.round(6), P_res.bse.round(6))",
)
case(
    "sm_arima",
    "statsmodels.tsa.arima.model.ARIMA",
    "P_model = ARIMA(series_arima, order=(1, 0, 0))",
    "P_res = P_model.fit()",
    "print(P_res.params.round(4), P_res.forecast(2).round(4))",
)
case(
    "sm_ets",
    "statsmodels.tsa.holtwinters.ExponentialSmoothing",
    'P_model = ExponentialSmoothing(series_ets, trend="add")',
    "P_res = P_model.fit()",
    "print(P_res.forecast(3).round(4))",
)
case(
    "sm_formula",
    "statsmodels.regression.linear_model.OLS (formula)",
    'P_model = smf.ols("y ~ x", data=df)',
    "P_res = P_model.fit()",
    "print(P_res.params.round(6), P_model.formula)",
)
case(
    "sm_results",
    "statsmodels.regression.linear_model.RegressionResultsWrapper",
    "P_res = sm.OLS(y, sm.add_constant(x)).fit()",
    "P_res.remove_data()",
    "print(P_res.params.round(6), P_res.model.exog)",
)
case(
    "sm_kde",
    "statsmodels.nonparametric.kde.KDEUnivariate",
    "P_kde = sm.nonparametric.KDEUnivariate(x)",
    "P_kde.fit()",
    "print(P_kde.density[:5].round(6), round(P_kde.bw, 6))",
)

# -- matplotlib -------------------------------------------------------------------------------

lib(
    "matplotlib",
    ("matplotlib",),
    """
import numpy as np
import matplotlib
import matplotlib.colors as mcolors
import matplotlib.lines as mlines
import matplotlib.patches as mpatches
import matplotlib.pyplot as plt
import matplotlib.text as mtext
import matplotlib.transforms as mtransforms
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpec
""",
)
case(
    "mp_figure",
    "matplotlib.figure.Figure",
    "P_fig = Figure(figsize=(3, 2), dpi=50)\nP_ax = P_fig.add_subplot()",
    'P_ax.plot([1, 2, 3], [3, 1, 2], label="a")\nP_ax.set_title("t")',
    "P_fig",
)
case(
    "mp_pyplot",
    "matplotlib.pyplot.subplots (Figure, Axes)",
    "P_fig, P_ax = plt.subplots(figsize=(3, 2), dpi=50)",
    'P_ax.bar(["a", "b"], [1, 2])\nP_ax.set_ylabel("n")',
    "display(P_fig)\nprint(P_ax.get_ylabel(), len(P_ax.patches))",
)
case(
    "mp_axes",
    "matplotlib.axes.Axes",
    "P_fig = Figure(figsize=(3, 2), dpi=50)\nP_ax = P_fig.add_subplot()",
    'P_ax.set_xlim(0, 10)\nP_ax.set_xscale("symlog")\nP_ax.set_xlabel("x")',
    "print(P_ax.get_xlim(), P_ax.get_xscale(), P_ax.get_xlabel())",
)
case(
    "mp_line",
    "matplotlib.lines.Line2D",
    "P_line = mlines.Line2D([0, 1], [0, 1])",
    'P_line.set_data([0, 1, 2], [2, 1, 0])\nP_line.set_color("red")',
    "print(P_line.get_xydata().tolist(), P_line.get_color())",
)
case(
    "mp_text",
    "matplotlib.text.Text",
    'P_t = mtext.Text(0, 0, "hi")',
    'P_t.set_text("hello")\nP_t.set_fontsize(20)\nP_t.set_position((1, 2))',
    "print(P_t.get_text(), P_t.get_fontsize(), P_t.get_position())",
)
case(
    "mp_rect",
    "matplotlib.patches.Rectangle",
    "P_r = mpatches.Rectangle((0, 0), 1, 2)",
    'P_r.set_width(3)\nP_r.set_facecolor("green")',
    "print(P_r.get_width(), P_r.get_facecolor(), P_r.get_bbox().bounds)",
)
case(
    "mp_cmap",
    "matplotlib.colors.ListedColormap",
    'P_cm = mcolors.ListedColormap(["red", "green", "blue"], name="rgb")',
    'P_cm = P_cm.with_extremes(under="black", over="white")\nP_cm.colorbar_extend = "both"',
    "print(P_cm(-1.0), P_cm(2.0), P_cm.colorbar_extend, P_cm.N)",
)
case(
    "mp_norm",
    "matplotlib.colors.Normalize",
    "P_n = mcolors.Normalize()",
    "P_n.autoscale([1.0, 5.0, 9.0])",
    "print(P_n.vmin, P_n.vmax, P_n(5.0))",
)
case(
    "mp_image",
    "matplotlib.image.AxesImage",
    "P_fig = Figure(figsize=(2, 2), dpi=40)\n"
    "P_im = P_fig.add_subplot().imshow(np.arange(6).reshape(2, 3))",
    'P_im.set_clim(0, 10)\nP_im.set_cmap("gray")',
    "print(P_im.get_clim(), P_im.get_cmap().name)\nP_fig",
)
case(
    "mp_legend",
    "matplotlib.legend.Legend",
    "P_fig = Figure(figsize=(3, 2), dpi=50)\nP_ax = P_fig.add_subplot()\n"
    'P_ax.plot([0, 1], label="one")\nP_ax.plot([1, 0], label="two")\nP_leg = P_ax.legend()',
    'P_leg.set_title("lines")\nP_leg.get_texts()[0].set_text("uno")',
    "print(P_leg.get_title().get_text(), [t.get_text() for t in P_leg.get_texts()])\nP_fig",
)
case(
    "mp_gridspec",
    "matplotlib.gridspec.GridSpec",
    "P_gs = GridSpec(2, 3)",
    "P_gs.update(wspace=0.5, hspace=0.25)",
    "print(P_gs.get_geometry(), P_gs.wspace, P_gs.hspace)",
)
case(
    "mp_affine",
    "matplotlib.transforms.Affine2D",
    "P_tr = mtransforms.Affine2D()",
    "P_tr.rotate_deg(30).translate(1, 2)",
    "print(P_tr.get_matrix().round(6), P_tr.transform([1.0, 0.0]).round(6))",
)

# -- plotly -----------------------------------------------------------------------------------

lib(
    "plotly",
    ("plotly",),
    """
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots
pio.renderers.default = "plotly_mimetype"
""",
)
case(
    "pl_figure",
    "plotly.graph_objects.Figure",
    "P_fig = go.Figure()",
    'P_fig.add_trace(go.Scatter(x=[1, 2], y=[3, 4], name="s"))\nP_fig.update_layout(title="T")',
    "P_fig.show()\nprint(len(P_fig.data), P_fig.layout.title.text)",
)
case(
    "pl_scatter",
    "plotly.graph_objects.Scatter",
    "P_tr = go.Scatter(x=[1, 2, 3], y=[1, 4, 9])",
    'P_tr.update(mode="markers", marker_color="red")\nP_tr.name = "squares"',
    "print(P_tr.to_plotly_json())",
)
case(
    "pl_layout",
    "plotly.graph_objects.Layout",
    'P_lay = go.Layout(title_text="a")',
    "P_lay.xaxis.range = [0, 5]\nP_lay.update(height=300)",
    "print(P_lay.to_plotly_json())",
)
case(
    "pl_subplots",
    "plotly.graph_objects.Figure (make_subplots)",
    "P_fig = make_subplots(rows=1, cols=2)",
    "P_fig.add_trace(go.Bar(x=[1], y=[2]), row=1, col=2)\n"
    "P_fig.update_xaxes(title_text='b', col=2)",
    "print(P_fig.to_json())",
)
case(
    "pl_express",
    "plotly.graph_objects.Figure (plotly.express)",
    "P_fig = px.scatter(x=[1, 2, 3], y=[3, 1, 2])",
    "P_fig.update_traces(marker_size=12)\nP_fig.add_hline(y=2)",
    "print(P_fig.to_json())",
)
case(
    "pl_bar",
    "plotly.graph_objects.Bar",
    'P_b = go.Bar(x=["a", "b"], y=[1, 2])',
    'P_b.y = [3, 4]\nP_b.marker.color = "green"',
    "print(P_b.to_plotly_json())",
)
case(
    "pl_annotation",
    "plotly.graph_objects.layout.Annotation",
    'P_a = go.layout.Annotation(text="x", x=1, y=1)',
    "P_a.showarrow = False\nP_a.font.size = 20",
    "print(P_a.to_plotly_json())",
)
case(
    "pl_template",
    "plotly.graph_objects.layout.Template",
    "P_t = go.layout.Template()",
    'P_t.layout.font.family = "serif"\nP_t.data.scatter = [go.Scatter(marker_symbol="x")]',
    "print(P_t.to_plotly_json())",
)
case(
    "pl_heatmap",
    "plotly.graph_objects.Heatmap",
    "P_h = go.Heatmap(z=[[1, 2], [3, 4]])",
    'P_h.colorscale = "Viridis"\nP_h.zmin = 0',
    "print(P_h.to_plotly_json())",
)

# -- seaborn ----------------------------------------------------------------------------------

lib(
    "seaborn",
    ("seaborn",),
    """
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
import seaborn as sns
import seaborn.objects as so
rng = np.random.default_rng(0)
df = pd.DataFrame({"x": rng.normal(size=30), "y": rng.normal(size=30),
                   "kind": ["a", "b", "c"] * 10})
""",
)
case(
    "sb_facet",
    "seaborn.axisgrid.FacetGrid",
    'P_g = sns.FacetGrid(df, col="kind", height=1.5)',
    'P_g.map(plt.scatter, "x", "y")\nP_g.set_titles("{col_name}")',
    "print([ax.get_title() for ax in P_g.axes.flat])\ndisplay(P_g.figure)",
)
case(
    "sb_joint",
    "seaborn.axisgrid.JointGrid",
    'P_g = sns.JointGrid(data=df, x="x", y="y", height=2)',
    "P_g.plot(sns.scatterplot, sns.histplot)",
    "print(len(P_g.ax_joint.collections))\ndisplay(P_g.figure)",
)
case(
    "sb_pair",
    "seaborn.axisgrid.PairGrid",
    'P_g = sns.PairGrid(df[["x", "y"]], height=1.2)',
    "P_g.map_diag(plt.hist)\nP_g.map_offdiag(plt.scatter)",
    "print(P_g.axes.shape)\ndisplay(P_g.figure)",
)
case(
    "sb_plot",
    "seaborn.objects.Plot",
    'P_p = so.Plot(df, x="x", y="y")',
    "P_p = P_p.add(so.Dot()).layout(size=(2, 2))",
    "P_p",
)
case(
    "sb_palette",
    "seaborn.palettes._ColorPalette",
    'P_pal = sns.color_palette("husl", 4)',
    "P_pal.append((0.0, 0.0, 0.0))\nP_pal.reverse()",
    "print(P_pal.as_hex())",
)
case(
    "sb_dot",
    "seaborn.objects.Dot",
    "P_m = so.Dot(pointsize=3)",
    'P_m.color = "red"\nP_m.alpha = 0.5',
    "print(P_m)",
)
case(
    "sb_cluster",
    "seaborn.matrix.ClusterGrid",
    'P_cg = sns.clustermap(df[["x", "y"]].head(6), figsize=(3, 3))',
    'P_cg.ax_heatmap.set_title("c")',
    "print(P_cg.ax_heatmap.get_title(), P_cg.dendrogram_row.reordered_ind)\ndisplay(P_cg.figure)",
)

# -- torch ------------------------------------------------------------------------------------

lib(
    "torch",
    ("torch",),
    """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
""",
)
case(
    "th_tensor",
    "torch.Tensor",
    "P_t = torch.arange(6.0).reshape(2, 3)",
    "P_t.mul_(2)\nP_t[0, 0] = -1",
    "print(P_t)",
)
case(
    "th_grad",
    "torch.Tensor (requires_grad, .grad)",
    "P_x = torch.tensor([1.0, 2.0], requires_grad=True)",
    "(P_x ** 2).sum().backward()",
    "print(P_x.grad)",
)
case(
    "th_linear",
    "torch.nn.Linear",
    "torch.manual_seed(0)\nP_m = nn.Linear(3, 2)",
    "with torch.no_grad():\n    P_m.weight.fill_(0.5)\n    P_m.bias.zero_()",
    "print(P_m(torch.ones(1, 3)))",
)
case(
    "th_sequential",
    "torch.nn.Sequential",
    "torch.manual_seed(0)\nP_m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))",
    "P_opt = torch.optim.SGD(P_m.parameters(), lr=0.1)\n"
    "for P_i in range(5):\n"
    "    P_opt.zero_grad()\n"
    "    P_loss = (P_m(torch.ones(2, 4)) - 1).pow(2).mean()\n"
    "    P_loss.backward()\n"
    "    P_opt.step()",
    "print(round(P_m(torch.ones(1, 4)).item(), 6))",
)
case(
    "th_sgd",
    "torch.optim.SGD",
    "P_w = torch.zeros(3, requires_grad=True)\n"
    "P_opt = torch.optim.SGD([P_w], lr=0.1, momentum=0.9)",
    "for P_i in range(3):\n"
    "    P_opt.zero_grad()\n"
    "    ((P_w - 1) ** 2).sum().backward()\n"
    "    P_opt.step()",
    'print(P_w, P_opt.param_groups[0]["params"][0] is P_w, P_opt.state_dict()["state"])',
)
case(
    "th_adam",
    "torch.optim.Adam",
    "P_w = torch.zeros(2, requires_grad=True)\nP_opt = torch.optim.Adam([P_w], lr=0.05)",
    "for P_i in range(4):\n"
    "    P_opt.zero_grad()\n"
    "    ((P_w - 2) ** 2).sum().backward()\n"
    "    P_opt.step()",
    'print(P_w, P_opt.state_dict()["state"][0]["step"])',
)
case(
    "th_sched",
    "torch.optim.lr_scheduler.StepLR",
    "P_w = torch.zeros(1, requires_grad=True)\nP_opt = torch.optim.SGD([P_w], lr=1.0)\n"
    "P_sched = torch.optim.lr_scheduler.StepLR(P_opt, step_size=2, gamma=0.5)",
    "for P_i in range(5):\n    P_opt.step()\n    P_sched.step()",
    'print(P_sched.get_last_lr(), P_sched.last_epoch, P_opt.param_groups[0]["lr"])',
)
case(
    "th_dataset",
    "torch.utils.data.TensorDataset",
    "P_ds = TensorDataset(torch.arange(10.0), torch.arange(10))",
    "P_ds.tensors = (P_ds.tensors[0] * 2, P_ds.tensors[1])",
    "print([b[0].tolist() for b in DataLoader(P_ds, batch_size=4)])",
)
case(
    "th_generator",
    "torch.Generator",
    "P_g = torch.Generator().manual_seed(0)",
    "P_draw = torch.rand(3, generator=P_g)",
    "print(P_draw, torch.rand(2, generator=P_g))",
)
case(
    "th_param",
    "torch.nn.Parameter",
    "P_p = nn.Parameter(torch.ones(2))",
    "P_p.requires_grad_(False)\nP_p.data.add_(1)",
    "print(P_p, P_p.requires_grad)",
)
case(
    "th_moduledict",
    "torch.nn.ModuleDict",
    'torch.manual_seed(0)\nP_md = nn.ModuleDict({"a": nn.Linear(2, 2)})',
    'P_md["b"] = nn.ReLU()\nP_md.eval()',
    "print(list(P_md.keys()), P_md.training, P_md['a'].training)",
)
case(
    "th_batchnorm",
    "torch.nn.BatchNorm1d",
    "P_bn = nn.BatchNorm1d(3)",
    "P_out = P_bn(torch.randn(8, 3, generator=torch.Generator().manual_seed(1)))",
    "print(P_bn.running_mean, P_bn.num_batches_tracked)",
)
case(
    "th_lstm",
    "torch.nn.LSTM",
    "torch.manual_seed(0)\nP_lstm = nn.LSTM(2, 3, batch_first=True)",
    "P_lstm.train(False)\nwith torch.no_grad():\n    P_lstm.weight_ih_l0.mul_(0.5)",
    "print(P_lstm(torch.ones(1, 2, 2))[0].detach().round(decimals=5), P_lstm.training)",
)
case(
    "th_normal",
    "torch.distributions.Normal",
    "P_d = torch.distributions.Normal(torch.tensor(0.0), torch.tensor(1.0))",
    "P_d.loc.add_(2.0)",
    "print(P_d.mean, P_d.log_prob(torch.tensor(1.0)))",
)

# -- astropy ----------------------------------------------------------------------------------

lib(
    "astropy",
    ("astropy",),
    """
import numpy as np
import astropy.units as u
from astropy.coordinates import SkyCoord
from astropy.cosmology import FlatLambdaCDM
from astropy.modeling import fitting, models
from astropy.nddata import NDData
from astropy.table import Column, QTable, Table
from astropy.time import Time, TimeDelta
from astropy.utils import iers
from astropy.wcs import WCS
iers.conf.auto_download = False
xs = np.linspace(-3, 3, 25)
ys = 2.5 * np.exp(-0.5 * (xs - 0.3) ** 2 / 0.8 ** 2)
""",
)
case(
    "ap_quantity",
    "astropy.units.Quantity",
    "P_q = np.array([1.0, 2.0, 3.0]) * u.m",
    "P_q *= 2\nP_q[0] = 10 * u.cm",
    "print(P_q, P_q.to(u.km))",
)
case(
    "ap_table",
    "astropy.table.Table",
    'P_t = Table({"a": [1, 2], "b": ["x", "y"]})',
    'P_t.add_row([3, "z"])\nP_t["c"] = P_t["a"] * 2\nP_t.meta["note"] = "n"',
    "print(P_t)\nprint(P_t.meta)",
)
case(
    "ap_qtable",
    "astropy.table.QTable",
    'P_t = QTable({"d": [3.0, 1.0, 2.0] * u.m, "n": ["c", "a", "b"]})',
    'P_t.sort("d")\nP_t["d"] = P_t["d"].to(u.km)',
    "print(P_t)",
)
case(
    "ap_time",
    "astropy.time.Time",
    'P_t = Time(["2020-01-01T00:00:00", "2021-06-01T12:00:00"], scale="utc")',
    'P_t.format = "mjd"\nP_t[0] = "2020-02-02T00:00:00"',
    "print(P_t, P_t.tt.iso)",
)
case(
    "ap_timedelta",
    "astropy.time.TimeDelta",
    'P_dt = TimeDelta(3600.0, format="sec")',
    'P_dt.format = "jd"',
    "print(P_dt, P_dt.to(u.min))",
)
case(
    "ap_skycoord",
    "astropy.coordinates.SkyCoord",
    "P_c = SkyCoord(ra=[10.0, 20.0] * u.deg, dec=[-5.0, 5.0] * u.deg)",
    "P_c[0] = SkyCoord(ra=30.0 * u.deg, dec=1.0 * u.deg)",
    "print(P_c, P_c.galactic)",
)
case(
    "ap_column",
    "astropy.table.Column",
    'P_col = Column([1, 2, 3], name="n", unit="s")',
    'P_col.unit = "min"\nP_col[1] = 20\nP_col.description = "d"',
    "print(P_col, P_col.unit, P_col.description)",
)
case(
    "ap_gaussian",
    "astropy.modeling.functional_models.Gaussian1D",
    "P_g = models.Gaussian1D(amplitude=1.0, mean=0.0, stddev=1.0)",
    "P_g.amplitude = 3.0\nP_g.mean.fixed = True",
    "print(P_g.parameters, P_g.fixed, P_g(0.0))",
)
case(
    "ap_fitter",
    "astropy.modeling.fitting.LevMarLSQFitter",
    "P_fit = fitting.LevMarLSQFitter()",
    "P_g = P_fit(models.Gaussian1D(amplitude=1.0, mean=0.0, stddev=1.0), xs, ys)",
    'print(P_g.parameters.round(5), P_fit.fit_info["nfev"])',
)
case(
    "ap_cosmology",
    "astropy.cosmology.FlatLambdaCDM",
    'P_c = FlatLambdaCDM(H0=70, Om0=0.3, name="c70")',
    "P_c2 = P_c.clone(H0=68)",
    "print(P_c.age(0).round(6), P_c2.H0, P_c2.age(1).round(6))",
)
case(
    "ap_wcs",
    "astropy.wcs.WCS",
    "P_w = WCS(naxis=2)",
    'P_w.wcs.crpix = [1, 1]\nP_w.wcs.cdelt = [0.1, 0.1]\nP_w.wcs.ctype = ["RA---TAN", "DEC--TAN"]',
    "print(P_w.wcs.ctype, P_w.wcs.cdelt, P_w.pixel_to_world_values(2, 2))",
)
case(
    "ap_nddata",
    "astropy.nddata.NDData",
    'P_d = NDData(np.arange(4.0), unit="adu")',
    'P_d.meta["exptime"] = 10\nP_d.data[0] = 7.0',
    "print(P_d.data, P_d.unit, dict(P_d.meta))",
)

# -- pandas -----------------------------------------------------------------------------------

lib(
    "pandas",
    ("pandas",),
    """
import numpy as np
import pandas as pd
""",
)
case(
    "pd_frame",
    "pandas.DataFrame",
    'P_df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})',
    'P_df["c"] = P_df["a"] * 2\nP_df.loc[0, "a"] = 99\nP_df.attrs["source"] = "made"',
    "print(P_df, P_df.attrs)",
)
case(
    "pd_series",
    "pandas.Series",
    "P_s = pd.Series([1.0, 2.0, 3.0])",
    'P_s.name = "v"\nP_s[1] = 7.5\nP_s.index.name = "i"',
    "print(P_s)",
)
case(
    "pd_index",
    "pandas.Index",
    'P_i = pd.Index(["a", "b", "c"])',
    'P_i.name = "letters"',
    "print(P_i)",
)
case(
    "pd_multiindex",
    "pandas.MultiIndex",
    'P_mi = pd.MultiIndex.from_product([["a", "b"], [1, 2]])',
    'P_mi.names = ["k", "n"]',
    "print(P_mi, P_mi.names)",
)
case(
    "pd_categorical",
    "pandas.Categorical",
    'P_c = pd.Categorical(["a", "b", "a"])',
    'P_c = P_c.add_categories(["z"])\nP_c[0] = "z"',
    "print(P_c)",
)
case(
    "pd_datetimeindex",
    "pandas.DatetimeIndex",
    'P_d = pd.date_range("2020-01-01", periods=3, freq="D")',
    'P_d = P_d.tz_localize("UTC")\nP_d.name = "when"',
    "print(P_d)",
)
case(
    "pd_timestamp",
    "pandas.Timestamp",
    'P_ts = pd.Timestamp("2020-01-01 12:00")',
    'P_ts = P_ts + pd.Timedelta("1D")',
    "print(P_ts, P_ts.day_name())",
)
case(
    "pd_groupby",
    "pandas.core.groupby.DataFrameGroupBy",
    'P_df = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})\nP_g = P_df.groupby("k")',
    'P_df["v"] *= 10',
    "print(P_g.sum(), P_g.obj is P_df)",
)
case(
    "pd_styler",
    "pandas.io.formats.style.Styler",
    'P_df = pd.DataFrame({"a": [1, 5, 3]})\nP_st = P_df.style.set_uuid("fixed")',
    'P_st.highlight_max(color="yellow").set_caption("caption")',
    "print(P_st.to_html())",
)
case(
    "pd_intervalindex",
    "pandas.IntervalIndex",
    "P_ii = pd.IntervalIndex.from_breaks([0, 1, 2, 3])",
    'P_ii.name = "bins"',
    "print(P_ii, P_ii.get_loc(1.5))",
)
case(
    "pd_rolling",
    "pandas.core.window.rolling.Rolling",
    "P_s = pd.Series([1.0, 2.0, 3.0, 4.0])\nP_r = P_s.rolling(2)",
    "P_s[0] = 10.0",
    "print(P_r.mean())",
)

# -- polars -----------------------------------------------------------------------------------

lib(
    "polars",
    ("polars",),
    """
import polars as pl
""",
)
case(
    "po_frame",
    "polars.DataFrame",
    'P_df = pl.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})',
    'P_df = P_df.with_columns((pl.col("a") * 2).alias("c"))',
    "print(P_df)",
)
case(
    "po_extend",
    "polars.DataFrame (changed in place)",
    'P_df = pl.DataFrame({"a": [1, 2], "b": ["x", "y"]})',
    'P_df.extend(pl.DataFrame({"a": [3], "b": ["z"]}))\nP_df[0, "a"] = 10',
    "print(P_df)",
)
case(
    "po_insert",
    "polars.DataFrame (insert_column)",
    'P_df = pl.DataFrame({"a": [1, 2, 3]})',
    'P_df.insert_column(0, pl.Series("z", [0, 0, 0]))',
    "print(P_df.columns, P_df)",
)
case(
    "po_series",
    "polars.Series",
    'P_s = pl.Series("n", [1, 2, 3])',
    'P_s.append(pl.Series("n", [4]))\nP_s[0] = 100',
    "print(P_s.to_list())",
)
case(
    "po_lazy",
    "polars.LazyFrame",
    'P_lf = pl.LazyFrame({"a": [1, 2, 3], "b": [4, 5, 6]})',
    'P_lf = P_lf.filter(pl.col("a") > 1).select("b")',
    "print(P_lf.collect())",
)
case(
    "po_expr",
    "polars.Expr",
    'P_e = pl.col("a") + 1',
    'P_e = (P_e * 2).alias("a2")',
    'print(P_e, pl.DataFrame({"a": [1, 2]}).select(P_e))',
)
case(
    "po_schema",
    "polars.Schema",
    'P_sch = pl.Schema({"a": pl.Int64})',
    'P_sch["b"] = pl.String',
    "print(P_sch, P_sch.names())",
)
case(
    "po_groupby",
    "polars.dataframe.group_by.GroupBy",
    'P_df = pl.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})\n'
    'P_gb = P_df.group_by("k", maintain_order=True)',
    'P_res = P_gb.agg(pl.col("v").sum())',
    "print(P_res)",
)
case(
    "po_sqlcontext",
    "polars.SQLContext",
    "P_ctx = pl.SQLContext()",
    'P_ctx.register("t", pl.DataFrame({"a": [1, 2, 3]}))',
    'print(P_ctx.tables(), P_ctx.execute("select sum(a) as s from t", eager=True))',
)
case(
    "po_config",
    "polars.Config",
    "P_cfg = pl.Config()",
    "P_cfg.set_tbl_rows(2)",
    'print(pl.DataFrame({"a": list(range(8))}))',
)

# -- pydantic ---------------------------------------------------------------------------------

lib(
    "pydantic",
    ("pydantic", "pydantic_settings"),
    """
from pydantic import BaseModel, ConfigDict, PrivateAttr, RootModel, SecretStr, TypeAdapter
from pydantic import field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_settings import BaseSettings


class Item(BaseModel):
    name: str
    tags: list[str] = []
    qty: int = 0


class Order(BaseModel):
    items: list[Item] = []


class Tags(RootModel[list[str]]):
    pass


class Settings(BaseSettings):
    debug: bool = False
    level: int = 1


@pydantic_dataclass
class Point:
    x: int
    y: int = 0


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)
    a: int


class Creds(BaseModel):
    user: str
    token: SecretStr


class Cached(BaseModel):
    n: int = 0
    _cache: dict = PrivateAttr(default_factory=dict)


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int = 0
""",
)
case(
    "py_model",
    "pydantic.BaseModel",
    'P_it = Item(name="a")',
    'P_it.qty = 3\nP_it.tags.append("x")',
    "print(P_it.model_dump_json())",
)
case(
    "py_nested",
    "pydantic.BaseModel (nested)",
    "P_o = Order()",
    'P_o.items.append(Item(name="b", qty=2))\nP_o.items[0].tags.append("t")',
    "print(P_o.model_dump())",
)
case(
    "py_root",
    "pydantic.RootModel",
    'P_t = Tags(["a"])',
    'P_t.root.append("z")',
    "print(P_t.model_dump_json())",
)
case(
    "py_settings",
    "pydantic_settings.BaseSettings",
    "P_s = Settings()",
    "P_s.debug = True\nP_s.level = 3",
    "print(P_s)",
)
case(
    "py_adapter",
    "pydantic.TypeAdapter",
    "P_ta = TypeAdapter(list[int])",
    'P_vals = P_ta.validate_python(["1", "2"])',
    'print(P_vals, P_ta.validate_json("[3]"), P_ta.json_schema())',
)
case(
    "py_dataclass",
    "pydantic.dataclasses.dataclass",
    "P_p = Point(x=1)",
    "P_p.y = 5",
    "print(P_p)",
)
case(
    "py_frozen",
    "pydantic.BaseModel (frozen)",
    "P_f = Frozen(a=1)",
    'P_f = P_f.model_copy(update={"a": 2})',
    "print(P_f, hash(P_f) == hash(Frozen(a=2)))",
)
case(
    "py_validator",
    "pydantic.BaseModel (defined in the step, validate_assignment)",
    "class P_Temp(BaseModel):\n"
    "    model_config = ConfigDict(validate_assignment=True)\n"
    "    c: float\n"
    "\n"
    '    @field_validator("c")\n'
    "    @classmethod\n"
    "    def P_not_cold(cls, v):\n"
    "        return max(v, -273.15)\n"
    "\n"
    "\n"
    "P_t = P_Temp(c=20)",
    "P_t.c = -500",
    "print(P_t, type(P_t).__name__)",
)
case(
    "py_secret",
    "pydantic.SecretStr (in a model)",
    'P_c = Creds(user="u", token=SecretStr("old-token"))',
    'P_c.token = SecretStr("new-token")',
    "print(P_c, len(P_c.token.get_secret_value()))",
)
case(
    "py_private",
    "pydantic.BaseModel (PrivateAttr)",
    "P_m = Cached()",
    'P_m._cache["k"] = 1\nP_m.n = 1',
    "print(P_m, P_m._cache)",
)
case(
    "py_extra",
    "pydantic.BaseModel (extra='allow')",
    "P_m = Loose()",
    "P_m.b = 2\nP_m.a = 1",
    "print(P_m.model_dump(), P_m.model_extra)",
)

# -- dataclasses and attrs --------------------------------------------------------------------

lib(
    "dataclasses",
    ("attrs",),
    """
import dataclasses
import attr
import attrs


@dataclasses.dataclass
class Pt:
    x: int
    y: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class Slotted:
    a: int
    b: str = "b"


@dataclasses.dataclass(frozen=True)
class FrozenPt:
    a: int
    b: int = 0


@attrs.define
class Acct:
    owner: str
    balance: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))
    log: list = attrs.Factory(list)


@attrs.frozen
class Key:
    a: int
    b: str = "k"


@attrs.define(slots=False)
class Box:
    w: int
    h: int
    area: int = attrs.field(init=False)

    def __attrs_post_init__(self):
        self.area = self.w * self.h


@attr.s
class Legacy:
    x = attr.ib(default=1)
    y = attr.ib(factory=dict)
""",
)
case(
    "dc_dataclass",
    "dataclasses.dataclass",
    "P_p = Pt(1)",
    "P_p.x = 5\nP_p.y.append(1)",
    "print(P_p, P_p == Pt(5, [1]))",
)
case(
    "dc_slots",
    "dataclasses.dataclass(slots=True)",
    "P_s = Slotted(1)",
    'P_s.a = 2\nP_s.b = "bb"',
    "print(P_s)",
)
case(
    "dc_frozen",
    "dataclasses.dataclass(frozen=True)",
    "P_f = FrozenPt(1)",
    "P_f = dataclasses.replace(P_f, b=3)",
    "print(P_f, hash(P_f) == hash(FrozenPt(1, 3)))",
)
case(
    "dc_in_step",
    "dataclasses.dataclass (defined in the step)",
    "@dataclasses.dataclass\nclass P_Conf:\n    lr: float = 0.1\n    tags: tuple = ()\n\n\n"
    "P_c = P_Conf()",
    'P_c.lr = 0.01\nP_c.tags = ("a",)',
    "print(P_c, isinstance(P_c, P_Conf))",
)
case(
    "at_define",
    "attrs.define",
    'P_a = Acct("ann")',
    'P_a.balance = 4\nP_a.log.append("deposit")',
    "print(P_a, attrs.asdict(P_a))",
)
case(
    "at_frozen",
    "attrs.frozen",
    "P_k = Key(1)",
    'P_k = attrs.evolve(P_k, b="z")',
    "print(P_k, hash(P_k) == hash(Key(1, 'z')))",
)
case(
    "at_dict_class",
    "attrs.define(slots=False) with __attrs_post_init__",
    "P_b = Box(2, 3)",
    "P_b.w = 5\nP_b.area = P_b.w * P_b.h\nP_b.note = 'extra'",
    "print(P_b, P_b.note)",
)
case(
    "at_legacy",
    "attr.s",
    "P_l = Legacy()",
    'P_l.x = 2\nP_l.y["k"] = "v"',
    "print(P_l)",
)

# -- the standard library ---------------------------------------------------------------------

lib(
    "stdlib",
    (),
    """
import array
import collections
import datetime
import enum
import heapq
import pathlib
import types


class Color(enum.Enum):
    RED = 1
    GREEN = 2
""",
)
case(
    "st_deque",
    "collections.deque",
    "P_d = collections.deque([1, 2], maxlen=3)",
    "P_d.append(3)\nP_d.append(4)\nP_d.appendleft(0)",
    "print(P_d, P_d.maxlen)",
)
case(
    "st_counter",
    "collections.Counter",
    'P_c = collections.Counter("abca")',
    'P_c.update("bbz")\nP_c["q"] -= 1',
    "print(sorted(P_c.items()), P_c.most_common(1))",
)
case(
    "st_defaultdict",
    "collections.defaultdict",
    "P_d = collections.defaultdict(list)",
    'P_d["k"].append(1)\nP_d["j"]',
    "print(dict(P_d), P_d.default_factory)",
)
case(
    "st_ordereddict",
    "collections.OrderedDict",
    "P_o = collections.OrderedDict(a=1, b=2, c=3)",
    'P_o.move_to_end("a")\nP_o.popitem(last=False)',
    "print(P_o)",
)
case(
    "st_chainmap",
    "collections.ChainMap",
    'P_cm = collections.ChainMap({"a": 1}, {"b": 2})',
    'P_cm["c"] = 3\nP_cm.maps[1]["b"] = 20',
    "print(P_cm, P_cm.maps)",
)
case(
    "st_array",
    "array.array",
    'P_a = array.array("i", [1, 2])',
    "P_a.extend([3, 4])\nP_a[0] = 9",
    "print(P_a)",
)
case(
    "st_namespace",
    "types.SimpleNamespace",
    "P_ns = types.SimpleNamespace(a=1)",
    "P_ns.b = [2]\nP_ns.a += 1",
    "print(P_ns)",
)
case(
    "st_heap",
    "list (heapq)",
    "P_h = [5, 1, 4]\nheapq.heapify(P_h)",
    "heapq.heappush(P_h, 0)\nP_top = heapq.heappop(P_h)",
    "print(P_h, P_top)",
)
case(
    "st_enum",
    "enum.Enum",
    "P_c = Color.RED",
    "P_c = Color(2)",
    "print(P_c, P_c is Color.GREEN)",
)
case(
    "st_datetime",
    "datetime.datetime",
    "P_t = datetime.datetime(2020, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)",
    "P_t = P_t.replace(hour=13) + datetime.timedelta(days=1)",
    "print(P_t.isoformat())",
)
case(
    "st_path",
    "pathlib.PurePosixPath",
    'P_p = pathlib.PurePosixPath("/data")',
    'P_p = P_p / "raw" / "x.csv"',
    "print(P_p, P_p.suffix)",
)

# -- langchain-core ---------------------------------------------------------------------------

lib(
    "langchain",
    ("langchain_core",),
    """
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, FewShotPromptTemplate, PromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore
""",
)
case(
    "lc_human",
    "langchain_core.messages.HumanMessage",
    'P_m = HumanMessage(content="hi")',
    'P_m.content = "hello"\nP_m.additional_kwargs["k"] = 1',
    "print(repr(P_m))",
)
case(
    "lc_ai",
    "langchain_core.messages.AIMessage",
    'P_m = AIMessage(content="", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c1"}])',
    'P_m.response_metadata["model_name"] = "m"\nP_m.content = "done"',
    "print(repr(P_m))",
)
case(
    "lc_tool",
    "langchain_core.messages.ToolMessage",
    'P_m = ToolMessage(content="42", tool_call_id="c1")',
    'P_m.status = "error"\nP_m.artifact = {"raw": 42}',
    "print(repr(P_m))",
)
case(
    "lc_system",
    "langchain_core.messages.SystemMessage",
    'P_m = SystemMessage(content="be brief")',
    'P_m.name = "rules"',
    "print(repr(P_m), P_m.text)",
)
case(
    "lc_history",
    "langchain_core.chat_history.InMemoryChatMessageHistory",
    "P_h = InMemoryChatMessageHistory()",
    'P_h.add_user_message("hi")\nP_h.add_ai_message("hello")',
    "print(P_h.messages)",
)
case(
    "lc_chatprompt",
    "langchain_core.prompts.ChatPromptTemplate",
    'P_p = ChatPromptTemplate.from_messages([("system", "You are {role}"), ("human", "{q}")])',
    'P_p.append(("ai", "ok"))\nP_p = P_p.partial(role="a bot")',
    'print(P_p.format_messages(q="why"))',
)
case(
    "lc_prompt",
    "langchain_core.prompts.PromptTemplate",
    'P_p = PromptTemplate.from_template("Tell me about {x}")',
    'P_p.template = "Tell me all about {x}!"',
    'print(P_p.format(x="cats"))',
)
case(
    "lc_fewshot",
    "langchain_core.prompts.FewShotPromptTemplate",
    "P_fs = FewShotPromptTemplate(\n"
    '    examples=[{"q": "1+1", "a": "2"}],\n'
    '    example_prompt=PromptTemplate.from_template("Q: {q} A: {a}"),\n'
    '    suffix="Q: {input}",\n'
    '    input_variables=["input"],\n'
    ")",
    'P_fs.examples.append({"q": "2+2", "a": "4"})',
    'print(P_fs.format(input="3+3"))',
)
case(
    "lc_document",
    "langchain_core.documents.Document",
    'P_d = Document(page_content="text")',
    'P_d.metadata["src"] = "web"\nP_d.id = "d1"',
    "print(repr(P_d))",
)
case(
    "lc_runnable",
    "langchain_core.runnables.RunnableSequence",
    "P_r = RunnableLambda(lambda v: v + 1)",
    "P_r = P_r | RunnableLambda(lambda v: v * 10) | RunnableLambda(str)",
    "print(P_r.invoke(1), type(P_r).__name__)",
)
case(
    "lc_fakechat",
    "langchain_core.language_models.fake_chat_models.FakeListChatModel",
    'P_llm = FakeListChatModel(responses=["one", "two", "three"])',
    'P_first = P_llm.invoke("q").content',
    'print(P_first, P_llm.invoke("q2").content)',
)
case(
    "lc_chain",
    "langchain_core.runnables.RunnableSequence (prompt | model | parser)",
    'P_chain = PromptTemplate.from_template("say {w}") | FakeListChatModel(responses=["a", "b"])'
    " | StrOutputParser()",
    'P_out = [P_chain.invoke({"w": "x"})]',
    'print(P_out, P_chain.invoke({"w": "y"}))',
)
case(
    "lc_vectorstore",
    "langchain_core.vectorstores.InMemoryVectorStore",
    "P_vs = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))",
    'P_vs.add_documents([Document(page_content="apples", id="1"), '
    'Document(page_content="pears", id="2")])',
    'print(sorted(P_vs.store), [d.page_content for d in P_vs.similarity_search("apples", k=1)])',
)

# -- langgraph --------------------------------------------------------------------------------

lib(
    "langgraph",
    ("langgraph",),
    """
import operator
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.store.memory import InMemoryStore


class St(TypedDict):
    n: int
    log: Annotated[list, operator.add]


def inc(state):
    return {"n": state["n"] + 1, "log": ["inc"]}


def make_builder():
    b = StateGraph(St)
    b.add_node("inc", inc)
    b.add_edge(START, "inc")
    b.add_edge("inc", END)
    return b


def reply(state):
    return {"messages": [AIMessage(content="echo " + state["messages"][-1].content, id="r")]}


thread = {"configurable": {"thread_id": "t1"}}
""",
)
case(
    "lg_saver",
    "langgraph.checkpoint.memory.InMemorySaver",
    "P_cp = InMemorySaver()",
    'P_app = make_builder().compile(checkpointer=P_cp)\nP_out = P_app.invoke({"n": 1}, thread)',
    "print(P_out, len(list(P_cp.list(thread))))\n"
    "print(P_cp.get_tuple(thread).checkpoint['channel_values'])",
)
case(
    "lg_builder",
    "langgraph.graph.StateGraph",
    "P_b = StateGraph(St)",
    'P_b.add_node("inc", inc)\nP_b.add_edge(START, "inc")\nP_b.add_edge("inc", END)',
    'print(sorted(P_b.nodes), P_b.compile().invoke({"n": 1}))',
)
case(
    "lg_compiled",
    "langgraph.graph.state.CompiledStateGraph",
    "P_app = make_builder().compile()",
    'P_out = P_app.invoke({"n": 5})',
    'print(P_out, P_app.invoke({"n": 1}))',
)
case(
    "lg_thread",
    "langgraph.graph.state.CompiledStateGraph (with a checkpointer)",
    "P_app = make_builder().compile(checkpointer=InMemorySaver())",
    'P_app.invoke({"n": 1}, thread)\nP_app.invoke({"n": 10}, thread)',
    "print(P_app.get_state(thread).values)",
)
case(
    "lg_messages",
    "langgraph.graph.StateGraph (MessagesState)",
    "P_b = StateGraph(MessagesState)\nP_b.add_node(reply)\nP_b.add_edge(START, 'reply')\n"
    "P_app = P_b.compile(checkpointer=InMemorySaver())",
    'P_app.invoke({"messages": [HumanMessage(content="hi", id="h1")]}, thread)',
    "print([m.content for m in P_app.get_state(thread).values['messages']])",
)
case(
    "lg_store",
    "langgraph.store.memory.InMemoryStore",
    "P_st = InMemoryStore()",
    'P_st.put(("users",), "u1", {"name": "ann"})\nP_st.put(("users",), "u2", {"name": "bo"})',
    'print(P_st.get(("users",), "u1").value, [i.key for i in P_st.search(("users",))])',
)
case(
    "lg_entrypoint",
    "langgraph.func.entrypoint (Pregel)",
    "P_cp = InMemorySaver()\n\n\n@entrypoint(checkpointer=P_cp)\ndef P_wf(n: int) -> int:\n"
    "    return n * 2",
    "P_out = P_wf.invoke(3, thread)",
    "print(P_out, P_wf.get_state(thread).values)",
)

# -- llama-index-core -------------------------------------------------------------------------

lib(
    "llamaindex",
    ("llama_index.core",),
    """
from llama_index.core import Document, PromptTemplate, Settings, StorageContext, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import ChatMessage, MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.schema import TextNode
from llama_index.core.storage.chat_store import SimpleChatStore
from llama_index.core.storage.docstore import SimpleDocumentStore
Settings.embed_model = MockEmbedding(embed_dim=8)
Settings.llm = MockLLM()
""",
)
case(
    "li_document",
    "llama_index.core.Document",
    'P_d = Document(text="hello world", id_="d1")',
    'P_d.metadata["src"] = "web"\nP_d.excluded_llm_metadata_keys.append("src")',
    'print(P_d.get_content(metadata_mode="all"), P_d.hash)',
)
case(
    "li_textnode",
    "llama_index.core.schema.TextNode",
    'P_n = TextNode(text="x", id_="n1")',
    'P_n.text = "y"\nP_n.metadata["k"] = 2',
    "print(P_n.get_content(metadata_mode='all'), P_n.hash)",
)
case(
    "li_splitter",
    "llama_index.core.node_parser.SentenceSplitter",
    "P_sp = SentenceSplitter(chunk_size=64, chunk_overlap=0)",
    "P_sp.chunk_size = 40",
    'print([n.text for n in P_sp.get_nodes_from_documents([Document(text="one two. " * 30)])])',
)
case(
    "li_index",
    "llama_index.core.VectorStoreIndex",
    "P_idx = VectorStoreIndex([])",
    'P_idx.insert(Document(text="apples are red", id_="d1"))',
    'print([n.node.text for n in P_idx.as_retriever(similarity_top_k=1).retrieve("apples")])',
)
case(
    "li_docstore",
    "llama_index.core.storage.docstore.SimpleDocumentStore",
    "P_ds = SimpleDocumentStore()",
    'P_ds.add_documents([TextNode(text="t", id_="n1")])',
    'print(sorted(P_ds.docs), P_ds.get_document("n1").text)',
)
case(
    "li_chatmessage",
    "llama_index.core.llms.ChatMessage",
    'P_m = ChatMessage(role="user", content="hi")',
    'P_m.content = "hello"\nP_m.additional_kwargs["x"] = 1',
    "print(repr(P_m), P_m.content)",
)
case(
    "li_prompt",
    "llama_index.core.PromptTemplate",
    'P_p = PromptTemplate("Q: {q} in {lang}")',
    'P_p = P_p.partial_format(lang="French")',
    'print(P_p.format(q="why"))',
)
case(
    "li_chatstore",
    "llama_index.core.storage.chat_store.SimpleChatStore",
    "P_cs = SimpleChatStore()",
    'P_cs.add_message("u1", ChatMessage(role="user", content="hi"))',
    'print(P_cs.get_messages("u1"), P_cs.get_keys())',
)
case(
    "li_mockllm",
    "llama_index.core.llms.MockLLM",
    "P_llm = MockLLM(max_tokens=5)",
    "P_llm.max_tokens = 3",
    'print(repr(P_llm.complete("a b c d e f").text))',
)
case(
    "li_storage",
    "llama_index.core.StorageContext",
    "P_sc = StorageContext.from_defaults()",
    'P_sc.docstore.add_documents([TextNode(text="s", id_="s1")])',
    "print(sorted(P_sc.docstore.docs))",
)

BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "two cases share a name"
