"""The durable log: a signed, never-evicting diskcache directory.

Layout (every key is a plain string, every value is signed bytes)::

    meta/format                      format version of the store
    r/<run>/meta                     run id, notebook, created, last activity
    r/<run>/s/<step key>             StepRecord header (JSON)
    r/<run>/t/<step key>             StepState (pinned / failed / stale)
    r/<run>/u/<step key>/<sub id>    SubRecord header + pickled value
    r/<run>/u/~run/<sub id>          sub-steps called outside any %%step
    b/<sha256>                       a pickled variable, stored once by content

``<run>`` is the first 16 hex digits of the SHA-256 of the run id.

On disk: ``<store>/key`` (the signing secret, 0600) and ``<store>/log/``
(the diskcache directory: its SQLite database and value files).

Every value is ``MAGIC + HMAC-SHA256(secret, key + NUL + payload) + payload``
where payload is a 4-byte header length, a JSON header and an optional body.
A value whose signature does not verify is refused *before* anything is
unpickled: diskcache itself is given a :class:`SafeDisk` that refuses to
unpickle keys or values, so a planted pickle in the directory never runs
(CVE-2025-69872). The secret comes from ``NBDURABLE_KEY`` or the file
``key`` inside the store (created 0600).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import diskcache

from . import faults
from .errors import CorruptRecord, FormatVersionError, StoreError
from .records import FORMAT_VERSION

MAGIC = b"NBD\x01"
_SIG = 32
_HDR = struct.Struct(">I")
RUN_SCOPE = "~run"
#: diskcache lives in this subdirectory: its check(fix=True) deletes every file
#: it does not know in its directory, which would include our key file.
CACHE_DIR = "log"


class SafeDisk(diskcache.Disk):
    """A diskcache ``Disk`` that only stores and loads bytes, never pickles."""

    def put(self, key: Any) -> tuple[Any, bool]:
        """Keys are plain str (stored raw, never pickled)."""
        if not isinstance(key, str):
            raise TypeError(f"nbdurable store keys are str, got {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        """Refuse a pickled key."""
        if not raw:
            raise CorruptRecord("refusing to unpickle a key planted in the store")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        """Values are bytes (stored raw, never pickled)."""
        if not isinstance(value, bytes):
            raise TypeError(f"nbdurable store values are bytes, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        """Refuse any value diskcache would unpickle (or decode as text)."""
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY):
            raise CorruptRecord(f"refusing a store value of diskcache mode {mode} (not bytes)")
        return super().fetch(mode, filename, value, read)


def run_hash(run_id: str) -> str:
    """The short, fixed-length form of a run id used in keys."""
    return hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:16]


class RunKeys:
    """Key builders for one run; see the module docstring for the layout."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.base = f"r/{run_hash(run_id)}/"

    @property
    def meta(self) -> str:
        """The run's metadata key."""
        return self.base + "meta"

    def step(self, step_key: str) -> str:
        """The key of a step's record."""
        return f"{self.base}s/{step_key}"

    def state(self, step_key: str) -> str:
        """The key of a step's pin/failure/stale state."""
        return f"{self.base}t/{step_key}"

    def subs_prefix(self, scope: str) -> str:
        """The prefix of every sub-step key of ``scope`` (a step key or RUN_SCOPE)."""
        return f"{self.base}u/{scope}/"

    def sub(self, scope: str, sub_id: str) -> str:
        """The key of one sub-step."""
        return f"{self.base}u/{scope}/{sub_id}"


