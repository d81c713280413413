"""Blobs: variables stored once by content, out-of-band buffers, verified by SHA-256."""

from __future__ import annotations

import hashlib
import os
import pickle

import numpy as np
import pytest

from nbdurable.errors import CorruptRecord, StoreError
from nbdurable.store import MAGIC, Store, blobs, codec, open_store, values

BIG = 6 * 1024 * 1024  # over blobs.THREAD_OVER and blobs.MAP_OVER: the threaded/mapped paths


def save(store: Store, value: object) -> str:
    stream, buffers = values.dumps_parts(value)
    sha, _ = store.put_blob(stream, buffers)
    return sha


def load(store: Store, sha: str) -> object:
    blob = store.get_blob(sha)
    assert blob is not None
    return values.loads(blob.stream, {}, blob.buffers)


def value_file(store: Store, sha: str) -> str:
    (filename,) = store._rows.cache._sql(
        "SELECT filename FROM Cache WHERE key = ?", ("b/" + sha,)
    ).fetchone()
    return str(store.cache_dir / filename) if filename else ""


@pytest.mark.parametrize("n", [10, 5_000, BIG // 8], ids=["inline", "file", "mapped"])
def test_an_array_comes_back_equal_and_writable(store, n):
    a = np.random.default_rng(n).random(n)
    stream, buffers = values.dumps_parts(a)
    assert len(buffers) == 1 and buffers[0].nbytes == a.nbytes  # out of band: not in the stream
    assert len(stream) < 1_000
    sha = save(store, a)
    b = load(store, sha)
    assert isinstance(b, np.ndarray) and np.array_equal(a, b) and b.dtype == a.dtype
    b[0] = -1.0  # restored arrays are writable...
    assert b[0] == -1.0
    assert np.array_equal(load(store, sha), a)  # ...and writing one never changes the record


def test_mixed_values_round_trip(store):
    value = {
        "arrays": [np.arange(100_000), np.ones((300, 400), order="F"), np.arange(10)[::2]],
        "raw": bytearray(b"x" * 100_000),
        "text": "é" * 1000,
        "nested": ([1, 2], {"k": None}),
    }
    got = load(store, save(store, value))
    assert got["text"] == value["text"] and got["nested"] == value["nested"]
    assert got["raw"] == value["raw"] and isinstance(got["raw"], bytearray)
    for a, b in zip(value["arrays"], got["arrays"], strict=True):
        plain = pickle.loads(pickle.dumps(a, protocol=5))  # what plain pickle gives back
        assert np.array_equal(a, b) and b.flags.f_contiguous == plain.flags.f_contiguous


def test_many_buffers_give_a_long_header(store):
    value = [np.full(3, i) for i in range(20_000)]  # header lists 20,000 lengths (> 64 KB)
    got = load(store, save(store, value))
    assert len(got) == 20_000 and all(np.array_equal(a, b) for a, b in zip(value, got, strict=True))


def test_the_same_content_is_stored_once_and_leaves_no_file_behind(store):
    a = np.random.default_rng(1).random(BIG // 8)
    stream, buffers = values.dumps_parts(a)
    sha, written = store.put_blob(stream, buffers)
    assert written > a.nbytes
    files = sorted(str(p) for p in store.cache_dir.rglob("*.val"))
    assert store.put_blob(stream, buffers) == (sha, 0)
    assert sorted(str(p) for p in store.cache_dir.rglob("*.val")) == files
    assert store.check(fix=False) == []


def test_the_key_is_the_sha256_of_the_stored_bytes(store):
    a = np.arange(1_000_000, dtype=np.int64)
    sha = save(store, a)
    with open(value_file(store, sha), "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == sha


@pytest.mark.parametrize("where", ["buffer", "stream", "header"])
def test_a_changed_byte_anywhere_is_refused_before_unpickling(store, where, tmp_path):
    a = np.random.default_rng(2).random(BIG // 8)
    sha = save(store, a)
    path = value_file(store, sha)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    n = int.from_bytes(data[4:8], "big")
    at = {"header": 10, "stream": 8 + n + 2, "buffer": len(data) - 5}[where]
    data[at] ^= 0x01
    with open(path, "r+b") as f:
        f.write(data)
    with pytest.raises(CorruptRecord, match="SHA-256|unreadable header"):
        store.get_blob(sha)


def test_a_planted_blob_never_runs(store, tmp_path):
    target = tmp_path / "pwned"

    class Planted:
        def __reduce__(self):
            return (open, (str(target), "w"))

    stream = pickle.dumps(Planted(), protocol=5)
    real_sha = save(store, np.arange(10))
    # Replace the blob's bytes by a well-formed blob holding a malicious pickle.
    evil = blobs.head(stream, []) + stream
    store._rows.cache._sql("UPDATE Cache SET value = ? WHERE key = ?", (evil, "b/" + real_sha))
    with pytest.raises(CorruptRecord, match="SHA-256"):
        store.get_blob(real_sha)
    assert not target.exists()


def test_a_truncated_blob_file_is_refused(store):
    sha = save(store, np.random.default_rng(3).random(BIG // 8))
    path = value_file(store, sha)
    os.truncate(path, os.path.getsize(path) - 100)
    with pytest.raises(CorruptRecord):
        store.get_blob(sha)
    # Refused blobs are rewritten by the next put of the same content.
    assert store.put_blob(*values.dumps_parts(np.random.default_rng(3).random(BIG // 8)))[1] > 0
    assert store.get_blob(sha) is not None


def test_a_missing_value_file_reads_as_absent_and_is_rewritten(store):
    a = np.random.default_rng(4).random(BIG // 8)
    sha = save(store, a)
    os.unlink(value_file(store, sha))
    assert store.get_blob(sha) is None
    assert store.put_blob(*values.dumps_parts(a))[1] > 0
    assert np.array_equal(load(store, sha), a)


def test_format_1_blobs_still_load(store):
    # nbdurable 0.1 wrote a blob as a signed record holding the whole pickle.
    # (signed with the first scheme: no store domain, see nbdurable.store.codec)
    def put_v1(key, data):
        store.write({key: codec.encode(store._macs.v1, key, {"kind": "blob"}, data, magic=MAGIC)})

    data = pickle.dumps({"old": [1, 2, 3]}, protocol=5)
    sha = hashlib.sha256(data).hexdigest()
    put_v1("b/" + sha, data)
    assert store.read("b/" + sha).startswith(MAGIC)
    assert load(store, sha) == {"old": [1, 2, 3]}
    big = pickle.dumps(b"y" * 100_000, protocol=5)  # in a value file
    sha2 = hashlib.sha256(big).hexdigest()
    put_v1("b/" + sha2, big)
    assert load(store, sha2) == b"y" * 100_000


@pytest.mark.parametrize("at", [100, 8 * 1024 * 1024 - 5], ids=["inside", "across-chunks"])
def test_a_secret_in_an_array_is_refused_and_nothing_is_written(store, at):
    secret = b"sk-test-0123456789abcdef"
    raw = bytearray(np.random.default_rng(5).integers(0, 255, 20 * 1024 * 1024, dtype=np.uint8))
    raw[at : at + len(secret)] = secret
    stream, buffers = values.dumps_parts(np.frombuffer(raw, dtype=np.uint8))
    files = sorted(store.cache_dir.rglob("*.val"))
    with pytest.raises(blobs.SecretFound) as err:
        store.put_blob(stream, buffers, secrets={"OPENAI_API_KEY": secret})
    assert err.value.names == ["OPENAI_API_KEY"]
    assert sorted(store.cache_dir.rglob("*.val")) == files and store.scan("b/") == []
    raw[at : at + len(secret)] = b"-" * len(secret)
    sha, written = store.put_blob(stream, buffers, secrets={"OPENAI_API_KEY": secret})
    assert written > 0 and store.get_blob(sha) is not None


def test_a_secret_in_a_small_value_is_refused(store):
    stream, buffers = values.dumps_parts({"token": "sk-test-0123456789abcdef"})
    with pytest.raises(blobs.SecretFound):
        store.put_blob(stream, buffers, secrets={"API_TOKEN": b"sk-test-0123456789abcdef"})
    assert store.scan("b/") == []


def test_what_is_stored_matches_its_name_while_another_thread_writes_to_the_value(store):
    # The hash, the secret search and the file all come from one copy of each chunk.
    import threading

    a = np.zeros(24 * 1024 * 1024 // 8)
    stop = threading.Event()

    def scribble() -> None:
        i = 0
        while not stop.is_set():
            a[(i * 7919) % a.size] = i
            i += 1

    t = threading.Thread(target=scribble)
    t.start()
    try:
        shas = [store.put_blob(*values.dumps_parts(a))[0] for _ in range(3)]
    finally:
        stop.set()
        t.join()
    for sha in shas:
        assert isinstance(load(store, sha), np.ndarray)  # verifies: never CorruptRecord


def test_a_failed_large_write_leaves_nothing(store, monkeypatch):
    a = np.random.default_rng(6).random(BIG // 8)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(blobs, "_write_chunks", full)
    with pytest.raises(StoreError, match="No space left"):
        store.put_blob(*values.dumps_parts(a))
    assert list(store.cache_dir.rglob("*.val")) == [] and store.scan("b/") == []
    monkeypatch.undo()
    sha, written = store.put_blob(*values.dumps_parts(a))
    assert written > 0 and np.array_equal(load(store, sha), a)


@pytest.mark.parametrize(
    "header",
    [b"[" * 200_000, b'{"format":2,"stream":1e400,"buffers":[]}', b"{}", b"\xff\xfe"],
    ids=["deep", "huge-number", "no-fields", "not-utf8"],
)
def test_a_damaged_blob_header_is_a_corrupt_record(header):
    data = blobs.BLOB_MAGIC + len(header).to_bytes(4, "big") + header
    with pytest.raises(CorruptRecord):
        blobs.split("ab" * 32, memoryview(data))


def test_mappings_are_capped_and_read_past_the_cap(store, monkeypatch):
    monkeypatch.setattr(blobs, "MAP_OVER", 1024 * 1024)
    monkeypatch.setattr(blobs, "MAP_MAX", 2)
    monkeypatch.setattr(blobs, "_live_maps", 0)
    arrays = [np.full(300_000, float(i)) for i in range(4)]
    shas = [save(store, a) for a in arrays]
    restored = [load(store, sha) for sha in shas]
    assert blobs._live_maps == 2  # two mapped, two read
    assert all(np.array_equal(a, b) for a, b in zip(arrays, restored, strict=True))
    del restored
    import gc

    gc.collect()
    assert blobs._live_maps == 0


_CHILD = """
import os, sys
import numpy as np
from nbdurable.store import blobs
from nbdurable.store import values
from nbdurable.store import Store, open_store

where, point = sys.argv[1], sys.argv[2]
store = open_store(where)
if point == "mid-write":
    real, fed = blobs._HashThread.feed, []

    def feed(self, view):
        fed.append(1)
        if len(fed) == 3:  # two chunks written, the third in flight
            os.kill(os.getpid(), 9)
        return real(self, view)

    blobs._HashThread.feed = feed
else:  # "after-commit": the row is in, the call has not returned
    from nbdurable.store._diskcache import Rows

    real = Rows.point_at

    def insert(rows, key, filename, size):
        real(rows, key, filename, size)
        os.kill(os.getpid(), 9)

    Rows.point_at = insert
a = np.random.default_rng(7).random(int(sys.argv[3]))
store.put_blob(*values.dumps_parts(a))
"""


@pytest.mark.parametrize("point", ["mid-write", "after-commit"])
def test_a_kill_while_writing_a_large_value_loses_nothing_and_leaves_no_orphan(tmp_path, point):
    import subprocess
    import sys

    from test_hostile import age_files

    where = tmp_path / "store"
    n = BIG // 8
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(where), point, str(n)], check=False)
    assert proc.returncode == -9, "the writer was not killed"
    a = np.random.default_rng(7).random(n)
    with open_store(where) as store:
        age_files(store.cache_dir)
        store.check(fix=True)  # removes what the killed write left behind, if anything
        assert store.check(fix=False) == []
        if point == "mid-write":
            assert store.scan("b/") == [] and not list(store.cache_dir.rglob("*.val"))
        else:  # committed: the value is there, whole
            (key,) = store.scan("b/")
            assert np.array_equal(load(store, key[2:]), a)
        sha, _ = store.put_blob(*values.dumps_parts(a))  # and writing works afterwards
        assert np.array_equal(load(store, sha), a)
