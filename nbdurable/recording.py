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
they would without nbdurable. Objects that cannot be weakly referenced
(lists, dicts, tuples, str, bytes, ...) are held strongly, but only while
the name that bound them still does: :meth:`Origins.prune` runs after every
cell.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import blobs, config, faults, redact, values
from .records import VarRecord
from .store import Store


@dataclass
class Saved:
    """What :func:`save_variables` wrote, and what it could not."""

    variables: list[VarRecord] = field(default_factory=list)
    origins: dict[str, tuple[Any, str]] = field(default_factory=dict)  # name -> (value, blob sha)
    unsaved: list[str] = field(default_factory=list)  # "name (why)" for the warning
    secrets: list[str] = field(default_factory=list)  # "name ($VAR)" for the warning
    large: list[str] = field(default_factory=list)  # "name (123.4 MB)" for the warning
    #: small blobs to write in the step record's transaction (see Store.put_blob's defer)
    pending: dict[str, bytes] = field(default_factory=dict)
    unsaved_names: list[str] = field(default_factory=list)  # the names of ``unsaved``

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
) -> Saved:
    """Write a blob per variable of ``names`` (once by content); return the records.

    ``names`` are the names the step bound or changed: a value that refers to
    one of them by name (``__main__.f``) cannot be restored (see
    :func:`values.restore_problem`).
    """
    out = Saved()
    limit = config.get().warn_size_mb * 1024 * 1024
    for name in names:
        value = ns[name]
        tname = values.type_name(value)
        if values.is_module(value):
            ref = values.module_ref(value, imported)
            out.variables.append(VarRecord(name, "module", ref, fingerprint(value, name)))
            continue
        try:
            stream, buffers = values.dumps_parts(value)
        except values.Unsaveable as exc:
            _unsaved(out, name, tname, str(exc), fingerprint(value, name))
            continue
        problem = values.restore_problem(stream, buffers, names, ns)
        if problem is not None:
            _unsaved(out, name, tname, problem, fingerprint(value, name))
            continue
        size = len(stream) + sum(b.nbytes for b in buffers)
        try:
            # Searched for secrets in the very copy that is hashed and written.
            sha, _written = store.put_blob(stream, buffers, defer=out.pending, secrets=secrets)
        except blobs.SecretFound as exc:
            out.secrets.append(f"{name} (${', $'.join(exc.names)})")
            why = "holds the value of $" + ", $".join(exc.names)
            out.variables.append(
                VarRecord(name, "unsaved", why, fingerprint(value, name), 0, tname)
            )
            continue
        if size > limit:
            out.large.append(f"{name} ({size / 1e6:.1f} MB)")
        faults.point("blob-written")
        out.origins[name] = (value, sha)
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


class Origins:
    """For each name: the object a step recorded or restored under it, and its blob's sha.

    Used to tell one recording of a value from another when its fingerprint
    sees it only by type (see ``Session._input_fp``). The objects are held
    weakly (see the module docstring): an entry whose object is gone reads
    as absent, and since a weak reference never revives, an object that
    later happens to get the same ``id()`` cannot be mistaken for it.
    """

    def __init__(self) -> None:
        self._map: dict[str, tuple[Callable[[], Any], str]] = {}

    def __setitem__(self, name: str, origin: tuple[Any, str]) -> None:
        self._map[name] = (_ref(origin[0]), origin[1])

    def get(self, name: str) -> tuple[Any, str] | None:
        """``(object, sha)``, or None when absent or the object is gone."""
        entry = self._map.get(name)
        if entry is None:
            return None
        obj = entry[0]()
        if obj is None and not isinstance(entry[0], _Held):
            del self._map[name]
            return None
        return obj, entry[1]

    def pop(self, name: str, default: Any = None) -> Any:
        """Forget ``name``."""
        entry = self._map.pop(name, None)
        return default if entry is None else (entry[0](), entry[1])

    def update(self, origins: Mapping[str, tuple[Any, str]]) -> None:
        """Add every ``name -> (object, sha)`` of ``origins``."""
        for name, origin in origins.items():
            self[name] = origin

    def clear(self) -> None:
        """Forget everything."""
        self._map.clear()

    def prune(self, ns: Mapping[str, Any]) -> None:
        """Forget every name that ``ns`` no longer binds to its object (dropping strong refs)."""
        for name, (ref, _sha) in list(self._map.items()):
            obj = ref()
            if (obj is None and not isinstance(ref, _Held)) or ns.get(name, _GONE) is not obj:
                del self._map[name]

    def __len__(self) -> int:
        return len(self._map)

    def __contains__(self, name: object) -> bool:
        return self.get(name) is not None if isinstance(name, str) else False


_GONE = object()


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
    """Outputs with every secret replaced by ``[redacted $NAME]``; and the names found."""
    if not secrets:
        return outputs, []
    found: set[str] = set()

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            text, names = redact.redact_text(value, secrets)
            found.update(names)
            return text
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        return value

    return [scrub(o) for o in outputs], sorted(found)
