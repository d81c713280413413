"""Turning variables into bytes and back.

Values are pickled with cloudpickle, which saves functions and classes
defined in the notebook (module ``__main__``) by value, so they come back
after a restart. A notebook class is saved as "the class of that name in the
namespace, if it has the same fingerprint, else this copy of it": after a
restart, the cell that defines ``class Finding`` runs again, and a replayed
``Finding`` instance must be an instance of *that* class (``isinstance``,
dataclass ``==``), not of a private copy. Modules are never pickled: they are
recorded by name and re-imported. Anything that cannot be pickled (an open
client, a socket, a generator) is reported, never silently dropped.

Deep values. The pickler recurses on the C stack once per nesting level, and
CPython bounds that recursion only by ``sys.getrecursionlimit()``: code that
raises the limit (as code building deep linked structures must) would let
the pickler run off the end of the thread's stack and kill the process. So
above the default limit, pickling and unpickling run on a helper thread whose
stack is sized for the limit (see :func:`_deep_safe`); a value deeper than
the limit is then reported unsaveable, as it is at the default limit.

Restorable values. A pickle can be written and still never load in a fresh
kernel: an object pickled *by name* from the notebook (``__main__.f``, which
is how a ``functools.lru_cache`` function is pickled) is looked up on load,
and if the step itself defines that name it does not exist yet when the step
is replayed; and a notebook class's own ``__reduce__``/``__setstate__`` may
not round-trip. :func:`restore_problem` finds such pickles when they are
written (for values that involve notebook code), by loading small ones back
and by scanning the names large ones refer to, so the step is marked not
replayable once, at record time.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import copyreg
import gc
import importlib
import io
import pickle
import pickletools
import re
import sys
import threading
import types
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import cloudpickle

from ..hush import hush
from ..identity import keys, localcode, reduction
from . import libfix, sharing

PROTOCOL = 5


#: Types pickled by plain pickle exactly as by cloudpickle (no code, no classes inside).
_PLAIN = frozenset((str, bytes, int, float, bool, type(None)))


class Unsaveable(Exception):
    """A value could not be pickled; the message says why."""


#: Up to this recursion limit, pickling runs on the calling thread. One level
#: of pickle recursion takes about 170 bytes of C stack (CPython 3.11, x86-64:
#: a 200,000-node chain is 600,000 levels), so even a 512 KB thread stack holds it.
INLINE_LIMIT = 3000
#: C stack reserved per level of recursion limit on the helper thread: about
#: three times what was measured, for types whose reduction takes more.
STACK_PER_LEVEL = 512
#: Largest helper-thread stack. Only the pages a deep value touches become
#: memory; the rest is address space. Above ``MAX_STACK / STACK_PER_LEVEL``
#: levels the recursion limit is lowered to that while the helper runs.
MAX_STACK = 1 << 30
#: Room for the Python code a level runs (a ``__reduce__``, cloudpickle).
_STACK_MARGIN = 32 * 1024 * 1024
_stack_lock = threading.Lock()  # one helper at a time: it sets process-wide state
_HELPER = "nbdurable-pickle"


def _deep_safe(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` hushed (see :mod:`nbdurable.hush`: the objects' own pickling code
    may warn or log, which a plain run never shows), deep enough (:func:`_deep`).
    """
    return _deep(_hushed, fn, *args)


def _hushed(fn: Any, *args: Any) -> Any:
    with hush():
        return fn(*args)


def _load_hushed(fn: Any, *args: Any) -> Any:
    """A load: :func:`_deep_safe`, its prints dropped too (see :func:`nbdurable.hush.hush`)."""
    return _deep(_hushed_streams, fn, *args)


def _hushed_streams(fn: Any, *args: Any) -> Any:
    with hush(streams=True):
        return fn(*args)


