"""Recording and replaying HTTP at the transport, so SDK calls need no wrapper.

While an :class:`HTTPSession` is active (``with HTTPSession(...)``), every
request sent through httpx (sync and async default transports; the
``httpx2`` fork the model SDKs moved to is treated the same), or through
requests (``HTTPAdapter.send``), goes through the session:

- a request that matches a recorded exchange is answered from the record:
  the raw status, headers and body bytes, so a server-sent-events body goes
  through the SDK's own parser again and a direct
  ``client.chat.completions.create(...)`` costs nothing on replay;
- any other request is sent (``on_miss="live"``), and its response is handed
  to the caller, unchanged, while its body is kept; once the body has been
  read to its end (a streamed body included, as the caller reads it), an
  :class:`Exchange` goes to ``on_record`` (the caller writes it). A body
  abandoned half way is not recorded, so that request is sent again next
  time. With ``on_miss="raise"``, :class:`ReplayMiss` is raised instead.

The key of a request is ``(method, URL, fingerprint of the body)``; each
exchange also keeps its ordinal (the how-many-th request of the session it
was). Among recorded exchanges with the same key, the earliest unused one
answers: a loop that asks the same question twice gets the two answers in
their order, and requests started together (``asyncio.gather``) may arrive
in any order without being taken for different ones.

Credentials are never stored: request headers are not kept at all (they
are not part of the key either: SDKs put retry counts and timeouts there),
response headers lose ``set-cookie`` and every credential header and have
keys and secrets in the others masked, the
URL's credential-looking query values and well-known key formats are masked
(in the key too, which is computed the same way on both sides), and a
response body that shows a key or an environment secret has it masked to
its own length (:attr:`Exchange.redacted` says what, so the caller can warn).

The patch is on the classes, so it sees every client, including ones made
before the session began (a client made in an earlier cell). An httpx client
given a transport of another class (litellm's aiohttp transport, a mounted
or retrying transport) is covered too: its transport is wrapped as the
client picks it for a request. It is
installed when the first session starts and removed when the last one
ends. A session belongs to the process: sessions are not meant to run in
two threads at once (a step runs one at a time), and a request another
thread makes while one is active goes through it too.

Not intercepted: other HTTP libraries used directly (aiohttp's own
``ClientSession``, urllib3, ``http.client``). A
requests response asked for with ``stream=True`` is read whole before it is
handed on (its content is the same; it no longer arrives piece by piece).
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import importlib.abc
import io
import json
import re
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..redact import redact_keys, secrets_in_env

#: Response headers never stored.
DROPPED_HEADERS = frozenset(
    {
        "set-cookie",
        "set-cookie2",
        "cookie",
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
    }
)
_SECRET_PARAM = re.compile(r"key|token|secret|password|signature|sig$|auth", re.IGNORECASE)
HTTPX_MODULES = ("httpx", "httpx2")


class ReplayMiss(ConnectionError):
    """A request that the record does not hold, in a session that may not send any."""


@dataclass(frozen=True)
class Exchange:
    """One request and its response, as stored (never a credential)."""

    ordinal: int
    method: str
    url: str  # masked: see safe_url()
    body_fp: str
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    #: what was masked in the body (key kinds, ``$NAME`` of environment secrets)
    redacted: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        """What a request must match to be answered by this exchange."""
        return (self.method, self.url, self.body_fp)


def body_fingerprint(body: bytes | str | None) -> str:
    """SHA-256 of a request body (hex, 32 characters); the empty body has one too."""
    raw = body.encode() if isinstance(body, str) else (body or b"")
    return hashlib.sha256(raw).hexdigest()[:32]


def safe_url(url: str) -> str:
    """``url`` with credential-looking query values and well-known keys masked."""
    # Masked before the query is encoded again, which would hide a credential in a
    # value from the patterns (``?next=https://me:pw@host`` becomes ``https%3A...``).
    parts = urlsplit(redact_keys(str(url))[0])
    if parts.query:
        query = [
            (k, "[redacted]" if _SECRET_PARAM.search(k) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
        parts = parts._replace(query=urlencode(query))
    if parts.username or parts.password:
        parts = parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
    return redact_keys(urlunsplit(parts))[0]


def _safe_headers(
    items: Iterable[tuple[Any, Any]],
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The response headers to keep, keys and secrets in their values masked (a server
    echoing the request's ``Authorization`` in ``X-Echo-Auth``), and what was masked.
    """
    out, found = [], []
    for k, v in items:
        k = k.decode("latin-1") if isinstance(k, bytes) else str(k)
        v = v.decode("latin-1") if isinstance(v, bytes) else str(v)
        if k.lower() in DROPPED_HEADERS:
            continue
        masked, kinds = _mask(v.encode("latin-1", "replace"))
        found += kinds
        out.append((k, masked.decode("latin-1") if kinds else v))
    return tuple(out), tuple(found)


