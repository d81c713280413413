"""Records per version: a step keeps a record for each version of its code and inputs.

A step's *version* is the digest of its code and its inputs
(:func:`nbdurable.identity.keys.step_version`). Its *current* record
(``s/<step key>``, sub-steps under ``u/<step key>/``) is the version that
ran last; every reader that asks "what did this step record?" reads that
one. Earlier versions are kept beside it (see :mod:`.layout`)::

    v/<step key>/<version>             the version's StepRecord header
    w/<step key>/<version>/<sub id>    its sub-step records

:func:`switch` moves between them, in one transaction:

- a step about to run with a version other than its current one first
  *archives* the current one (record and sub-steps, copied; the current
  sub-steps stay where they are, so a new version still replays the calls
  it shares with the previous one);
- a step whose version is archived gets it back as its current record,
  with exactly that version's sub-steps, so a parameter set back to an
  earlier value replays that version's run (or, if its body must run
  again, that version's calls), and its archive entry is removed.

Archiving is skipped when the archive already holds a readable record of
that version: it was archived by an earlier attempt of the same change,
which a crash interrupted, and the current sub-steps may already hold the
new version's calls.

**What is kept** (:func:`excess`): at most ``keep`` versions of each step,
the current one included (``configure(keep_versions=N)``, default
:data:`KEEP_VERSIONS`; ``nbdurable gc --keep-versions N``); beyond that the
versions recorded longest ago go first. A pinned step keeps every version
(``gc`` never removes a pinned step's records). ``clear`` removes every
version of a step.
"""

from __future__ import annotations

from typing import Any

from ..errors import CorruptRecord
from .base import Store
from .layout import RunKeys

#: Versions of each step kept by default, the current one included.
KEEP_VERSIONS = 10


def kept(store: Store, rk: RunKeys, key: str) -> list[str]:
    """The earlier versions of a step the archive holds (not the current one)."""
    prefix = rk.versions(key)
    return [k[len(prefix) :] for k in store.scan(prefix)]


def kept_by_step(store: Store, rk: RunKeys) -> dict[str, list[str]]:
    """:func:`kept` of every step of the run that keeps any, in one key scan (a view
    of thousands of steps makes one read, not one per step).
    """
    prefix = rk.all_versions
    out: dict[str, list[str]] = {}
    for k in store.scan(prefix):
        step, _, version = k[len(prefix) :].partition("/")  # step keys hold no "/"
        out.setdefault(step, []).append(version)
    return out


def has(store: Store, rk: RunKeys, key: str, version: str) -> bool:
    """True if the archive holds ``version`` of the step."""
    return store.has(rk.version(key, version))


def _readable(store: Store, key: str) -> bool:
    try:
        return store.get(key) is not None
    except CorruptRecord:
        return False


def _subs(store: Store, prefix: str) -> list[tuple[str, dict[str, Any], bytes]]:
    """``(sub id, header, body)`` of every readable record under ``prefix``."""
    out = []
    for k, raw in store.load_prefix(prefix).items():
        try:
            got = store.get_loaded(k, raw)
        except CorruptRecord:  # an unusable record is not carried along: the call is made again
            continue
        if got is not None:
            out.append((k[len(prefix) :], got[0], bytes(got[1])))
    return out


def switch(
    store: Store,
    rk: RunKeys,
    key: str,
    current: str | None,
    wanted: str,
    keep: int,
    *,
    restore: bool = True,
) -> bool:
    """Archive the current version, bring ``wanted`` back if archived; True if it was.

    ``current`` is the current record's version (None: no current record).
    Raises :class:`CorruptRecord` (changing nothing) if the archived record
    of ``wanted`` fails its check. With ``restore=False`` an archived
    ``wanted`` is not brought back but removed: the step is about to run
    that version and record it as the current one.
    """
    puts: list[tuple[str, dict[str, Any], bytes]] = []
    deletes: list[str] = []
    adding: dict[str, Any] = {}  # version archived now -> when it was recorded
    subs_prefix = rk.subs_prefix(key)
    if current is not None and current != wanted:
        archived = rk.version(key, current)
        got = store.get(rk.step(key))
        if got is not None and not _readable(store, archived):
            adding[current] = got[0].get("started")
            puts.append((archived, got[0], b""))
            puts += [
                (rk.version_subs(key, current) + sub, h, b)
                for sub, h, b in _subs(store, subs_prefix)
            ]
    back = store.get(rk.version(key, wanted)) if restore else None
    if not restore and store.has(rk.version(key, wanted)):
        deletes.append(rk.version(key, wanted))
        deletes += store.scan(rk.version_subs(key, wanted))
    if back is not None:
        old_subs = rk.version_subs(key, wanted)
        back_subs = _subs(store, old_subs)
        puts.append((rk.step(key), back[0], b""))
        puts += [(subs_prefix + sub, h, b) for sub, h, b in back_subs]
        ids = {sub for sub, _, _ in back_subs}
        deletes += [k for k in store.scan(subs_prefix) if k[len(subs_prefix) :] not in ids]
        deletes.append(rk.version(key, wanted))
        deletes += store.scan(old_subs)
    if not puts:
        if deletes:
            store.apply(deletes=deletes)
        return False
    pruned = excess(store, rk, key, keep, exclude={wanted}, adding=adding)
    if current in adding and rk.version(key, current) in pruned:  # archived and dropped at once
        dropped = (rk.version(key, current), rk.version_subs(key, current))
        puts = [p for p in puts if p[0] != dropped[0] and not p[0].startswith(dropped[1])]
    store.apply(puts=puts, deletes=deletes + [k for k in pruned if k not in deletes])
    return back is not None


def excess(
    store: Store,
    rk: RunKeys,
    key: str,
    keep: int,
    *,
    exclude: frozenset[str] | set[str] = frozenset(),
    adding: dict[str, Any] | None = None,
) -> list[str]:
    """The keys of the earlier versions beyond ``keep`` versions (current included).

    The versions recorded longest ago go first; an archived record that
    cannot be read counts as the oldest. ``adding`` (version -> started) are
    versions about to be archived; versions in ``exclude`` are not counted.
    """
    prefix = rk.versions(key)
    when: dict[str, float] = {}
    for k in store.scan(prefix):
        version = k[len(prefix) :]
        if version in exclude:
            continue
        try:
            got = store.get(k)
        except CorruptRecord:
            got = None
        started = (got[0] if got else {}).get("started")
        when[version] = started if isinstance(started, (int, float)) else float("-inf")
    for version, started in (adding or {}).items():
        if version not in exclude:
            when[version] = started if isinstance(started, (int, float)) else float("-inf")
    others = max(keep, 1) - 1  # the current record is one of the versions kept
    oldest = sorted(when, key=lambda v: when[v], reverse=True)[others:]
    out = []
    for version in oldest:
        out.append(rk.version(key, version))
        out += store.scan(rk.version_subs(key, version))
    return out
