"""Sub-steps: ``step()``, ``@recorded`` and ``idempotency_key()``.

A sub-step runs a function once per run and records its result the moment
it returns, each in its own transaction; on a rerun it returns the recorded
value instead. Results are recorded only on success.

A recorded value replays only if both the call's arguments and the function
it calls are unchanged: each record holds the arguments' fingerprint and the
callee's :func:`~nbdurable.identity.callables.callable_fingerprint` (its
code, defaults, closure values and the globals it reads, transitively; for
``@recorded``, of the undecorated function). A changed function means the
call is made again and recorded anew; inside a step, the calls made again
are said in one line when the step is recorded
(:func:`~nbdurable.durable.context.remade_summary`), not one warning per
call. A record written before callee fingerprints were recorded replays on
its arguments alone, and the step says so in one line. A part of the callee
that the call itself changes (a counter or cache in a global or closure it
fills) is state, not code: it is left out of the comparison, or a function
that counts its calls would never replay.

A call that changes its arguments in place (fills a list passed in) is
recorded with their new state, pickled with the result, and a replay puts
that state back into the objects passed (lists, dicts, sets, bytearrays,
NumPy arrays, objects with a ``__dict__``), so the caller sees what a real
call leaves. An argument changed in a way that cannot be put back is not
recorded at all (with a one-line note): the call is made again next time,
never half replayed.

Sync or async, and streams, are told by what the call *returns*, not by
what the function looks like (the model SDKs wrap their ``async def``
methods in synchronous decorators): a call that returned an awaitable is
recorded when it is awaited, and replay hands back an awaitable again
(:mod:`nbdurable.clients.awaitables`), so ``await step(...)``,
``asyncio.gather`` and ``TaskGroup`` work on every run. A call that returned
a stream is handed back as that stream, tapped, and recorded only once it
has been read to its end; replay hands back a stream that yields the
recorded chunks: the SDK's own stream class for OpenAI and Anthropic
streams and stream managers (:mod:`nbdurable.clients.streams`), a generator
for other iterators of chunks (a generator, LangChain's ``.stream()``,
litellm's stream wrapper), an async generator for async iterators. A stream
abandoned half way, or cut by a crash, is not recorded: the call is made
again next time. The record's ``returns`` field names the shape.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import config, events, faults, redact
from ..clients import awaitables, streams, usage
from ..errors import BadArgument, CorruptRecord, DivergenceError, StoreError, UsageProblem
from ..identity import keys
from ..identity.callables import callable_parts, first_change
from ..store import blobs, values
from ..store.layout import RUN_SCOPE
from . import recording
from .context import SubIndex, current_sub, warn
from .host import Capture
from .session import Session, get_session

T = TypeVar("T")
#: Hex digits of each callee part a record keeps (``callee_parts``). What decides a
#: replay is ``callee_fp``, a digest over the full parts; the parts only say which
#: one changed, for which a prefix suffices (a clash of two prefixes would name
#: another part, or none, in the message: never replay a changed callee).
PART_DIGITS = 8
_ENOVAL = object()  # "no record": a recorded value may well be None


def step(step_id: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` once per run; on a rerun return its recorded result.

    Inside a ``%%step`` cell the id is scoped to that step; outside one, to
    the run. For a coroutine function, ``await step(...)``. The arguments'
    fingerprint is recorded; calling the same id with other arguments is a
    divergence, handled as ``nbdurable.configure(on_divergence=...)`` says.
    """
    __tracebackhide__ = True
    sub_id = keys.validate_sub_id(step_id)
    if not callable(fn):
        raise BadArgument(
            f"step({sub_id!r}, fn, ...): fn must be callable, got {type(fn).__name__}; "
            "pass the function itself, not its result"
        )
    return _substep(get_session(), sub_id, fn, args, kwargs)


