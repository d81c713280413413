"""Records per version, on both engines: archive, bring back, keep N, clear, gc, copy, status.

Records are written straight into a real store (a directory, and a
PostgreSQL namespace); the kernel side of the same rules is tested with real
kernels and real papermill in tests/test_clients.py.
"""

from __future__ import annotations

import time

import pytest

from nbdurable import commands, status
from nbdurable.identity.keys import source_fingerprint, step_version
from nbdurable.ipython.rows import row_html
from nbdurable.store import RunKeys, Store, admin, open_store, versions
from nbdurable.store.copy import copy_run
from nbdurable.store.records import StepRecord, StepState, SubRecord, VarRecord

RUN = "nb.ipynb"
RK = RunKeys(RUN)
KEY = "name:plan"


def put_version(
    store: Store, topic: str, started: float, subs: dict[str, bytes], blob: str = ""
) -> str:
    """Record the step as if it had just run with ``topic``: its record and sub-steps."""
    rec = StepRecord(
        run=RUN,
        key=KEY,
        name="plan",
        position=3,
        source="plan = make(topic)",
        source_fp=source_fingerprint("plan = make(topic)"),
        inputs={"topic": f"fp-{topic}"},
        input_from={},
        variables=(VarRecord("plan", "value", blob, "fp", 1),) if blob else (),
        deleted=(),
        outputs=({"output_type": "stream", "name": "stdout", "text": topic},),
        started=started,
        duration=1.0,
    )
    store.put(RK.step(KEY), rec.to_header())
    for sub_id, body in subs.items():
        sub = SubRecord(RUN, KEY, sub_id, "m.f", f"args-{topic}", started, 0.1, len(body), "str")
        store.put(RK.sub(KEY, sub_id), sub.to_header(), body)
    return version(topic)


def version(topic: str) -> str:
    return step_version(source_fingerprint("plan = make(topic)"), {"topic": f"fp-{topic}"})


def current(store: Store) -> tuple[str, dict[str, bytes]]:
    """The current record's topic, and its sub-steps' bodies by id."""
    head = store.get(RK.step(KEY))[0]
    prefix = RK.subs_prefix(KEY)
    subs = {k[len(prefix) :]: bytes(store.get(k)[1]) for k in store.scan(prefix)}
    return head["outputs"][0]["text"], subs


def test_a_version_set_back_comes_back_with_its_own_substeps(any_store):
    cats = put_version(any_store, "cats", 1.0, {"search": b"cats-1"})
    dogs = version("dogs")
    # dogs is about to run: cats is archived, its sub-steps stay current for dogs to reuse
    assert versions.switch(any_store, RK, KEY, cats, dogs, keep=10) is False
    assert versions.kept(any_store, RK, KEY) == [cats]
    assert current(any_store) == ("cats", {"search": b"cats-1"})
    put_version(any_store, "dogs", 2.0, {"search": b"dogs-1", "extra": b"dogs-2"})
    # back to cats: exactly cats's record and sub-steps, and dogs kept
    assert versions.has(any_store, RK, KEY, cats)
    assert versions.switch(any_store, RK, KEY, dogs, cats, keep=10) is True
    assert current(any_store) == ("cats", {"search": b"cats-1"})
    assert versions.kept(any_store, RK, KEY) == [dogs]
    assert versions.switch(any_store, RK, KEY, cats, dogs, keep=10) is True
    assert current(any_store) == ("dogs", {"search": b"dogs-1", "extra": b"dogs-2"})
    assert versions.kept(any_store, RK, KEY) == [cats]


def test_an_interrupted_change_does_not_archive_the_new_versions_calls(any_store):
    cats = put_version(any_store, "cats", 1.0, {"search": b"cats-1"})
    dogs = version("dogs")
    versions.switch(any_store, RK, KEY, cats, dogs, keep=10)
    # dogs's attempt recorded a call, then its kernel died before the step's record
    any_store.put(RK.sub(KEY, "search"), {"kind": "sub", "args_fp": "args-dogs"}, b"dogs-1")
    versions.switch(any_store, RK, KEY, cats, dogs, keep=10)  # the retry
    prefix = RK.version_subs(KEY, cats)
    assert bytes(any_store.get(prefix + "search")[1]) == b"cats-1"


