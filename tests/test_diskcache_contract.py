"""The parts of diskcache's private API the embedded store relies on are still there.

The store writes rows with one INSERT instead of ``Cache.set``'s four statements,
reads them with one SELECT, and checks its own files; for that it uses names
diskcache does not promise to keep (``Cache._sql``, ``Cache._disk``,
``Cache._row_insert``, ``Cache._row_update``) and the layout of its ``Cache``
table. ``pyproject.toml`` bounds diskcache above for this reason; whoever lifts
the bound runs this file first, and a failure here names exactly what moved.
"""

from __future__ import annotations

import inspect
import sqlite3

import diskcache
import pytest

CACHE_METHODS = {
    "_sql": None,
    "_disk": None,
    "_row_insert": ["key", "raw", "now", "columns"],
    "_row_update": ["rowid", "now", "columns"],
    "transact": ["retry"],
}
DISK_METHODS = {
    "filename": ["key", "value"],
    "remove": ["file_path"],
    "fetch": ["mode", "filename", "value", "read"],
    "store": ["value", "read", "key"],
}
CORE_NAMES = ["DBNAME", "DEFAULT_SETTINGS", "MODE_RAW", "MODE_BINARY", "UNKNOWN"]
CACHE_COLUMNS = [
    "rowid", "key", "raw", "store_time", "expire_time", "access_time",
    "access_count", "tag", "size", "mode", "filename", "value",
]  # fmt: skip


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.fixture
def cache(tmp_path):
    with diskcache.Cache(tmp_path) as c:
        yield c


def test_cache_private_methods(cache):
    version = diskcache.__version__
    for name, params in CACHE_METHODS.items():
        assert hasattr(cache, name), (
            f"diskcache {version}: Cache.{name} is gone; the store's diskcache engine uses it"
        )
        if params is not None:
            assert _params(getattr(cache, name)) == params, (
                f"diskcache {version}: Cache.{name} now takes {_params(getattr(cache, name))}, "
                f"the store calls it with {params}"
            )
    assert isinstance(cache._disk, diskcache.Disk)
    assert callable(cache._sql)


def test_disk_methods():
    version = diskcache.__version__
    for name, params in DISK_METHODS.items():
        fn = getattr(diskcache.Disk, name, None)
        assert fn is not None, f"diskcache {version}: Disk.{name} is gone"
        assert _params(fn) == params, (
            f"diskcache {version}: Disk.{name} now takes {_params(fn)}, the store expects {params}"
        )


def test_core_names():
    missing = [n for n in CORE_NAMES if not hasattr(diskcache.core, n)]
    assert not missing, f"diskcache {diskcache.__version__}: diskcache.core lacks {missing}"
    assert "disk_min_file_size" in diskcache.core.DEFAULT_SETTINGS


def test_cache_table_layout(cache, tmp_path):
    con = sqlite3.connect(tmp_path / diskcache.core.DBNAME)
    try:
        columns = [row[1] for row in con.execute("PRAGMA table_info(Cache)")]
    finally:
        con.close()
    assert columns == CACHE_COLUMNS, (
        f"diskcache {diskcache.__version__}: the Cache table's columns changed to {columns}; "
        "the store's INSERT and SELECT statements name the old ones"
    )


def test_row_insert_writes_a_row_the_public_api_reads(cache):
    """The INSERT path the store takes yields a row that ``Cache.get`` reads back."""
    now = 1.0
    columns = (None, None, 5, diskcache.core.MODE_RAW, None, sqlite3.Binary(b"hello"))
    with cache.transact():
        cache._row_insert("k", 1, now, columns)
    assert cache.get("k") == b"hello"