def _mask(body: bytes) -> tuple[bytes, tuple[str, ...]]:
    """``body`` with keys and environment secrets masked to their own length.

    Same length, so a Content-Length and the framing of an event stream stay
    valid; what was masked is named in :attr:`Exchange.redacted`, for the
    caller's warning. (A compressed body is masked only where a key shows.)
    """
    body, kinds = redact_keys(body, keep_length=True)
    found = list(kinds)
    for name, value in secrets_in_env().items():
        if value in body:
            body = body.replace(value, b"*" * len(value))
            found.append("$" + name)
    return body, tuple(found)


#: The ordinal of a request the session lets through (see HTTPSession.passes).
_PASSED = 0


class HTTPSession:
    """Answer requests from ``recorded``; send (and record) or refuse the others."""

    def __init__(
        self,
        recorded: Iterable[Exchange] = (),
        *,
        on_record: Callable[[Exchange], Any] | None = None,
        on_miss: Literal["live", "raise"] = "live",
        passes: Callable[[], bool] | None = None,
        refusal: Callable[[str], Exception] | None = None,
    ) -> None:
        if on_miss not in ("live", "raise"):
            raise ValueError(f"on_miss must be 'live' or 'raise' (got {on_miss!r})")
        self.on_record = on_record
        self.on_miss = on_miss
        #: with ``on_miss="raise"``: the error for a request not recorded (given what
        #: it was), instead of :class:`ReplayMiss`
        self.refusal = refusal
        #: asked as a request starts: True lets it through untouched (neither answered
        #: from the record nor recorded; a sub-step's own call records its result)
        self.passes = passes
        self._unused: dict[tuple[str, str, str], list[Exchange]] = {}
        for ex in sorted(recorded, key=lambda e: e.ordinal):
            self._unused.setdefault(ex.key, []).append(ex)
        self._lock = threading.Lock()
        self._ordinal = 0
        self.served = 0  # requests answered from the record
        #: the recorded exchanges that answered a request, as recorded
        self.served_records: list[Exchange] = []
        self.sent = 0  # requests that went out
        #: every exchange this session used, served or newly recorded, numbered
        #: by this session's ordinals: what a step writes as its new record
        self.exchanges: list[Exchange] = []

    # -- the decision, shared by every library ----------------------------------
    def _begin(self, method: str, url: str, body: bytes) -> tuple[int, tuple[str, str, str]]:
        key = (method.upper(), safe_url(url), body_fingerprint(body))
        if self.passes is not None and self.passes():
            return _PASSED, key
        with self._lock:
            self._ordinal += 1
            return self._ordinal, key

    def _lookup(self, ordinal: int, key: tuple[str, str, str]) -> Exchange | None:
        if ordinal == _PASSED:
            return None
        with self._lock:
            queue = self._unused.get(key)
            if queue:
                self.served += 1
                ex = queue.pop(0)
                self.served_records.append(ex)
                self.exchanges.append(replace(ex, ordinal=ordinal))
                return ex
            if self.on_miss == "raise":
                method, url, fp = key
                if self.refusal is not None:
                    raise self.refusal(f"{method} {url} (body {fp[:12]}) was not recorded")
                raise ReplayMiss(
                    f"{method} {url} (body {fp}) was not recorded, and this replay may not "
                    "send requests; run the step again to record it"
                )
            self.sent += 1
            return None

    def _finish(
        self, ordinal: int, key: tuple[str, str, str], status: int, headers: Any, body: bytes
    ) -> None:
        if ordinal == _PASSED:
            return
        method, url, fp = key
        body, found = _mask(body)
        kept, in_headers = _safe_headers(headers)
        found = tuple(dict.fromkeys(found + in_headers))  # each named once
        ex = Exchange(ordinal, method, url, fp, status, kept, body, found)
        with self._lock:
            self.exchanges.append(ex)
            self.exchanges.sort(key=lambda e: e.ordinal)
        if self.on_record is not None:
            self.on_record(ex)

    # -- activation --------------------------------------------------------------
    def __enter__(self) -> HTTPSession:
        with _patch_lock:
            if not _active:
                _install()
            _active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _patch_lock:
            _active.remove(self)
            if not _active:
                _uninstall()


_active: list[HTTPSession] = []
_patch_lock = threading.Lock()
_originals: list[tuple[type, str, Any]] = []


