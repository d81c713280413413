"""Whether a step's record replays: the one decision the step runner acts on and every view shows.

:func:`invalid_reason` takes a step's record and state and what is known
now, and returns why the record cannot be replayed (one phrase: "its code
changed", "input 'x' changed", "file 'data.csv' changed", ...) or None when
it replays. The step runner (:mod:`nbdurable.durable.stepper`) calls it with
everything known in the kernel at the moment the cell runs; the panel,
``%step list`` and ``nbdurable status`` (through :mod:`nbdurable.status`)
call it with what they know, so what they show is what running does.

What is known differs by caller, never the rule:

- ``source_fp``: the cell's code as Python; None when the cell is not known
  (a step no longer in the saved notebook): its code is not compared.
- ``inputs``: the current fingerprint of each input name the caller can
  see. The step runner sees the whole namespace (a name the record read
  and the namespace lacks is a change); the panel sees the kernel's
  namespace as it is between cells; ``nbdurable status`` sees none.
- ``unknown``: input names whose current value the caller cannot see (not
  yet in a restarted kernel's namespace, or no kernel at all). For those
  the store decides: when the step that made the value (the record's
  ``input_from``) has been recorded again since this record, and this step
  has not replayed against that new record since (``StepState.confirmed``),
  the value came from an older execution of it and the input changed (a
  cascade from an upstream change). Otherwise a Run All restores the same
  value first, and the input counts as unchanged. A library's module,
  class or function (``StepRecord.library``) is what its name says: a Run
  All binds the same. A plain cell's immutable value or helper function
  (``StepRecord.plain``: a literal's digest, a ``def``'s key) is compared
  with what the saved notebook's plain cells bind it to before the step
  (``plain_now``, where known: the same is unchanged, another is a change).
  Any other value a plain cell made is seen only by
  the kernel: the step "may run" (:data:`MAY_RUN`), never a promised replay.
- ``declared``: the ``--inputs`` patterns with the files they match now;
  None when the cell's patterns are not known here.
- ``environment``: compare the environment variables the step read with
  this process's environment: only a kernel's environment is the step's.
- ``will_run``: for a prediction (the views; never the step runner), the
  steps before this one that the next run executes, or may execute
  (:func:`will_run_entry`). When nothing else invalidates the record but it
  read a value one of them makes (the record's ``input_from``, or
  ``writers``: the step that assigns the name last before this one in the
  notebook as saved, which finds a step renamed or added since the record),
  the step's fate is not known yet: the step runner replays it only if that value
  comes out of the rerun the same. The reason then begins with
  :data:`MAY_RUN` (``"may run: step 'plan' runs first: replays only if
  'plan' comes out the same"``), and the views show the state "may run",
  never a replay that may not happen. A pinned step replays whatever runs
  before it: no such reason. The step runner needs none: when it judges a
  step, the steps before it have run, and their values are in the inputs
  it compares.

Recorded files are always checked: they are absolute paths read from disk;
the files a step wrote first (a missing or changed one is named: "output
file 'out/result.csv' is missing").
The comparisons of files and environment variables with what a record
keeps live here too (:func:`files_changed`, :func:`declared_changes`,
:func:`env_changed`), with the digests the kernel records them by
(:func:`file_digest`, :func:`value_digest`), so recording and judging
cannot drift apart.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.records import StepRecord, StepState


def invalid_reason(
    rec: StepRecord,
    state: StepState,
    *,
    source_fp: str | None,
    inputs: Mapping[str, str],
    unknown: Collection[str] = (),
    upstream: Mapping[str, StepRecord] | None = None,
    declared: dict[str, list[str]] | None = None,
    environment: bool = True,
    will_run: Mapping[str, tuple[str, bool]] | None = None,
    writers: Mapping[str, str] | None = None,
    outcomes: Mapping[str, Mapping[str, bool]] | None = None,
    plain_now: Mapping[str, str | None] | None = None,
) -> str | None:
    """Why ``rec`` cannot be replayed, or None if it can (see the module docstring)."""
    if source_fp is not None and rec.source_fp != source_fp:
        return "its code changed"
    if state.stale:
        return state.stale
    gone = files_changed(rec.written)
    if gone:
        return output_reason(gone)
    if declared is not None:
        matched = declared_changes(rec.declared, declared)
        if matched:
            return matched
    files = files_changed(rec.files)
    if files:
        listed = ", ".join(repr(os.path.basename(p)) for p in files[:5])
        return f"file{'s' if len(files) > 1 else ''} {listed} changed"
    if environment:
        env = env_changed(rec.env)
        if env:
            listed = ", ".join(f"${n}" for n in env[:5])
            return f"environment variable{'s' if len(env) > 1 else ''} {listed} changed"
    names = set(rec.inputs) | set(inputs)
    changed = sorted(n for n in names - set(unknown) if rec.inputs.get(n) != inputs.get(n))
    # Unseen values a plain cell makes: the literal the saved cell binds now, where known.
    plain, rebound = [], []
    for n in sorted(set(unknown) & set(rec.inputs)):
        if n in rec.library or rec.input_from.get(n) not in (None, rec.key):
            continue
        now, was = (plain_now or {}).get(n), rec.plain.get(n)
        if now is None or was is None:
            plain.append(n)
        elif now != was:
            rebound.append(n)
    if rebound and not changed:
        listed = ", ".join(repr(n) for n in rebound[:5])
        s, them = ("s", "them") if len(rebound) > 1 else ("", "it")
        return f"input{s} {listed} changed ({PLAIN_REBOUND} {them} to another value)"
    changed = sorted(set(changed) | set(rebound))
    remade = sorted(
        n for n in set(unknown) & set(rec.inputs) if _remade(rec, n, upstream, state.confirmed)
    )
    if remade and not changed:
        maker = (upstream or {})[rec.input_from[remade[0]]]
        listed = ", ".join(repr(n) for n in remade[:5])
        s = "s" if len(remade) > 1 else ""
        return f"input{s} {listed} changed (step {maker.name or maker.key!r} ran again)"
    changed = sorted(set(changed) | set(remade))
    if changed:
        listed = ", ".join(repr(n) for n in changed[:5])
        return f"input{'s' if len(changed) > 1 else ''} {listed} changed"
    if state.pinned:
        return None
    if will_run:
        waits = _upstream_runs(rec, will_run, writers or {}, outcomes or {})
        if waits is not None:
            return waits
    if plain:
        listed = ", ".join(repr(n) for n in plain[:5])
        it, come = ("it", "comes") if len(plain) == 1 else ("they", "come")
        return (
            f"{MAY_RUN}reads {listed} from plain cells (seen only in a kernel): "
            f"replays only if {it} {come} out the same"
        )
    return None


#: In the reason of an input a saved plain cell now binds to another literal.
PLAIN_REBOUND = "a plain cell binds"

#: How a reason begins when the step's fate waits on a step before it (see invalid_reason).
MAY_RUN = "may run: "


def may_run(reason: str | None) -> bool:
    """Whether ``reason`` says the step may run (an upstream step runs first), not that it will."""
    return reason is not None and reason.startswith(MAY_RUN)


def will_run_entry(label: str, state: str) -> tuple[str, bool] | None:
    """What a view passes in ``will_run`` for a step it predicts in ``state``, or None.

    A step that runs (invalidated, pending, failed, running now, waiting for
    an approval: it runs again once decided) is certain
    to make its values again; one that may run may. Replayed, recorded,
    pinned and orphaned steps make nothing new. Nor does a step that is only
    not replayable: its body reruns, but with the code and inputs its
    values were recorded from, so they come out as recorded, which is what
    every replay assumes (when its code or inputs changed, it is
    invalidated instead).
    """
    if state in ("invalidated", "pending", "failed", "running", "waiting"):
        return (label, True)
    if state == "may run":
        return (label, False)
    return None


def _upstream_runs(
    rec: StepRecord,
    will_run: Mapping[str, tuple[str, bool]],
    writers: Mapping[str, str],
    outcomes: Mapping[str, Mapping[str, bool]],
) -> str | None:
    """``may run: step 'plan' runs first: replays only if 'plan' comes out the same``, or None.

    Where the upstream's outcome for a name is known before it runs
    (``outcomes``: ``N = 3`` in its code before and after an edit comes out
    the same; ``STYLE = 'bold'`` where it was ``'plain'`` does not), the
    step does not wait on that name: it replays, or it runs ("input 'STYLE'
    changes (step 'config' runs first)").
    """

    def maker(name: str) -> str | None:
        # The step that made the value when recorded, else the one writing it now.
        for key in (rec.input_from.get(name), writers.get(name)):
            if key is not None and key != rec.key and key in will_run:
                return key
        return None

    found: dict[str, str] = {}
    changes: list[str] = []
    for name in rec.inputs:
        key = maker(name)
        if key is None:
            continue
        known = outcomes.get(key, {}).get(name)
        if known is True:
            continue  # comes out of the rerun the same
        if known is False and rec.input_from.get(name) == key and will_run[key][1]:
            changes.append(name)  # the value this record read is not what the rerun makes
            continue
        found[name] = key
    if changes:
        changes.sort()
        label = will_run[rec.input_from[changes[0]]][0]
        listed = ", ".join(repr(n) for n in changes[:5])
        verb = "changes" if len(changes) == 1 else "change"
        return f"input{'s' if len(changes) > 1 else ''} {listed} {verb} (step {label!r} runs first)"
    waiting = sorted(found)
    if not waiting:
        return None
    # The first certain one names the cause; only "may run" steps: the first of those.
    makers = [will_run[found[n]] for n in waiting]
    label, certain = next((m for m in makers if m[1]), makers[0])
    listed = ", ".join(repr(n) for n in waiting[:5])
    verb = "runs" if certain else "may run"
    come = "comes" if len(waiting) == 1 else "come"
    return f"{MAY_RUN}step {label!r} {verb} first: replays only if {listed} {come} out the same"


def _remade(
    rec: StepRecord,
    name: str,
    upstream: Mapping[str, StepRecord] | None,
    confirmed: Mapping[str, float],
) -> bool:
    """Whether the step that made input ``name`` was recorded again after ``rec`` was,
    and ``rec`` has not replayed since (``confirmed``: see ``StepState.confirmed``).
    """
    maker_key = rec.input_from.get(name)
    if not upstream or maker_key is None or maker_key == rec.key:
        return False
    maker = upstream.get(maker_key)
    return (
        maker is not None
        and maker.started > rec.started
        and confirmed.get(maker_key) != maker.started
    )


def file_digest(path: str, start: int = 0, end: int | None = None) -> str | None:
    """SHA-256 (32 hex) of a file's bytes (``start`` to ``end``), None if it cannot be read.

    Streamed in 1 MiB chunks: a file of any size costs one pass and no memory.
    A file shorter than ``end`` is None: it no longer holds those bytes.
    """
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            fh.seek(start)
            left = end - start if end is not None else None
            while left is None or left > 0:
                chunk = fh.read(1 << 20 if left is None else min(1 << 20, left))
                if not chunk:
                    break
                h.update(chunk)
                if left is not None:
                    left -= len(chunk)
            if left:
                return None
        return h.hexdigest()[:32]
    except OSError:
        return None


def files_changed(recorded: dict[str, list[Any]]) -> list[str]:
    """The recorded files that are gone or whose content differs, in path order.

    Same size and mtime: unchanged; otherwise the content digest decides.
    Files read and written whole are ``[size, mtime_ns, digest]``; a file a
    step appended to is ``[end, mtime_ns, digest of start..end, start]``
    (see :mod:`nbdurable.durable.fileio`): it may have grown since, its part
    must be intact.
    """
    out = []
    for path in sorted(recorded):
        try:
            size, mtime, digest, *rest = recorded[path]
            start = int(rest[0]) if rest else None
        except (TypeError, ValueError):
            out.append(path)
            continue
        try:
            st = os.stat(path)
        except OSError:
            out.append(path)
            continue
        if st.st_size == size and st.st_mtime_ns == mtime:
            continue
        if start is None:
            same = st.st_size == size and file_digest(path) == digest
        else:
            same = st.st_size >= size and file_digest(path, start, size) == digest
        if not same:
            out.append(path)
    return out


#: How the reason a step's output files invalidate it begins (see output_reason).
OUTPUT_REASON = "output file"


def output_reason(paths: list[str]) -> str:
    """``output file 'out/result.csv' is missing``: the first few, each missing or changed."""
    said = [f"{_shown_path(p)!r} {'changed' if os.path.exists(p) else 'is missing'}"
            for p in paths[:3]]  # fmt: skip
    more = f" (and {len(paths) - 3} more)" if len(paths) > 3 else ""
    plural = "s" if len(paths) > 1 else ""
    return f"{OUTPUT_REASON}{plural} {', '.join(said)}{more}"


def _shown_path(path: str) -> str:
    """A path as the user wrote it, most likely: relative when under the working directory."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if rel.startswith(os.pardir) else rel


def declared_changes(recorded: dict[str, list[str]], now: dict[str, list[str]]) -> str | None:
    """Why the declared files differ from those recorded (one phrase), or None.

    The files' contents are compared by :func:`files_changed` (they are in
    the record's files too); here only which files the patterns match.
    """
    if sorted(recorded) != sorted(now):
        return "its --inputs patterns changed"
    for pattern in sorted(now):
        before, after = set(recorded[pattern]), set(now[pattern])
        for verb, paths in (("added", after - before), ("removed", before - after)):
            if paths:
                listed = ", ".join(repr(os.path.basename(p)) for p in sorted(paths)[:5])
                return f"file{'s' if len(paths) > 1 else ''} {listed} {verb}"
    return None


def value_digest(value: str | None) -> str | None:
    """What a step's record keeps of an environment value: a digest, never the value."""
    if value is None:
        return None
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def env_changed(recorded: dict[str, Any]) -> list[str]:
    """The recorded variables whose value in this process differs, in name order.

    A variable is recorded as the digest the step read, or as ``[read, left]``
    when the step itself then set it (an import's ``os.environ.setdefault``,
    as scikit-learn's does): the variable is unchanged if it holds either
    (the process before the step, or after a step that ran earlier set it).
    """
    out = []
    for name in sorted(recorded):
        was = recorded[name]
        if value_digest(os.environ.get(name)) not in (was if isinstance(was, list) else [was]):
            out.append(name)
    return out
