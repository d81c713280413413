"""The layers import one way: a test that walks every import of the package (AST).

identity/ and store/ never import kernel/ or run/, nor IPython; run/ never
imports kernel/; only store/_diskcache.py imports diskcache. Imports inside
functions count (a lazy import is still a dependency), and so do imports of
imports: a store module that imports a top-level module that imports the
kernel breaks the rule as surely as a direct import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nbdurable

ROOT = Path(nbdurable.__file__).parent

#: (the importing layer, what it must never reach)
RULES = [
    ("nbdurable.identity", ("nbdurable.kernel", "nbdurable.run", "IPython", "ipykernel")),
    ("nbdurable.store", ("nbdurable.kernel", "nbdurable.run", "IPython", "ipykernel")),
    ("nbdurable.run", ("nbdurable.kernel",)),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(
    source: str, module: str, is_package: bool = False, modules: set[str] = ()
) -> set[str]:
    """Every module ``module``'s source imports, relative imports resolved.

    ``from a import b`` is ``a.b`` when that is one of ``modules``, else ``a``
    (``b`` is then a name defined in ``a``).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
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


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (the package's own, and outside ones)."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {
        name: imports_of(
            path.read_text(encoding="utf-8"), name, path.stem == "__init__", set(paths)
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
                    if hit:
                        bad.append(f"{start} reaches {dep}: {' -> '.join(chain[mod] + [dep])}")
                        continue
                    if dep in g and dep not in chain:
                        chain[dep] = chain[mod] + [dep]
                        todo.append(dep)
    return bad


def test_layers_import_one_way():
    bad = violations(graph())
    assert not bad, "imports against the layer rules:\n" + "\n".join(bad)


def test_only_the_fence_imports_diskcache():
    users = sorted(m for m, deps in graph().items() if any(within(d, "diskcache") for d in deps))
    assert users == ["nbdurable.store._diskcache"], users


def test_the_walk_sees_lazy_relative_and_indirect_imports():
    # The checker itself: a violation hidden in a function, behind a relative
    # import and one module away, is found and its chain named.
    mods = {"nbdurable.store.fake", "nbdurable.helper", "nbdurable.kernel.session"}
    g = {
        "nbdurable.store.fake": imports_of(
            "def f():\n    from ..helper import go\n", "nbdurable.store.fake", modules=mods
        ),
        "nbdurable.helper": imports_of(
            "from .kernel import session\n", "nbdurable.helper", modules=mods
        ),
        "nbdurable.run.fake": imports_of("import nbdurable.kernel.magic\n", "nbdurable.run.fake"),
    }
    bad = violations(g)
    assert any(
        line.startswith("nbdurable.store.fake reaches nbdurable.kernel")
        and "nbdurable.helper" in line
        for line in bad
    ), bad
    assert any(line.startswith("nbdurable.run.fake reaches nbdurable.kernel") for line in bad), bad


def test_old_import_paths_keep_working_for_one_release(tmp_path):
    from nbdurable import engine
    from nbdurable.kernel import context, session
    from nbdurable.store import MAGIC, RUN_SCOPE, RunKeys, Store
    from nbdurable.store.disk import DiskStore

    assert engine.get_session is session.get_session
    assert engine.reset_session is session.reset_session
    assert engine.Session is session.Session and engine.SubIndex is context.SubIndex
    assert engine.NbdurableWarning is nbdurable.NbdurableWarning
    session.reset_session()
    assert engine._session is None
    assert session.get_session() is engine._session
    session.reset_session()
    with Store(tmp_path / "store") as store:  # the interface opens the embedded engine
        assert isinstance(store, Store) and isinstance(store, DiskStore)
        store.put(RunKeys("nb.ipynb").sub(RUN_SCOPE, "x"), {"n": 1})
        assert store.read(RunKeys("nb.ipynb").sub(RUN_SCOPE, "x")).startswith(MAGIC)
    assert Store.exists(tmp_path / "store")


def test_the_public_api_is_unchanged():
    import warnings

    for name in ("step", "recorded", "idempotency_key", "configure", "panel"):
        assert callable(getattr(nbdurable, name)), name
    assert issubclass(nbdurable.NbdurableWarning, UserWarning)
    assert "NbdurableWarning" in nbdurable.__all__
    with pytest.warns(nbdurable.NbdurableWarning):
        warnings.warn("x", nbdurable.NbdurableWarning, stacklevel=1)


def test_the_readme_architecture_names_every_module():
    readme = (ROOT.parent / "README.md").read_text(encoding="utf-8")
    tree = readme.split("## Architecture", 1)[1].split("```")[1]
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
    assert not missing, f"README's Architecture tree does not name: {missing}"
