"""The Store interface is enough for a second engine: a dict-backed one runs the same code.

``MemoryStore`` implements only the primitives :class:`nbdurable.store.base.Store`
declares abstract (over bytes), the way a database engine would; records,
signatures, small and large blobs, the lease's compare-and-set, RunView, the
listing and clear/pin then work on it unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from test_ops import RK, RUN, record, sub

from nbdurable import commands, status
from nbdurable.durable import lease
from nbdurable.errors import CorruptRecord, LeaseHeld
from nbdurable.store import RunView, Store, blobs, layout, values
from nbdurable.store.base import Fence


class MemoryStore(Store):
    """A store in a dict: the abstract primitives and nothing else."""

    small_blob_max = 256

    def __init__(self) -> None:
        self.path = Path("memory")
        self.generation = self.deletions = 0
        self.data: dict[str, bytes] = {}
        self._start(b"a secret of at least sixteen bytes")

    def read(self, key: str) -> bytes | None:
        return self.data.get(key)

    def read_prefix(self, prefix: str, row_max: int) -> list[tuple[str, bytes | None]]:
        return [(k, v if len(v) <= row_max else None) for k, v in self._items(prefix)]

    def write(
        self, values: dict[str, bytes], deletes: Sequence[str] = (), fence: Fence | None = None
    ) -> None:
        if fence is not None and not fence.held(self.data.get(fence.key)):
            raise self._lost(fence)
        self.data.update(values)
        for k in deletes:
            self.data.pop(k, None)
        self.deletions += bool(deletes)

    def delete(self, key: str) -> bool:
        self.deletions += 1
        return self.data.pop(key, None) is not None

    def scan(self, prefix: str) -> list[str]:
        return [k for k, _ in self._items(prefix)]

    def stats(self, prefix: str) -> tuple[int, int]:
        items = self._items(prefix)
        return len(items), sum(len(v) for _, v in items)

    def size_of(self, key: str) -> int:
        return len(self.data.get(key, b""))

    def has(self, key: str) -> bool:
        return key in self.data

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        saved = dict(self.data)
        try:
            yield
        except BaseException:
            self.data = saved  # all of it or none of it
            raise

    def _put_blob_file(self, parts, total: int, secrets: dict[str, bytes]) -> tuple[str, int]:
        data = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
        found = blobs.scan(data, secrets)
        if found:
            raise blobs.SecretFound(found)
        sha = hashlib.sha256(data).hexdigest()
        key = layout.blob(sha)
        if key in self.data and key not in self._suspect:
            return sha, 0
        self.write({key: data})
        return sha, total

    def get_blob(self, sha: str) -> blobs.Blob | None:
        key = layout.blob(sha)
        raw = self.data.get(key)
        return None if raw is None else self._blob_from_bytes(sha, key, raw)

    def check(self, fix: bool = True) -> list[str]:
        return []

    def replaced(self) -> bool:
        return False

    def check_same(self) -> None:
        pass

    def reopen(self) -> None:
        self.generation += 1

    def close(self) -> None:
        pass

    def _items(self, prefix: str) -> list[tuple[str, bytes]]:
        return sorted((k, v) for k, v in self.data.items() if k.startswith(prefix))


@pytest.fixture
def mem() -> MemoryStore:
    return MemoryStore()


def test_records_are_signed_and_checked_on_any_engine(mem):
    assert mem.get(layout.FORMAT_KEY)[0]["format"] == 1, "the format record is written on open"
    mem.put("r/x/s/a", {"n": 1}, b"body")
    assert mem.get("r/x/s/a") == ({"n": 1}, b"body")
    raw = bytearray(mem.data["r/x/s/a"])
    raw[-1] ^= 1
    mem.data["r/x/s/a"] = bytes(raw)
    with pytest.raises(CorruptRecord, match="signature"):
        mem.get("r/x/s/a")
    mem.data["r/x/s/b"] = mem.data["r/x/s/a"]  # a record copied under another key
    with pytest.raises(CorruptRecord):
        mem.get("r/x/s/b")


def test_small_and_large_blobs_round_trip(mem):
    for value in (["small"], list(range(10_000))):
        stream, buffers = values.dumps_parts(value)
        sha, written = mem.put_blob(stream, buffers)
        assert written > 0 and mem.put_blob(stream, buffers)[1] == 0, "stored once by content"
        blob = mem.get_blob(sha)
        assert values.loads(blob.stream, None, blob.buffers) == value


def test_swap_is_the_leases_compare_and_set(mem):
    assert mem.swap("r/x/lease", lambda cur: {"who": "a"}) is None
    with pytest.raises(RuntimeError):
        mem.swap("r/x/lease", lambda cur: (_ for _ in ()).throw(RuntimeError("held")))
    assert mem.get("r/x/lease")[0] == {"who": "a"}, "a refused swap leaves the record"
    assert mem.swap("r/x/lease", lambda cur: None) == {"who": "a"}
    assert not mem.has("r/x/lease")

    first = lease.Lease(mem, RUN, "first")
    first.acquire()
    assert lease.read(mem, RUN).token == first.token
    first.release()
    assert lease.read(mem, RUN) is None
    # A live holder on this host (our parent process) refuses the lease, and keeps it.
    now = time.time()
    holder = lease.Holder(socket.gethostname(), os.getppid(), "", "someone", now, now, "other")
    mem.put(RK.lease, dataclasses.asdict(holder))
    with pytest.raises(LeaseHeld, match="is being recorded by"):
        lease.Lease(mem, RUN, "second").acquire()
    assert lease.read(mem, RUN) == holder


def test_runview_listing_and_commands_work_unchanged(mem):
    record(mem, "name:a")
    record(mem, "name:b", input_from={"x": "name:a"})
    sub(mem, "name:a", "call")
    view = RunView(mem, RUN)
    assert set(view.records()) == {"name:a", "name:b"} and view.sub_stats("name:a")[0] == 1
    done = commands.clear_steps(mem, RUN, ["a"])
    assert done.message == "cleared: a; invalidated dependants: b"
    rows = {i.label: i.state for i in status.step_infos(mem, RUN)}
    assert rows == {"b": "invalidated"} and view.sub_stats("name:a")[0] == 0
    assert commands.pin_steps(mem, RUN, ["b"]).message == "pinned: b"
    assert view.state("name:b").pinned
