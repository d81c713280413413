"""A signed record replays only in the store it was written into, and only while it is current.

Signatures cover the store's domain (a PostgreSQL namespace, an embedded
store's id): a row copied into another namespace or another store directory
that shares the key does not verify there. Each run's manifest refuses a
record written back after its step was cleared, an earlier step record
rolled back in place, and records stamped under a manifest that was deleted;
``nbdurable check`` names and removes them. Records of the first signing
scheme (no domain, no generation) still replay. Both engines, real stores.
"""

from __future__ import annotations

import json
import warnings

import pytest

from nbdurable import approvals, cli, commands
from nbdurable.durable import session as engine
from nbdurable.durable.approval import approve
from nbdurable.durable.context import StepContext
from nbdurable.durable.host import PlainHost
from nbdurable.errors import CorruptRecord, NbdurableWarning, StaleRecord, StoreError
from nbdurable.store import RunKeys, RunView, codec, open_store
from nbdurable.store.copy import copy_run

RUN = "nb.ipynb"
KEY = "shared-team-key-" + "k" * 16


def _record(store, run=RUN, step="name:s", value=b"v1", started=1.0):
    """A step record and one sub-step of ``step``, as a kernel writes them."""
    rk = RunKeys(run)
    store.apply(
        puts=[
            (rk.sub(step, "call"), {"run": run, "id": "call", "started": started}, value),
            (rk.step(step), {"run": run, "name": step, "started": started}, b""),
        ]
    )
    return rk


def _raw(store, keys):
    return {k: store.read(k) for k in keys}


# -- signatures bind the store -----------------------------------------------------------


