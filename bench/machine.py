"""What machine the figures come from: CPU, cores, memory, disk, Python, package versions."""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
import time
from importlib import metadata
from pathlib import Path

PACKAGES = (
    "nbdurable",
    "diskcache",
    "cloudpickle",
    "ipython",
    "ipykernel",
    "nbclient",
    "numpy",
    "joblib",
    "dbos",
    "sqlalchemy",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _disk(path: Path) -> str:
    """Filesystem, device and (if the kernel says) whether it is rotational."""
    try:
        best = ("", "", "")
        real = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fs = line.split()[:3]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best[1]):
                best = (dev, mnt, fs)
        dev, mnt, fs = best
        kind = ""
        name = os.path.basename(dev)
        rot = Path(f"/sys/class/block/{name}/queue/rotational")
        if not rot.exists():  # a partition: look at its parent device
            parent = Path(f"/sys/class/block/{name}").resolve().parent / "queue" / "rotational"
            rot = parent
        if rot.exists():
            kind = "rotational" if rot.read_text().strip() == "1" else "non-rotational"
        if name.startswith("vd"):
            kind = f"virtio block device, reported {kind}" if kind else "virtio block device"
        return f"{fs} on {dev} mounted at {mnt}" + (f" ({kind})" if kind else "")
    except (OSError, ValueError):
        return "unknown"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        if pkg == "nbdurable":
            import nbdurable

            return f"{nbdurable.__version__} (source checkout)"
        return "not installed"


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    try:
        a, b, c = os.getloadavg()
        return f"{a:.2f}, {b:.2f}, {c:.2f}"
    except OSError:
        return "unknown"


def describe(data_dir: Path) -> list[tuple[str, str]]:
    """``(what, value)`` pairs describing this machine."""
    return [
        ("CPU", _cpu()),
        ("cores", str(os.cpu_count())),
        ("memory", _ram()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("disk (benchmark data)", _disk(data_dir)),
        ("Python", f"{sys.version.split()[0]} ({platform.python_implementation()})"),
        ("SQLite", sqlite3.sqlite_version),
        ("packages", ", ".join(f"{p} {_version(p)}" for p in PACKAGES)),
    ]


class CpuWatch:
    """CPU time spent by *other* processes while the benchmark runs (Linux).

    The load average counts the benchmark itself (a busy process is a load
    of 1), so it cannot tell whether anything else ran. This reads the
    machine's busy time from ``/proc/stat`` and subtracts this process's
    own CPU time and that of its finished children (the kernels of section
    4): what is left, divided by the wall time, is how many cores others
    used. ``steal`` is time the hypervisor gave to other guests.
    """

    def __init__(self) -> None:
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float, float] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        busy = (user + nice + system + irq + softirq) / self._hz
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy, steal / self._hz, own, time.monotonic()

    def restart(self) -> None:
        """Measure from now."""
        self._start = self._sample()

    def others(self) -> tuple[float, float] | None:
        """``(cores used by other processes, cores stolen)`` since the start, or None."""
        end = self._sample()
        if end is None or self._start is None:
            return None
        busy0, steal0, own0, t0 = self._start
        busy1, steal1, own1, t1 = end
        wall = max(t1 - t0, 1e-9)
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / wall, (steal1 - steal0) / wall