def _deep(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, on a helper thread with a stack sized for the recursion limit if raised.

    At or below :data:`INLINE_LIMIT` it simply runs here. Above, the calling
    thread waits for a thread whose stack holds ``limit`` levels of pickle
    recursion, so a value nested deeper than the stack allows raises
    ``RecursionError`` instead of overrunning the stack. The process-wide
    ``threading.stack_size`` is restored at once (it only affects threads
    started meanwhile), and the recursion limit, if it had to be lowered,
    when the helper is done. The helper runs in a copy of the caller's context.
    """
    limit = sys.getrecursionlimit()
    if limit <= INLINE_LIMIT or threading.current_thread().name == _HELPER:
        return fn(*args)  # (a helper's own nested pickling runs on its large stack)
    levels = min(limit, (MAX_STACK - _STACK_MARGIN) // STACK_PER_LEVEL)
    box: dict[str, Any] = {}
    ctx = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = ctx.run(fn, *args)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    with _stack_lock:
        previous = threading.stack_size()
        try:
            # A whole number of 64 KiB: some platforms take only multiples of their page size.
            threading.stack_size(-(-(levels * STACK_PER_LEVEL + _STACK_MARGIN) // 65536) * 65536)
            thread = threading.Thread(target=run, name=_HELPER, daemon=True)
            lowered = levels < limit
            if lowered:  # a limit no stack we start could hold: hold what we can
                sys.setrecursionlimit(levels)
            try:
                thread.start()
                thread.join()
            except KeyboardInterrupt:
                # An interrupted helper is left to finish in the background (its
                # result is dropped), unless the limit was lowered for it: raising
                # the limit again under it could let it overrun its stack.
                while lowered and thread.is_alive():
                    with contextlib.suppress(KeyboardInterrupt):
                        thread.join()
                raise
            finally:
                if lowered:
                    sys.setrecursionlimit(limit)
        finally:
            threading.stack_size(previous)
    if "error" in box:
        raise box.pop("error")
    return box.get("value")


def dumps(value: Any) -> bytes:
    """Pickle ``value``; raise :class:`Unsaveable` with the reason if it cannot be."""
    if type(value) in _PLAIN:  # the common result of a model call: no cloudpickle set-up
        return pickle.dumps(value, PROTOCOL)
    try:
        return _deep_safe(_dump, value, None)[0]
    except RecursionError as exc:
        raise Unsaveable(f"too deeply nested to pickle ({exc})") from exc
    except Exception as exc:  # pickling runs arbitrary __reduce__ code
        raise Unsaveable(f"{type(exc).__name__}: {exc}") from exc


def _dump(value: Any, keep: Any) -> tuple[bytes, bool, bool]:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, protocol=PROTOCOL, buffer_callback=keep)
    pickler.top = value
    pickler.dump(value)
    return buffer.getvalue(), pickler.plain, pickler.notebook


def dumps_parts(value: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``value`` keeping large raw memory out of band: ``(stream, buffers)``.

    The buffers are views of the value's own memory (a numpy array's data,
    a bytearray), not copies; :func:`loads` takes them back. Raises
    :class:`Unsaveable` like :func:`dumps`.
    """
    got = dump_value(value)
    return got.stream, got.buffers


#: Exactly these types (and str, bytes, int, float, bool, None, which the
#: pickler writes without asking) make a value *plain data*.
_PLAIN_CONTAINERS = frozenset((list, dict, tuple, set, frozenset, bytearray))

#: The process's synchronization inside an object: a lock, a re-entrant lock or a
#: thread-local store an object holds (a SQLite checkpointer's lock, a session's
#: per-thread connections) is written as a new one, as the object's constructor makes it
#: (a lock held stays held; a re-entrant lock held, or a thread-local holding values in
#: this thread, cannot be saved). Without this, such an object could not be saved at all,
#: and a step that only used it (a checkpointer's first write sets its `is_setup`) ran
#: its body again on replay, writing its rows to the checkpointer's file a second time.
#: A variable that is itself a lock is the notebook's own coordination of threads a
#: replay does not start again: not saved (see _Pickler.top).
_SYNC = frozenset((type(threading.Lock()), type(threading.RLock()), threading.local))


def _sync_reduce(obj: Any, t: type) -> tuple:
    if t is threading.local:
        if vars(obj):
            raise pickle.PicklingError("a threading.local holding values in this thread")
        return threading.local, ()
    if t is type(threading.Lock()):
        return (_held_lock, ()) if obj.locked() else (threading.Lock, ())
    if obj._is_owned():  # an RLock held: by whom and how often is not ours to remake
        raise pickle.PicklingError("a re-entrant lock that is held")
    return threading.RLock, ()


def _held_lock() -> Any:
    lock = threading.Lock()
    lock.acquire()
    return lock


class Pickled(NamedTuple):
    """A value pickled by :func:`dump_value`."""

    stream: bytes
    buffers: list[memoryview]  # out-of-band views of the value's own memory
    #: Builtin containers of builtin scalars, nothing else (no subclass, no
    #: class, no function, no array): what :func:`keys.fingerprint` sees completely.
    plain: bool
    #: Holds an object, class or function defined in the notebook (``__main__``).
    notebook: bool


def _out_of_band() -> tuple[list[memoryview], Callable[[pickle.PickleBuffer], bool]]:
    """A list, and the pickler's ``buffer_callback`` that keeps buffers out of band in it."""
    buffers: list[memoryview] = []

    def keep(pb: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(pb.raw())
        except BufferError:  # not contiguous: pickle copies it in band
            return True
        return False

    return buffers, keep


def dump_value(value: Any) -> Pickled:
    """:func:`dumps_parts`, and what the value is made of (see :class:`Pickled`).

    The pickler asks ``reducer_override`` about every object but atoms,
    strings and bytes, so both answers are exact and cost a lookup or two
    per object.
    """
    buffers, keep = _out_of_band()
    value = _out_of_band_items([value], ())[0]
    try:
        stream, plain, notebook = _deep_safe(_dump, value, keep)
        return Pickled(stream, buffers, plain and not buffers, notebook)
    except RecursionError as exc:
        raise Unsaveable(f"too deeply nested to pickle ({exc})") from exc
    except Exception as exc:  # pickling runs arbitrary __reduce__ code
        raise Unsaveable(f"{type(exc).__name__}: {exc}") from exc


#: A ``bytes`` or ``bytearray`` value at least this large is written out of
#: band, as an array's memory is: the pickler would copy it into the stream.
BYTES_OUT_OF_BAND = 64 * 1024


class _BytesOutOfBand:
    """A large ``bytes`` or ``bytearray`` item, pickled as ``type(<its buffer>)``.

    CPython's pickler writes both types itself, in band, without asking
    ``reducer_override``; an item wrapped in this is asked about, and its
    memory goes to the buffer callback as a view, not a copy. It loads back as
    its own type (one copy, from the blob's mapping into the new object).
    """

    __slots__ = ("value",)

    def __init__(self, value: bytes | bytearray) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: Any) -> tuple[type, tuple[pickle.PickleBuffer]]:
        return type(self.value), (pickle.PickleBuffer(self.value),)


def _out_of_band_items(items: list[Any], keep_as_is: Container[int]) -> list[Any]:
    """``items`` with each large ``bytes``/``bytearray`` wrapped (see :class:`_BytesOutOfBand`).

    Not those whose ids are in ``keep_as_is`` (written as references to where
    they live, or restored in place). One wrapper per object, so a value bound
    to two names is written once and loads back as one object.
    """
    wrapped: dict[int, _BytesOutOfBand] = {}
    out = []
    for item in items:
        if (
            type(item) in (bytes, bytearray)
            and len(item) >= BYTES_OUT_OF_BAND
            and id(item) not in keep_as_is
        ):
            item = wrapped.setdefault(id(item), _BytesOutOfBand(item))
        out.append(item)
    return out


class Joint(NamedTuple):
    """Values pickled together by :func:`dump_values`: one stream, one memo."""

    stream: bytes
    buffers: list[memoryview]
    #: per value: (end of its pickle in ``stream``, end of its buffers, plain, notebook)
    parts: list[tuple[int, int, bool, bool]]


class PartFailed(Unsaveable):
    """The value at ``index`` could not be pickled (the message says why)."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index = index


def dump_values(
    items: list[Any],
    find_refs: Callable[[dict[int, Any]], dict[int, tuple[sharing.Path, Any]]] | None = None,
    ref_fp: Callable[[sharing.Path, Any], str | None] | None = None,
    in_place: Mapping[int, str] | None = None,
    standins: tuple[str, ...] = (),
    known_refs: Mapping[int, tuple[sharing.Path, Any]] | None = None,
) -> Joint:
    """Pickle ``items`` one after the other with one pickler, so they share its memo.

    An object two items hold is written once and loads back as one object.
    ``find_refs(ids)`` returns, of the objects whose ids are given (the keys
    of a dict made for the call: those the pickle holds), the ones that live
    elsewhere, as ``id -> (path, obj)``:
    each is written as a reference to where it lives (see
    :mod:`nbdurable.store.sharing`) carrying ``ref_fp(path, obj)``.
    ``in_place`` maps the ids of items changed in place to their names: each
    loads into the live object of its name where a replay offers one (see
    :func:`sharing.in_place`); ``standins`` are the names ``ref_fp`` let stand in
    (see :func:`sharing.in_place_standins`), written with each reference that
    carries a fingerprint. ``known_refs`` are objects known beforehand to live
    elsewhere, as ``find_refs`` would name them (the other variables' own
    values, see :func:`sharing.top_level`): written as references from the
    first pass, so a step whose values only share those (instances of a
    notebook class) is pickled once. Raises :class:`PartFailed` naming the first
    item that cannot be pickled (the caller pickles the others again without
    it: a failed item leaves the memo half written).
    """
    buffers, keep = _out_of_band()
    last: list[_Pickler] = []  # the pickler of the latest pass, kept if its dump fails

    def run(cls: type[_Pickler]) -> tuple[Joint, Any]:
        del buffers[:]
        wrapped[:] = _out_of_band_items(items, {*refs, *(in_place or ())})
        out = io.BytesIO()
        pickler = cls(out, protocol=PROTOCOL, buffer_callback=keep)
        pickler.refs, pickler.ref_fp, pickler.standins = refs, ref_fp, standins
        if in_place:
            pickler.in_place = in_place
        last[:] = [pickler]
        parts = []
        so_far = True  # every part before this one is plain data
        for i, item in enumerate(wrapped):
            pickler.plain, pickler.notebook = True, False
            pickler.top = item
            n = len(buffers)
            try:
                pickler.dump(item)
            except RecursionError as exc:
                raise PartFailed(i, f"too deeply nested to pickle ({exc})") from exc
            except Exception as exc:  # pickling runs arbitrary __reduce__ code
                raise PartFailed(i, f"{type(exc).__name__}: {exc}") from exc
            # An object an earlier part wrote is not looked at again (a memo
            # hit): it is plain data only if every earlier part was, so a part
            # is plain only if all before it are (load_values reads it back
            # under the same rule; callers put likely plain values first).
            so_far = so_far and pickler.plain and len(buffers) == n
            parts.append((out.tell(), len(buffers), so_far, pickler.notebook))
        return Joint(out.getvalue(), list(buffers), parts), pickler

    # First without references: asking about every object (persistent_id) costs
    # a Python call per object, five times the pickling of a list of ints. Only if
    # an object it wrote (every object but atoms is in its memo) lives elsewhere
    # is the stream written again, with references.
    #
    # A pass that fails is not the end either: what it could not write may lie
    # inside an object that lives elsewhere (a compiled agent graph whose node
    # function reads the notebook's model client: the client, pickled by value
    # as the function's global, holds a lock). The failed pass's memo holds the
    # objects written up to the failure, the client among them; if any lives
    # elsewhere, the values are written again with references.
    refs: dict[int, tuple[sharing.Path, Any]] = {}
    # Only references the pickler meets through reducer_override: a known list
    # or dict would need persistent_id, a Python call per object (see below).
    for key, got in (known_refs or {}).items():
        if type(got[1]) not in _NO_OVERRIDE:
            refs[key] = got
    searched = False  # refs hold what find_refs found: the next pass is the last
    wrapped: list[Any] = []  # the items as this pass writes them (see _out_of_band_items)
    cls: type[_Pickler] = _RefReducer if refs else _Pickler
    while True:
        try:
            joint, pickler = _deep_safe(run, cls)
        except PartFailed as exc:
            if find_refs is None:
                raise
            failed, pickler = exc, last[0]
        else:
            failed = None
            if find_refs is None or searched:
                return joint
        del last[:]
        # The ids of what the pass wrote, as the keys of a copy of its memo: the
        # copy makes a tuple per object, a million for a large step, and with the
        # collector on each thousand of them would set off a collection walking
        # all the rest (four times the copy itself). They hold no cycle, and are
        # freed by reference counting once the search is done.
        paused = gc.isenabled()
        gc.disable()
        try:
            held: dict[int, Any] = pickler.memo.copy()
            # a wrapped bytearray is not in the memo (its buffer is): it may live elsewhere
            held.update((id(w.value), None) for w in wrapped if type(w) is _BytesOutOfBand)
            if failed is not None and pickler.asked is not None:
                # What a failed pass failed on is not in its memo, and may live
                # elsewhere itself: a SQLite checkpointer's connection, made in a
                # plain cell and bound to a name there, is written as a reference.
                held[id(pickler.asked)] = None
            del pickler
            found = {k: v for k, v in find_refs(held).items() if k not in refs}
            del held
        finally:
            if paused:
                gc.enable()
        if not found:
            if failed is not None:
                raise failed
            return joint
        refs.update(found)
        searched = True
        # A reference to a list, dict, str... must be asked about (persistent_id):
        # the pickler writes those types without calling reducer_override. Any
        # other (a class, a function, an instance) can be written from
        # reducer_override, which the pickler calls only for such objects.
        slow = any(type(obj) in _NO_OVERRIDE for _, obj in refs.values())
        cls = _RefPickler if slow else _RefReducer


class PartUnloadable(Exception):
    """The value at ``index`` of a :func:`dump_values` stream did not load (``cause``)."""

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.index = index
        self.cause = cause


def load_values(
    data: bytes | memoryview,
    count: int,
    namespace: dict[str, Any] | None = None,
    buffers: list[memoryview] | None = None,
) -> list[tuple[Any, bool]]:
    """The ``count`` values of a :func:`dump_values` stream, each with its plainness.

    References resolve in ``namespace`` and are checked against their
    recorded fingerprints (:class:`sharing.NotExact` if one differs); with no
    namespace they load as placeholder strings (for an export).
    """
    token = sharing.load_namespace.set(namespace)
    try:
        used = [0]  # out-of-band buffers taken so far

        def taken() -> Iterator[memoryview]:
            for buf in buffers or ():
                used[0] += 1
                yield buf

        unpickler = _Unpickler(io.BytesIO(data), buffers=taken())
        unpickler.live = namespace

        def run() -> list[tuple[Any, bool]]:
            out = []
            so_far = True  # the rule of dump_values: plain if every earlier part was
            for i in range(count):
                unpickler.plain, before = True, used[0]
                try:
                    value = unpickler.load()
                except Exception as exc:  # unpickling runs arbitrary code; imports modules
                    raise PartUnloadable(i, exc) from exc
                so_far = so_far and unpickler.plain and used[0] == before
                out.append((value, so_far))
            if unpickler.resolved:
                sharing.relink(unpickler.memo.copy().values())
            return out

        try:
            return _load_hushed(run)
        finally:
            _release(unpickler)
    finally:
        sharing.load_namespace.reset(token)


def _release(unpickler: pickle.Unpickler) -> None:
    """Empty ``unpickler``'s memo once its loads are done.

    The memo holds every object loaded and every global looked up, among them
    functions that refer back to the unpickler (the closures and bound methods
    ``find_class`` returns for a reference or a notebook class): a cycle
    through the unpickler, which holds its out-of-band buffers. Python
    3.11.2's collector does not free it (3.11.7's does, at the next collection),
    so a recorded or replayed array stayed in memory, or its blob file mapped,
    after the notebook deleted it. Emptied, the memo ends the cycle, and the
    unpickler and what it loaded go when the last reference does.
    """
    with contextlib.suppress(Exception):
        unpickler.memo.clear()


def loads(
    data: bytes | memoryview,
    namespace: dict[str, Any] | None = None,
    buffers: list[memoryview] | None = None,
) -> Any:
    """Unpickle bytes that were verified by the store (with their out-of-band buffers).

    Notebook classes resolve to the same-named classes of ``namespace`` when
    their fingerprints match (see the module docstring).
    """
    return load_value(data, namespace, buffers)[0]


def load_value(
    data: bytes | memoryview,
    namespace: dict[str, Any] | None = None,
    buffers: list[memoryview] | None = None,
) -> tuple[Any, bool]:
    """:func:`loads`, and whether the value is plain data (see :func:`dump_value`).

    Every object that is not plain data is rebuilt through a global (a
    class, a function) the unpickler looks up with ``find_class``, or on an
    out-of-band buffer: a load that did neither made plain data.
    """
    token = sharing.load_namespace.set(namespace)
    try:
        unpickler = _QuietUnpickler(io.BytesIO(data), buffers=buffers or ())
        try:
            return _deep(_quiet_load, unpickler), unpickler.plain and not buffers
        finally:
            _release(unpickler)
    finally:
        sharing.load_namespace.reset(token)


def _quiet_load(unpickler: _QuietUnpickler) -> Any:
    """``unpickler.load()``, hushed as :func:`_load_hushed` hushes from the first code
    it could run; on the thread that loads (see :func:`_deep`), as the hush is per thread.
    """
    try:
        return unpickler.load()
    finally:
        unpickler.quiet.close()


class _Unpickler(pickle.Unpickler):
    """An unpickler that notes whether it looked up any global, and resolves references."""

    plain = True
    #: Where references (see :mod:`sharing`) are resolved; None: they load as placeholders.
    live: dict[str, Any] | None = None
    resolved = False  # a reference resolved to a live object (see sharing.relink)
    check = True  # compare a reference's fingerprint with the recorded one

    def find_class(self, module: str, name: str) -> Any:
        self.plain = False
        found = super().find_class(module, name)
        if found is _ref:  # written by _RefReducer: the same as a persistent id
            return lambda *pid: self.persistent_load(pid)
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) in (3, 4) and pid[0] == sharing.TAG):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        self.plain = False
        path, fp = pid[1], pid[2]
        if self.live is None:
            return f"<the object at {sharing.describe(path)}>"
        obj = sharing.resolve(self.live, path)
        self.resolved = True
        if self.check and fp is not None:
            standins = sharing.in_place_standins(self.live, pid[3]) if len(pid) == 4 else None
            if sharing.ref_fingerprint(obj, standins) != fp:
                raise sharing.NotExact(f"{sharing.describe(path)} is not the object it was")
        return obj


#: Pickles whose stream (not counting out-of-band buffers, which a load
#: reuses without copying) is at most this large are loaded back once when written.
TRIAL_MAX = 2 * 1024 * 1024


def restore_problem(
    pickled: Pickled,
    produced: Iterable[str],
    namespace: dict[str, Any] | None = None,
    count: int = 1,
) -> str | None:
    """Why this pickle would not restore on replay, or None if it would.

    Only pickles that involve the notebook's own code are looked at (an
    object, class or function defined in the notebook, or a reference by
    name to ``__main__``): a library's types are trusted to round-trip.
    Such a pickle, if its stream is at most :data:`TRIAL_MAX` bytes, is
    loaded back and the copy dropped: any error it raises now, it would
    raise on replay (the notebook's own ``__setstate__``/``__reduce__`` code
    runs once more, as replay would run it). The trial is given up, and
    the pickle only scanned, as soon as it needs a global outside the
    notebook, the standard library's data types, numpy and pandas: loading
    other libraries' objects may have side effects (a matplotlib figure
    registers itself with pyplot, and would be shown). Either way the names
    it refers to in the notebook (``__main__.X``) are checked: one that the
    step itself binds (``produced``) is not defined yet when the step is
    replayed in a fresh kernel, or is an older object of that name.
    ``count`` is how many pickles the stream holds (see :func:`dump_values`).
    """
    stream = pickled.stream
    if not pickled.notebook and b"__main__" not in stream:
        return None
    refs: list[str] | None = None
    if len(stream) <= TRIAL_MAX:
        token = sharing.load_namespace.set(namespace)
        unpickler = _TrialUnpickler(io.BytesIO(stream), buffers=pickled.buffers)
        try:
            for _ in range(count):
                _load_hushed(unpickler.load)
            refs = unpickler.main_refs
        except _Untried:
            pass
        except Exception as exc:  # whatever loading would raise on replay
            return f"it does not load back ({type(exc).__name__}: {exc})"
        finally:
            _release(unpickler)
            sharing.load_namespace.reset(token)
    own = set(produced)
    if refs is None:  # too large to load twice, or not ours to load: read its names
        if not _may_name(stream, own):
            return None
        refs = _main_refs(stream)
    for ref in refs:
        if ref.split(".", 1)[0] in own:
            return (
                f"it is saved by reference to __main__.{ref}, which this step defines, "
                "so replay cannot find it"
            )
    return None


#: Modules whose objects a trial load may build: the notebook's, nbdurable's
#: and cloudpickle's rebuilding functions, and data types known to load without
#: side effects (first dotted part).
_TRIAL_MODULES = frozenset(
    (
        "__main__", "builtins", "copyreg", "_codecs", "cloudpickle", "nbdurable", "types",
        "collections", "functools", "operator", "datetime", "decimal", "fractions", "enum",
        "uuid", "pathlib", "re", "array", "numpy", "pandas",
    )
)  # fmt: skip


class _Untried(Exception):
    """A trial load was given up: the pickle needs a global it should not build."""


class _QuietUnpickler(_Unpickler):
    """An unpickler that enters the hush (:func:`nbdurable.hush.hush`, streams too) at
    the first global it looks up or reference it resolves.

    Only those run code: a class's ``__setstate__`` or ``__reduce__`` callable, a
    reference's fingerprint hook, all come through :meth:`find_class` or
    :meth:`persistent_load` first, and plain data (text, numbers, lists and dicts of
    them: a sub-step's usual result) prints and warns nothing. Such a load skips
    the hush, which costs several times the load itself. :func:`_quiet_load` leaves it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.quiet = contextlib.ExitStack()
        self.hushed = False

    def _hush(self) -> None:
        if not self.hushed:
            self.hushed = True
            self.quiet.enter_context(hush(streams=True))

    def find_class(self, module: str, name: str) -> Any:
        self._hush()
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        self._hush()
        return super().persistent_load(pid)


class _TrialUnpickler(_Unpickler):
    """An unpickler that notes the notebook names (``__main__.X``) it looks up.

    A notebook class loads as the live class here (see :func:`_live_class`),
    but as its saved copy in a fresh kernel that lacks it: the names the copy
    refers to count too (a ``functools.cache`` method refers to
    ``__main__.Class.method``).
    """

    check = False  # a trial resolves references but does not fingerprint them

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.main_refs: list[str] = []
        self.live = sharing.load_namespace.get()

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".", 1)[0] not in _TRIAL_MODULES:
            raise _Untried(module)
        if module == "__main__":
            self.main_refs.append(name)
        found = super().find_class(module, name)
        if found is _live_class:
            return self._live_class
        if found is sharing._patch_class:  # a trial changes no class: the live one is it
            return lambda name, *_: (self.live or {}).get(name)
        return found

    def _live_class(self, qualname: str, fingerprint: str, copy: bytes) -> type:
        self.main_refs += _main_refs(copy)
        return _live_class(qualname, fingerprint, copy)


