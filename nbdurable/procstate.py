"""Process state a step changes besides its variables: recorded as a delta, re-applied on replay.

A plain run of a cell that calls ``np.random.seed(0)``, ``os.chdir(..)`` or
``helpers.REGISTRY.append(..)`` leaves the process different for every later
cell. Replaying the cell's variables alone would not, so around each step:

1. :func:`snapshot` takes a cheap copy of well-known process state before
   the body runs and again after it;
2. :func:`delta` turns the two into plain data (JSON-safe: no user objects,
   nothing that needs unpickling), kept in the step's record;
3. :func:`apply` re-applies it when the step is replayed, so later plain
   cells see the process exactly as after a plain run.

What is tracked, and how each part of a delta is re-applied:

===============  ===================================  =====================================
part             seen as                              re-applied as
===============  ===================================  =====================================
``env``          variables set / unset                ``os.environ`` set / unset
``cwd``          the new working directory            ``os.chdir``
``path``         entries added in front / at the      the same insertions, or the whole
                 back of ``sys.path``, else the list  list when entries were reordered
``random``       ``random.getstate()`` if changed     ``random.setstate``
``numpy_random`` NumPy's global (legacy) generator    ``np.random.set_state``
``warnings``     filters added in front / at the      ``warnings``' own add-filter rule,
                 back, else the whole list            or the whole list
``printoptions`` changed ``np.get_printoptions()``    ``np.set_printoptions``
``pandas``       changed pandas options               ``pd.set_option``
``rcparams``     changed matplotlib ``rcParams``      ``matplotlib.rcParams[k] = v``
``modules``      module-level data of user modules    set, or updated in place (a list
                 (files outside the stdlib and        stays the same list), or deleted
                 site-packages) and attributes the
                 step's source assigns on modules
===============  ===================================  =====================================

A module (NumPy, pandas, matplotlib) is looked at only if already imported:
nothing here imports a heavy module to take a snapshot, and :func:`apply`
imports one only when the delta holds something for it. A module imported
by the step itself is compared with its defaults.

Anything that cannot be described as plain data (a ``float_format``
callable, a warnings category defined in the notebook, a function
monkeypatched onto a module, a module attribute holding an object) is
listed under ``unreplayable`` with the reason: such a step is not replayed,
its body runs again. So is a changed environment variable whose name looks
secret (see :mod:`nbdurable.redact`): it is never written.

Not tracked: other modules' state not named above (a library's internal
cache, a logging configuration), attributes of classes and objects held by
user modules changed in place, and monkeypatches done other than by an
attribute assignment in the step's own source (``setattr(mod, ..)`` with a
literal name counts).
"""

from __future__ import annotations

import ast
import base64
import functools
import importlib
import json
import math
import os
import random
import re
import site
import sys
import sysconfig
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import redact
from .fingerprint import fingerprint

#: A recorded value larger than this (as JSON) is not kept; the step reruns instead.
MAX_VALUE_CHARS = 1_000_000

_ABSENT = object()  # an attribute or option that does not exist


class NotPlain(Exception):
    """A value cannot be described as plain data; the message says why."""


# -- plain data ------------------------------------------------------------------------