def recorded(fn: Callable[..., T] | None = None, /, *, approve: bool = False) -> Any:
    """Decorator: every call of ``fn`` becomes a sub-step.

    Inside a ``%%step`` the id is ``module.qualname#N``, N counting this
    function's calls within the step (so calls must happen in a stable
    order: use explicit ``step()`` ids for calls made from threads).
    Outside a step the id also carries the arguments' fingerprint, and N
    counts identical calls within the cell.

    ``@recorded(approve=True)``: a call with no record first asks a person
    (:func:`nbdurable.approve`, its id the sub-step's), with the call and its
    arguments as what is approved; approved, the call is made and recorded;
    rejected, :class:`~nbdurable.errors.Rejected` is raised and nothing is
    called. A recorded call replays without asking; a call with other
    arguments asks again.
    """
    if fn is None:
        return lambda f: recorded(f, approve=approve)
    qual = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        session = get_session()
        sub_id = _ordinal_id(session, qual, args, kwargs)
        return _substep(session, sub_id, fn, args, kwargs, approve=approve)

    wrapper.__nbdurable_recorded__ = True  # type: ignore[attr-defined]
    return wrapper


def idempotency_key(name: str = "") -> str:
    """A key for a provider that deduplicates, the same on every attempt of this step version.

    Pass it to providers that deduplicate (email, payments, queues), so a
    call repeated after a crash between the effect and its record is
    dropped by the provider. It is derived from the run id, the step's key
    and version (its source and inputs' fingerprints), the sub-step id and
    ``name``: stable across replays and retries of the same step version,
    new when the step is invalidated (its code or an input changed), so the
    new version's effect is not dropped as a duplicate of the old one.
    ``name`` tells apart several effects in one step.
    """
    if not isinstance(name, str):
        raise BadArgument(f"idempotency_key(name): name must be str, got {type(name).__name__}")
    session = get_session()
    ctx = session.current
    scope = ctx.key if ctx is not None else RUN_SCOPE
    if ctx is not None and ctx.version:
        scope += "@" + ctx.version
    sub = current_sub.get() or ""
    raw = "\0".join((session.run_id, scope, sub, name)).encode("utf-8")
    return "nbd-" + hashlib.sha256(raw).hexdigest()[:32]


def _ordinal_id(session: Session, qual: str, args: tuple, kwargs: dict) -> str:
    ctx = session.current
    if ctx is not None:
        with ctx.lock:
            n = ctx.ordinals.get(qual, 0)
            ctx.ordinals[qual] = n + 1
        return f"{qual}#{n}"
    base = f"{qual}#{keys.args_fingerprint(args, kwargs)[:12]}"
    return f"{base}#{session.next_ordinal(base)}"


def _substep(
    session: Session,
    sub_id: str,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    approve: bool = False,
) -> Any:
    __tracebackhide__ = True
    call = _Call(session, sub_id, fn)
    call.approve = approve
    call.take_id()
    try:
        return call.run(args, kwargs)
    except BaseException:
        call.forget()  # nothing was recorded: a retry may use the same id
        raise


