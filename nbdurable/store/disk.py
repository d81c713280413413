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

import contextlib
import errno
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import diskcache

from .. import faults
from ..errors import CorruptRecord, FormatVersionError, StoreError
from . import blobs
from .records import FORMAT_VERSION, RECORD_FORMAT

MAGIC = b"NBD\x01"
_SIG = 32
_HDR = struct.Struct(">I")
RUN_SCOPE = "~run"
DBNAME = diskcache.core.DBNAME
# The only value-file names diskcache makes (Disk.filename): "ab/cd/<28 hex>.val".
_VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")
# The files of the cache directory that no record points to.
_DB_FILES = frozenset({DBNAME, DBNAME + "-wal", DBNAME + "-shm"})
# check() leaves younger unreferenced value files alone: diskcache writes a value
# file before its row, and may wait out its 60 s lock timeout in between.
ORPHAN_GRACE = 300.0
#: A body at least this large is returned as a memoryview of the stored bytes, not a copy.
_VIEW_OVER = 64 * 1024
#: Values shorter than this are kept in the database row (diskcache's min_file_size).
_INLINE_MAX = diskcache.core.DEFAULT_SETTINGS["disk_min_file_size"]
# One encoder for every header: json.dumps with options builds a new one per call.
_JSON = json.JSONEncoder(separators=(",", ":"), default=str)
_JSON_DECODE = json.JSONDecoder().decode
#: load_prefix holds values of at most this many bytes, and this many bytes in all.
LOAD_ROW_MAX = 16 * 1024
LOAD_TOTAL_MAX = 32 * 1024 * 1024
_SELECT_PREFIX = (
    "SELECT key, CASE WHEN filename IS NULL AND typeof(value) = 'blob' AND length(value) <= ?"
    " THEN value END"
    " FROM Cache WHERE raw = 1 AND key >= ? AND key < ? ORDER BY key"
)
_SELECT_VALUE = "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
_INSERT_INLINE = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
    " tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, ?, NULL, ?)"
)
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
        if len(value) >= self.min_file_size:
            # diskcache writes bytes through io.BytesIO, i.e. line by line: a
            # 100 MB binary pickle became ~300,000 write() calls. One write.
            filename, full_path = self.filename(key, value)
            self._write(full_path, (value,), "xb")
            return len(value), diskcache.core.MODE_BINARY, filename, None
        return super().store(value, read, key=key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        """Refuse any value diskcache would unpickle (or decode as text)."""
        if mode not in (diskcache.core.MODE_RAW, diskcache.core.MODE_BINARY):
            raise CorruptRecord(f"refusing a store value of diskcache mode {mode} (not bytes)")
        if filename is not None and not _VALUE_FILE.fullmatch(filename):
            raise CorruptRecord(f"refusing a store value kept outside the store ({filename!r})")
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path: str) -> None:
        """Remove a value file, never a file a planted row names outside the store."""
        if _VALUE_FILE.fullmatch(file_path):
            super().remove(file_path)


def run_hash(run_id: str) -> str:
    """The short, fixed-length form of a run id used in keys."""
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


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


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _reason(exc: BaseException) -> str:
    """The OS's or SQLite's own words for a failure, on one line."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return _one_line(exc.strerror + where)
    return _one_line(exc) or type(exc).__name__


def _advice(exc: BaseException) -> str:
    """What the user can do about ``exc``, judged by its errno or SQLite's message."""
    code = getattr(exc, "errno", None)
    # The error's own words, never its file name: a path may contain "full".
    text = (getattr(exc, "strerror", None) or str(exc)).lower()
    if code in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in text or "no space" in text:
        return "free disk space, or set NBDURABLE_DIR to a directory on another disk"
    if (
        isinstance(exc, PermissionError)
        or code in (errno.EACCES, errno.EPERM, errno.EROFS)
        or "readonly" in text
        or "read-only" in text
    ):
        return "make the directory writable by you, or set NBDURABLE_DIR to one that is"
    return "check the directory (free space, permissions), or set NBDURABLE_DIR to another one"


