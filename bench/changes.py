"""What finding a step's unnamed changes costs (``python -m bench.changes``).

The namespace: 1,000 user variables of everyday kinds (lists of numbers,
dicts of strings, instances of a notebook class with a list attribute, small
arrays, strings), a 100 MB float64 array, and (unless ``--no-gb``) a 1 GB
DataFrame of 16 float64 columns. Measured per step, as the step runner pays
it: the tokens taken before the body (:class:`nbdurable.durable.changes.Tokens`)
plus the comparison after it, once when nothing changed and once when one
list and one element of the large array changed; and the walk that finds
which objects of a recorded step live elsewhere in the namespace
(:func:`nbdurable.store.sharing.index`, run when a step has values to save).
Median of ``--repeat`` runs,
as wall time and as this process's CPU time (which other load on the
machine inflates less).
The goal: under 5% of a 1-second cell (50 ms).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from nbdurable.durable import changes
from nbdurable.store import sharing


class Item:
    """A notebook-style object: a name and a list."""

    def __init__(self, i: int) -> None:
        self.name = f"item{i}"
        self.values = list(range(i % 50))


Item.__module__ = "__main__"


def namespace(gb: bool) -> dict:
    ns: dict = {}
    for i in range(1000):
        kind = i % 5
        if kind == 0:
            ns[f"v{i}"] = list(range(100))
        elif kind == 1:
            ns[f"v{i}"] = {f"k{j}": f"value {j}" for j in range(20)}
        elif kind == 2:
            ns[f"v{i}"] = Item(i)
        elif kind == 3:
            ns[f"v{i}"] = np.arange(1000.0)
        else:
            ns[f"v{i}"] = f"a string {i}"
    ns["arr"] = np.random.default_rng(0).random(100 * 1024 * 1024 // 8)
    if gb:
        import pandas as pd

        rows = 1024 * 1024 * 1024 // 8 // 16
        ns["df"] = pd.DataFrame({f"c{j}": np.full(rows, float(j)) for j in range(16)})
    return ns


def measure(ns: dict, change: bool) -> tuple[float, float, float]:
    """(wall seconds before, wall seconds after, CPU seconds of both)."""
    names = changes.user_names(ns)
    c0, t0 = time.process_time(), time.perf_counter()
    tokens = changes.Tokens(ns, names)
    t1 = time.perf_counter()
    c1 = time.process_time()
    if change:
        ns["v0"].append(1)
        ns["arr"][0] += 1.0
    c2, t2 = time.process_time(), time.perf_counter()
    found = tokens.changed(ns)
    t3, c3 = time.perf_counter(), time.process_time()
    if change and found != ["arr", "v0"]:
        raise SystemExit(f"changes missed: found {found}")
    if not change and found:
        raise SystemExit(f"changes invented: found {found}")
    return t1 - t0, t3 - t2, (c1 - c0) + (c3 - c2)


def measure_index(ns: dict) -> tuple[float, float]:
    """(wall, CPU) seconds to find three objects a step's pickle holds in the namespace."""
    names = changes.user_names(ns)
    wanted = {id(ns["v0"]), id(ns["v2"].values), id(ns["arr"])}
    c0, t0 = time.process_time(), time.perf_counter()
    found = sharing.index(ns, names, wanted)
    t1, c1 = time.perf_counter(), time.process_time()
    if set(found) != wanted:
        raise SystemExit(f"index missed: found {sorted(p for p, _o in found.values())}")
    return t1 - t0, c1 - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-gb", action="store_true", help="leave out the 1 GB DataFrame")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    ns = namespace(not args.no_gb)
    size = sum(getattr(v, "nbytes", 0) for v in ns.values())
    if "df" in ns:
        size += int(ns["df"].memory_usage(index=False).sum())
    print(f"namespace: {len(ns)} variables, {size / 1e9:.2f} GB of arrays and frames")
    for change in (False, True):
        runs = [measure(ns, change) for _ in range(args.repeat)]
        before = statistics.median(r[0] for r in runs)
        after = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs) * 1000
        what = "one list and the 100 MB array changed" if change else "nothing changed"
        total = (before + after) * 1000
        print(
            f"{what}: tokens before {before * 1000:.1f} ms + compare after "
            f"{after * 1000:.1f} ms = {total:.1f} ms wall ({total / 10:.1f}% of a 1 s cell), "
            f"{cpu:.1f} ms CPU ({cpu / 10:.1f}%)"
        )
    runs = [measure_index(ns) for _ in range(args.repeat)]
    wall = statistics.median(r[0] for r in runs) * 1000
    cpu = statistics.median(r[1] for r in runs) * 1000
    print(f"finding shared objects when saving: {wall:.1f} ms wall, {cpu:.1f} ms CPU")


if __name__ == "__main__":
    main()
