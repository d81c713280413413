"""Streamed model replies, recorded as the user reads them and replayed as streams.

Recording: :func:`record_stream` takes what a streaming SDK call returned
(OpenAI ``Stream``/``AsyncStream`` from ``create(stream=True)``, the
``chat.completions.stream(...)`` manager, Anthropic ``Stream``/``AsyncStream``
and the ``messages.stream(...)`` manager, sync and async) and hands back
**the same object**, tapped: the user iterates it, uses it as a context
manager and calls its helpers exactly as without nbdurable, and each raw
chunk is collected on its way through. When the raw stream is read to its
end, ``on_complete`` receives a :class:`StreamRecord` (the chunks, plus what
is needed to rebuild the stream); the caller writes it. A stream abandoned
half way (``break``, ``close()``, leaving the ``with`` block early), one that
fails, or one cut by a crash never reaches its end, so nothing is recorded
and the call runs again next time.

The tap sits on the SDK's raw stream, the one that turns server-sent events
into chunk objects: its ``_iterator`` (a generator both SDKs read in
``__iter__``/``__next__``, and that the managers' stream classes read
through ``_raw_stream``) is replaced by one that passes each chunk on and
keeps it. For a manager, which makes its raw stream only on ``__enter__``,
the request function it was given is wrapped so the stream it makes is
tapped. These are private names of the SDKs; :func:`record_stream` raises
:class:`TypeError` when they are missing, and the tests run against the real
SDKs, so a release that renames them is seen at once.

Replaying: :func:`replay_stream` rebuilds the SDK's own stream class around
an HTTP response whose body is the recorded chunks written back as
server-sent events (each chunk's JSON, with ``event:`` lines where the API
uses them, and OpenAI's closing ``data: [DONE]``). The SDK's own parser then
turns them into chunk objects of the same types, and every helper works as
on the first run, because it is the SDK's code doing it: iteration and async
iteration, ``with``/``async with``, ``text_stream``, ``get_final_message()``,
``get_final_completion()``, ``until_done()``, the event objects of the
managers, ``response.headers``. Rebuilding the stream class around stored
objects instead would mean reimplementing those helpers for every SDK
version, and being wrong silently where they differ.

Other streams (LangChain's ``.stream()`` generator, litellm's stream
wrapper, any iterator of picklable chunks) have no SDK class worth
rebuilding: :func:`record_iter` yields their chunks while keeping them and
hands them over once the iterator is exhausted, and :func:`replay_iter`
yields them again from a plain generator (the async forms are in
:mod:`nbdurable.clients.awaitables`).

The rebuilt stream needs a client (its SSE decoder and its response
processing); it is a client of the same SDK made for the purpose, with a
placeholder key and an address that nothing listens on: no request is made
on replay, and no credential is stored or needed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import faults
from .http_record import safe_url

#: The SDKs whose streams are understood (by top-level module name).
SDKS = ("openai", "anthropic")
#: Response headers never kept: credentials and cookies.
DROPPED_HEADERS = frozenset(
    {"authorization", "x-api-key", "api-key", "cookie", "set-cookie", "proxy-authorization"}
)


@dataclass
class StreamRecord:
    """What replay needs to rebuild a stream. Picklable (chunks are pydantic models)."""

    sdk: str  # "openai" or "anthropic"
    stream_class: type  # the raw stream class, e.g. openai.Stream
    cast_to: Any  # the chunk type the SDK parses each event into
    is_async: bool
    chunks: list[Any]
    url: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    http_module: str = "httpx"  # the HTTP library the SDK's response came from
    # For a manager (chat.completions.stream / messages.stream): its class and
    # the keyword arguments it was made with besides the request itself.
    manager_class: type | None = None
    manager_kwargs: dict[str, Any] = field(default_factory=dict)


def _sdk_of(obj: Any) -> str | None:
    sdk = type(obj).__module__.split(".")[0]
    return sdk if sdk in SDKS else None


def _names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def stream_kind(obj: Any) -> str | None:
    """``"stream"``, ``"async_stream"``, ``"manager"``, ``"async_manager"``, or None.

    None for anything that is not a stream of a known SDK (checked by the
    class names in its MRO and its top-level module, so no SDK is imported).
    """
    if _sdk_of(obj) is None:
        return None
    names = _names(obj)
    if "AsyncStream" in names:
        return "async_stream"
    if "Stream" in names:
        return "stream"
    managers = {n for n in names if n.endswith("StreamManager")}
    if any(n.startswith("Async") for n in managers):
        return "async_manager"
    return "manager" if managers else None


# -- recording -----------------------------------------------------------------


def _describe(raw: Any, is_async: bool) -> StreamRecord:
    response = getattr(raw, "response", None)
    request = getattr(response, "request", None)
    headers = getattr(response, "headers", {}) or {}
    return StreamRecord(
        sdk=_sdk_of(raw) or "?",
        stream_class=type(raw),
        cast_to=getattr(raw, "_cast_to", None),
        is_async=is_async,
        chunks=[],
        url=safe_url(str(getattr(request, "url", ""))),
        status=int(getattr(response, "status_code", 200) or 200),
        headers={k: v for k, v in headers.items() if k.lower() not in DROPPED_HEADERS},
        http_module=type(response).__module__.split(".")[0] if response is not None else "httpx",
    )


def _tap_sync(raw: Any, record: StreamRecord, on_complete: Callable[[StreamRecord], Any]) -> None:
    inner = raw._iterator

    def tapped() -> Iterator[Any]:
        for chunk in inner:
            record.chunks.append(chunk)
            yield chunk
            faults.point("stream-chunk")  # the reader has the chunk: a kill here is mid-stream
        on_complete(record)

    raw._iterator = tapped()


def _tap_async(raw: Any, record: StreamRecord, on_complete: Callable[[StreamRecord], Any]) -> None:
    inner = raw._iterator

    async def tapped() -> AsyncIterator[Any]:
        async for chunk in inner:
            record.chunks.append(chunk)
            yield chunk
            faults.point("stream-chunk")  # the reader has the chunk: a kill here is mid-stream
        on_complete(record)

    raw._iterator = tapped()


def _tap(raw: Any, on_complete: Callable[[StreamRecord], Any], manager: Any = None) -> Any:
    kind = stream_kind(raw)
    if kind not in ("stream", "async_stream") or "_iterator" not in dir(raw):
        raise TypeError(
            f"cannot record a {type(raw).__module__}.{type(raw).__qualname__}: this version of "
            "its SDK is not one nbdurable knows how to tap; consume the stream inside a "
            "function given to step() and return the final message instead"
        )
    record = _describe(raw, kind == "async_stream")
    if manager is not None:
        record.manager_class, record.manager_kwargs = type(manager), _manager_kwargs(manager)
    (_tap_async if record.is_async else _tap_sync)(raw, record, on_complete)
    return raw


def _private(obj: Any) -> dict[str, Any]:
    """A manager's name-mangled attributes, by their plain name (``api_request``, ...)."""
    out = {}
    for cls in type(obj).__mro__:
        prefix = f"_{cls.__name__}__"
        for key, value in vars(obj).items():
            if key.startswith(prefix):
                out[key[len(prefix) :]] = (key, value)
    return out