class Store:
    """A narrow interface over one diskcache directory.

    ``durability`` is ``"crash"`` (SQLite ``synchronous=NORMAL`` in WAL mode:
    a record survives a kernel or process crash) or ``"power"``
    (``synchronous=FULL``: it also survives power loss, at a cost per write).

    Every failure of the disk or of SQLite (no space, read-only, no permission,
    a damaged database) is raised as :class:`StoreError`, one line naming the
    store and what to do. If the directory is deleted or replaced while open
    (diskcache would go on writing into the unlinked database: silent loss),
    the next read or write raises :class:`StoreError` and the one after opens
    the store now at that path (a new, empty one if it is gone).
    """

    @staticmethod
    def exists(directory: str | os.PathLike[str]) -> bool:
        """True if ``directory`` holds an nbdurable store."""
        return (Path(directory) / CACHE_DIR / DBNAME).exists()

    @property
    def cache_dir(self) -> Path:
        """The diskcache directory inside the store (diskcache owns every file in it)."""
        return self.path / CACHE_DIR

    def __init__(self, directory: str | os.PathLike[str], *, durability: str = "crash") -> None:
        if durability not in ("crash", "power"):
            raise ValueError(f"durability must be 'crash' or 'power', got {durability!r}")
        self.path = Path(directory).expanduser().absolute()
        self._durability = durability
        self._cache: diskcache.Cache | None = None
        #: How many times the store was reopened (see :meth:`reopen`): a lease or
        #: anything else held in the store before the reopen is gone.
        self.generation = 0
        #: How many deletes this object made: an index of records read before
        #: (see engine.SubIndex) is read again after one.
        self.deletions = 0
        self._open()

    def _open(self) -> None:
        self._replaced = False
        # Keys that failed to verify, or blobs found missing: put_blob rewrites them.
        self._suspect: set[str] = set()
        try:
            created = not self.path.exists()
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if created:
                os.chmod(self.path, 0o700)
            self._secret = _load_secret(self.path)
            self._mac = hmac.new(self._secret, digestmod="sha256")
            self.cache_dir.mkdir(mode=0o700, exist_ok=True)
            self._cache = diskcache.Cache(
                str(self.cache_dir),
                disk=SafeDisk,
                eviction_policy="none",
                cull_limit=0,
                statistics=0,
                timeout=60,
                sqlite_synchronous=2 if self._durability == "power" else 1,
            )
            self._db_file = os.path.join(self.cache_dir, DBNAME)  # a str: stat() per write
            st = os.stat(self._db_file)
            self._identity = (st.st_dev, st.st_ino)
            self._check_format()
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the nbdurable store at {self.path}: {_reason(exc)}. "
                f"Nothing was read or recorded; {_advice(exc)}."
            ) from exc

    @property
    def _db(self) -> diskcache.Cache:
        """The open cache; reopened first if it was found deleted or replaced."""
        if self._replaced:
            self.reopen()
        assert self._cache is not None
        return self._cache

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """Turn a disk or SQLite failure into a one-line :class:`StoreError`."""
        try:
            yield
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise self._failure(doing, exc) from exc

    def _failure(self, doing: str, exc: BaseException) -> StoreError:
        if doing == "write":
            return StoreError(
                f"could not write to the nbdurable store at {self.path}: {_reason(exc)}. "
                f"Nothing was recorded for this write; {_advice(exc)}, then run the cell again."
            )
        return StoreError(
            f"could not {doing} the nbdurable store at {self.path}: {_reason(exc)}; {_advice(exc)}."
        )

    # -- deleted or replaced while open ----------------------------------------------
    def replaced(self) -> bool:
        """True if the directory no longer holds the database this object opened (one stat)."""
        try:
            st = os.stat(self._db_file)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    def _ensure_same(self, doing: str) -> None:
        if not self._replaced and self.replaced():
            self._replaced = True  # the next operation reopens (see _db)
            raise StoreError(
                f"the nbdurable store at {self.path} was deleted or replaced while in use; "
                f"nothing was {doing}. Run the cell again to open the store now there (a new, "
                "empty one if it is gone), or set NBDURABLE_DIR to another directory and "
                "restart the kernel."
            )

    def check_same(self) -> None:
        """Raise :class:`StoreError` if the store was deleted or replaced (one stat)."""
        if self._replaced:
            self.reopen()
        self._ensure_same("read")

    def reopen(self) -> None:
        """Close, and open the store now at :attr:`path` (creating it if it is gone)."""
        with contextlib.suppress(Exception):  # a connection to an unlinked file
            if self._cache is not None:
                self._cache.close()
        self._cache = None
        self.generation += 1
        self._open()

    # -- encoding -----------------------------------------------------------
    def _sign(self, key: str, *parts: bytes | memoryview) -> bytes:
        # HMAC of key + NUL + the parts, fed piece by piece: a 100 MB value is
        # hashed where it lies, never concatenated into a copy first. The keyed
        # state is computed once per store and copied per record.
        mac = self._mac.copy()
        mac.update(key.encode("utf-8", "surrogatepass"))
        mac.update(b"\0")
        for part in parts:
            mac.update(part)
        return mac.digest()

    def _encode(self, key: str, header: dict[str, Any], body: bytes) -> bytes:
        head = _JSON.encode(header).encode("utf-8")
        prefix = _HDR.pack(len(head)) + head
        return b"".join((MAGIC, self._sign(key, prefix, body), prefix, body))

    def _decode(
        self, key: str, raw: Any, *, newer_ok: bool = False
    ) -> tuple[dict[str, Any], bytes]:
        """Verify and split a stored value; the body is a memoryview when large (no copy)."""
        start = len(MAGIC) + _SIG
        if not isinstance(raw, bytes) or len(raw) < start + _HDR.size:
            raise CorruptRecord(f"record {key!r} is truncated or not an nbdurable record")
        if not raw.startswith(MAGIC):
            raise CorruptRecord(f"record {key!r} does not start with the nbdurable marker")
        view = memoryview(raw)
        if not hmac.compare_digest(view[len(MAGIC) : start], self._sign(key, view[start:])):
            raise CorruptRecord(
                f"record {key!r} failed its signature check (damaged, planted, or written "
                "with another store key); it is ignored"
            )
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
        body = view[body_at:] if len(raw) - body_at >= _VIEW_OVER else raw[body_at:]
        return header, body  # type: ignore[return-value]

    def _check_format(self) -> None:
        # Read past the per-record format check: a newer store must be reported as
        # such (FormatVersionError), not as one unreadable record.
        assert self._cache is not None
        try:
            raw = self._cache.get("meta/format", default=None, retry=True)
            found = None if raw is None else self._decode("meta/format", raw, newer_ok=True)
        except CorruptRecord as exc:
            raise StoreError(
                f"the nbdurable store at {self.path} cannot be verified: its format record "
                "fails its signature check. Either it was written with another store key "
                "(NBDURABLE_KEY, or the key file, differs from the one it was written with) or "
                "that record was damaged. Restore the key, or set NBDURABLE_DIR to a new "
                "directory."
            ) from exc
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
        return self._fetch(key, self._verified)

    def _verified(self, key: str, row: tuple[int, str | None, Any]) -> Any:
        raw = self._raw(row)
        return None if raw is None else self._decode(key, raw)

    def _fetch(self, key: str, load: Callable[[str, Any], Any]) -> Any:
        """``load(key, row)`` of ``key``'s row (None if absent), on a store checked to be there.

        The read path of records and blobs alike: a failure of the disk or of
        SQLite becomes a one-line :class:`StoreError`, and a key that fails its
        check is remembered as suspect (``put_blob`` rewrites it). One SELECT
        on diskcache's own table, as ``Cache.get`` does without its per-call
        Python layers (no expiry, no statistics, no eviction here).
        """
        try:
            self.check_same()
            assert self._cache is not None
            rows = self._cache._sql(_SELECT_VALUE, (key,)).fetchall()
            return load(key, rows[0]) if rows else None
        except CorruptRecord:
            self._suspect.add(key)
            raise
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise self._failure("read", exc) from exc

    def _read(self, key: str) -> bytes | None:
        """The stored bytes of ``key``, unchecked and unverified (None if absent)."""
        assert self._cache is not None
        rows = self._cache._sql(_SELECT_VALUE, (key,)).fetchall()
        return self._raw(rows[0]) if rows else None

    def _raw(self, row: tuple[int, str | None, Any]) -> Any:
        """A row's stored value.

        A value file is read by :class:`SafeDisk` (which refuses anything but
        bytes, and files outside the store); one that vanished reads as
        absent, as in ``Cache.get``.
        """
        mode, filename, value = row
        if filename is None and mode == diskcache.core.MODE_RAW:
            return value  # not bytes (a planted number or text): _decode refuses it
        assert self._cache is not None
        try:
            return self._cache._disk.fetch(mode, filename, value, False)
        except FileNotFoundError:
            return None

    def load_prefix(self, prefix: str) -> dict[str, bytes | None]:
        """Every key under ``prefix`` with its stored bytes, unverified (one range read).

        Pass an entry to :meth:`get_loaded`, which verifies it. Values kept in
        value files, over :data:`LOAD_ROW_MAX` bytes, or past
        :data:`LOAD_TOTAL_MAX` bytes in all map to None: ``get_loaded`` reads
        those one by one: this never holds more than 32 MB, and the caller drops
        each entry once used.
        """
        try:
            self.check_same()
            assert self._cache is not None
            rows = self._cache._sql(
                _SELECT_PREFIX, (LOAD_ROW_MAX, prefix, _upper(prefix))
            ).fetchall()
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise self._failure("read", exc) from exc
        out: dict[str, bytes | None] = {}
        total = 0
        for key, value in rows:
            if value is not None:
                total += len(value)
                if total > LOAD_TOTAL_MAX:
                    value = None
            out[key] = value
        return out

    def get_loaded(self, key: str, raw: bytes | None) -> tuple[dict[str, Any], bytes] | None:
        """Verified ``(header, body)`` of an entry of :meth:`load_prefix` (None: read it now)."""
        if raw is None:
            return self.get(key)
        try:
            return self._decode(key, raw)
        except CorruptRecord:
            self._suspect.add(key)
            raise

    def put(self, key: str, header: dict[str, Any], body: bytes = b"") -> int:
        """Write one record atomically; return its size in bytes."""
        value = self._encode(key, header, body)
        self._write({key: value})
        return len(value)

    def apply(
        self,
        puts: Iterable[tuple[str, dict[str, Any], bytes]] = (),
        deletes: Iterable[str] = (),
        blobs: dict[str, bytes] | None = None,
    ) -> int:
        """Write and delete in one transaction: all of it happens or none of it.

        ``blobs`` are small blobs deferred by :meth:`put_blob` (already encoded).
        """
        values = dict(blobs or {})
        values.update((k, self._encode(k, h, b)) for k, h, b in puts)
        self._write(values, list(deletes))
        return sum(len(v) for v in values.values())

    def _write(self, values: dict[str, bytes], deletes: list[str] = ()) -> None:  # type: ignore[assignment]
        with self._guard("write"):
            db = self._db
            self._ensure_same("recorded for this write")
            if len(values) == 1 and not deletes and not faults.armed("store-write"):
                # The hot path of recording (a sub-step's result): one INSERT if new and small.
                ((k, v),) = values.items()
                if len(v) >= _INLINE_MAX or not self._insert_new(db, k, v):
                    db.set(k, v, retry=True)
            else:
                if deletes:
                    self.deletions += 1
                with db.transact(retry=True):
                    for k, v in values.items():
                        db.set(k, v)
                    for k in deletes:
                        db.delete(k)
                    faults.point("store-write")
        self._suspect.difference_update(values)

    @staticmethod
    def _insert_new(db: diskcache.Cache, key: str, value: bytes) -> bool:
        """Write a new small record with one INSERT (its own transaction); False if it exists.

        ``Cache.set`` spends four statements (BEGIN IMMEDIATE, SELECT, INSERT,
        COMMIT) because a cache key is usually already there; a record's key is
        usually new. The row is the one ``Cache.set`` writes for bytes stored
        inline, and diskcache's triggers keep its count and size. A key that
        exists (IntegrityError on its unique index) goes through ``Cache.set``,
        which also removes a value file the old row had; so does any other
        SQLite refusal (``Cache.set`` retries a lock held past the busy timeout).
        """
        now = time.time()
        try:
            db._sql(_INSERT_INLINE, (key, now, now, diskcache.core.MODE_RAW, sqlite3.Binary(value)))
        except sqlite3.IntegrityError:
            return False
        except sqlite3.OperationalError:  # e.g. locked past the busy timeout: Cache.set retries
            return False
        return True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A context manager: reads and writes inside it are one SQLite transaction."""
        with self._guard("write"), self._db.transact(retry=True):
            yield

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        with self._guard("write"):
            db = self._db
            self._ensure_same("deleted")
            self.deletions += 1
            return bool(db.delete(key, retry=True))

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete several keys in one transaction."""
        n = 0
        with self._guard("write"):
            db = self._db
            self._ensure_same("deleted")
            self.deletions += 1
            with db.transact(retry=True):
                for k in keys:
                    n += bool(db.delete(k))
        return n

    def scan(self, prefix: str) -> list[str]:
        """All keys that start with ``prefix``, in key order (an index range scan).

        Only plain-text keys are seen: a row whose key diskcache pickled
        (``raw = 0``, planted by plain diskcache) is never read, let alone unpickled.
        """
        # diskcache has no prefix scan; its Cache table has a unique index on
        # (key, raw), so a range query on it is O(log n + matches).
        with self._guard("read"):
            rows = self._db._sql(
                "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? ORDER BY key",
                (prefix, _upper(prefix)),
            ).fetchall()
        return [r[0] for r in rows]

    def stats(self, prefix: str) -> tuple[int, int]:
        """``(count, bytes)`` of the keys under ``prefix``."""
        with self._guard("read"):
            row = self._db._sql(
                "SELECT COUNT(*), COALESCE(SUM(size + COALESCE(LENGTH(value), 0)), 0) "
                "FROM Cache WHERE raw = 1 AND key >= ? AND key < ?",
                (prefix, _upper(prefix)),
            ).fetchone()
        return int(row[0]), int(row[1])

    def size_of(self, key: str) -> int:
        """Bytes stored for ``key`` (0 if absent)."""
        with self._guard("read"):
            row = self._db._sql(
                "SELECT size + COALESCE(LENGTH(value), 0) FROM Cache WHERE raw = 1 AND key = ?",
                (key,),
            ).fetchone()
        return int(row[0]) if row else 0

    def has(self, key: str) -> bool:
        """True if ``key`` is present (not verified)."""
        with self._guard("read"):
            return key in self._db

    # -- blobs: variables stored once by content (format: see nbdurable.blobs) --------
    def put_blob(
        self,
        stream: bytes,
        buffers: Sequence[memoryview] = (),
        *,
        defer: dict[str, bytes] | None = None,
        secrets: dict[str, bytes] | None = None,
    ) -> tuple[str, int]:
        """Store a pickle and its out-of-band buffers once by content.

        Returns ``(sha, bytes written)``; 0 bytes if the same blob was already
        there. A blob this process found damaged or missing is written again,
        so the step that re-ran because of it replays next time. With
        ``defer``, a small blob is not written but added to it, for
        :meth:`apply` to write in the same transaction as the record that
        refers to it (one commit per step, not one per variable). Raises
        :class:`blobs.SecretFound` (writing nothing) if the bytes hold one of
        ``secrets``: they are searched in the very copy that is hashed and written.
        """
        bufs = [memoryview(b).cast("B") for b in buffers]
        parts: list[blobs.Buffer] = [blobs.head(stream, bufs), stream, *bufs]
        total = sum(memoryview(p).nbytes for p in parts)
        if total < _INLINE_MAX:
            data = b"".join(parts)
            found = blobs.scan(data, secrets or {})
            if found:
                raise blobs.SecretFound(found)
            sha = hashlib.sha256(data).hexdigest()
            key = "b/" + sha
            if defer is not None:
                defer[key] = data  # rewriting equal bytes is harmless: no existence check
                return sha, total
            if key not in self._suspect and self.has(key):
                return sha, 0
            self._write({key: data})
            return sha, total
        with self._guard("write"):
            db = self._db
            self._ensure_same("recorded for this write")
            filename, full_path = db._disk.filename()
            os.makedirs(os.path.dirname(full_path), exist_ok=True)
            key, committed = "", False
            try:
                with open(full_path, "xb") as f:
                    sha = blobs.write(f, parts, secrets or {})
                key = "b/" + sha
                if key in self._suspect or not self.has(key):
                    self._insert_file(db, key, filename, total)
                    committed = True
            finally:
                # Failed, interrupted, or stored already: remove the file, unless a row
                # committed just before an interrupt names it (then it is the value).
                if not committed and not (key and self._names(db, key, filename)):
                    with contextlib.suppress(OSError):
                        os.unlink(full_path)
        self._suspect.discard(key)
        return sha, total if committed else 0

    @staticmethod
    def _names(db: diskcache.Cache, key: str, filename: str) -> bool:
        """True if ``key``'s row points at value file ``filename``."""
        try:
            rows = db._sql(
                "SELECT 1 FROM Cache WHERE key = ? AND raw = 1 AND filename = ?", (key, filename)
            ).fetchall()
        except sqlite3.Error:
            return False
        return bool(rows)

    @staticmethod
    def _insert_file(db: diskcache.Cache, key: str, filename: str, size: int) -> None:
        """Point ``key`` at a value file just written (the row ``Cache.set`` would write)."""
        now = time.time()
        columns = (None, None, size, diskcache.core.MODE_BINARY, filename, None)
        old = None
        with db.transact(retry=True):
            rows = db._sql("SELECT rowid, filename FROM Cache WHERE key = ? AND raw = 1", (key,))
            found = rows.fetchall()
            if found:
                ((rowid, old),) = found
                db._row_update(rowid, now, columns)
            else:
                db._row_insert(key, 1, now, columns)
        if old and old != filename:
            db._disk.remove(old)  # diskcache's remove ignores a file already gone

    def get_blob(self, sha: str) -> blobs.Blob | None:
        """The verified blob ``sha``, None if absent.

        Raises :class:`CorruptRecord` if it is there but does not match its SHA-256.
        """
        key = "b/" + sha
        blob = self._fetch(key, lambda key, row: self._load_blob(sha, key, row))
        if blob is None:
            # Its row may still be there with its value file gone: rewrite it on put_blob.
            self._suspect.add(key)
        return blob

    def _load_blob(self, sha: str, key: str, row: tuple[int, str | None, Any]) -> blobs.Blob | None:
        mode, filename, value = row
        if filename is None:
            if mode != diskcache.core.MODE_RAW or not isinstance(value, bytes):
                raise CorruptRecord(f"refusing blob {key!r}: not stored as bytes")
            if value.startswith(MAGIC):  # format 1: a signed record
                return blobs.Blob(self._decode(key, value)[1])
            return blobs.writable(blobs.parse(sha, value))
        if mode != diskcache.core.MODE_BINARY or not _VALUE_FILE.fullmatch(filename):
            raise CorruptRecord(f"refusing blob {key!r}: kept outside the store or not bytes")
        try:
            f = open(self.cache_dir / filename, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        with f:
            if f.read(len(MAGIC)) == MAGIC:  # format 1: a signed record
                return blobs.Blob(self._decode(key, MAGIC + f.read())[1])
            f.seek(0)
            return blobs.read_verified(sha, f, os.fstat(f.fileno()).st_size)

    # -- housekeeping ---------------------------------------------------------
    def check(self, fix: bool = True) -> list[str]:
        """Check the database and the value files; with ``fix``, repair what can be.

        Returns one line per problem (empty: the store is sound). Repairs: a
        value file no record points to (left by an interrupted write, e.g. on
        a full disk) is removed unless younger than :data:`ORPHAN_GRACE`
        seconds (it may be a write in progress); a record whose value file is
        missing, of the wrong size, or outside the store is deleted (it could
        not be verified anyway: its step runs again); empty value directories
        are removed. The key file and the database files are never touched,
        and no key or value is unpickled.
        """
        problems: list[str] = []
        done = "; removed" if fix else ""
        with self._guard("check"):
            db = self._db
            rows = db._sql("PRAGMA integrity_check").fetchall()
            if rows != [("ok",)]:
                problems += [f"database {self.cache_dir / DBNAME}: {m}" for (m,) in rows]
            with db.transact(retry=True):
                known: set[Path] = set()
                for rowid, key, size, filename in db._sql(
                    "SELECT rowid, key, size, filename FROM Cache WHERE filename IS NOT NULL"
                ).fetchall():
                    name = repr(key) if isinstance(key, str) else "with a non-text key"
                    full = self.cache_dir / filename
                    if not _VALUE_FILE.fullmatch(filename):
                        bad = f"names a value file outside the store ({filename!r})"
                        full = None
                    else:
                        known.add(full)
                        try:
                            real = full.stat().st_size
                            bad = (
                                None
                                if real == size
                                else f"has a value file of {real} bytes, not {size} (truncated?)"
                            )
                        except FileNotFoundError:
                            bad = "has lost its value file"
                    if bad is None:
                        continue
                    problems.append(f"record {name} {bad}{done}")
                    if fix:
                        db._sql("DELETE FROM Cache WHERE rowid = ?", (rowid,))
                        self.deletions += 1
                        if full is not None:
                            full.unlink(missing_ok=True)
                now = time.time()
                for dirpath, _dirs, files in os.walk(self.cache_dir):
                    top = Path(dirpath) == self.cache_dir
                    for f in files:
                        full = Path(dirpath) / f
                        if full in known or (top and f in _DB_FILES):
                            continue
                        try:
                            if now - full.stat().st_mtime < ORPHAN_GRACE:
                                continue
                        except FileNotFoundError:
                            continue
                        problems.append(f"file {full} belongs to no record{done}")
                        if fix:
                            full.unlink(missing_ok=True)
                if fix:
                    for dirpath, _dirs, _files in os.walk(self.cache_dir, topdown=False):
                        if Path(dirpath) != self.cache_dir:
                            with contextlib.suppress(OSError):  # not empty
                                os.rmdir(dirpath)
        return problems

    def volume(self) -> int:
        """Bytes used on disk."""
        with self._guard("read"):
            return int(self._db.volume())

    def close(self) -> None:
        """Close the underlying connections."""
        if self._cache is not None:
            self._cache.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