def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON-safe data that :func:`decode` turns back into an equal value.

    Exact types only: ``None``, ``bool``, ``int``, ``float``, ``complex``,
    ``str``, ``bytes``, and ``list``/``tuple``/``dict``/``set``/``frozenset``
    of those. A subclass (an ``OrderedDict``, a named tuple, an enum) raises
    :class:`NotPlain`: it would not come back as itself. Every JSON object in
    the result is a tag (``{"tuple": [...]}``), so lists and tags never mix up.
    """
    if _depth > 100:
        raise NotPlain("nested too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is list:
        return [encode(v, _depth + 1) for v in value]
    if t is tuple or t is set or t is frozenset:
        return {t.__name__: [encode(v, _depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": base64.b64encode(value).decode("ascii")}
    if t is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    if t.__name__ == "Cycler" and t.__module__.startswith("cycler"):
        # matplotlib's axes.prop_cycle: rcParams accepts (and validates) its repr.
        return {"cycler": repr(value)}
    raise NotPlain(f"holds a {t.__module__}.{t.__qualname__}")


def decode(data: Any) -> Any:
    """The value :func:`encode` described."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, body),) = data.items()
    if tag == "tuple":
        return tuple(decode(v) for v in body)
    if tag == "set":
        return {decode(v) for v in body}
    if tag == "frozenset":
        return frozenset(decode(v) for v in body)
    if tag == "dict":
        return {decode(k): decode(v) for k, v in body}
    if tag == "float":
        return float(body)
    if tag == "bytes":
        return base64.b64decode(body)
    if tag == "complex":
        return complex(decode(body[0]), decode(body[1]))
    if tag == "cycler":
        return body  # a string: matplotlib's rcParams validator builds the Cycler
    raise ValueError(f"unknown tag {tag!r} in recorded process state")


# -- which modules are the user's ----------------------------------------------------


def _library_dirs() -> tuple[str, ...]:
    dirs = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_path = sysconfig.get_paths().get(name)
        if with_path:
            dirs.add(with_path)
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # a virtualenv's old site.py lacks them
        pass
    dirs.add(os.path.dirname(os.__file__))  # the stdlib, wherever it is
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs if d)


_LIBRARY_DIRS = _library_dirs()
_user: dict[str, tuple[Any, bool]] = {}  # module name -> (the module, is a user module)


def is_user_module(name: str, module: Any) -> bool:
    """True for a module of the user's own files: not the stdlib, site-packages or nbdurable."""
    known = _user.get(name)
    if known is not None and known[0] is module:  # asked around every step: kept
        return known[1]
    file = getattr(module, "__file__", None)
    mine = (
        isinstance(file, str)
        and name != "__main__"
        and name.split(".")[0] != "nbdurable"
        and file.endswith(".py")
        and not os.path.abspath(file).startswith(_LIBRARY_DIRS)
        and "site-packages" not in file
        and "dist-packages" not in file
    )
    _user[name] = (module, mine)
    return mine


# -- snapshot ------------------------------------------------------------------------


@dataclass
class Snapshot:
    """Process state at one moment; compare two with :func:`delta`. Never stored."""

    environ: dict[Any, Any]
    cwd: str | None
    path: list[str]
    random: Any
    numpy_random: Any  # None: NumPy not imported
    warnings: list[Any]
    printoptions: dict[str, Any] | None
    pandas: dict[str, Any] | None
    rcparams: dict[str, Any] | None
    #: module name -> attribute -> (the object, its content fingerprint or None)
    modules: dict[str, dict[str, tuple[Any, str | None]]]
    #: (module name, attribute) -> the object (or _ABSENT) for watched attributes
    watched: dict[tuple[str, str], Any]
    watch: tuple[tuple[str, str], ...] = ()


def snapshot(
    namespace: Mapping[str, Any] | None = None, watch: Iterable[tuple[str, str]] = ()
) -> Snapshot:
    """The process state now (see the module docstring for what is in it).

    ``watch`` holds ``(dotted name, attribute)`` pairs (see
    :func:`assigned_attributes`); a dotted name that resolves in
    ``namespace`` to a module has that attribute watched for rebinding.
    """
    watch = tuple(watch)
    raw_env = getattr(os.environ, "_data", None)
    env = dict(raw_env) if raw_env is not None else dict(os.environ)
    try:
        cwd: str | None = os.getcwd()
    except OSError:  # the directory was deleted under us
        cwd = None
    np = sys.modules.get("numpy")
    np_random = np_print = None
    if np is not None and hasattr(np, "random") and hasattr(np, "get_printoptions"):
        try:
            np_random = np.random.get_state()
        except Exception:  # a replaced global generator; see delta
            np_random = _ABSENT
        np_print = np.get_printoptions()
    return Snapshot(
        environ=env,
        cwd=cwd,
        path=list(sys.path),
        random=random.getstate(),
        numpy_random=np_random,
        warnings=list(warnings.filters),
        printoptions=np_print,
        pandas=_pandas_options(),
        rcparams=_rcparams(),
        modules=_user_modules(),
        watched=_watched(namespace, watch),
        watch=watch,
    )


