"""The store: signed records over a key-value engine; no IPython here.

- :mod:`.base`: the :class:`Store` interface, over bytes, that every engine implements;
- :mod:`.opener`: :func:`open_store`, the one way to open a store (a directory or a URL);
- :mod:`.postgres`: the shared engine, a PostgreSQL database (:mod:`._pg`: its URL and tables);
- :mod:`.disk`: the embedded engine, a diskcache directory (:mod:`._diskcache` fences diskcache);
- :mod:`.codec`: signing and encoding records; :mod:`.layout`: every key;
- :mod:`.records`: what a record holds; :mod:`.blobs` and :mod:`.values`: saved variables;
- :mod:`.view`: :class:`RunView`, the one reader of a run's records and states;
- :mod:`.versions`: a record per version of a step's code and inputs, and which are kept;
- :mod:`.admin`: whole runs: ``ls``, ``export``, ``gc``, ``check``.
"""

from __future__ import annotations

from .base import Store
from .codec import MAGIC
from .layout import RUN_SCOPE, RunKeys
from .opener import open_store
from .view import RunView

__all__ = ["MAGIC", "RUN_SCOPE", "RunKeys", "RunView", "Store", "open_store"]
