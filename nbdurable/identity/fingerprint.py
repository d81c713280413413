"""Content fingerprints of values: how a step's inputs are compared across runs.

See :mod:`nbdurable.identity.keys` for how fingerprints feed the key recipe.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import io
import pathlib
import pickle
import re
import struct
import sys
import types
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..hush import hush
from . import localcode, reduction

# The rules' version: increment when a kind of value gets a new encoding, and list it.
# Records may store it, so a changed fingerprint can be told apart from a rule change.
# 1 (0.1.0): the first rules.
# 2: where 1 was wrong. Dicts in key order (it is semantic: ",".join(d)); objects by their
#    pickle state (``__reduce_ex__``) instead of by type; functions also by the globals
#    they read and ``__wrapped__``; local modules by source; classes and dataclasses of
#    the notebook or a local module with those functions; bound methods and bound
#    builtins with their instance; masked arrays by data and mask; instance attributes
#    of subclasses of builtins; pandas values holding sets with the sets sorted (their
#    order differed between processes), pandas values pickled without pickle's memo (with
#    it, the stream depended on which equal strings were one object, so a frame loaded
#    back from the store differed from the one that was saved), and pandas values over
#    64 MB with their arrays hashed in place (0.1.0 copied them into one pickle first).
#    Every other kind keeps its encoding, and so its 0.1.0 fingerprint: the stream header
#    below stays "1" on purpose, so that upgrading does not invalidate steps whose inputs
#    are plain data (numbers, strings, lists, sets, arrays, library objects hashed by
#    type only).
# 3: what differs between two processes that built the same object: inside library
#    objects random (version 4) UUIDs (trace and run ids a library stamps on what it
#    does) are one token, and inside any object's state a list of classes is compared
#    as a set (``list(set_of_classes)``: classes hash by address, so its order differed),
#    and a library object's or pandas value's caches filled on first use are left out
#    (pandas' ``_cache``: a model fitted on a Series filled its index's), as is the trace
#    map of LlamaIndex's CallbackManager (the ids of the last trace's events).
#    Later, with no bump: a torch ``UntypedStorage`` by its bytes. Its pickle (torch.save's)
#    was keyed by its memory address, so no fingerprint of one ever matched another.
# 4: weak proxies by type only, as weak references already were: a live proxy handed
#    pickle its referent's state, a dead one nothing, so a value holding one changed
#    its fingerprint when the collector freed the referent.
#    And inside library objects, what a library keeps per process is left out (see
#    localcode.cache_names): matplotlib's transform back-pointers (keyed by id()) and
#    invalidation flags, artists' stale flags and callbacks. A drawn figure loaded back
#    from a record fingerprinted otherwise.
FINGERPRINT_VERSION = 4
_STREAM_HEADER = b"1"  # change only with every encoding at once

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

    ``type_only`` collects the qualified type names of what was hashed by type
    only (:func:`_type_only`); ``functions`` remembers each function's digest
    within one walk, so a helper read by many functions is hashed once.
    """

    def __init__(
        self, read_globals: bool = True, standins: Mapping[int, str] | None = None
    ) -> None:
        self.read_globals = read_globals
        #: id -> name of objects written as that name, not walked (see fingerprint)
        self.standins = standins or None
        self.sinks = [_Sink()]
        self.path: dict[int, int] = {}
        self.stack: list[Any] = []
        self.type_only: list[str] = []
        self.memo: dict[int, tuple[object, bytes]] = {}
        #: id -> (object, its state digest, or None if it was type-only) of the library
        #: objects hashed so far in this walk (see _reduced)
        self.library_memo: dict[int, tuple[object, bytes | None]] = {}
        self.reduced_depth = 0
        self.open_libraries = 0  # library objects being hashed, see _reduced
        self.skipping = False  # one of them is type-only: skip its remaining values
        self.in_code = False  # walking a code object's content (see _code_digest)

    def run(self, value: object) -> str:
        self.put(b"nbdurable-fingerprint", _STREAM_HEADER)
        stack, sinks, exact = self.stack, self.sinks, _EXACT
        stack.append(value)
        while stack:
            item = stack.pop()
            if type(item) is _Op:
                item.fn(self, item.arg)
                continue
            if self.skipping:
                continue
            if self.standins is not None and id(item) in self.standins:
                self.put(b"stand-in", self.standins[id(item)], _qual(type(item)))
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


_list = _sequence(b"list")


def _list_or_classes(h: _Hasher, v: list) -> None:
    # Inside an object's state, a list of classes is a set some code listed
    # (LlamaIndex's ``Workflow.__init__``: ``list(set_of_classes)``, also in a
    # notebook subclass): classes hash by address, so two processes that built
    # the same object listed them in other orders. Compared as a set there; the
    # notebook's own lists keep their order.
    if h.reduced_depth and len(v) > 1 and all(isinstance(x, type) for x in v):
        if h.enter(v):
            h.put(b"classes", _int(len(v)))
            _unordered(h, ((x,) for x in v))
        return
    _list(h, v)


_str_head = _head(b"str", 1)
# A random UUID (version 4) in canonical form, anywhere in a string.
_UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", re.I)


