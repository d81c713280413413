r"""How a record becomes signed bytes and back: pure functions, no I/O but the key file.

Every value is ``MAGIC + signature + payload``, where payload is a 4-byte
header length, a JSON header and an optional body. Three schemes:

* ``NBD\x02`` (written now, but see ``NBD\x03``): ``HMAC-SHA256(secret,
  "NBD2" + domain + NUL + key + NUL + payload)``. The *domain* names the
  store the record was written into: a PostgreSQL store's namespace, or the
  random id an embedded store keeps in its format record. A record copied
  into another namespace, or into another store directory that shares the
  key, does not verify there.
* ``NBD\x01`` (written by earlier versions, and still for the format record,
  which holds the domain): ``HMAC-SHA256(secret, key + NUL + payload)``. Such
  records still verify; they are bound to their key but not to a store, so
  one copied between stores sharing a key verifies (documented as weaker).
* ``NBD\x03`` (written for small sub-step records in stores of format 3,
  when it is shorter): ``NBD\x02``'s payload deflated (raw DEFLATE with the
  fixed preset dictionary :data:`ZDICT`), signed as stored:
  ``HMAC-SHA256(secret, "NBD3" + domain + NUL + key + NUL + deflated)``. The
  scheme is in what is signed, so a record's marker cannot be swapped for
  another's; the signature is verified before anything is inflated, and a
  payload inflating past :data:`DEFLATE_MAX` is refused.

A value whose signature does not verify is refused *before* anything is
unpickled. The key is part of what is signed, so a valid record copied under
another key does not verify either. The secret comes from ``NBDURABLE_KEY``
or the file ``key`` inside the store (created 0600).
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import struct
import zlib
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import CorruptRecord, StoreError
from .records import FORMAT_VERSION, RECORD_FORMAT

#: The marker of records signed without a domain (format 1, and the format record).
MAGIC = b"NBD\x01"
#: The marker of records whose signature covers the store's domain.
MAGIC2 = b"NBD\x02"
#: The marker of records of the second kind whose payload is deflated.
MAGIC3 = b"NBD\x03"
#: A payload (header length, header, body) is deflated only up to this size: a
#: sub-step's record is mostly its header, whose field names the dictionary holds;
#: a large value is a pickle, and is kept as it is (and read without a copy).
DEFLATE_MAX = 16 * 1024
#: A payload longer than this is deflated at zlib's fastest level (see :func:`encode`).
DEFLATE_FAST_OVER = 2048
#: The preset dictionary of every ``NBD\x03`` record: the field names and common
#: values of a sub-step's header (see ``nbdurable.durable.substeps``). Records
#: deflated with it inflate only with it: never change it (add a scheme instead).
ZDICT = (
    b'{"run":"","scope":"name:","id":"","fn":"__main__.","args_fp":"","callee_fp":"",'
    b'"callee_parts":{"code":"","defaults":"019ed885","kwdefaults":"019ed885","closure ",'
    b'"wrapped":"","global ","self":"","partial args":"","partial keywords":""},'
    b'"callee_volatile":["global "],"mutated":["#0"],"started":17,"duration":0.0,'
    b'"size":,"type":"str","dict","list","bytes","int","returns":"","awaitable","stream",'
    b'"tokens":[["gpt-",,,1]],"printed":[{"output_type":"stream","name":"stdout","text":""}],'
    b'"buffers":[""],"kind":"sub","gen":17'
)
_SIG = 32
_HDR = struct.Struct(">I")
#: A body at least this large is returned as a memoryview of the stored bytes, not a copy.
VIEW_OVER = 64 * 1024
# One encoder for every header: json.dumps with options builds a new one per call.
_JSON = json.JSONEncoder(separators=(",", ":"), default=str)
_JSON_DECODE = json.JSONDecoder().decode


class Macs(NamedTuple):
    r"""A store's keyed HMAC states: ``v1`` verifies ``NBD\x01`` records, ``v2`` and
    ``v3`` sign and verify ``NBD\x02`` and ``NBD\x03`` ones (None until the store's
    domain is known).
    """

    v1: Any
    v2: Any = None
    v3: Any = None

    @classmethod
    def bound(cls, mac: Any, domain: str) -> Macs:
        """The states of a store whose domain is ``domain`` (see :func:`bind`)."""
        return cls(mac, bind(mac, domain), bind(mac, domain, b"NBD3"))


def signer(secret: bytes) -> Any:
    """The keyed HMAC state of a store: computed once, copied per record."""
    return hmac.new(secret, digestmod="sha256")


def bind(mac: Any, domain: str, scheme: bytes = b"NBD2") -> Any:
    """``mac`` fed with ``scheme`` and ``domain`` once: every record it signs is bound
    to that store and to that scheme.

    The domain goes in before the key, so binding costs nothing per record
    (the state is copied per record either way).
    """
    bound = mac.copy()
    bound.update(scheme + domain.encode("utf-8", "surrogatepass") + b"\0")
    return bound


def sign(mac: Any, key: str, *parts: bytes | memoryview) -> bytes:
    """The signature of ``key`` and ``parts`` under ``mac`` (see :func:`signer`)."""
    # HMAC of key + NUL + the parts, fed piece by piece: a 100 MB value is
    # hashed where it lies, never concatenated into a copy first.
    mac = mac.copy()
    mac.update(key.encode("utf-8", "surrogatepass"))
    mac.update(b"\0")
    for part in parts:
        mac.update(part)
    return mac.digest()


def encode(
    mac: Any,
    key: str,
    header: dict[str, Any],
    body: bytes | memoryview = b"",
    magic: bytes = MAGIC2,
    deflated: Any = None,
) -> bytes:
    """The signed bytes stored for ``key``: ``mac`` is bound (:func:`bind`) for ``MAGIC2``.

    With ``deflated`` (the store's ``Macs.v3``), a payload of at most
    :data:`DEFLATE_MAX` bytes is stored deflated as ``MAGIC3`` when that is shorter.
    """
    head = _JSON.encode(header).encode("utf-8")
    prefix = _HDR.pack(len(head)) + head
    size = len(prefix) + len(body)
    if deflated is not None and size <= DEFLATE_MAX:
        # Up to DEFLATE_FAST_OVER: zlib's default level (on a small payload no slower
        # than level 1, and a 100-byte sub-step's record 25 bytes shorter) with a 4 KB
        # window and a small hash table, whose state is a few KB to set up, not zlib's
        # default 256 KB, which costs more than deflating a small payload. Above it:
        # level 1 with zlib's default window and table. On 10 KB of text or hex the
        # first costs 310-330 us, more than the rest of the record, the second
        # 90-125 us, for a record 3-16% longer. (Any level and window inflate with
        # the 32 KB window _inflate uses.)
        if size <= DEFLATE_FAST_OVER:
            z = zlib.compressobj(6, zlib.DEFLATED, -12, 4, zlib.Z_DEFAULT_STRATEGY, ZDICT)
        else:
            z = zlib.compressobj(1, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, ZDICT)
        packed = z.compress(prefix) + z.compress(body) + z.flush()
        if len(packed) < size:
            return b"".join((MAGIC3, sign(deflated, key, packed), packed))
    return b"".join((magic, sign(mac, key, prefix, body), prefix, body))


def signature(raw: bytes) -> str:
    """The hex signature of stored bytes (what a run's manifest names a record by)."""
    return raw[len(MAGIC) : len(MAGIC) + _SIG].hex()


def decode(
    macs: Macs, key: str, raw: Any, *, newer_ok: bool = False
) -> tuple[dict[str, Any], bytes]:
    r"""Verify and split a stored value; the body is a memoryview when large (no copy).

    Raises :class:`CorruptRecord` for anything but a record signed with this
    store's secret under this very key (and, for ``NBD\x02`` and ``NBD\x03``, in
    this very store), or one of a newer format (unless ``newer_ok``).
    """
    start = len(MAGIC) + _SIG
    if not isinstance(raw, bytes) or len(raw) < start + _HDR.size:
        raise CorruptRecord(f"record {key!r} is truncated or not an nbdurable record")
    magic = raw[: len(MAGIC)]
    mac = (
        macs.v2
        if magic == MAGIC2
        else macs.v3
        if magic == MAGIC3
        else macs.v1
        if magic == MAGIC
        else None
    )
    if mac is None:
        raise CorruptRecord(f"record {key!r} does not start with the nbdurable marker")
    view = memoryview(raw)
    if not hmac.compare_digest(view[len(MAGIC) : start], sign(mac, key, view[start:])):
        raise CorruptRecord(
            f"record {key!r} failed its signature check (damaged, planted, copied from "
            "another store or namespace, or written with another store key); it is ignored"
        )
    if magic == MAGIC3:  # verified: now inflated, as NBD\x02's payload
        raw, start = _inflate(key, view[start:]), 0
        view = memoryview(raw)
        if len(raw) < _HDR.size:
            raise CorruptRecord(f"record {key!r} is truncated or not an nbdurable record")
    (n,) = _HDR.unpack_from(raw, start)
    body_at = start + _HDR.size + n
    try:
        header = _JSON_DECODE(raw[start + _HDR.size : body_at].decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError alike
        raise CorruptRecord(f"record {key!r} has an unreadable header") from exc
    if not isinstance(header, dict):
        raise CorruptRecord(f"record {key!r} has a header that is not an object")
    fmt = header.get("format", FORMAT_VERSION)
    if not newer_ok and (not isinstance(fmt, int) or fmt > RECORD_FORMAT):
        raise CorruptRecord(
            f"record {key!r} has format {fmt}, newer than this nbdurable reads "
            f"({RECORD_FORMAT}); upgrade nbdurable to replay it"
        )
    body = view[body_at:] if len(raw) - body_at >= VIEW_OVER else raw[body_at:]
    return header, body  # type: ignore[return-value]


def _inflate(key: str, packed: memoryview) -> bytes:
    r"""An ``NBD\x03`` record's payload, inflated (at most :data:`DEFLATE_MAX` bytes)."""
    z = zlib.decompressobj(-15, zdict=ZDICT)
    try:
        out = z.decompress(packed, DEFLATE_MAX + 1)
    except zlib.error as exc:
        raise CorruptRecord(f"record {key!r} has a payload that does not inflate") from exc
    if len(out) > DEFLATE_MAX or not z.eof or z.unused_data:
        raise CorruptRecord(f"record {key!r} has a payload that does not inflate")
    return out


def load_secret(directory: Path) -> bytes:
    """The signing secret: ``NBDURABLE_KEY``, else the store's ``key`` file (made on first use)."""
    env = os.environ.get("NBDURABLE_KEY")
    if env:
        return env.encode("utf-8")
    path = directory / "key"
    if not path.exists():
        # Write the key to a private temp file, then link it into place: a
        # link either creates the name or fails, so two processes opening a
        # new store at once never see a half-written key.
        tmp = directory / f".key-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process won the race; use its key
        finally:
            tmp.unlink()
    data = path.read_bytes()
    if len(data) < 16:
        raise StoreError(
            f"the store key {path} is shorter than 16 bytes; it was damaged. "
            "Restore it, or delete the store directory to start afresh."
        )
    return data
