"""The layers import one way: a test that walks every import of the package (AST).

From the top: ipython/ (the shell side) → durable/ (the engine) → the
shared modules (config, status, commands, states, text, ...) → identity/ and
store/. durable/ never imports ipython/ nor IPython; nothing below durable/
imports it; store/ never imports config; run/ (which drives kernels from
outside) never imports durable/ or ipython/; only store/_diskcache.py
imports diskcache; and the package's modules import one another without
cycles. Imports inside functions count (a lazy import is still a
dependency), and so do imports of imports: a store module that imports a
top-level module that imports the engine breaks the rule as surely as a
direct import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nbdurable

ROOT = Path(nbdurable.__file__).parent

#: (the importing layer, what it must never reach)
_SHELL = ("nbdurable.ipython", "IPython", "ipykernel", "ipywidgets")
_ABOVE_SHARED = ("nbdurable.durable", "nbdurable.run", "nbdurable.cli", *_SHELL)
#: Allowed below the shell side all the same: IPython's cell transformer is pure text
#: (status turns a saved cell into the Python a kernel would run); it starts no shell.
ALLOWED = ("IPython.core.inputtransformer2",)
#: The shared middle layer: top-level modules every side uses.
SHARED = (
    "commands",
    "config",
    "dbwrites",
    "errors",
    "events",
    "faults",
    "hush",
    "redact",
    "rundiff",
    "states",
    "status",
    "text",
)
RULES = [
    ("nbdurable.durable", ("nbdurable.run", *_SHELL)),
    *((f"nbdurable.{m}", _ABOVE_SHARED) for m in SHARED),
    ("nbdurable.identity", ("nbdurable.config", "nbdurable.status", *_ABOVE_SHARED)),
    ("nbdurable.store", ("nbdurable.config", "nbdurable.status", *_ABOVE_SHARED)),
    ("nbdurable.procstate", _ABOVE_SHARED),
    ("nbdurable.clients", _ABOVE_SHARED),
    ("nbdurable.run", ("nbdurable.durable", *_SHELL)),
    ("nbdurable.server", ("nbdurable.durable", *_SHELL)),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _nodes(tree: ast.AST, typing_too: bool) -> list[ast.AST]:
    """Every node of ``tree``; without ``typing_too``, none under ``if TYPE_CHECKING:``."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if not typing_too and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def imports_of(
    source: str,
    module: str,
    is_package: bool = False,
    modules: set[str] = (),
    typing_too: bool = True,
) -> set[str]:
    """Every module ``module``'s source imports, relative imports resolved.

    ``from a import b`` is ``a.b`` when that is one of ``modules``, else ``a``
    (``b`` is then a name defined in ``a``). Without ``typing_too``, imports
    made only for type checkers are left out (they never run).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(ast.parse(source), typing_too):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.add(sub if sub in modules else target)
    return found


def graph(typing_too: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports (the package's own, and outside ones)."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {
        name: imports_of(
            path.read_text(encoding="utf-8"),
            name,
            path.stem == "__init__",
            set(paths),
            typing_too,
        )
        for name, path in paths.items()
    }


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(g: dict[str, set[str]]) -> list[str]:
    """One line per module that reaches what its layer must not, with the chain."""
    bad = []
    for layer, forbidden in RULES:
        for start in sorted(m for m in g if within(m, layer)):
            # Breadth-first over the package's own modules, remembering the chain.
            chain = {start: [start]}
            todo = [start]
            while todo:
                mod = todo.pop(0)
                for dep in sorted(g.get(mod, ())):
                    hit = next((f for f in forbidden if within(dep, f)), None)
                    if any(within(dep, a) for a in ALLOWED):
                        hit = None
                    if hit:
                        bad.append(f"{start} reaches {dep}: {' -> '.join(chain[mod] + [dep])}")
                        continue
                    if dep in g and dep not in chain:
                        chain[dep] = chain[mod] + [dep]
                        todo.append(dep)
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The package's import cycles: each strongly connected component of two or more
    modules (or one importing itself), sorted (Tarjan's algorithm, iteratively).
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(d for d in g[root] if d in g)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(d for d in g[dep] if d in g))))
                elif dep in on_stack:
                    low[node] = min(low[node], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in g[node]:
                    found.append(sorted(component))
    return sorted(found)


def _without_packages(g: dict[str, set[str]]) -> dict[str, set[str]]:
    # A package's __init__ that only re-exports its modules (store/__init__) is
    # not a cycle with them: importing `nbdurable.store.base` from `store.view`
    # runs the package's __init__ first, but the edge that matters is the module.
    packages = {m for m in g if (ROOT.parent / m.replace(".", "/") / "__init__.py").exists()}
    return {m: deps - packages if m not in packages else set() for m, deps in g.items()}


def test_no_import_cycles():
    found = cycles(_without_packages(graph(typing_too=False)))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_check_finds_a_lazy_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(g) == [["a", "b", "c"], ["e"]]


def test_layers_import_one_way():
    bad = violations(graph())
    assert not bad, "imports against the layer rules:\n" + "\n".join(bad)


def test_only_the_fence_imports_diskcache():
    users = sorted(m for m, deps in graph().items() if any(within(d, "diskcache") for d in deps))
    assert users == ["nbdurable.store._diskcache"], users


def test_the_walk_sees_lazy_relative_and_indirect_imports():
    # The checker itself: a violation hidden in a function, behind a relative
    # import and one module away, is found and its chain named.
    mods = {"nbdurable.store.fake", "nbdurable.helper", "nbdurable.durable.session"}
    g = {
        "nbdurable.store.fake": imports_of(
            "def f():\n    from ..helper import go\n", "nbdurable.store.fake", modules=mods
        ),
        "nbdurable.helper": imports_of(
            "from .durable import session\n", "nbdurable.helper", modules=mods
        ),
        "nbdurable.run.fake": imports_of("import nbdurable.ipython.magic\n", "nbdurable.run.fake"),
    }
    bad = violations(g)
    assert any(
        line.startswith("nbdurable.store.fake reaches nbdurable.durable")
        and "nbdurable.helper" in line
        for line in bad
    ), bad
    assert any(line.startswith("nbdurable.run.fake reaches nbdurable.ipython") for line in bad), bad


def test_the_public_api_is_unchanged():
    import warnings

    for name in ("step", "recorded", "idempotency_key", "configure", "panel"):
        assert callable(getattr(nbdurable, name)), name
    assert issubclass(nbdurable.NbdurableWarning, UserWarning)
    assert "NbdurableWarning" in nbdurable.__all__
    with pytest.warns(nbdurable.NbdurableWarning):
        warnings.warn("x", nbdurable.NbdurableWarning, stacklevel=1)


def test_warnings_are_one_line_and_leave_later_formatters_in_charge(monkeypatch):
    # nbdurable's own warnings show without a location; others as before. A formatter
    # installed later and calling the previous one (nbdurable's) stays in charge,
    # without the two calling each other forever.
    import warnings

    from nbdurable.durable import context

    def plain(m, c, f, n, line=None):
        return f"{f}:{n}: {c.__name__}: {m}\n"

    # as in a fresh process, whatever this one's earlier tests installed
    monkeypatch.setattr(warnings, "formatwarning", plain)
    monkeypatch.setattr(context, "_formatting", False)
    monkeypatch.setattr(context._format, "chained", context._format.chained)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        context.warn("first")
    ours = warnings.formatwarning
    shown = ours("a note", nbdurable.NbdurableWarning, "/x/stepper.py", 3)
    assert shown == "NbdurableWarning: a note\n"
    assert "/x/y.py:3: UserWarning: m" in ours("m", UserWarning, "/x/y.py", 3)

    def later(m, c, f, n, line=None):
        return "later " + ours(m, c, f, n, line)

    warnings.formatwarning = later
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        context.warn("second")
    assert warnings.formatwarning is later
    assert later("m", UserWarning, "/x/y.py", 3).startswith("later /x/y.py:3: UserWarning")


def test_the_documented_architecture_names_every_module():
    page = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    tree = page.split("```")[1]
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted(ROOT.rglob("*.py"))
        if p.name != "__init__.py" and p.name not in tree
    ]
    missing += [
        d.name + "/"
        for d in sorted(ROOT.iterdir())
        if (d / "__init__.py").exists() and d.name + "/" not in tree
    ]
    assert not missing, f"docs/architecture.md's tree does not name: {missing}"
