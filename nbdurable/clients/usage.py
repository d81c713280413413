"""Tokens a model call used, read from what the call returned; and what they cost.

Pure: no SDK is imported. Every shape is read by its field names, from an
object's attributes or a dict's keys alike, so a reply that was pickled,
rebuilt, or written as a plain dict reads the same as the SDK's own object.

What is read (input tokens, output tokens):

================================  ================================================
OpenAI ``ChatCompletion``, a      ``usage.prompt_tokens``, ``usage.completion_tokens``
stream chunk with usage, litellm
``ModelResponse``
OpenAI Responses ``Response``     ``usage.input_tokens``, ``usage.output_tokens``
and its ``response.completed``
event
Anthropic ``Message``             ``usage.input_tokens`` (plus
                                  ``cache_creation_input_tokens`` and
                                  ``cache_read_input_tokens``, which Anthropic
                                  counts apart), ``usage.output_tokens``
Anthropic stream events           ``message_start.message.usage``, then each
                                  ``message_delta.usage``; these are running
                                  totals, so the last value of each field wins
LangChain ``AIMessage`` (and      ``usage_metadata["input_tokens"]``,
chunks)                           ``usage_metadata["output_tokens"]``; chunks add
================================  ================================================

A stream's usage (:func:`usage_of_stream`) follows each API's rule: OpenAI
sends usage once, in a last chunk with no choices (only when asked with
``stream_options={"include_usage": True}``), so the last chunk that has it
wins; Anthropic sends running totals; LangChain chunks add up.

Tokens are summed per model in a :class:`Tally` (one per step, one per run),
so that a cost can be put on them from prices the user gives, never from a
table fetched from the network: ``{"model": (input per 1k, output per 1k)}``.
A reply's model name often carries a date (``gpt-4o-2024-08-06``); a price
given for ``gpt-4o`` applies to it (the longest given name it starts with).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Prices = Mapping[str, tuple[float, float]]


@dataclass(frozen=True)
class Tokens:
    """Input and output tokens, and how many replies reported them."""

    input: int = 0
    output: int = 0
    replies: int = 0

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input + self.output

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.input + other.input, self.output + other.output, self.replies + other.replies
        )

    def __bool__(self) -> bool:
        return bool(self.replies or self.input or self.output)


def _get(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]``, None when absent (never raises)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    try:
        return getattr(obj, name, None)
    except Exception:  # a property that raises is "absent" here
        return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _from_usage(usage: Any) -> Tokens | None:
    """Tokens from a ``usage`` block of any of the known shapes."""
    if usage is None:
        return None
    prompt, completion = _int(_get(usage, "prompt_tokens")), _int(_get(usage, "completion_tokens"))
    if prompt is not None or completion is not None:
        return Tokens(prompt or 0, completion or 0, 1)
    inp, out = _int(_get(usage, "input_tokens")), _int(_get(usage, "output_tokens"))
    if inp is None and out is None:
        return None
    cached = sum(
        _int(_get(usage, name)) or 0
        for name in ("cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return Tokens((inp or 0) + cached, out or 0, 1)


def usage_of(obj: Any) -> Tokens | None:
    """The tokens one reply (or a list of stream chunks) reports; None if it reports none."""
    if isinstance(obj, (list, tuple)):
        return usage_of_stream(obj)
    meta = _get(obj, "usage_metadata")  # LangChain AIMessage / AIMessageChunk
    if isinstance(meta, Mapping) and ("input_tokens" in meta or "output_tokens" in meta):
        return Tokens(_int(meta.get("input_tokens")) or 0, _int(meta.get("output_tokens")) or 0, 1)
    kind = _get(obj, "type")
    if kind == "message_start":  # Anthropic stream event: the message so far
        return _from_usage(_get(_get(obj, "message"), "usage"))
    if isinstance(kind, str) and kind.startswith("response.") and _get(obj, "response"):
        return _from_usage(_get(_get(obj, "response"), "usage"))  # Responses stream event
    return _from_usage(_get(obj, "usage"))


def usage_of_stream(chunks: Iterable[Any]) -> Tokens | None:
    """The tokens a whole stream reports, by its API's rule (see the module docstring)."""
    added: Tokens | None = None  # LangChain chunks
    last: Tokens | None = None  # OpenAI-style: the last chunk with usage
    inp = out = None  # Anthropic running totals
    for chunk in chunks:
        meta = _get(chunk, "usage_metadata")
        if isinstance(meta, Mapping):
            one = usage_of(chunk)
            if one is not None:
                added = one if added is None else added + one
            continue
        kind = _get(chunk, "type")
        if kind in ("message_start", "message_delta"):
            usage = _get(_get(chunk, "message"), "usage") if kind == "message_start" else None
            usage = usage if usage is not None else _get(chunk, "usage")
            one = _from_usage(usage)
            if one is not None:
                if _int(_get(usage, "input_tokens")) is not None:
                    inp = one.input
                if _int(_get(usage, "output_tokens")) is not None:
                    out = one.output
            continue
        one = usage_of(chunk)
        if one is not None:
            last = one
    if inp is not None or out is not None:
        return Tokens(inp or 0, out or 0, 1)
    if added is not None:
        return Tokens(added.input, added.output, 1)
    return last


