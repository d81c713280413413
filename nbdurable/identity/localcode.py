"""Which code is the user's: local files, local modules, and the names code reads.

A fingerprint follows what a function reads only into the user's own code:
the notebook and **local modules**, i.e. modules whose file lies outside the
standard library and every ``site-packages``/``dist-packages`` directory (a
``helpers.py`` next to the notebook, a package installed in editable mode).
Library code is identified by name: following a library function's globals
would walk half of numpy, and a library changes only when it is upgraded.
nbdurable's own modules count as library code.

A local module is identified by the SHA-256 of its source file, read again
whenever its size or modification time changes. What a function reads is
taken from its bytecode and that of the code nested in it (inner functions,
lambdas, comprehensions): the names it loads as globals, and from a local
module every name the code mentions (``co_names``, attribute names included:
``helpers.SCALE`` lists ``helpers`` and ``SCALE``), a small over-approximation.

The files of local modules a step imports itself (``import helpers`` inside
the step, where ``helpers`` is bound, not read) are found by
:func:`local_module_files`: each module and, transitively, the local modules
its namespace holds or takes functions and classes from.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import os
import site
import sys
import sysconfig
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

from . import analysis, reduction

_PACKAGE_DIRS = frozenset({"site-packages", "dist-packages"})


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except AttributeError:  # site's functions are missing in some embedded interpreters
        pass
    # nbdurable itself, even when installed editable: the package directory,
    # two levels up from this file (nbdurable/identity/localcode.py).
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = {os.path.realpath(r) for r in roots if r} | {os.path.realpath(here)}
    return tuple(r.rstrip(os.sep) + os.sep for r in sorted(found))


_ROOTS = _library_roots()


@functools.cache
def is_library_file(filename: str) -> bool:
    """True for a file of the standard library, an installed package, or nbdurable.

    Pseudo file names: ``<frozen ...>`` (frozen standard modules) is library
    code; any other (``<string>``, ``<stdin>``, a cell's ``<ipython-input-...>``)
    is the user's.
    """
    if filename.startswith("<"):
        return filename.startswith("<frozen")
    path = os.path.realpath(filename)
    if _PACKAGE_DIRS.intersection(path.split(os.sep)):
        return True
    return path.startswith(_ROOTS)


def is_library_name(value: Any) -> bool:
    """True for a module, class or function of the standard library or an installed
    package: what its name (and the package's version) says all of.
    """
    if isinstance(value, types.ModuleType):
        return module_file(value) is None and value.__name__ != "__main__"
    if isinstance(value, type):
        return not is_local_module_name(getattr(value, "__module__", None))
    if isinstance(value, types.FunctionType):
        return not is_local_function(value)
    return isinstance(value, types.BuiltinFunctionType)


def package_version(module_name: str) -> str:
    """The installed version of the distribution a library module comes from.

    ``sklearn.cluster`` -> ``sklearn 1.9.1``; a standard module -> ``""`` (the
    interpreter is the kernel's: a new one is a new kernel, and a standard
    module keeps the fingerprint it had before versions were part of it). A library object is
    fingerprinted by its name and this: the same installed version is the
    same object on every run, whichever step bound it; an upgrade is a change.
    """
    top = module_name.partition(".")[0]
    got = _VERSIONS.get(top)
    if got is None:
        got = _VERSIONS[top] = _version_of(top)
    return got


_VERSIONS: dict[str, str] = {}


def _version_of(top: str) -> str:
    # Cheapest first: a first step pays for this once per package, and the
    # table of every distribution's modules costs a quarter of a second.
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        return ""
    module = sys.modules.get(top)
    version = getattr(module, "__version__", None) if module is not None else None
    if isinstance(version, str) and version:
        return f"{top} {version}"
    import importlib.metadata

    try:
        return f"{top} {importlib.metadata.version(top)}"
    except Exception:  # the distribution is named otherwise (PyYAML for yaml)
        pass
    global _LOOKUPS, _TABLE
    try:
        # Each lookup reads every distribution's file list once; a notebook that needs
        # many (rare: most packages say their version themselves) builds the table.
        _LOOKUPS += 1
        if _TABLE is None and _LOOKUPS > 3:
            _TABLE = importlib.metadata.packages_distributions()
        found = _TABLE.get(top, []) if _TABLE is not None else distributions_of(top)
        names = sorted(set(found))
        return " ".join(f"{n} {importlib.metadata.version(n)}" for n in names) or "unversioned"
    except Exception:  # a broken distribution's metadata: the name alone stands
        return "unversioned"


_LOOKUPS = 0
_TABLE: Any = None


def distributions_of(top: str) -> list[str]:
    """The names of the installed distributions that provide top-level package ``top``.

    What ``importlib.metadata.packages_distributions()[top]`` says, without
    building that table of every distribution: it parses every distribution's
    file list (``RECORD``), seconds of a kernel's first step in a large
    environment (torch's list alone is thousands of lines). Here a list is
    parsed only when ``top`` occurs in its text at all, which it must for the
    package to be inferred from it; a declared ``top_level.txt`` is read as is.
    """
    import importlib.metadata as md

    declared = getattr(md, "_top_level_declared", None)
    inferred = getattr(md, "_top_level_inferred", None)
    if declared is None or inferred is None:  # another Python's internals: the whole table
        return list(md.packages_distributions().get(top, []))
    names = []
    for dist in md.distributions():
        tops = declared(dist)
        if not tops:
            listing = dist.read_text("RECORD")
            if listing is not None and top not in listing:
                continue
            tops = inferred(dist)
        if top in tops:
            names.append(dist.metadata["Name"])
    return names


def module_file(module: types.ModuleType) -> str | None:
    """The file of a local module; None for library, built-in and ``__main__`` modules.

    Reads the module's ``__dict__`` directly: a module ``__getattr__`` (PEP 562)
    is never called.
    """
    try:
        namespace = vars(module)
    except TypeError:
        return None
    name = namespace.get("__name__")
    file = namespace.get("__file__")
    if not isinstance(name, str) or name == "__main__" or not isinstance(file, str):
        return None
    return None if is_library_file(file) else file


def lazy_names(t: type) -> frozenset[str]:
    """The attributes instances of ``t`` build on first access.

    A ``functools.cached_property`` stores its value under its own name; pandas'
    ``cache_readonly`` stores every value of an object in one dict, ``_cache``
    (a ``DatetimeArray``'s ``_creso``, filled when a model first reads its
    index). A library fills them when first used (``client.chat``, a LangChain
    model's ``_client``, statsmodels fitting on a plain cell's Series),
    wherever that happens: they are a cache, never a change and never part of
    what identifies the object (see :mod:`nbdurable.durable.changes` and
    :mod:`nbdurable.identity.fingerprint`).
    """
    got = _LAZY.get(t)
    if got is None:
        found = set()
        for klass in getattr(t, "__mro__", ()):
            for name, member in vars(klass).items():
                if isinstance(member, functools.cached_property):
                    found.add(name)
                elif _is_pandas_cache(member):
                    found.add("_cache")
        if len(_LAZY) > 10_000:  # classes made in a loop: do not keep them all alive
            _LAZY.clear()
        got = _LAZY[t] = frozenset(found)
    return got


_LAZY: dict[type, frozenset[str]] = {}


def _is_pandas_cache(member: Any) -> bool:
    t = type(member)
    return t.__name__ == "CachedProperty" and t.__module__ == "pandas._libs.properties"


#: Attributes of library objects that are the bookkeeping of the process holding them,
#: not what the object is, by the qualified name of the class that sets them (its
#: subclasses too). matplotlib: a transform's back-pointers to the transforms built on
#: it (``_parents``, keyed by their ``id()`` and holding weak references, so a parent
#: collected or an object loaded in another process changes it) and whether it must be
#: recomputed (``_invalid``); whether an artist must be redrawn (``_stale``) and the
#: callback that tells its container (``stale_callback``, which pickle drops). Drawing
#: a figure, showing it, or loading it back changes them all and nothing it draws.
_BOOKKEEPING: dict[str, frozenset[str]] = {
    "matplotlib.transforms.TransformNode": frozenset({"_parents", "_invalid"}),
    "matplotlib.artist.Artist": frozenset({"_stale", "stale_callback"}),
}
_CACHES: dict[type, frozenset[str]] = {}


def cache_names(t: type) -> frozenset[str]:
    """What instances of ``t`` hold that is not their content: :func:`lazy_names` and the
    bookkeeping some libraries keep per process (see ``_BOOKKEEPING``).

    Never part of a fingerprint, never a change (see :mod:`nbdurable.durable.changes`);
    unlike lazy attributes, bookkeeping is pickled as the library pickles it.
    """
    got = _CACHES.get(t)
    if got is None:
        found = set(lazy_names(t))
        for klass in getattr(t, "__mro__", ()):
            qual = f"{getattr(klass, '__module__', '')}.{getattr(klass, '__qualname__', '')}"
            found |= _BOOKKEEPING.get(qual, frozenset())
        if len(_CACHES) > 10_000:  # classes made in a loop: do not keep them all alive
            _CACHES.clear()
        got = _CACHES[t] = frozenset(found)
    return got


def without_lazy(t: type, state: Any) -> Any:
    """A library object's pickle state without what it builds on first use (see
    :func:`lazy_names`): it is saved as it was before (the client is made again
    on next use, where a made one may hold a lock).

    The state is the instance's ``__dict__``, pydantic's dict holding
    ``__dict__``, or a tuple holding one of these (a ``(__dict__, slots)``
    pair; pandas' ``(dtype, ndarray, __dict__)``).
    """
    return _without(lazy_names(t), state)


def without_caches(t: type, state: Any) -> Any:
    """A library object's pickle state without :func:`cache_names`, for its fingerprint:
    a model whose client was made by its first call is the model it was, and so is a
    figure drawn since, or loaded back in another process.
    """
    return _without(cache_names(t), state)


def _without(drop: frozenset[str], state: Any) -> Any:
    if not drop:
        return state
    if type(state) is tuple:  # (__dict__, slots); pandas' (dtype, ndarray, __dict__)
        return tuple(_without(drop, x) if type(x) is dict else x for x in state)
    if type(state) is not dict:
        return state
    inner = state.get("__dict__")
    if type(inner) is dict and not drop.isdisjoint(inner):
        state = dict(state, __dict__={k: v for k, v in inner.items() if k not in drop})
    if not drop.isdisjoint(state):
        state = {k: v for k, v in state.items() if k not in drop}
    return state


def reduce_without_lazy(
    obj: Any, protocol: int, reduce: Callable[[Any, int], Any] = reduction.reduce_ex
) -> tuple | None:
    """``reduce(obj, protocol)`` (its ``__reduce_ex__``, taken without changing it) with
    its state :func:`without_lazy`, or None when there is nothing to leave out (no
    lazy attribute filled, or a reduction that is not ``(callable, args, state,
    ...)``). For library objects: a notebook class's own cached properties are its data.
    """
    t = type(obj)
    lazy = lazy_names(t)
    attrs = getattr(obj, "__dict__", None)
    if not lazy or type(attrs) is not dict or lazy.isdisjoint(attrs):
        return None
    reduced = reduce(obj, protocol)
    if type(reduced) is not tuple or len(reduced) < 3:
        return None
    state = reduced[2]
    if type(state) is tuple and state and state[-1] is attrs and lazy.issuperset(attrs):
        # Cython's reduce (pandas' arrays) appends __dict__ only when it is not
        # empty: before first use the state had no such item.
        state = state[:-1]
    return (reduced[0], reduced[1], without_lazy(t, state), *reduced[3:])


def is_local_module_name(name: Any) -> bool:
    """True if ``name`` is ``__main__`` (the notebook) or a loaded local module."""
    if name == "__main__":
        return True
    module = sys.modules.get(name) if isinstance(name, str) else None
    return module is not None and module_file(module) is not None


def is_local_function(fn: types.FunctionType) -> bool:
    """True if the function's code comes from the notebook or a local module.

    Decided by its code's file, and for code that names no real file (a
    function cloudpickle rebuilt by value, such as a library's lambda a
    restored checkpointer holds: ``<dynamic-code>``) by its module: a function
    of a loaded library module is the library's wherever its code was made.
    """
    filename = fn.__code__.co_filename
    if filename.startswith("<") and filename != "<string>":
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if module is not None and getattr(module, "__name__", None) != "__main__":
            return module_file(module) is not None
    return not is_library_file(filename)


_FILE_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}
_RACY_NS = 2_000_000_000


def file_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes, cached while its inode, size and mtime stay.

    Only files already older than two seconds when hashed are cached: file
    times tick coarsely (a few ms), so an edit right after hashing could keep
    the same mtime and size (git calls this the racy-clean problem). A file
    that cannot be read gives ``"unreadable: <error class>"``, so deleting a
    module's file is a change, never an exception.
    """
    try:
        st = os.stat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        cached = _FILE_DIGESTS.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()  # module sources are small
    except OSError as exc:
        return f"unreadable: {type(exc).__name__}"
    if time.time_ns() - st.st_mtime_ns > _RACY_NS:
        _FILE_DIGESTS[path] = (stamp, digest)
    return digest


_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})


