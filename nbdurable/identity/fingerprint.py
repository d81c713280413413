"""Content fingerprints of values: how a step's inputs are compared across runs.

See :mod:`nbdurable.keys` for how fingerprints feed the key recipe.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import pathlib
import pickle
import struct
import types
import uuid
from typing import Any

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
    """

    def __init__(self) -> None:
        self.sinks = [_Sink()]
        self.path: dict[int, int] = {}
        self.stack: list[Any] = []

    def run(self, value: object) -> str:
        self.put(b"nbdurable-fingerprint", b"1")  # change on any encoding change
        stack, sinks, exact = self.stack, self.sinks, _EXACT
        stack.append(value)
        while stack:
            item = stack.pop()
            if type(item) is _Op:
                item.fn(self, item.arg)
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
    # In any order, as == compares dicts: a dict built by iterating over a set of
    # strings has a different order in every process (PYTHONHASHSEED).
    if h.enter(v):
        h.put(b"dict", _int(len(v)))
        _unordered(h, v.items())


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
    if h.enter(v):
        cells = []
        for cell in v.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # a cell not filled yet
                cells.append(_MISSING)
        h.put(b"function", _int(len(cells)))
        h.push(v.__code__, v.__defaults__, v.__kwdefaults__, *cells)


def _code(h: _Hasher, v: types.CodeType) -> None:
    # Not co_filename, co_firstlineno or the line table: IPython names each
    # cell's file after the kernel's pid, and moving code must not matter.
    if h.enter(v):
        counts = (v.co_argcount, v.co_posonlyargcount, v.co_kwonlyargcount, v.co_flags)
        h.put(b"code", v.co_name, v.co_code, *map(_int, counts))
        h.push(v.co_consts, v.co_names, v.co_varnames, v.co_freevars, v.co_cellvars)


def _method(h: _Hasher, v: types.MethodType) -> None:
    if h.enter(v):
        owner = v.__self__
        h.put(b"method")
        h.push(v.__func__, owner if isinstance(owner, type) else type(owner))


def _builtin(h: _Hasher, v: Any) -> None:
    h.put(b"builtin", str(getattr(v, "__module__", None)), str(getattr(v, "__qualname__", None)))


def _class(h: _Hasher, v: type) -> None:
    if not h.enter(v):
        return
    h.put(b"class", _qual(v))
    if getattr(v, "__module__", None) == "__main__":  # may change between runs: by content
        members = sorted(
            ((k, x) for k, x in vars(v).items() if not k.startswith("__") or _is_code(x)),
            key=lambda kx: kx[0],
        )
        h.put(b"members", *(k for k, _ in members))
        h.push(v.__bases__, *(x for _, x in members))


def _is_code(x: object) -> bool:
    return isinstance(x, (types.FunctionType, staticmethod, classmethod, property))


def _is_ndarray(t: type) -> bool:
    return any(c.__name__ == "ndarray" and c.__module__ == "numpy" for c in t.__mro__)


def _ndarray(h: _Hasher, v: Any) -> None:
    h.put(b"ndarray", _qual(type(v)), v.dtype.str, str(v.dtype), str(v.shape))
    if not v.dtype.hasobject:
        data = v if v.flags.c_contiguous else v.copy(order="C")
        h.raw(data.reshape(-1).view("u1"))  # bytes of any dtype, without a copy
    elif h.enter(v):
        items = list(v.flat)
        h.put(b"items", _int(len(items)))
        h.stack.extend(reversed(items))


def _pandas(h: _Hasher, v: Any) -> None:
    try:
        data = pickle.dumps(v, protocol=5)
    except Exception:  # whatever the reason, it is hashed by type only (documented)
        h.put(b"opaque", _qual(type(v)), b"unpicklable")
    else:
        h.put(b"pandas", _qual(type(v)))
        h.raw(data)


def _custom(h: _Hasher, v: Any, hook: Any) -> None:
    result = hook(v)
    if isinstance(result, str):
        result = result.encode("utf-8", "surrogatepass")
    if not isinstance(result, bytes):
        raise TypeError(
            f"{_qual(type(v))}.__nbdurable_fingerprint__() must return str or bytes, "
            f"got {type(result).__name__}"
        )
    h.put(b"custom", _qual(type(v)), result)