def _current() -> HTTPSession | None:
    return _active[-1] if _active else None


# -- httpx (and httpx2) ------------------------------------------------------------

# Events after which a server-sent-events body is over, whatever the
# connection does next: OpenAI's `data: [DONE]`, Anthropic's message_stop,
# the Responses API's last events.
_SSE_LAST = {"[DONE]", "message_stop", "response.completed", "response.incomplete"}


def _complete(headers: Any, body: bytes) -> bool:
    """Whether a body the reader stopped reading is nonetheless whole."""
    length = headers.get("content-length")
    if length is not None:
        return length.isdigit() and int(length) == len(body)
    if "text/event-stream" not in headers.get("content-type", ""):
        return False
    last = body.rstrip().rsplit(b"\n\n", 1)[-1].decode("utf-8", "replace")
    for line in last.splitlines():
        name, _, value = line.partition(":")
        value = value.strip()
        if name == "event" and value in _SSE_LAST:
            return True
        if name == "data" and (value in _SSE_LAST or _type_of(value) in _SSE_LAST):
            return True
    return False


def _type_of(data: str) -> str:
    try:
        obj = json.loads(data)
    except ValueError:
        return ""
    return obj.get("type", "") if isinstance(obj, dict) else ""


class _Body:
    """A response body being read through: kept, and recorded once it is whole.

    Whole means read to its end, or closed after its last byte: the OpenAI
    SDK stops reading an event stream at ``data: [DONE]`` and closes it
    without waiting for the end of the connection. A body closed earlier
    than that was abandoned, and is not recorded.
    """

    def __init__(self, session: HTTPSession, ordinal: int, key: Any, response: Any) -> None:
        self.session, self.ordinal, self.key, self.response = session, ordinal, key, response
        self.parts: list[bytes] = []
        self.done = False

    def finish(self) -> None:
        if not self.done:
            self.done = True
            r = self.response
            self.session._finish(
                self.ordinal, self.key, r.status_code, r.headers.raw, b"".join(self.parts)
            )

    def closing(self) -> None:
        if not self.done and _complete(self.response.headers, b"".join(self.parts)):
            self.finish()


#: Set while a request goes out through its transport: a wrapped transport whose own
#: method calls the patched one (a subclass calling ``super()``) records it once.
_sending: contextvars.ContextVar[bool] = contextvars.ContextVar("nbdurable_sending", default=False)


def _httpx_patches(mod: Any) -> list[tuple[type, str, Any]]:
    sync_cls, async_cls = mod.HTTPTransport, mod.AsyncHTTPTransport
    orig_sync, orig_async = sync_cls.handle_request, async_cls.handle_async_request

    def replayed(ex: Exchange, request: Any) -> Any:
        return mod.Response(
            ex.status, headers=list(ex.headers), stream=mod.ByteStream(ex.body), request=request
        )

    def through(send: Callable[[Any], Any], request: Any) -> Any:
        session = _current()
        if session is None or _sending.get():
            return send(request)
        ordinal, key = session._begin(request.method, str(request.url), request.read())
        ex = session._lookup(ordinal, key)
        if ex is not None:
            return replayed(ex, request)
        token = _sending.set(True)
        try:
            response = send(request)
        finally:
            _sending.reset(token)
        inner, body = response.stream, _Body(session, ordinal, key, response)

        class Tee(mod.SyncByteStream):
            def __iter__(self) -> Any:
                for chunk in inner:
                    body.parts.append(chunk)
                    yield chunk
                body.finish()

            def close(self) -> None:
                body.closing()
                inner.close()

        response.stream = Tee()
        return response

    async def athrough(send: Callable[[Any], Any], request: Any) -> Any:
        session = _current()
        if session is None or _sending.get():
            return await send(request)
        ordinal, key = session._begin(request.method, str(request.url), await request.aread())
        ex = session._lookup(ordinal, key)
        if ex is not None:
            return replayed(ex, request)
        token = _sending.set(True)
        try:
            response = await send(request)
        finally:
            _sending.reset(token)
        inner, body = response.stream, _Body(session, ordinal, key, response)

        class ATee(mod.AsyncByteStream):
            async def __aiter__(self) -> Any:
                async for chunk in inner:
                    body.parts.append(chunk)
                    yield chunk
                body.finish()

            async def aclose(self) -> None:
                body.closing()
                await inner.aclose()

        response.stream = ATee()
        return response

    def handle_request(self: Any, request: Any) -> Any:
        return through(lambda r: orig_sync(self, r), request)

    async def handle_async_request(self: Any, request: Any) -> Any:
        return await athrough(lambda r: orig_async(self, r), request)

    # A client given a transport of another class (litellm's aiohttp transport, a
    # library's retrying or mounted transport) sends through that class's own method,
    # which the patch above never sees: such a transport is wrapped as the client
    # picks it for a request, for as long as a session is active.
    class Wrapped(mod.BaseTransport):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def handle_request(self, request: Any) -> Any:
            return through(self.inner.handle_request, request)

        def close(self) -> None:
            self.inner.close()

    class AWrapped(mod.AsyncBaseTransport):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def handle_async_request(self, request: Any) -> Any:
            return await athrough(self.inner.handle_async_request, request)

        async def aclose(self) -> None:
            await self.inner.aclose()

    client_cls, aclient_cls = mod.Client, mod.AsyncClient
    orig_pick, orig_apick = client_cls._transport_for_url, aclient_cls._transport_for_url

    def transport_for_url(self: Any, url: Any) -> Any:
        transport = orig_pick(self, url)
        if _current() is None or type(transport).handle_request is handle_request:
            return transport
        return Wrapped(transport)

    def atransport_for_url(self: Any, url: Any) -> Any:
        transport = orig_apick(self, url)
        if _current() is None or type(transport).handle_async_request is handle_async_request:
            return transport
        return AWrapped(transport)

    return [
        (sync_cls, "handle_request", handle_request),
        (async_cls, "handle_async_request", handle_async_request),
        (client_cls, "_transport_for_url", transport_for_url),
        (aclient_cls, "_transport_for_url", atransport_for_url),
    ]