def _str(h: _Hasher, v: str) -> None:
    # Inside a library object, a random UUID is an identity the library stamped on
    # something it did (LlamaIndex's callback trace ids, a run id), new in every
    # process: one token, so an object built again the same way is the same object.
    # The notebook's own strings are compared whole, UUIDs included.
    if h.open_libraries and len(v) >= 36:
        v = _UUID4.sub("<uuid4>", v)
    data = v.encode("utf-8", "surrogatepass")
    h.sinks[-1].buf += _str_head + _LEN.pack(len(data)) + data


def _uuid(h: _Hasher, v: uuid.UUID) -> None:
    if h.open_libraries and v.version == 4:
        h.put(b"UUID", b"<uuid4>")
    else:
        h.put(b"UUID", v.bytes)


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
    # In key order: it is semantic (`",".join(d)`, `list(d)`, JSON output).
    if h.enter(v):
        h.put(b"dict", _int(len(v)))
        stack = h.stack
        for k, x in reversed(v.items()):
            stack.append(x)
            stack.append(k)


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
    if _memo_begin(h, v, b"function"):
        parts = function_parts(v, h.read_globals)
        h.put(b"function", *(label for label, _ in parts))
        h.push(*(value for _, value in parts))


def function_parts(fn: types.FunctionType, read_globals: bool = True) -> list[tuple[str, Any]]:
    """What identifies a function, as ``(label, value)`` pairs in a fixed order.

    ``code`` (see :func:`_code`), ``defaults``, ``kwdefaults``, one ``closure
    NAME`` per free variable (an empty cell is :data:`_MISSING`),
    ``wrapped`` if :func:`functools.wraps` set ``__wrapped__``, and (if
    ``read_globals``) for a function of the notebook or a local module one
    ``global NAME`` for each name its code reads that its globals hold, in
    name order (a local module is read through :class:`_ModuleReads`: its
    source plus the names read from it).
    """
    parts: list[tuple[str, Any]] = [
        ("code", fn.__code__),
        ("defaults", fn.__defaults__),
        ("kwdefaults", fn.__kwdefaults__),
    ]
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        try:
            parts.append((f"closure {name}", cell.cell_contents))
        except ValueError:  # a cell not filled yet
            parts.append((f"closure {name}", _MISSING))
    wrapped = _instance_dict(fn).get("__wrapped__", _MISSING)
    if wrapped is not _MISSING:
        parts.append(("wrapped", wrapped))
    if read_globals and localcode.is_local_function(fn):
        globals_, names = localcode.names_read(fn.__code__)
        namespace = fn.__globals__
        for name in globals_:
            if name in namespace:
                parts.append((f"global {name}", _reads(namespace[name], names)))
    return parts


class _ModuleReads:
    """A local module as a function sees it: its source and the names it reads from it."""

    __slots__ = ("module", "names")

    def __init__(self, module: types.ModuleType, names: tuple[str, ...]) -> None:
        self.module, self.names = module, names


def _reads(value: Any, names: tuple[str, ...]) -> Any:
    if type(value) is types.ModuleType and localcode.module_file(value) is not None:
        return _ModuleReads(value, names)
    return value


def _module_reads(h: _Hasher, r: _ModuleReads) -> None:
    if not h.enter(r.module):
        return
    _module(h, r.module)
    namespace = vars(r.module)
    found = [n for n in r.names if n in namespace]
    h.put(b"reads", *found)
    h.push(*(_reads(namespace[n], r.names) for n in found))


def _module(h: _Hasher, v: types.ModuleType) -> None:
    name = str(_instance_dict(v).get("__name__"))
    file = localcode.module_file(v)
    if file is None:  # a library module: by name and installed version
        version = localcode.package_version(name)
        h.put(b"module", name, version) if version else h.put(b"module", name)
    else:  # a local module: by its source, so an edit to helpers.py is a change
        h.put(b"local-module", name, localcode.file_digest(file))


def _code(h: _Hasher, v: types.CodeType) -> None:
    if h.in_code:
        _code_content(h, v)
    else:
        h.put(b"code", _code_digest(v))


@functools.lru_cache(maxsize=4096)
def _code_digest(v: types.CodeType) -> bytes:
    """Code objects are immutable: each is walked once, not once per fingerprint.

    The cache compares code objects with ``==``, which looks at everything
    :func:`_code_content` hashes (and more), so equal keys have equal digests.
    """
    h = _Hasher()
    h.in_code = True
    return bytes.fromhex(h.run(v))


def _code_content(h: _Hasher, v: types.CodeType) -> None:
    # Not co_filename, co_firstlineno or the line table: IPython names each
    # cell's file after the kernel's pid, and moving code must not matter.
    if h.enter(v):
        counts = (v.co_argcount, v.co_posonlyargcount, v.co_kwonlyargcount, v.co_flags)
        h.put(b"code", v.co_name, v.co_code, *map(_int, counts))
        h.push(v.co_consts, v.co_names, v.co_varnames, v.co_freevars, v.co_cellvars)


