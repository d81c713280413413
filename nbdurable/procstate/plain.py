"""Plain data: values described as JSON-safe data, and back; nothing is ever unpickled.

A delta (see :mod:`nbdurable.procstate`) lives in a step record's JSON
header, so every value in it is described by :func:`encode`.
"""

from __future__ import annotations

import base64
import math
from typing import Any

#: A recorded value larger than this (as JSON) is not kept; the step reruns instead.
MAX_VALUE_CHARS = 1_000_000


ABSENT = object()  # an attribute or option that does not exist


class NotPlain(Exception):
    """A value cannot be described as plain data; the message says why."""


def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON-safe data that :func:`decode` turns back into an equal value.

    Exact types only: ``None``, ``bool``, ``int``, ``float``, ``complex``,
    ``str``, ``bytes``, and ``list``/``tuple``/``dict``/``set``/``frozenset``
    of those. A subclass (an ``OrderedDict``, a named tuple, an enum) raises
    :class:`NotPlain`: it would not come back as itself. Every JSON object in
    the result is a tag (``{"tuple": [...]}``), so lists and tags never mix up.
    """
    if _depth > 100:
        raise NotPlain("nested too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is list:
        return [encode(v, _depth + 1) for v in value]
    if t is tuple or t is set or t is frozenset:
        return {t.__name__: [encode(v, _depth + 1) for v in value]}
    if t is dict:
        return {"dict": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": base64.b64encode(value).decode("ascii")}
    if t is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    if t.__name__ == "Cycler" and t.__module__.startswith("cycler"):
        # matplotlib's axes.prop_cycle: rcParams accepts (and validates) its repr.
        return {"cycler": repr(value)}
    raise NotPlain(f"holds a {t.__module__}.{t.__qualname__}")


def decode(data: Any) -> Any:
    """The value :func:`encode` described."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    ((tag, body),) = data.items()
    if tag == "tuple":
        return tuple(decode(v) for v in body)
    if tag == "set":
        return {decode(v) for v in body}
    if tag == "frozenset":
        return frozenset(decode(v) for v in body)
    if tag == "dict":
        return {decode(k): decode(v) for k, v in body}
    if tag == "float":
        return float(body)
    if tag == "bytes":
        return base64.b64decode(body)
    if tag == "complex":
        return complex(decode(body[0]), decode(body[1]))
    if tag == "cycler":
        return body  # a string: matplotlib's rcParams validator builds the Cycler
    raise ValueError(f"unknown tag {tag!r} in recorded process state")
