"""Turning a finished step's variables and outputs into what the store keeps.

Each variable is pickled and stored once by content (a blob, see
:mod:`nbdurable.blobs`); modules are
kept by name; a value that cannot be pickled, or that holds a secret from
the environment, is kept as *unsaved* with the reason, never silently
dropped. Outputs and the source are scrubbed of secrets before they are
written. Everything that was not written is returned for one loud warning.

A value that pickles but would not load back on replay (see
:func:`values.restore_problem`) is kept as *unsaved* too, so the step is
marked not replayable when it is recorded, not found out at every replay.

nbdurable holds user objects no longer than a plain run would: what it must
remember about them between cells (:class:`Origins`) and during a step
(:class:`Snapshot`) it holds through weak references, so ``del x`` and
``gc.collect()`` free a recorded array, and fire its finalizers, exactly when
they would without nbdurable. Between cells, plain data (lists and dicts of
numbers and strings) is remembered by ``id()`` only. What is left, objects
that cannot be weakly referenced and hold other objects (a list of model
responses), is held while the name that bound it still does, and dropped at
the end of the cell that unbinds it (:meth:`Origins.prune`); during a step,
the step's :class:`Snapshot` holds such objects until the step ends.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import config, faults, redact
from ..store import Store, blobs, values
from ..store.records import VarRecord


@dataclass
class Saved:
    """What :func:`save_variables` wrote, and what it could not."""

    variables: list[VarRecord] = field(default_factory=list)
    #: name -> (value, blob sha, plain data?), for Origins
    origins: dict[str, tuple[Any, str, bool]] = field(default_factory=dict)
    unsaved: list[str] = field(default_factory=list)  # "name (why)" for the warning
    secrets: list[str] = field(default_factory=list)  # "name ($VAR)" for the warning
    large: list[str] = field(default_factory=list)  # "name (123.4 MB)" for the warning
    #: small blobs to write in the step record's transaction (see Store.put_blob's defer)
    pending: dict[str, bytes] = field(default_factory=dict)
    unsaved_names: list[str] = field(default_factory=list)  # the names of ``unsaved``

    def drop_unsaved(self, names: set[str]) -> None:
        """Leave out of the record the variables of ``names`` that could not be saved."""
        gone = {n for n in self.unsaved_names if n in names}
        if not gone:
            return
        self.variables = [v for v in self.variables if not (v.kind == "unsaved" and v.name in gone)]
        kept = [
            (u, n) for u, n in zip(self.unsaved, self.unsaved_names, strict=True) if n not in gone
        ]
        self.unsaved = [u for u, _ in kept]
        self.unsaved_names = [n for _, n in kept]

    def unsaved_beyond(self, known: frozenset[str]) -> list[str]:
        """The ``unsaved`` entries of names not in ``known``."""
        return [u for u, n in zip(self.unsaved, self.unsaved_names, strict=True) if n not in known]


def save_variables(
    store: Store,
    ns: dict[str, Any],
    names: list[str],
    imported: set[str],
    fingerprint: Callable[[Any, str], str],
    secrets: dict[str, bytes],
    unloadable: Mapping[str, str] | None = None,
) -> Saved:
    """Write a blob per variable of ``names`` (once by content); return the records.

    ``names`` are the names the step bound or changed: a value that refers to
    one of them by name (``__main__.f``) cannot be restored (see
    :func:`values.restore_problem`). ``unloadable`` maps names whose recorded
    value failed to load on this kernel's replay to the reason: they are kept
    unsaved without a second try (what failed there, a module missing from a
    fresh kernel, would load here and fail again there).
    """
    out = Saved()
    limit = config.get().warn_size_mb * 1024 * 1024
    for name in names:
        value = ns[name]
        tname = values.type_name(value)
        if unloadable and name in unloadable:
            _unsaved(out, name, tname, unloadable[name], fingerprint(value, name))
            continue
        if values.is_module(value):
            ref = values.module_ref(value, imported)
            out.variables.append(VarRecord(name, "module", ref, fingerprint(value, name)))
            continue
        try:
            pickled = values.dump_value(value)
        except values.Unsaveable as exc:
            _unsaved(out, name, tname, str(exc), fingerprint(value, name))
            continue
        problem = values.restore_problem(pickled, names, ns)
        if problem is not None:
            _unsaved(out, name, tname, problem, fingerprint(value, name))
            continue
        stream, buffers = pickled.stream, pickled.buffers
        size = len(stream) + sum(b.nbytes for b in buffers)
        try:
            # Searched for secrets in the very copy that is hashed and written.
            sha, _written = store.put_blob(stream, buffers, defer=out.pending, secrets=secrets)
        except blobs.SecretFound as exc:
            out.secrets.append(f"{name} ({redact.said(exc.names)})")
            why = "holds " + redact.said(exc.names)
            out.variables.append(
                VarRecord(name, "unsaved", why, fingerprint(value, name), 0, tname)
            )
            continue
        if size > limit:
            out.large.append(f"{name} ({size / 1e6:.1f} MB)")
        faults.point("blob-written")
        out.origins[name] = (value, sha, pickled.plain)
        # A saved value's fingerprint is its blob's SHA-256 (already computed:
        # a second pass over a 100 MB array would cost as much as writing it).
        out.variables.append(VarRecord(name, "value", sha, "blob:" + sha[:32], size, tname))
    return out


def _unsaved(out: Saved, name: str, tname: str, why: str, fp: str) -> None:
    out.unsaved.append(f"{name} ({tname}: {why})")
    out.unsaved_names.append(name)
    out.variables.append(VarRecord(name, "unsaved", why[:200], fp, 0, tname))


def unsaved_names(variables: Iterable[VarRecord]) -> frozenset[str]:
    """Names a record kept as unsaved (what made it not replayable)."""
    return frozenset(v.name for v in variables if v.kind == "unsaved")


class _Held:
    """A strong reference with the call interface of ``weakref.ref``."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self) -> Any:
        return self.obj


