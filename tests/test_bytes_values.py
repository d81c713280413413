"""Large ``bytes`` values: recorded out of band, stored once, scanned where they lie.

A step variable that is a large ``bytes`` or ``bytearray`` goes to its blob
from its own memory (not copied into a pickle stream first); a sub-step that
returns one keeps its memory in a blob of its own, the same blob a step
variable bound to it spills, so the store holds it once; a replay of that
sub-step (its step's body running again) loads it back equal; ``gc`` keeps
that blob. Memory is measured with ``tracemalloc`` by ``bench/bytes_memory.py``
(a bound, never a time), in a fresh process with no IPython.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from kernel_util import REPO_ROOT

from nbdurable.redact import find_keys
from nbdurable.store import blobs


def _python(code: str, cwd) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "NBDURABLE_DIR": str(cwd)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_recording_a_large_bytes_value_makes_no_copy_and_stores_it_once(tmp_path):
    got = _python(
        """
        import json
        from pathlib import Path
        from bench import bytes_memory as b
        out = {case: b.measure(case, 32, Path('.')) for case in b.CASES}
        print(json.dumps(out))
        """,
        tmp_path,
    )
    for case, (peak, stored, equal) in got.items():
        assert equal, f"{case}: did not replay equal"
        # before: a copy in the pickle stream (and, for a sub-step result, one more
        # in the encoded record): 1.1 to 2 MB more per MB recorded
        assert peak < 0.5, f"{case}: {peak:.2f} MB allocated per MB recorded"
        assert stored < 1.1, f"{case}: {stored:.2f} MB stored per MB"


SUBSTEP = """
    import contextlib, io, json, sys
    sys.path.insert(0, {bench!r})
    from bench.bytes_memory import _Host, _maker
    from nbdurable import step
    from nbdurable.durable import session as sessions
    from nbdurable.store import open_store
    from nbdurable.store.admin import gc

    calls = []
    make = _maker(bytes, 20 * 1024 * 1024)

    def fetch():
        calls.append(1)
        return make()

    def fetch_other():  # a result no variable holds: only its sub-step record keeps its blob
        calls.append(2)
        return make()[::-1]

    def run(tag):
        sessions.reset_session()
        ns = {{"fetch": fetch, "fetch_other": fetch_other, "tag": tag, "step": step}}
        session = sessions.get_session(_Host(ns))
        store = open_store({store!r})
        session.set_store(store, "bytes-run")
        session.steps.run_step(
            "value = step('fetch', fetch)\\n"
            "n = len(step('other', fetch_other))\\nlabel = tag + '!'",
            name="big",
        )
        same = ns["value"] == make() and type(ns["value"]) is bytes and ns["n"] == len(ns["value"])
        return store, session.status["name:big"][0], same

    store, first, same1 = run("a")
    store.close()
    store, second, same2 = run("b")  # an input changed: the body runs, the sub-step replays
    removed = gc(store, older_than=10**9).blobs
    stored = sum(p.stat().st_size for p in __import__("pathlib").Path("store").rglob("*")
                 if p.is_file())
    store.close()
    store, third, same3 = run("c")  # after gc: the sub-step's blob is still there
    print(json.dumps(dict(states=[first, second, third], same=[same1, same2, same3],
                          calls=len(calls), removed=removed, stored=stored)))
"""


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_at(request, tmp_path):
    """Where the script's store is: a directory, or a namespace of the test server."""
    return "store" if request.param == "disk" else request.getfixturevalue("pg_url")


def test_a_large_bytes_sub_step_result_replays_from_its_blob(tmp_path, store_at):
    got = _python(SUBSTEP.format(bench=str(REPO_ROOT), store=store_at), tmp_path)
    assert got["states"] == ["recorded", "recorded", "recorded"], got
    assert got["same"] == [True, True, True], got
    # 2 calls: each sub-step once; a third would be 'other' called again after gc
    # removed the blob that only its sub-step record holds
    assert got["calls"] == 2, "a sub-step was called again"
    assert got["removed"] == 0, "gc removed a blob a sub-step record uses"
    if store_at == "store":  # the result and the variable bound to it: stored once, not twice
        assert got["stored"] < 2.1 * 20 * 1024 * 1024, got["stored"]


def test_keys_and_secrets_are_found_in_a_view_without_copying_it():
    key = "sk-" + "proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" + "_-QQ7"
    data = bytearray(b"x " * 50_000 + key.encode() + b" y")
    for view in (memoryview(data), memoryview(bytes(data)), memoryview(data)[1:]):
        assert find_keys(view) == ["openai"]
        # `secret in view` compares items, not substrings: scan must not use it
        assert blobs.scan(view, {"OPENAI_API_KEY": key.encode()}) == ["OPENAI_API_KEY"]
    assert blobs.scan(memoryview(b"nothing here"), {"K": b"secret-value"}) == []
