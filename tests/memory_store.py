"""A third engine for the contract tests: a store in a dict, nothing but the primitives.

``MemoryStore`` implements only what :class:`nbdurable.store.base.Store`
declares abstract (over bytes), the way a database engine would; records,
signatures, small and large blobs, the lease's compare-and-set, RunView, the
listing and clear/pin then work on it unchanged (tests/test_engine_contract.py
runs the same contract on it as on the disk and PostgreSQL engines).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from nbdurable.store import Store, blobs, layout
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
