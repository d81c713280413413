"""Which names a cell reads, binds and mutates: the static analysis behind step inputs.

See :mod:`nbdurable.identity.keys` for how the results feed the key recipe.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def _parse(source: str) -> ast.Module:
    # Silence SyntaxWarnings ("is" with a literal, bad escapes): IPython already
    # showed them once, and under warnings-as-errors they would abort the parse.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(source, "<cell>", "exec", flags=_PARSE_FLAGS, dont_inherit=True)


@dataclass(frozen=True)
class CellAnalysis:
    """What a cell reads, binds and may mutate at top level (see :func:`analyse`)."""

    reads: frozenset[str]
    binds: frozenset[str]
    mutates: frozenset[str]
    has_await: bool


@dataclass
class _Uses:
    """What a nested scope (function, lambda, comprehension, class) uses from outside."""

    loads: set[str] = field(default_factory=set)
    mutates: set[str] = field(default_factory=set)
    binds: set[str] = field(default_factory=set)  # module names bound via `global`
    forced: set[str] = field(default_factory=set)  # declared `global`: skip enclosing functions
    walrus: set[str] = field(default_factory=set)  # `:=` in a comprehension binds outside it


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _base(node: ast.AST) -> str | None:
    """``x`` for ``x``, ``x.a.b``, ``x[0].c``; None when the chain starts elsewhere."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _import_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    # `import a.b.c` binds `a`; `from m import *` binds names we cannot know.
    return [a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"]


def _outer_parts(node: ast.AST) -> list[ast.AST]:
    """Expressions of a def, lambda or class that run in the enclosing scope."""
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords]
    if isinstance(node, _COMPREHENSIONS):
        return []  # its first iterable: the walker visits it
    a = node.args  # type: ignore[attr-defined]
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
    parts = [*getattr(node, "decorator_list", []), *a.defaults, *a.kw_defaults]
    parts += [getattr(node, "returns", None), *(p.annotation for p in params if p)]
    return [p for p in parts if p is not None]


