"""Turning a finished step's variables and outputs into what the store keeps.

A step's variables are pickled together and stored once by content (one
blob, see :mod:`nbdurable.store.blobs`), so what they share stays shared,
and what they share with the rest of the namespace is kept as a reference
to it (see :mod:`nbdurable.store.sharing`); modules are kept by name; a
value that cannot be pickled, or that holds a secret from the environment,
is kept as *unsaved* with the reason, never silently
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

import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import config, faults, redact
from ..errors import CorruptRecord
from ..store import Store, blobs, sharing, spill, values
from ..store.records import VarRecord
from . import changes


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

    def drop_unsaved(self, names: set[str]) -> set[str]:
        """Leave out of the record the variables of ``names`` that could not be saved.

        Returns the names left out: the step did not produce them.
        """
        gone = {n for n in self.unsaved_names if n in names}
        if not gone:
            return gone
        self.variables = [v for v in self.variables if not (v.kind == "unsaved" and v.name in gone)]
        kept = [
            (u, n) for u, n in zip(self.unsaved, self.unsaved_names, strict=True) if n not in gone
        ]
        self.unsaved = [u for u, _ in kept]
        self.unsaved_names = [n for _, n in kept]
        return gone

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
    others: Iterable[str] = (),
    checked: Iterable[str] = (),
    replace: Mapping[str, Any] | None = None,
    in_place: Iterable[str] = (),
) -> Saved:
    """Write the values of ``names`` as one blob (once by content); return the records.

    The values are pickled together, so objects they share stay shared
    (``b = a`` loads back as one list), and objects they share with
    ``others``, the user variables the step did not change, are written as
    references to where they live (see :mod:`nbdurable.store.sharing`);
    a reference rooted at a name of ``checked`` (the step's inputs, whose
    fingerprints the plan compares) carries no fingerprint of its own.
    ``replace`` maps names to what is pickled instead of their value (a
    :class:`sharing.ClassPatch` for a notebook class changed in place);
    those are pickled first, so the step's instances of such a class load
    as instances of the live, changed class. ``in_place`` names the objects
    the step changed without rebinding them: on replay each is restored into
    the live object of its name (see :func:`sharing.in_place`).

    ``names`` are the names the step bound or changed: a value that refers to
    one of them by name (``__main__.f``) cannot be restored (see
    :func:`values.restore_problem`). ``unloadable`` maps names whose recorded
    value failed to load on this kernel's replay to the reason: they are kept
    unsaved without a second try (what failed there, a module missing from a
    fresh kernel, would load here and fail again there).
    """
    out = Saved()
    pending: list[str] = []
    for name in names:
        value = ns[name]
        masked, found = redact.scrub_name(name, secrets)
        if found:
            # A name is written as it is (a record's header, every export): a variable
            # named by a secret is not written at all, and its body runs again.
            why = "its name holds " + redact.said(found)
            out.secrets.append(f"{masked} ({redact.said(found)} in its name)")
            tname = values.type_name(value)
            out.variables.append(
                VarRecord(masked, "unsaved", why, fingerprint(value, name), 0, tname)
            )
        elif unloadable and name in unloadable:
            _unsaved(out, name, values.type_name(value), unloadable[name], fingerprint(value, name))
        elif values.is_module(value):
            ref = values.module_ref(value, imported)
            out.variables.append(VarRecord(name, "module", ref, fingerprint(value, name)))
        else:
            pending.append(name)
    if pending:
        swap = dict(replace or {})
        # Patches first (see above); then values that look like plain data:
        # a part is known as plain only if all before it are (see
        # values.dump_values). Stable otherwise.
        pending.sort(key=lambda n: (n not in swap, not _looks_plain(ns[n])))
        view = {**ns, **swap} if swap else ns
        _save_joint(
            out, store, ns, view, pending, names, fingerprint, secrets, others, checked, in_place
        )
    return out


_CONTAINERS = (list, dict, tuple, set, frozenset)
_SCALARS = (str, bytes, int, float, bool, type(None))


def _looks_plain(value: Any, depth: int = 3) -> bool:
    """A guess from a few items: builtin containers of builtin scalars (only orders values)."""
    t = type(value)
    if t in _SCALARS:
        return True
    if t not in _CONTAINERS or depth == 0:
        return False
    items = value.values() if t is dict else value
    return all(_looks_plain(v, depth - 1) for v in itertools.islice(items, 8))


def _save_joint(
    out: Saved,
    store: Store,
    ns: dict[str, Any],
    view: Mapping[str, Any],
    pending: list[str],
    produced: list[str],
    fingerprint: Callable[[Any, str], str],
    secrets: dict[str, bytes],
    others: Iterable[str],
    checked: Iterable[str],
    in_place: Iterable[str] = (),
) -> None:
    """Pickle ``pending`` together and write the blob; drop (as unsaved) what cannot be."""
    limit = config.get().warn_size_mb * 1024 * 1024
    roots = [n for n in others if n in ns]
    in_place = set(in_place)

    def own() -> set[int]:
        # Not the objects the step changed in place: a checkpointer the step
        # filled is also reachable from the graph holding it, yet it is this
        # step's to save (and to restore into the live one). A name the step
        # bound to an object that lives elsewhere (`current = state`) is a
        # reference, as before.
        return {id(view[n]) for n in pending if n in in_place}

    def find_refs(held: dict[int, Any]) -> dict[int, tuple[sharing.Path, Any]]:
        mine = own()
        for key in mine:  # (held is made for this call: no copy of a million ids)
            held.pop(key, None)
        return sharing.index(ns, roots, held, mine)

    checked = set(checked)

    while pending:
        here = {id(ns[n]): n for n in pending if n in in_place and view[n] is ns[n]}
        # What holds an object restored in place is fingerprinted with that object
        # standing in by name (see sharing.in_place_standins).
        standins = {i: n for i, n in here.items() if values.restores_in_place(ns[n])}
        try:
            joint = values.dump_values(
                [view[n] for n in pending],
                find_refs,
                _ref_fps(checked, standins),
                here,
                tuple(sorted(standins.values())),
                sharing.top_level(ns, roots, own()),
            )
        except values.PartFailed as exc:
            name = pending.pop(exc.index)
            _unsaved(out, name, values.type_name(ns[name]), str(exc), fingerprint(ns[name], name))
            continue
        notebook = any(p[3] for p in joint.parts)
        problem = values.restore_problem(
            values.Pickled(joint.stream, joint.buffers, False, notebook),
            produced,
            ns,
            count=len(pending),
        )
        if problem is not None:
            # One memo: the stream does not say whose value it is. Each is tried
            # alone; those that fail alone are unsaved and the rest pickled again.
            bad = _culprits(view, pending, produced, ns) or {n: problem for n in pending}
            for name, why in bad.items():
                pending.remove(name)
                value = ns[name]
                _unsaved(out, name, values.type_name(value), why, fingerprint(value, name))
            continue
        try:
            # Searched for secrets in the very copy that is hashed and written.
            sha, spilled = spill.put(
                store, joint.stream, joint.buffers, defer=out.pending, secrets=secrets
            )
        except blobs.SecretFound:
            holders = _secret_holders(joint, pending, secrets)
            for name, found_names in holders:
                pending.remove(name)
                out.secrets.append(f"{name} ({redact.said(found_names)})")
                why = "holds " + redact.said(found_names)
                tname = values.type_name(ns[name])
                out.variables.append(
                    VarRecord(name, "unsaved", why, fingerprint(ns[name], name), 0, tname)
                )
            continue
        faults.point("blob-written")
        digest = spill.digest(sha, spilled)
        start, first = 0, 0
        for i, name in enumerate(pending):
            end, last, plain, _nb = joint.parts[i]
            size = end - start + sum(b.nbytes for b in joint.buffers[first:last])
            own = tuple((pos, ref) for pos, ref in spilled if first <= pos < last)
            start, first = end, last
            if size > limit:
                out.large.append(f"{name} ({size / 1e6:.1f} MB)")
            out.origins[name] = (ns[name], digest, plain)
            # A saved value's fingerprint is its blobs' SHA-256 and its place in them
            # (already computed: a second pass over a 100 MB array would cost as much).
            out.variables.append(
                VarRecord(
                    name,
                    "shared",
                    sha,
                    f"blob:{digest}/{i}",
                    size,
                    values.type_name(ns[name]),
                    own,
                )
            )
        return


def _ref_fps(
    checked: set[str], standins: dict[int, str]
) -> Callable[[sharing.Path, Any], str | None]:
    """The fingerprint each reference carries (once per object); None under an input."""
    fps: dict[int, str | None] = {}

    def ref_fp(path: sharing.Path, obj: Any) -> str | None:
        if id(obj) not in fps:
            fps[id(obj)] = None if path[0] in checked else sharing.ref_fingerprint(obj, standins)
        return fps[id(obj)]

    return ref_fp


def _culprits(
    view: Mapping[str, Any], pending: list[str], produced: list[str], ns: dict[str, Any]
) -> dict[str, str]:
    """The names of ``pending`` whose value alone would not restore, with the reason."""
    bad = {}
    for name in pending:
        try:
            problem = values.restore_problem(values.dump_value(view[name]), produced, ns)
        except values.Unsaveable as exc:  # pickled with the others, not alone: still its fault
            problem = str(exc)
        if problem is not None:
            bad[name] = problem
    return bad


def _secret_holders(
    joint: values.Joint, pending: list[str], secrets: dict[str, bytes]
) -> list[tuple[str, list[str]]]:
    """The names whose part of ``joint`` holds a secret (all of them if none alone does)."""
    holders = []
    start, first = 0, 0
    for i, name in enumerate(pending):
        end, last, _plain, _nb = joint.parts[i]
        part = joint.stream[start:end]
        # As the store searches (see its put_blob): environment secrets everywhere,
        # well-known keys typed literally in the pickle stream and in bytes' buffers.
        found: set[str] = set(blobs.scan(part, secrets) or redact.key_names(part))
        for buf in joint.buffers[first:last]:
            found.update(blobs.scan(buf, secrets))
            if isinstance(buf.obj, bytes | bytearray):
                found.update(redact.key_names(buf))
        start, first = end, last
        if found:
            holders.append((name, sorted(found)))
    if not holders:  # a secret split across two parts: none can be written alone
        every = sorted(
            blobs.scan(joint.stream, secrets) or redact.key_names(joint.stream)
        ) or sorted(secrets)
        holders = [(name, every) for name in pending]
    return holders


class LoadFailed(Exception):
    """Restoring a record's variables failed; ``names`` are the variables it concerned."""

    def __init__(self, names: list[str], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.names = names
        self.cause = cause


def load_variables(
    store: Store,
    variables: Iterable[VarRecord],
    ns: dict[str, Any],
    live: sharing.LiveTargets | None = None,
) -> tuple[dict[str, Any], dict[str, bool]]:
    """The values a record's variables restore to, and which of them are plain data.

    Nothing is bound here, but a value recorded as changed in place is loaded
    into the object of ``live`` of its name (see :func:`sharing.in_place`):
    the caller undoes that (``live.undo()``) if it abandons the replay, this
    function included. Raises :class:`LoadFailed` naming the variables
    concerned (its ``cause`` is a :class:`~nbdurable.errors.CorruptRecord`
    for a damaged or missing blob, a :class:`sharing.NotExact` when a
    shared object is no longer what it was).
    """
    token = sharing.live_targets.set(live)
    try:
        return _load_variables(store, variables, ns)
    finally:
        sharing.live_targets.reset(token)


def _load_variables(
    store: Store, variables: Iterable[VarRecord], ns: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, bool]]:
    variables = list(variables)
    restoring = [v.name for v in variables]
    restored: dict[str, Any] = {}
    pure: dict[str, bool] = {}
    joint: dict[str, list[str]] = {}  # sha -> names in the blob's order
    spilled: dict[str, list[Any]] = {}  # sha -> its spilled buffers (see spill)
    for var in variables:
        if var.kind == "shared":
            joint.setdefault(var.ref, []).append(var.name)
            spilled.setdefault(var.ref, []).extend(var.spilled)
            continue
        try:
            faults.point("replay")
            if var.kind == "module":
                restored[var.name] = values.import_module(var.ref)
                continue
            blob = store.get_blob(var.ref)
            if blob is None:
                raise CorruptRecord(f"the saved value of {var.name!r} is missing")
            value, pure[var.name] = values.load_value(blob.stream, ns, blob.buffers)
            restored[var.name] = values.adopt(value, ns, restoring)
        except Exception as exc:
            raise LoadFailed([var.name], exc) from exc
    for sha, names in joint.items():
        try:
            faults.point("replay")
            blob = spill.get(store, sha, spilled[sha])
            if blob is None:
                raise CorruptRecord(f"the saved value of {names[0]!r} is missing")
            got = values.load_values(blob.stream, len(names), ns, blob.buffers)
            for name, (value, plain) in zip(names, got, strict=True):
                restored[name] = values.adopt(value, ns, restoring)
                pure[name] = plain
        except values.PartUnloadable as exc:
            # The values before it loaded: it is the one that does not (those
            # after it were not tried, and are not blamed).
            raise LoadFailed([names[exc.index]], exc.cause) from exc.cause
        except Exception as exc:
            raise LoadFailed(names, exc) from exc
    return restored, pure