def _memo_begin(h: _Hasher, v: object, tag: bytes) -> bool:
    """Start hashing ``v`` into its own sink; False if done (seen before, or a cycle).

    Within one walk a function or notebook class is hashed once: later
    occurrences write its digest. A helper read by every function of a
    notebook is then walked once, not once per reader.
    """
    seen = h.memo.get(id(v))
    if seen is not None:
        h.put(tag + b"-seen", seen[1])
        return False
    if not h.enter(v):
        return False
    h.sinks.append(_Sink())
    h.stack.append(_Op(_memo_end, (v, tag)))
    return True


def _memo_end(h: _Hasher, arg: tuple[object, bytes]) -> None:
    v, tag = arg
    digest = h.sinks.pop().digest()
    if not h.skipping:  # a partly skipped walk is no digest to reuse
        h.memo[id(v)] = (v, digest)  # holds v: its id is not reused during the walk
    h.put(tag + b"-digest", digest)


def _method(h: _Hasher, v: types.MethodType) -> None:
    # The instance too: a bound method's result depends on its state (`box.area`).
    if h.enter(v):
        h.put(b"method")
        h.push(v.__func__, v.__self__)


def _builtin(h: _Hasher, v: Any) -> None:
    h.put(b"builtin", str(getattr(v, "__module__", None)), str(getattr(v, "__qualname__", None)))
    owner = getattr(v, "__self__", None)  # `d.get`: the dict it reads from
    if owner is not None and not isinstance(owner, (types.ModuleType, type)):
        h.stack.append(owner)


def _class(h: _Hasher, v: type) -> None:
    module = getattr(v, "__module__", None)
    if not localcode.is_local_module_name(module):
        # A library class: by name and installed version, not by content (the same
        # class of the same release is the same object on every run).
        version = localcode.package_version(str(module))
        h.put(b"class", _qual(v), version) if version else h.put(b"class", _qual(v))
        return
    # A class of the notebook or a local module may change between runs: by content.
    if not _memo_begin(h, v, b"class"):
        return
    own = vars(v)
    # A SQLAlchemy declarative class: the ORM's machinery set on it (instrumented
    # attributes, the class manager, the registry: sets in hash order, mappers
    # configured on first use) differs in every process and after every query; the
    # class is what its table is, written as the DDL that creates it.
    orm = any(k.startswith("_sa_") for k in own)
    members = sorted(
        (
            (k, x)
            for k, x in own.items()
            if (not k.startswith("__") or _is_code(x))
            and k != "_abc_impl"  # an ABC's cache
            and not (orm and _from_sqlalchemy(x))
        ),
        key=lambda kx: kx[0],
    )
    h.put(b"class", _qual(v), *(k for k, _ in members))
    if orm and own.get("__table__") is not None:
        h.put(b"table", _table_ddl(own["__table__"]))
    h.push(v.__bases__, *(x for _, x in members))


def _from_sqlalchemy(x: object) -> bool:
    return str(getattr(type(x), "__module__", "")).partition(".")[0] == "sqlalchemy"


def _table_ddl(table: Any) -> str:
    try:
        from sqlalchemy.schema import CreateTable

        return str(CreateTable(table))
    except Exception:  # not a Table after all: by its name
        return str(getattr(table, "name", type(table).__name__))


def _is_code(x: object) -> bool:
    return isinstance(x, (types.FunctionType, staticmethod, classmethod, property))


def _is_ndarray(t: type) -> bool:
    return any(c.__name__ == "ndarray" and c.__module__ == "numpy" for c in t.__mro__)


def _ndarray(h: _Hasher, v: Any) -> None:
    numpy = sys.modules["numpy"]
    t = type(v)
    if isinstance(v, numpy.ma.MaskedArray):
        # Data, mask and fill value: a mask change is a change. getmaskarray turns
        # `nomask` into all-False, which means the same.
        h.put(b"masked", _qual(t))
        h.push(v.data, numpy.ma.getmaskarray(v), v.fill_value)
        return
    extra = _instance_dict(v) if t is not numpy.ndarray else None
    if extra:  # a subclass's own attributes (a unit, a name)
        h.put(b"attributes")
        h.stack.append(extra)
    v = v.view(numpy.ndarray)  # a subclass may override reshape / view
    h.put(b"ndarray", _qual(t), v.dtype.str, str(v.dtype), str(v.shape))
    if not v.dtype.hasobject:
        data = v if v.flags.c_contiguous else v.copy(order="C")
        h.raw(data.reshape(-1).view("u1"))  # bytes of any dtype, without a copy
    elif h.enter(v):
        items = list(v.flat)
        h.put(b"items", _int(len(items)))
        h.stack.extend(reversed(items))


