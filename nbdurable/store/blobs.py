"""The blob format: a variable's pickle, stored once by content.

A variable is pickled with protocol 5 and a buffer callback, so the raw
memory of numpy arrays, pandas blocks and bytearrays stays *out of band*:
it is written to disk from where it lies, never copied into the pickle
stream first. A blob is::

    BLOB_MAGIC + u32 header length + JSON header + stream + buffer 1 + buffer 2 ...

with the header ``{"format": 2, "stream": <bytes>, "buffers": [<bytes>, ...]}``.
Its store key is ``b/<SHA-256 of all of the above>``.

A blob carries no signature of its own: the only way to reach one is from
a step record, which is signed and names the blob's SHA-256. Reading a blob
recomputes that SHA-256 and refuses bytes that do not match before
anything is unpickled, so a planted or damaged blob never loads.

One pass over the data each way: writing hashes on a helper thread while
the main thread writes the file (``hashlib`` and file I/O release the GIL
on large buffers, so the two run side by side on two cores); reading maps
the file and hashes the page cache, and arrays are rebuilt on that mapping
without a copy (see :func:`read_verified`).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import queue
import re
import struct
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from ..errors import CorruptRecord
from ..redact import searchable

BLOB_MAGIC = b"NBB\x02"
BLOB_FORMAT = 2
_LEN = struct.Struct(">I")
#: Below this many bytes a blob is hashed on the calling thread (a thread costs more).
THREAD_OVER = 4 * 1024 * 1024
#: Chunk size of the write pipeline (two buffers of it are kept and reused).
CHUNK = 4 * 1024 * 1024
#: Buffers of a blob file at least this large are mapped, not read...
MAP_OVER = 16 * 1024 * 1024
#: ...while fewer than this many mappings are alive (each holds a file descriptor).
MAP_MAX = 64

Buffer = bytes | bytearray | memoryview


@dataclass
class Blob:
    """A verified blob: the pickle stream and its out-of-band buffers."""

    stream: Buffer
    buffers: list[memoryview] = field(default_factory=list)


def head(stream: Buffer, buffers: Sequence[memoryview]) -> bytes:
    """The magic, length and header that precede ``stream`` and ``buffers``."""
    meta = {"format": BLOB_FORMAT, "stream": len(stream), "buffers": [b.nbytes for b in buffers]}
    text = json.dumps(meta, separators=(",", ":")).encode("ascii")
    return BLOB_MAGIC + _LEN.pack(len(text)) + text


class SecretFound(Exception):
    """The value holds a secret (from the environment, or a literal key): nothing was written.

    ``names``: environment variables, or ``"openai key"``-style kinds of well-known
    keys (see :func:`nbdurable.redact.said`).
    """

    def __init__(self, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.names = names


def scan(data: Buffer, secrets: dict[str, bytes]) -> list[str]:
    """Names of the ``secrets`` whose value occurs in ``data`` (searched where it lies).

    ``secret in view`` is no substring search on a memoryview (it compares
    items): a view is searched as the bytes object it shows, or by a pattern.
    """
    if not secrets:
        return []
    data = searchable(data)
    if isinstance(data, memoryview):
        return sorted(n for n, v in secrets.items() if re.search(re.escape(v), data))
    return sorted(n for n, v in secrets.items() if v in data)


def write(f: IO[bytes], parts: Sequence[Buffer], secrets: dict[str, bytes]) -> str:
    """Write ``parts`` to ``f``; return their SHA-256. Raises :class:`SecretFound`.

    What is hashed, searched for secrets and written is one copy of each
    chunk, so the blob matches its name even if another thread changes the
    value meanwhile. Below :data:`THREAD_OVER` bytes that copy is one
    ``bytes``; above, chunks go through two reused buffers: a helper thread
    hashes chunk *k* while this one copies, searches and writes chunk *k+1*
    (``hashlib`` and file writes release the GIL, so the two run side by side).
    """
    total = sum(memoryview(p).nbytes for p in parts)
    if total < THREAD_OVER:
        data = b"".join(parts)
        found = scan(data, secrets)
        if found:
            raise SecretFound(found)
        f.write(data)
        return hashlib.sha256(data).hexdigest()
    hasher = _HashThread()
    bufs = _take_buffers()
    try:
        _write_chunks(f, parts, secrets, hasher, bufs)
    finally:
        sha = hasher.finish()  # joined on every path: it reads the buffers
        _give_back(bufs)
    return sha


# The pipeline's two buffers are kept between writes: fresh memory is slow to touch
# (on the VMs measured here, as slow as the write itself).
_spare: list[bytearray] | None = None
_spare_lock = threading.Lock()


def _take_buffers() -> list[bytearray]:
    global _spare
    with _spare_lock:
        bufs, _spare = _spare, None
    return bufs or [bytearray(CHUNK), bytearray(CHUNK)]


def _give_back(bufs: list[bytearray]) -> None:
    global _spare
    with _spare_lock:
        _spare = bufs


def _write_chunks(
    f: IO[bytes],
    parts: Sequence[Buffer],
    secrets: dict[str, bytes],
    hasher: _HashThread,
    bufs: list[bytearray],
) -> None:
    hashed: list[threading.Event | None] = [None, None]
    overlap = max((len(v) for v in secrets.values()), default=1) - 1
    tail = b""
    k = 0
    for part in parts:
        src = memoryview(part).cast("B")
        for at in range(0, src.nbytes, CHUNK):
            i = k % 2
            k += 1
            if hashed[i] is not None:
                hashed[i].wait()  # the helper is done with this buffer
            n = min(CHUNK, src.nbytes - at)
            view = memoryview(bufs[i])[:n]
            view[:] = src[at : at + n]
            hashed[i] = hasher.feed(view)  # hashed while it is searched and written
            if secrets:
                edge = tail + bytes(view[:overlap])  # a secret across two chunks
                found = sorted(
                    name for name, v in secrets.items() if bufs[i].find(v, 0, n) >= 0 or v in edge
                )
                if found:
                    raise SecretFound(found)
                tail = bytes(view[max(0, n - overlap) :]) if overlap else b""
            f.write(view)


class _HashThread:
    """SHA-256 of the chunks fed to it, in order, on a helper thread."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._queue: queue.SimpleQueue[tuple[memoryview, threading.Event] | None] = (
            queue.SimpleQueue()
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nbdurable-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            view, done = item
            try:
                if self._error is None:
                    self._h.update(view)
            except BaseException as exc:  # reported by finish(), on the caller's thread
                self._error = exc
            finally:
                done.set()

    def feed(self, view: memoryview) -> threading.Event:
        """Queue ``view`` to be hashed; the event is set once it has been."""
        done = threading.Event()
        self._queue.put((view, done))
        return done

    def finish(self) -> str:
        """Wait for every chunk; the hex digest."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()


def parse(sha: str, data: Buffer) -> Blob:
    """Verify ``data`` (a whole blob already in memory) against ``sha`` and split it."""
    if hashlib.sha256(data).hexdigest() != sha:
        raise CorruptRecord(f"blob {sha[:12]} does not match its SHA-256 (damaged or planted)")
    return split(sha, memoryview(data))


def read_verified(sha: str, f: IO[bytes], size: int) -> Blob:
    """Read and verify a blob file of ``size`` bytes.

    The header and pickle stream are read into memory; the buffers (the
    bulk: an array's data) are mapped copy-on-write from the file, not read:
    SHA-256 runs over the page cache directly, and arrays are rebuilt on the
    mapping (writing to one copies only the pages written). The stream is
    hashed from the private copy that is then unpickled, so nothing that
    changes in the file after the check can reach the unpickler.
    """
    first = f.read(min(size, 64 * 1024))
    if len(first) >= len(BLOB_MAGIC) + _LEN.size:
        # A header longer than the first read (a value with very many buffers).
        (n,) = _LEN.unpack_from(first, len(BLOB_MAGIC))
        want = min(size, len(BLOB_MAGIC) + _LEN.size + n)
        if want > len(first):
            first += f.read(want - len(first))
    meta_end, stream_len, lengths = _layout(sha, first, size)
    stream_end = meta_end + stream_len
    front = first[:stream_end]
    if stream_end > len(first):
        front = first + f.read(stream_end - len(first))
    if len(front) != stream_end:
        raise CorruptRecord(f"blob {sha[:12]} is truncated")
    f.seek(stream_end)
    rest = _map(f, stream_end) if size - stream_end >= MAP_OVER else None
    if rest is None:
        buf = bytearray(size - stream_end)
        rest = memoryview(buf)[: f.readinto(buf)]
    if len(rest) != size - stream_end:
        raise CorruptRecord(f"blob {sha[:12]} is truncated")
    h = hashlib.sha256(front)
    h.update(rest)
    if h.hexdigest() != sha:
        raise CorruptRecord(f"blob {sha[:12]} does not match its SHA-256 (damaged or planted)")
    buffers, at = [], 0
    for n in lengths:
        buffers.append(rest[at : at + n])
        at += n
    return Blob(memoryview(front)[meta_end:], buffers)


_live_maps = 0  # mappings alive now (see MAP_MAX)
_maps_lock = threading.Lock()


def _map(f: IO[bytes], start: int) -> memoryview | None:
    """The file from ``start`` on, mapped copy-on-write; None to read it instead.

    None when :data:`MAP_MAX` mappings are alive (each keeps a file
    descriptor open until its arrays are gone) or the file system cannot map.
    """
    global _live_maps
    with _maps_lock:
        if _live_maps >= MAP_MAX:
            return None
        _live_maps += 1
    try:
        extra = {"trackfd": False} if sys.version_info >= (3, 13) else {}
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY, **extra)
    except (OSError, ValueError):  # e.g. ENODEV on some network or FUSE file systems
        _unmapped()
        return None
    weakref.finalize(mm, _unmapped)
    return memoryview(mm)[start:]


def _unmapped() -> None:
    global _live_maps
    with _maps_lock:
        _live_maps -= 1


def _layout(sha: str, data: Buffer, size: int) -> tuple[int, int, list[int]]:
    """``(end of header, stream length, buffer lengths)`` from a blob's first bytes."""
    view = memoryview(data)
    try:
        if bytes(view[: len(BLOB_MAGIC)]) != BLOB_MAGIC:
            raise ValueError("no blob marker")
        (n,) = _LEN.unpack_from(view, len(BLOB_MAGIC))
        at = len(BLOB_MAGIC) + _LEN.size
        if at + n > len(view):
            raise ValueError("header longer than its blob's start")
        meta: Any = json.loads(bytes(view[at : at + n]))
        stream_len, lengths = int(meta["stream"]), [int(x) for x in meta["buffers"]]
        if min([stream_len, *lengths]) < 0 or at + n + stream_len + sum(lengths) != size:
            raise ValueError("lengths do not add up")
    except Exception as exc:  # any damage: bad JSON, deep nesting, 1e400, short data
        raise CorruptRecord(f"blob {sha[:12]} has an unreadable header ({exc!r})") from exc
    return at + n, stream_len, lengths


def split(sha: str, view: memoryview) -> Blob:
    """Split verified blob bytes into stream and buffers (views, no copy)."""
    at, stream_len, lengths = _layout(sha, view, len(view))
    stream = view[at : at + stream_len]
    at += stream_len
    buffers = []
    for n in lengths:
        buffers.append(view[at : at + n])
        at += n
    return Blob(stream, buffers)


def writable(blob: Blob) -> Blob:
    """``blob`` with buffers that can be written to (arrays restored on them are not read-only)."""
    if all(not b.readonly for b in blob.buffers):
        return blob
    return Blob(blob.stream, [memoryview(bytearray(b)) for b in blob.buffers])