def _unsaved(out: Saved, name: str, tname: str, why: str, fp: str) -> None:
    why = redact.scrub(why)[0]  # an error's text may quote the value; masked before the cut
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
        #: name -> (the object's fingerprint when it was recorded or restored, its
        #: fingerprint when recorded, if known) (see :meth:`note_fingerprint`)
        self._fps: dict[str, tuple[str, str | None]] = {}

    def __setitem__(self, name: str, origin: tuple[Any, ...]) -> None:
        """``origins[name] = (object, sha)`` or ``(object, sha, pure)``."""
        obj, sha = origin[0], origin[1]
        pure = len(origin) > 2 and origin[2]
        self._map[name] = (_Id(obj) if pure else _ref(obj), sha)
        self._fps.pop(name, None)

    def note_fingerprint(self, name: str, fp: str, recorded: str | None = None) -> None:
        """The fingerprint the object of ``name`` had when it was recorded or restored.

        ``recorded``: its fingerprint when the step recorded it (the same as ``fp``
        in that run; the record's ``VarRecord.content`` when restored).

        An object pickle rebuilds from its state may come back with a state
        that fingerprints otherwise (scikit-learn's ``Bunch`` drops a private
        dict in ``__setstate__``): the restored copy is what the record holds,
        yet its fingerprint is not the recorded object's. What a dependant
        compares is then "the object of this blob, unchanged since" (see
        ``Stepper._input_fp``), the same in the run that recorded it and in the
        one that restored it.
        """
        if name in self._map:
            self._fps[name] = (fp, recorded or None)

    def fingerprint_at_origin(self, name: str) -> str | None:
        """What :meth:`note_fingerprint` noted for ``name`` (None: nothing)."""
        noted = self._fps.get(name)
        return None if noted is None else noted[0]

    def content_at_origin(self, name: str) -> str | None:
        """The fingerprint ``name``'s object had when recorded, if noted (None: not known)."""
        noted = self._fps.get(name)
        return None if noted is None else noted[1]

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
        self._fps.pop(name, None)
        entry = self._map.pop(name, None)
        return default if entry is None else entry[1]

    def update(self, origins: Mapping[str, tuple[Any, ...]]) -> None:
        """Add every ``name -> (object, sha[, pure])`` of ``origins``."""
        for name, origin in origins.items():
            self[name] = origin

    def clear(self) -> None:
        """Forget everything."""
        self._map.clear()
        self._fps.clear()

    def prune(self, ns: Mapping[str, Any]) -> None:
        """Forget every name that ``ns`` no longer binds to its object (dropping strong refs)."""
        for name, (handle, _sha) in list(self._map.items()):
            if name not in ns or not _same(handle, ns[name]):
                del self._map[name]
                self._fps.pop(name, None)

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
        # What every user variable reaches, as cheap tokens (see changes.Tokens).
        self.tokens = changes.Tokens(ns, changes.user_names(ns))

    def class_patches(self, ns: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
        """What to save instead of the notebook classes of ``names`` the step changed in place."""
        return self.tokens.class_patches(ns, names)

    def mutated(self, ns: Mapping[str, Any], known: Iterable[str]) -> list[str]:
        """Names not in ``known``, bound to the same object, whose reachable objects changed."""
        return self.tokens.changed(ns, known)

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
