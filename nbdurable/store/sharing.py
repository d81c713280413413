"""Objects a step's values share with the namespace, and numpy views, across a replay.

A step's changed variables are pickled together (one pickler, one memo: see
:func:`nbdurable.store.values.dump_values`), so two of its names bound to one
object load back as one object. What they share with the rest of the
namespace is not theirs to copy: a sentinel from a plain cell, a handler, a
list an earlier step made. Such an object is written as a *reference*, a
pickle persistent id naming where it lives::

    ("nbdurable.ref", path, fingerprint or None)

``path`` is a variable name followed by steps: ``("i", 3)`` an index of a
list or tuple, ``("k", key)`` a dict key (a string, number or None), ``("a",
name)`` an instance attribute, ``("s", None)`` a torch tensor's storage. On
replay the path is followed in the live namespace; if it does not lead
anywhere, or to an object whose fingerprint differs from the recorded one,
the replay would not be exact, so it is refused (:class:`NotExact`) and the
step's body runs again. The fingerprint
is left out (None) when the path's variable is one of the step's inputs,
whose fingerprints the plan already compared.

Which objects are references: those the step's pickle holds that are
reachable (:func:`index`) from the variables the step did not change (the
pickle is written first without references; only the objects in its memo
are looked for, and only if one is found is it written again with
references), through lists, tuples, dicts (``OrderedDict``, ``defaultdict``
and ``Counter`` too) and instance attributes, within :data:`BUDGET` objects
and :data:`DEPTH` steps; classes, functions, arrays and DataFrames are
leaves (referenced whole, never walked), and of an instance of a library
class only its own attributes are looked at, not what lies below them (but
for a torch module's parts, see below), unless the step's pickle holds that
instance too (an artist the step changed holds its figure: the figure's
axes and transforms are references then, so the artist loads into the live
figure, not beside a copy of it). An object beyond those bounds is not
found, and is pickled by value like the step's own objects.

A reference's fingerprint is taken with the objects the same pickle
restores in place standing in by name and type (see
:func:`in_place_standins`): the figure holding the artist a step changed is
the same figure before the change is restored into the artist and after.

In place. A library object a step changed without rebinding it (an
in-memory checkpointer filled through the compiled graph that holds it, a
store, a chat history) is held by other objects the step did not save: the
graph, made in a plain cell, points at it. Restored as a copy and rebound,
the name would hold the step's state and the graph the empty one. So such
an object is pickled as "the live object of this name, emptied, then given
this state" (:func:`in_place`): on replay the object the plain cells made
again receives the recorded state, and every holder sees it. Only objects
pickle rebuilds the default way (``cls.__new__`` then their state), of the
same class as the live one (a pandas DataFrame or Series is one: its state is
its block manager, and a groupby made from it then reads the recorded data);
anything else loads as a new object, as before.
What a replay filled is put back (:class:`LiveTargets`) if the replay is
abandoned, so a body that runs again starts from what the plain cells made.

numpy. An array's pickle is its memory (out of band, see
:mod:`nbdurable.store.blobs`) rebuilt with that memory as its base, and a
view (``v = arr[:5]``) is pickled as "this window of that array": the array
once, the view rebuilt on it, so writes through the view still reach the
array after a replay and ``v.base is arr`` holds as in a plain run.

torch. A tensor is a window on a storage that other tensors may share
(``model.state_dict()`` and ``param.detach()`` hold the parameters' own
memory; a later ``optimizer.step()`` changes them too). torch's pickle
copies each tensor's storage, so a CPU tensor is pickled instead as "this
window of that storage" (:func:`reduce_tensor`), the storage written once,
its memory out of band. A storage is reached from a tensor of the namespace
by the path step ``("s", None)`` (``t.untyped_storage()``), and a torch
module's submodules, parameters and buffers are walked as its data: a
step's ``sd = model.state_dict()`` loads as tensors on the storages of the
live model's parameters.
"""

from __future__ import annotations

