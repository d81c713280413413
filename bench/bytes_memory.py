"""Peak memory and store size per MB of a ``bytes`` value recorded (no IPython, no kernel).

A step binds a large ``bytes`` (and, separately, a ``bytearray``); a step
whose sub-step returns one. For each, the peak of memory that Python
allocates while the step is recorded (:mod:`tracemalloc`; the value itself
was made before, so it is not counted) and the bytes the store grew by, each
per MB of the value, then the value is loaded back in a new session and
compared. Run ``python -m bench.bytes_memory [MB]``; prints one line per
case and exits 1 if a value did not load back equal.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

MB = 1024 * 1024


class _Capture:
    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []
        self.unfaithful: list[str] = []
        self._redirect = contextlib.redirect_stdout(io.StringIO())

    def __enter__(self) -> _Capture:
        self._redirect.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._redirect.__exit__(*exc)


class _Host:
    """The least a session needs to run a step body (see tests/test_engine_without_ipython)."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self.user_ns = ns

    def hidden(self) -> dict[str, Any]:
        return {}

    def transform(self, body: str) -> str:
        return body

    def run_body(self, py: str, has_await: bool) -> None:
        exec(compile(py, "<step>", "exec"), self.user_ns)

    def capture(self) -> _Capture:
        return _Capture()

    def show(self, outputs: list[dict[str, Any]]) -> None:
        pass

    def publish(self, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        pass

    def executed(self) -> list[str]:
        return []

    def frontend_cell(self) -> tuple[None, None]:
        return None, None

    def describe(self) -> str:
        return "bench"


#: case: (step body, the type made); ``_make()`` makes the value (counted, then subtracted)
CASES = {
    "bytes variable": ("value = _make()", bytes),
    "bytearray variable": ("value = _make()", bytearray),
    "bytes sub-step result": ("value = step('fetch', _make)", bytes),
}


def _maker(kind: type, n: int) -> Any:
    """A function of the notebook's own making a new ``kind`` of ``n`` bytes each call."""
    ns: dict[str, Any] = {}
    exec(f"def _make():\n    return {kind.__name__}(range(256)) * {n // 256}", ns)
    return ns["_make"]


def _session(ns: dict[str, Any], store_dir: Path) -> Any:
    from nbdurable import step
    from nbdurable.durable import session as sessions
    from nbdurable.store import open_store

    sessions.reset_session()
    ns["step"] = step
    session = sessions.get_session(_Host(ns))
    session.set_store(open_store(store_dir), "bench-bytes")
    return session


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(case: str, mb: int, root: Path) -> tuple[float, float, bool]:
    """``(peak MB per MB recorded, store MB per MB, loaded back equal)`` of one case.

    The peak counts what recording allocates besides the value itself.
    """
    body, kind = CASES[case]
    store_dir = root / case.replace(" ", "-")
    n = mb * MB
    ns: dict[str, Any] = {"_make": _maker(kind, n)}
    session = _session(ns, store_dir)
    empty = _size(store_dir)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    session.steps.run_step(body, name="big")
    peak = tracemalloc.get_traced_memory()[1] - base - n
    tracemalloc.stop()
    grown = _size(store_dir) - empty
    session.store.close()
    del ns
    again: dict[str, Any] = {"_make": _maker(kind, n)}
    session = _session(again, store_dir)
    session.steps.run_step(body, name="big")
    got = again.get("value")
    equal = type(got) is kind and got == again["_make"]()
    state = session.status.get("name:big", ("?",))[0]
    session.store.close()
    return peak / n, grown / n, equal and state == "replayed"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mb = int(args[0]) if args else 64
    ok = True
    with tempfile.TemporaryDirectory(prefix="nbd-bytes-") as tmp:
        for case in CASES:
            peak, stored, equal = measure(case, mb, Path(tmp))
            ok &= equal
            print(
                f"{case:24} {mb} MB: peak {peak:.2f} MB per MB recorded, "
                f"store {stored:.2f} MB per MB, {'loads back equal' if equal else 'DIFFERS'}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
