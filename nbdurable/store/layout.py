"""The key layout of a store: every key nbdurable writes is built here, and only here.

Every key is a plain string, every value signed bytes (see :mod:`.codec`)::

    meta/format                      format version of the store
    r/<run>/meta                     run id, notebook, last activity
    r/<run>/manifest                 which records are current (see .manifest)
    r/<run>/lease                    who records into the run now (see nbdurable.durable.lease)
    r/<run>/fork                     the run it was forked from, and when (nbdurable fork)
    r/<run>/s/<step key>             StepRecord header (JSON)
    r/<run>/t/<step key>             StepState (pinned / failed / stale)
    r/<run>/u/<step key>/<sub id>    SubRecord header + pickled value
    r/<run>/u/~run/<sub id>          sub-steps called outside any %%step
    r/<run>/u/<scope>/approval:<id>  an approval's decision, a sub-step (nbdurable.approvals)
    r/<run>/p/<scope>/<id>           an approval asked and not decided yet (pending)
    r/<run>/v/<step key>/<version>   an earlier version's StepRecord (see .versions)
    r/<run>/w/<step key>/<version>/<sub id>   that version's SubRecords
    b/<sha256>                       a pickled variable, stored once by content

``<run>`` is the first 16 hex digits of the SHA-256 of the run id: fixed
length, whatever characters a run name holds. Code elsewhere never slices a
key by hand; it asks :class:`RunKeys` or :func:`parse`.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

#: The scope of sub-steps called outside any ``%%step``.
RUN_SCOPE = "~run"
#: The store's own format record.
FORMAT_KEY = "meta/format"
RUNS = "r/"
BLOBS = "b/"


def run_hash(run_id: str) -> str:
    """The short, fixed-length form of a run id used in keys."""
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def blob(sha: str) -> str:
    """The key of the blob whose content hashes to ``sha``."""
    return BLOBS + sha


def upper(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix`` (for range scans)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class RunKeys:
    """Key builders for one run; see the module docstring for the layout."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.base = f"{RUNS}{run_hash(run_id)}/"

    @classmethod
    def of_hash(cls, hashed: str) -> RunKeys:
        """The keys of a run known only by its hash (its id may be unreadable); run_id is ''."""
        keys = cls.__new__(cls)
        keys.run_id, keys.base = "", f"{RUNS}{hashed}/"
        return keys

    @property
    def meta(self) -> str:
        """The run's metadata key."""
        return self.base + "meta"

    @property
    def lease(self) -> str:
        """The key of the run's lease."""
        return self.base + "lease"

    @property
    def fork(self) -> str:
        """The key saying which run this one was forked from (written once, by the fork)."""
        return self.base + "fork"

    @property
    def changed(self) -> str:
        """The key a command rewrites with every change it makes (clear, pin, unpin):
        a kernel's panel reads it once a second to show another process's change.
        """
        return self.base + "changed"

    @property
    def manifest(self) -> str:
        """The key of the run's manifest (see :mod:`.manifest`)."""
        return self.base + "manifest"

    @property
    def steps(self) -> str:
        """The prefix of every step record of the run."""
        return self.base + "s/"

    @property
    def states(self) -> str:
        """The prefix of every step state of the run."""
        return self.base + "t/"

    @property
    def all_subs(self) -> str:
        """The prefix of every sub-step record of the run, whatever its scope."""
        return self.base + "u/"

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

    @property
    def all_pending(self) -> str:
        """The prefix of every pending approval of the run, whatever its scope."""
        return self.base + "p/"

    def pending_prefix(self, scope: str) -> str:
        """The prefix of the pending approvals of ``scope`` (a step key or RUN_SCOPE)."""
        return f"{self.base}p/{scope}/"

    def pending(self, scope: str, approval_id: str) -> str:
        """The key of a pending approval (asked, not decided yet)."""
        return f"{self.base}p/{scope}/{approval_id}"

    def versions(self, step_key: str) -> str:
        """The prefix of the earlier versions kept of a step (step keys hold no ``/``)."""
        return f"{self.base}v/{step_key}/"

    @property
    def all_versions(self) -> str:
        """The prefix of the earlier versions kept of every step (their step records)."""
        return f"{self.base}v/"

    def version(self, step_key: str, version: str) -> str:
        """The key of an earlier version's step record."""
        return f"{self.base}v/{step_key}/{version}"

    @property
    def all_version_subs(self) -> str:
        """The prefix of every earlier version's sub-steps, of every step."""
        return f"{self.base}w/"

    def version_subs(self, step_key: str, version: str | None = None) -> str:
        """The prefix of an earlier version's sub-steps (None: of every earlier version)."""
        return f"{self.base}w/{step_key}/" + ("" if version is None else f"{version}/")


class Parsed(NamedTuple):
    """A run's key taken apart: ``kind`` is meta, lease, changed, fork, manifest, step,
    state, sub, version, vsub, pending or other.

    For ``version`` and ``vsub`` keys, ``sub`` is the version (``vsub``:
    ``<version>/<sub id>``).
    """

    run_hash: str
    kind: str
    step: str = ""  # the step key (the scope, for a sub-step)
    sub: str = ""  # the sub-step id


_KINDS = {"s": "step", "t": "state", "u": "sub", "v": "version", "w": "vsub", "p": "pending"}


def parse(key: str) -> Parsed | None:
    """Take a key under ``r/<run>/`` apart (None: not a run's key).

    A key under a run that this layout does not know is of kind ``other``:
    it still belongs to its run (``gc`` removes it with the run).
    """
    parts = key.split("/", 3)
    if not key.startswith(RUNS) or len(parts) < 3:
        return None
    if len(parts) == 3 and parts[2] in ("meta", "lease", "changed", "fork", "manifest"):
        return Parsed(parts[1], parts[2])
    if len(parts) < 4 or parts[2] not in _KINDS:
        return Parsed(parts[1], "other")
    kind, rest = _KINDS[parts[2]], parts[3]
    if kind in ("sub", "version", "vsub", "pending"):
        scope, _, sub = rest.partition("/")
        return Parsed(parts[1], kind, scope, sub)
    return Parsed(parts[1], kind, rest)