class _PandasPickler(pickle.Pickler):
    """Pickles a pandas value with its sets in a fixed order and without its caches.

    A set's pickle follows its iteration order, which for strings changes with
    every process (``PYTHONHASHSEED``): an object column of sets would look
    changed after every restart. ``persistent_id`` sees every object before
    pickle's own fast paths do, so each set is replaced by its fingerprint.

    An array's ``_cache`` (pandas' ``cache_readonly`` values, part of a
    ``DatetimeArray``'s pickle) is filled on first use, by whatever read the
    value: a model fitted on a plain cell's Series fills its index's. It is
    left out (:func:`localcode.without_lazy`), so the Series is the one the
    cell made.
    """

    def reducer_override(self, obj: Any) -> Any:
        if localcode.lazy_names(type(obj)):
            reduced = localcode.reduce_without_lazy(obj, 5)
            if reduced is not None:
                return reduced
        return NotImplemented

    def persistent_id(self, obj: Any) -> Any:
        t = type(obj)
        if t is not set and t is not frozenset:
            return None
        kind = _homogeneous(obj)
        if kind is not None:  # the common case, sorted directly (10x faster)
            return (t.__name__, kind, tuple(sorted(obj)))
        return (t.__name__, fingerprint(obj))


def _homogeneous(items: Any) -> str | None:
    """``"str"`` or ``"int"`` if all items are exactly that type (so sorting is total)."""
    kinds = set(map(type, items))
    if len(kinds) == 1:
        kind = kinds.pop()
        if kind is str or kind is int:
            return kind.__name__
    return None


# Bytes a pickle holds if it may hold a set, or a pandas cache: then it is pickled again
# with _PandasPickler (which writes the same bytes for everything else).
_PANDAS_MARKERS = (pickle.EMPTY_SET, pickle.FROZENSET, b"_cache")
# Up to this size a pandas value is hashed by its pickle in one stream; a larger one by
# its pickle with array buffers apart, hashed in place.
_IN_BAND_LIMIT = 64 << 20


def _pickled(v: Any, pickler: type[pickle.Pickler], out_of_band: bool) -> tuple[bytes, list]:
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    # protocol 5 hands array buffers over apart, uncopied
    p = pickler(stream, protocol=5, buffer_callback=buffers.append if out_of_band else None)
    # No memo: pickle writes an object seen before as a reference to it, so the
    # stream would depend on which equal objects are one object. A column named
    # 'name' is pandas' own interned 'name' in the process that built the frame,
    # and a string of its own once loaded back from the store.
    p.fast = True
    try:
        p.dump(v)
    except ValueError:  # a cycle, which fast mode cannot write: with the memo, then
        stream, buffers = io.BytesIO(), []
        pickler(stream, protocol=5, buffer_callback=buffers.append if out_of_band else None).dump(v)
    return stream.getvalue(), buffers


def _pandas(h: _Hasher, v: Any) -> None:
    try:
        stream, buffers = _pickled(v, pickle.Pickler, True)
        # Sets pickle in iteration order, which changes between processes: if one
        # may be there (or the byte is data), pickle with sets sorted; and if a
        # cache may be, without it. Only then, as that costs a Python call per object.
        pickler = _PandasPickler if any(m in stream for m in _PANDAS_MARKERS) else pickle.Pickler
        raws = [b.raw() for b in buffers]
        if len(stream) + sum(r.nbytes for r in raws) <= _IN_BAND_LIMIT:
            data, _ = _pickled(v, pickler, False)
            h.put(b"pandas", _qual(type(v)))
            h.raw(data)
            return
        if pickler is not pickle.Pickler:
            stream, buffers = _pickled(v, pickler, True)
            raws = [b.raw() for b in buffers]
    except Exception:  # whatever the reason: by type only (documented)
        _type_only(h, v)
        return
    h.put(b"pandas-buffers", _qual(type(v)), _int(len(raws)))
    h.raw(stream)
    for raw in raws:
        h.raw(raw)


def _custom(h: _Hasher, v: Any, hook: Any = None) -> None:
    result = hook(v)
    if isinstance(result, str):
        result = result.encode("utf-8", "surrogatepass")
    if not isinstance(result, bytes):
        raise TypeError(
            f"{_qual(type(v))}.__nbdurable_fingerprint__() must return str or bytes, "
            f"got {type(result).__name__}"
        )
    h.put(b"custom", _qual(type(v)), result)


def _instance_dict(v: object) -> dict[str, Any]:
    """``v.__dict__`` if it is a plain dict, else ``{}``; never calls ``__getattr__``."""
    try:
        d = object.__getattribute__(v, "__dict__")
    except (AttributeError, TypeError):
        return {}
    return d if type(d) is dict else {}


def _type_only(h: _Hasher, v: object) -> None:
    """The named fallback for what cannot be described: its type, and nothing else.

    Sockets, locks, open files, generators, database connections, and library
    objects holding one (clients) cannot be pickled, so they have no state to
    compare. Two such objects of one type look the same; every use is listed
    in :attr:`FingerprintInfo.type_only` so a caller can say so.
    """
    name = _qual(type(v))
    h.put(b"opaque", name)  # 0.1.0's tag: these fingerprints did not change
    h.type_only.append(name)
    if h.open_libraries:  # the enclosing library object will be type-only: stop walking it
        h.skipping = True


_REDUCE_DEPTH = 1_000  # nested reduced objects; past this, a reduce that makes new objects


