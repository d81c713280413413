"""Turning a finished step's variables and outputs into what the store keeps.

Each variable is pickled and stored once by content (a blob, see
:mod:`nbdurable.blobs`); modules are
kept by name; a value that cannot be pickled, or that holds a secret from
the environment, is kept as *unsaved* with the reason, never silently
dropped. Outputs and the source are scrubbed of secrets before they are
written. Everything that was not written is returned for one loud warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import config, faults, redact
from ..store import Store, blobs, values
from ..store.records import VarRecord


@dataclass
class Saved:
    """What :func:`save_variables` wrote, and what it could not."""

    variables: list[VarRecord] = field(default_factory=list)
    origins: dict[str, tuple[Any, str]] = field(default_factory=dict)  # name -> (value, blob sha)
    unsaved: list[str] = field(default_factory=list)  # "name (why)" for the warning
    secrets: list[str] = field(default_factory=list)  # "name ($VAR)" for the warning
    large: list[str] = field(default_factory=list)  # "name (123.4 MB)" for the warning
    #: small blobs to write in the step record's transaction (see Store.put_blob's defer)
    pending: dict[str, bytes] = field(default_factory=dict)


def save_variables(
    store: Store,
    ns: dict[str, Any],
    names: list[str],
    imported: set[str],
    fingerprint: Callable[[Any, str], str],
    secrets: dict[str, bytes],
) -> Saved:
    """Write a blob per variable of ``names`` (once by content); return the records."""
    out = Saved()
    limit = config.get().warn_size_mb * 1024 * 1024
    for name in names:
        value = ns[name]
        tname = values.type_name(value)
        if values.is_module(value):
            ref = values.module_ref(value, imported)
            out.variables.append(VarRecord(name, "module", ref, fingerprint(value, name)))
            continue
        try:
            stream, buffers = values.dumps_parts(value)
        except values.Unsaveable as exc:
            out.unsaved.append(f"{name} ({tname}: {exc})")
            out.variables.append(
                VarRecord(name, "unsaved", str(exc)[:200], fingerprint(value, name), 0, tname)
            )
            continue
        size = len(stream) + sum(b.nbytes for b in buffers)
        try:
            # Searched for secrets in the very copy that is hashed and written.
            sha, _written = store.put_blob(stream, buffers, defer=out.pending, secrets=secrets)
        except blobs.SecretFound as exc:
            out.secrets.append(f"{name} (${', $'.join(exc.names)})")
            why = "holds the value of $" + ", $".join(exc.names)
            out.variables.append(
                VarRecord(name, "unsaved", why, fingerprint(value, name), 0, tname)
            )
            continue
        if size > limit:
            out.large.append(f"{name} ({size / 1e6:.1f} MB)")
        faults.point("blob-written")
        out.origins[name] = (value, sha)
        # A saved value's fingerprint is its blob's SHA-256 (already computed:
        # a second pass over a 100 MB array would cost as much as writing it).
        out.variables.append(VarRecord(name, "value", sha, "blob:" + sha[:32], size, tname))
    return out


def scrub_outputs(
    outputs: list[dict[str, Any]], secrets: dict[str, bytes]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Outputs with every secret replaced by ``[redacted $NAME]``; and the names found."""
    if not secrets:
        return outputs, []
    found: set[str] = set()

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            text, names = redact.redact_text(value, secrets)
            found.update(names)
            return text
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        return value

    return [scrub(o) for o in outputs], sorted(found)
