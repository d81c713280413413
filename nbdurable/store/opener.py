"""Opening a store: a directory opens the embedded engine, a URL the shared one.

Which store a process uses is :func:`nbdurable.config.chosen_store`'s
answer (configured, else ``NBDURABLE_STORE``, else the notebook's
directory); this module opens it. A URL ``postgresql://user@host:port/db?namespace=team1`` (or ``postgres://``)
opens :mod:`.postgres`; anything else is a directory of :mod:`.disk`. With a
URL store, the run id is still the notebook's path relative to the
local directory (see ``locate.run_id_for``): two machines whose
projects lie at different paths share the run of the same notebook.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import StoreError

SCHEMES = ("postgresql://", "postgres://")


def is_url(target: object) -> bool:
    """True if ``target`` names a database rather than a directory."""
    return isinstance(target, str) and target.strip().lower().startswith(SCHEMES)


def engine_for(target: object) -> type[Any]:
    """The :class:`~.base.Store` subclass that opens ``target``."""
    if is_url(target):
        from .postgres import PgStore

        return PgStore
    if isinstance(target, str) and "://" in target:
        raise StoreError(
            f"unknown store URL {target.split('://')[0]}://...: nbdurable stores runs in a "
            "directory or at a postgresql:// URL"
        )
    from .disk import DiskStore

    return DiskStore


def open_store(target: str | os.PathLike[str], *, durability: str = "crash") -> Any:
    """Open the store at ``target`` (a directory or a URL) with its engine."""
    return engine_for(target)(target, durability=durability)


def exists(target: str | os.PathLike[str]) -> bool:
    """True if ``target`` holds a store (a URL always does: opening creates its namespace)."""
    if is_url(target):
        return True
    from .disk import DiskStore

    return DiskStore.exists(target)