def _reduced(h: _Hasher, v: Any, local: bool = False) -> None:
    """An object by what pickle would save of it: ``__reduce_ex__(4)``.

    That is its documented state: ``__getstate__`` (by default ``__dict__``
    and ``__slots__``) or its own ``__reduce__``, and the callable and
    arguments that rebuild it (for notebook classes the class by content, so
    ``box.v = 60`` and an edited method are both changes). Nothing is
    serialized: the parts are walked like any value. A library object with
    anything inside it that can only be hashed by type (a client holding a
    socket) is hashed by type as a whole, so no half-described state is compared.
    """
    t = type(v)
    if not local:
        # A library object reached again in the same walk is written as it was the
        # first time: matplotlib's artists all point at their figure, axes and
        # transforms, and walking them as a tree took longer than any step.
        seen = h.library_memo.get(id(v))
        if seen is not None:
            if seen[1] is None:
                _type_only(h, v)
            else:
                h.put(b"state", seen[1])
            return
    try:
        with hush():  # the object's own code: a warning or log line of it is not the cell's
            reduced = reduction.reduce_ex(v, 4)
    except Exception:  # TypeError "cannot pickle", or a broken __reduce__
        _type_only(h, v)
        return
    if isinstance(reduced, str):  # pickled by name (a C wrapper such as lru_cache's)
        h.put(b"global", _qual(t), reduced)
        wrapped = _instance_dict(v).get("__wrapped__", _MISSING)
        if wrapped is not _MISSING:
            h.stack.append(wrapped)
        return
    if not isinstance(reduced, tuple) or not 2 <= len(reduced) <= 6:
        _type_only(h, v)
        return
    func, args, state, items, pairs = (reduced + (None, None, None))[:5]
    try:
        items = None if items is None else list(items)
        pairs = None if pairs is None else list(pairs)
    except Exception:
        _type_only(h, v)
        return
    if h.reduced_depth >= _REDUCE_DEPTH:
        _type_only(h, v)
        return
    if not h.enter(v):
        return
    h.reduced_depth += 1
    if local:  # of a notebook or local-module class
        h.stack.append(_Op(_end_reduced, None))
    else:
        h.open_libraries += 1
        h.sinks.append(_Sink())
        h.stack.append(_Op(_end_reduced, (v, len(h.type_only))))
    h.put(b"object", _qual(t))
    if not local:
        state = localcode.without_caches(t, state)
    if type(state) is dict and "__pydantic_fields_set__" in state:
        # Which fields were given to the constructor, not what they hold: pydantic's
        # own == ignores it, and a round trip through pickle may change it (LlamaIndex).
        state = {k: v for k, v in state.items() if k != "__pydantic_fields_set__"}
    h.push(func, args, state, items, pairs)


def _end_reduced(h: _Hasher, library: tuple[object, int] | None) -> None:
    h.reduced_depth -= 1
    if library is None:
        return
    v, before = library
    digest = h.sinks.pop().digest()
    h.open_libraries -= 1
    h.skipping = h.skipping and h.open_libraries > 0
    if len(h.type_only) > before:  # it holds something that cannot be described
        del h.type_only[before:]
        _type_only(h, v)
        kept = None
    else:
        h.put(b"state", digest)
        kept = digest
    if not h.skipping:  # a partly skipped walk is no digest to reuse
        h.library_memo[id(v)] = (v, kept)  # holds v: its id is not reused during the walk


def _other(h: _Hasher, v: Any) -> None:
    """Everything whose exact type is not in ``_EXACT``: by a handler chosen per type."""
    t = type(v)
    handler = _RESOLVED.get(t)
    if handler is None:
        if len(_RESOLVED) > 10_000:  # classes made in a loop: do not keep them all alive
            _RESOLVED.clear()
        handler = _RESOLVED[t] = _resolve(t)
    handler(h, v)


_RESOLVED: dict[type, Any] = {}
# Weak references and proxies, by type only whether their referent is alive or not: a
# weak reference is no part of its holder's state (pickle refuses it), and a proxy
# forwards __reduce_ex__ to its referent while it lives. Not a token with the holder
# described: what holds weak references is a registry whose entries come and go with
# the collector, and is keyed by id() as often as not (a workflow runtime's caches),
# which no two processes share.
_WEAK = (weakref.ReferenceType, weakref.ProxyType, weakref.CallableProxyType)
# The kernel's own machinery, by type: a notebook function that calls get_ipython()
# reads the shell, whose state is the whole session (and sockets in the end).
_MACHINERY = frozenset({"IPython", "ipykernel", "jupyter_client", "zmq", "tornado"})


