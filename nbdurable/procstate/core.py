"""Snapshot, delta and re-apply of process state; the table in :mod:`nbdurable.procstate`."""

from __future__ import annotations

import functools
import importlib
import json
import os
import random
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import redact
from ..identity import localcode
from . import sqlite
from .modules import (
    apply_module,
    check_fresh,
    modules_delta,
    user_modules,
    watched,
)
from .plain import ABSENT, NotPlain, decode, encode


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
    #: (module name, attribute) -> the object (or ABSENT) for watched attributes
    watched: dict[tuple[str, str], Any]
    watch: tuple[tuple[str, str], ...] = ()
    recursionlimit: int = 0
    decimal: dict[str, Any] | None = None  # None: decimal not imported
    #: the threads alive (see :func:`_threads_left`)
    threads: tuple[threading.Thread, ...] = ()
    #: writes so far per in-memory SQLite connection alive (see :mod:`.sqlite`)
    sqlite: dict[int, int] = field(default_factory=dict)
    #: writes so far per SQLite database file (see :mod:`.sqlite`)
    sqlite_files: dict[str, int] = field(default_factory=dict)
    #: the backend pyplot has loaded (None: none yet, or pyplot not imported)
    mplbackend: str | None = None


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
            np_random = ABSENT
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
        modules=user_modules(),
        watched=watched(namespace, watch),
        watch=watch,
        recursionlimit=sys.getrecursionlimit(),
        decimal=_decimal_context(),
        threads=tuple(threading.enumerate()),
        sqlite=sqlite.counts(),
        sqlite_files=sqlite.file_counts(),
        mplbackend=_pyplot_backend(),
    )


def _threads_left(before: Snapshot, after: Snapshot) -> list[str]:
    """The threads of the user's code started between the snapshots and still running.

    A replay cannot start them again (a poller, a watcher the step left
    behind): the step's body must run. Only threads running the user's code
    (a notebook or local-module function as the target, or a ``Thread``
    subclass of the user's) count; a library's own workers (a thread pool's,
    a client's) are its business, as its other insides are.
    """
    known = {id(t) for t in before.threads}
    out = []
    for thread in after.threads:
        if id(thread) in known or not thread.is_alive():
            continue
        target = getattr(thread, "_target", None) or getattr(thread, "function", None)
        mine = isinstance(target, types.FunctionType) and localcode.is_local_function(target)
        kind = type(thread)
        if not mine and kind.run is not threading.Thread.run:
            mine = localcode.is_local_module_name(kind.__module__)
        if mine:
            out.append(thread.name)
    return out


#: The settings of a decimal context, each an int, or a str for ``rounding``.
_DECIMAL_FIELDS = ("prec", "rounding", "Emin", "Emax", "capitals", "clamp")


def _decimal_context() -> dict[str, Any] | None:
    """The current thread's decimal context as plain data (its settings, flags and traps)."""
    dec = sys.modules.get("decimal")
    if dec is None:
        return None
    ctx = dec.getcontext()
    out: dict[str, Any] = {f: getattr(ctx, f) for f in _DECIMAL_FIELDS}
    # A signal's name, for the classes decimal itself exports (all of them).
    out["flags"] = sorted(sig.__name__ for sig, on in ctx.flags.items() if on)
    out["traps"] = sorted(sig.__name__ for sig, on in ctx.traps.items() if on)
    return out


def _apply_decimal(change: Mapping[str, Any]) -> None:
    dec = importlib.import_module("decimal")
    ctx = dec.getcontext()
    for field_ in _DECIMAL_FIELDS:
        if field_ in change:
            setattr(ctx, field_, change[field_])
    for part, table in (("flags", ctx.flags), ("traps", ctx.traps)):
        if part in change:
            on = set(change[part])
            for sig in list(table):
                table[sig] = sig.__name__ in on


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
            node = node.get(part, ABSENT) if isinstance(node, dict) else ABSENT
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


def _pyplot_backend() -> str | None:
    """The backend pyplot has loaded, by name; None if it has loaded none yet.

    pyplot loads its backend on first use (the first figure), not on import, and
    loading it changes the process: IPython's inline backend registers the PNG
    formatter every later figure is displayed with, and its after-cell hook.
    """
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None or getattr(pyplot, "_backend_mod", None) is None:
        return None
    name = dict.get(sys.modules["matplotlib"].rcParams, "backend")  # unresolved: no side effect
    return name if isinstance(name, str) else None


