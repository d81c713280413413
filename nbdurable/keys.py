"""Step identity and fingerprints: the whole key recipe, in one place.

**Step keys** (:func:`step_key`), most stable first:

1. ``name:<name>`` for ``%%step NAME`` (label ``NAME``). Named steps survive
   edits, moves and copies of the cell; names are checked by :func:`validate_name`.
2. ``id:<cell id>`` (label ``cell <first 8 chars>``). The caller passes a cell id
   only when the notebook file on disk carries it: JupyterLab invents new
   random ids on every load of an nbformat 4.4 notebook, so an unsaved id would
   change after a restart.
3. ``pos:<index>`` (label ``cell #<index + 1>``): the 0-based index of the cell
   in the notebook, from our runner or from finding the cell's source in the
   saved notebook. The label counts from 1, as a reader counts cells.
4. ``src:<first 16 hex of the source fingerprint>`` (label ``cell <first 30
   chars of the first code line>``): survives restarts, not edits.

**Sub-step keys**: ``<step key>/<sub id>`` for ``step(id, ...)`` inside a
``%%step`` cell, ``~run/<sub id>`` outside any step; sub ids are checked by
:func:`validate_sub_id` and kept exactly. ``@recorded`` functions use
``<module.qualname>#<ordinal of the call within the enclosing step>`` as id
(outside a step ``<module.qualname>#<first 12 hex of args_fingerprint>#<ordinal>``).

**Source fingerprint** (:func:`source_fingerprint`): SHA-256 of
:func:`normalize_source` of the cell's Python (after IPython's transforms),
i.e. of its AST, so comments, blank lines and formatting never invalidate a
step, while any code edit does.

**Input fingerprints**: for each name of :attr:`CellAnalysis.reads` (may be
read before the cell binds it, see :func:`analyse`) that exists in the
namespace, :func:`fingerprint` of its value: data by content, functions by
code and closure, modules and library classes by name, notebook classes by
their members too, other objects by type only. A step re-executes when its
source fingerprint or any input fingerprint changed.

**Idempotency keys**: ``"nbd-"`` + the first 32 hex digits of the SHA-256 of
``run id, step key, sub id, name`` (UTF-8, joined by NUL), stable across
retries of the same sub-step and distinct between sub-steps.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import pathlib
import pickle
import re
import struct
import types
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageProblem

# -- source -------------------------------------------------------------------

_PARSE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def _parse(source: str) -> ast.Module:
    # Silence SyntaxWarnings ("is" with a literal, bad escapes): IPython already
    # showed them once, and under warnings-as-errors they would abort the parse.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(source, "<cell>", "exec", flags=_PARSE_FLAGS, dont_inherit=True)


def normalize_source(source: str) -> str:
    """The cell's code with comments, blank lines and formatting removed.

    Parseable code (top-level ``await`` included) comes back as
    ``ast.unparse`` of its AST. We unparse rather than ``ast.dump`` because
    the dump changes with every new AST field or dump default (3.12 added
    ``type_params``, 3.13 hides empty fields), whereas unparsed source only
    changes when the grammar does, so a Python upgrade invalidates fewer steps.
    Code that does not parse (or is too deeply nested to unparse) falls back
    to its lines without comment-only lines, blank lines or trailing spaces.
    Never raises.
    """
    try:
        return ast.unparse(_parse(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        lines = (line.rstrip() for line in source.splitlines())
        return "\n".join(s for s in lines if s and not s.lstrip().startswith("#"))


def source_fingerprint(source: str) -> str:
    """SHA-256 (32 hex digits) of :func:`normalize_source`."""
    data = normalize_source(source).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:32]


# -- analysis -----------------------------------------------------------------


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
    SyntaxError, so nothing is recorded). A cell nested too deeply to walk
    gets a rough one: every name it loads is read, every name it mentions may
    be mutated.
    """
    try:
        tree = _parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return CellAnalysis(frozenset(), frozenset(), frozenset(), False)
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
    return CellAnalysis(frozenset(reads), frozenset(binds), frozenset(mutates), _has_await(tree))


