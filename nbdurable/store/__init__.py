"""The store: signed records on disk, no IPython.

``from nbdurable.store import Store`` keeps working: the names below are
re-exported from their modules.
"""

from __future__ import annotations

from .disk import MAGIC, RUN_SCOPE, RunKeys, Store

__all__ = ["MAGIC", "RUN_SCOPE", "RunKeys", "Store"]
