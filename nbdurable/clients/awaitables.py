"""Sync or async, decided by what a call returns; and the awaitable replay hands back.

The model SDKs wrap their ``async def`` methods in synchronous decorators, so
``inspect.iscoroutinefunction(aclient.chat.completions.create)`` is False and
asking the function is the wrong question. What the call *returned* is the
right one: a coroutine, a task or any object with ``__await__``
(:func:`result_kind`). When it did, the record notes it, and replay
hands back an awaitable again (:func:`replay_awaitable`); when it did not,
the bare value. Code written for the first run (``await step(...)``,
``asyncio.gather(*[step(...) ...])``, ``tg.create_task(step(...))``) then
runs unchanged on every run after it.

Replay hands back a *coroutine*, whatever kind of awaitable the first run
returned: it is the one kind every consumer takes (``await``, ``gather``,
``asyncio.create_task`` and ``TaskGroup.create_task``, which refuse a bare
future), it needs no running loop to be made, and it belongs to no loop, so
it cannot be "attached to a different loop" after a kernel restart.

On the recording side, the sub-step returns a coroutine of its own that
awaits the first run's awaitable and records its value
(``nbdurable.durable.substeps``). Only a value is recorded: an exception or
a cancellation propagates and records nothing, so the call runs again next
time.

Async iterators (an async generator, an SDK's ``AsyncStream``) are the other
shape an async call takes: :func:`record_async_iter` yields the items while
collecting them and hands them over only when the iterator is exhausted (one
abandoned half way records nothing); :func:`replay_async_iter` yields them
again. An object that is both awaitable and async-iterable (a paginator:
``await page`` and ``async for item in page`` both work) cannot be told
apart by its type; :func:`result_kind` names it ``"both"`` so the caller can
decline to record it, loudly, rather than guess which way it will be used.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

Kind = Literal["plain", "awaitable", "async_iter", "both"]


def result_kind(result: Any) -> Kind:
    """``"awaitable"``, ``"async_iter"``, ``"both"`` or ``"plain"``: how ``result`` is consumed."""
    awaitable = inspect.isawaitable(result)
    aiter = hasattr(type(result), "__aiter__")
    if awaitable and aiter:
        return "both"
    if awaitable:
        return "awaitable"
    return "async_iter" if aiter else "plain"


async def _value(value: T) -> T:
    return value


def replay_awaitable(value: T) -> Coroutine[Any, Any, T]:
    """A coroutine that returns ``value`` at once: what replay hands back for an awaitable."""
    return _value(value)


async def record_async_iter(
    source: AsyncIterator[T] | Any, on_complete: Callable[[list[T]], Any]
) -> AsyncIterator[T]:
    """Yield ``source``'s items while collecting them; hand them over when it is exhausted.

    An iteration abandoned half way (``break``, a closed generator, an error,
    a cancellation) hands nothing over.
    """
    items: list[T] = []
    async for item in source:
        items.append(item)
        yield item
    on_complete(items)


async def replay_async_iter(items: list[T]) -> AsyncIterator[T]:
    """Yield the recorded ``items`` again, as an async generator."""
    for item in items:
        yield item