# -- values -------------------------------------------------------------------

_LEN = struct.Struct("<Q")
_FLOAT = struct.Struct("<d")
_BIG = 1 << 16  # buffers this large go to SHA-256 in place, uncopied


def _qual(t: type) -> str:
    return f"{getattr(t, '__module__', None)}.{getattr(t, '__qualname__', None)}"


def _head(tag: bytes, count: int) -> bytes:
    return bytes([len(tag)]) + tag + _LEN.pack(count)


def _int(v: int) -> bytes:
    # Not str(v): Python 3.11 refuses str() of ints over 4300 digits.
    return v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True)


class _Op:
    """A step of the walk that is not a value (leave a container, open a set element)."""

    __slots__ = ("fn", "arg")

    def __init__(self, fn: Any, arg: Any) -> None:
        self.fn, self.arg = fn, arg


class _Missing:
    """Stands for an empty closure cell or an unset dataclass field."""


_MISSING = _Missing()


class _Sink:
    """Bytes on their way into SHA-256; the hash object is made only when needed."""

    __slots__ = ("hash", "buf")

    def __init__(self) -> None:
        self.hash: Any = None
        self.buf = bytearray()

    def flush(self) -> None:
        if self.hash is None:
            self.hash = hashlib.sha256()
        self.hash.update(self.buf)
        self.buf.clear()

    def digest(self) -> bytes:
        self.flush()
        return self.hash.digest()

    def summary(self) -> bytes:
        """A set element: its encoding itself when short (cheaper), else its digest."""
        if self.hash is None and len(self.buf) <= 64:
            return b"=" + self.buf
        return b"#" + self.digest()


class _Hasher:
    """Feeds one value into SHA-256, walking it with an explicit stack.

    Each value writes a header with :meth:`put` (tag, part count, then each
    part length-prefixed, so the stream is unambiguous) and pushes its
    children, whose number the header states. A container that is already on
    the path from the root writes a back-reference (its depth) instead, so
    cycles end; there is no recursion, so deep nesting cannot overflow.
    A set's elements are hashed into their own sinks and their digests sorted.
    """

    def __init__(self) -> None:
        self.sinks = [_Sink()]
        self.path: dict[int, int] = {}
        self.stack: list[Any] = []

    def run(self, value: object) -> str:
        self.put(b"nbdurable-fingerprint", b"1")  # change on any encoding change
        stack, sinks, exact = self.stack, self.sinks, _EXACT
        stack.append(value)
        while stack:
            item = stack.pop()
            if type(item) is _Op:
                item.fn(self, item.arg)
                continue
            exact.get(type(item), _other)(self, item)
            if len(sinks[-1].buf) > _BIG:
                sinks[-1].flush()
        return sinks[0].digest().hex()[:32]

    def put(self, tag: bytes, *parts: bytes | str) -> None:
        buf = self.sinks[-1].buf
        buf += _head(tag, len(parts))
        for part in parts:
            if isinstance(part, str):
                part = part.encode("utf-8", "surrogatepass")
            buf += _LEN.pack(len(part))
            buf += part

    def raw(self, data: Any) -> None:
        """A length-prefixed C-contiguous buffer; a large one is hashed without a copy."""
        view = memoryview(data).cast("B")
        sink = self.sinks[-1]
        sink.buf += _LEN.pack(view.nbytes)
        if view.nbytes < _BIG:
            sink.buf += view
        else:
            sink.flush()
            sink.hash.update(view)

    def push(self, *children: Any) -> None:
        self.stack.extend(reversed(children))

    def enter(self, v: object) -> bool:
        """Put ``v`` on the path; False (and a back-reference written) if it already is."""
        depth = self.path.get(id(v))
        if depth is not None:
            self.put(b"cycle", _int(depth))
            return False
        self.path[id(v)] = len(self.path)
        self.stack.append(_Op(_leave, v))  # holds v, so its id is not reused meanwhile
        return True


