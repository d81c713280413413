"""nbdurable: durable execution for Jupyter notebooks.

``%load_ext nbdurable``, then ``%%step`` cells are recorded and replayed;
``step()``, ``@recorded`` and ``idempotency_key()`` record single calls;
``approve()`` records a person's decision.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    ApprovalPending,
    CorruptRecord,
    DivergenceError,
    FormatVersionError,
    LeaseHeld,
    LiveCallRefused,
    NbdurableError,
    NbdurableWarning,
    NotRestored,
    Rejected,
    RepeatRefused,
    SettingError,
    StoreError,
    UsageProblem,
)

_LAZY = {
    "approve": "durable.approval",
    "compare": "durable.experiments",
    "configure": "config",
    "idempotency_key": "durable.substeps",
    "recorded": "durable.substeps",
    "step": "durable.substeps",
}


def __getattr__(name: str) -> Any:
    # Imported on first use: the engine is not light, and the CLI (`nbdurable
    # status`, `ls`, ...) should not pay for it.
    if name in _LAZY:
        import sys
        from importlib import import_module

        if _LAZY[name].startswith("durable.") and "IPython" in sys.modules:
            # step() called in IPython before `%load_ext`: the engine's host is the shell.
            import_module(".ipython", __name__)
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nbdurable' has no attribute {name!r}")


__all__ = [
    "ApprovalPending",
    "CorruptRecord",
    "DivergenceError",
    "FormatVersionError",
    "LeaseHeld",
    "LiveCallRefused",
    "NbdurableError",
    "NbdurableWarning",
    "NotRestored",
    "Rejected",
    "RepeatRefused",
    "SettingError",
    "StoreError",
    "UsageProblem",
    "approve",
    "compare",
    "configure",
    "idempotency_key",
    "panel",
    "recorded",
    "step",
]
__version__ = "0.1.0"


def panel() -> Any:
    """The step panel widget for the current run (see :mod:`nbdurable.ipython.panel`)."""
    from .ipython.panel import panel as _panel

    return _panel()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbdurable``."""
    from .ipython.magic import load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext nbdurable``: remove the hooks ``load`` added."""
    from .ipython.magic import unload

    unload(ipython)
