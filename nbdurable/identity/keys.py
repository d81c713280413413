"""Step identity and fingerprints: the whole key recipe, in one place.

**Step keys** (:func:`step_key`), most stable first:

1. ``name:<name>`` for ``%%step NAME`` (label ``NAME``). Named steps survive
   edits, moves and copies of the cell; names are checked by :func:`validate_name`.
2. ``id:<cell id>`` (label ``cell <first 8 chars>``). The caller passes a cell id
   only when the notebook file on disk carries it: JupyterLab invents new
   random ids on every load of an nbformat 4.4 notebook, so an unsaved id would
   change after a restart.
3. ``pos:<index>`` (label ``cell #<index + 1>``): the 0-based index of the cell
   in the notebook, from our runner or from finding the cell's source in the
   saved notebook. The label counts from 1, as a reader counts cells.
4. ``src:<first 16 hex of the source fingerprint>`` (label ``cell <first 30
   chars of the first code line>``): survives restarts, not edits.

**Sub-step keys**: ``<step key>/<sub id>`` for ``step(id, ...)`` inside a
``%%step`` cell, ``~run/<sub id>`` outside any step; sub ids are checked by
:func:`validate_sub_id` and kept exactly. ``@recorded`` functions use
``<module.qualname>#<ordinal of the call within the enclosing step>`` as id
(outside a step ``<module.qualname>#<first 12 hex of args_fingerprint>#<ordinal>``).

**Source fingerprint** (:func:`source_fingerprint`): SHA-256 of
:func:`normalize_source` of the cell's Python (after IPython's transforms),
i.e. of its AST, so comments, blank lines and formatting never invalidate a
step, while any code edit does. A trailing ``;`` after a final expression is
kept (it decides whether IPython displays the result).

**Input fingerprints**: for each name of :attr:`CellAnalysis.reads` (may be
read before the cell binds it, see :func:`analyse`) that exists in the
namespace, :func:`fingerprint` of its value: data by content (dicts in key
order, sets in any order), objects by their pickle state, functions by code,
closure and the globals they read, library modules and classes by name, local
modules (outside site-packages and the standard library) by source, notebook
classes by their members too; what cannot be pickled (sockets, locks, clients)
by type only, which :func:`fingerprint_info` reports. A step re-executes when
its source fingerprint or any input fingerprint changed.

**Callee fingerprints** (:func:`callable_fingerprint`): what a sub-step calls,
by code, defaults, closure values, ``__wrapped__``, bound instance and the
globals it reads, transitively through notebook functions and local modules;
a recorded call replays only if its callee's fingerprint is unchanged.

**Idempotency keys**: ``"nbd-"`` + the first 32 hex digits of the SHA-256 of
``run id, step key@step version, sub id, name`` (UTF-8, joined by NUL; the
version is 16 hex of the SHA-256 of the source fingerprint and the sorted
``name=fingerprint`` inputs, :func:`step_version`; outside a step the scope is ``~run``), stable
across replays and retries of the same step version, new when the step's
code or inputs change, distinct between sub-steps.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re

from .. import redact
from ..errors import BadArgument, UsageProblem
from .analysis import CellAnalysis, _parse, analyse, ends_with_semicolon
from .callables import callable_fingerprint
from .fingerprint import args_fingerprint, fingerprint, fingerprint_info

__all__ = [
    "CellAnalysis",
    "analyse",
    "args_fingerprint",
    "callable_fingerprint",
    "fingerprint",
    "fingerprint_info",
    "normalize_source",
    "source_fingerprint",
    "step_key",
    "step_version",
    "validate_name",
    "validate_sub_id",
]

# -- source -------------------------------------------------------------------


def normalize_source(source: str) -> str:
    """The cell's code with comments, blank lines and formatting removed.

    Parseable code (top-level ``await`` included) comes back as
    ``ast.unparse`` of its AST. We unparse rather than ``ast.dump`` because
    the dump changes with every new AST field or dump default (3.12 added
    ``type_params``, 3.13 hides empty fields), whereas unparsed source only
    changes when the grammar does, so a Python upgrade invalidates fewer steps.
    Code that does not parse (or is too deeply nested to unparse) falls back
    to its lines without comment-only lines, blank lines or trailing spaces.
    A final expression statement followed by ``;`` keeps it (``ast.unparse``
    drops it): IPython does not display that result, so adding or removing it
    changes what the cell shows. Never raises.
    """
    try:
        tree = _parse(source)
        text = ast.unparse(tree)
        if tree.body and isinstance(tree.body[-1], ast.Expr) and ends_with_semicolon(source):
            text += ";"
        return text
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        lines = (line.rstrip() for line in source.splitlines())
        return "\n".join(s for s in lines if s and not s.lstrip().startswith("#"))


def source_fingerprint(source: str) -> str:
    """SHA-256 (32 hex digits) of :func:`normalize_source`."""
    data = normalize_source(source).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:32]


# -- names --------------------------------------------------------------------

#: A step name (the frontend gets it from the server, see nbdurable.states.vocabulary).
NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}"
_NAME = re.compile(NAME_PATTERN)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # nbformat 4.5's cell id pattern
_NAME_RULE = "use letters, digits, _ . : - (at most 128, starting with a letter or _)"


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=8192)
def _key_names_of(text: str) -> tuple[str, ...]:
    # The key patterns are fixed: a name is searched once per process, not once per
    # look (a view checks every saved step's name each time it reads the notebook).
    return tuple(redact.name_key_names(text))


def refuse_secret(text: str, what: str) -> None:
    """Raise :class:`UsageProblem` if ``text`` (a name or id, which becomes part of a
    record's key and header, never redacted there) holds a key or an environment
    secret; the message names what, never the text.
    """
    found = list(_key_names_of(text))
    found += [n for n, v in redact.secrets_in_env().items() if v.decode("utf-8", "replace") in text]
    if found:
        raise UsageProblem(
            f"{what} holds {redact.said(found)}: it would be stored as part of the record's "
            "key; use a name without it (an index, a hash of the prompt)"
        )


def validate_name(name: str, what: str = "step name") -> str:
    """Return ``name`` if it is a valid step name, else raise :class:`UsageProblem`."""
    if not isinstance(name, str):
        raise BadArgument(f"{what} must be a str, got {type(name).__name__}")
    refuse_secret(name, f"a {what}")
    if not _NAME.fullmatch(name):
        raise UsageProblem(f"{what} {_shown(name)} is not allowed: {_NAME_RULE}")
    return name


#: The ids of the HTTP exchanges a ``--http`` step records (``http:N``), no one else's.
HTTP_PREFIX = "http:"
#: The sub-step ids of approval decisions (see nbdurable.approvals): ``approval:<id>``.
APPROVAL_PREFIX = "approval:"


def validate_sub_id(sub_id: object) -> str:
    r"""Return ``sub_id`` as a plain str if it is a valid sub-step id.

    Any non-empty str of at most 512 characters without control characters
    (``\x00``-``\x1f``, ``\x7f``), not starting with :data:`HTTP_PREFIX`, is
    valid and kept exactly: no normalization, so two different ids never collide. A non-str raises
    ``TypeError``; a bad str raises :class:`UsageProblem` (a ``ValueError``).
    """
    if not isinstance(sub_id, str):
        raise BadArgument(f"a sub-step id must be a str, got {type(sub_id).__name__}")
    if not sub_id:
        raise UsageProblem("a sub-step id must not be empty: pass a non-empty str")
    refuse_secret(sub_id, "a sub-step id")
    if len(sub_id) > 512:
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)} has {len(sub_id)} characters: at most 512 are allowed"
        )
    if sub_id.startswith(HTTP_PREFIX):
        # A ``--http`` step keeps its exchanges as sub-steps ``http:N``: a user's
        # own id there would be answered with (or overwrite) a recorded exchange.
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)}: ids starting with {HTTP_PREFIX!r} are kept for "
            "the HTTP exchanges of --http steps; choose another id"
        )
    if sub_id.startswith(APPROVAL_PREFIX):
        # A decision of approve() is recorded as the sub-step ``approval:<id>``.
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)}: ids starting with {APPROVAL_PREFIX!r} are kept for "
            "the decisions of approve(); choose another id"
        )
    bad = _CONTROL.search(sub_id)
    if bad:
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)} contains the control character {bad.group()!r} "
            f"at index {bad.start()}: ids may not contain \\x00-\\x1f or \\x7f"
        )
    try:
        sub_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageProblem(
            f"sub-step id {_shown(sub_id)} contains the lone surrogate {sub_id[exc.start]!r} "
            f"at index {exc.start}, which the store cannot hold; decode names read as bytes "
            "with errors='backslashreplace'"
        ) from None
    return str.__str__(sub_id)  # a plain str, also for str subclasses


def step_key(
    name: str | None, cell_id: str | None, position: int | None, source: str
) -> tuple[str, str]:
    """``(key, label)`` of a step, by the recipe in the module docstring.

    The first of ``name``, ``cell_id`` (empty counts as absent), ``position``
    (0-based; the label shows it 1-based) that is given decides; without any,
    the normalized source does. ``name`` is checked with :func:`validate_name`.
    """
    if name is not None:
        return f"name:{validate_name(name)}", name
    if cell_id and _CELL_ID.fullmatch(cell_id):
        return f"id:{cell_id}", f"cell {cell_id[:8]}"
    if position is not None:
        return f"pos:{position}", f"cell #{position + 1}"
    lines = (line.strip() for line in source.splitlines())
    first = next((s for s in lines if s and not s.startswith("#")), "(empty)")
    return f"src:{source_fingerprint(source)[:16]}", f"cell {first[:30]}"


def step_version(source_fp: str, inputs: dict[str, str]) -> str:
    """The version of a step's record: its source fingerprint and its inputs' (16 hex).

    The same for every execution of the same code on the same inputs (a retry
    after a crash, a parameter set back to an earlier value), new when either
    changes. A step keeps a record per version (see :mod:`nbdurable.store.versions`).
    """
    raw = "\0".join([source_fp, *(f"{n}={fp}" for n, fp in sorted(inputs.items()))])
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]