def _leave(h: _Hasher, v: object) -> None:
    del h.path[id(v)]


def _begin_element(h: _Hasher, _: None) -> None:
    h.sinks.append(_Sink())


_BEGIN = _Op(_begin_element, None)


def _end_element(h: _Hasher, digests: list[bytes]) -> None:
    digests.append(h.sinks.pop().summary())


def _end_set(h: _Hasher, digests: list[bytes]) -> None:
    h.put(b"elements", *sorted(digests))


def _atom(tag: bytes, encode: Any) -> Any:
    return lambda h, v: h.put(tag, *encode(v))


def _atom1(tag: bytes, encode: Any) -> Any:
    """Like ``_atom`` with one part, inlined: ints and strings are most of the work."""
    head = _head(tag, 1)

    def handler(h: _Hasher, v: Any) -> None:
        data = encode(v)
        h.sinks[-1].buf += head + _LEN.pack(len(data)) + data

    return handler


def _sequence(tag: bytes) -> Any:
    def handler(h: _Hasher, v: Any) -> None:
        if h.enter(v):
            h.put(tag, _int(len(v)))
            h.stack.extend(reversed(v))

    return handler


def _unordered(h: _Hasher, groups: Any) -> None:
    """Hash each group of values into its own sink; write the sorted summaries."""
    digests: list[bytes] = []
    end = _Op(_end_element, digests)
    stack = h.stack
    stack.append(_Op(_end_set, digests))
    for group in groups:
        stack.append(end)
        stack.extend(reversed(group))
        stack.append(_BEGIN)


def _set(tag: bytes) -> Any:
    def handler(h: _Hasher, v: Any) -> None:
        if h.enter(v):
            h.put(tag, _int(len(v)))
            _unordered(h, ((x,) for x in v))

    return handler


def _wrapper(tag: bytes, *attrs: str) -> Any:
    def handler(h: _Hasher, v: Any) -> None:
        if h.enter(v):
            h.put(tag)
            h.push(*(getattr(v, a) for a in attrs))

    return handler


def _dict(h: _Hasher, v: Any) -> None:
    # In any order, as == compares dicts: a dict built by iterating over a set of
    # strings has a different order in every process (PYTHONHASHSEED).
    if h.enter(v):
        h.put(b"dict", _int(len(v)))
        _unordered(h, v.items())


def _defaultdict(h: _Hasher, v: Any) -> None:
    h.put(b"defaultdict")
    _dict(h, v)
    h.stack.append(v.default_factory)


def _bytes(h: _Hasher, v: Any) -> None:
    h.put(type(v).__name__.encode())
    h.raw(v)


def _memoryview(h: _Hasher, v: memoryview) -> None:
    h.put(b"memoryview", v.format, str(v.shape))
    h.raw(v.tobytes())


def _function(h: _Hasher, v: types.FunctionType) -> None:
    if h.enter(v):
        cells = []
        for cell in v.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # a cell not filled yet
                cells.append(_MISSING)
        h.put(b"function", _int(len(cells)))
        h.push(v.__code__, v.__defaults__, v.__kwdefaults__, *cells)


def _code(h: _Hasher, v: types.CodeType) -> None:
    # Not co_filename, co_firstlineno or the line table: IPython names each
    # cell's file after the kernel's pid, and moving code must not matter.
    if h.enter(v):
        counts = (v.co_argcount, v.co_posonlyargcount, v.co_kwonlyargcount, v.co_flags)
        h.put(b"code", v.co_name, v.co_code, *map(_int, counts))
        h.push(v.co_consts, v.co_names, v.co_varnames, v.co_freevars, v.co_cellvars)


def _method(h: _Hasher, v: types.MethodType) -> None:
    if h.enter(v):
        owner = v.__self__
        h.put(b"method")
        h.push(v.__func__, owner if isinstance(owner, type) else type(owner))


