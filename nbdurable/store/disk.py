"""The embedded engine: a signed, never-evicting diskcache directory.

On disk: ``<store>/key`` (the signing secret, 0600; see :mod:`.codec`) and
``<store>/log/`` (the diskcache directory: its SQLite database and value
files). What the keys are is :mod:`.layout`'s business; every call into
diskcache is in :mod:`._diskcache`.

``durability`` is ``"crash"`` (SQLite ``synchronous=NORMAL`` in WAL mode:
a record survives a kernel or process crash) or ``"power"``
(``synchronous=FULL``: it also survives power loss, at a cost per write).

If the directory is deleted or replaced while open (diskcache would go on
writing into the unlinked database: silent loss), the next read or write
raises :class:`StoreError` and the one after opens the store now at that
path (a new, empty one if it is gone).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import faults
from ..errors import CorruptRecord, DamagedDatabase, StoreError
from ..text import one_line
from . import blobs, codec, layout
from ._diskcache import DBNAME, INLINE_MAX, MODE_BINARY, MODE_RAW, VALUE_FILE, Rows
from .base import Fence, Store
from .ownership import check_private

# The files of the cache directory that no record points to.
_DB_FILES = frozenset({DBNAME, DBNAME + "-wal", DBNAME + "-shm"})
# check() leaves younger unreferenced value files alone: diskcache writes a value
# file before its row, and may wait out its 60 s lock timeout in between.
ORPHAN_GRACE = 300.0
#: diskcache lives in this subdirectory: its check(fix=True) deletes every file
#: it does not know in its directory, which would include our key file.
CACHE_DIR = "log"


_CHECK_ADVICE = (
    "`nbdurable check --store DIR` keeps a copy of it and starts it afresh (every step "
    "then runs again), or restore the store from a backup"
)


def _reason(exc: BaseException) -> str:
    """The OS's or SQLite's own words for a failure, on one line."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return one_line(exc.strerror + where)
    return one_line(exc) or type(exc).__name__


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