def test_at_most_keep_versions_are_kept_the_oldest_go_first(any_store):
    topics = ["a", "b", "c", "d", "e"]
    previous = None
    for i, topic in enumerate(topics):
        if previous is not None:
            versions.switch(any_store, RK, KEY, previous, version(topic), keep=3)
        previous = put_version(any_store, topic, float(i), {"call": topic.encode()})
    # the current version (e) and the two recorded last (d, c)
    assert sorted(versions.kept(any_store, RK, KEY)) == sorted([version("c"), version("d")])
    assert any_store.scan(RK.version_subs(KEY, version("a"))) == []
    # keep=1: only the current version, nothing archived
    versions.switch(any_store, RK, KEY, version("e"), version("f"), keep=1)
    assert versions.kept(any_store, RK, KEY) == []


def test_clear_removes_every_version(any_store):
    cats = put_version(any_store, "cats", 1.0, {"search": b"cats-1"})
    versions.switch(any_store, RK, KEY, cats, version("dogs"), keep=10)
    put_version(any_store, "dogs", 2.0, {"search": b"dogs-1"})
    commands.clear(any_store, RUN, [KEY])
    # the run's change mark and its manifest (which refuses the cleared records), nothing else
    assert any_store.scan(RK.base) == sorted([RK.changed, RK.manifest])


def test_status_export_and_panel_show_the_current_version_and_how_many_others_are_kept(any_store):
    cats = put_version(any_store, "cats", 1.0, {})
    versions.switch(any_store, RK, KEY, cats, version("dogs"), keep=10)
    put_version(any_store, "dogs", 2.0, {})
    (row,) = status.step_infos(any_store, RUN)
    assert (row.version, row.versions) == (version("dogs")[:8], 1)
    table = status.format_table([row])
    assert f"{version('dogs')[:8]} +1" in table, table
    exported = admin.export_run(any_store, RUN, [row])["steps"][0]
    assert (exported["version"], exported["versions"]) == (version("dogs")[:8], 1)
    html = row_html(row)  # the panel's row
    assert f"v&nbsp;{version('dogs')[:8]}&nbsp;(+1&nbsp;kept)" in html, html


def _blob(store: Store, text: str) -> str:
    return store.put_blob(text.encode() * 400)[0]  # large enough to be a blob of its own


def test_gc_keeps_n_versions_and_every_version_of_a_pinned_step(any_store):
    shas = {t: _blob(any_store, t) for t in "abcd"}
    previous = None
    for i, topic in enumerate("abcd"):
        if previous is not None:
            versions.switch(any_store, RK, KEY, previous, version(topic), keep=10)
        started = time.time() + i  # recent: gc keeps the run
        previous = put_version(any_store, topic, started, {"call": b"x"}, blob=shas[topic])
    any_store.put(RK.state(KEY), StepState(pinned=True).to_header())
    report = admin.gc(any_store, older_than=1e9, keep_versions=2)
    assert report.versions == 0 and len(versions.kept(any_store, RK, KEY)) == 3  # pinned
    any_store.delete(RK.state(KEY))
    report = admin.gc(any_store, older_than=1e9, keep_versions=2)
    assert report.versions == 2 and versions.kept(any_store, RK, KEY) == [version("c")]
    # the saved variables of the versions kept stay; the others' are removed
    assert any_store.get_blob(shas["c"]) is not None and any_store.get_blob(shas["d"]) is not None
    assert any_store.get_blob(shas["a"]) is None and any_store.get_blob(shas["b"]) is None


def test_copy_carries_every_version_and_its_saved_variables(tmp_path, pg_url):
    src, dst = open_store(tmp_path / "store"), open_store(pg_url)
    try:
        sha = _blob(src, "cats")
        cats = put_version(src, "cats", 1.0, {"search": b"cats-1"}, blob=sha)
        versions.switch(src, RK, KEY, cats, version("dogs"), keep=10)
        put_version(src, "dogs", 2.0, {"search": b"dogs-1"}, blob=_blob(src, "dogs"))
        copy_run(src, dst, RUN)
        assert versions.switch(dst, RK, KEY, version("dogs"), cats, keep=10) is True
        assert current(dst) == ("cats", {"search": b"cats-1"})
        assert dst.get_blob(sha) is not None
    finally:
        src.close()
        dst.close()


# -- the step runner's side, on an in-process shell ------------------------------------------