def _pandas_options() -> dict[str, Any] | None:
    cf = sys.modules.get("pandas._config.config")
    if cf is None or "pandas" not in sys.modules:
        return None
    # Read the registered options straight from pandas' store: pd.get_option
    # costs more, and warns for deprecated keys.
    out = {}
    root = cf._global_config
    for key in cf._registered_options:
        node = root
        for part in key.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        out[key] = node
    return out


def _pandas_defaults() -> dict[str, Any]:
    cf = sys.modules["pandas._config.config"]
    return {k: o.defval for k, o in cf._registered_options.items()}


def _rcparams() -> dict[str, Any] | None:
    mpl = sys.modules.get("matplotlib")
    rc = getattr(mpl, "rcParams", None)
    if rc is None:
        return None
    # dict's own items: RcParams.__getitem__ resolves the backend and warns on
    # deprecated keys. Lists are copied so that an in-place change is seen.
    return {k: (v.copy() if type(v) is list else v) for k, v in dict.items(rc)}


def _numpy_print_defaults() -> dict[str, Any] | None:
    mod = sys.modules.get("numpy._core.printoptions")
    defaults = getattr(mod, "default_format_options_dict", None)
    if not isinstance(defaults, dict):
        return None
    out = dict(defaults)
    if out.get("legacy") == sys.maxsize:  # stored as an int, shown as False
        out["legacy"] = False
    return out


_OPAQUE = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)


def _module_state(module: Any) -> dict[str, tuple[Any, str | None]]:
    out = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        fp = None
        if not isinstance(value, _OPAQUE):  # functions and classes: compared by identity
            try:
                fp = fingerprint(value)
            except Exception:  # an object whose fingerprint hook fails: identity only
                fp = None
        out[name] = (value, fp)
    return out


def _user_modules() -> dict[str, dict[str, tuple[Any, str | None]]]:
    cache = _user
    out = {}
    for name, mod in list(sys.modules.items()):
        known = cache.get(name)
        mine = known[1] if known is not None and known[0] is mod else is_user_module(name, mod)
        if mine:
            out[name] = _module_state(mod)
    return out


def _resolve(namespace: Mapping[str, Any], dotted: str) -> Any:
    first, *rest = dotted.split(".")
    obj = namespace.get(first, _ABSENT)
    for part in rest:
        obj = getattr(obj, part, _ABSENT)
    return obj


def _watched(
    namespace: Mapping[str, Any] | None, watch: tuple[tuple[str, str], ...]
) -> dict[tuple[str, str], Any]:
    out: dict[tuple[str, str], Any] = {}
    if namespace is None:
        return out
    for dotted, attr in watch:
        mod = _resolve(namespace, dotted)
        if isinstance(mod, types.ModuleType):
            out[(mod.__name__, attr)] = getattr(mod, attr, _ABSENT)
    return out