import collections
import contextvars
import pickle
import sys
import types
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ..errors import NbdurableError
from ..identity import keys, localcode

#: The tag of a reference persistent id.
TAG = "nbdurable.ref"
#: At most this many objects are visited when indexing the namespace...
BUDGET = 200_000
#: ...at most this many steps below a variable (a 200,000-node linked list is
#: not walked to its end, and no path grows longer than this).
DEPTH = 64
_ATOMS = (str, bytes, int, float, bool, complex, type(None))
_KEYS = (str, int, float, bool, type(None))
#: dicts by another type, walked as dicts (a torch ``state_dict()`` is an OrderedDict)
_DICTS = frozenset((collections.OrderedDict, collections.defaultdict, collections.Counter))


#: The namespace live notebook classes are looked up in while loading
#: (see values._live_class and _patch_class).
load_namespace: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nbdurable_namespace", default=None
)


def live_namespace() -> dict[str, Any] | None:
    """The namespace a load in progress resolves notebook names in (None outside one)."""
    return load_namespace.get()


def _fp(obj: Any, standins: Mapping[int, str] | None = None) -> str:
    try:
        return keys.fingerprint(obj, standins=standins)
    except Exception:  # a user's fingerprint hook failing: such a reference never matches
        return "unfingerprintable"


def ref_fingerprint(obj: Any, standins: Mapping[int, str] | None = None) -> str:
    """The fingerprint a reference to ``obj`` is checked against on replay.

    ``standins``: the objects the same pickle restores in place (id -> their
    name), compared by name and type only (see :func:`in_place_standins`).
    """
    return _fp(obj, standins)


def in_place_standins(ns: Mapping[str, Any], names: Iterable[str]) -> dict[int, str]:
    """``id -> name`` of the live objects of ``names`` (a reference's in-place names).

    A step that changed an artist in place holds a reference to the figure that
    holds the artist: its fingerprint after the step includes the change, and on
    replay, before the change is restored into the live artist (while it is, the
    artist is emptied), it does not. So a reference is fingerprinted with the
    objects its pickle restores in place standing in by name and type: the same
    when the step recorded it and when the replay resolves it. One that is not
    restored in place on replay (another class now) fingerprints otherwise.
    """
    return {id(ns[n]): n for n in names if n in ns}


class NotExact(NbdurableError, LookupError):
    """A reference did not resolve to the recorded object: the replay would not be exact."""


Path = tuple[Any, ...]


def index(
    ns: Mapping[str, Any],
    names: Iterable[str],
    wanted: Collection[int],
    mine: Collection[int] = (),
) -> dict[int, tuple[Path, Any]]:
    """``id(obj) -> (path, obj)`` for objects of ``wanted`` (ids) reachable from ``names``.

    Not through the objects of ``mine`` (ids): the objects the step restores in
    place, whose state the step's pickle holds by value.

    The first path found wins (variables in the order given, breadth first),
    so a top-level name is preferred to a path through another object. Only
    the wanted objects are kept, and only objects that hold others are
    remembered while walking: indexing a namespace of a million objects for
    a step whose values share three of them costs no memory per object.
    """
    found: dict[int, tuple[Path, Any]] = {}
    seen: set[int] = set()
    known: dict[str, bool] = {}
    todo: list[tuple[Path, Any]] = []
    for name in names:
        obj = ns[name]
        if isinstance(obj, (types.ModuleType, *_ATOMS)):
            continue
        if id(obj) in wanted and id(obj) not in found:
            found[id(obj)] = ((name,), obj)
        if id(obj) not in seen and _holds(obj):
            seen.add(id(obj))
            todo.append(((name,), obj))
    budget, depth = BUDGET, 0
    while todo and budget > 0 and depth < DEPTH:
        depth += 1
        nxt: list[tuple[Path, Any]] = []
        for path, obj in todo:
            # A library object's own attributes can be referenced; what lies
            # below them (a logger's handlers' streams, a client's pools: the
            # kernel's whole object graph) is not walked, as changes.Tokens
            # does not walk it either. Unless the step's values hold the object
            # too: what it holds is then theirs as well (the figure of an artist
            # the step changed, its axes and their transforms), and must load
            # as the live objects, not copies beside them.
            inside = id(obj) in wanted or not _library(obj, known)
            parts = _torch_module_parts(obj)
            for step, child in _children(obj):
                budget -= 1
                if isinstance(child, (types.ModuleType, *_ATOMS)):
                    continue
                key = id(child)
                if key in mine:
                    continue
                if key in wanted and key not in found:
                    found[key] = (path + (step,), child)
                if (inside or step in parts) and key not in seen and _holds(child):
                    seen.add(key)
                    nxt.append((path + (step,), child))
            if budget <= 0:
                break
        todo = nxt
    return found