class _Call:
    """One sub-step call: what its lookup, its execution and its record share.

    Sync and async calls take the same path: :meth:`run` looks the id up and
    calls ``fn``; a plain result is recorded by :meth:`save` at once, a
    coroutine's when it is awaited (:meth:`finish`), by the same :meth:`save`.
    """

    __slots__ = (
        "approve",
        "args",
        "args_fp",
        "before",
        "callee",
        "ctx",
        "fn",
        "miss",
        "printed",
        "returns",
        "scope",
        "session",
        "started",
        "store_key",
        "sub_id",
        "t0",
        "where",
    )

    def __init__(self, session: Session, sub_id: str, fn: Callable[..., Any]) -> None:
        ctx = session.current
        self.session, self.ctx, self.sub_id, self.fn = session, ctx, sub_id, fn
        self.scope = ctx.key if ctx is not None else RUN_SCOPE
        self.where = f"sub-step {sub_id!r}" + (f" of step {ctx.label!r}" if ctx else "")
        self.returns = ""
        self.printed: list[dict[str, Any]] = []  # the call's outputs (see _capture)
        self.approve = False  # a person approves the call before it is made

    def take_id(self) -> None:
        """Claim the id within the running step: each call of a step needs its own."""
        ctx = self.ctx
        if ctx is not None:
            with ctx.lock:
                if self.sub_id in ctx.seen:
                    raise UsageProblem(
                        f"{self.where} was already used in this step; give each call its own "
                        f"id, e.g. step(f'search:{{i}}', ...)"
                    )
                ctx.seen.add(self.sub_id)

    @contextlib.contextmanager
    def within(self) -> Iterator[None]:
        """The call's scope, for what its result does later (a stream manager's request)."""
        token = current_sub.set(self.sub_id)
        try:
            yield
        finally:
            current_sub.reset(token)

    def _capture(self) -> Capture | None:
        """Where what this call prints is recorded: its step's capture, or its plain cell's.

        Only on the thread the step's body (or the cell) runs in: a call in a
        worker thread prints among the other threads' output, its span of the
        cell's outputs cannot be told apart, so none is kept.
        """
        ctx = self.ctx
        if ctx is None:
            return self.session.cell_capture()
        if getattr(ctx.capture, "mark", None) is not None and ctx.thread == threading.get_ident():
            return ctx.capture
        return None

    def forget(self) -> None:
        """Give the id back (the call raised: nothing was recorded)."""
        ctx = self.ctx
        if ctx is not None:
            with ctx.lock:
                ctx.seen.discard(self.sub_id)

    def run(self, args: tuple, kwargs: dict) -> Any:
        """The recorded value, or ``fn``'s result (recorded; for a coroutine, once awaited)."""
        __tracebackhide__ = True
        session, ctx = self.session, self.ctx
        self.store_key = session.keys.sub(self.scope, self.sub_id)
        self.args_fp = keys.args_fingerprint(args, kwargs)
        self.callee = _callee_parts(self.fn, self.where)
        self.args = _labelled(args, kwargs)
        self.miss = "has no record"  # why lookup() found nothing usable (for verify mode)
        live = config.is_live(self.sub_id)  # runs live although recorded (`--live`)
        value = _ENOVAL if live else self.lookup()
        if value is _ENOVAL and session.verifying and not live:
            raise session.refuse(f"{self.where} {self.miss}")
        if value is not _ENOVAL:
            if ctx is not None:
                with ctx.lock:
                    ctx.subs_replayed += 1
            events.emit("sub-replayed", session.run_id, self.scope, id=self.sub_id)
            if self.printed and self._capture() is not None:
                session.host.show(self.printed)  # what the call printed, as a plain run shows
            return _replayed(value, self.returns, self.fn)
        if ctx is None:
            session.claim(verify=False)  # inside a step, the step already holds the lease
        if self.approve:
            self.approved(args, kwargs)
        token = current_sub.set(self.sub_id)
        # Arguments a call could change in place, fingerprinted before it (see save)
        self.before = {k: _arg_fp(v) for k, v in self.args.items() if not _immutable(v)}
        self.started, self.t0 = time.time(), time.perf_counter()
        capture = self._capture()
        mark = capture.mark() if capture is not None else None
        try:
            result = self.fn(*args, **kwargs)
        finally:
            current_sub.reset(token)
        if capture is not None:  # what the call printed, kept with its record
            self.printed = capture.since(mark)
        kind = awaitables.result_kind(result)
        if kind == "awaitable":  # a coroutine's body runs when it is awaited
            return self.finish(result)
        if kind == "both" and streams.stream_kind(result) is None:
            # A paginator: ``await page`` and ``async for x in page`` both work, and
            # which one the caller will do cannot be known here.
            warn(
                f"{self.where} returned a {values.type_name(result)}, which can be awaited "
                "and iterated alike; it was NOT recorded and will be called again on the next "
                "run. Await or iterate it inside the function given to step()."
            )
            return result
        return self.hand_over(result, "")

    async def finish(self, awaitable: Any) -> Any:
        """Await a coroutine's body, then record its result as :meth:`run` does a plain one."""
        token = current_sub.set(self.sub_id)  # the body runs now: idempotency_key() sees its id
        try:
            result = await awaitable
            result = self.hand_over(result, "awaitable")
        except BaseException:
            self.forget()
            raise
        finally:
            current_sub.reset(token)
        return result

    def approved(self, args: tuple, kwargs: dict) -> None:
        """Ask a person to approve this call (``@recorded(approve=True)``); raise if rejected.

        What is approved is the call: the function and each argument, by
        fingerprint, so a call with another argument is asked again.
        """
        __tracebackhide__ = True
        from . import approval

        name = _fn_name(self.fn).strip("'")
        shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        summary = f"call {name}({', '.join(shown)})"
        details = "\n".join(f"{k}: {v!r}" for k, v in self.args.items())
        # The arguments only: a callee's own state (a list of what it sent) changes with
        # every call, and would make every decision stale.
        parts = {k: _arg_fp(v) or "?" for k, v in self.args.items()}
        decision = approval.ask(self.session, self.sub_id, summary, details, parts)
        if not decision.approved:
            raise approval.rejected(self.sub_id, decision)

    def hand_over(self, result: Any, outer: str) -> Any:
        """``result`` recorded now, or a stream of it that records itself once read to its end."""
        prefix = outer + ":" if outer else ""

        def save_as(shape: str) -> Callable[[Any], None]:
            return lambda value: self.save(value, prefix + shape)

        if streams.stream_kind(result) is not None:
            return streams.record_stream(result, save_as("stream"), self.within)
        kind = awaitables.result_kind(result)
        # litellm's stream wrapper iterates both ways: awaited, it is read with
        # `async for`; returned at once, with `for`.
        if kind == "async_iter" and (outer or not _chunk_iterator(result)):
            return awaitables.record_async_iter(result, save_as("async_iter"))
        if _chunk_iterator(result):
            return streams.record_iter(result, save_as("iter"))
        self.save(result, outer)
        return result

    def index(self) -> SubIndex | None:
        """The scope's :class:`SubIndex`: the current step's, or the cell's for the run scope."""
        session, scope = self.session, self.scope
        ctx = session.current
        if ctx is not None and ctx.key == scope:
            return ctx.sub_index
        return session.run_index if scope == RUN_SCOPE else None

    def lookup(self) -> Any:
        """The recorded value of this call, or ``_ENOVAL`` (with a warning when unusable)."""
        session, where, store_key, args_fp = self.session, self.where, self.store_key, self.args_fp
        index = self.index()
        try:
            if index is None:
                got = session.store.get(store_key)
            else:
                store = session.store
                found, raw = index.find(store, session.keys.subs_prefix(self.scope), store_key)
                got = store.get_loaded(store_key, raw) if found else None
        except CorruptRecord as exc:
            self.miss = f"has a record that cannot be used ({exc})"
            warn(f"{where}: its record cannot be used ({exc}); calling again.")
            return _ENOVAL
        if got is None:
            return _ENOVAL
        header, body = got
        # Only a few fields matter here: no SubRecord is built on the replay path.
        recorded_fp, duration = header.get("args_fp"), header.get("duration")
        self.returns = header.get("returns", None)
        printed = header.get("printed")
        self.printed = printed if isinstance(printed, list) else []
        if not isinstance(recorded_fp, str) or not isinstance(duration, (int, float)):
            self.miss = "has a malformed record"
            warn(f"{where}: its record is malformed (no args_fp or duration); calling again.")
            return _ENOVAL
        if recorded_fp != args_fp:
            mode = config.get().on_divergence
            msg = (
                f"{where} was called with arguments other than those recorded "
                f"(recorded {recorded_fp[:12]}, now {args_fp[:12]}): the run has diverged"
            )
            if mode == "error":
                raise DivergenceError(
                    msg + "; clear the step, or configure(on_divergence='rerun'|'replay')"
                )
            if mode != "replay":
                self.miss = "was called with arguments other than those recorded"
                self.remade("its arguments changed: the run diverged", msg, loud=mode == "warn")
                return _ENOVAL
        # An edited function is not a divergence of the run but a new call: it is
        # always made again, whatever on_divergence says.
        recorded_callee = header.get("callee_fp")
        volatile = header.get("callee_volatile") or ()
        if not recorded_callee:  # a record from before callee fingerprints
            self.unchecked()
        elif recorded_callee != _parts_digest(self.callee, volatile):
            old = header.get("callee_parts")
            old = {
                k: v for k, v in (old if isinstance(old, dict) else {}).items() if k not in volatile
            }
            # A record keeps the first digits of each part (see PART_DIGITS): compare as many
            now = {
                k: v[: len(old[k])] if isinstance(old.get(k), str) else v
                for k, v in self.callee.items()
                if k not in volatile
            }
            what = first_change(old, now)
            why = f"its function {_fn_name(self.fn)} changed ({what or 'code'})"
            self.miss = f"would call again: {why}"
            self.remade(why, f"{where}: {why}", loud=True)
            return _ENOVAL
        try:
            buffers = _result_buffers(session.store, header.get("buffers"))
            if buffers is None:
                self.miss = "has a recorded value whose blob is missing"
                warn(f"{where}: its recorded value's blob is missing; calling again.")
                return _ENOVAL
            value = values.loads(body, session.user_ns, buffers)
            mutated = header.get("mutated")
            if mutated:  # (result, {argument: its state after the call})
                value = self.put_back(value, mutated)
        except Exception as exc:
            self.miss = f"has a recorded value that cannot be loaded ({exc!r})"
            warn(f"{where}: its recorded value cannot be loaded ({exc!r}); calling again.")
            return _ENOVAL
        tokens = usage.Tally.from_json(header.get("tokens"))
        session.count_replayed(duration, tokens=tokens)
        self.count_tokens(tokens)
        return value

    def count_tokens(self, tokens: usage.Tally) -> None:
        """Add a reply's tokens to its step's (made or replayed, a step's record holds all)."""
        ctx = self.ctx
        if ctx is not None and tokens:
            with ctx.lock:
                ctx.tokens = ctx.tokens + tokens

    def put_back(self, loaded: Any, labels: list[str]) -> Any:
        """Restore the recorded state of the arguments the call changed; its result.

        Every target is checked before any is changed: all are restored, or
        none (the call is then made again).
        """
        result, states = loaded
        if sorted(states) != sorted(labels):
            raise ValueError("the record's argument states do not match its header")
        targets = {k: self.args.get(k, _ENOVAL) for k in labels}
        for k, target in targets.items():
            if target is _ENOVAL or not _restorable(target, states[k]):
                raise ValueError(f"argument {k} cannot take back the state the call left")
        for k, target in targets.items():
            _restore(target, states[k])
            if result is states[k]:  # the call returned the argument it filled
                result = target
        return result

    def remade(self, why: str, message: str, *, loud: bool) -> None:
        """Note a recorded call that is made again: counted in its step, else warned now.

        ``loud=False`` (``on_divergence='rerun'``) says nothing at all.
        """
        ctx = self.ctx
        if not loud:
            return
        if ctx is None:
            warn(message + "; calling again and recording the new result.")
            return
        with ctx.lock:
            ctx.subs_remade += 1
            if not ctx.first_remade:
                ctx.first_remade = f"sub-step {self.sub_id!r}: {why}"

    def unchecked(self) -> None:
        """Note a replay from a record that holds no callee fingerprint."""
        ctx = self.ctx
        if ctx is None:
            warn(
                f"{self.where} replays a record made before nbdurable recorded the function a "
                "call makes: only its arguments were compared. Clear it to make the call again."
            )
            return
        with ctx.lock:
            ctx.subs_unchecked += 1

    def save(self, result: Any, returns: str = "") -> None:
        """Record ``result`` (one transaction); say so loudly if it cannot be.

        ``returns`` is the shape the call handed it over in (see ``SubRecord.returns``).
        """
        where, fn = self.where, self.fn
        duration = time.perf_counter() - self.t0
        mutated = sorted(k for k, fp in self.before.items() if _arg_fp(self.args[k]) != fp)
        stuck = [k for k in mutated if not _restorable(self.args[k], self.args[k])]
        if stuck:
            warn(
                f"{where} changed its argument {', '.join(stuck)} "
                f"({values.type_name(self.args[stuck[0]])}) in place, which a replay cannot "
                "restore; it was NOT recorded and will be called again on the next run."
            )
            return
        saved = (result, {k: self.args[k] for k in mutated}) if mutated else result
        parts = self.callee
        after = _callee_parts(fn, where)  # what the call changed in its callee
        volatile = sorted(k for k, v in parts.items() if after.get(k) != v)
        refs: list[str] = []  # blobs holding the result's memory (see _put_result)
        try:
            if type(saved) in (bytes, bytearray) and len(saved) >= blobs.MAP_OVER:
                body, refs = _put_result(self.session.store, saved)
            else:
                body = values.dumps(saved)
        except blobs.SecretFound as exc:
            warn(
                f"{where} returned a value holding {redact.said(exc.names)}; secrets "
                "are never written to the store, so it was NOT recorded and will be called "
                "again on the next run."
            )
            return
        except values.Unsaveable as exc:
            warn(
                f"{where} returned a {values.type_name(result)}"
                f"{' and changed its arguments ' + ', '.join(mutated) if mutated else ''}, "
                f"which cannot be saved ({exc}); "
                "it was NOT recorded and will be called again on the next run. Return plain "
                "data (e.g. the text or a dict) from the function given to step()."
            )
            return
        tokens = usage.Tally()
        tokens.add(result.chunks if isinstance(result, streams.StreamRecord) else result)
        faults.point("sub-returned")
        # An environment secret is named by its variable, even when it is a key too.
        found = redact.find_secrets(body, redact.secrets_in_env()) or redact.key_names(body)
        if found:
            warn(
                f"{where} returned a value holding {redact.said(found)}; secrets "
                "are never written to the store, so it was NOT recorded and will be called "
                "again on the next run."
            )
            return
        size = len(body) + (len(saved) if refs else 0)
        if size > config.get().warn_size_mb * 1024 * 1024:
            warn(
                f"{where} returned {size / 1e6:.1f} MB (over warn_size_mb="
                f"{config.get().warn_size_mb:g}); it is recorded, but consider returning less."
            )
        # SubRecord's header, built directly (a frozen dataclass costs more than the write),
        # and compact: a field at its default (no mutated arguments, no volatile parts,
        # no tokens, the format of every sub-step record) is left out, as readers take
        # it; times are kept to the microsecond (duration) and millisecond (start).
        header = {
            "run": self.session.run_id,
            "scope": self.scope,
            "id": self.sub_id,
            "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}",
            "args_fp": self.args_fp,
            "callee_fp": _parts_digest(parts, volatile),
            "callee_parts": {k: v[:PART_DIGITS] for k, v in parts.items()},
            "started": round(self.started, 3),
            "duration": round(duration, 6),
            "size": size,
            "type": values.type_name(result),
            "returns": returns,
            "kind": "sub",
        }
        if volatile:
            header["callee_volatile"] = volatile
        if mutated:
            header["mutated"] = mutated
        json_tokens = tokens.to_json()
        if json_tokens:
            header["tokens"] = json_tokens
        if refs:
            header["buffers"] = refs
        if self.printed:
            printed, leaked = recording.scrub_outputs(self.printed, redact.secrets_in_env())
            if not leaked:  # shown masked, a replay would differ: such prints are not kept
                header["printed"] = printed
        try:
            self.session.write(puts=[(self.store_key, header, body)])
        except StoreError as exc:
            raise StoreError(f"{where} returned but its result was NOT recorded: {exc}") from exc
        faults.point("sub-written")
        index = self.index()
        if index is not None:
            index.recorded(self.store_key)
        ctx = self.session.current
        if ctx is not None:
            with ctx.lock:
                ctx.subs_recorded += 1
                ctx.sub_seconds += duration
        self.count_tokens(tokens)
        events.emit(
            "sub-recorded", self.session.run_id, self.scope, id=self.sub_id, duration=duration
        )