_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_BYTES = {"SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}


_STRING_START = rb"(?:\x8c.|X.{4}|\x8d.{8}|[\nV])"


def _may_name(stream: bytes, names: Iterable[str]) -> bool:
    """False only if no ``__main__`` reference in ``stream`` can start with one of ``names``.

    Reading a pickle's opcodes (:func:`_main_refs`) runs in Python, about a
    second per million objects; this is a byte search in C. A reference to
    ``__main__.X`` or ``__main__.X.attr`` holds ``X`` as the start of a string
    that the pickle writes whole (after its length, or after a newline in
    protocol 0's ``GLOBAL``), nested class copies included: where no name
    appears in any such place, no reference can name it.
    """
    for name in names:
        raw = name.encode("utf-8", "surrogatepass")
        # Before the name: 0x8c and a 1-byte length (SHORT_BINUNICODE), "X" and 4
        # (BINUNICODE), 0x8d and 8 (BINUNICODE8), a newline (GLOBAL, INST) or "V"
        # (UNICODE). Any length bytes will do: a superset is enough.
        if raw in stream and re.search(_STRING_START + re.escape(raw), stream, re.DOTALL):
            return True
    return False


def _main_refs(stream: bytes) -> list[str]:
    """``X`` for every ``__main__.X`` global in a pickle stream, read without loading it.

    ``STACK_GLOBAL`` takes the module and name the two pushes before it left
    (literal strings or memo reads of them), which is how pickle writes it.
    A stream of several pickles (see :func:`dump_values`) is read to its end.
    """
    refs: list[str] = []
    memo: dict[int, str | None] = {}
    pushed: list[str | None] = [None, None]
    data = io.BytesIO(stream)
    try:
        while data.tell() < len(stream):  # one pickle after the other (see dump_values)
            for op, arg, _pos in pickletools.genops(data):
                name = op.name
                if name in _STRINGS:
                    pushed = [pushed[-1], arg]
                elif name in _GETS:
                    pushed = [pushed[-1], memo.get(arg)]
                elif name == "MEMOIZE":
                    memo[len(memo)] = pushed[-1]
                elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                    memo[arg] = pushed[-1]
                elif name == "STACK_GLOBAL":
                    if pushed[0] == "__main__" and pushed[1] is not None:
                        refs.append(pushed[1])
                    pushed = [None, None]
                elif name in ("GLOBAL", "INST"):
                    module, _, attr = str(arg).partition(" ")
                    if module == "__main__":
                        refs.append(attr)
                elif name in _BYTES and arg[:1] == b"\x80" and b"__main__" in arg:
                    refs += _main_refs(arg)  # a notebook class's saved copy (see _live_class)
                    pushed = [pushed[-1], None]
                elif name not in ("FRAME", "PROTO"):
                    pushed = [pushed[-1], None]
    except Exception:  # a stream we just wrote always parses; never fail the record on it
        return refs
    return refs


class _Pickler(cloudpickle.Pickler):
    plain = True  # see Pickled
    notebook = False
    #: id -> variable name of the values restored in place (see sharing.in_place)
    in_place: Mapping[int, str] = {}
    #: id -> (path, object) of objects written as references (see sharing)
    refs: dict[int, tuple[sharing.Path, Any]] | None = None
    ref_fp: Any = None  # (path, object) -> the fingerprint a reference carries, or None
    asked: Any = None  # see reducer_override
    top: Any = None  # the value being dumped (see _SYNC)
    #: the names whose objects stand in in a reference's fingerprint (see sharing.in_place_standins)
    standins: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # cloudpickle's reducers over copyreg's, as one dict made now: its
        # ChainMap of the two is looked up by the C pickler for every object it
        # reduces (a Python call and a KeyError each, a third of pickling a
        # million instances). Made per pickler, so copyreg's registrations
        # until now count, as they would through the ChainMap.
        table = type(self).dispatch_table
        if isinstance(table, collections.ChainMap):
            self.dispatch_table = {k: v for m in reversed(table.maps) for k, v in m.items()}
        super().__init__(*args, **kwargs)
        self.usual: dict[type, bool] = {}  # type -> _usual(type), for this pickler's dumps

    def reference(self, got: tuple[sharing.Path, Any], obj: Any) -> tuple | None:
        """The persistent id of ``obj``, found as ``got`` in ``refs`` (None: an id reused)."""
        if got[1] is not obj:
            return None
        self.plain = False
        fp = self.ref_fp(*got) if self.ref_fp else None
        if fp is None or not self.standins:
            return (sharing.TAG, got[0], fp)
        return (sharing.TAG, got[0], fp, self.standins)

    def reducer_override(self, obj: Any) -> Any:
        self.asked = obj  # the last object asked about: the one a failed pass failed on
        t = type(obj)
        # An instance of a type no rule below is about (a notebook class's or a
        # library's plain object) is pickled the default way: answered from one
        # lookup per type, since a step may hold a million of them. Per pickler,
        # so a class changed between records is looked at again.
        usual = self.usual.get(t)
        if usual is None:
            usual = self.usual[t] = _usual(t)
        if usual and id(obj) not in self.in_place:
            self.plain = False
            if t.__module__ == "__main__":
                self.notebook = True
            return NotImplemented
        if t is types.CodeType:
            return _code_reduce(obj)
        reduced = None
        if self.refs is not None:  # values pickled together: views and storages kept
            reduced = sharing.reduce_array(obj)
            if reduced is None and type(obj).__module__.startswith("torch"):
                reduced = sharing.reduce_tensor(obj) or sharing.reduce_storage(obj)
        if reduced is None and self.in_place:
            name = self.in_place.get(id(obj))
            reduced = _in_place_reduce(obj, name) if name is not None else None
        if reduced is not None:
            self.plain = False
            return _with_fields_set(reduced) if _restores_fields_set(t) else reduced
        if t not in _PLAIN_CONTAINERS:
            self.plain = False
            if t.__module__ == "__main__" or (
                (t is types.FunctionType or isinstance(obj, type)) and obj.__module__ == "__main__"
            ):
                self.notebook = True
        if (
            isinstance(obj, type)
            and obj.__module__ == "__main__"
            and "<locals>" not in obj.__qualname__
        ):
            copy = _class_copy(obj)
            return _live_class, (obj.__qualname__, keys.fingerprint(obj), copy)
        if isinstance(obj, type) and "__slots__" in vars(obj):
            reduced = _slots_class_reduce(obj)
            if reduced is not None:
                return reduced
        if isinstance(obj, BaseException):
            return _reduce_exception(obj)
        if t in _SYNC and obj is not self.top:
            return _sync_reduce(obj, t)
        if t is object:
            got = _module_sentinel(obj)
            if got is not None:
                return getattr, got
        if t.__module__.startswith("torch") and getattr(obj, "grad", None) is not None:
            reduced = _tensor_with_grad(obj)
            if reduced is not None:
                return reduced
        if t not in _PLAIN_CONTAINERS:
            reduced = libfix.reduce(obj)
            if reduced is not None:
                return reduced
        if t.__module__ == "tiktoken.core" and t.__name__ == "Encoding":
            reduced = _tiktoken_reduce(obj)
            if reduced is not None:
                return reduced
        if localcode.lazy_names(t):
            reduced = _without_lazy(obj, t)
            if reduced is not None:
                return _with_fields_set(reduced) if _restores_fields_set(t) else reduced
        if _restores_fields_set(t):
            return _with_fields_set(_library_reduce(obj))
        if (
            t not in _PLAIN_CONTAINERS
            and not isinstance(obj, type)
            and t not in copyreg.dispatch_table
            and reduction.guarded(t)
        ):
            # A library's __getstate__ may take from the live object what it cannot
            # pickle (LlamaIndex): reduced here, it is given back (see reduction).
            return _library_reduce(obj)
        return super().reducer_override(obj)


def _usual(t: type) -> bool:
    """True if :meth:`_Pickler.reducer_override` leaves every instance of ``t`` to pickle.

    That is, none of its rules is about ``t``: not a class, function, code
    object, exception or lock, no numpy, torch, plotly, polars or tiktoken
    type, no lazy attributes, no library pickling to guard, no pydantic state
    setter of its own, not a bare ``object()``; then cloudpickle's own
    ``reducer_override`` answers ``NotImplemented`` too. (Objects restored in
    place are asked about one by one all the same.)
    """
    module = getattr(t, "__module__", None)
    if type(module) is not str or module.startswith(("numpy", "torch", "plotly.", "tiktoken")):
        return False
    try:
        if issubclass(t, (type, types.FunctionType, types.CodeType, BaseException)):
            return False
        return not (
            t is object
            or t in _PLAIN_CONTAINERS
            or t in _SYNC
            or libfix.loads_anew(t)
            or localcode.lazy_names(t)
            or _restores_fields_set(t)
            or reduction.guarded(t)
        )
    except Exception:  # a type that will not be looked at: the full rules, per object
        return False


def _library_reduce(obj: Any) -> Any:
    """``obj``'s reduction, refused when its own pickling leaves something out.

    LlamaIndex's components drop from their state what they cannot pickle (a
    ``Memory``'s ``sql_store``, an LLM's clients): a copy without them is not
    the object the step left, and a replay must be exact or not happen, so
    the value cannot be saved (the step's body runs again on replay, saying so).
    """
    reduced, taken = reduction.reduce_noting(obj, PROTOCOL)
    if taken:
        raise pickle.PicklingError(
            f"its own pickling leaves out {', '.join(taken[:4])} (it cannot pickle them)"
        )
    return reduced


def _restores_fields_set(t: type) -> bool:
    """True for a pydantic model whose own ``__setstate__`` replaces pydantic's.

    pydantic's ``__setstate__`` restores ``__pydantic_fields_set__`` (which
    fields were given: ``model_dump(exclude_unset=True)`` reads it); one of a
    library may not: LlamaIndex's calls ``__init__(**fields)``, which marks
    every field set. Such a model is loaded with its own ``__setstate__``,
    then given back the fields set it was saved with (:func:`_with_fields_set`).
    """
    got = _FIELDS_SET.get(t)
    if got is None:
        base = getattr(sys.modules.get("pydantic.main"), "BaseModel", None)
        got = (
            isinstance(base, type)
            and issubclass(t, base)
            and getattr(t, "__setstate__", None) is not base.__setstate__
        )
        if len(_FIELDS_SET) > 10_000:  # classes made in a loop: do not keep them all alive
            _FIELDS_SET.clear()
        _FIELDS_SET[t] = got
    return got


_FIELDS_SET: dict[type, bool] = {}


def _with_fields_set(reduced: Any) -> Any:
    """``reduced`` loading through :func:`_set_state_and_fields` (pickle's state setter)."""
    if (
        type(reduced) is not tuple
        or not 3 <= len(reduced) <= 5
        or type(reduced[2]) is not dict
        or "__pydantic_fields_set__" not in reduced[2]
    ):
        return reduced
    return (*reduced, *(None,) * (5 - len(reduced)), _set_state_and_fields)


def _set_state_and_fields(obj: Any, state: dict[str, Any]) -> None:
    obj.__setstate__(state)
    object.__setattr__(obj, "__pydantic_fields_set__", set(state["__pydantic_fields_set__"]))


def _without_lazy(obj: Any, t: type) -> tuple | None:
    """A library object's reduction without the parts it built on first use.

    A LangChain model's ``_client`` (a ``functools.cached_property``) holds an
    SDK client with locks and an SSL context: saved as it was before its
    first call, the model pickles, and makes its client again when next used,
    as a plain run's model did once. None: nothing to leave out (a notebook
    class's own cached properties are its data, kept).
    """
    if localcode.is_local_module_name(t.__module__):
        return None
    return localcode.reduce_without_lazy(obj, PROTOCOL, lambda o, _protocol: _library_reduce(o))


def restores_in_place(obj: Any) -> bool:
    """True if ``obj``, changed in place, is pickled to be restored into the live object."""
    return _in_place_reduce(obj, "") is not None


def _in_place_reduce(obj: Any, name: str) -> tuple | None:
    """``obj``'s reduction as "the live ``name``, given this state" (see
    :func:`sharing.in_place`), or None for an object pickle does not rebuild the
    default way (``cls.__new__`` and a state: arrays, their own ``__reduce__``).

    A pandas DataFrame or Series is one (its state is its block manager, its
    flags, attrs and name, which ``__setstate__`` sets on the emptied object:
    what a groupby, a rolling window or a Styler made from it holds then
    reads the recorded data, as in a plain run); other numpy and pandas
    objects (arrays, indexes) load as new ones.
    """
    t = type(obj)
    top = str(getattr(t, "__module__", "")).partition(".")[0]
    if top == "numpy" or top == "pandas" and not _is_frame(t) or libfix.loads_anew(t):
        return None
    try:
        reduced = _library_reduce(obj)
    except Exception:  # cannot be pickled: the normal path says why
        return None
    if (
        type(reduced) is not tuple
        or len(reduced) < 3
        or reduced[0] is not copyreg.__newobj__
        or reduced[1] != (t,)
    ):
        return None
    state = reduced[2]
    if not localcode.is_local_module_name(t.__module__):
        state = localcode.without_lazy(t, state)
    return (sharing.in_place, (name, t), state, *reduced[3:])


def _is_frame(t: type) -> bool:
    """True for pandas' DataFrame and Series (an ``NDFrame``), subclasses included."""
    generic = sys.modules.get("pandas.core.generic")
    return generic is not None and issubclass(t, generic.NDFrame)


def _tensor_with_grad(t: Any) -> tuple | None:
    """A torch tensor with its ``.grad``, which torch's own pickle leaves out.

    ``loss.backward()`` in a step fills only the leaves' ``.grad``: without it
    a replayed model's optimizer would step on nothing. The tensor is written
    as a detached copy (same storage) rebuilt as it was (a ``Parameter`` stays
    one) with its gradient set again. None for anything else.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(t, torch.Tensor) or not t.is_leaf:
        return None
    kind = "parameter" if isinstance(t, torch.nn.Parameter) else "tensor"
    return _with_grad, (kind, t.detach(), t.requires_grad, t.grad)


def _with_grad(kind: str, data: Any, requires_grad: bool, grad: Any) -> Any:
    torch = sys.modules.get("torch") or importlib.import_module("torch")
    if kind == "parameter":
        out = torch.nn.Parameter(data, requires_grad=requires_grad)
    else:
        out = data.requires_grad_(requires_grad)
    out.grad = grad
    return out


def _tiktoken_reduce(enc: Any) -> tuple | None:
    """A tiktoken encoding of tiktoken's registry, by its data, or None for another.

    tiktoken pickles a registered encoding (``cl100k_base``) by name, and
    loading it makes it again the way ``get_encoding`` does: from a file it
    downloads, or finds in the cache that ``TIKTOKEN_CACHE_DIR`` names.
    LlamaIndex sets that variable, to the files it ships, only while it makes
    its tokenizer: a fresh kernel without a network could not load a splitter.
    So the encoding is written with its ranks (as tiktoken writes an
    unregistered one), and loads as the registry's (:func:`_tiktoken_encoding`).
    """
    registry = sys.modules.get("tiktoken.registry")
    if registry is None or getattr(registry, "ENCODINGS", {}).get(enc.name) is not enc:
        return None
    try:  # the attributes tiktoken's own __getstate__ reads
        state = {
            "name": enc.name,
            "pat_str": enc._pat_str,
            "mergeable_ranks": enc._mergeable_ranks,
            "special_tokens": enc._special_tokens,
        }
    except AttributeError:  # another tiktoken: its own pickle
        return None
    return _tiktoken_encoding, (state,)


def _tiktoken_encoding(state: dict[str, Any]) -> Any:
    """The registry's encoding of that name if it holds these ranks; else one made from
    them, and registered if the registry has none (as ``get_encoding`` would have).
    """
    registry = importlib.import_module("tiktoken.registry")
    live = registry.ENCODINGS.get(state["name"])
    parts = ("pat_str", "mergeable_ranks", "special_tokens")
    if live is not None and all(getattr(live, f"_{k}", None) == state[k] for k in parts):
        return live
    made = registry.Encoding(**state)
    return made if live is not None else registry.ENCODINGS.setdefault(state["name"], made)


def _module_sentinel(obj: object) -> tuple[types.ModuleType, str] | None:
    """The module and name of a bare ``object()`` that is a module's global, or None.

    Libraries mark "no value" with such sentinels (LangGraph's ``MISSING``,
    ``PASSTHROUGH``) and test for them by identity: a copy pickled by value
    would load as another object, which the library then takes for data. So
    a sentinel is written as the module attribute it is, and loads back as
    the very object. The notebook's own (``__main__``) are found as
    references to the namespace instead (see :mod:`.sharing`). The index is
    made again whenever a module has been imported since.
    """
    global _SENTINELS_AT
    if _SENTINELS_AT != len(sys.modules):
        found: dict[int, tuple[types.ModuleType, str, object]] = {}
        for modname, module in list(sys.modules.items()):
            if modname == "__main__" or not isinstance(module, types.ModuleType):
                continue
            try:
                members = list(vars(module).items())
            except Exception:  # a module object that hides its namespace
                continue
            for attr, value in members:
                if type(value) is object and type(attr) is str:
                    found.setdefault(id(value), (module, attr, value))
        _SENTINELS.clear()
        _SENTINELS.update(found)
        _SENTINELS_AT = len(sys.modules)
    got = _SENTINELS.get(id(obj))
    if got is None or got[2] is not obj:
        return None
    return got[0], got[1]


#: id -> (module, name, the object) of modules' bare ``object()`` globals
_SENTINELS: dict[int, tuple[types.ModuleType, str, object]] = {}
_SENTINELS_AT = -1  # len(sys.modules) when _SENTINELS was made


class _ClassCopier(cloudpickle.Pickler):
    """cloudpickle, but a class with ``__slots__`` is rebuilt with them (see below)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            return _code_reduce(obj)
        if isinstance(obj, type) and "__slots__" in vars(obj):
            reduced = _slots_class_reduce(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


def _code_reduce(code: types.CodeType) -> Any:
    """A code object as cloudpickle writes it, keeping the file name of a library's code.

    cloudpickle writes every code object's file as ``<dynamic-code>`` (a cell's
    file name changes with each kernel). A library's function is pickled by
    value when ``functools.wraps`` gave it the notebook's ``__module__``
    (dataclasses' ``__repr__`` wrapper, a library decorator on a notebook
    function): without its file it would load as notebook code, whose
    fingerprint also reads its globals, and differ from the object it was
    saved as. A library file's name is the same in every kernel of this
    environment, so it is kept; any other code is written as before.
    """
    filename = code.co_filename
    if filename.startswith("<") or not localcode.is_library_file(filename):
        return NotImplemented  # cloudpickle's own reduction
    return _code_at, (code.replace(co_filename="<dynamic-code>"), filename)


def _code_at(code: types.CodeType, filename: str) -> types.CodeType:
    """A code object loaded by cloudpickle, given back the file name it had (see _code_reduce)."""
    return code.replace(co_filename=filename)


def _class_copy(cls: type) -> bytes:
    """A notebook class by value (what :func:`_live_class` falls back to)."""
    buf = io.BytesIO()
    _ClassCopier(buf, protocol=PROTOCOL).dump(cls)
    return buf.getvalue()


def _slots_class_reduce(cls: type) -> Any:
    """Cloudpickle's reduction of a class defined by value, with its ``__slots__``.

    cloudpickle builds the class's skeleton from its name, bases and module
    only and sets ``__slots__`` afterwards, as a plain attribute: the slots'
    descriptors are never made, so the instances get a ``__dict__`` instead.
    The skeleton is made here with ``__slots__`` in its namespace, as the
    class statement made it. None for a class pickled by reference.
    """
    from cloudpickle import cloudpickle as internals

    try:  # cloudpickle's private names (3.0 to 3.1 have them); else its own way, as before
        if internals._should_pickle_by_reference(cls):
            return None
        reduced = list(internals._dynamic_class_reduce(cls))
        if reduced[0] is not internals._make_skeleton_class:  # an Enum: cloudpickle's own way
            return None
    except AttributeError:
        return None
    args = list(reduced[1])
    args[3] = {**args[3], "__slots__": vars(cls)["__slots__"]}
    reduced[1] = tuple(args)
    return tuple(reduced)


def _reduce_exception(exc: BaseException) -> Any:
    """An exception with its chain: pickle's default keeps ``args`` and ``__dict__`` only.

    ``__cause__``, ``__context__`` and ``__suppress_context__`` are saved with it
    (``__notes__`` lives in ``__dict__``). A traceback cannot be saved (its frames
    are this process's), and an exception restored without one would differ
    from the one the step kept: it is refused, so the step's body runs again.
    """
    if exc.__traceback__ is not None:
        raise pickle.PicklingError(f"{type(exc).__name__} holds a traceback, which cannot be saved")
    state = dict(vars(exc)) if getattr(exc, "__dict__", None) else None
    chain = (exc.__cause__, exc.__context__, exc.__suppress_context__)
    return _exception, (type(exc), exc.args, state, chain)


def _exception(t: type, args: tuple, state: dict | None, chain: tuple) -> BaseException:
    exc = t.__new__(t, *args)  # not __init__: what it did is in args and state
    exc.args = args
    if state:
        exc.__dict__.update(state)
    exc.__cause__, exc.__context__, exc.__suppress_context__ = chain
    return exc


class _RefPickler(_Pickler):
    """A :class:`_Pickler` that writes the objects of ``refs`` as references."""

    def persistent_id(self, obj: Any) -> Any:
        # Asked about every object, atoms and memoized ones included, before
        # anything else: kept to one lookup for the common answer (None).
        got = self.refs.get(id(obj))  # type: ignore[union-attr]
        if got is None:
            if type(obj) not in _PLAIN_CONTAINERS and type(obj) not in _PLAIN:
                self.plain = False  # (memoized objects never reach reducer_override)
            return None
        return self.reference(got, obj)


class _RefReducer(_Pickler):
    """A :class:`_RefPickler` for ``refs`` that hold no container (see :data:`_NO_OVERRIDE`).

    The same references, without a Python call per object: the reference is
    a call of :func:`_ref`, which the unpickler resolves as a persistent id.
    The pickler memoizes it, so the object is still written once.
    """

    def reducer_override(self, obj: Any) -> Any:
        got = self.refs.get(id(obj))  # type: ignore[union-attr]
        pid = self.reference(got, obj) if got is not None else None
        if pid is not None:
            return _ref, pid
        return super().reducer_override(obj)


#: Types the pickler writes itself, without asking reducer_override (CPython's _pickle.c).
_NO_OVERRIDE = frozenset(
    (bytes, str, dict, set, frozenset, list, tuple, bytearray, pickle.PickleBuffer)
)


def _ref(tag: str, path: Any, fp: str | None, standins: tuple[str, ...] = ()) -> Any:
    """A reference written by :class:`_RefReducer`; :class:`_Unpickler` resolves it."""
    raise pickle.UnpicklingError("a reference to a live object loads only through nbdurable")


def _live_class(qualname: str, fingerprint: str, copy: bytes) -> type:
    """The namespace's class ``qualname`` if its fingerprint matches, else the saved copy."""
    live: Any = sharing.load_namespace.get()
    for part in qualname.split("."):
        live = live.get(part) if isinstance(live, dict) else getattr(live, part, None)
    if (
        isinstance(live, type)
        and live.__module__ == "__main__"
        and keys.fingerprint(live) == fingerprint
    ):
        return live
    return pickle.loads(copy)


def is_module(value: Any) -> bool:
    """True for module objects (recorded by name, re-imported on replay)."""
    return isinstance(value, types.ModuleType)


def module_ref(module: types.ModuleType, imported: Iterable[str] = ()) -> str:
    """How a module variable is recorded: its name, then the submodules imported through it.

    ``import a.b.c`` binds ``a``, and ``a.b.c`` is reachable as an attribute only
    because the submodule was imported; re-importing ``a`` alone after a restart
    would lose it. ``imported`` holds the dotted names the step imported.
    """
    name = module.__name__
    return " ".join([name, *sorted({n for n in imported if n.startswith(name + ".")})])


def import_module(ref: str) -> types.ModuleType:
    """Import a module recorded by :func:`module_ref` (and its recorded submodules)."""
    name, *submodules = ref.split()
    module = importlib.import_module(name)
    for sub in submodules:
        importlib.import_module(sub)
    return module


def adopt(value: Any, namespace: dict[str, Any], restoring: Iterable[str] = ()) -> Any:
    """Give functions and classes defined in the notebook the notebook's globals again.

    cloudpickle restores a notebook function (one whose globals were
    ``__main__``) with a private copy of the globals it used when it was
    saved: after a restart it would not see names defined by later cells
    (NameError) nor their current values. Such a function is rebuilt on
    ``namespace``, as are the ones in its closure (``@decorator`` wrappers) and
    the methods of notebook classes (in place, so their instances follow).
    Returns the value to bind (a new function object for a function).
    A function whose saved globals hold names the notebook never had
    (generated code with a namespace of its own: attrs' ``__init__`` reads
    ``_compat``) keeps them; ``restoring`` are the names the same record is
    about to bind, which count as the notebook's.
    """
    memo: dict[int, Any] = {}
    known = _Known(namespace, frozenset(restoring))
    if isinstance(value, types.FunctionType):
        return _adopt_function(value, namespace, memo, known)
    cls = value if isinstance(value, type) else type(value)
    _adopt_class(cls, namespace, memo, known)
    return value


class _Known:
    """The names the notebook has, or is about to have (see :func:`adopt`)."""

    def __init__(self, ns: dict[str, Any], restoring: frozenset[str]) -> None:
        self.ns, self.restoring = ns, restoring

    def __contains__(self, name: str) -> bool:
        return name in self.ns or name in self.restoring


def _adopt_function(
    fn: types.FunctionType, ns: dict[str, Any], memo: dict[int, Any], known: _Known
) -> Any:
    if id(fn) in memo:
        return memo[id(fn)]
    memo[id(fn)] = fn
    for cell in fn.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if isinstance(inner, types.FunctionType):
            new_inner = _adopt_function(inner, ns, memo, known)
            if new_inner is not inner:
                cell.cell_contents = new_inner
        elif isinstance(inner, type):
            _adopt_class(inner, ns, memo, known)
    wrapped = fn.__dict__.get("__wrapped__")
    if isinstance(wrapped, types.FunctionType):
        # The function a wrapper calls is also its __wrapped__ (functools.wraps): both
        # must name the one adopted function, as they named one function when saved
        # (a fingerprint tells a shared function from two equal ones).
        new_wrapped = _adopt_function(wrapped, ns, memo, known)
        if new_wrapped is not wrapped:
            fn.__wrapped__ = new_wrapped
    if fn.__globals__ is ns or fn.__globals__.get("__name__") != "__main__":
        return fn
    if any(k not in known and not k.startswith("__") for k in fn.__globals__):
        # Globals the notebook never had: code generated with a namespace of its
        # own (attrs' __init__ and __eq__ read `_compat`), kept as it is.
        return fn
    new = types.FunctionType(fn.__code__, ns, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = fn.__annotations__
    new.__dict__.update(fn.__dict__)
    memo[id(fn)] = new
    return new


def _adopt_class(cls: type, ns: dict[str, Any], memo: dict[int, Any], known: _Known) -> None:
    for klass in cls.__mro__:
        if klass.__module__ != "__main__" or id(klass) in memo:
            continue
        memo[id(klass)] = klass
        for name, member in list(vars(klass).items()):
            new = _adopt_member(member, ns, memo, known)
            if new is not member:
                try:
                    setattr(klass, name, new)
                except (AttributeError, TypeError):  # a class that refuses: keep it
                    pass


def _adopt_member(member: Any, ns: dict[str, Any], memo: dict[int, Any], known: _Known) -> Any:
    if isinstance(member, types.FunctionType):
        return _adopt_function(member, ns, memo, known)
    if isinstance(member, (staticmethod, classmethod)):
        fn = member.__func__
        new = _adopt_member(fn, ns, memo, known)
        return member if new is fn else type(member)(new)
    if isinstance(member, property):
        parts = [member.fget, member.fset, member.fdel]
        new_parts = [None if p is None else _adopt_member(p, ns, memo, known) for p in parts]
        if all(a is b for a, b in zip(parts, new_parts, strict=True)):
            return member
        return type(member)(*new_parts, member.__doc__)
    return member


def type_name(value: Any) -> str:
    """``module.QualName`` of the value's type, for display."""
    t = type(value)
    mod = t.__module__
    return t.__qualname__ if mod == "builtins" else f"{mod}.{t.__qualname__}"