def top_level(
    ns: Mapping[str, Any], names: Iterable[str], mine: Collection[int] = ()
) -> dict[int, tuple[Path, Any]]:
    """What :func:`index` finds at the top of ``names`` for any object wanted there.

    ``id(obj) -> ((name,), obj)`` of each variable's own value, the first name
    winning, without modules, atoms and the objects of ``mine``: known before
    anything is pickled, as :func:`index` would name them, since it looks at
    every top-level name before walking below any.
    """
    found: dict[int, tuple[Path, Any]] = {}
    for name in names:
        obj = ns[name]
        if isinstance(obj, (types.ModuleType, *_ATOMS)) or id(obj) in mine:
            continue
        found.setdefault(id(obj), ((name,), obj))
    return found


def _library(obj: Any, known: dict[str, bool]) -> bool:
    """True for an instance of a class that is neither the notebook's nor a local module's.

    ``known`` caches the answer by module name for one walk.
    """
    t = type(obj)
    if t is list or t is tuple or t is dict or t in _DICTS:
        return False
    mod = getattr(t, "__module__", None) or ""
    if mod not in known:
        try:
            known[mod] = not localcode.is_local_module_name(mod)
        except Exception:  # no source to look at: not the user's
            known[mod] = True
    return known[mod]


def _holds(obj: Any) -> bool:
    """True if ``obj`` has a child worth walking to (not only atoms)."""
    return any(not isinstance(c, _ATOMS) for _s, c in _children(obj))


#: The attributes of a torch module that hold its submodules, parameters and buffers.
_TORCH_PARTS = frozenset((("a", "_modules"), ("a", "_parameters"), ("a", "_buffers")))