def _put_result(store: Any, result: bytes | bytearray) -> tuple[bytes, list[str]]:
    """Store a large ``bytes`` result's memory as a blob of its own; ``(stream, [sha])``.

    The record keeps only the pickle stream. The blob is the one a step
    variable bound to the same value spills (see :mod:`nbdurable.store.spill`),
    so a result the step keeps is stored once, and it is written from where
    it lies, never copied into a pickle first. Raises
    :class:`blobs.SecretFound` (nothing written) if it holds a secret.
    """
    stream, buffers = values.dumps_parts(result)
    refs = [store.put_blob(b"", [buf], secrets=redact.secrets_in_env())[0] for buf in buffers]
    return stream, refs


def _result_buffers(store: Any, refs: Any) -> list[memoryview] | None:
    """The out-of-band buffers of a sub-step record (``[]`` for most); None if one is gone."""
    out: list[memoryview] = []
    for sha in refs if isinstance(refs, list) else ():
        blob = store.get_blob(sha) if isinstance(sha, str) else None
        if blob is None or len(blob.buffers) != 1:
            return None
        out.append(blob.buffers[0])
    return out


def _replayed(value: Any, returns: str | None, fn: Callable[..., Any]) -> Any:
    """The recorded ``value`` handed back in the shape the first call returned it."""
    if returns is None:  # a record from before shapes were recorded
        returns = "awaitable" if inspect.iscoroutinefunction(fn) else ""
    outer, _, shape = returns.rpartition(":")
    if not outer and shape == "awaitable":
        outer, shape = "awaitable", ""
    if shape == "stream":
        value = streams.replay_stream(value)
    elif shape == "async_iter":
        value = awaitables.replay_async_iter(value)
    elif shape == "iter":
        value = streams.replay_iter(value)
    return awaitables.replay_awaitable(value) if outer else value