def _resolve(t: type) -> Any:
    """The handler for values of type ``t`` (the choice depends on the type alone)."""
    module = str(getattr(t, "__module__", "")).partition(".")[0]
    name = getattr(t, "__name__", "")
    hook = getattr(t, "__nbdurable_fingerprint__", None)
    if hook is not None:
        return functools.partial(_custom, hook=hook)
    if module in _MACHINERY:
        return _type_only
    if issubclass(t, _WEAK):
        return _type_only
    special = _BY_NAME.get(f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', '')}")
    if special is not None:
        return special
    if module == "torch" and _is_tensor(t):
        return _tensor
    if module == "torch" and name == "UntypedStorage":
        return _storage
    if issubclass(t, type):
        return _class
    if issubclass(t, enum.Enum):
        return _enum
    if _is_ndarray(t):
        return _ndarray
    if module == "numpy" and name in ("ufunc", "vectorize"):
        return _ufunc if name == "ufunc" else _vectorize
    if module == "numpy" and hasattr(t, "dtype") and hasattr(t, "tobytes"):
        return _numpy_scalar
    if module == "pandas":
        return _pandas
    if dataclasses.is_dataclass(t):
        return _dataclass
    if issubclass(t, tuple) and isinstance(getattr(t, "_fields", None), tuple):
        return _namedtuple
    for base in t.__mro__[1:]:  # a subclass of a type we know: its content
        handler = _EXACT.get(base)
        if handler is not None:
            return functools.partial(_subclass, handler=handler, attrs=base is not types.ModuleType)
    local = localcode.is_local_module_name(getattr(t, "__module__", None))
    return functools.partial(_reduced, local=local)  # never repr(): it may hold addresses


def _callback_registry(h: _Hasher, v: Any) -> None:
    # Its __getstate__ advances a counter (next(self._cid_gen)): taken for a
    # fingerprint, it changed every artist's fingerprint each time, and the ids
    # a plain run's later mpl_connect returns. What it holds that pickle keeps:
    # the signals and the callbacks marked to be pickled.
    pickled = getattr(v, "_pickled_cids", set())
    signals = sorted(map(str, getattr(v, "callbacks", {})))
    h.put(b"callback-registry", *signals)
    h.push(sorted(c for c in pickled if isinstance(c, int)))


def _llama_callback_manager(h: _Hasher, v: Any) -> None:
    # LlamaIndex's CallbackManager: which handlers it calls. Its trace map is the
    # ids of the events of the last trace, emptied when the next one starts: every
    # use of a model or an embedding holding it (an index's insert) grows it, so the
    # object a plain cell made looked changed once used, wherever that happened.
    h.put(b"llama-callback-manager")
    h.stack.append(getattr(v, "handlers", None))


def sqlcontext_tables(ctx: Any) -> dict[str, Any] | None:
    """The frames a polars ``SQLContext`` has registered, collected, by name.

    They live in its native context, which neither pickles nor shows them; a
    ``select *`` of each gives them back. None: catalogs are attached, or a
    table cannot be read back (that context is not restored, its step runs again).
    """
    if getattr(ctx, "_catalogs", None):
        return None
    try:
        out = {}
        for name in sorted(ctx.tables()):
            quoted = '"' + name.replace('"', '""') + '"'
            frame = ctx.execute(f"select * from {quoted}", eager=False)
            out[name] = frame.collect() if hasattr(frame, "collect") else frame
        return out
    except Exception:  # a scan whose file is gone, a frame polars cannot collect
        return None


def _sqlcontext(h: _Hasher, v: Any) -> None:
    # A polars SQLContext's tables are native state its attributes do not show:
    # `register` changed nothing nbdurable could see. By its tables' content.
    tables = sqlcontext_tables(v)
    h.put(b"polars-sqlcontext", str(getattr(v, "_eager_execution", None)))
    if tables is None:
        h.put(b"unreadable", str(id(v)))  # a change for each object: never taken as equal
        return
    h.put(b"tables", *tables)
    h.push(*tables.values())


def _is_tensor(t: type) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and issubclass(t, torch.Tensor)


def _tensor(h: _Hasher, v: Any) -> None:
    # A tensor's pickle is torch.save's legacy bytes, keyed by the storage's
    # memory address: equal tensors never fingerprinted alike, so every step
    # reading a tensor, a module or an optimizer ran again. By its content
    # instead: type, dtype, shape, whether it needs grad, its bytes, its grad.
    try:
        flat = v.detach().cpu().contiguous().reshape(-1)
        data = flat.view(sys.modules["torch"].uint8).numpy()
    except Exception:  # sparse, quantized, meta: what pickle says of it
        _reduced(h, v)
        return
    h.put(b"tensor", _qual(type(v)), str(v.dtype), *map(str, v.shape), str(v.requires_grad))
    h.raw(data)
    h.push(v.grad, _instance_dict(v) or None)


def _storage(h: _Hasher, v: Any) -> None:
    # A tensor's memory, which tensors of a step's values may share with the
    # namespace's (see nbdurable.store.sharing): by its bytes, as a tensor.
    try:
        torch = sys.modules["torch"]
        data = torch.empty(0, dtype=torch.uint8, device=v.device).set_(v).cpu().numpy()
    except Exception:  # a storage with no bytes to read (meta)
        _reduced(h, v)
        return
    h.put(b"storage", str(v.device))
    h.raw(data)


#: Library classes whose own pickling has side effects, or whose state holds a record of
#: their use, by qualified name.
_BY_NAME = {
    "matplotlib.cbook.CallbackRegistry": _callback_registry,
    "llama_index.core.callbacks.base.CallbackManager": _llama_callback_manager,
    "polars.sql.context.SQLContext": _sqlcontext,
}


def _enum(h: _Hasher, v: Any) -> None:
    h.put(b"enum", _qual(type(v)), str(v._name_))
    h.stack.append(v._value_)


def _ufunc(h: _Hasher, v: Any) -> None:
    h.put(b"ufunc", str(getattr(v, "__name__", None)))


def _vectorize(h: _Hasher, v: Any) -> None:
    # Its function, not its cache (`_ufunc` appears after the first call).
    h.put(b"vectorize")
    h.push(*(getattr(v, a, None) for a in ("pyfunc", "otypes", "excluded", "signature")))


def _numpy_scalar(h: _Hasher, v: Any) -> None:
    h.put(b"numpy", _qual(type(v)), v.dtype.str, v.tobytes())


def _dataclass(h: _Hasher, v: Any) -> None:
    if h.enter(v):
        t = type(v)
        names = [f.name for f in dataclasses.fields(v)]
        h.put(b"dataclass", _qual(t), *names)
        h.push(*(getattr(v, n, _MISSING) for n in names))
        if localcode.is_local_module_name(t.__module__):  # its methods may have changed
            h.put(b"of-class")
            h.stack.append(t)


def _namedtuple(h: _Hasher, v: Any) -> None:
    if h.enter(v):
        h.put(b"namedtuple", _qual(type(v)), *type(v)._fields)
        h.stack.extend(reversed(v))


def _subclass(h: _Hasher, v: Any, handler: Any, attrs: bool) -> None:
    extra = _instance_dict(v) if attrs else None
    if extra:  # attributes set on the instance (`class Config(dict)`)
        h.put(b"subclass-attributes", _qual(type(v)))
        h.stack.append(extra)
    else:
        h.put(b"subclass", _qual(type(v)))  # 0.1.0's encoding
    handler(h, v)


def _pattern(h: _Hasher, v: re.Pattern) -> None:
    h.put(b"pattern", type(v.pattern).__name__, v.pattern, _int(v.flags))


def _array(h: _Hasher, v: Any) -> None:
    h.put(b"array", v.typecode)
    h.raw(v)


def _cache_wrapper(h: _Hasher, v: Any) -> None:
    # functools.cache / lru_cache: the function it wraps (its own pickle is its name).
    h.put(b"cache-wrapper", str(_instance_dict(v).get("__qualname__")))
    h.stack.append(_instance_dict(v).get("__wrapped__", _MISSING))


_EXACT: dict[type, Any] = {
    type(None): lambda h, v: h.put(b"None"),
    type(...): lambda h, v: h.put(b"Ellipsis"),
    type(NotImplemented): lambda h, v: h.put(b"NotImplemented"),
    _Missing: lambda h, v: h.put(b"missing"),
    bool: _atom(b"bool", lambda v: [b"1" if v else b"0"]),
    int: _atom1(b"int", _int),
    float: _atom1(b"float", _FLOAT.pack),
    complex: _atom(b"complex", lambda v: [_FLOAT.pack(v.real), _FLOAT.pack(v.imag)]),
    str: _str,
    bytes: _bytes,
    bytearray: _bytes,
    memoryview: _memoryview,
    tuple: _sequence(b"tuple"),
    list: _list_or_classes,
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
    uuid.UUID: _uuid,
    pathlib.PurePath: _atom(b"path", lambda v: [_qual(type(v)), str(v)]),
    type: _class,
    types.ModuleType: _module,
    _ModuleReads: _module_reads,
    re.Pattern: _pattern,
    array.array: _array,
    functools._lru_cache_wrapper: _cache_wrapper,
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


def fingerprint(
    value: object, *, read_globals: bool = True, standins: Mapping[int, str] | None = None
) -> str:
    """A content hash (32 hex digits of SHA-256), the same in every process.

    It never depends on ``hash()`` (randomized per process by
    ``PYTHONHASHSEED``), ``id()`` or ``repr()``. Every value is tagged with
    its type, so ``1``, ``1.0``, ``True``, ``"1"``, ``[1]`` and ``(1,)`` differ.

    * Data by content: None, bool, int, float (IEEE bytes: ``-0.0`` and NaN
      are stable), complex, str, bytes, bytearray, memoryview, tuple, list,
      deque, dict (in key order: it is semantic), set and frozenset (in any
      order, as ``==`` compares them: element digests are sorted), range,
      slice, Decimal, Fraction, datetime, date, time, timedelta, UUID, paths,
      ``re.Pattern``, ``array.array``, SimpleNamespace, Enum members (class
      and name), dataclass instances and namedtuples (class name and fields;
      a notebook dataclass with its class's content), and subclasses of all
      these (their type, the content and any instance attributes).
    * numpy arrays by dtype, shape and raw bytes, in one pass (no copy when
      C-contiguous; object arrays element by element); masked arrays by data,
      mask and fill value; scalars by dtype and bytes; ufuncs by name;
      ``np.vectorize`` by its function. numpy is never imported. pandas
      objects by their pickle (without the memo: equal objects written
      alike, shared or not) with sets in a fixed order, array buffers
      hashed in place.
    * Functions by code (bytecode, constants with nested code, names,
      arguments; not the file name or line numbers), defaults, closure
      contents, ``__wrapped__``, and, for functions of the notebook or of a
      local module, the globals they read (:func:`function_parts`).
      ``functools.partial`` by function, args and keywords; ``cache`` and
      ``lru_cache`` wrappers by the function they wrap; bound methods by
      function and instance; builtins by module and qualified name (and the
      object a bound builtin reads, as in ``d.get``).
    * Classes of libraries by module and qualified name; classes of the
      notebook or a local module also by their bases and members, so editing
      a method changes the class's fingerprint. Library modules by name,
      local modules also by their source file (:mod:`nbdurable.identity.localcode`).
    * Any other object by its documented pickle state (:func:`_reduced`):
      instances of notebook classes, ChainMap, ``operator.itemgetter``,
      ``ZoneInfo``, pydantic models. Nothing is serialized and ``repr`` is
      never called.
    * Escape hatch: a class may define ``__nbdurable_fingerprint__(self)``
      returning str or bytes; that result (with the class's name) is used.
    * What two processes building the same object make differently: inside a
      library object's state a random (version 4) UUID, alone or in a string,
      is one token (a trace or run id the library stamped); inside any
      object's state a list of classes is compared as a set (listed from a
      set, its order follows the classes' addresses).
    * What a library builds or records as it is used: the caches of
      :func:`localcode.lazy_names` (a ``functools.cached_property``, pandas'
      ``_cache``) and a LlamaIndex ``CallbackManager``'s trace map (it is
      compared by its handlers) are left out.
    * By type only, the named fallback (:func:`_type_only`): what cannot be
      pickled (sockets, locks, open files, generators, connections), weak
      references and weak proxies (never their referent, alive or not), and
      any library object holding one (a client). :func:`fingerprint_info` lists them.

    A container reachable from itself hashes a back-reference where it
    recurs, so cycles (mutually recursive functions too) end. The walk uses
    no recursion, so very deep nesting is fine.

    ``read_globals=False`` leaves out the globals functions read: the code
    alone, e.g. to tell whether a live class is the one a value was saved with.

    ``standins`` maps the ``id()`` of objects to names: each is written as its
    name and type, not walked. What holds a step's object changed in place is
    then compared without that object's state, the same before the step's
    change is restored into it and after (see :mod:`nbdurable.store.sharing`).
    """
    # One hush for the whole walk: each object's own reduce (see _reduced) then
    # nests in it for the price of a counter, not a warnings-filter change per object.
    with hush():
        return _Hasher(read_globals, standins).run(value)


class FingerprintInfo(NamedTuple):
    """A fingerprint and what in the value was hashed by type only."""

    digest: str
    #: qualified type names hashed by type only (in walk order, repeats kept);
    #: empty when the value was described completely
    type_only: tuple[str, ...]


def fingerprint_info(value: object) -> FingerprintInfo:
    """:func:`fingerprint` plus the types it could only hash by type (same cost)."""
    h = _Hasher()
    with hush():
        digest = h.run(value)
    return FingerprintInfo(digest, tuple(h.type_only))


def args_fingerprint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Fingerprint of a call's arguments, checked on every sub-step replay.

    Arguments made only of plain scalars (str, bytes, int, float, bool,
    None), or lists/tuples of them, take a direct encoding (a few
    microseconds: this runs on every replayed call); anything else is
    :func:`fingerprint` of ``(args, kwargs items sorted by name)``. Which
    path a call takes depends only on its argument types, so a call always
    gets the same fingerprint.
    """
    # The flat path encodes into one buffer and hashes it once (the bytes are
    # those of the piece-by-piece encoding it replaced: fingerprints are unchanged).
    buf = bytearray(_ARGS_PREFIX)
    try:
        for a in args:
            _enc_flat(buf, a, False)
        buf += b"|"
        if kwargs:
            for k in sorted(kwargs):
                _enc_flat(buf, k, True)
                _enc_flat(buf, kwargs[k], False)
    except _NotFlat:
        return fingerprint((tuple(args), tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))))
    return hashlib.sha256(buf).hexdigest()[:32]


_ARGS_PREFIX = b"nbdurable-args-1\0"


class _NotFlat(Exception):
    """An argument the flat encoding does not cover."""


def _enc_flat(buf: bytearray, v: Any, inner: bool) -> None:
    t = type(v)
    if t is str:
        b = v.encode("utf-8", "surrogatepass")
        buf += b"s"
        buf += _LEN.pack(len(b))
        buf += b
    elif t is int:
        b = _int(v)
        buf += b"i"
        buf += _LEN.pack(len(b))
        buf += b
    elif t is float:
        buf += b"f"
        buf += _FLOAT.pack(v)
    elif t is bool:
        buf += b"1" if v else b"0"
    elif v is None:
        buf += b"N"
    elif t is bytes:
        buf += b"b"
        buf += _LEN.pack(len(v))
        buf += v
    elif (t is list or t is tuple) and not inner:
        buf += b"L" if t is list else b"T"
        buf += _LEN.pack(len(v))
        for x in v:
            _enc_flat(buf, x, True)
    else:
        raise _NotFlat
