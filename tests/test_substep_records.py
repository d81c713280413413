"""A sub-step's record: compact, deflated where it pays, and still read as written before.

A new store (format 3) keeps a small sub-step's record deflated (``NBD\\x03``,
see :mod:`nbdurable.store.codec`); a store an earlier version made (format 2)
keeps writing ``NBD\\x02`` so that version still reads it. Records written as
the earlier encoder wrote them (built here byte by byte, not by the codec)
still verify and replay. The deflated scheme is bound into the signature, is
verified before anything is inflated, and inflates to a bounded size.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib

import pytest

from nbdurable.durable import session as engine
from nbdurable.durable.context import StepContext
from nbdurable.errors import CorruptRecord
from nbdurable.identity.callables import callable_parts
from nbdurable.store import codec, open_store
from nbdurable.store.layout import RunKeys

RUN = "records-run"
STEP = "name:s"
CALLS: list[int] = []
PAD = "0"


def fetch(i: int) -> str:
    CALLS.append(i)
    return f"{i:02d}{PAD}" * 30


@pytest.fixture
def in_step(monkeypatch):
    """``session_for(store)``: a session on ``store`` inside the step ``s``."""
    monkeypatch.setattr(engine, "_session", None)
    CALLS.clear()

    def session_for(store):
        engine.reset_session()
        session = engine.get_session()
        session.set_store(store, RUN)
        session.current = StepContext(STEP, "s")
        return session

    yield session_for
    engine.reset_session()


def _call(i: int = 1) -> str:
    from nbdurable import step

    return step(f"call:{i}", fetch, i)


def test_a_new_store_keeps_a_small_sub_step_record_deflated_and_replays_it(tmp_path, in_step):
    with open_store(tmp_path / "store") as store:
        assert store.get("meta/format")[0]["format"] == 3
        in_step(store)
        assert _call() == "010" * 30
        key = RunKeys(RUN).sub(STEP, "call:1")
        raw = store.read(key)
        assert raw.startswith(codec.MAGIC3)
        header, body = store.get(key)
        assert header["kind"] == "sub" and header["id"] == "call:1" and header["type"] == "str"
        plain = len(json.dumps(header, separators=(",", ":"))) + len(body)
        assert len(raw) < plain  # stored shorter than its header and body alone
    with open_store(tmp_path / "store") as store:
        in_step(store)
        assert _call() == "010" * 30
    assert CALLS == [1]  # replayed, not called again


def test_a_format_2_store_stays_at_2_and_is_written_as_before(tmp_path, in_step):
    path = tmp_path / "store"
    with open_store(path) as store:
        fmt = store.get("meta/format")[0]
        store.put("meta/format", {**fmt, "format": 2})  # as the earlier version made it
    with open_store(path) as store:
        assert store.get("meta/format")[0]["format"] == 2  # not upgraded
        in_step(store)
        assert _call() == "010" * 30
        assert store.read(RunKeys(RUN).sub(STEP, "call:1")).startswith(codec.MAGIC2)


def _old_encoding(macs: codec.Macs, key: str, header: dict, body: bytes) -> bytes:
    """A record as the earlier encoder wrote it: ``NBD\\x02``, JSON header, by hand."""
    head = json.dumps(header, separators=(",", ":")).encode()
    payload = struct.pack(">I", len(head)) + head + body
    mac = macs.v2.copy()
    mac.update(key.encode() + b"\0" + payload)
    return codec.MAGIC2 + mac.digest() + payload


def _as_earlier(header: dict) -> dict:
    """A sub-step header as the earlier sub-step path wrote it: every field, full digests."""
    return {
        **header,
        "callee_parts": callable_parts(fetch),
        "callee_volatile": ["global CALLS"],
        "mutated": [],
        "tokens": [],
        "format": 1,
        "started": 1796472196.429819,
        "duration": 2.5273000005654467e-05,
    }


def test_a_record_the_earlier_encoder_wrote_still_replays(tmp_path, in_step):
    path = tmp_path / "store"
    key = RunKeys(RUN).sub(STEP, "call:1")
    with open_store(path) as store:
        in_step(store)
        assert _call() == "010" * 30
        header, body = store.get(key)
        old = _as_earlier(header)
        store.write({key: _old_encoding(store._macs, key, old, bytes(body))})
        assert store.get(key)[0] == old
    with open_store(path) as store:
        in_step(store)
        assert _call() == "010" * 30
    assert CALLS == [1]  # replayed from the earlier record


@pytest.mark.parametrize("earlier", [False, True], ids=["record-now", "earlier-record"])
def test_a_changed_callee_part_is_named_from_either_record(tmp_path, in_step, monkeypatch, earlier):
    """A record keeps each callee part's first digits; one with full digests compares too."""
    path = tmp_path / "store"
    key = RunKeys(RUN).sub(STEP, "call:1")
    with open_store(path) as store:
        in_step(store)
        _call()
        header, body = store.get(key)
        assert {len(v) for v in header["callee_parts"].values()} == {8}
        if earlier:
            old = _as_earlier(header)
            store.write({key: _old_encoding(store._macs, key, old, bytes(body))})
    monkeypatch.setitem(globals(), "PAD", "1")
    with open_store(path) as store:
        session = in_step(store)
        assert _call() == "011" * 30
        assert session.current.first_remade == (
            "sub-step 'call:1': its function 'fetch' changed (global PAD)"
        )
    assert CALLS == [1, 1]