def assigned_attributes(source: str) -> list[tuple[str, str]]:
    """``(dotted name, attribute)`` for each ``a.b.attr = ..`` (or ``del``, ``+=``) in ``source``.

    Also ``setattr(a.b, "attr", ..)`` / ``delattr`` with a literal name.
    Whether ``a.b`` is a module is decided by :func:`snapshot`.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = compile(
                source, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            )
    except (SyntaxError, ValueError):
        return []
    found = set()
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            base = _dotted(node.args[0])
            if base:
                found.add((base, node.args[1].value))
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Attribute):
                base = _dotted(t.value)
                if base:
                    found.add((base, t.attr))
    return sorted(found)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


# -- delta ---------------------------------------------------------------------------


def delta(
    before: Snapshot, after: Snapshot, secrets: Mapping[str, bytes] | None = None
) -> dict[str, Any]:
    """What changed from ``before`` to ``after``, as plain JSON-safe data ({} if nothing).

    ``secrets`` (see :func:`nbdurable.redact.secrets_in_env`) are never
    written: a part holding one is replaced by an ``unreplayable`` reason.
    """
    out: dict[str, Any] = {}
    why: list[str] = []
    _env_delta(before.environ, after.environ, out, why)
    if after.cwd != before.cwd:
        if after.cwd is None:
            why.append("the working directory was deleted")
        else:
            out["cwd"] = after.cwd
    path = _list_delta(before.path, after.path)
    if path is not None:
        out["path"] = path
    if after.random != before.random:
        version, internal, gauss = after.random
        out["random"] = [version, list(internal), gauss]
    _numpy_random_delta(before.numpy_random, after.numpy_random, out, why)
    _warnings_delta(before.warnings, after.warnings, out, why)
    base = before.printoptions
    if base is None and after.printoptions is not None:
        base = _numpy_print_defaults() or {}
    _options_delta("printoptions", "NumPy print option", base, after.printoptions, out, why)
    base = before.pandas
    if base is None and after.pandas is not None:
        base = _pandas_defaults()
    _options_delta("pandas", "pandas option", base, after.pandas, out, why)
    _rcparams_delta(before.rcparams, after.rcparams, out, why)
    _modules_delta(before, after, out, why)
    if secrets:
        for part in [k for k in out if k != "env"]:
            text = json.dumps(out[part], ensure_ascii=False)
            names = redact.find_secrets(text, dict(secrets))
            if names:
                del out[part]
                why.append(f"{part} holds the value of ${', $'.join(names)} (not written)")
    if why:
        out["unreplayable"] = why
    return out


def replayable_reasons(process: Mapping[str, Any] | None) -> list[str]:
    """Why a recorded delta cannot be re-applied ([] when it can)."""
    return list((process or {}).get("unreplayable", ()))


def _text(v: Any) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v


def _env_delta(before: dict, after: dict, out: dict, why: list[str]) -> None:
    if before == after:
        return
    set_ = {_text(k): _text(v) for k, v in after.items() if before.get(k) != v}
    unset = sorted(_text(k) for k in before if k not in after)
    secret = redact.secrets_in_env(set_)
    for name in sorted(secret):
        del set_[name]
        why.append(f"environment variable ${name} looks secret (not written)")
    if set_ or unset:
        out["env"] = {"set": set_, "unset": unset}


def _list_delta(before: list, after: list) -> dict[str, list] | None:
    """Entries added in front / at the back, else the whole new list (None: unchanged)."""
    if before == after:
        return None
    n, m = len(before), len(after)
    if m > n and after[m - n :] == before:
        return {"front": after[: m - n]}
    if m > n and after[:n] == before:
        return {"back": after[n:]}
    return {"replace": list(after)}


def _numpy_random_delta(before: Any, after: Any, out: dict, why: list[str]) -> None:
    if after is None or after is _ABSENT:
        if after is _ABSENT and before is not _ABSENT:
            why.append("NumPy's global generator was replaced by one that cannot be recorded")
        return
    if not isinstance(after, tuple) or len(after) != 5:
        why.append("NumPy's global generator is not MT19937")
        return
    if isinstance(before, tuple) and len(before) == 5 and _same_np_state(before, after):
        return
    name, state, pos, has_gauss, cached = after
    out["numpy_random"] = [name, state.tolist(), int(pos), int(has_gauss), float(cached)]


def _same_np_state(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[2:] == b[2:] and a[1].tobytes() == b[1].tobytes()


def describe_filter(item: tuple) -> list[Any]:
    """A warnings filter as plain data; raises :class:`NotPlain` if it cannot be rebuilt."""
    action, message, category, module, lineno = item

    def pattern(p: Any) -> Any:
        if p is None or type(p) is str:  # a str matches by equality (warnings' C code)
            return p
        if isinstance(p, re.Pattern) and isinstance(p.pattern, str):
            return [p.pattern, p.flags]
        raise NotPlain(f"its pattern is a {type(p).__name__}")

    where, qual = getattr(category, "__module__", None), getattr(category, "__qualname__", "")
    if _find_class(where, qual, import_it=False) is not category:
        raise NotPlain(f"its category {where}.{qual} cannot be found by name")
    return [action, pattern(message), f"{where}:{qual}", pattern(module), lineno]


def _find_class(module: Any, qualname: str, import_it: bool) -> Any:
    if not isinstance(module, str) or module == "__main__" or "<locals>" in qualname:
        return None
    obj = sys.modules.get(module)
    if obj is None and import_it:
        obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _rebuild_filter(plain: list[Any]) -> tuple:
    action, message, category, module, lineno = plain
    where, _, qual = category.partition(":")
    cls = _find_class(where, qual, import_it=True)
    if not (isinstance(cls, type) and issubclass(cls, Warning)):
        raise LookupError(f"warnings category {where}.{qual} is gone")

    def pattern(p: Any) -> Any:
        return re.compile(p[0], p[1]) if isinstance(p, list) else p

    return (action, pattern(message), cls, pattern(module), lineno)


def _warnings_delta(before: list, after: list, out: dict, why: list[str]) -> None:
    change = _list_delta(before, after)
    if change is None:
        return
    ((how, items),) = change.items()
    try:
        out["warnings"] = {how: [describe_filter(f) for f in items]}
    except NotPlain as exc:
        why.append(f"a warnings filter cannot be recorded ({exc})")


def _options_delta(
    part: str, what: str, before: dict | None, after: dict | None, out: dict, why: list[str]
) -> None:
    if after is None or before == after:
        return
    changed = {}
    for key, value in after.items():
        if before is not None and key in before and _same(before[key], value):
            continue
        try:
            changed[key] = encode(value)
        except NotPlain as exc:
            why.append(f"{what} {key!r} {exc}")
    if changed:
        out[part] = changed


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(type(a) is type(b) and a == b)
    except Exception:  # an == that raises (an array): not the same
        return False


def _rcparams_delta(before: dict | None, after: dict | None, out: dict, why: list[str]) -> None:
    if after is None:
        return
    mpl = sys.modules.get("matplotlib")
    base = before
    if base is None:  # imported by the step: compare with what matplotlib read at import
        orig = getattr(mpl, "rcParamsOrig", None)
        base = dict(dict.items(orig)) if orig is not None else {}
    b, a = base.get("backend"), after.get("backend")
    if isinstance(b, str) and isinstance(a, str) and a != b:
        why.append(f"the matplotlib backend was switched to {a!r}")
    after = {k: v for k, v in after.items() if k != "backend"}
    base = {k: v for k, v in base.items() if k != "backend"}
    _options_delta("rcparams", "matplotlib rcParams", base, after, out, why)


def _modules_delta(before: Snapshot, after: Snapshot, out: dict, why: list[str]) -> None:
    changes: dict[str, dict[str, Any]] = {}

    def note(mod: str, kind: str, attr: str, value: Any = None) -> None:
        entry = changes.setdefault(mod, {})
        if kind == "del":
            entry.setdefault("del", []).append(attr)
            return
        if isinstance(value, types.ModuleType):  # `import pkg.sub` binds pkg.sub
            entry.setdefault("import", {})[attr] = value.__name__
            return
        try:
            data = encode(value)
        except NotPlain as exc:
            why.append(f"module {mod} attribute {attr} {exc}")
            return
        if len(json.dumps(data)) > MAX_VALUE_CHARS:
            why.append(f"module {mod} attribute {attr} is too large to record")
            return
        entry.setdefault(kind, {})[attr] = data

    for mod, now in after.modules.items():
        old = before.modules.get(mod)
        if old is None:
            _fresh_module(mod, now, after, changes, why)
            continue
        for attr, (value, fp) in now.items():
            was = old.get(attr)
            if was is None or was[0] is not value:
                note(mod, "set", attr, value)
            elif fp != was[1]:  # the same object, changed in place
                note(mod, "update", attr, value)
        for attr in old:
            if attr not in now:
                note(mod, "del", attr)
    for (mod, attr), value in after.watched.items():
        if mod in after.modules:
            continue  # a user module: compared above, in full
        was = before.watched.get((mod, attr), _ABSENT)
        if was is value:
            continue
        if value is _ABSENT:
            note(mod, "del", attr)
        elif isinstance(value, _OPAQUE) or callable(value):
            why.append(f"module {mod} attribute {attr} was rebound to a {type(value).__name__}")
        else:
            note(mod, "set", attr, value)
    changes = {m: c for m, c in changes.items() if c}
    if changes:
        out["modules"] = changes


def _fresh_module(
    mod: str,
    now: dict[str, tuple[Any, str | None]],
    after: Snapshot,
    changes: dict[str, dict[str, Any]],
    why: list[str],
) -> None:
    """A user module the step imported: what it holds after the step, to check on replay.

    The step may have changed it right after importing it
    (``import helpers; helpers.REGISTRY.append(..)``), and nothing tells
    that apart from what the import itself did. So each data attribute's
    fingerprint is kept, with its value when it is plain data: replay imports
    the module and puts back every value that differs (see :func:`prepare`).
    Functions and classes come back from the import; one the step's source
    rebinds cannot be restored.
    """
    fresh = {}
    for attr, (value, fp) in now.items():
        if isinstance(value, _OPAQUE):
            if (mod, attr) in after.watched:
                why.append(f"module {mod} attribute {attr} was rebound to a {type(value).__name__}")
            continue
        if fp is None:
            continue  # no fingerprint: cannot be compared (see the module docstring)
        try:
            data = encode(value)
            if len(json.dumps(data)) > MAX_VALUE_CHARS:
                data = None
        except NotPlain:
            data = None  # checked on replay; restored only if it is as imported
        fresh[attr] = [fp, data]
    if fresh:
        changes.setdefault(mod, {})["fresh"] = fresh


# -- apply ---------------------------------------------------------------------------


def apply(process: Mapping[str, Any] | None) -> None:
    """Re-apply a recorded :func:`delta` in this process.

    Everything is looked up first (modules imported, warnings categories
    found, the directory checked); if any of it fails, this raises before
    changing anything, so the caller can run the step's body instead.
    Raises ``ValueError`` for a delta with ``unreplayable`` reasons.
    """
    for fn in prepare(process):
        fn()


def prepare(process: Mapping[str, Any] | None) -> list[Callable[[], None]]:
    """The changes :func:`apply` makes, resolved and checked but not yet made."""
    if not process:
        return []
    reasons = replayable_reasons(process)
    if reasons:
        raise ValueError("process state cannot be restored: " + "; ".join(reasons))
    quiet: list[Callable[[], None]] = []  # run with warnings silenced (deprecated options)
    last: list[Callable[[], None]] = []
    env = process.get("env")
    if env:
        quiet.append(lambda: _apply_env(env))
    if "cwd" in process:
        cwd = process["cwd"]
        if not os.path.isdir(cwd):
            raise FileNotFoundError(f"the working directory {cwd} does not exist")
        quiet.append(lambda: os.chdir(cwd))
    if "path" in process:
        change = process["path"]
        quiet.append(lambda: _apply_list(sys.path, change))
    if "random" in process:
        version, internal, gauss = process["random"]
        state = (version, tuple(internal), gauss)
        quiet.append(lambda: random.setstate(state))
    if "numpy_random" in process or "printoptions" in process:
        np = importlib.import_module("numpy")
        if "numpy_random" in process:
            name, keys, pos, has_gauss, cached = process["numpy_random"]
            np_state = (name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached)
            quiet.append(lambda: np.random.set_state(np_state))
        if "printoptions" in process:
            opts = {k: decode(v) for k, v in process["printoptions"].items()}
            quiet.append(lambda: np.set_printoptions(**opts))
    if "pandas" in process:
        pd = importlib.import_module("pandas")
        for key, value in process["pandas"].items():
            quiet.append(functools.partial(pd.set_option, key, decode(value)))
    if "rcparams" in process:
        mpl = importlib.import_module("matplotlib")
        for key, value in process["rcparams"].items():
            quiet.append(functools.partial(mpl.rcParams.__setitem__, key, decode(value)))
    for name, change in (process.get("modules") or {}).items():
        mod = sys.modules.get(name) or importlib.import_module(name)
        _check_fresh(name, mod, change.get("fresh", {}))
        quiet.append(lambda m=mod, c=change: _apply_module(m, c))
    if "warnings" in process:
        ((how, items),) = process["warnings"].items()
        filters = {how: [_rebuild_filter(f) for f in items]}
        # Last and outside catch_warnings, which would put the old list back.
        last.append(lambda: _apply_warnings(filters))

    def silenced() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for fn in quiet:
                fn()

    return [silenced, *last]


def _apply_env(env: Mapping[str, Any]) -> None:
    for k, v in env.get("set", {}).items():
        os.environ[k] = v
    for k in env.get("unset", ()):
        os.environ.pop(k, None)


def _apply_list(target: list, change: Mapping[str, list]) -> None:
    ((how, items),) = change.items()
    if how == "replace":
        target[:] = items
    elif how == "front":
        target[:0] = items
    else:
        target.extend(items)


def _apply_warnings(change: Mapping[str, list]) -> None:
    ((how, items),) = change.items()
    filters = warnings.filters
    if how == "replace":
        filters[:] = items
    elif how == "front":
        # warnings' own rule for a filter added in front: an equal one moves.
        for item in reversed(items):
            if item in filters:
                filters.remove(item)
            filters.insert(0, item)
    else:
        for item in items:
            if item not in filters:
                filters.append(item)
    mutated = getattr(warnings, "_filters_mutated", None) or getattr(
        warnings, "_filters_mutated_lock_held", None
    )
    if mutated is not None:
        mutated()


def _check_fresh(name: str, mod: Any, fresh: Mapping[str, list]) -> None:
    for attr, (fp, data) in fresh.items():
        current = getattr(mod, attr, _ABSENT)
        if data is None and (current is _ABSENT or _fingerprint(current) != fp):
            raise LookupError(
                f"module {name} attribute {attr} is not as the step left it, and cannot be "
                "recorded as plain data"
            )


def _fingerprint(value: Any) -> str | None:
    try:
        return fingerprint(value)
    except Exception:  # a fingerprint hook that fails: never equal
        return None


def _apply_module(mod: Any, change: Mapping[str, Any]) -> None:
    for attr, name in change.get("import", {}).items():
        setattr(mod, attr, importlib.import_module(name))
    for attr, data in change.get("set", {}).items():
        setattr(mod, attr, decode(data))
    updates = dict(change.get("update", {}))
    for attr, (fp, data) in change.get("fresh", {}).items():
        current = getattr(mod, attr, _ABSENT)
        if data is not None and (current is _ABSENT or _fingerprint(current) != fp):
            updates[attr] = data
    for attr, data in updates.items():
        value, current = decode(data), getattr(mod, attr, _ABSENT)
        # The step changed this very object in place; a name imported from the
        # module elsewhere (`from helpers import REGISTRY`) must see it too.
        if type(current) is type(value) and isinstance(value, (list, dict, set)):
            if isinstance(current, list):
                current[:] = value
            else:
                current.clear()
                current.update(value)
        else:
            setattr(mod, attr, value)
    for attr in change.get("del", ()):
        if hasattr(mod, attr):
            delattr(mod, attr)
