"""The runner: ``nbdurable run`` drives real kernels from outside through nbclient.

:mod:`.attempts` is the attempt loop (a dead kernel is replaced and the
notebook run again from the top), :mod:`.result` what a run reports,
:mod:`.progress` the console's lines and bar, :mod:`.notebook` the notebook
file. Never imports :mod:`nbdurable.durable` or :mod:`nbdurable.ipython`: it
learns what a kernel did from the store, the cells' outputs, and the kernel's
``run_summary()``.
"""

from __future__ import annotations

from .attempts import run_notebook
from .progress import ConsoleProgress, Progress
from .result import RunResult

__all__ = ["ConsoleProgress", "Progress", "RunResult", "run_notebook"]