def _manager_kwargs(manager: Any) -> dict[str, Any]:
    return {
        name: value
        for name, (_, value) in _private(manager).items()
        if name not in ("api_request", "stream")
    }


def record_stream(
    obj: Any,
    on_complete: Callable[[StreamRecord], Any],
    within: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Any:
    """``obj`` (a stream or stream manager), tapped so that reading it to the end records it.

    Returns the very object given, so its type and helpers are the SDK's.
    ``on_complete`` gets the :class:`StreamRecord` once the raw stream is
    exhausted; an error it raises reaches the reader of the stream. A
    manager's request, made on ``__enter__``, is made inside ``within()`` (the
    sub-step's scope: it is the call's request, whenever the SDK sends it).
    """
    kind = stream_kind(obj)
    if kind in ("stream", "async_stream"):
        return _tap(obj, on_complete)
    if kind in ("manager", "async_manager"):
        found = _private(obj).get("api_request")
        if found is None:
            raise TypeError(
                f"cannot record a {type(obj).__qualname__}: its request is not where this "
                "version of nbdurable looks for it"
            )
        attr, api_request = found
        if kind == "manager":

            def tapped() -> Any:
                with within():
                    return _tap(api_request(), on_complete, obj)

            setattr(obj, attr, tapped)
        else:

            async def tapped_request() -> Any:
                with within():
                    return _tap(await api_request, on_complete, obj)

            setattr(obj, attr, tapped_request())
        return obj
    raise TypeError(
        f"not a stream nbdurable can record: {type(obj).__module__}.{type(obj).__qualname__}"
    )


def record_iter(source: Any, on_complete: Callable[[list[Any]], Any]) -> Iterator[Any]:
    """Yield ``source``'s chunks while keeping them; hand them over once it is exhausted.

    Abandoned half way (``break``, ``close()``, an error), it hands nothing over.
    """
    chunks: list[Any] = []
    for chunk in source:
        chunks.append(chunk)
        yield chunk
    on_complete(chunks)


def replay_iter(chunks: list[Any]) -> Iterator[Any]:
    """Yield the recorded ``chunks`` again."""
    yield from chunks


# -- replaying -----------------------------------------------------------------


def _chunk_json(chunk: Any) -> str:
    dump = getattr(chunk, "model_dump_json", None)
    if dump is not None:
        return dump(by_alias=True, exclude_unset=True)
    return json.dumps(chunk)


def sse_bytes(record: StreamRecord) -> bytes:
    """The recorded chunks written back as the server-sent events they came from."""
    frames = []
    for chunk in record.chunks:
        kind = getattr(chunk, "type", None)
        if kind is None and isinstance(chunk, dict):
            kind = chunk.get("type")
        head = f"event: {kind}\n" if isinstance(kind, str) else ""
        frames.append(f"{head}data: {_chunk_json(chunk)}\n\n")
    if record.sdk == "openai":
        frames.append("data: [DONE]\n\n")
    return "".join(frames).encode()


_clients: dict[tuple[str, bool], Any] = {}


def _offline_client(sdk: str, is_async: bool) -> Any:
    """A client of ``sdk`` that is never used to send anything (see the module docstring)."""
    key = (sdk, is_async)
    if key not in _clients:
        module = importlib.import_module(sdk)
        name = {"openai": "OpenAI", "anthropic": "Anthropic"}[sdk]
        cls = getattr(module, ("Async" if is_async else "") + name)
        # Port 9 ("discard") on the loopback: were a request ever made, it would
        # fail at once instead of reaching any service.
        _clients[key] = cls(
            api_key="nbdurable-replay", base_url="http://127.0.0.1:9", max_retries=0
        )
    return _clients[key]


def _raw_stream(record: StreamRecord) -> Any:
    http = importlib.import_module(record.http_module)
    request = http.Request("POST", record.url or "http://127.0.0.1:9/replayed")
    headers = {**record.headers, "content-type": "text/event-stream"}
    headers.pop("content-length", None)
    headers.pop("content-encoding", None)  # the body below is not compressed
    response = http.Response(
        record.status, headers=headers, content=sse_bytes(record), request=request
    )
    cast_to = record.cast_to if record.cast_to is not None else type(record.chunks[0])
    return record.stream_class(
        cast_to=cast_to, response=response, client=_offline_client(record.sdk, record.is_async)
    )


def replay_stream(record: StreamRecord) -> Any:
    """A stream of the SDK's own class that yields the recorded chunks again.

    For a recorded manager, a manager of the same class, whose ``with``
    block gives the SDK's stream object with all its helpers.
    """
    if record.manager_class is None:
        return _raw_stream(record)
    if record.is_async:

        async def api_request() -> Any:
            return _raw_stream(record)

        return record.manager_class(api_request(), **record.manager_kwargs)
    return record.manager_class(lambda: _raw_stream(record), **record.manager_kwargs)
