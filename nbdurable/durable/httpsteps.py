"""The HTTP a step's body makes, recorded and replayed without wrappers.

While the body of a step executes (every step by default; with
``configure(http=False)``, only those marked ``%%step NAME --http``), an
:class:`~nbdurable.clients.http_record.HTTPSession` is active: every request
sent through httpx (or its ``httpx2`` fork) or requests goes through it.

- Each exchange is written the moment its response has been read to its end
  (a streamed body as the SDK reads it), as a sub-step record of the step
  with the id ``http:N`` (N: a number not yet used by the step's exchanges).
  Its body is the :class:`~nbdurable.clients.http_record.Exchange`: method,
  URL, a fingerprint of the request body, and the raw response (status,
  headers, bytes). Request headers are never kept, nor credentials in
  response headers, URLs or bodies (see :mod:`nbdurable.clients.http_record`).
- A request made inside a sub-step (``step()``, ``@recorded``) is not kept
  as an exchange: the sub-step records its result and replays it whole.
- When the body runs again (the kernel died half way, or the step keeps a
  value that cannot be saved), every exchange recorded for the step is
  loaded first, and a request with the same method, URL and body fingerprint
  is answered from the earliest unused one of them: the raw bytes go through
  the SDK's own parser again, so a direct ``client.chat.completions.create(...)``,
  streamed or not, costs nothing and returns what it returned. Other
  requests are sent and recorded.
- The tokens a recorded reply reports count for the step (and, replayed,
  as tokens saved), as a sub-step's do.

A step replayed whole (its record is valid) runs no body and needs none of
this. Only the body of a ``%%step`` cell run by IPython is covered;
``run_cell_magic("step", "... --http", body)`` from code is refused.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import config, faults, redact
from ..clients import usage
from ..clients.http_record import Exchange, HTTPSession
from ..errors import StoreError
from ..identity import keys
from ..store import values
from ..store.records import SubRecord
from .context import StepContext, current_sub, warn

if TYPE_CHECKING:
    from .session import Session

PREFIX = keys.HTTP_PREFIX


def wanted(asked: bool) -> bool:
    """Whether a step's HTTP is recorded: its ``--http`` (``asked``), or the ``http`` setting
    (True by default).
    """
    return asked or config.get().http


class StepHTTP:
    """The HTTP session of one executing step: start it before the body, stop it after."""

    def __init__(self, session: Session, ctx: StepContext) -> None:
        self.session, self.ctx = session, ctx
        self.prefix = session.keys.sub(ctx.key, PREFIX)
        self.used: set[int] = set()
        self.http: HTTPSession | None = None

    def start(self) -> None:
        """Load the step's recorded exchanges and begin answering from them."""
        recorded = []
        store = self.session.store
        for key in store.scan(self.prefix):
            n = key[len(self.prefix) :]
            if n.isdigit():
                self.used.add(int(n))
            try:
                got = store.get(key)
                if got is not None:
                    ex = values.loads(got[1], {})
                    if isinstance(ex, Exchange):
                        recorded.append(ex)
            except Exception as exc:  # damaged, or unpicklable here: that request is sent again
                warn(f"step {self.ctx.label!r}: recorded HTTP exchange {n} cannot be used ({exc})")
        # A request a sub-step's call makes passes: the call records its result.
        verify = self.session.verifying
        self.http = HTTPSession(
            recorded,
            on_record=self.save,
            passes=_in_a_sub_step,
            on_miss="raise" if verify else "live",
            refusal=self._refusal if verify else None,
        )
        self.http.__enter__()
        self.ctx.http = True

    def _refusal(self, what: str) -> Exception:
        # Said at once as well: an SDK wraps what its transport raises in its own error.
        error = self.session.refuse(f"step {self.ctx.label!r}: {what}")
        warn(str(error))
        return error

    def stop(self) -> None:
        """Stop answering; count what the record answered as saved by replay."""
        http, self.http = self.http, None
        if http is None:
            return
        http.__exit__(None, None, None)
        if not http.served_records:
            return
        tokens = usage.Tally()
        for ex in http.served_records:
            tokens.add(_reply(ex))
        self.session.count_replayed(0.0, calls=len(http.served_records), tokens=tokens)
        with self.ctx.lock:
            self.ctx.subs_replayed += len(http.served_records)
            self.ctx.tokens = self.ctx.tokens + tokens

    def save(self, ex: Exchange) -> None:
        """Write one exchange (called as its response body ends)."""
        ctx = self.ctx
        with ctx.lock:
            n = max(self.used, default=0) + 1
            self.used.add(n)
        if ex.redacted:  # kinds of keys ("openai"), and "$NAME" for environment secrets
            names = [r[1:] if r.startswith("$") else f"{r} key" for r in ex.redacted]
            warn(
                f"step {ctx.label!r}: an HTTP response held {redact.said(names)}; "
                "it was recorded with it masked."
            )
        tokens = usage.Tally()
        tokens.add(_reply(ex))
        body = values.dumps(ex)
        header = SubRecord(
            run=self.session.run_id,
            scope=ctx.key,
            id=f"{PREFIX}{n}",
            fn=f"{ex.method} {ex.url}",
            args_fp=ex.body_fp,
            started=time.time(),
            duration=0.0,
            size=len(body),
            type="Exchange",
            returns="http",
            tokens=tokens.to_json(),
        ).to_header()
        try:
            self.session.write(puts=[(self.prefix + str(n), header, body)])
        except StoreError as exc:
            warn(f"step {ctx.label!r}: an HTTP exchange was NOT recorded ({exc})")
            return
        faults.point("http-written")
        with ctx.lock:
            ctx.subs_recorded += 1
            ctx.tokens = ctx.tokens + tokens


def _in_a_sub_step() -> bool:
    return current_sub.get() is not None


def _reply(ex: Exchange) -> Any:
    headers = {k.lower(): v for k, v in ex.headers}
    return usage.reply_of_http_body(ex.body, headers.get("content-type", ""))
