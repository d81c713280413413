"""Keeping secrets out of the store.

The values of environment variables whose names look secret (``*KEY*``,
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, any case) must never be written to
the store. Before a value is written, its bytes are searched for each such
secret (as UTF-8 text, which is how pickle stores a ``str``); a value that
contains one is not written, and the warning names the step, the variable
and the environment variable, never the secret itself.
"""

from __future__ import annotations

import os
import re
from typing import Any

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
#: Shorter values are too likely to occur by chance ("1", "true") to hunt for.
MIN_SECRET_LENGTH = 8
#: Our own store key may be a secret too, but it is not a user secret to hunt.
_OURS = {"NBDURABLE_KEY"}


def secrets_in_env(environ: dict[str, str] | None = None) -> dict[str, bytes]:
    """``{variable name: value as UTF-8}`` for secret-looking environment variables.

    Called before every write, so it reads ``os.environ``'s raw storage and
    remembers which names look secret, instead of decoding every variable
    each time (a few microseconds, not a hundred).
    """
    if environ is not None:
        items: Any = ((k.encode(), v.encode("utf-8")) for k, v in environ.items())
    else:
        raw = getattr(os.environ, "_data", None)
        if raw is None:  # pragma: no cover - every CPython has it
            return secrets_in_env(dict(os.environ))
        items = raw.items()
    out: dict[str, bytes] = {}
    for key, value in items:
        looks = _looks_secret.get(key)
        if looks is None:
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
            looks = _looks_secret[key] = bool(_SECRET_NAME.search(name)) and name not in _OURS
        if looks:
            val = value if isinstance(value, bytes) else value.encode("utf-8")
            if len(val.strip()) >= MIN_SECRET_LENGTH:
                name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
                out[name] = val
    return out


_looks_secret: dict[Any, bool] = {}


def find_secrets(data: bytes | str, secrets: dict[str, bytes] | None = None) -> list[str]:
    """Names of the environment variables whose secret value occurs in ``data``."""
    secrets = secrets_in_env() if secrets is None else secrets
    if not secrets:
        return []
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return sorted(name for name, value in secrets.items() if value in raw)


def redact_text(text: str, secrets: dict[str, bytes] | None = None) -> tuple[str, list[str]]:
    """``text`` with every secret replaced by ``[redacted $NAME]``, and the names found."""
    secrets = secrets_in_env() if secrets is None else secrets
    found = []
    for name, value in secrets.items():
        plain = value.decode("utf-8", "replace")
        if plain in text:
            text = text.replace(plain, f"[redacted ${name}]")
            found.append(name)
    return text, sorted(found)


# -- well-known key formats ----------------------------------------------------

# Characters that may neither precede nor follow a key: those of keys and of
# base64 (standard and URL-safe) runs.
_EDGE_BEFORE = r"(?<![A-Za-z0-9_+/=-])"
_EDGE_AFTER = r"(?![A-Za-z0-9_+/=-])"

#: ``kind: pattern`` (as text); order matters where one prefix contains another.
KEY_FORMATS: dict[str, str] = {
    # (a digit is required: hyphenated prose such as "sk-learn-..." has none)
    "anthropic": r"sk-ant-(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{20,}",
    "openai": r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{20,}",
    "aws": r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",
    "github": r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    "google": r"AIza[0-9A-Za-z_-]{35}",
}
# An AWS secret key has no prefix: 40 characters of base64. It is taken only
# after its usual label, or within a few lines after an access key id.
_AWS_SECRET_LABELLED = (
    r"(?i:aws_secret_access_key|secret_access_key|secretaccesskey)"
    r"[\"']?\s*[:=]\s*[\"']?(?P<secret>[A-Za-z0-9/+]{40})" + _EDGE_AFTER
)
_AWS_SECRET_NEAR = _EDGE_BEFORE + r"[A-Za-z0-9/+]{40}" + _EDGE_AFTER
_NEAR = 300  # characters after an access key id in which a bare secret key is taken


def _compile(pattern: str) -> tuple[re.Pattern[str], re.Pattern[bytes]]:
    return re.compile(pattern), re.compile(pattern.encode())


_KEYS = {
    kind: _compile(_EDGE_BEFORE + pattern + _EDGE_AFTER) for kind, pattern in KEY_FORMATS.items()
}
_AWS_LABELLED = _compile(_AWS_SECRET_LABELLED)
_AWS_NEAR = _compile(_AWS_SECRET_NEAR)


def _spans(data: str | bytes) -> list[tuple[int, int, str]]:
    """``(start, end, kind)`` of every key in ``data``, not overlapping, in order."""
    which = 1 if isinstance(data, bytes) else 0
    spans: list[tuple[int, int, str]] = []
    for kind, patterns in _KEYS.items():
        spans += [(m.start(), m.end(), kind) for m in patterns[which].finditer(data)]
    aws_ids = [s for s in spans if s[2] == "aws"]
    for m in _AWS_LABELLED[which].finditer(data):
        spans.append((m.start("secret"), m.end("secret"), "aws"))
    for _, end, _ in aws_ids:
        for m in _AWS_NEAR[which].finditer(data, end):
            if m.start() > end + _NEAR:
                break
            spans.append((m.start(), m.end(), "aws"))
    spans.sort()
    kept: list[tuple[int, int, str]] = []
    for span in spans:
        if kept and span[0] < kept[-1][1]:
            continue  # inside one already taken (an id's window may meet a labelled secret)
        kept.append(span)
    return kept


def find_keys(data: str | bytes) -> list[str]:
    """The kinds of well-known keys (``"openai"``, ``"aws"``, ...) that occur in ``data``."""
    return sorted({kind for _, _, kind in _spans(data)})


def redact_keys(data: Any, *, keep_length: bool = False) -> tuple[Any, list[str]]:
    """``data`` (text or bytes) with every well-known key replaced, and the kinds found.

    A key becomes ``[redacted KIND key]``; with ``keep_length=True`` it becomes
    that label cut or padded with ``*`` to the key's own length, so byte
    offsets and lengths around it stay valid.
    """
    spans = _spans(data)
    if not spans:
        return data, []
    is_bytes = isinstance(data, bytes)
    parts: list[Any] = []
    pos = 0
    for start, end, kind in spans:
        label = f"[redacted {kind} key]"
        if keep_length:
            label = (label + "*" * (end - start))[: end - start]
        parts += [data[pos:start], label.encode() if is_bytes else label]
        pos = end
    parts.append(data[pos:])
    joined = (b"" if is_bytes else "").join(parts)
    return joined, sorted({kind for _, _, kind in spans})