def _load_pyplot_backend(pyplot: Any, name: str) -> None:
    if getattr(pyplot, "_backend_mod", None) is None:  # (one the plain cells loaded stays)
        pyplot.switch_backend(name)


def _numpy_print_defaults() -> dict[str, Any] | None:
    mod = sys.modules.get("numpy._core.printoptions")
    defaults = getattr(mod, "default_format_options_dict", None)
    if not isinstance(defaults, dict):
        return None
    out = dict(defaults)
    if out.get("legacy") == sys.maxsize:  # stored as an int, shown as False
        out["legacy"] = False
    return out


def delta(
    before: Snapshot, after: Snapshot, secrets: Mapping[str, bytes] | None = None
) -> dict[str, Any]:
    """What changed from ``before`` to ``after``, as plain JSON-safe data ({} if nothing).

    ``secrets`` (see :func:`nbdurable.redact.secrets_in_env`) are never
    written: a part holding one is replaced by an ``unreplayable`` reason.
    """
    out: dict[str, Any] = {}
    why: list[str] = []
    _env_delta(before.environ, after.environ, secrets, out, why)
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
    if before.mplbackend is None and after.mplbackend is not None:
        out["mplbackend"] = after.mplbackend
    if after.recursionlimit != before.recursionlimit:
        out["recursionlimit"] = after.recursionlimit
    if after.decimal is not None and after.decimal != before.decimal:
        base = before.decimal or {}
        out["decimal"] = {k: v for k, v in after.decimal.items() if base.get(k) != v}
    modules_delta(before, after, out, why)
    left = _threads_left(before, after)
    if left:
        why.append(f"it left {_said_threads(left)} running, which a replay cannot start again")
    if sqlite.written(before.sqlite, after.sqlite):
        why.append("it wrote to an in-memory SQLite database, whose rows a replay cannot restore")
    files = sqlite.files_written(before.sqlite_files, after.sqlite_files)
    if files:  # kept there: re-applying it does nothing (see nbdurable.dbwrites)
        out["dbfiles"] = files
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


def _said_threads(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"thread{'s' if len(names) > 1 else ''} {shown}{more}"


def replayable_reasons(process: Mapping[str, Any] | None) -> list[str]:
    """Why a recorded delta cannot be re-applied ([] when it can)."""
    return list((process or {}).get("unreplayable", ()))


def _text(v: Any) -> str:
    return v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v


def _env_delta(
    before: dict, after: dict, secrets: Mapping[str, bytes] | None, out: dict, why: list[str]
) -> None:
    if before == after:
        return
    set_ = {_text(k): _text(v) for k, v in after.items() if before.get(k) != v}
    unset = sorted(_text(k) for k in before if k not in after)
    for name in sorted(redact.secrets_in_env(set_)):
        del set_[name]
        why.append(f"environment variable ${name} looks secret (not written)")
    for name in sorted(set_):
        held = redact.find_secrets(set_[name], dict(secrets or {}))
        if held:  # `os.environ["X"] = os.environ["API_KEY"]`
            del set_[name]
            why.append(f"environment variable ${name} holds the value of ${', $'.join(held)}")
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
    if after is None or after is ABSENT:
        if after is ABSENT and before is not ABSENT:
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
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pd.get_option(key)  # an option this pandas does not have raises here
            quiet.append(functools.partial(pd.set_option, key, decode(value)))
    if "rcparams" in process:
        mpl = importlib.import_module("matplotlib")
        for key, value in process["rcparams"].items():
            if key not in mpl.rcParams:
                raise KeyError(f"matplotlib has no rcParams[{key!r}]")
            quiet.append(functools.partial(mpl.rcParams.__setitem__, key, decode(value)))
    if "mplbackend" in process:
        pyplot = importlib.import_module("matplotlib.pyplot")
        quiet.append(functools.partial(_load_pyplot_backend, pyplot, str(process["mplbackend"])))
    if "recursionlimit" in process:
        limit = int(process["recursionlimit"])
        quiet.append(lambda: sys.setrecursionlimit(limit))
    if "decimal" in process:
        change = process["decimal"]
        dec = importlib.import_module("decimal")
        for name in (*change.get("flags", ()), *change.get("traps", ())):
            if not isinstance(getattr(dec, name, None), type):
                raise LookupError(f"decimal has no signal {name}")
        quiet.append(lambda: _apply_decimal(change))
    for name, change in (process.get("modules") or {}).items():
        mod = sys.modules.get(name) or importlib.import_module(name)
        check_fresh(name, mod, change.get("fresh", {}))
        quiet.append(lambda m=mod, c=change: apply_module(m, c))
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