class _Walker(ast.NodeVisitor):
    """Where names are loaded, stored and mutated; subclasses say what that means."""

    mutates: set[str]

    def load(self, name: str) -> None:
        raise NotImplementedError

    def store(self, name: str) -> None:
        raise NotImplementedError

    def mutate(self, name: str | None) -> None:
        raise NotImplementedError

    def nested(self, node: ast.AST, uses: _Uses) -> None:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        self.store(name)

    def walrus(self, name: str) -> None:
        self.store(name)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.load(node.id)
        elif isinstance(node.ctx, ast.Store):
            self.store(node.id)
        else:
            self.delete(node.id)

    def visit_Attribute(self, node: ast.Attribute | ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):  # `x.a = ...`, `x[k] += ...`, `del x[k]`
            self.mutate(_base(node))
        self.generic_visit(node)

    visit_Subscript = visit_Attribute

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute):  # any method may mutate its object
            self.mutate(_base(node.func))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.load(node.target.id)
        self.visit(node.value)
        self.visit(node.target)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)
        elif not isinstance(node.target, ast.Name):
            self.visit(node.target.value)  # `x.a: int` evaluates x

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.walrus(node.target.id)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for name in _import_names(node):
            self.store(name)

    visit_ImportFrom = visit_Import

    def visit_MatchAs(self, node: ast.MatchAs | ast.MatchStar | ast.MatchMapping) -> None:
        self.generic_visit(node)
        name = getattr(node, "rest", None) or getattr(node, "name", None)
        if name:
            self.store(name)

    visit_MatchStar = visit_MatchMapping = visit_MatchAs

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.nested(node, _function_uses(node))
        self.store(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.nested(node, _function_uses(node))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.nested(node, _class_uses(node))
        self.store(node.name)

    def visit_ListComp(self, node: ast.expr) -> None:
        self.visit(node.generators[0].iter)  # type: ignore[attr-defined]
        self.nested(node, _comprehension_uses(node))

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    def loop_body(self, node: ast.For | ast.AsyncFor, visit_body: Any) -> None:
        """Visit a loop's body; if it mutates the loop variable, the iterable is mutated too."""
        outer, self.mutates = self.mutates, set()
        visit_body()
        if self.mutates & _names(node.target):  # `for row in rows: row[k] = v`
            self.mutates |= _names(node.iter)
        self.mutates |= outer


class _Scope(_Walker):
    """A function, lambda or comprehension body, flow-insensitively.

    That is Python's own rule: a name bound anywhere in a function is local
    everywhere in it, so the scope reads from outside its loads minus its locals.
    """

    def __init__(self, is_comprehension: bool = False) -> None:
        self.is_comp = is_comprehension
        self.local: set[str] = set()
        self.loads: set[str] = set()
        self.mutates: set[str] = set()
        self.glob: set[str] = set()
        self.nonloc: set[str] = set()
        self.walrus_names: set[str] = set()
        self.inner: list[_Uses] = []

    def load(self, name: str) -> None:
        self.loads.add(name)

    def store(self, name: str) -> None:
        self.local.add(name)

    def mutate(self, name: str | None) -> None:
        if name:
            self.mutates.add(name)

    def walrus(self, name: str) -> None:
        (self.walrus_names if self.is_comp else self.local).add(name)

    def nested(self, node: ast.AST, uses: _Uses) -> None:
        for part in _outer_parts(node):
            self.visit(part)
        self.inner.append(uses)
        for name in uses.walrus:
            self.walrus(name)

    def visit_Global(self, node: ast.Global) -> None:
        self.glob.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.nonloc.update(node.names)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.store(node.name)
        self.generic_visit(node)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self.visit(node.target)
        self.loop_body(node, lambda: [self.visit(s) for s in node.body + node.orelse])

    visit_AsyncFor = visit_For

    def uses(self) -> _Uses:
        local = self.local - self.glob - self.nonloc
        u = _Uses(self.loads - local, self.mutates - local, self.local & self.glob, set(self.glob))
        u.walrus = self.walrus_names
        for inner in self.inner:
            u.loads |= {n for n in inner.loads if n in inner.forced or n not in local}
            u.mutates |= {n for n in inner.mutates if n in inner.forced or n not in local}
            u.binds |= inner.binds
            u.forced |= inner.forced
        return u


def _function_uses(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> _Uses:
    scope = _Scope()
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
    scope.local |= {p.arg for p in params if p is not None}
    for stmt in node.body if isinstance(node.body, list) else [node.body]:
        scope.visit(stmt)
    return scope.uses()


def _comprehension_uses(node: ast.expr) -> _Uses:
    scope = _Scope(is_comprehension=True)
    for i, gen in enumerate(node.generators):  # type: ignore[attr-defined]
        scope.visit(gen.target)
        for part in ([gen.iter] if i else []) + gen.ifs:  # the first iterable runs outside
            scope.visit(part)
    for name in ("elt", "key", "value"):
        if hasattr(node, name):
            scope.visit(getattr(node, name))
    return scope.uses()


def _class_uses(node: ast.ClassDef) -> _Uses:
    flow = _Flow(in_class=True)
    flow.block(node.body, set())
    return _Uses(flow.reads, flow.mutates, flow.global_binds, flow.forced)


class _Flow(_Walker):
    """A module or class body, in evaluation order, tracking definitely-bound names.

    ``block`` returns the names bound for sure at the end of a block, or None
    when its end is unreachable (``raise``, ``break``...). Branches intersect;
    loop bodies and ``except`` handlers bind nothing for sure. Functions,
    lambdas, comprehensions and classes read their free names where they are
    defined; in a class body they skip the class's own names, as Python does.
    """

    def __init__(self, in_class: bool = False) -> None:
        self.in_class = in_class
        self.bound: set[str] = set()
        self.live = True
        self.reads: set[str] = set()
        self.binds: set[str] = set()
        self.mutates: set[str] = set()
        self.global_binds: set[str] = set()
        self.forced: set[str] = set()

    def block(self, stmts: list[ast.stmt], start: set[str]) -> set[str] | None:
        self.bound, self.live = set(start), True
        for stmt in stmts:
            self.visit(stmt)
            if not self.live:
                return None
        return self.bound

    def join(self, outs: list[set[str] | None]) -> None:
        live = [o for o in outs if o is not None]
        self.live = bool(live)
        self.bound = set.intersection(*live) if live else set()

    def load(self, name: str) -> None:
        if name not in self.bound:
            self.reads.add(name)

    def store(self, name: str) -> None:
        self.binds.add(name)
        self.bound.add(name)

    def delete(self, name: str) -> None:
        self.binds.add(name)  # reported as a bind; unbound afterwards
        self.bound.discard(name)

    def mutate(self, name: str | None) -> None:
        if name and not (self.in_class and name in self.bound):
            self.mutates.add(name)

    def nested(self, node: ast.AST, uses: _Uses) -> None:
        for part in _outer_parts(node):
            self.visit(part)
        self.reads |= {n for n in uses.loads if self.in_class or n not in self.bound}
        self.mutates |= uses.mutates
        self.global_binds |= uses.binds
        self.forced |= uses.forced
        self.binds |= uses.walrus  # bound maybe, not for sure

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        self.visit(node.values[0])
        saved = set(self.bound)
        for value in node.values[1:]:  # may not run: their walruses bind maybe
            self.visit(value)
        self.bound = saved

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        saved = set(self.bound)
        self.visit(node.body)
        self.bound = set(saved)
        self.visit(node.orelse)
        self.bound = saved

    def visit_Return(self, node: ast.stmt) -> None:
        self.generic_visit(node)
        self.live = False

    visit_Raise = visit_Break = visit_Continue = visit_Return

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        start = self.bound
        self.join([self.block(node.body, start), self.block(node.orelse, start)])

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        start = set(self.bound)
        self.visit(node.target)
        self.loop_body(node, lambda: self.block(node.body, self.bound))
        self.block(node.orelse, start)
        self.bound, self.live = start, True

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        start = self.bound
        self.block(node.body, start)
        self.block(node.orelse, start)
        self.bound, self.live = set(start), True

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.visit(item.optional_vars)
        start = self.bound
        out = self.block(node.body, start)
        # Managers are taken to run their body through, except `suppress(...)`.
        funcs = [getattr(item.context_expr, "func", None) for item in node.items]
        names = {getattr(f, "id", None) or getattr(f, "attr", None) for f in funcs}
        self.join([out, start] if "suppress" in names else [out])

    visit_AsyncWith = visit_With

    def visit_Try(self, node: ast.Try) -> None:
        start = self.bound
        body = self.block(node.body, start)
        outs = [None if body is None else self.block(node.orelse, body)]
        for handler in node.handlers:  # may start before anything in the body ran
            self.bound, self.live = set(start), True
            if handler.type is not None:
                self.visit(handler.type)
            if handler.name:
                self.store(handler.name)
            out = self.block(handler.body, self.bound)
            outs.append(out and out - {handler.name})  # `as e` is deleted at the end
        self.join(outs)
        joined = self.bound if self.live else None
        if node.finalbody:
            final = self.block(node.finalbody, start)
            joined = None if joined is None or final is None else joined | final
        self.join([joined])

    visit_TryStar = visit_Try

    def visit_Match(self, node: ast.Match) -> None:
        self.visit(node.subject)
        start = self.bound
        outs: list[set[str] | None] = [set(start)]  # no case may match
        for case in node.cases:
            self.bound, self.live = set(start), True
            self.visit(case.pattern)
            if case.guard is not None:
                self.visit(case.guard)
            outs.append(self.block(case.body, self.bound))
        self.join(outs)


def _has_await(tree: ast.AST) -> bool:
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            return True
        if isinstance(node, ast.comprehension) and node.is_async:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def analyse(source: str) -> CellAnalysis:
    """What a cell reads, binds and may mutate, from its source.

    ``reads``: names that may be read before the cell binds them, in
    evaluation order, including free names of the functions, lambdas,
    comprehensions and classes it defines (read where they are defined).
    A name bound on only some paths (an ``if`` without ``else``, a loop body,
    an ``except`` handler) still counts as read afterwards. ``binds``: every
    name bound at top level, including ``del x``, walrus targets in
    comprehensions and ``global`` names assigned inside functions (not the
    names of ``from m import *``). ``mutates``: names whose object may be
    changed in place: ``x[k] = ...``, ``x.a = ...``, ``del x[k]``, any method
    call ``x.m(...)``, also inside functions where ``x`` is free, and the
    iterable's names when a loop mutates its loop variable. Calls like
    ``f(x)`` and aliases (``y = x; y.append(1)``) are not tracked.
    ``has_await``: top-level ``await``, ``async for`` or ``async with``.

    A cell that does not parse gets an empty analysis (running it raises the
    SyntaxError, so nothing is recorded). A cell nested too deeply to parse
    or walk gets a rough one: every name it loads (or, if it cannot even be
    parsed, every identifier in it) is read, and every name may be mutated.
    """
    try:
        tree = _parse(source)
    except (SyntaxError, ValueError):
        return CellAnalysis(frozenset(), frozenset(), frozenset(), False)
    except (RecursionError, MemoryError):
        # Too deep for the compiler here: every identifier may be read, bound
        # and mutated. Over-inclusive, never missing an input.
        names = frozenset(_identifiers(source))
        return CellAnalysis(names, names, names, "await" in names)
    try:
        flow = _Flow()
        flow.block(tree.body, set())
        reads, binds, mutates = flow.reads, flow.binds | flow.global_binds, flow.mutates
    except RecursionError:
        nodes = list(ast.walk(tree))
        named = [n for n in nodes if isinstance(n, ast.Name)]
        reads = {n.id for n in named if isinstance(n.ctx, ast.Load)}
        binds = {n.id for n in named if not isinstance(n.ctx, ast.Load)}
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                binds.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                binds.update(_import_names(n))
        mutates = {n.id for n in named}
    # Without the words (in ASCII text) there is no await, async for or async with to find.
    maybe_async = not source.isascii() or "await" in source or "async" in source
    return CellAnalysis(
        frozenset(reads), frozenset(binds), frozenset(mutates), maybe_async and _has_await(tree)
    )


def imported_modules(source: str, package: str = "") -> frozenset[str]:
    """Every module an ``import`` of ``source`` names, wherever it is, with its packages.

    ``import a.b`` gives ``a`` and ``a.b``; ``from a.b import c`` gives ``a``,
    ``a.b`` and ``a.b.c`` (``c`` may be a submodule). Relative imports are
    resolved against ``package`` (the ``__package__`` of the module whose
    source it is); with none (a notebook) they name nothing. An unparsable
    source names nothing.
    """
    try:
        tree = _parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    dotted: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".") if package else []
                if not parts or node.level - 1 > len(parts) - 1:
                    continue  # beyond the top-level package: the import fails anyway
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            if base:
                dotted.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
                dotted.add(base)
    out: set[str] = set()
    for name in dotted:
        parts = name.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return frozenset(out)


def _identifiers(source: str) -> set[str]:
    """Every NAME token of ``source`` (no parsing, so no recursion)."""
    import io
    import keyword
    import tokenize

    out: set[str] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                out.add(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass  # what was read so far still counts
    return out


def ends_with_semicolon(source: str) -> bool:
    r"""Whether the last token of `source`, ignoring comments and newlines, is ``;``.

    A trailing ``;`` hides a cell's result. IPython decides this in
    ``DisplayHook.semicolon_at_end_of_expression``, which only exists from
    IPython 8.8 on, so the same token rule is kept here for the whole
    supported range.

    >>> ends_with_semicolon("x = 1\nx;  # hidden")
    True
    >>> ends_with_semicolon("'a;'")
    False
    """
    if ";" not in source:
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    skip = {tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT}
    for token in reversed(tokens):
        if token.type in skip:
            continue
        return token.type == tokenize.OP and token.string == ";"
    return False


def _bound_once(source: str) -> tuple[ast.Module, dict[str, int]] | None:
    """A cell's tree and how many times it binds each name (anywhere in it, a def's
    locals too: more is never "once"); None when it does not parse or may bind names
    its syntax does not spell (a star import, ``match``, ``globals()``).
    """
    try:
        tree = _parse(source)
    except (SyntaxError, ValueError):
        return None
    stores: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Match) or (
            isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
        ):
            return None  # binds names not spelled as targets: none is known to be bound once
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in _DYNAMIC:
            return None  # globals()["N"] = ..., exec(...): may bind anything
        if isinstance(node, ast.ExceptHandler) and node.name:
            stores[node.name] = stores.get(node.name, 0) + 1
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                stores[name] = stores.get(name, 0) + 2  # never "once"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores[node.name] = stores.get(node.name, 0) + 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _import_names(node):
                stores[name] = stores.get(name, 0) + 1
    return tree, stores


def constant_bindings(source: str) -> dict[str, str]:
    """The names a cell binds once, at top level, to an immutable literal: name -> the
    value's :func:`literal_key` (the values themselves: :func:`constant_values`).
    """
    return {n: k for n, v in constant_values(source).items() if (k := literal_key(v)) is not None}


def constant_values(source: str) -> dict[str, Any]:
    """The names a cell binds once, at top level, to an immutable literal: name -> value.

    ``N_QUESTIONS = 3`` in a cell whose other lines change: the name comes out
    of a rerun the same whatever else changed, and ``STYLE = 'bold'`` where it
    was ``'plain'`` comes out otherwise, which a view can say before the rerun
    (see :mod:`nbdurable.status`). Only a plain ``NAME = literal``
    (numbers, strings, bytes, booleans, None, tuples of these)
    whose name nothing else in the cell binds, deletes or declares global:
    the value cannot be changed in place, and no other line can rebind it.
    A cell that does not parse binds none.
    """
    counted = _bound_once(source)
    if counted is None:
        return {}
    tree, stores = counted
    out: dict[str, Any] = {}
    for stmt in tree.body:
        if not (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
        ):
            continue
        name = stmt.targets[0].id
        try:
            value = ast.literal_eval(stmt.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if stores.get(name) == 1 and literal_key(value) is not None:
            out[name] = value
    return out


def function_defs(source: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions a cell defines once, at top level: name -> its ``def`` (decorators
    included), whose :func:`def_key` a view with no kernel compares with a record's.
    """
    counted = _bound_once(source)
    if counted is None:
        return {}
    tree, stores = counted
    return {
        stmt.name: stmt
        for stmt in tree.body
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stores.get(stmt.name) == 1
    }


def library_imports(source: str, local_dir: Any = None) -> set[str]:
    """The names a cell binds once, at top level, by importing an absolute module that
    is not a local one (no ``NAME.py`` or ``NAME/`` in ``local_dir``, the notebook's
    folder): what a Run All binds to a library's module, class or function.
    """
    import os

    counted = _bound_once(source)
    if counted is None:
        return set()
    tree, stores = counted
    out: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            tops = {a.asname or a.name.split(".")[0]: a.name.split(".")[0] for a in stmt.names}
        elif isinstance(stmt, ast.ImportFrom) and stmt.level == 0 and stmt.module:
            top = stmt.module.split(".")[0]
            tops = {a.asname or a.name: top for a in stmt.names if a.name != "*"}
        else:
            continue
        for name, top in tops.items():
            local = local_dir is not None and (
                os.path.exists(os.path.join(local_dir, top + ".py"))
                or os.path.isdir(os.path.join(local_dir, top))
            )
            if stores.get(name) == 1 and not local and top != "__main__":
                out.add(name)
    return out


def global_reads(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names a ``def`` may read from the module: every name loaded anywhere in it
    (nested functions, decorators and defaults too) but its parameters and the names
    its own body binds. A nested scope's locals count as reads: more, never fewer.
    """
    args = node.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    params += [a for a in (args.vararg, args.kwarg) if a is not None]
    local = {a.arg for a in params}
    declared: set[str] = set()
    todo: list[ast.AST] = list(node.body)
    while todo:  # the function's own scope: not into nested defs, lambdas, classes
        n = todo.pop()
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            declared.update(n.names)
        elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            local.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            local.add(n.name)
            continue
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            local.update(_import_names(n))
        if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        todo.extend(ast.iter_child_nodes(n))
    loads = {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    return loads - (local - declared)


def def_key(
    node: ast.FunctionDef | ast.AsyncFunctionDef, resolve: Callable[[str], str | None]
) -> str | None:
    """A notebook function as a view with no kernel can know it: a digest of its code
    (its ``def`` as a tree, so comments and layout aside) and of what each name it
    reads from the module is: ``resolve(name)`` gives ``"lib"`` (a library's module,
    class or function, or a name no cell binds: a builtin, which IPython binds to
    its own function for some, ``open``), a literal's :func:`literal_key`, another
    function's key, or None when that is not known, and nor then is this key (None).

    The kernel computes it from the live function (its source and globals), a
    view from the saved plain cells; where both know it, the same key is the same
    function on the next Run All, and another key a changed one.
    """
    parts = [ast.dump(node)]
    for name in sorted(global_reads(node)):
        got = "self" if name == node.name else resolve(name)
        if got is None:
            return None
        parts.append(f"{name}={got}")
    return (
        "def:"
        + hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    )


def literal_key(value: Any) -> str | None:
    """A digest of an immutable builtin value (its type and repr), None for any other.

    What a record keeps of an input a plain cell bound to a literal
    (``StepRecord.plain``), compared with what the saved cell binds now: a
    digest, never the value (it may be a key). A string holding a redacted
    secret (a record's code) has none: it is not the value the cell binds.
    """
    if not _immutable(value) or (isinstance(value, str) and "[redacted " in value):
        return None
    text = f"{type(value).__name__}:{value!r}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


#: Line magics that bind no name of the namespace (``%time x = 1`` does, ``%run`` may).
_QUIET_MAGICS = frozenset({"load_ext", "reload_ext", "matplotlib", "pip", "conda",
                           "autoreload", "aimport", "config", "env", "precision"})  # fmt: skip


def binds_unknown(source: str) -> bool:
    """Whether a cell may bind names its syntax does not spell (a star import, ``exec``,
    ``globals()``, a magic such as ``%run`` or ``%%capture out``), or does not parse.

    A view reading a plain cell's literal (:func:`constant_bindings`) from the
    saved notebook trusts it only while no later cell may have bound the
    name some other way.
    """
    try:
        tree = _parse(source)
    except (SyntaxError, ValueError):
        return True
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in _DYNAMIC:
            return True
        if isinstance(node, ast.Global):  # a function that rebinds a global when called
            return True
        if isinstance(node, ast.Call) and (magic := _magic_call(node)) is not None:
            if magic not in _QUIET_MAGICS:
                return True
    return False


def _magic_call(node: ast.Call) -> str | None:
    """``get_ipython().run_line_magic('run', ...)`` -> ``'run'``; "" for another call on
    ``get_ipython()``; None for any other call.
    """
    func = node.func
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "get_ipython"
    ):
        return None
    if func.attr == "run_line_magic" and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return ""


#: Builtins through which a cell may bind any name: no binding of it is known to be the only one.
_DYNAMIC = frozenset({"globals", "locals", "vars", "exec", "eval", "setattr", "__import__"})


def _immutable(value: Any) -> bool:
    # Not a frozenset: two equal ones may list their items in other orders.
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes))