def _builtin(h: _Hasher, v: Any) -> None:
    h.put(b"builtin", str(getattr(v, "__module__", None)), str(getattr(v, "__qualname__", None)))


def _class(h: _Hasher, v: type) -> None:
    if not h.enter(v):
        return
    h.put(b"class", _qual(v))
    if getattr(v, "__module__", None) == "__main__":  # may change between runs: by content
        members = sorted(
            ((k, x) for k, x in vars(v).items() if not k.startswith("__") or _is_code(x)),
            key=lambda kx: kx[0],
        )
        h.put(b"members", *(k for k, _ in members))
        h.push(v.__bases__, *(x for _, x in members))


def _is_code(x: object) -> bool:
    return isinstance(x, (types.FunctionType, staticmethod, classmethod, property))


def _is_ndarray(t: type) -> bool:
    return any(c.__name__ == "ndarray" and c.__module__ == "numpy" for c in t.__mro__)


def _ndarray(h: _Hasher, v: Any) -> None:
    h.put(b"ndarray", _qual(type(v)), v.dtype.str, str(v.dtype), str(v.shape))
    if not v.dtype.hasobject:
        data = v if v.flags.c_contiguous else v.copy(order="C")
        h.raw(data.reshape(-1).view("u1"))  # bytes of any dtype, without a copy
    elif h.enter(v):
        items = list(v.flat)
        h.put(b"items", _int(len(items)))
        h.stack.extend(reversed(items))


def _pandas(h: _Hasher, v: Any) -> None:
    try:
        data = pickle.dumps(v, protocol=5)
    except Exception:  # whatever the reason, it is hashed by type only (documented)
        h.put(b"opaque", _qual(type(v)), b"unpicklable")
    else:
        h.put(b"pandas", _qual(type(v)))
        h.raw(data)


def _custom(h: _Hasher, v: Any, hook: Any) -> None:
    result = hook(v)
    if isinstance(result, str):
        result = result.encode("utf-8", "surrogatepass")
    if not isinstance(result, bytes):
        raise TypeError(
            f"{_qual(type(v))}.__nbdurable_fingerprint__() must return str or bytes, "
            f"got {type(result).__name__}"
        )
    h.put(b"custom", _qual(type(v)), result)


def _other(h: _Hasher, v: Any) -> None:
    """Everything whose exact type is not in ``_EXACT``."""
    t = type(v)
    module = str(getattr(t, "__module__", "")).partition(".")[0]
    hook = getattr(t, "__nbdurable_fingerprint__", None)
    if hook is not None:
        _custom(h, v, hook)
    elif isinstance(v, type):
        _class(h, v)
    elif isinstance(v, enum.Enum):
        h.put(b"enum", _qual(t), str(v._name_))
        h.stack.append(v._value_)
    elif _is_ndarray(t):
        _ndarray(h, v)
    elif module == "numpy" and t.__name__ == "ufunc":
        h.put(b"ufunc", str(getattr(v, "__name__", None)))
    elif module == "numpy" and hasattr(v, "dtype") and hasattr(v, "tobytes"):  # a scalar
        h.put(b"numpy", _qual(t), v.dtype.str, v.tobytes())
    elif module == "pandas":
        _pandas(h, v)
    elif dataclasses.is_dataclass(t):
        if h.enter(v):
            names = [f.name for f in dataclasses.fields(v)]
            h.put(b"dataclass", _qual(t), *names)
            h.push(*(getattr(v, n, _MISSING) for n in names))
    elif isinstance(v, tuple) and isinstance(getattr(t, "_fields", None), tuple):
        if h.enter(v):
            h.put(b"namedtuple", _qual(t), *t._fields)
            h.stack.extend(reversed(v))
    else:
        for base in t.__mro__[1:]:  # a subclass of a type we know: its content
            handler = _EXACT.get(base)
            if handler is not None:
                h.put(b"subclass", _qual(t))
                handler(h, v)
                return
        h.put(b"opaque", _qual(t))  # never repr() (addresses) nor pickle (side effects)


