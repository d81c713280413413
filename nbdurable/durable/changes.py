"""Which user variables a step changed in place, whoever changed them.

A step's syntax names what it binds and mutates (``x.append``); a helper
that appends to a global, a method that sets an attribute, a closure's
counter, ``setattr`` or ``Model.scale = 5`` are invisible to it. So before a
step runs, :class:`Tokens` takes a cheap *token* of every object reachable
from the user's variables, folded with the object's id into one hash per
variable (nothing is kept per object while the body runs, so a value the
body drops is freed as in a plain run), and after it, compares: a variable
whose reachable objects changed is recorded with the step like one it bound.

A token is what can be read without hashing data:

* list, tuple, deque, dict (``defaultdict``, ``OrderedDict`` and ``Counter``
  too), an instance's ``__dict__``: the length and the ids of the items (and
  keys), so a replaced, added or removed item shows; items are walked in turn;
* set: the ids of its members;
* a notebook function: the ids of its closure cells' contents, defaults and
  ``__dict__`` (a closure counter); a notebook class: the ids of its
  attributes (``Model.scale = 5``, a method added);
* a generator or a builtin iterator: its position (``f_lasti``, the index
  its ``__reduce__`` reports), so a step that advances one is seen;
* the ``__slots__`` of an instance count as its attributes;
* a numpy array: its data pointer, shape, strides and dtype, and a digest of
  all its bytes up to :data:`FULL_HASH_MAX`, of a sample of them above
  (evenly spaced elements and both ends); a pandas DataFrame or Series:
  the tokens of its arrays and the ids of its axes; a torch tensor on the
  CPU: its window and its storage's memory, as an array's. A large array is never
  hashed whole here: a write to it that the sample misses is seen only when
  the step names the array (its inputs are fingerprinted whole by the plan);
* an instance of a library class (not the notebook's, not a local
  module's): its own attributes' ids, and of them only its data (the
  lists, dicts and sets it holds: a checkpointer's storage, a chat
  history's messages) is walked, not the objects it holds, so a client's
  connection pool or a model's caches do not count as the step's changes,
  while a checkpointer a step filled does;
* anything else: its id (an opaque object's inner state is not seen).

The walk visits at most :data:`BUDGET` objects and :data:`DEPTH` levels
below each variable; what lies beyond is not tracked.
"""

from __future__ import annotations

import collections
import hashlib
import re
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

from ..identity import keys, localcode
from ..store import sharing

#: Arrays up to this many bytes are hashed whole; larger ones by a sample.
FULL_HASH_MAX = 1 << 20
#: Elements of a large array's sample.
SAMPLE = 4096
BUDGET = 200_000
DEPTH = 32
_ATOMS = (str, bytes, int, float, bool, complex, type(None), range)
_ATOM_TYPES = frozenset(_ATOMS)
#: Names the shell keeps in the namespace for itself (the output history, the input
#: history, its helpers, the rewritten ``%%step`` cell's entry point): never a step's
#: input or output, and never watched for changes.
HIDDEN = re.compile(
    r"^(_+|_\d+|_i+|_i\d+|_ih|_oh|_dh|In|Out|get_ipython|exit|quit|__nbdurable_step__)$"
)


def _ours(value: Any) -> bool:
    """One of nbdurable's own views (a step panel): its class says so with
    ``nbdurable_view = True``. Other nbdurable objects a user keeps are watched as any.
    """
    return getattr(type(value), "nbdurable_view", False) is True


def user_names(ns: Mapping[str, Any]) -> list[str]:
    """The names of ``ns`` that are the user's (not IPython's history and helpers)."""
    return [n for n in ns if not HIDDEN.match(n)]