def test_the_marker_of_a_deflated_record_is_signed(tmp_path):
    with open_store(tmp_path / "store") as store:
        key = RunKeys(RUN).sub(STEP, "x")
        store.put(key, {"kind": "sub", "id": "x", "fn": "a.b" * 40}, b"body" * 10)
        raw = store.read(key)
        assert raw.startswith(codec.MAGIC3)
        store.write({key: codec.MAGIC2 + raw[4:]})
        with pytest.raises(CorruptRecord, match="failed its signature check"):
            store.get(key)


def test_a_deflated_record_is_verified_before_it_is_inflated(tmp_path, monkeypatch):
    with open_store(tmp_path / "store") as store:
        key = RunKeys(RUN).sub(STEP, "x")
        store.put(key, {"kind": "sub", "id": "x", "fn": "a.b" * 40}, b"body" * 10)
        raw = bytearray(store.read(key))
        raw[-3] ^= 1
        store.write({key: bytes(raw)})
        inflated = []
        real = zlib.decompressobj
        monkeypatch.setattr(
            zlib, "decompressobj", lambda *a, **k: inflated.append(1) or real(*a, **k)
        )
        with pytest.raises(CorruptRecord, match="failed its signature check"):
            store.get(key)
        assert inflated == []


def test_a_deflated_payload_inflates_to_a_bounded_size(tmp_path):
    with open_store(tmp_path / "store") as store:
        key = RunKeys(RUN).sub(STEP, "x")
        head = b'{"kind":"sub"}'
        payload = struct.pack(">I", len(head)) + head + b"\0" * (codec.DEFLATE_MAX * 4)
        z = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, codec.ZDICT)
        packed = z.compress(payload) + z.flush()
        bomb = codec.MAGIC3 + codec.sign(store._macs.v3, key, packed) + packed
        store.write({key: bomb})
        with pytest.raises(CorruptRecord, match="does not inflate"):
            store.get(key)


def test_a_large_sub_step_record_is_not_deflated(tmp_path):
    with open_store(tmp_path / "store") as store:
        key = RunKeys(RUN).sub(STEP, "x")
        body = hashlib.sha256(b"x").digest() * (codec.DEFLATE_MAX // 32 + 1)
        store.put(key, {"kind": "sub", "id": "x"}, body)
        assert store.read(key).startswith(codec.MAGIC2)
        assert bytes(store.get(key)[1]) == body


def test_records_other_than_sub_steps_are_not_deflated(tmp_path):
    with open_store(tmp_path / "store") as store:
        rk = RunKeys(RUN)
        store.put(rk.state(STEP), {"kind": "state", "name": "a.b" * 40})
        assert store.read(rk.state(STEP)).startswith(codec.MAGIC2)


def test_a_signature_under_another_scheme_does_not_verify(tmp_path):
    """``NBD\\x03`` is signed under its own binding, not ``NBD\\x02``'s."""
    with open_store(tmp_path / "store") as store:
        key = RunKeys(RUN).sub(STEP, "x")
        head = b'{"kind":"sub"}'
        payload = struct.pack(">I", len(head)) + head
        z = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, codec.ZDICT)
        packed = z.compress(payload) + z.flush()
        forged = codec.MAGIC3 + codec.sign(store._macs.v2, key, packed) + packed
        store.write({key: forged})
        with pytest.raises(CorruptRecord, match="failed its signature check"):
            store.get(key)


@pytest.mark.parametrize(
    "size, level", [(100, 6), (1500, 6), (codec.DEFLATE_FAST_OVER + 1, 1), (12_000, 1)]
)
def test_a_payload_over_2_kb_is_deflated_at_the_fastest_level_and_reads_back(
    tmp_path, monkeypatch, size, level
):
    # Text of words, as a model's reply is: it deflates, at either level.
    text = (b"the answer of the model is that " * (size // 32 + 1))[:size]
    levels = []
    real = zlib.compressobj
    monkeypatch.setattr(
        zlib, "compressobj", lambda lvl, *a, **k: levels.append(lvl) or real(lvl, *a, **k)
    )
    with open_store(tmp_path / "store") as store:
        key = RunKeys(RUN).sub(STEP, "x")
        store.put(key, {"kind": "sub", "id": "x"}, text)
        raw = store.read(key)
        assert raw.startswith(codec.MAGIC3) and len(raw) < size
        assert levels == [level]
        assert bytes(store.get(key)[1]) == text