def _torch_module_parts(obj: Any) -> frozenset:
    """The path steps below a library object that are walked all the same: a torch
    module's submodules, parameters and buffers (the tensors whose storages a
    step's ``state_dict()`` shares). Empty for anything else.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        return _TORCH_PARTS
    return frozenset()


def _children(obj: Any) -> Iterable[tuple[tuple[str, Any], Any]]:
    t = type(obj)
    if t is list or t is tuple:
        return ((("i", i), v) for i, v in enumerate(obj))
    if t is dict or t in _DICTS:
        return ((("k", k), v) for k, v in obj.items() if type(k) in _KEYS)
    storage = storage_of(obj)
    if storage is not None:
        return ((("s", None), storage),)
    if isinstance(obj, type) or callable(obj) and not hasattr(obj, "__dict__"):
        return ()
    if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return ()
    mod = getattr(t, "__module__", "") or ""
    if mod.split(".", 1)[0] in ("numpy", "pandas", "builtins"):
        return ()
    attrs = getattr(obj, "__dict__", None)
    if type(attrs) is not dict:
        return ()
    return ((("a", k), v) for k, v in attrs.items() if type(k) is str)


def relink(loaded: Iterable[Any]) -> None:
    """Register each matplotlib transform of ``loaded`` with the transforms it is built on.

    A transform learns that it must be recomputed through its children's
    ``_parents`` (weak back-links set when it is built, and by pickle when a
    whole figure loads at once). One loaded beside live ones (an image's clip
    box, of the artist a step changed in place, over the live axes' transforms)
    is in no live child's ``_parents``: the figure drawn with another layout
    (``bbox_inches="tight"``, as the inline backend shows it) clipped the image
    to where the axes were. So each loaded transform is set as the parent of
    the transforms its attributes hold, as building it would have (an extra
    link only invalidates once more).
    """
    transforms = sys.modules.get("matplotlib.transforms")
    node = getattr(transforms, "TransformNode", None)
    if node is None:
        return
    for obj in loaded:
        if isinstance(obj, node):
            children = [v for v in vars(obj).values() if isinstance(v, node) and v is not obj]
            if children:
                obj.set_children(*children)


# -- objects restored in place ---------------------------------------------------------


class LiveTargets:
    """The live objects a load may restore in place (by variable name), and how to undo it."""

    def __init__(self, targets: Mapping[str, Any]) -> None:
        self.targets = targets
        self._undo: list[Any] = []

    def take(self, name: str, cls: type) -> Any:
        """The live object of ``name`` emptied for its recorded state, or None."""
        obj = self.targets.get(name)
        if obj is None or type(obj) is not cls:
            return None
        self._undo.append(_empty(obj))
        return obj

    def undo(self) -> None:
        """Give every object taken back the state it had before the load."""
        while self._undo:
            self._undo.pop()()


live_targets: contextvars.ContextVar[LiveTargets | None] = contextvars.ContextVar(
    "nbdurable_live_targets", default=None
)


def in_place(name: str, cls: type) -> Any:
    """The object pickle fills with the recorded state: the live one of ``name`` if a
    replay offers it (see :class:`LiveTargets`), else a new one (as ``cls.__new__``).
    """
    got = live_targets.get()
    obj = got.take(name, cls) if got is not None else None
    return cls.__new__(cls) if obj is None else obj


def _empty(obj: Any) -> Any:
    """Empty ``obj`` for pickle's BUILD (and APPENDS, SETITEMS); return what refills it.

    Its ``__dict__`` is cleared, and so are the items of a list, dict or set
    subclass (seaborn's palette is a list): the recorded state and items are
    all it holds afterwards. Slots are left to BUILD, which sets those the
    state has (deleting one a ``__setstate__`` does not set would break the
    object: pydantic's ``RootModel``).
    """
    attrs = getattr(obj, "__dict__", None)
    kept = dict(attrs) if type(attrs) is dict else None
    slots = {}
    for name in slot_names(type(obj)):
        try:
            slots[name] = object.__getattribute__(obj, name)
        except AttributeError:  # never set
            continue
    items: Any = None
    if isinstance(obj, list):
        items = list(obj)
        list.clear(obj)
    elif isinstance(obj, dict):
        items = dict(obj)
        dict.clear(obj)
    elif isinstance(obj, set):
        items = set(obj)
        set.clear(obj)
    if kept is not None:
        attrs.clear()

    def refill() -> None:
        now = getattr(obj, "__dict__", None)
        if kept is not None and type(now) is dict:
            now.clear()
            now.update(kept)
        for name, value in slots.items():
            object.__setattr__(obj, name, value)
        if isinstance(obj, list):
            list.clear(obj)
            list.extend(obj, items)
        elif isinstance(obj, dict):
            dict.clear(obj)
            dict.update(obj, items)
        elif isinstance(obj, set):
            set.clear(obj)
            set.update(obj, items)

    return refill


def slot_names(t: type) -> tuple[str, ...]:
    """The ``__slots__`` of ``t`` and its bases (not ``__dict__``, ``__weakref__``),
    as the attribute names they make (``__x`` of class ``C`` is ``_C__x``).
    """
    got = _SLOTS.get(t)
    if got is None:
        names: list[str] = []
        for klass in getattr(t, "__mro__", ()):
            declared = vars(klass).get("__slots__", ())
            for name in (declared,) if isinstance(declared, str) else declared:
                if isinstance(name, str) and name not in ("__dict__", "__weakref__"):
                    if name.startswith("__") and not name.endswith("__"):
                        name = f"_{klass.__name__.lstrip('_')}{name}"
                    if name not in names:
                        names.append(name)
        if len(_SLOTS) > 10_000:  # classes made in a loop: do not keep them all alive
            _SLOTS.clear()
        got = _SLOTS[t] = tuple(names)
    return got


_SLOTS: dict[type, tuple[str, ...]] = {}


def resolve(ns: Mapping[str, Any], path: Path) -> Any:
    """The object ``path`` leads to in ``ns``; :class:`NotExact` if it leads nowhere."""
    try:
        obj = ns[path[0]]
        for kind, key in path[1:]:
            if kind == "a":
                obj = vars(obj)[key]
            elif kind == "s":
                obj = storage_of(obj)
                if obj is None:
                    raise TypeError("not a tensor on the CPU")
            else:
                obj = obj[key]
    except Exception as exc:
        raise NotExact(f"{describe(path)} is gone from the namespace") from exc
    return obj


def describe(path: Path) -> str:
    """``reg['x'].items[0]`` for a path."""
    text = str(path[0])
    for kind, key in path[1:]:
        if kind == "s":
            text += ".untyped_storage()"
        else:
            text += f".{key}" if kind == "a" else f"[{key!r}]"
    return text


# -- notebook classes changed in place ---------------------------------------------------


class ClassPatch:
    """What a step changed on a notebook class it did not define (``Model.scale = 5``).

    Pickled in place of the class: on replay the attributes are set on the
    live class of that name (the one its instances made by plain cells are
    instances of), after checking that class is the one the step changed
    (``fingerprint``, taken before the step; None when the plan checks it).
    """

    def __init__(
        self, name: str, fingerprint: str | None, attrs: dict[str, Any], removed: list[str]
    ) -> None:
        self.name, self.fingerprint, self.attrs, self.removed = name, fingerprint, attrs, removed

    def __reduce__(self) -> Any:
        return _patch_class, (self.name, self.fingerprint, self.attrs, self.removed)


def _patch_class(name: str, fingerprint: str | None, attrs: dict, removed: list[str]) -> type:
    live = resolve(live_namespace() or {}, (name,))
    if not isinstance(live, type) or (
        fingerprint is not None and ref_fingerprint(live) != fingerprint
    ):
        raise NotExact(f"class {name} is not the class the step changed")
    for key, value in attrs.items():
        setattr(live, key, value)
    for key in removed:
        if key in vars(live):
            delattr(live, key)
    return live


# -- numpy -------------------------------------------------------------------------------


def reduce_array(obj: Any) -> Any:
    """A reduction for an exact ``numpy.ndarray`` that keeps views and bases, or None."""
    np = sys.modules.get("numpy")
    if np is None or type(obj) is not np.ndarray or obj.dtype.hasobject:
        return None
    try:
        base = obj.base
        if type(base) is np.ndarray and not base.dtype.hasobject and _contiguous(base):
            offset = obj.__array_interface__["data"][0] - base.__array_interface__["data"][0]
            return _view, (base, obj.dtype, obj.shape, obj.strides, offset, obj.flags.writeable)
        if not _contiguous(obj):
            return None
        order = "C" if obj.flags.c_contiguous else "F"
        # As bytes: a buffer cannot carry every dtype (datetime64 is refused).
        raw = pickle.PickleBuffer(_bytes_of(obj))
        return _array, (raw, obj.dtype, obj.shape, order, obj.flags.writeable)
    except Exception:  # numpy's own reduction copies, but never fails where this did
        return None


def _bytes_of(a: Any) -> Any:
    """The memory of a contiguous array as a flat uint8 view of it (no copy)."""
    import numpy as np

    return a.ravel(order="K").view(np.uint8)


def _contiguous(a: Any) -> bool:
    return bool(a.flags.c_contiguous or a.flags.f_contiguous)


def _array(buf: Any, dtype: Any, shape: tuple[int, ...], order: str, writeable: bool) -> Any:
    import numpy as np

    mem = memoryview(buf)  # not an ndarray: views of the result keep it as their base
    if mem.readonly and writeable:
        mem = memoryview(bytearray(mem))
    arr = np.ndarray(shape, dtype, buffer=mem.cast("B") if mem.nbytes else None, order=order)
    if not writeable:
        arr.flags.writeable = False
    return arr


def _view(
    base: Any, dtype: Any, shape: tuple[int, ...], strides: tuple[int, ...], off: int, w: bool
) -> Any:
    import numpy as np

    # Through bytes of the base (it may be of a dtype no buffer can carry); the
    # view's base is still ``base``: numpy collapses the chain to it.
    view = np.ndarray(shape, dtype, buffer=_bytes_of(base), offset=off, strides=strides)
    if not w:
        view.flags.writeable = False
    return view


# -- torch -------------------------------------------------------------------------------


def storage_of(obj: Any) -> Any:
    """The storage of a dense CPU torch tensor (exactly ``Tensor`` or ``Parameter``), or None.

    torch gives back the same storage object for as long as its memory lives,
    so it is found by identity like any object of the namespace.
    """
    torch = sys.modules.get("torch")
    if torch is None or type(obj) not in (torch.Tensor, torch.nn.Parameter):
        return None
    try:
        if obj.layout != torch.strided or obj.device.type != "cpu" or obj.is_quantized:
            return None
        return obj.untyped_storage()
    except Exception:  # a tensor without storage (a functional or fake one)
        return None


def reduce_tensor(obj: Any) -> Any:
    """A reduction for an exact dense CPU ``torch.Tensor`` on its storage object, or None.

    torch's own reduction, with its storage argument (a ``TypedStorage``
    made afresh for each tensor) replaced by the tensor's storage, which
    the pickler then writes once (:func:`reduce_storage`) or as a reference.
    A tensor torch reduces otherwise (a subclass, one with attributes of its
    own, one with a graph) keeps torch's reduction.
    """
    torch = sys.modules.get("torch")
    if torch is None or type(obj) is not torch.Tensor or not obj.is_leaf:
        return None
    if obj.grad is not None or storage_of(obj) is None:
        return None  # a gradient: written with it (see values._tensor_with_grad)
    try:
        reduced = obj.__reduce_ex__(5)
        fn, args = reduced[0], reduced[1]
        if len(reduced) != 2 or fn is not torch._utils._rebuild_tensor_v2:
            return None
        typed = args[0]
        if type(typed) is not torch.storage.TypedStorage:
            return None
        return _tensor, (typed._untyped_storage, typed.dtype, *args[1:])
    except Exception:  # torch's own reduction says why, if anything
        return None


def _tensor(storage: Any, dtype: Any, *args: Any) -> Any:
    import torch

    typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
    return torch._utils._rebuild_tensor_v2(typed, *args)


def reduce_storage(obj: Any) -> Any:
    """A reduction for a CPU ``torch.UntypedStorage``: its memory out of band, or None."""
    torch = sys.modules.get("torch")
    if torch is None or type(obj) is not torch.UntypedStorage or sys.modules.get("numpy") is None:
        return None
    try:
        if obj.device.type != "cpu":
            return None
        return _storage, (pickle.PickleBuffer(storage_bytes(obj)),)
    except Exception:  # torch's own reduction (torch.save's bytes)
        return None


def storage_bytes(storage: Any) -> Any:
    """The memory of a CPU storage as a numpy uint8 array (no copy)."""
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def _storage(buf: Any) -> Any:
    import numpy as np
    import torch

    mem = memoryview(buf).cast("B")
    # A storage of its own (resizable, as torch's own loads are), filled with the bytes.
    out = torch.UntypedStorage(mem.nbytes)
    if mem.nbytes:
        storage_bytes(out)[:] = np.frombuffer(mem, np.uint8)
    return out