def _array_token(a: Any) -> Any:
    info = a.__array_interface__
    head = (info["data"], a.shape, a.strides, a.dtype.str)
    if a.dtype.hasobject:
        return head + (tuple(map(id, a.reshape(-1).tolist())) if a.size <= SAMPLE else None,)
    h = hashlib.blake2b(digest_size=16)
    if a.nbytes <= FULL_HASH_MAX:
        h.update(a.tobytes() if not a.flags.c_contiguous else memoryview(a).cast("B"))
    else:
        flat = a.reshape(-1) if a.flags.c_contiguous else a.ravel(order="K")
        step = max(1, flat.size // SAMPLE)
        h.update(flat[::step].tobytes())
        h.update(flat[:512].tobytes())
        h.update(flat[-512:].tobytes())
    return head + (h.digest(),)


def _walkable(items: Iterable[Any]) -> list[Any]:
    # Atoms hold nothing: dropped here, in one comprehension, not one by one in the walk.
    return [x for x in items if type(x) not in _ATOM_TYPES]


def _token_and_children(obj: Any) -> tuple[Any, Iterable[Any]]:
    t = type(obj)
    if t is list or t is tuple or t is collections.deque:
        return (t, len(obj), tuple(map(id, obj))), _walkable(obj)
    if t is dict or t in _DICTS:
        return (t, tuple(map(id, obj)), tuple(map(id, obj.values()))), _walkable(obj.values())
    if t is set or t is frozenset:
        return (t, frozenset(map(id, obj))), ()
    if t is types.FunctionType and obj.__module__ == "__main__":
        cells = []
        for cell in obj.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:
                cells.append(None)
        parts = [*cells, obj.__defaults__, obj.__kwdefaults__, obj.__dict__]
        return (t, tuple(map(id, parts))), cells
    if t is types.GeneratorType:
        frame = obj.gi_frame
        return (t, frame.f_lasti if frame is not None else -1), ()
    if isinstance(obj, type):
        if obj.__module__ != "__main__":
            return id(obj), ()
        attrs = vars(obj)
        return (tuple(attrs), tuple(map(id, attrs.values()))), [
            v for v in attrs.values() if type(v) in (list, dict, set)
        ]
    mod = (getattr(t, "__module__", None) or "").split(".", 1)[0]
    if mod == "numpy":
        np = sys.modules["numpy"]
        if isinstance(obj, np.ndarray):
            return _array_token(obj), ()
        return id(obj), ()
    if mod == "pandas":
        return _pandas_token(obj), ()
    if mod == "torch":
        storage = sharing.storage_of(obj)
        if storage is not None:
            return _tensor_token(obj, storage), ()
    if mod == "builtins":
        if t.__name__.endswith("iterator"):
            try:
                return (t, repr(obj.__reduce__()[2:])), ()
            except Exception:  # an iterator that cannot say where it is
                return id(obj), ()
        return id(obj), ()
    attrs = getattr(obj, "__dict__", None)
    slots = sharing.slot_names(t)
    if slots:  # `__slots__` (LangGraph's InMemoryStore keeps its data in one)
        attrs = dict(attrs) if type(attrs) is dict else {}
        for name in slots:
            try:
                attrs[name] = getattr(obj, name)
            except AttributeError:  # a slot never set
                pass
    elif type(attrs) is not dict:
        return (t, id(obj)), ()
    if mod != "__main__" and not _user_code(t):
        # A library object (an HTTP client, a model): its own attributes are
        # compared, its insides (connection pools, caches) are its business, and
        # so are the parts it builds on first use (`client.chat`, a
        # functools.cached_property): wherever that first use happens, it is no change.
        # Nor is its bookkeeping (a figure drawn: see localcode.cache_names).
        #
        # Its data is, though: the lists, dicts and sets it holds in its own
        # attributes (a checkpointer's storage, a chat history's messages, an
        # estimator's fitted lists) are walked like the notebook's, so a step
        # that fills an in-memory checkpointer through `app.invoke(...)` is seen
        # to change the checkpointer wherever it was made.
        caches = localcode.cache_names(t)
        if caches:
            attrs = {k: v for k, v in attrs.items() if k not in caches}
        data = [v for v in attrs.values() if type(v) in _DATA]
        return (t, tuple(attrs), tuple(map(id, attrs.values()))), data
    token = (t, tuple(attrs), tuple(map(id, attrs.values())))
    return token, _walkable(attrs.values())


def _user_code(t: type) -> bool:
    try:
        return localcode.is_local_module_name(t.__module__)
    except Exception:  # no source to look at
        return False


def _tensor_token(t: Any, storage: Any) -> Any:
    # Its window (offset, shape, strides, dtype) and its storage's memory as an
    # array's: `sd = model.state_dict()` changes with the training that
    # changes the parameters whose memory it shares.
    try:
        memory = _array_token(sharing.storage_bytes(storage))
    except Exception:  # a storage numpy cannot view: seen by identity
        memory = id(storage)
    return (type(t), t.storage_offset(), tuple(t.shape), t.stride(), str(t.dtype), memory)


def _pandas_token(obj: Any) -> Any:
    mgr = getattr(obj, "_mgr", None)
    arrays = getattr(mgr, "arrays", None)
    if arrays is None:
        return id(obj)
    np = sys.modules.get("numpy")
    parts = [id(getattr(obj, "index", None)), id(getattr(obj, "columns", None)), obj.shape]
    for arr in arrays:
        parts.append(_array_token(arr) if np and isinstance(arr, np.ndarray) else id(arr))
    return tuple(parts)


def _class_fp(cls: type) -> str:
    try:
        return keys.fingerprint(cls)
    except Exception:  # a user's fingerprint hook failing: the patch never applies
        return "unfingerprintable"


_CONTAINERS = (list, dict, set)
#: dicts by another type: walked as dicts
_DICTS = frozenset((collections.defaultdict, collections.OrderedDict, collections.Counter))
#: the containers of a library object's attributes that are walked (its data)
_DATA = frozenset((list, dict, set, collections.deque, *_DICTS))


class Tokens:
    """Tokens of everything reachable from a namespace's variables, for :meth:`changed`."""

    def __init__(self, ns: Mapping[str, Any], names: Iterable[str]) -> None:
        # nbdurable's own objects (a step panel in a variable, whose watcher thread
        # redraws it while a step runs) are not the user's state: never a change.
        self.roots = {n: self._walk(ns[n]) for n in names if n in ns and not _ours(ns[n])}
        #: name -> (the class, its attributes, its fingerprint) for notebook classes
        self.classes: dict[str, tuple[type, dict[str, Any], str]] = {}
        #: name -> {attribute: token} of a notebook class's list, dict and set
        #: attributes: `Registry.items.append(...)` changes one without rebinding it
        self.class_data: dict[str, dict[str, int | None]] = {}
        for n in self.roots:
            cls = ns[n]
            if isinstance(cls, type) and cls.__module__ == "__main__":
                self.classes[n] = (cls, dict(vars(cls)), _class_fp(cls))
                self.class_data[n] = {
                    k: self._walk(v) for k, v in vars(cls).items() if type(v) in _CONTAINERS
                }

    def class_patches(self, ns: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
        """A :class:`sharing.ClassPatch` for each of ``names`` that is a notebook class
        changed in place (same object before and after the step).
        """
        out: dict[str, Any] = {}
        for n in names:
            got = self.classes.get(n)
            if got is None or ns.get(n) is not got[0]:
                continue
            cls, before, fp = got
            now = vars(cls)
            data = self.class_data.get(n, {})
            attrs = {
                k: v
                for k, v in now.items()
                if k not in before
                or before[k] is not v
                or (k in data and self._walk(v) != data[k])  # changed in place
            }
            attrs.pop("__dict__", None)
            attrs.pop("__weakref__", None)
            removed = [k for k in before if k not in now]
            out[n] = sharing.ClassPatch(n, fp, attrs, removed)
        return out

    @staticmethod
    def _walk(root: Any) -> int | None:
        """One number for the tokens of everything ``root`` reaches (None: nothing to walk).

        Nothing is kept per object: the tokens, with each object's id, are
        folded into one hash as the walk goes (a namespace of a million
        objects costs no memory between the two walks, so a step that frees
        a value frees its memory as in a plain run). Only objects that hold
        others are remembered while walking (by id), to walk each once.
        """
        if isinstance(root, (types.ModuleType, *_ATOMS)):
            return None
        seen: set[int] = set()
        acc = 0
        todo = [root]
        depth = visited = 0
        while todo and depth < DEPTH and visited < BUDGET:
            depth += 1
            nxt: list[Any] = []
            for obj in todo:
                if type(obj) is types.ModuleType:
                    continue
                try:
                    token, children = _token_and_children(obj)
                except Exception:  # an object whose attributes raise: seen by id only
                    token, children = id(obj), ()
                if children:  # a leaf reached twice is folded twice: the same each walk
                    if id(obj) in seen:
                        continue
                    seen.add(id(obj))
                    nxt.extend(children)
                visited += 1
                try:
                    acc = hash((acc, id(obj), token))
                except TypeError:  # an unhashable part in a token: its id stands in
                    acc = hash((acc, id(obj)))
            todo = nxt
        return acc

    def changed(self, ns: Mapping[str, Any], skip: Iterable[str] = ()) -> list[str]:
        """Names still bound to the same object whose reachable objects changed."""
        skipped = set(skip)
        out = []
        for name, before in self.roots.items():
            if before is None or name in skipped or name not in ns:
                continue
            if self._walk(ns[name]) != before:
                out.append(name)
        return sorted(out)