#: Iterators of chunks that are not generators, by top-level module: their
#: streams are recorded chunk by chunk (any other iterator is a plain value).
_CHUNK_ITERATORS = ("litellm",)


def _chunk_iterator(result: Any) -> bool:
    """Whether ``result`` is a stream of chunks to record as they are read (see module doc)."""
    if isinstance(result, types.GeneratorType):
        return True
    t = type(result)
    return hasattr(t, "__next__") and t.__module__.split(".")[0] in _CHUNK_ITERATORS


def _parts_digest(parts: dict[str, str], skip: Any) -> str:
    """The digest compared on replay: the callee's parts, less those the call changed."""
    h = hashlib.sha256(b"nbdurable-callee-1\0")
    for label, digest in parts.items():
        if label not in skip:
            h.update(f"{label}\0{digest}\0".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def _callee_parts(fn: Callable[..., Any], where: str) -> dict[str, str]:
    """The parts of :func:`~nbdurable.identity.callables.callable_fingerprint` (the digest
    compared is :func:`_parts_digest` over them), by the type when a custom hook fails.
    """
    try:
        return callable_parts(fn)
    except Exception as exc:  # a user's __nbdurable_fingerprint__ may raise
        warn(f"{where}: cannot fingerprint its function ({exc!r}); comparing it by type only.")
        t = type(fn)
        digest = hashlib.sha256(f"type:{t.__module__}.{t.__qualname__}".encode()).hexdigest()
        return {"type": digest[:32]}


def _labelled(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A call's arguments by label: ``#0``, ``#1``... positional, then keyword names."""
    out = {f"#{i}": v for i, v in enumerate(args)}
    out.update(kwargs)
    return out


_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), range, frozenset)