class DiskStore(Store):
    """The store in one local directory; see the module docstring."""

    small_blob_max = INLINE_MAX

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
        self._rows: Rows | None = None
        self.generation = 0
        self.deletions = 0
        self._open()

    def _open(self) -> None:
        self._replaced = False
        try:
            created = not self.path.exists()
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if created:
                os.chmod(self.path, 0o700)
            # Whose it is, before its key is read (see .ownership).
            check_private(self.path, "directory")
            check_private(self.path / "key", "key file")
            check_private(self.cache_dir, "database folder")
            db_file = self.cache_dir / DBNAME
            had_rows = db_file.exists()
            if had_rows and db_file.stat().st_size == 0 and (self.path / "key").exists():
                # diskcache writes its tables as it makes the file: empty, it was emptied.
                raise DamagedDatabase(
                    f"the store's database {db_file} is empty: its records were lost (the "
                    f"file was truncated or replaced). Nothing was read; {_CHECK_ADVICE}",
                    str(db_file),
                )
            self.cache_dir.mkdir(mode=0o700, exist_ok=True)
            try:
                self._rows = Rows(str(self.cache_dir), self._durability)
            except sqlite3.DatabaseError as exc:
                if not had_rows or isinstance(exc, sqlite3.OperationalError):
                    raise  # not damage: a lock, a full disk, permissions (said below)
                raise DamagedDatabase(
                    f"the store's database {db_file} is damaged ({_reason(exc)}): nothing "
                    f"was read; {_CHECK_ADVICE}",
                    str(db_file),
                ) from None
            key_file = self.path / "key"
            if had_rows and not os.environ.get("NBDURABLE_KEY") and not key_file.exists():
                if self._rows.stats("", "\uffff")[0]:  # its format record is signed too
                    # A new key would take every record for a forgery ("another key").
                    self._rows.close()
                    self._rows = None
                    raise StoreError(
                        f"the store key file {key_file} is missing, and the store holds "
                        "records signed with it: restore the file (or set NBDURABLE_KEY to "
                        "the key), or move the store aside to start afresh"
                    )
            secret = codec.load_secret(self.path)
            self._db_file = os.path.join(self.cache_dir, DBNAME)  # a str: stat() per write
            st = os.stat(self._db_file)
            self._identity = (st.st_dev, st.st_ino)
            self._start(secret)
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(
                f"cannot open the nbdurable store at {self.path}: {_reason(exc)}. "
                f"Nothing was read or recorded; {_advice(exc)}."
            ) from exc

    @property
    def _db(self) -> Rows:
        """The open cache; reopened first if it was found deleted or replaced."""
        if self._replaced:
            self.reopen()
        assert self._rows is not None
        return self._rows

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
            if self._rows is not None:
                self._rows.close()
        self._rows = None
        self.generation += 1
        self._open()

    # -- reading ------------------------------------------------------------------------
    def read(self, key: str) -> Any:
        """The stored bytes of ``key`` (None if absent), on a store checked to be there."""
        return self._fetch(key, lambda key, row: self._db.value(row))

    def _fetch(self, key: str, load: Callable[[str, Any], Any]) -> Any:
        """``load(key, row)`` of ``key``'s row (None if absent), on a store checked to be there.

        The read path of records and blobs alike: a failure of the disk or of
        SQLite becomes a one-line :class:`StoreError`, and a key that fails its
        check is remembered as suspect (``put_blob`` rewrites it).
        """
        try:
            self.check_same()
            row = self._db.row(key)
            return None if row is None else load(key, row)
        except CorruptRecord:
            self._suspect.add(key)
            raise
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise self._failure("read", exc) from exc

    def read_prefix(self, prefix: str, row_max: int) -> list[tuple[str, bytes | None]]:
        """Keys under ``prefix`` with their inline bytes (value files: None)."""
        try:
            self.check_same()
            return self._db.prefix(prefix, layout.upper(prefix), row_max)
        except StoreError:
            raise
        except (OSError, sqlite3.Error) as exc:
            raise self._failure("read", exc) from exc

    def scan(self, prefix: str) -> list[str]:
        """All keys that start with ``prefix``, in key order (an index range scan)."""
        with self._guard("read"):
            return self._db.keys(prefix, layout.upper(prefix))

    def stats(self, prefix: str) -> tuple[int, int]:
        """``(count, bytes)`` of the keys under ``prefix``."""
        with self._guard("read"):
            return self._db.stats(prefix, layout.upper(prefix))

    def stats_by_scope(self, prefix: str) -> dict[str, tuple[int, int]]:
        """``(count, bytes)`` of the keys under ``prefix`` by scope (see :class:`Store`)."""
        with self._guard("read"):
            return self._db.stats_by_scope(prefix, layout.upper(prefix))

    def size_of(self, key: str) -> int:
        """Bytes stored for ``key`` (0 if absent)."""
        with self._guard("read"):
            return self._db.size_of(key)

    def has(self, key: str) -> bool:
        """True if ``key`` is present (not verified)."""
        with self._guard("read"):
            return self._db.has(key)

    # -- writing ------------------------------------------------------------------------
    def write(
        self, values: dict[str, bytes], deletes: Sequence[str] = (), fence: Fence | None = None
    ) -> None:
        """Write and delete in one transaction (under ``fence``: see Store.write)."""
        with self._guard("write"):
            db = self._db
            self._ensure_same("recorded for this write")
            if faults.armed("store-readonly"):  # as SQLite refuses a read-only directory
                raise sqlite3.OperationalError("attempt to write a readonly database")
            plain = fence is None and not faults.armed("store-write")
            if len(values) == 1 and not deletes and plain:
                # The hot path of recording (a sub-step's result): one INSERT if new and small.
                ((k, v),) = values.items()
                if len(v) >= INLINE_MAX or not db.insert_new(k, v):
                    db.set(k, v)
            else:
                if deletes:
                    self.deletions += 1
                with db.transact():
                    if fence is not None and not fence.held(self.read(fence.key)):
                        raise self._lost(fence)
                    for k, v in values.items():
                        # A new small record (a sub-step's, under its lease's fence): one
                        # INSERT, as on the hot path above; a key that exists, Cache.set.
                        if len(v) >= INLINE_MAX or not db.insert_new(k, v):
                            db.set(k, v, retry=False)
                    for k in deletes:
                        db.delete(k, retry=False)
                    faults.point("store-write")
        self._suspect.difference_update(values)

    def _atomically(self, lock: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` in one SQLite transaction (SQLite serializes every writer)."""
        with self._guard("write"):
            self._db  # noqa: B018 - reopens a store found replaced before
            # A store deleted under a step: the write's own message, before any read in fn.
            self._ensure_same("recorded for this write")
        return super()._atomically(lock, fn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A context manager: reads and writes inside it are one SQLite transaction."""
        with self._guard("write"), self._db.transact():
            yield

    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""
        with self._guard("write"):
            db = self._db
            self._ensure_same("deleted")
            self.deletions += 1
            return db.delete(key)

    # -- blobs (format: see .blobs) -------------------------------------------------------
    def _put_blob_file(
        self, parts: Sequence[blobs.Buffer], total: int, secrets: dict[str, bytes]
    ) -> tuple[str, int]:
        """Stream a large blob into a new value file, hashing it, then point its key at it."""
        with self._guard("write"):
            db = self._db
            self._ensure_same("recorded for this write")
            filename, full_path = db.new_value_file()
            # diskcache's two levels of subfolders, private as the store is (makedirs'
            # mode reaches the last folder only)
            folder = os.path.dirname(full_path)
            for part in (os.path.dirname(folder), folder):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700)
            key, committed = "", False
            try:
                fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with open(fd, "wb") as f:
                    sha = blobs.write(f, parts, secrets)
                key = layout.blob(sha)
                if key in self._suspect or not self.has(key):
                    db.point_at(key, filename, total)
                    committed = True
            finally:
                # Failed, interrupted, or stored already: remove the file, unless a row
                # committed just before an interrupt names it (then it is the value).
                if not committed and not (key and db.names(key, filename)):
                    with contextlib.suppress(OSError):
                        os.unlink(full_path)
        self._suspect.discard(key)
        return sha, total if committed else 0

    def get_blob(self, sha: str) -> blobs.Blob | None:
        """The verified blob ``sha``, None if absent.

        Raises :class:`CorruptRecord` if it is there but does not match its SHA-256.
        """
        key = layout.blob(sha)
        blob = self._fetch(key, lambda key, row: self._load_blob(sha, key, row))
        if blob is None:
            # Its row may still be there with its value file gone: rewrite it on put_blob.
            self._suspect.add(key)
        return blob

    def _load_blob(self, sha: str, key: str, row: tuple[int, str | None, Any]) -> blobs.Blob | None:
        mode, filename, value = row
        if filename is None:
            if mode != MODE_RAW or not isinstance(value, bytes):
                raise CorruptRecord(f"refusing blob {key!r}: not stored as bytes")
            return self._blob_from_bytes(sha, key, value)
        if mode != MODE_BINARY or not VALUE_FILE.fullmatch(filename):
            raise CorruptRecord(f"refusing blob {key!r}: kept outside the store or not bytes")
        try:
            f = open(self.cache_dir / filename, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return None
        with f:
            if f.read(len(codec.MAGIC)) == codec.MAGIC:  # format 1: a signed record
                return blobs.Blob(self._decode(key, codec.MAGIC + f.read())[1])
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
            problems += [f"database {self.cache_dir / DBNAME}: {m}" for m in db.integrity()]
            with db.transact():
                known: set[Path] = set()
                for rowid, key, size, filename in db.file_rows():
                    name = repr(key) if isinstance(key, str) else "with a non-text key"
                    full: Path | None = self.cache_dir / filename
                    if not VALUE_FILE.fullmatch(filename):
                        bad = f"names a value file outside the store ({filename!r})"
                        full = None
                    else:
                        assert full is not None
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
                        db.delete_row(rowid)
                        self.deletions += 1
                        if full is not None:
                            full.unlink(missing_ok=True)
                problems += self._orphans(known, fix, done)
        return problems

    def _orphans(self, known: set[Path], fix: bool, done: str) -> list[str]:
        """Value files no record points to (and, with ``fix``, empty directories) removed."""
        problems = []
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

    def close(self) -> None:
        """Close the underlying connections."""
        if self._rows is not None:
            self._rows.close()