@pytest.fixture
def shell(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    import nbdurable
    from nbdurable.durable import session as engine

    monkeypatch.setenv("NBDURABLE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("NBDURABLE_NOTEBOOK", str(tmp_path / "v.ipynb"))
    sh = InteractiveShell.instance()
    engine.reset_session()
    nbdurable.load_ipython_extension(sh)
    log = tmp_path / "calls.log"
    setup = (
        "from nbdurable import step\n"
        "def fetch(topic):\n"
        f"    with open({str(log)!r}, 'a') as fh:\n"
        "        fh.write(topic + '\\n')\n"
        "    return topic.upper()"
    )
    assert sh.run_cell(setup).success
    yield sh, log
    nbdurable.configure(keep_versions=versions.KEEP_VERSIONS)
    nbdurable.unload_ipython_extension(sh)
    engine.reset_session()
    sh.reset(new_session=False)


STEP = "%%step fetch\nresult = step('fetch', fetch, topic)"


def _run(sh, topic: str) -> str:
    assert sh.run_cell(f"topic = {topic!r}").success
    assert sh.run_cell(STEP).success
    assert sh.user_ns["result"] == topic.upper()
    from nbdurable.durable import session as engine

    return engine.get_session().status["name:fetch"][0]


def _calls(log) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_pinned_step_keeps_its_version_whatever_its_inputs(shell):
    sh, log = shell
    assert _run(sh, "cats") == "recorded"
    assert sh.run_cell("%step pin fetch").success
    assert sh.run_cell("topic = 'dogs'").success
    assert sh.run_cell(STEP).success
    assert sh.user_ns["result"] == "CATS"  # pinned: the current version, stale
    from nbdurable.durable import session as engine

    s = engine.get_session()
    assert versions.kept(s.store, s.keys, "name:fetch") == []  # nothing switched
    assert sh.run_cell("%step unpin fetch").success
    assert [_run(sh, t) for t in ("dogs", "cats", "dogs")] == ["recorded", "replayed", "replayed"]
    assert _calls(log) == ["cats", "dogs"]


def test_keep_versions_bounds_what_a_step_keeps(shell):
    import nbdurable

    sh, log = shell
    nbdurable.configure(keep_versions=2)
    for topic in ("a", "b", "c"):
        assert _run(sh, topic) == "recorded"
    assert _run(sh, "b") == "replayed"  # one other version kept
    assert _run(sh, "a") == "recorded"  # removed when c ran: made again
    assert _calls(log) == ["a", "b", "c", "a"]
    with pytest.raises(Exception, match="keep_versions must be a whole number"):
        nbdurable.configure(keep_versions=0)


def test_an_unreadable_kept_version_runs_again_in_one_line_and_is_replaced(shell, recwarn):
    sh, log = shell
    _run(sh, "cats")
    _run(sh, "dogs")
    from nbdurable.durable import session as engine

    s = engine.get_session()
    (kept,) = versions.kept(s.store, s.keys, "name:fetch")
    key = s.keys.version("name:fetch", kept)
    s.store.write({key: s.store.read(key)[:-3] + b"xyz"})  # a damaged record
    assert _run(sh, "cats") == "recorded"
    lines = [str(w.message) for w in recwarn if "cannot be used" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert _run(sh, "dogs") == "replayed" and _run(sh, "cats") == "replayed"
    assert _calls(log) == ["cats", "dogs", "cats"]


def test_gc_keep_versions_from_the_command_line(tmp_path, capsys):
    from nbdurable import cli

    directory = tmp_path / "store"
    with open_store(directory) as s:
        previous = None
        for i, topic in enumerate("abc"):
            if previous is not None:
                versions.switch(s, RK, KEY, previous, version(topic), keep=10)
            previous = put_version(s, topic, time.time() + i, {"call": b"x"})
    with pytest.raises(SystemExit) as bad:  # argparse's way out: one line, exit 2
        cli.main(["gc", "--store", str(directory), "--keep-versions", "0"])
    assert bad.value.code == 2
    assert "expected a whole number 1 or more" in capsys.readouterr().err
    assert cli.main(["gc", "--store", str(directory), "--keep-versions", "2"]) == 0
    assert "removed 1 earlier versions of steps (beyond 2 per step)" in capsys.readouterr().out
    with open_store(directory) as s:
        assert versions.kept(s, RK, KEY) == [version("b")]
