"""The store interface: what the engine, the runner and the CLI may ask of a store.

:class:`Store` is an abstract base class over bytes. An engine implements a
handful of primitives (read, range read, write-and-delete in one
transaction, delete, range scan, a transaction, blob files, a check); this
class builds records on them: signing and verifying every value (see
:mod:`.codec`), the format check on open, the lease's compare-and-set
(:meth:`Store.swap`), and blobs small enough to travel with a record.

The embedded engine is diskcache (:mod:`.disk`), the shared one PostgreSQL
(:mod:`.postgres`); :func:`~.opener.open_store` opens the one a directory or
URL names, and code that only says ``Store`` works with any of them.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import secrets as _secrets
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import redact
from ..errors import (
    CorruptRecord,
    FormatVersionError,
    LeaseLost,
    NbdurableWarning,
    StaleRecord,
    StoreError,
)
from . import blobs, codec, layout
from .manifest import REFUSALS, Manifest, refusal
from .records import STORE_FORMAT, STORE_FORMATS, UPGRADED_FORMAT

#: load_prefix holds values of at most this many bytes, and this many bytes in all.
LOAD_ROW_MAX = 16 * 1024
LOAD_TOTAL_MAX = 32 * 1024 * 1024

Header = dict[str, Any]
Record = tuple[Header, bytes]


def _own(key: str) -> bool:
    """True for the store's own records: its format record, a run's manifest and lease."""
    if key == layout.FORMAT_KEY:
        return True
    # r/<16 hex>/manifest, r/<16 hex>/lease
    return key.startswith(layout.RUNS) and key[18:19] == "/" and key[19:] in ("manifest", "lease")


@dataclass(frozen=True)
class Fence:
    """A write that lands only while the lease record at ``key`` names ``token``.

    The kernel side passes its lease's fence with every record it writes
    (see ``nbdurable.durable.lease``); the engine checks it in the write's own
    transaction, so a writer whose lease was taken over (its heartbeats
    stalled past the expiry, or ``%step takeover``) cannot write one more
    record into the run: the write raises :class:`LeaseLost` and nothing of it
    lands. The check is on the stored bytes: a lease record's header holds
    ``"token":"<token>"`` (the codec's compact JSON).
    """

    key: str
    token: str

    @property
    def marker(self) -> bytes:
        """The bytes the lease record holds while it names ``token``."""
        return b'"token":"' + self.token.encode("ascii") + b'"'

    def held(self, raw: bytes | None) -> bool:
        """True if ``raw`` (the lease record's stored bytes) names this fence's token."""
        return raw is not None and self.marker in raw


class Store(abc.ABC):
    """A durable, signed key-value log; see the module docstring.

    Every failure of the medium (no space, read-only, no permission, a
    damaged database) is raised as :class:`StoreError`, one line naming the
    store and what to do; a record that does not verify as :class:`CorruptRecord`.
    """

    #: A blob smaller than this is written with the records (see :meth:`put_blob`).
    small_blob_max = 1024
    #: Where the store lives (a directory for the embedded engine, a URL
    #: without its password for PostgreSQL).
    path: Path | str
    #: What a user can do to start afresh elsewhere (ends an error message).
    elsewhere = "set NBDURABLE_DIR to a new directory"
    #: How many times the store was reopened (see :meth:`reopen`): a lease or
    #: anything else held in the store before the reopen is gone.
    generation: int = 0
    #: How many deletes this object made: an index of records read before
    #: (see kernel.context.SubIndex) is read again after one.
    deletions: int = 0

    def _start(self, secret: bytes) -> None:
        """Called by an engine once open: the signing key, then the format check."""
        # Keys that failed to verify, or blobs found missing: put_blob rewrites them.
        self._suspect: set[str] = set()
        # Until the format record names the store's domain, only it can be read.
        self._macs = codec.Macs(codec.signer(secret))
        #: why an earlier version's store could not be upgraded on open (see _read_only)
        self._unwritable: StoreError | None = None
        #: the runs of the pass over many records this thread is in (see reading())
        self._pass = threading.local()
        #: run hash -> its manifest as last read or written (None: absent or unreadable)
        self._manifests: dict[str, Manifest | None] = {}
        #: whether small sub-step records are written deflated (a store of format 3)
        self._deflate = False
        self._check_format()

    # -- what an engine implements (over bytes) ----------------------------------------
    @abc.abstractmethod
    def read(self, key: str) -> bytes | None:
        """The stored bytes of ``key``, unverified (None if absent)."""

    @abc.abstractmethod
    def read_prefix(self, prefix: str, row_max: int) -> list[tuple[str, bytes | None]]:
        """Every key under ``prefix`` in key order, with its bytes if at most ``row_max`` long."""

    @abc.abstractmethod
    def write(
        self, values: dict[str, bytes], deletes: Sequence[str] = (), fence: Fence | None = None
    ) -> None:
        """Write ``values`` and delete ``deletes`` in one transaction: all of it or none.

        With a ``fence``, only if its lease is still held, checked in the same
        transaction; else :class:`LeaseLost` and nothing is written.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Delete one key; True if it existed."""

    @abc.abstractmethod
    def scan(self, prefix: str) -> list[str]:
        """All keys that start with ``prefix``, in key order (a range scan)."""

    @abc.abstractmethod
    def stats(self, prefix: str) -> tuple[int, int]:
        """``(count, bytes)`` of the keys under ``prefix``."""

    def stats_by_scope(self, prefix: str) -> dict[str, tuple[int, int]]:
        """``(count, bytes)`` of the keys under ``prefix``, by scope: the part of each key
        after ``prefix`` up to its next ``/`` (a key with none is in no scope).

        What :meth:`stats` gives for each ``prefix + scope + "/"``, in one read: a view of
        thousands of steps asks it once, not once per step. Engines answer it in one
        statement; this default, from the keys and their sizes, is for the others.
        """
        out: dict[str, tuple[int, int]] = {}
        for key in self.scan(prefix):
            scope, slash, _ = key[len(prefix) :].partition("/")
            if not slash:
                continue
            n, size = out.get(scope, (0, 0))
            out[scope] = (n + 1, size + self.size_of(key))
        return out

    @abc.abstractmethod
    def size_of(self, key: str) -> int:
        """Bytes stored for ``key`` (0 if absent)."""

    @abc.abstractmethod
    def has(self, key: str) -> bool:
        """True if ``key`` is present (not verified)."""

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Reads and writes inside it are one transaction, isolated from other processes."""

    @abc.abstractmethod
    def _put_blob_file(
        self, parts: Sequence[blobs.Buffer], total: int, secrets: dict[str, bytes]
    ) -> tuple[str, int]:
        """Store a large blob (streamed, hashed as written); ``(sha, bytes written)``.

        0 bytes written if the blob was there already, unless this object
        found it damaged or missing (``_suspect``): then it is written again.
        """

    @abc.abstractmethod
    def get_blob(self, sha: str) -> blobs.Blob | None:
        """The verified blob ``sha``, None if absent (:class:`CorruptRecord` if damaged)."""

    @abc.abstractmethod
    def check(self, fix: bool = True) -> list[str]:
        """Check the medium; with ``fix``, repair what can be. One line per problem found."""

    @abc.abstractmethod
    def replaced(self) -> bool:
        """True if the medium this object opened is gone or was replaced."""

    @abc.abstractmethod
    def check_same(self) -> None:
        """Raise :class:`StoreError` if the store was deleted or replaced."""

    @abc.abstractmethod
    def reopen(self) -> None:
        """Close, and open the store now at :attr:`path`."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the underlying connections."""

    # -- records, built on the primitives ------------------------------------------------
    def get(self, key: str) -> Record | None:
        """Verified ``(header, body)`` for ``key``, None if absent.

        Raises :class:`CorruptRecord` if the record is present but does not verify.
        """
        raw = self.read(key)
        if raw is None:
            return None
        got = self._decode(key, raw)
        # A step record is read once per step: read its run's manifest afresh
        # then, so a clear made by another process since is seen; in a pass over
        # many records (see reading()), at the first of the run's only.
        refresh = key[19:21] == "s/" and self._refresh_due(key[2:18])
        self._check_current(key, raw, got[0], refresh=refresh)
        return got

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A pass over many records (a view, a listing, a check): each run's manifest is
        read afresh once, at the first of its step records read, not once per step
        record (a manifest names every step: reading it per record is quadratic).

        A record its cached manifest refuses is checked again against the manifest
        read then (see :meth:`_check_current`), so one recorded anew meanwhile is
        taken. Per thread; nested passes are one.
        """
        if getattr(self._pass, "runs", None) is not None:
            yield
            return
        self._pass.runs = set()
        try:
            yield
        finally:
            self._pass.runs = None

    def _refresh_due(self, run: str) -> bool:
        """Whether a step record of ``run`` read now reads its manifest afresh."""
        runs = getattr(self._pass, "runs", None)
        if runs is None:
            return True  # a single read
        if run in runs:
            return False
        runs.add(run)
        return True

    def _decode(self, key: str, raw: bytes) -> Record:
        try:
            return codec.decode(self._macs, key, raw)
        except CorruptRecord:
            self._suspect.add(key)
            raise

    def _encode(self, key: str, header: Header, body: bytes | memoryview = b"") -> bytes:
        # Every header passes the redaction gate as it is written (see redact.masked_header),
        # but the store's own records (format, a run's manifest and lease): their fields
        # are the store's (generations, signatures, a host and a token), never user data,
        # and a manifest, which names every step of its run, is written with each step.
        if not _own(key):
            header = redact.masked_header(header)
        if key == layout.FORMAT_KEY:  # it names the domain, so it cannot be bound to it
            return codec.encode(self._macs.v1, key, header, body, magic=codec.MAGIC)
        if self._macs.v2 is None:  # an earlier version's store that could not be upgraded
            raise self._unwritable or StoreError(f"the store at {self.path} cannot be written")
        # r/<16 hex>/u/... and r/<16 hex>/w/...: a sub-step's record, deflated where it pays
        sub = self._deflate and key[20:21] == "/" and key[19] in "uw" and key.startswith("r/")
        return codec.encode(
            self._macs.v2, key, header, body, deflated=self._macs.v3 if sub else None
        )

    # -- freshness: the run's manifest (see .manifest) -------------------------------------
    def _check_current(self, key: str, raw: bytes, header: Header, refresh: bool) -> None:
        """Raise :class:`StaleRecord` if ``key`` is a run's record its manifest does not name."""
        # r/<16 hex>/<kind>/...: the kinds a manifest speaks for are s, u, v and w.
        if key[20:21] != "/" or key[19] not in "suvw" or not key.startswith(layout.RUNS):
            return
        run, kind = key[2:18], key[19]
        fresh = refresh or run not in self._manifests
        m = self._read_manifest(run) if fresh else self._manifests[run]
        scope = key[21:].partition("/")[0]
        if kind != "s" and m is not None and header.get("gen", -1) == m.gen(scope):
            return  # the replay path of a sub-step: current
        sig = codec.signature(raw) if kind == "s" else ""
        why = refusal(m, kind, scope, header, sig)
        if why and not fresh:
            # The manifest this process cached may predate the record: another process
            # cleared the step and recorded it anew since. Generations only go up, so
            # the manifest read now refuses only what is really not current.
            m = self._read_manifest(run)
            why = refusal(m, kind, scope, header, sig)
        if why:
            raise StaleRecord(f"record {key!r} {REFUSALS[why]}; it is ignored", reason=why)

    def _read_manifest(self, run: str) -> Manifest | None:
        """The run's manifest as the store holds it now (None: absent or unreadable)."""
        key = layout.RunKeys.of_hash(run).manifest
        raw = self.read(key)
        m = None
        if raw is not None:
            try:
                m = Manifest.from_header(codec.decode(self._macs, key, raw)[0])
            except (CorruptRecord, KeyError, TypeError, ValueError, IndexError):
                m = None
        before = self._manifests.get(run)
        if m is not None and before is not None and m.seq < before.seq:
            # Consistent, so nothing in it is refused; but this process saw a later one.
            warnings.warn(
                f"the manifest of run {run} in the store at {self.path} went back from change "
                f"{before.seq} to {m.seq} while this process used it: the run was rolled back "
                "to an earlier copy (a backup restored over it?)",
                NbdurableWarning,
                stacklevel=4,
            )
        self._manifests[run] = m
        return m

    def _manifest_for_write(self, run: str) -> Manifest:
        """The run's manifest, made (in its own transaction) if the run has none yet."""
        m = self._manifests.get(run)
        if m is None:
            m = self._read_manifest(run)
        if m is None:
            m = self._atomically(layout.RunKeys.of_hash(run).manifest, lambda: self._begin(run))
        return m

    def _begin(self, run: str) -> Manifest:
        """Start the manifest of ``run`` (inside a transaction): see :mod:`.manifest`."""
        m = self._read_manifest(run)
        if m is not None:
            return m  # another process started it meanwhile
        rk = layout.RunKeys.of_hash(run)
        stamped = unstamped = 0
        for prefix in (rk.steps, rk.all_subs):
            for k, value in self.read_prefix(prefix, LOAD_ROW_MAX):
                try:
                    header = codec.decode(self._macs, k, value)[0] if value else None
                except CorruptRecord:
                    continue
                if header is not None:
                    stamped += "gen" in header
                    unstamped += "gen" not in header
        m = Manifest.new(adopted=bool(unstamped) and not stamped)
        if stamped:
            warnings.warn(
                f"the manifest of run {rk.base[2:-1]} in the store at {self.path} was missing "
                "or unreadable (deleted or damaged): a new one was started, and the records "
                "written under the old one are not trusted (their steps run again)",
                NbdurableWarning,
                stacklevel=4,
            )
        self.write({rk.manifest: self._encode(rk.manifest, m.to_header())})
        self._manifests[run] = m
        return m

    def _atomically(self, lock: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` in one transaction, serialized with every other that names ``lock``."""
        with self.transaction():
            return fn()

    def _stamp(self, key: str, header: Header) -> Header:
        """``header`` with the generation of its scope, for a record a manifest speaks for."""
        if key[20:21] != "/" or key[19] not in "suvw" or not key.startswith(layout.RUNS):
            return header
        m = self._manifest_for_write(key[2:18])
        return {**header, "gen": m.gen(key[21:].partition("/")[0])}

    def load_prefix(self, prefix: str) -> dict[str, bytes | None]:
        """Every key under ``prefix`` with its stored bytes, unverified (one range read).

        Pass an entry to :meth:`get_loaded`, which verifies it. Values over
        :data:`LOAD_ROW_MAX` bytes, or past :data:`LOAD_TOTAL_MAX` bytes in
        all, map to None: ``get_loaded`` reads those one by one, so this never
        holds more than 32 MB, and the caller drops each entry once used.
        """
        out: dict[str, bytes | None] = {}
        total = 0
        if prefix.startswith(layout.RUNS) and len(prefix) >= 19:
            # A step's sub-steps are loaded at its start: the manifest is read afresh then.
            self._read_manifest(prefix[2:18])
        for key, value in self.read_prefix(prefix, LOAD_ROW_MAX):
            if value is not None:
                total += len(value)
                if total > LOAD_TOTAL_MAX:
                    value = None
            out[key] = value
        return out

    def get_loaded(self, key: str, raw: bytes | None) -> Record | None:
        """Verified ``(header, body)`` of an entry of :meth:`load_prefix` (None: read it now)."""
        if raw is None:
            return self.get(key)
        got = self._decode(key, raw)
        self._check_current(key, raw, got[0], refresh=False)
        return got

    def put(self, key: str, header: Header, body: bytes = b"", fence: Fence | None = None) -> int:
        """Write one record atomically (under ``fence``, see :meth:`write`); return its size."""
        return self.apply([(key, header, body)], fence=fence)

    def apply(
        self,
        puts: Iterable[tuple[str, Header, bytes]] = (),
        deletes: Iterable[str] = (),
        blobs: dict[str, bytes] | None = None,
        fence: Fence | None = None,
        cleared: tuple[str, list[str] | None] | None = None,
    ) -> int:
        """Write and delete in one transaction: all of it happens or none of it.

        ``blobs`` are small blobs deferred by :meth:`put_blob` (already encoded);
        ``fence``: see :meth:`write`. ``cleared``: ``(run id, step keys)`` whose
        records this clears (None: the whole run), so its manifest refuses them
        if they are ever written back.

        Every record of a run's step, sub-step or version is stamped with its
        scope's generation; a step record, and a clear, also rewrite the run's
        manifest, read and written in this same transaction (see :mod:`.manifest`):
        a crash leaves the record and the manifest that names it both or neither.
        """
        puts = list(puts)
        deletes = list(deletes)
        steps = {k[2:18] for k, _, _ in puts if k[19:21] == "s/" and k.startswith(layout.RUNS)}
        if cleared is not None:
            steps.add(layout.run_hash(cleared[0]))
        if not steps:  # the hot path (a sub-step): no manifest is written
            values = dict(blobs or {})
            values.update((k, self._encode(k, self._stamp(k, h), b)) for k, h, b in puts)
            self.write(values, deletes, fence)
            return sum(len(v) for v in values.values())
        return int(
            self._atomically(
                layout.RunKeys.of_hash(min(steps)).manifest,
                lambda: self._apply_recording(puts, deletes, blobs, fence, steps, cleared),
            )
        )

    def _apply_recording(
        self,
        puts: list[tuple[str, Header, bytes]],
        deletes: list[str],
        blobs: dict[str, bytes] | None,
        fence: Fence | None,
        runs: set[str],
        cleared: tuple[str, list[str] | None] | None,
    ) -> int:
        """:meth:`apply` of step records or a clear: the manifests are read, changed and
        written with them (inside :meth:`_atomically`).
        """
        # Read afresh inside the transaction: another process may have cleared meanwhile.
        manifests = {run: self._read_manifest(run) for run in sorted(runs)}
        try:
            for run in runs:
                manifests[run] = manifests[run] or self._manifest_for_write(run)
            if cleared is not None:
                manifests[layout.run_hash(cleared[0])].cleared(cleared[1])  # type: ignore[union-attr]
            values = dict(blobs or {})
            recorded = []
            for k, h, b in puts:
                values[k] = value = self._encode(k, self._stamp(k, h), b)
                if k[19:21] == "s/" and k.startswith(layout.RUNS):
                    recorded.append((k, codec.signature(value)))
            self.write(values, deletes, fence)
            # Still inside the transaction: the manifest lands with the records, or neither.
            for k, sig in recorded:
                # the step's sub-step rows as this write left them (check says if rows go)
                rows = self.stats(layout.RunKeys.of_hash(k[2:18]).subs_prefix(k[21:]))[0]
                manifests[k[2:18]].recorded(k[21:], sig, rows)  # type: ignore[union-attr]
            mine = {}
            for run, m in manifests.items():
                mkey = layout.RunKeys.of_hash(run).manifest
                mine[mkey] = self._encode(mkey, m.to_header())  # type: ignore[union-attr]
            self.write(mine)
        except BaseException:
            # Changed in memory but perhaps not written: read again at the next use.
            for run in runs:
                self._manifests.pop(run, None)
            raise
        return sum(len(v) for v in values.values())  # the manifest is the store's own

    def _lost(self, fence: Fence) -> LeaseLost:
        """The error of a write refused by ``fence`` (the kernel side names the new holder)."""
        return LeaseLost(
            f"the lease at {fence.key} in the store at {self.path} is no longer held by this "
            "process: the write was refused, nothing of it was recorded"
        )

    def swap(self, key: str, update: Callable[[Header | None], Header | None]) -> Header | None:
        """Replace ``key``'s header by ``update(current)`` atomically; return the current one.

        The lease's compare-and-set (see :mod:`nbdurable.durable.lease`):
        ``update`` may raise to leave the record as it is, or return None to
        delete it. An unreadable current record counts as absent. An engine
        shared by machines overrides this with its own row lock.
        """
        with self.transaction():
            try:
                got = self.get(key)
            except CorruptRecord:
                got = None
            current = None if got is None else got[0]
            new = update(current)
            if new is None:
                if current is not None:
                    self.delete(key)
            else:
                self.write({key: self._encode(key, new)})
        return current

    # -- blobs: variables stored once by content (format: see .blobs) --------------------
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
        ``secrets``: they are searched in the very copy that is hashed and written;
        or if ``stream`` holds a well-known key (:func:`nbdurable.redact.key_names`).
        """
        # Keys typed literally are text: in the pickle stream, or in the buffer of a
        # large bytes or bytearray (searched where it lies, see redact.searchable).
        # Array data is not searched for them (it would cost more than the write;
        # environment secrets are searched everywhere).
        # An environment secret is named by its variable, even when it is a key too.
        found = blobs.scan(stream, secrets or {}) or redact.key_names(stream)
        for buf in buffers:
            if not found and isinstance(memoryview(buf).obj, bytes | bytearray):
                found = redact.key_names(buf)
        if found:
            raise blobs.SecretFound(found)
        bufs = [memoryview(b).cast("B") for b in buffers]
        parts: list[blobs.Buffer] = [blobs.head(stream, bufs), stream, *bufs]
        total = sum(memoryview(p).nbytes for p in parts)
        if total >= self.small_blob_max:
            return self._put_blob_file(parts, total, secrets or {})
        data = b"".join(parts)
        found = blobs.scan(data, secrets or {})
        if found:
            raise blobs.SecretFound(found)
        sha = hashlib.sha256(data).hexdigest()
        key = layout.blob(sha)
        if defer is not None:
            defer[key] = data  # rewriting equal bytes is harmless: no existence check
            return sha, total
        if key not in self._suspect and self.has(key):
            return sha, 0
        self.write({key: data})
        return sha, total

    def _blob_from_bytes(self, sha: str, key: str, value: bytes) -> blobs.Blob:
        """A small blob kept as a record's bytes: format 2, or a format-1 signed record."""
        if value.startswith(codec.MAGIC):  # format 1: a signed record (of the first scheme)
            return blobs.Blob(self._decode(key, value)[1])
        return blobs.writable(blobs.parse(sha, value))

    # -- the store's own format ----------------------------------------------------------
    def _check_format(self) -> None:
        # Read past the per-record format check: a newer store must be reported as
        # such (FormatVersionError), not as one unreadable record.
        try:
            found = self._read_format()
        except CorruptRecord as exc:
            raise StoreError(
                f"the nbdurable store at {self.path} cannot be verified: its format record "
                "fails its signature check. Either it was written with another store key "
                "(NBDURABLE_KEY, or the key file, differs from the one it was written with) or "
                f"that record was damaged. Restore the key, or {self.elsewhere}."
            ) from exc
        version = STORE_FORMAT if found is None else found.get("format")
        if version not in STORE_FORMATS:
            raise FormatVersionError(
                f"the store at {self.path} has format {version}; this nbdurable reads format "
                f"{STORE_FORMAT}. Upgrade nbdurable, or {self.elsewhere}."
            )
        if found is None or self._domain(found) is None or version < UPGRADED_FORMAT:
            try:
                found = self._atomically(layout.FORMAT_KEY, self._name_store)
            except StoreError as exc:
                if found is None:
                    raise  # a new store: nothing to read, and it cannot be made
                self._read_only(exc, found)
        domain = self._domain(found)
        if domain is not None:
            self._macs = codec.Macs.bound(self._macs.v1, domain)
            self._deflate = found.get("format") == 3

    def _read_only(self, exc: StoreError, found: Header) -> None:
        """An earlier version's store opened where it cannot be written (a read-only
        directory or database role): it is read as it is, not upgraded.

        Its records were all signed with the first scheme (the domain is
        written before any record of the second), so they verify as before;
        a write, which would need the domain, fails with the medium's error.
        """
        self._unwritable = exc
        warnings.warn(
            f"the store at {self.path} was made by an earlier nbdurable and cannot be "
            f"upgraded here (format {found.get('format')}, {exc}); it is read as it is, "
            "nothing in it is lost, and writing to it fails",
            NbdurableWarning,
            stacklevel=4,
        )

    def _read_format(self) -> Header | None:
        raw = self.read(layout.FORMAT_KEY)
        if raw is None:
            return None
        return codec.decode(self._macs, layout.FORMAT_KEY, raw, newer_ok=True)[0]

    def _name_store(self) -> Header:
        """Write the format record, with a store id if it has none (inside a transaction):
        a new store at :data:`STORE_FORMAT`, an earlier one at :data:`UPGRADED_FORMAT`.

        The format record is signed with the first scheme (no domain): it is
        what names the domain. Read again inside the transaction, so two
        processes opening a new store at once agree on one id.
        """
        found = self._read_format()
        version = STORE_FORMAT if found is None else found.get("format")
        if found is not None and self._domain(found) and version >= UPGRADED_FORMAT:
            return found
        new = dict(found or {"created": time.time()})
        # An earlier version, reading format 1 only, refuses it now; one reading format
        # 2 still reads an upgraded store (see records.STORE_FORMATS).
        new["format"] = max(version, UPGRADED_FORMAT)
        if self._domain(new) is None:  # an engine whose domain is its own name needs no id
            new["store"] = _secrets.token_hex(16)
        self.write({layout.FORMAT_KEY: self._encode(layout.FORMAT_KEY, new)})
        return new

    def _domain(self, fmt: Header) -> str | None:
        """What a record's signature binds it to (see :mod:`.codec`): this store's id.

        None while the format record holds none (a store made by an earlier
        version gets one once). An engine shared by a team overrides this.
        """
        store = fmt.get("store")
        return f"store:{store}" if isinstance(store, str) and store else None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
