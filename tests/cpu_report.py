"""Sum a NBDURABLE_TEST_CPU file by test file: ``python tests/cpu_report.py FILE [N]``.

Prints the N (default 30) costliest files by CPU seconds (the test process and
every process it reaped), their wall seconds, test and kernel counts, and the
totals. See ``pytest_runtest_protocol`` in conftest.py.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str, top: int = 30) -> None:
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0])
    tests = []
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        tests.append(row)
        entry = files[row["test"].split("::")[0]]
        entry[0] += row["cpu"]
        entry[1] += row["wall"]
        entry[2] += 1
        entry[3] += row.get("kernels", 0)
    total = [sum(e[i] for e in files.values()) for i in range(4)]
    print(f"{'file':48} {'cpu s':>8} {'wall s':>8} {'tests':>6} {'kernels':>7}")
    for name, (cpu, wall, n, k) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{name:48} {cpu:8.1f} {wall:8.1f} {n:6d} {k:7d}")
    print(f"{'all':48} {total[0]:8.1f} {total[1]:8.1f} {total[2]:6.0f} {total[3]:7.0f}")
    print(f"\n{top} costliest tests by CPU:")
    for row in sorted(tests, key=lambda r: -r["cpu"])[:top]:
        print(f"{row['cpu']:8.1f} {row['wall']:8.1f} {row.get('kernels', 0):4d}  {row['test']}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