_EXACT: dict[type, Any] = {
    type(None): lambda h, v: h.put(b"None"),
    type(...): lambda h, v: h.put(b"Ellipsis"),
    type(NotImplemented): lambda h, v: h.put(b"NotImplemented"),
    _Missing: lambda h, v: h.put(b"missing"),
    bool: _atom(b"bool", lambda v: [b"1" if v else b"0"]),
    int: _atom1(b"int", _int),
    float: _atom1(b"float", _FLOAT.pack),
    complex: _atom(b"complex", lambda v: [_FLOAT.pack(v.real), _FLOAT.pack(v.imag)]),
    str: _atom1(b"str", lambda v: v.encode("utf-8", "surrogatepass")),
    bytes: _bytes,
    bytearray: _bytes,
    memoryview: _memoryview,
    tuple: _sequence(b"tuple"),
    list: _sequence(b"list"),
    collections.deque: _sequence(b"deque"),
    types.SimpleNamespace: _wrapper(b"namespace", "__dict__"),
    dict: _dict,
    collections.defaultdict: _defaultdict,
    set: _set(b"set"),
    frozenset: _set(b"frozenset"),
    range: _atom(b"range", lambda v: [_int(v.start), _int(v.stop), _int(v.step)]),
    slice: _wrapper(b"slice", "start", "stop", "step"),
    # as_tuple, not str(): str() follows the context's `capitals` setting.
    decimal.Decimal: _atom(b"Decimal", lambda v: [str(v.as_tuple())]),
    fractions.Fraction: _atom(b"Fraction", lambda v: [_int(v.numerator), _int(v.denominator)]),
    datetime.datetime: _atom(b"datetime", lambda v: [v.isoformat(), str(v.fold), str(v.tzname())]),
    datetime.date: _atom(b"date", lambda v: [v.isoformat()]),
    datetime.time: _atom(b"time", lambda v: [v.isoformat(), str(v.fold), str(v.tzname())]),
    datetime.timedelta: _atom(
        b"timedelta", lambda v: [_int(v.days), _int(v.seconds), _int(v.microseconds)]
    ),
    uuid.UUID: _atom(b"UUID", lambda v: [v.bytes]),
    pathlib.PurePath: _atom(b"path", lambda v: [_qual(type(v)), str(v)]),
    type: _class,
    types.ModuleType: _atom(b"module", lambda v: [str(getattr(v, "__name__", None))]),
    types.FunctionType: _function,
    types.CodeType: _code,
    types.MethodType: _method,
    functools.partial: _wrapper(b"partial", "func", "args", "keywords"),
    staticmethod: _wrapper(b"staticmethod", "__func__"),
    classmethod: _wrapper(b"classmethod", "__func__"),
    property: _wrapper(b"property", "fget", "fset", "fdel"),
    **{
        t: _builtin
        for t in (
            types.BuiltinFunctionType,
            types.MethodDescriptorType,
            types.WrapperDescriptorType,
            types.MethodWrapperType,
            types.ClassMethodDescriptorType,
        )
    },
}


