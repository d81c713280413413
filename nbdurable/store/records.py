"""What nbdurable stores: frozen records, encoded as JSON headers.

Every record is a small JSON header (plus, for a sub-step, the pickled value
as the body). Headers never go through pickle, so listing, exporting and
inspecting a store never unpickles anything. Only values (a sub-step's body,
a step variable's blob) are pickles, and those are loaded only after their
signature verified (see :mod:`nbdurable.store`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .layout import RunKeys

#: Format of a record of the first kind (a sub-step's): unchanged since the first
#: version, and still written as 1.
FORMAT_VERSION = 1
#: On-disk format of a new store, in its format record. Increment on breaking change;
#: a store whose format this version does not read is refused on open with a clear
#: message. Format 2: records are signed over the store's domain (``NBD\x02``, see
#: :mod:`nbdurable.store.codec`), which nbdurable 0.1 cannot verify (its ``check``
#: would delete them as foreign): it refuses a format-2 store instead. Format 3: its
#: small sub-step records may be deflated (``NBD\x03``), which a reader of format 2
#: cannot read: it refuses a format-3 store.
STORE_FORMAT = 3
#: Store formats this version opens. A format-1 store is upgraded to
#: :data:`UPGRADED_FORMAT` (given its store id) when first opened by a process that
#: can write it; a format-2 store stays at 2 (and its records are not deflated), so
#: an existing store stays readable by the versions that wrote it.
STORE_FORMATS = (1, 2, 3)
#: What an earlier store is upgraded to: the least format with a store id.
UPGRADED_FORMAT = 2
#: Newest record format this version reads and writes. A step record of
#: format 2 refers to format-2 blobs (see :mod:`nbdurable.store.blobs`), which
#: nbdurable 0.1 cannot read: it refuses such a record as "newer, upgrade
#: nbdurable" instead of finding its blobs damaged. Format 3 adds variables of
#: kind ``"shared"`` (a step's values pickled together into one blob, whose
#: pickles a format-2 reader would take one for all); its blobs are still
#: format 2. Formats 2 and 3 are both read. Sub-step records are unchanged
#: and still written as format 1.
RECORD_FORMAT = 3


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _field_set(cls: type) -> frozenset[str]:
    # Looked up once per header key as a record is read: a set, not a tuple of dozens.
    return frozenset(_field_names(cls))


class _Header:
    """A record that travels as a JSON header: its fields, flat, plus ``kind``.

    Shallow, not ``dataclasses.asdict``: that deep-copies every output (images
    too), and a sub-step's header is written once per call. A record with
    nested parts converts them in :meth:`_encode` / :meth:`_decode`.
    """

    KIND: ClassVar[str]

    def to_header(self) -> dict[str, Any]:
        """Encode as a JSON-able dict."""
        d = {name: getattr(self, name) for name in _field_names(type(self))}
        d["kind"] = self.KIND
        return self._encode(d)

    @classmethod
    def from_header(cls, d: dict[str, Any]) -> Any:
        """Decode from :meth:`to_header` output; raises ``KeyError``/``TypeError`` if malformed."""
        d = dict(d)
        d.pop("kind", None)
        # Fields a newer nbdurable added (additive: a newer record format is refused
        # before this) are left out, so an older reader still lists its records.
        known = _field_set(cls)
        return cls(**{k: v for k, v in cls._decode(d).items() if k in known})

    def _encode(self, d: dict[str, Any]) -> dict[str, Any]:
        return d

    @classmethod
    def _decode(cls, d: dict[str, Any]) -> dict[str, Any]:
        return d


@dataclass(frozen=True)
class VarRecord:
    """One variable a step bound or mutated.

    ``kind`` is ``"shared"`` (pickled with the step's other shared variables
    into the blob ``ref``: one pickle per variable, one after the other in the
    order of the record's ``"shared"`` variables, with one memo, see
    :func:`nbdurable.store.values.dump_values`; its large buffers are blobs
    of their own, listed in ``spilled``), ``"value"`` (alone in the
    blob ``ref``; records of format 2), ``"module"`` (re-imported by the
    module name ``ref`` on replay), or ``"unsaved"`` (could not be pickled;
    ``ref`` holds the reason).
    """

    name: str
    kind: str
    ref: str
    fp: str
    size: int = 0
    type: str = ""
    #: for ``"shared"``: the large buffers of this variable's pickle kept as blobs
    #: of their own, ``[position among the blob's buffers, sha]`` (see
    #: :mod:`nbdurable.store.spill`)
    spilled: tuple[tuple[int, str], ...] = ()
    #: for an instance pickle rebuilds from its state: its fingerprint when recorded,
    #: which its readers compare (its restored copy may fingerprint otherwise: see
    #: ``Stepper._input_fp``); "" when not noted (and in records made before it was)
    content: str = ""


@dataclass(frozen=True)
class StepRecord(_Header):
    """A finished ``%%step`` cell: what it read, what it bound, what it printed."""

    KIND: ClassVar[str] = "step"

    run: str
    key: str
    name: str
    position: int | None
    source: str
    source_fp: str
    inputs: dict[str, str]
    input_from: dict[str, str]
    variables: tuple[VarRecord, ...]
    deleted: tuple[str, ...]
    outputs: tuple[dict[str, Any], ...]
    started: float
    duration: float
    substeps: int = 0
    substep_seconds: float = 0.0
    #: Process state the step changed (os.environ, sys.path, RNG states, options,
    #: user modules' data), as plain JSON data; see :mod:`nbdurable.procstate`.
    process: dict[str, Any] | None = None
    #: The value the last expression showed: ``{"var": name}`` (the object that
    #: saved variable holds), ``{"input": name}`` (the object that input holds)
    #: or ``{"ref": sha}`` (a blob, with ``"spilled"`` buffers: see
    #: :mod:`nbdurable.store.spill`); None when none was saved.
    result: dict[str, Any] | None = None
    format: int = RECORD_FORMAT
    #: environment variables the step read: name -> SHA-256 digest of the value it
    #: saw (None: unset); never the value. See :mod:`nbdurable.durable.envreads`.
    env: dict[str, str | None] = field(default_factory=dict)
    #: files the step read: absolute path -> [size, mtime_ns, SHA-256 of the content];
    #: see :mod:`nbdurable.durable.fileio`
    files: dict[str, list[Any]] = field(default_factory=dict)
    #: tokens the step's sub-steps' model replies reported, per model, as
    #: ``nbdurable.clients.usage.Tally.to_json`` gives them: what a replay saves
    tokens: list[list[Any]] = field(default_factory=list)
    #: ``%%step --inputs`` patterns, made absolute -> the files each matched (sorted);
    #: those files are in ``files`` too
    declared: dict[str, list[str]] = field(default_factory=dict)
    #: files the step wrote, as it left them: absolute path -> [size, mtime_ns, SHA-256],
    #: or [end, mtime_ns, SHA-256 of its part, start] for a file it appended to; see
    #: :mod:`nbdurable.durable.fileio`
    written: dict[str, list[Any]] = field(default_factory=dict)
    #: the inputs that were a library's module, class or function (``np``, ``KMeans``):
    #: what their name and installed version say all of, so a view with no kernel
    #: knows a Run All binds them the same; every other input a plain cell made is a
    #: value only the kernel sees (see :func:`nbdurable.identity.verdict.invalid_reason`)
    library: tuple[str, ...] = ()
    #: the inputs a plain cell made that were an immutable builtin value (``N = 5``) or a
    #: helper function it defined: name -> the value's
    #: :func:`~nbdurable.identity.analysis.literal_key` (a digest, never the value) or the
    #: function's :func:`~nbdurable.identity.localcode.notebook_function_key`, which a view
    #: with no kernel compares with what the saved cell binds
    plain: dict[str, str] = field(default_factory=dict)
    #: what each input looked like when the step started, and each variable it saved
    #: when it ended: name -> :func:`nbdurable.why.brief` (a short repr of a small
    #: builtin value, else its type and shape; secrets redacted), which "why" shows
    #: beside what the value is now (see :mod:`nbdurable.why`)
    seen: dict[str, str] = field(default_factory=dict)
    made: dict[str, str] = field(default_factory=dict)
    #: the generation of its step when written: the store stamps it (see
    #: :mod:`nbdurable.store.manifest`); absent from records written before manifests
    gen: int = 0

    @property
    def replayable(self) -> bool:
        """True when every variable and the process state can be restored without the body."""
        return all(v.kind != "unsaved" for v in self.variables) and not (
            self.process and self.process.get("unreplayable")
        )

    def _encode(self, d: dict[str, Any]) -> dict[str, Any]:
        d["variables"] = [{n: getattr(v, n) for n in _VAR_FIELDS} for v in self.variables]
        d["deleted"] = list(self.deleted)
        d["outputs"] = list(self.outputs)
        d["library"] = list(self.library)
        return d

    @classmethod
    def _decode(cls, d: dict[str, Any]) -> dict[str, Any]:
        var_fields = _field_set(VarRecord)
        d["variables"] = tuple(
            VarRecord(**{k: x for k, x in v.items() if k in var_fields}) for v in d["variables"]
        )
        d["deleted"] = tuple(d["deleted"])
        d["outputs"] = tuple(d["outputs"])
        d["library"] = tuple(d.get("library", ()))
        return d


@dataclass(frozen=True)
class SubRecord(_Header):
    """A finished sub-step: one ``step()`` call. Its value is the record's body."""

    KIND: ClassVar[str] = "sub"

    run: str
    scope: str
    id: str
    fn: str
    args_fp: str
    started: float
    duration: float
    size: int
    type: str
    format: int = FORMAT_VERSION
    #: :func:`~nbdurable.identity.callables.callable_fingerprint` of the function
    #: called, digest and parts; "" and {} in records written before it was recorded
    callee_fp: str = ""
    callee_parts: dict[str, str] = field(default_factory=dict)
    #: parts of the callee the call itself changed (its own counter or cache): not compared
    callee_volatile: list[str] = field(default_factory=list)
    #: labels (``#0``, a keyword) of the arguments the call changed in place; the
    #: body is then the pickle of ``(result, {label: the argument after the call})``
    mutated: list[str] = field(default_factory=list)
    #: how the call handed its value over, when not plainly: ``awaitable``,
    #: ``stream``, ``async_iter``, ``iter``, or ``awaitable:`` one of the last
    #: three (an awaited stream); replay hands back the same shape
    returns: str = ""
    #: tokens the reply reported (``Tally.to_json``: ``[[model, input, output, replies]]``)
    tokens: list[list[Any]] = field(default_factory=list)
    #: what the call printed and displayed while it ran, in the step's thread (the
    #: cell's outputs of that span): shown again when the call replays in a body
    #: that runs again; absent from the header when it printed nothing
    printed: list[dict[str, Any]] = field(default_factory=list)
    #: the generation of its scope when written: the store stamps it (see
    #: :mod:`nbdurable.store.manifest`); absent from records written before manifests
    gen: int = 0

    def _encode(self, d: dict[str, Any]) -> dict[str, Any]:
        # A field at its default is left out, as substeps writes the header (a sub-step
        # record is mostly its header); every reader takes the default for it.
        for name in _SUB_OMITTED:
            if not d[name]:
                del d[name]
        if d["format"] == FORMAT_VERSION:
            del d["format"]
        return d


