"""Small text helpers shared by every message nbdurable prints."""

from __future__ import annotations

import re

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: object) -> str:
    r"""``text`` on one line, for a message: every run of whitespace (line breaks
    too) made one space, any other control character escaped (``\x07``).
    """
    flat = " ".join(str(text).split())
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], flat)


def plural(n: int, word: str) -> str:
    """``1 call``, ``2 calls``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def tokens(n: int, cost: float | None = None) -> str:
    """``1,234 tokens``, with ``($0.0123)`` when a cost is known."""
    money = "" if cost is None else f" (${cost:.4f})" if cost < 1 else f" (${cost:,.2f})"
    return f"{n:,} token{'' if n == 1 else 's'}{money}"


def human_size(n: int) -> str:
    """``1.2 MB`` style size."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def seconds(t: float) -> str:
    """``0.04 s``, ``12.3 s``, ``4 min 5 s``, ``1 h 3 min``."""
    if t < 0.1:
        return f"{t:.2f} s"
    if t < 60:
        return f"{t:.1f} s"
    if t < 3600:
        return f"{int(t // 60)} min {int(t % 60)} s"
    return f"{int(t // 3600)} h {int(t % 3600 // 60)} min"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters at a sentence's end (else a word's),
    with ``…`` where something was cut: a message never stops mid-word.
    """
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    end = head.rfind(". ")
    if end >= limit // 3:
        return head[: end + 1] + " …"
    space = head.rfind(" ")
    return (head[:space] if space >= limit // 3 else head).rstrip(" ,;:") + "…"
