"""The demo: a research agent on a simulated model, killed mid-run and resumed.

:mod:`.crash_resume` runs the bundled notebook, kills its kernel for real and
resumes it with ``nbdurable run``; :mod:`.sim` is the offline model, search
engine and mail provider the notebook calls (tests use them too).
"""

from __future__ import annotations

from .crash_resume import run_demo

__all__ = ["run_demo"]