#: SubRecord fields left out of a header when empty.
_SUB_OMITTED = ("callee_volatile", "mutated", "tokens", "printed")


#: Variable kinds whose ``ref`` is a blob.
BLOB_KINDS = ("value", "shared")


def blob_refs(header: dict[str, Any]) -> list[str]:
    """The blobs a record's header refers to: a step's variables' and result's, a sub-step's.

    Spilled buffers (see :mod:`nbdurable.store.spill`) are blobs too.
    """
    refs = []
    for v in header.get("variables", ()):
        if v.get("kind") in BLOB_KINDS:
            refs.append(v["ref"])
            refs += [sha for _pos, sha in v.get("spilled") or ()]
    result = header.get("result")
    if isinstance(result, dict) and isinstance(result.get("ref"), str):
        refs.append(result["ref"])
        refs += [sha for _pos, sha in result.get("spilled") or ()]
    # a sub-step record's: the memory of a large bytes result
    refs += [sha for sha in header.get("buffers") or () if isinstance(sha, str)]
    return refs


_VAR_FIELDS = tuple(f.name for f in dataclasses.fields(VarRecord))


@dataclass(frozen=True)
class StepState(_Header):
    """User-set and failure state of a step, kept apart from its record.

    A step can be pinned, can have failed on its last execution, and can be
    marked stale because a step it depends on was cleared.
    """

    KIND: ClassVar[str] = "state"

    pinned: bool = False
    failed: str | None = None
    failed_at: float | None = None
    stale: str | None = None
    name: str = ""
    position: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def _encode(self, d: dict[str, Any]) -> dict[str, Any]:
        d["extra"] = dict(self.extra)  # the record's own copy, as asdict made
        return d

    @property
    def confirmed(self) -> dict[str, float]:
        """Upstream steps recorded again since this step's record, that it then replayed
        against: step key -> the ``started`` of the upstream record it replayed after.

        A view with no kernel takes an input whose maker was recorded again for
        changed (:func:`nbdurable.identity.verdict.invalid_reason`), unless the step
        replayed after that record: then what it reads came out the same. Kept in
        ``extra``, which older versions read and keep.
        """
        got = self.extra.get("confirmed")
        return {str(k): float(v) for k, v in got.items()} if isinstance(got, dict) else {}

    @property
    def empty(self) -> bool:
        """True when the state says nothing worth keeping."""
        return not (self.pinned or self.failed or self.stale or self.confirmed)


def changed_mark(rk: RunKeys, action: str) -> tuple[str, dict[str, Any], bytes]:
    """The run's ``changed`` mark, written with a command's change (see ``RunKeys.changed``).

    What views poll to learn that a run changed under them: written with every
    clear, pin and decision, in the same write.
    """
    return (rk.changed, {"kind": "changed", "action": action, "at": time.time()}, b"")