# -- requests ------------------------------------------------------------------------


def _requests_patches(adapters: Any) -> list[tuple[type, str, Any]]:
    from urllib3.response import HTTPResponse

    orig_send = adapters.HTTPAdapter.send

    def from_bytes(adapter: Any, request: Any, status: int, headers: Any, body: bytes) -> Any:
        # transfer-encoding would make urllib3 parse chunk framing the body no longer has
        kept = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
        raw = HTTPResponse(
            body=io.BytesIO(body),
            headers=kept,
            status=status,
            preload_content=False,
            decode_content=True,
        )
        return adapter.build_response(request, raw)

    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        session = _current()
        if session is None:
            return orig_send(self, request, *args, **kwargs)
        body = request.body
        if body is not None and not isinstance(body, (bytes, str)):
            body = b"".join(body if not hasattr(body, "read") else [body.read()])
            request.body = body
        ordinal, key = session._begin(request.method, request.url, body or b"")
        ex = session._lookup(ordinal, key)
        if ex is not None:
            return from_bytes(self, request, ex.status, ex.headers, ex.body)
        response = orig_send(self, request, *args, **kwargs)
        # (the adapter never reads the body itself, whatever `stream` says)
        # the raw bytes, before content decoding, so that replay decodes them again
        raw_body = response.raw.read(decode_content=False) if response.raw else b""
        headers = list(response.raw.headers.items()) if response.raw else []
        response.close()
        session._finish(ordinal, key, response.status_code, headers, raw_body)
        return from_bytes(self, request, response.status_code, headers, raw_body)

    return [(adapters.HTTPAdapter, "send", send)]


def _install() -> None:
    """Patch the HTTP libraries that are imported; those that are not, when they are.

    Nothing is imported here: a plain run of the notebook imports neither
    httpx nor requests unless its code does, and importing one changes the
    process (requests' urllib3 adds warning filters). A library the step
    imports later is patched as its import finishes (:class:`_PatchOnImport`).
    """
    for name in (*HTTPX_MODULES, "requests.adapters"):
        module = sys.modules.get(name)
        if module is not None:
            _patch(name, module)
        elif _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def _patch(name: str, module: Any) -> None:
    if any(done == name for done in _patched):
        return
    patches = _requests_patches(module) if name == "requests.adapters" else _httpx_patches(module)
    _patched.append(name)
    for cls, attr, fn in patches:
        _originals.append((cls, attr, cls.__dict__[attr]))
        setattr(cls, attr, fn)


_patched: list[str] = []


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches an HTTP library the moment it is first imported while a session is active."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in HTTPX_MODULES and fullname != "requests.adapters":
            return None
        for finder in sys.meta_path:  # the real spec, from the finders after this one
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str) -> None:
        self.loader, self.name = loader, name

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        with _patch_lock:
            if _active:
                _patch(self.name, module)


_FINDER = _PatchOnImport()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    _patched.clear()
    while _originals:
        cls, attr, fn = _originals.pop()
        setattr(cls, attr, fn)
