"""Per-call timings and their summaries (median, p99, mean)."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

perf_ns = time.perf_counter_ns


def timed_loop(n: int, call: Callable[[int], object], deadline: float | None = None) -> list[int]:
    """Call ``call(i)`` for i in 0..n-1; return each call's duration in ns.

    With ``deadline`` (a ``time.monotonic()`` value) the loop stops early
    once it is past, so a peer that grows quadratically cannot stall the run.
    """
    out: list[int] = []
    append = out.append
    pc = perf_ns
    for i in range(n):
        t = pc()
        call(i)
        append(pc() - t)
        if deadline is not None and time.monotonic() > deadline:
            break
    return out


def quiesce() -> None:
    """Collect garbage before a timed phase, so one phase's garbage is not billed to the next."""
    gc.collect()


def percentile(sorted_ns: Sequence[int], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_ns:
        return math.nan
    k = max(0, min(len(sorted_ns) - 1, math.ceil(q / 100 * len(sorted_ns)) - 1))
    return float(sorted_ns[k])


@dataclass(frozen=True)
class Summary:
    """Summary of one set of per-call timings, in microseconds."""

    n: int
    median_us: float
    p99_us: float
    mean_us: float

    @classmethod
    def of(cls, ns: Sequence[int]) -> Summary:
        if not ns:
            return cls(0, math.nan, math.nan, math.nan)
        s = sorted(ns)
        return cls(
            len(s), statistics.median(s) / 1e3, percentile(s, 99) / 1e3, statistics.fmean(s) / 1e3
        )


def fmt_us(us: float) -> str:
    """A duration in µs, ms or s with three significant digits."""
    if us != us:  # nan
        return "–"
    if us < 1000:
        return f"{us:.3g} µs"
    if us < 1e6:
        return f"{us / 1e3:.3g} ms"
    return f"{us / 1e6:.3g} s"


def fmt_ratio(r: float) -> str:
    if r != r:
        return "–"
    if r >= 100:
        return f"{r:.0f}×"
    if r >= 10:
        return f"{r:.1f}×"
    return f"{r:.2f}×"


def fmt_bytes(n: float) -> str:
    if n != n:
        return "–"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"
