"""A run's manifest: which of its records are current, so an old one written back is refused.

A signature proves a record was written by a holder of the store key, into
this store, under this key (see :mod:`.codec`); it cannot prove the record is
still the current one. A record cleared by ``%step clear`` and written back
later, or an earlier version of a step record rolled back in place, is signed
as well as the day it was written. The manifest, one signed row per run
(``r/<run>/manifest``), says which records are current::

    {"kind": "manifest", "seq": 7, "epoch": 1733390000123, "top": 1733390000456,
     "steps": {"<scope>": [generation, "<signature of its step record>", rows]}}

* Every step, sub-step and archived-version record carries the *generation*
  of its scope (a step key, or ``~run``) when it was written, in its signed
  header (``"gen"``). A scope's generation is its entry's, else the run's
  ``epoch``. ``clear`` gives the cleared scopes a new generation,
  ``clear --all`` a new epoch; new generations come from the clock and are
  always above ``top``, every generation the run ever had, so no record
  written before a clear matches after it, not even after the manifest
  was deleted and made anew.
* A step's entry names the signature of its current step record, written in
  the same transaction as that record: a step record that is not that one
  (an earlier one rolled back in place) is refused. It also counts the
  step's sub-step rows then (``rows``): ``nbdurable check`` says when fewer
  are left (a lost row is a call its body, run again, pays again).
* ``seq`` counts the manifest's changes: a process that reads a manifest with
  a lower ``seq`` than one it read before says the run was rolled back.

A record that does not match is refused like a record whose signature fails
(:class:`~nbdurable.errors.CorruptRecord`): one line, and its step (or call)
runs again. Records written before manifests existed carry no generation:
they are accepted while their scope was never cleared since (generation 0:
a run adopted with records of that kind starts at epoch 0). A missing or
unreadable manifest, for a run whose records carry generations, is said in
each refusal; the next write starts a new manifest (above every earlier
generation, so what the old one guarded stays refused).

Not detected: a whole run rolled back together with its manifest (a
consistent older copy of the store), a sub-step record rolled back to an
earlier write of the same call within one generation, and, in a run
adopted from an earlier version, old records written back after its manifest
was deleted.
"""

from __future__ import annotations

import time
from typing import Any

KIND = "manifest"
#: A record written before manifests: it carries no generation.
LEGACY = 0


class Manifest:
    """The decoded manifest of one run (see the module docstring)."""

    __slots__ = ("epoch", "seq", "steps", "top")

    def __init__(self, epoch: int, seq: int = 0, top: int | None = None) -> None:
        self.epoch = epoch
        self.seq = seq
        self.top = epoch if top is None else top
        self.steps: dict[str, list[Any]] = {}

    @classmethod
    def new(cls, adopted: bool) -> Manifest:
        """A run's first manifest: at epoch 0 when it adopts records written before
        manifests (they carry no generation), else at a new generation.
        """
        return cls(LEGACY) if adopted else cls(_next(0))

    @classmethod
    def from_header(cls, h: dict[str, Any]) -> Manifest:
        """Decode; raises ``KeyError``/``TypeError``/``ValueError`` if malformed."""
        m = cls(int(h["epoch"]), int(h["seq"]), int(h["top"]))
        steps = h["steps"]
        if not isinstance(steps, dict):
            raise TypeError("steps is not an object")
        m.steps = {str(k): [int(v[0]), str(v[1]), int(v[2])] for k, v in steps.items()}
        return m

    def to_header(self) -> dict[str, Any]:
        """Encode as a JSON-able dict."""
        return {
            "kind": KIND,
            "seq": self.seq,
            "epoch": self.epoch,
            "top": self.top,
            "steps": self.steps,
        }

    def gen(self, scope: str) -> int:
        """The generation records of ``scope`` are written with now."""
        entry = self.steps.get(scope)
        return self.epoch if entry is None else entry[0]

    def recorded(self, scope: str, sig: str, rows: int) -> None:
        """Note ``sig`` as the signature of the step ``scope``'s current record, written
        when the step had ``rows`` sub-step rows.
        """
        self.steps[scope] = [self.gen(scope), sig, rows]
        self.seq += 1

    def cleared(self, scopes: list[str] | None) -> None:
        """Give ``scopes`` (None: the whole run) a new generation: their records are refused."""
        self.top = _next(self.top)
        if scopes is None:
            self.epoch, self.steps = self.top, {}
        else:
            for scope in scopes:
                self.steps[scope] = [self.top, "", 0]
        self.seq += 1


def _next(top: int) -> int:
    """A generation above ``top``: from the clock (ms), so it is also above the
    generations of a manifest that was deleted (kept in no row any more).
    """
    return max(int(time.time() * 1000), top + 1)


#: Why a record is not current (:func:`refusal`), by the code a StaleRecord's ``reason`` holds.
REFUSALS = {
    "unproven": (
        "cannot be proven current: its run's manifest is missing or unreadable "
        "(deleted or damaged), so a record cleared earlier may have been written back"
    ),
    "cleared": (
        "is not current: it was written before its step was last cleared "
        "(an old record written back)"
    ),
    "replaced": (
        "is not the step's current record: the run's manifest names another "
        "(an earlier record rolled back in its place)"
    ),
}


def refusal(m: Manifest | None, kind: str, scope: str, header: dict[str, Any], sig: str) -> str:
    """Why the record of ``kind`` (``s``, ``u``, ``v``, ``w``) in ``scope`` is not current,
    as a key of :data:`REFUSALS`; "" when it is. ``m`` is None when the run has no
    readable manifest.
    """
    stamped = "gen" in header  # records written before manifests have none
    gen = header["gen"] if stamped else LEGACY
    if m is None:
        return "unproven" if stamped else ""  # unstamped: written before manifests
    if gen != m.gen(scope):
        return "cleared"
    if kind == "s" and stamped:
        entry = m.steps.get(scope)
        if entry is None or entry[1] != sig:
            return "replaced"
    return ""
