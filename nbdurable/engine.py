"""Old import path, kept for one release: the engine now lives in :mod:`nbdurable.kernel`.

``nbdurable.engine`` was split into :mod:`nbdurable.kernel.session` (the run
context and its lease), :mod:`nbdurable.kernel.stepper` (replay or execute a
``%%step``), :mod:`nbdurable.kernel.execute` and :mod:`nbdurable.kernel.context`.
This module only re-exports their public names; import from there instead.
"""

from __future__ import annotations

from typing import Any

from .errors import NbdurableWarning
from .kernel.context import Savings, StepContext, SubIndex, warn
from .kernel.session import (
    Session,
    current_session,
    get_session,
    reset_session,
    run_summary,
)
from .kernel.stepper import Plan

__all__ = [
    "NbdurableWarning",
    "Plan",
    "Savings",
    "Session",
    "StepContext",
    "SubIndex",
    "current_session",
    "get_session",
    "reset_session",
    "run_summary",
    "warn",
]


def __getattr__(name: str) -> Any:
    # `engine._session` was read by code outside the kernel; the session now is
    # current_session().
    if name == "_session":
        return current_session()
    raise AttributeError(f"module 'nbdurable.engine' has no attribute {name!r}")