def _ref(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj``, or a strong one if it cannot be weakly referenced."""
    try:
        return weakref.ref(obj)
    except TypeError:  # list, dict, tuple, int, str, bytes, ...
        return _Held(obj)


class _Id:
    """Only the ``id()`` of an object of plain data (see :meth:`Origins.__setitem__`)."""

    __slots__ = ("id",)

    def __init__(self, obj: Any) -> None:
        self.id = id(obj)


class Origins:
    """For each name: the object a step recorded or restored under it, and its blob's sha.

    Used to tell one recording of a value from another when its fingerprint
    sees it only by type (see ``Session._input_fp``, which mixes the sha
    into the fingerprint of the very object recorded). Nothing here keeps a
    value alive that a plain run would free:

    * an object that can be weakly referenced (arrays, DataFrames, instances)
      is held weakly; a weak reference never revives, so a later object that
      happens to get the same ``id()`` is never mistaken for it;
    * plain data (``pure``: builtin containers of builtin scalars, see
      :func:`values.dump_value`) is remembered by ``id()`` alone. Its
      fingerprint sees all of its content, so even if a later object reuses
      that id, the fingerprint mixed with the sha still equals the recorded
      one only for equal content;
    * anything else (a list holding objects seen by type only) is held
      strongly, but only while its name still binds it: :meth:`prune` runs
      before every step and after every cell.
    """

    def __init__(self) -> None:
        self._map: dict[str, tuple[Any, str]] = {}

    def __setitem__(self, name: str, origin: tuple[Any, ...]) -> None:
        """``origins[name] = (object, sha)`` or ``(object, sha, pure)``."""
        obj, sha = origin[0], origin[1]
        pure = len(origin) > 2 and origin[2]
        self._map[name] = (_Id(obj) if pure else _ref(obj), sha)

    def sha_for(self, name: str, value: Any) -> str | None:
        """The blob sha recorded under ``name`` if ``value`` is that very object, else None."""
        entry = self._map.get(name)
        if entry is None:
            return None
        if _same(entry[0], value):
            return entry[1]
        if isinstance(entry[0], weakref.ref) and entry[0]() is None:
            del self._map[name]
        return None

    def pop(self, name: str, default: Any = None) -> Any:
        """Forget ``name``; its sha (or ``default``)."""
        entry = self._map.pop(name, None)
        return default if entry is None else entry[1]

    def update(self, origins: Mapping[str, tuple[Any, ...]]) -> None:
        """Add every ``name -> (object, sha[, pure])`` of ``origins``."""
        for name, origin in origins.items():
            self[name] = origin

    def clear(self) -> None:
        """Forget everything."""
        self._map.clear()

    def prune(self, ns: Mapping[str, Any]) -> None:
        """Forget every name that ``ns`` no longer binds to its object (dropping strong refs)."""
        for name, (handle, _sha) in list(self._map.items()):
            if name not in ns or not _same(handle, ns[name]):
                del self._map[name]

    def __len__(self) -> int:
        return len(self._map)


def _same(handle: Any, value: Any) -> bool:
    if isinstance(handle, _Id):
        return handle.id == id(value)
    obj = handle()
    return obj is value and (obj is not None or isinstance(handle, _Held))


class Snapshot(Mapping[str, Any]):
    """What a namespace bound when a step started, for telling what the step changed.

    ``snapshot[name]`` is the object ``name`` was bound to, or None if that
    object has been freed since (so it is not the object bound now). Held
    weakly where possible, so a step that drops a value an earlier cell made
    frees it at once, as a plain run does.
    """

    def __init__(self, ns: Mapping[str, Any]) -> None:
        self._refs = {name: _ref(value) for name, value in ns.items()}

    def __getitem__(self, name: str) -> Any:
        return self._refs[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)


def scrub_outputs(
    outputs: list[dict[str, Any]], secrets: dict[str, bytes]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Outputs with secrets replaced, and the names found (see :func:`nbdurable.redact.said`).

    An environment secret becomes ``[redacted $NAME]``, a well-known key
    ``[redacted openai key]``.
    """
    found: set[str] = set()

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            text, names = redact.redact_text(value, secrets)
            text, kinds = redact.redact_keys(text)
            found.update(names)
            found.update(f"{kind} key" for kind in kinds)
            return text
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        return value

    return [scrub(o) for o in outputs], sorted(found)
