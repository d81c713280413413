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