def test_a_row_copied_to_another_store_directory_with_the_same_key_does_not_verify(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("NBDURABLE_KEY", KEY)
    with open_store(tmp_path / "a") as a, open_store(tmp_path / "b") as b:
        rk = _record(a)
        rows = _raw(a, [rk.step("name:s"), rk.sub("name:s", "call")])
        assert all(v[:4] in (codec.MAGIC2, codec.MAGIC3) for v in rows.values())
        b.write(rows)
        for key in rows:
            with pytest.raises(CorruptRecord, match="copied from another store"):
                b.get(key)
        assert a.get(rk.step("name:s")) is not None  # where it was written, it verifies


@pytest.mark.postgres
def test_a_row_copied_to_another_namespace_does_not_verify(pg_url):
    other = pg_url.replace("namespace=", "namespace=x")
    with open_store(pg_url) as a, open_store(other) as b:
        try:
            rk = _record(a)
            rows = _raw(a, [rk.step("name:s"), rk.sub("name:s", "call")])
            b.write(rows)
            for key in rows:
                with pytest.raises(CorruptRecord, match="failed its signature check"):
                    b.get(key)
            assert RunView(b, RUN).records() == {"name:s": None}
        finally:
            import psycopg
            from pg_util import namespace

            with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{namespace(other)}" CASCADE')


def test_a_store_keeps_one_id_and_a_record_of_the_first_scheme_still_verifies(tmp_path):
    path = tmp_path / "store"
    with open_store(path) as s:
        store_id = s.get("meta/format")[0]["store"]
        rk = RunKeys(RUN)
        key = rk.sub("~run", "old")
        old = codec.encode(s._macs.v1, key, {"id": "old"}, b"body", magic=codec.MAGIC)
        s.write({key: old})
        assert s.get(key)[0] == {"id": "old"}  # written before manifests: replays
    with open_store(path) as s:
        assert s.get("meta/format")[0]["store"] == store_id  # made once, kept


def test_copy_re_signs_into_the_destination(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDURABLE_KEY", KEY)
    with open_store(tmp_path / "a") as a, open_store(tmp_path / "b") as b:
        rk = _record(a)
        copy_run(a, b, RUN)
        assert b.get(rk.step("name:s"))[0]["name"] == "name:s"
        assert bytes(b.get(rk.sub("name:s", "call"))[1]) == b"v1"
        assert b.read(rk.step("name:s")) != a.read(rk.step("name:s"))


# -- freshness: the run's manifest ------------------------------------------------------------


def test_a_cleared_record_written_back_is_refused(any_store):
    rk = _record(any_store)
    keys = [rk.step("name:s"), rk.sub("name:s", "call")]
    saved = _raw(any_store, keys)
    commands.clear(any_store, RUN, ["name:s"])
    any_store.write(saved)  # someone with write access puts the old rows back
    for key in keys:
        with pytest.raises(StaleRecord, match="written before its step was last cleared"):
            any_store.get(key)
    assert RunView(any_store, RUN).records() == {"name:s": None}
    # recorded again, it replays; the old rows cannot come back over it
    _record(any_store, value=b"v2", started=2.0)
    assert bytes(any_store.get(keys[1])[1]) == b"v2"


def test_records_written_back_after_clear_all_are_refused(any_store):
    rk = _record(any_store)
    saved = _raw(any_store, [rk.step("name:s"), rk.sub("name:s", "call")])
    commands.clear_all(any_store, RUN)
    any_store.write(saved)
    for key in saved:
        with pytest.raises(StaleRecord):
            any_store.get(key)
    any_store._manifests.clear()  # a process that opens the store now refuses them too
    for key in saved:
        with pytest.raises(StaleRecord):
            any_store.get(key)


def test_an_earlier_step_record_rolled_back_in_place_is_refused(any_store):
    rk = _record(any_store, started=1.0)
    first = _raw(any_store, [rk.step("name:s")])
    _record(any_store, started=2.0)
    any_store.write(first)
    with pytest.raises(StaleRecord, match="rolled back in its place"):
        any_store.get(rk.step("name:s"))


def test_a_deleted_manifest_is_said_and_what_it_guarded_stays_refused(any_store):
    rk = _record(any_store)
    saved = _raw(any_store, [rk.step("name:s"), rk.sub("name:s", "call")])
    commands.clear(any_store, RUN, ["name:s"])
    any_store.delete(rk.manifest)
    any_store.write(saved)
    any_store._manifests.clear()  # as a kernel started afterwards
    with pytest.raises(StaleRecord, match="manifest is missing"):
        any_store.get(rk.step("name:s"))
    with pytest.warns(NbdurableWarning, match="manifest of run .* was missing"):
        _record(any_store, step="name:t")  # the next write starts a new one, and says so
    for key in saved:
        with pytest.raises(StaleRecord):
            any_store.get(key)
    assert any_store.get(rk.step("name:t")) is not None


def test_records_of_an_earlier_version_replay_until_their_step_is_cleared(tmp_path):
    with open_store(tmp_path / "store") as s:
        rk = RunKeys(RUN)
        legacy = {}
        for key, header in [
            (rk.step("name:s"), {"run": RUN, "name": "name:s"}),
            (rk.sub("name:s", "call"), {"id": "call"}),
        ]:
            legacy[key] = codec.encode(s._macs.v1, key, header, b"", magic=codec.MAGIC)
        s.write(legacy)
        for key in legacy:
            assert s.get(key) is not None  # no manifest yet: nothing says otherwise
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # adopting them is not a warning
            _record(s, step="name:t")
        for key in legacy:
            assert s.get(key) is not None  # adopted: still replays
        commands.clear(s, RUN, ["name:s"])
        s.write(legacy)
        for key in legacy:
            with pytest.raises(StaleRecord):
                s.get(key)


def test_an_approval_written_back_after_clear_is_asked_again(any_store, monkeypatch):
    asked = []

    class Host(PlainHost):
        def wait_approval(self, pending, elsewhere, decide):  # noqa: D102
            asked.append(pending.id)
            return decide(len(asked) == 1, "")  # approved the first time only

    monkeypatch.setattr(engine, "_session", None)
    session = engine.get_session(Host())
    session.set_store(any_store, RUN)
    session.current = StepContext("name:mail", "mail")
    assert approve("send", "Send it") is True
    rk = session.keys
    decision = rk.sub("name:mail", approvals.APPROVAL_PREFIX + "send")
    saved = _raw(any_store, [decision])
    commands.clear(any_store, RUN, ["name:mail"])
    any_store.write(saved)
    session.current = StepContext("name:mail", "mail")  # the step runs again
    with pytest.warns(NbdurableWarning, match="cannot be used .*not current"):
        assert approve("send", "Send it") is False  # asked again, not the old approval
    assert asked == ["send", "send"]


# -- check --------------------------------------------------------------------------------


def test_check_names_and_removes_records_that_are_no_longer_current(tmp_path, capsys):
    path = tmp_path / "store"
    with open_store(path) as s:
        rk = _record(s)
        saved = _raw(s, [rk.step("name:s"), rk.sub("name:s", "call")])
        commands.clear(s, RUN, ["name:s"])
        s.write(saved)
    assert cli.main(["check", "--store", str(path), "--dry-run", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert len(report["found"]) == 2 and all("not current" in p for p in report["found"]), report
    assert cli.main(["check", "--store", str(path)]) == 0, capsys.readouterr().out
    assert "2 problems found, 2 repaired" in capsys.readouterr().out
    with open_store(path) as s:
        assert s.scan(rk.all_subs) == [] and not s.has(rk.step("name:s"))
    assert cli.main(["check", "--store", str(path)]) == 0
    assert "sound" in capsys.readouterr().out


def test_check_says_a_missing_manifest(tmp_path, capsys):
    path = tmp_path / "store"
    with open_store(path) as s:
        rk = _record(s)
        s.delete(rk.manifest)
    assert cli.main(["check", "--store", str(path), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "manifest is missing" in out and rk.base[2:-1] in out, out
    assert cli.main(["check", "--store", str(path)]) == 0
    with open_store(path) as s:
        assert s.has(rk.manifest)


# -- crash safety: a record and its manifest are one transaction -------------------------

_KILLED_WRITER = """
import os, sys
from nbdurable import faults
from nbdurable.store import RunKeys, open_store
s = open_store(sys.argv[1])
rk = RunKeys("nb.ipynb")
s.apply(puts=[(rk.step("name:s"), {"run": "nb.ipynb", "started": 1.0}, b"")])
faults._spec, faults._loaded = ("store-write", 1), True  # die inside the next transaction
s.apply(puts=[(rk.step("name:s"), {"run": "nb.ipynb", "started": 2.0}, b"")])
"""


def test_a_kill_while_a_step_record_is_written_leaves_the_one_before_usable(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], timeout=60)
    assert done.returncode == 137, "the writer died inside its transaction"
    with open_store(path) as s:
        rk = RunKeys(RUN)
        assert s.get(rk.step("name:s"))[0]["started"] == 1.0  # neither record nor manifest moved
        manifest = s._read_manifest(rk.base[2:-1])
        assert manifest.steps["name:s"][1] == codec.signature(s.read(rk.step("name:s")))
        _record(s, started=3.0)  # and the step records again
        assert s.get(rk.step("name:s"))[0]["started"] == 3.0


def test_a_run_rolled_back_with_its_manifest_while_in_use_is_said(any_store):
    rk = _record(any_store, started=1.0)
    earlier = _raw(any_store, [rk.step("name:s"), rk.sub("name:s", "call"), rk.manifest])
    _record(any_store, value=b"v2", started=2.0)
    assert any_store.get(rk.step("name:s"))[0]["started"] == 2.0
    any_store.write(earlier)  # the whole run, manifest and all, put back as it was
    with pytest.warns(NbdurableWarning, match="went back from change 2 to 1"):
        got = any_store.get(rk.step("name:s"))
    assert got[0]["started"] == 1.0  # consistent: it replays (see docs/guarantees.md)


def test_check_says_sub_step_rows_lost_since_their_step_was_recorded(tmp_path, capsys):
    path = tmp_path / "store"
    with open_store(path) as s:
        rk = _record(s)
        s.delete(rk.sub("name:s", "call"))  # lost, the step record left as it was
        assert s.get(rk.step("name:s")) is not None  # the record itself still replays
    assert cli.main(["check", "--store", str(path), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "has lost 1 of its 1 sub-step rows" in out, out
    assert cli.main(["check", "--store", str(path)]) == 0  # said once, noted
    assert cli.main(["check", "--store", str(path)]) == 0
    assert "sound" in capsys.readouterr().out


# -- two processes: a manifest cached by one, changed by the other -------------------------


def _second(any_store, request):
    """Another Store object on the same store, as another process opens it."""
    if isinstance(any_store.path, str):
        return open_store(request.getfixturevalue("pg_url"))
    return open_store(any_store.path)


def test_a_record_made_anew_by_another_process_is_current_to_one_that_cached_the_manifest(
    any_store, request
):
    rk = _record(any_store, value=b"v1", started=1.0)  # this object caches the manifest
    decision = rk.sub("name:s", approvals.APPROVAL_PREFIX + "send")
    with _second(any_store, request) as other:
        commands.clear(other, RUN, ["name:s"])
        _record(other, value=b"v2", started=2.0)
        other.apply(puts=[(decision, {"approval": {"approved": True, "by": "b", "at": 1.0},
                                      "args_fp": ""}, b"")])  # fmt: skip
    assert bytes(any_store.get(rk.sub("name:s", "call"))[1]) == b"v2"
    got = approvals.read_decision(any_store, rk, "name:s", "send", strict=True)
    assert got is not None and got.approved and got.by == "b"


def test_check_does_not_call_a_store_it_cannot_read_sound(tmp_path, monkeypatch):
    from nbdurable.store.currency import check_runs

    with open_store(tmp_path / "store") as s:
        rk = _record(s)
        real = s.read

        def failing(key):  # the medium fails as the step record is read
            if key == rk.step("name:s"):
                raise StoreError("disk I/O error reading the store")
            return real(key)

        monkeypatch.setattr(s, "read", failing)
        with pytest.raises(StoreError, match="disk I/O error"):
            check_runs(s, fix=False, done="")


def test_a_stale_record_says_why_as_a_reason(any_store):
    rk = _record(any_store)
    saved = _raw(any_store, [rk.step("name:s")])
    commands.clear(any_store, RUN, ["name:s"])
    any_store.write(saved)
    with pytest.raises(StaleRecord) as err:
        any_store.get(rk.step("name:s"))
    assert err.value.reason == "cleared"
    any_store.delete(rk.manifest)
    any_store._manifests.clear()
    with pytest.raises(StaleRecord) as err:
        any_store.get(rk.step("name:s"))
    assert err.value.reason == "unproven"


# -- an earlier version's store, opened where it cannot be written -----------------------


@pytest.mark.postgres
def test_an_earlier_versions_store_opens_for_a_read_only_role(pg_url):
    import uuid

    import psycopg

    rk = RunKeys(RUN)
    with open_store(pg_url) as admin:
        _record(admin)
        admin.put("meta/format", {"format": 1, "created": 5.0})  # as an earlier version left it
    server, ns = pg_url.split("?")[0], pg_url.rpartition("namespace=")[2]
    role = f"nbd_ro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {ns} TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {ns} TO {role}")
    try:
        reader = pg_url.replace("postgres@", f"{role}@", 1)
        with pytest.warns(
            NbdurableWarning, match="cannot be upgraded here .*nothing in it is lost"
        ):
            store = open_store(reader)
        with store:
            assert store.get(rk.step("name:s"))[0]["name"] == "name:s"  # reading works
            with pytest.raises(StoreError, match="permission denied") as err:
                store.put(rk.state("name:s"), {"kind": "state", "pinned": True})
            assert "\n" not in str(err.value)
        with open_store(pg_url) as admin:  # where it can be written, it is upgraded
            assert admin.get("meta/format")[0]["format"] == 2
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_an_earlier_versions_store_opens_in_a_read_only_directory(tmp_path, monkeypatch):
    from nbdurable import faults

    path = tmp_path / "store"
    rk = RunKeys(RUN)
    with open_store(path) as s:  # made as an earlier version made it: no store id
        old = codec.encode(
            s._macs.v1, rk.step("name:s"), {"name": "name:s"}, b"", magic=codec.MAGIC
        )
        s.write({rk.step("name:s"): old})
        s.put("meta/format", {"format": 1, "created": 5.0})
    monkeypatch.setattr(faults, "_spec", ("store-readonly", 1))
    monkeypatch.setattr(faults, "_loaded", True)
    with pytest.warns(NbdurableWarning, match="cannot be upgraded here .*nothing in it is lost"):
        store = open_store(path)
    with store:
        assert store.get(rk.step("name:s"))[0] == {"name": "name:s"}  # the first scheme verifies
        with pytest.raises(StoreError, match="readonly database") as err:
            store.put(rk.state("name:s"), {"kind": "state", "pinned": True})
        assert "\n" not in str(err.value)
    monkeypatch.setattr(faults, "_spec", None)
    with open_store(path) as s:  # where it can be written, it is upgraded
        assert s.get("meta/format")[0]["format"] == 2 and s.get(rk.step("name:s")) is not None


# -- cost: a manifest read once per pass, not once per step ------------------------------


def test_a_view_of_many_steps_reads_the_run_manifest_once(any_store, monkeypatch):
    for i in range(20):
        rk = _record(any_store, step=f"name:s{i}")
    read, reads = any_store.read, []

    def counting(key):
        reads.append(key)
        return read(key)

    monkeypatch.setattr(any_store, "read", counting)
    RunView(any_store, RUN).records()
    assert reads.count(rk.manifest) == 1, reads.count(rk.manifest)
    reads.clear()
    any_store.get(rk.step("name:s0"))  # a single read still reads it afresh
    assert reads.count(rk.manifest) == 1


def test_a_step_whose_name_looks_like_a_key_still_replays(any_store):
    """The manifest names every step: the redaction gate, which masks what looks like a
    key in a header, must not rename a step in it (its record would then be refused).
    """
    step = "name:AKIA" + "Q" * 16  # a valid step name shaped as an AWS key id
    rk = _record(any_store, step=step)
    any_store._manifests.clear()
    assert any_store.get(rk.step(step)) is not None
    assert step in any_store._read_manifest(rk.base[2:-1]).steps