def _immutable(v: Any) -> bool:
    t = type(v)
    return t in _IMMUTABLE or (t is tuple and all(type(x) in _IMMUTABLE for x in v))


def _arg_fp(v: Any) -> str:
    try:
        return keys.fingerprint(v)
    except Exception:  # a user's __nbdurable_fingerprint__ may raise: judged unchanged
        return ""


def _is_ndarray(v: Any) -> bool:
    return any(c.__module__ == "numpy" and c.__name__ == "ndarray" for c in type(v).__mro__)


def _restorable(target: Any, state: Any) -> bool:
    """Whether :func:`_restore` can put ``state`` into ``target`` in place."""
    if type(target) is not type(state):
        return False
    if isinstance(target, (list, dict, set, bytearray)):
        return True
    if _is_ndarray(target):
        return (
            target.shape == state.shape and target.dtype == state.dtype and target.flags.writeable
        )
    # Any other object only if its whole state is its __dict__ (no custom pickling
    # or slots): a library object (a DataFrame) keeps state elsewhere.
    t = type(target)
    return (
        isinstance(getattr(target, "__dict__", None), dict)
        and not isinstance(target, (type, types.ModuleType, types.FunctionType))
        and not hasattr(t, "__slots__")
        and getattr(t, "__getstate__", None) is object.__getstate__
        and not hasattr(t, "__setstate__")
        and t.__reduce_ex__ is object.__reduce_ex__
        and t.__reduce__ is object.__reduce__
    )


def _restore(target: Any, state: Any) -> None:
    if isinstance(target, (list, bytearray)):
        target[:] = state
    elif isinstance(target, (dict, set)):
        target.clear()
        target.update(state)
    elif _is_ndarray(target):
        target[...] = state
    else:
        vars(target).clear()
        vars(target).update(vars(state))


def _fn_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{name!r}" if name != "<lambda>" else "(a lambda)"