@functools.lru_cache(maxsize=4096)
def names_read(code: types.CodeType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(globals, names)`` read by ``code`` and every code object nested in it.

    ``globals``: the names its bytecode loads as globals (``LOAD_GLOBAL``,
    and ``LOAD_NAME`` in class bodies), so ``self.model`` does not make a
    global ``model`` an input. ``names``: all of ``co_names``, attribute
    names included: what may be read from a module (``helpers.SCALE``). Both sorted.
    """
    globals_: set[str] = set()
    names: set[str] = set()
    todo = [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        globals_.update(i.argval for i in dis.get_instructions(c) if i.opname in _GLOBAL_LOADS)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return tuple(sorted(globals_)), tuple(sorted(names))


def local_module_files(names: Iterable[str]) -> list[str]:
    """The source files of the loaded local modules among ``names``, and of those they use.

    A module uses another local module when its source imports it (``import
    helpers2``, ``from helpers2 import VALUE``, relative imports in a
    package), or its namespace holds it or a function or class defined
    there. Names not loaded (a failed import) or not local are skipped.
    Sorted, each file once; cycles end.
    """
    todo = [sys.modules.get(n) for n in names]
    seen: set[int] = set()
    files: set[str] = set()
    while todo:
        module = todo.pop()
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        file = module_file(module) if isinstance(module, types.ModuleType) else None
        if file is None:
            continue
        files.add(os.path.abspath(file))
        namespace = vars(module)
        package = namespace.get("__package__")
        todo.extend(
            map(sys.modules.get, _imports_of(file, package if isinstance(package, str) else ""))
        )
        for value in list(namespace.values()):
            if isinstance(value, types.ModuleType):
                todo.append(value)
            elif isinstance(value, (types.FunctionType, type)):
                owner = getattr(value, "__module__", None)
                if isinstance(owner, str) and owner != namespace["__name__"]:
                    todo.append(sys.modules.get(owner))
    return sorted(files)


def _imports_of(path: str, package: str) -> frozenset[str]:
    """The modules a source file imports (see :func:`analysis.imported_modules`); cached."""
    try:
        st = os.stat(path)
    except OSError:
        return frozenset()
    return _imports_cached(path, st.st_mtime_ns, st.st_size, package)


@functools.lru_cache(maxsize=1024)
def _imports_cached(path: str, _mtime: int, _size: int, package: str) -> frozenset[str]:
    try:
        with open(path, "rb") as fh:
            source = fh.read().decode("utf-8", "replace")
    except OSError:
        return frozenset()
    return analysis.imported_modules(source, package)


def notebook_function_key(fn: Any, _seen: frozenset[int] = frozenset()) -> str | None:
    """:func:`~nbdurable.identity.analysis.def_key` of a function a notebook cell
    defined, from its source and the globals it reads now; None for any other value,
    or where a global it reads is not a library's name, a literal or such a function
    (a client, a list: only the kernel knows what those hold).

    What a record keeps of such an input (``StepRecord.plain``), so that a view
    with no kernel, finding the same ``def`` in the saved plain cells, knows the
    next Run All binds the same function.
    """
    import ast
    import inspect
    import textwrap

    if not isinstance(fn, types.FunctionType) or getattr(fn, "__module__", None) != "__main__":
        return None
    if id(fn) in _seen or fn.__closure__ or not is_local_function(fn):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    node = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name != fn.__name__:
        return None  # a wrapper a decorator made, a lambda: not the def the cell shows
    scope = fn.__globals__

    def resolve(name: str) -> str | None:
        if name not in scope:
            return "lib"  # a builtin, or bound by no cell: a Run All binds the same
        value = scope[name]
        if is_library_name(value):
            return "lib"
        literal = analysis.literal_key(value)
        if literal is not None:
            return literal
        return notebook_function_key(value, _seen | {id(fn)})

    return analysis.def_key(node, resolve)