def _other(h: _Hasher, v: Any) -> None:
    """Everything whose exact type is not in ``_EXACT``."""
    t = type(v)
    module = str(getattr(t, "__module__", "")).partition(".")[0]
    hook = getattr(t, "__nbdurable_fingerprint__", None)
    if hook is not None:
        _custom(h, v, hook)
    elif isinstance(v, type):
        _class(h, v)
    elif isinstance(v, enum.Enum):
        h.put(b"enum", _qual(t), str(v._name_))
        h.stack.append(v._value_)
    elif _is_ndarray(t):
        _ndarray(h, v)
    elif module == "numpy" and t.__name__ == "ufunc":
        h.put(b"ufunc", str(getattr(v, "__name__", None)))
    elif module == "numpy" and hasattr(v, "dtype") and hasattr(v, "tobytes"):  # a scalar
        h.put(b"numpy", _qual(t), v.dtype.str, v.tobytes())
    elif module == "pandas":
        _pandas(h, v)
    elif dataclasses.is_dataclass(t):
        if h.enter(v):
            names = [f.name for f in dataclasses.fields(v)]
            h.put(b"dataclass", _qual(t), *names)
            h.push(*(getattr(v, n, _MISSING) for n in names))
    elif isinstance(v, tuple) and isinstance(getattr(t, "_fields", None), tuple):
        if h.enter(v):
            h.put(b"namedtuple", _qual(t), *t._fields)
            h.stack.extend(reversed(v))
    else:
        for base in t.__mro__[1:]:  # a subclass of a type we know: its content
            handler = _EXACT.get(base)
            if handler is not None:
                h.put(b"subclass", _qual(t))
                handler(h, v)
                return
        h.put(b"opaque", _qual(t))  # never repr() (addresses) nor pickle (side effects)


_EXACT: dict[type, Any] = {
    type(None): lambda h, v: h.put(b"None"),
    type(...): lambda h, v: h.put(b"Ellipsis"),
    type(NotImplemented): lambda h, v: h.put(b"NotImplemented"),
    _Missing: lambda h, v: h.put(b"missing"),
    bool: _atom(b"bool", lambda v: [b"1" if v else b"0"]),
    int: _atom1(b"int", _int),
    float: _atom1(b"float", _FLOAT.pack),
    complex: _atom(b"complex", lambda v: [_FLOAT.pack(v.real), _FLOAT.pack(v.imag)]),
    str: _atom1(b"str", lambda v: v.encode("utf-8", "surrogatepass")),
    bytes: _bytes,
    bytearray: _bytes,
    memoryview: _memoryview,
    tuple: _sequence(b"tuple"),
    list: _sequence(b"list"),
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
    uuid.UUID: _atom(b"UUID", lambda v: [v.bytes]),
    pathlib.PurePath: _atom(b"path", lambda v: [_qual(type(v)), str(v)]),
    type: _class,
    types.ModuleType: _atom(b"module", lambda v: [str(getattr(v, "__name__", None))]),
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


def fingerprint(value: object) -> str:
    """A content hash (32 hex digits of SHA-256), the same in every process.

    It never depends on ``hash()`` (randomized per process by
    ``PYTHONHASHSEED``), ``id()`` or ``repr()``. Every value is tagged with
    its type, so ``1``, ``1.0``, ``True``, ``"1"``, ``[1]`` and ``(1,)`` differ.

    * Data by content: None, bool, int, float (IEEE bytes: ``-0.0`` and NaN
      are stable), complex, str, bytes, bytearray, memoryview, tuple, list,
      deque, dict, set and frozenset (these three in any order, as ``==``
      compares them), range, slice, Decimal, Fraction, datetime, date, time,
      timedelta, UUID, paths, SimpleNamespace, Enum members (class and name),
      dataclass instances and namedtuples (type and fields), and subclasses
      of all these (their type plus the content).
    * numpy arrays by dtype, shape and raw bytes (no copy when C-contiguous;
      object arrays element by element), numpy scalars by dtype and bytes,
      ufuncs by name; numpy is never imported. pandas objects by their
      pickle; one that cannot be pickled by type only.
    * Functions by code (bytecode, constants with nested code, names,
      arguments; not the file name or line numbers), defaults and closure
      contents, so a decorator's wrapper differs per wrapped function; never
      by their globals. ``functools.partial`` by function, args and keywords;
      bound methods by function and the class of ``__self__``; builtins by
      module and qualified name; staticmethod, classmethod and property by
      what they wrap.
    * Classes by module and qualified name; classes defined in ``__main__``
      (the notebook) also by their bases and members, so editing a method
      changes the class's fingerprint. Modules by name.
    * Escape hatch: a class may define ``__nbdurable_fingerprint__(self)``
      returning str or bytes; that result (with the class's name) is used.
    * Anything else (clients, sockets, locks, files, generators, plain class
      instances) by type only: never by ``repr`` (it may hold addresses),
      never by pickle (it may have side effects).

    A container reachable from itself hashes a back-reference where it
    recurs. The walk uses no recursion, so very deep nesting is fine.
    """
    return _Hasher().run(value)


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
