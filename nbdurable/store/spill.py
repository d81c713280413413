"""A step's values as one blob, with each large buffer a blob of its own.

A step's values are pickled together (see :func:`nbdurable.store.values.dump_values`),
so their out-of-band buffers (the memory of arrays) would all land in one
file. A replayed array lives on a mapping of its blob file (see
:func:`nbdurable.store.blobs.read_verified`), and a mapping is released only
when every array on it is gone: with one file per step, ``del big`` would
free nothing while any other value of that step lived. So every buffer of
at least :data:`blobs.MAP_OVER` bytes is *spilled*: written as a blob of
its own (an empty stream and that one buffer), and the step's blob keeps
the stream and the small buffers. The spilled blobs are listed, as
``[position among the buffers, sha]``, with the variable whose pickle
holds them (``VarRecord.spilled``), so the records name every blob they
use (``gc`` keeps them) and a load puts each buffer back in its place.

A spilled buffer is mapped on its own file when loaded, and ``del`` of its
array unmaps it, as a plain run frees it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from ..errors import CorruptRecord
from . import blobs
from .base import Store

#: ``[position among the step blob's buffers, sha of the blob holding it]``
Spilled = list[tuple[int, str]]


def put(
    store: Store,
    stream: bytes,
    buffers: Sequence[memoryview],
    *,
    defer: dict[str, bytes] | None = None,
    secrets: dict[str, bytes] | None = None,
) -> tuple[str, Spilled]:
    """Store ``stream`` and ``buffers``; the step blob's sha and what was spilled.

    Raises :class:`blobs.SecretFound` if any part holds a secret (a spilled
    buffer already written stays, unreferenced, for ``gc``).
    """
    kept: list[memoryview] = []
    spilled: Spilled = []
    for i, buf in enumerate(buffers):
        if memoryview(buf).nbytes >= blobs.MAP_OVER:
            sha, _ = store.put_blob(b"", [buf], secrets=secrets)
            spilled.append((i, sha))
        else:
            kept.append(buf)
    sha, _ = store.put_blob(stream, kept, defer=defer, secrets=secrets)
    return sha, spilled


def get(store: Store, sha: str, spilled: Iterable[Sequence[object]] = ()) -> blobs.Blob | None:
    """The step blob ``sha`` with its spilled buffers back in place; None if one is absent."""
    blob = store.get_blob(sha)
    if blob is None:
        return None
    placed = {int(pos): str(ref) for pos, ref in spilled}  # type: ignore[call-overload]
    if not placed:
        return blob
    kept = iter(blob.buffers)
    buffers: list[memoryview] = []
    for i in range(len(blob.buffers) + len(placed)):
        if i not in placed:
            try:
                buffers.append(next(kept))
            except StopIteration:
                raise CorruptRecord(f"blob {sha[:12]} lacks buffers its record lists") from None
            continue
        part = store.get_blob(placed[i])
        if part is None:
            return None
        if len(part.buffers) != 1:
            raise CorruptRecord(f"blob {placed[i][:12]} is not one spilled buffer")
        buffers.append(part.buffers[0])
    return blobs.Blob(blob.stream, buffers)


def digest(sha: str, spilled: Iterable[Sequence[object]] = ()) -> str:
    """An identity of the step blob and its spilled buffers together (32 hex digits).

    The step blob alone does not tell two arrays of one shape apart: their
    bytes are in the spilled blobs.
    """
    listed = list(spilled)
    if not listed:
        return sha[:32]
    text = sha + "".join(f";{pos}:{ref}" for pos, ref in listed)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