def _upper(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _load_secret(directory: Path) -> bytes:
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


class Store:
    """A narrow interface over one diskcache directory.

    ``durability`` is ``"crash"`` (SQLite ``synchronous=NORMAL`` in WAL mode:
    a record survives a kernel or process crash) or ``"power"``
    (``synchronous=FULL``: it also survives power loss, at a cost per write).
    """

    @staticmethod
    def exists(directory: str | os.PathLike[str]) -> bool:
        """True if ``directory`` holds an nbdurable store."""
        return (Path(directory) / CACHE_DIR / "cache.db").exists()

    @property
    def cache_dir(self) -> Path:
        """The diskcache directory inside the store (diskcache owns every file in it)."""
        return self.path / CACHE_DIR

    def __init__(self, directory: str | os.PathLike[str], *, durability: str = "crash") -> None:
        if durability not in ("crash", "power"):
            raise ValueError(f"durability must be 'crash' or 'power', got {durability!r}")
        self.path = Path(directory).expanduser().absolute()
        try:
            created = not self.path.exists()
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if created:
                os.chmod(self.path, 0o700)
            self._secret = _load_secret(self.path)
            self.cache_dir.mkdir(mode=0o700, exist_ok=True)
            self._cache = diskcache.Cache(
                str(self.cache_dir),
                disk=SafeDisk,
                eviction_policy="none",
                cull_limit=0,
                statistics=0,
                timeout=60,
                sqlite_synchronous=2 if durability == "power" else 1,
            )
        except OSError as exc:
            raise StoreError(
                f"cannot open the nbdurable store at {self.path}: {exc.strerror or exc}. "
                "Check that the directory is writable, or set NBDURABLE_DIR to another one."
            ) from exc
        self._check_format()

    # -- encoding -----------------------------------------------------------
    def _sign(self, key: str, payload: bytes) -> bytes:
        return hmac.new(self._secret, key.encode("utf-8") + b"\0" + payload, "sha256").digest()

    def _encode(self, key: str, header: dict[str, Any], body: bytes) -> bytes:
        head = json.dumps(header, separators=(",", ":"), default=str).encode("utf-8")
        payload = _HDR.pack(len(head)) + head + body
        return MAGIC + self._sign(key, payload) + payload

    def _decode(
        self, key: str, raw: Any, *, newer_ok: bool = False
    ) -> tuple[dict[str, Any], bytes]:
        if not isinstance(raw, bytes) or len(raw) < len(MAGIC) + _SIG + _HDR.size:
            raise CorruptRecord(f"record {key!r} is truncated or not an nbdurable record")
        if not raw.startswith(MAGIC):
            raise CorruptRecord(f"record {key!r} does not start with the nbdurable marker")
        sig = raw[len(MAGIC) : len(MAGIC) + _SIG]
        payload = memoryview(raw)[len(MAGIC) + _SIG :]
        if not hmac.compare_digest(sig, self._sign(key, payload.tobytes())):
            raise CorruptRecord(
                f"record {key!r} failed its signature check (damaged, planted, or written "
                "with another store key); it is ignored"
            )
        (n,) = _HDR.unpack_from(payload)
        try:
            header = json.loads(payload[_HDR.size : _HDR.size + n].tobytes())
        except ValueError as exc:
            raise CorruptRecord(f"record {key!r} has an unreadable header") from exc
        fmt = header.get("format", FORMAT_VERSION)
        if not newer_ok and (not isinstance(fmt, int) or fmt > FORMAT_VERSION):
            raise CorruptRecord(
                f"record {key!r} has format {fmt}, newer than this nbdurable reads "
                f"({FORMAT_VERSION}); upgrade nbdurable to replay it"
            )
        return header, payload[_HDR.size + n :].tobytes()

    def _check_format(self) -> None:
        # Read past the per-record format check: a newer store must be reported as
        # such (FormatVersionError), not as one unreadable record.
        raw = self._cache.get("meta/format", default=None, retry=True)
        found = None if raw is None else self._decode("meta/format", raw, newer_ok=True)
        if found is None:
            self.put("meta/format", {"format": FORMAT_VERSION, "created": time.time()})
            return
        version = found[0].get("format")
        if version != FORMAT_VERSION:
            raise FormatVersionError(
                f"the store at {self.path} has format {version}; this nbdurable reads format "
                f"{FORMAT_VERSION}. Upgrade nbdurable, or set NBDURABLE_DIR to a new directory."
            )

    # -- the interface --------------------------------------------------------
    def get(self, key: str) -> tuple[dict[str, Any], bytes] | None:
        """Verified ``(header, body)`` for ``key``, None if absent.

        Raises :class:`CorruptRecord` if the record is present but does not verify.
        """
        try:
            raw = self._cache.get(key, default=None, retry=True)
        except OSError as exc:
            raise StoreError(f"cannot read {key!r} from {self.path}: {exc}") from exc
        if raw is None:
            return None
        return self._decode(key, raw)

    def put(self, key: str, header: dict[str, Any], body: bytes = b"") -> int:
        """Write one record atomically; return its size in bytes."""
        value = self._encode(key, header, body)
        self._write({key: value})
        return len(value)

    def apply(
        self,
        puts: Iterable[tuple[str, dict[str, Any], bytes]] = (),
        deletes: Iterable[str] = (),
    ) -> int:
        """Write and delete in one transaction: all of it happens or none of it."""
        values = {k: self._encode(k, h, b) for k, h, b in puts}
        self._write(values, list(deletes))
        return sum(len(v) for v in values.values())

    def _write(self, values: dict[str, bytes], deletes: list[str] = ()) -> None:  # type: ignore[assignment]
        try:
            if len(values) == 1 and not deletes and not faults.armed("store-write"):
                ((k, v),) = values.items()
                self._cache.set(k, v, retry=True)
                return
            with self._cache.transact(retry=True):
                for k, v in values.items():
                    self._cache.set(k, v)
                for k in deletes:
                    self._cache.delete(k)
                faults.point("store-write")
        except OSError as exc:
            raise StoreError(
                f"could not write to the nbdurable store at {self.path}: "
                f"{exc.strerror or exc}. Nothing was recorded for this write; free disk "
                "space or fix permissions, then run the cell again."
            ) from exc

    def transaction(self) -> Any:
        """A context manager: reads and writes inside it are one SQLite transaction."""
        return self._cache.transact(retry=True)

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        return bool(self._cache.delete(key, retry=True))

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete several keys in one transaction."""
        n = 0
        with self._cache.transact(retry=True):
            for k in keys:
                n += bool(self._cache.delete(k))
        return n

    def scan(self, prefix: str) -> list[str]:
        """All keys that start with ``prefix``, in key order (an index range scan)."""
        # diskcache has no prefix scan; its Cache table has a unique index on
        # (key, raw), so a range query on it is O(log n + matches).
        rows = self._cache._sql(
            "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? ORDER BY key",
            (prefix, _upper(prefix)),
        ).fetchall()
        return [r[0] for r in rows]

    def stats(self, prefix: str) -> tuple[int, int]:
        """``(count, bytes)`` of the keys under ``prefix``."""
        row = self._cache._sql(
            "SELECT COUNT(*), COALESCE(SUM(size + COALESCE(LENGTH(value), 0)), 0) FROM Cache "
            "WHERE raw = 1 AND key >= ? AND key < ?",
            (prefix, _upper(prefix)),
        ).fetchone()
        return int(row[0]), int(row[1])

    def size_of(self, key: str) -> int:
        """Bytes stored for ``key`` (0 if absent)."""
        row = self._cache._sql(
            "SELECT size + COALESCE(LENGTH(value), 0) FROM Cache WHERE raw = 1 AND key = ?", (key,)
        ).fetchone()
        return int(row[0]) if row else 0

    def has(self, key: str) -> bool:
        """True if ``key`` is present (not verified)."""
        return key in self._cache

    # -- blobs: variables stored once by content --------------------------------
    def put_blob(self, data: bytes) -> tuple[str, int]:
        """Store ``data`` under its SHA-256 unless there; return ``(sha, bytes written)``."""
        sha = hashlib.sha256(data).hexdigest()
        key = "b/" + sha
        if key in self._cache:
            return sha, 0
        return sha, self.put(key, {"kind": "blob"}, data)

    def get_blob(self, sha: str) -> bytes | None:
        """The verified bytes of blob ``sha``, None if absent."""
        got = self.get("b/" + sha)
        return None if got is None else got[1]

    # -- housekeeping ---------------------------------------------------------
    def check(self, fix: bool = True) -> list[str]:
        """Run diskcache's integrity check; with ``fix`` remove orphan files."""
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._cache.check(fix=fix, retry=True)
        return [str(w.message) for w in caught]

    def volume(self) -> int:
        """Bytes used on disk."""
        return int(self._cache.volume())

    def close(self) -> None:
        """Close the underlying connections."""
        self._cache.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