def fingerprint(value: object) -> str:
    """A content hash (32 hex digits of SHA-256), the same in every process.

    It never depends on ``hash()`` (randomized per process by
    ``PYTHONHASHSEED``), ``id()`` or ``repr()``. Every value is tagged with
    its type, so ``1``, ``1.0``, ``True``, ``"1"``, ``[1]`` and ``(1,)`` differ.

    * Data by content: None, bool, int, float (IEEE bytes: ``-0.0`` and NaN
      are stable), complex, str, bytes, bytearray, memoryview, tuple, list,
      deque, dict, set and frozenset (these three in any order, as ``==``
      compares them), range, slice, Decimal, Fraction, datetime, date, time,
      timedelta, UUID, paths, SimpleNamespace, Enum members (class and name),
      dataclass instances and namedtuples (type and fields), and subclasses
      of all these (their type plus the content).
    * numpy arrays by dtype, shape and raw bytes (no copy when C-contiguous;
      object arrays element by element), numpy scalars by dtype and bytes,
      ufuncs by name; numpy is never imported. pandas objects by their
      pickle; one that cannot be pickled by type only.
    * Functions by code (bytecode, constants with nested code, names,
      arguments; not the file name or line numbers), defaults and closure
      contents, so a decorator's wrapper differs per wrapped function; never
      by their globals. ``functools.partial`` by function, args and keywords;
      bound methods by function and the class of ``__self__``; builtins by
      module and qualified name; staticmethod, classmethod and property by
      what they wrap.
    * Classes by module and qualified name; classes defined in ``__main__``
      (the notebook) also by their bases and members, so editing a method
      changes the class's fingerprint. Modules by name.
    * Escape hatch: a class may define ``__nbdurable_fingerprint__(self)``
      returning str or bytes; that result (with the class's name) is used.
    * Anything else (clients, sockets, locks, files, generators, plain class
      instances) by type only: never by ``repr`` (it may hold addresses),
      never by pickle (it may have side effects).

    A container reachable from itself hashes a back-reference where it
    recurs. The walk uses no recursion, so very deep nesting is fine.
    """
    return _Hasher().run(value)


def args_fingerprint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """:func:`fingerprint` of ``(args, kwargs items sorted by name)``."""
    return fingerprint((tuple(args), tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))))


# -- names --------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME_RULE = "use letters, digits, _ . : - (at most 128, starting with a letter or _)"


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_name(name: str, what: str = "step name") -> str:
    """Return ``name`` if it is a valid step name, else raise :class:`UsageProblem`."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise UsageProblem(f"{what} {_shown(name)} is not allowed: {_NAME_RULE}")
    return name


def validate_sub_id(sub_id: object) -> str:
    r"""Return ``sub_id`` as a plain str if it is a valid sub-step id.

    Any non-empty str of at most 512 characters without control characters
    (``\x00``-``\x1f``, ``\x7f``) is valid and kept exactly: no
    normalization, so two different ids never collide. A non-str raises
    ``TypeError``; a bad str raises :class:`UsageProblem` (a ``ValueError``).
    """
    if not isinstance(sub_id, str):
        raise TypeError(f"a sub-step id must be a str, got {type(sub_id).__name__}")
    if not sub_id:
        raise UsageProblem("a sub-step id must not be empty: pass a non-empty str")
    if len(sub_id) > 512:
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)} has {len(sub_id)} characters: at most 512 are allowed"
        )
    bad = _CONTROL.search(sub_id)
    if bad:
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)} contains the control character {bad.group()!r} "
            f"at index {bad.start()}: ids may not contain \\x00-\\x1f or \\x7f"
        )
    return str.__str__(sub_id)  # a plain str, also for str subclasses


def step_key(
    name: str | None, cell_id: str | None, position: int | None, source: str
) -> tuple[str, str]:
    """``(key, label)`` of a step, by the recipe in the module docstring.

    The first of ``name``, ``cell_id`` (empty counts as absent), ``position``
    (0-based; the label shows it 1-based) that is given decides; without any,
    the normalized source does. ``name`` is checked with :func:`validate_name`.
    """
    if name is not None:
        return f"name:{validate_name(name)}", name
    if cell_id:
        return f"id:{cell_id}", f"cell {cell_id[:8]}"
    if position is not None:
        return f"pos:{position}", f"cell #{position + 1}"
    lines = (line.strip() for line in source.splitlines())
    first = next((s for s in lines if s and not s.startswith("#")), "(empty)")
    return f"src:{source_fingerprint(source)[:16]}", f"cell {first[:30]}"
