"""A store nobody else can write, and a lease holder that is really alive.

Opening a store checks, before its key is read, that the directory, the key
file and the database folder belong to this user (or root) and are writable
by no one else (``nbdurable.store.ownership``): whoever can write them can
sign a pickle that a replay runs. CI runs as root, which is the case that
matters most (a root kernel replaying another user's store would run their
code as root): the test giving the store to another user needs root to
``chown``, and is skipped, saying so, elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from nbdurable import cli
from nbdurable.durable.lease import Holder, _alive, _proc_stat, host
from nbdurable.errors import StoreError
from nbdurable.store import open_store
from nbdurable.store.disk import CACHE_DIR


def _recorded(tmp_path):
    path = tmp_path / "store"
    with open_store(path) as s:
        s.put("r/x/meta", {"kind": "run", "run": "x"})
    return path


@pytest.mark.parametrize(
    ("target", "what"),
    [("", "directory"), ("key", "key file"), (CACHE_DIR, "database folder")],
)
def test_a_store_others_can_write_is_refused_before_anything_is_read(tmp_path, target, what):
    path = _recorded(tmp_path)
    place = path / target if target else path
    os.chmod(place, os.stat(place).st_mode | 0o022)
    with pytest.raises(StoreError) as err:
        open_store(path)
    said = str(err.value)
    assert f"the store {what} {place} is writable by others" in said, said
    assert f"chmod go-w {place}" in said and "\n" not in said
    os.chmod(place, os.stat(place).st_mode & ~0o022)
    with open_store(path) as s:  # made private again: it opens, its records intact
        assert s.get("r/x/meta") is not None


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    path = _recorded(tmp_path)
    os.chmod(path, 0o777)
    assert cli.main(["ls", "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is writable by others" in err, err


@pytest.mark.skipif(os.getuid() != 0, reason="giving the store to another user needs root")
def test_root_refuses_a_store_another_user_owns(tmp_path):
    path = _recorded(tmp_path)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, 12345, 12345)
    with pytest.raises(StoreError, match=r"belongs to another user \(uid 12345\)"):
        open_store(path)
    # A symlink to a store of one's own, owned by someone else, is refused too.
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, 0, 0)
    link = tmp_path / "link"
    link.symlink_to(path)
    os.lchown(link, 12345, 12345)
    with pytest.raises(StoreError, match=r"\(a symlink\) belongs to another user"):
        open_store(link)


def test_value_folders_are_private(tmp_path):
    with open_store(tmp_path / "store") as s:
        s.put_blob(b"v" * (1 << 20))  # large enough for a value file of its own
    folders = [
        os.path.join(r, d) for r, ds, _ in os.walk(tmp_path / "store" / CACHE_DIR) for d in ds
    ]
    assert folders, "no value folder was made"
    modes = {f: os.stat(f).st_mode & 0o777 for f in folders}
    assert set(modes.values()) == {0o700}, modes


def test_a_zombie_lease_holder_is_not_alive():
    """A killed kernel its parent has not reaped answers signals, but records nothing."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while _proc_stat(child.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        state, started = _proc_stat(child.pid)
        assert state == "Z", state
        now = time.time()
        holder = Holder(host(), child.pid, started, "t", now, now)
        assert not _alive(holder, now)
        mine = Holder(host(), os.getpid(), _proc_stat(os.getpid())[1], "t", now, now)
        assert _alive(mine, now)
        # The same pid, started at another time: a pid reused, not the holder.
        assert not _alive(Holder(host(), os.getpid(), "1", "t", now, now), now)
    finally:
        child.wait()


def test_a_missing_key_file_of_a_store_with_records_is_an_error_not_a_new_key(tmp_path):
    path = _recorded(tmp_path)
    (path / "key").unlink()
    with pytest.raises(StoreError, match=r"the store key file .*key is missing, and the store"):
        open_store(path)
    assert not (path / "key").exists(), "a new key was made"
    # A directory with no database yet makes its key, as a new store does.
    fresh = tmp_path / "fresh"
    fresh.mkdir(mode=0o700)
    open_store(fresh).close()
    assert (fresh / "key").exists()
