"""Damage to a store's database is said, never silent, and ``nbdurable check`` repairs it.

A database emptied under the store (truncated to zero) or overwritten so that
SQLite cannot read it: opening the store refuses in one line naming the file
and the fix, reading nothing; ``nbdurable check`` says what it found (exit 1:
the records are lost), keeps the damaged file beside the store's folder,
where nothing deletes it, and starts the database afresh, after which the
store is sound and records again.
"""

from __future__ import annotations

import json
import os

import pytest

from nbdurable import cli
from nbdurable.errors import DamagedDatabase
from nbdurable.store import open_store
from nbdurable.store.disk import CACHE_DIR


def _recorded(tmp_path):
    path = tmp_path / "store"
    with open_store(path) as s:
        s.put("r/x/meta", {"kind": "run", "run": "x"})
    return path


def _emptied(db):
    os.truncate(db, 0)


def _overwritten(db):
    with open(db, "r+b") as f:
        f.write(b"not a database, just bytes " * 8)


@pytest.mark.parametrize("damage", [_emptied, _overwritten], ids=["emptied", "overwritten"])
def test_a_damaged_database_is_said_then_check_repairs_it(tmp_path, capsys, damage):
    path = _recorded(tmp_path)
    db = path / CACHE_DIR / "cache.db"
    damage(db)
    with pytest.raises(DamagedDatabase) as err:
        open_store(path)
    said = str(err.value)
    assert str(db) in said and "nbdurable check" in said and "\n" not in said, said

    assert cli.main(["check", "--store", str(path), "--dry-run"]) == 1  # nothing changed
    assert db.exists() and not list(path.glob("cache.db.damaged-*"))
    capsys.readouterr()
    assert cli.main(["check", "--store", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (kept,) = path.glob("cache.db.damaged-*")
    assert f"kept as {kept}" in report["found"][0], report
    assert cli.main(["check", "--store", str(path)]) == 0  # sound now, the copy kept
    assert kept.exists()
    with open_store(path) as s:
        assert s.get("r/x/meta") is None  # what it held is lost: steps run again
        s.put("r/x/meta", {"kind": "run", "run": "x"})
        assert s.get("r/x/meta") is not None