def model_of(obj: Any) -> str | None:
    """The model name a reply (or a list of stream chunks) names, if any."""
    if isinstance(obj, (list, tuple)):
        for chunk in obj:
            name = model_of(chunk)
            if name:
                return name
        return None
    for holder in (obj, _get(obj, "message"), _get(obj, "response")):
        name = _get(holder, "model")
        if isinstance(name, str) and name:
            return name
    meta = _get(obj, "response_metadata")  # LangChain
    if isinstance(meta, Mapping):
        name = meta.get("model_name") or meta.get("model")
        if isinstance(name, str) and name:
            return name
    return None


def reply_of_http_body(body: bytes, content_type: str = "") -> Any:
    """The reply a raw HTTP response body holds, for :func:`usage_of` / :meth:`Tally.add`.

    A JSON body gives its object; a server-sent-events body gives the list of
    its events' JSON objects (a stream, in the shape of its chunks); anything
    else gives None. For the bodies recorded by ``%%step --http``.
    """
    text = body.decode("utf-8", "replace")
    if "text/event-stream" in content_type or text.lstrip().startswith(("data:", "event:")):
        events = []
        for frame in text.split("\n\n"):
            data = "\n".join(
                line[5:].strip() for line in frame.splitlines() if line.startswith("data:")
            )
            if data and data != "[DONE]":
                try:
                    events.append(json.loads(data))
                except ValueError:
                    continue
        return events
    try:
        return json.loads(text)
    except ValueError:
        return None


def check_prices(prices: Any) -> dict[str, tuple[float, float]]:
    """``prices`` checked: ``{model: (input per 1k, output per 1k)}``, else a ValueError."""
    if not isinstance(prices, Mapping):
        raise ValueError(
            "prices must be a dict {'model-name': (input_per_1k, output_per_1k)} "
            f"(got a {type(prices).__name__})"
        )
    out: dict[str, tuple[float, float]] = {}
    for model, pair in prices.items():
        ok = (
            isinstance(model, str)
            and model
            and isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(_int(p) is not None and p >= 0 for p in pair)
        )
        if not ok:
            raise ValueError(
                f"prices[{model!r}] must be (input_per_1k, output_per_1k), two numbers >= 0 "
                f"(got {pair!r})"
            )
        out[model] = (float(pair[0]), float(pair[1]))
    return out


def price_for(model: str | None, prices: Prices) -> tuple[float, float] | None:
    """The price given for ``model``: by exact name, else the longest name it starts with."""
    if not model:
        return None
    if model in prices:
        return prices[model]
    best = max((name for name in prices if model.startswith(name)), key=len, default=None)
    return prices[best] if best is not None else None


class Tally:
    """Tokens summed per model: one for a step, one for a run (``+`` merges)."""

    def __init__(self, by_model: Mapping[str | None, Tokens] | None = None) -> None:
        self.by_model: dict[str | None, Tokens] = dict(by_model or {})

    def add(self, reply: Any) -> Tokens | None:
        """Count what ``reply`` (a reply, or a stream's chunks) reports; return it."""
        tokens = usage_of(reply)
        if tokens is not None:
            self.add_tokens(tokens, model_of(reply))
        return tokens

    def add_tokens(self, tokens: Tokens, model: str | None = None) -> None:
        """Count ``tokens`` for ``model``."""
        self.by_model[model] = self.by_model.get(model, Tokens()) + tokens

    @property
    def total(self) -> Tokens:
        """All models together."""
        out = Tokens()
        for tokens in self.by_model.values():
            out = out + tokens
        return out

    def cost(self, prices: Prices) -> tuple[float, list[str]]:
        """The cost of the priced models, and the models (by name) that had no price."""
        money, unpriced = 0.0, []
        for model, tokens in self.by_model.items():
            price = price_for(model, prices)
            if price is None:
                if tokens.total:
                    unpriced.append(model or "(model not named)")
                continue
            money += tokens.input / 1000 * price[0] + tokens.output / 1000 * price[1]
        return money, sorted(unpriced)

    def __add__(self, other: Tally) -> Tally:
        out = Tally(self.by_model)
        for model, tokens in other.by_model.items():
            out.add_tokens(tokens, model)
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tally) and self.by_model == other.by_model

    def __repr__(self) -> str:
        return f"Tally({self.by_model!r})"

    def to_json(self) -> list[list[Any]]:
        """A JSON-able form, for a record's header: ``[[model, input, output, replies], ...]``."""
        return [
            [m, t.input, t.output, t.replies]
            for m, t in sorted(self.by_model.items(), key=lambda kv: kv[0] or "")
        ]

    @classmethod
    def from_json(cls, rows: Any) -> Tally:
        """The inverse of :meth:`to_json`; rows of a wrong shape are skipped, not trusted."""
        out = cls()
        for row in rows if isinstance(rows, list) else []:
            if (
                isinstance(row, list)
                and len(row) == 4
                and all(_int(v) is not None for v in row[1:])
            ):
                model = row[0] if isinstance(row[0], str) else None
                out.add_tokens(Tokens(int(row[1]), int(row[2]), int(row[3])), model)
        return out
