"""Fixtures shared by the test files, and the environment every process they start inherits."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from nbdurable.store import open_store


def _cache_bytecode_for_children() -> None:
    """Let the kernels and CLI processes the tests start reuse compiled bytecode.

    CI (and some machines) set PYTHONDONTWRITEBYTECODE=1, which keeps a
    checkout free of ``__pycache__`` folders but made every one of the
    suite's ~1,500 kernels compile nbdurable's modules from source: about
    0.16 of a kernel's 0.9 CPU-seconds. Children instead write and read their
    bytecode under one private prefix outside the checkout (Python writes each
    file atomically, so processes starting at once share it safely), as a
    user's kernel caches bytecode by default. Set once, at import, so xdist's
    workers and everything they start inherit it.
    """
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = Path(tempfile.gettempdir()) / f"nbdurable-tests-pycache-{os.getuid()}"
    prefix.mkdir(mode=0o700, exist_ok=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False


_cache_bytecode_for_children()


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch):
    """Stores in tests use their own key file, whatever the environment says."""
    monkeypatch.delenv("NBDURABLE_KEY", raising=False)


@pytest.fixture(autouse=True, scope="session")
def _test_files_are_not_the_notebooks_modules():
    """The test files themselves are not a notebook's local modules.

    Tests that drive a shell in this process (not a kernel) would otherwise
    have the process state snapshot of every step (procstate: the module-level
    data of local modules, compared before and after) fingerprint the test
    modules' own globals, hypothesis strategies and fixtures included: most of
    an in-process step's time, for state no notebook has. Local modules the
    tests write (a ``helpers.py`` in a temporary folder) are still the user's.
    """
    import sys

    from nbdurable.procstate import modules

    here = str(Path(__file__).resolve().parent)
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if file.startswith(here):
            modules._user[name] = (module, False)
    yield


@pytest.fixture
def store(tmp_path):
    """A fresh store in the test's temporary directory."""
    s = open_store(tmp_path / "store")
    yield s
    s.close()


# -- the PostgreSQL server of the team-store tests ---------------------------------------

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def pg_server():
    """The URL of a running PostgreSQL server: NBDURABLE_TEST_PG's, else one of the tests' own.

    Where no server answers at NBDURABLE_TEST_PG (default: the one at
    127.0.0.1:5432), the tests start their own from the PostgreSQL binaries
    (``pg_util.PrivateServer``) for the session. Fails, never skips, when
    neither can be had.
    """
    import os

    import psycopg

    url = os.environ.get("NBDURABLE_TEST_PG", PG_DEFAULT)
    problem = None
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        problem = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if problem is None:
        yield url
        return
    from pg_util import PrivateServer

    try:
        own = PrivateServer()
    except RuntimeError as exc:
        problem += f"; and no server of the tests' own: {str(exc).splitlines()[0]}"
        own = None
    if own is None:  # outside the except: one line, no chained traceback
        pytest.fail(
            f"no PostgreSQL server answers at {url} ({problem}): start one "
            "(`pg_ctlcluster 15 main start`, or apt-get install postgresql) or set "
            "NBDURABLE_TEST_PG to a server's URL",
            pytrace=False,
        )
    yield own.url
    own.close()


@pytest.fixture
def pg_url(pg_server, monkeypatch, request):
    """A store URL in a namespace of its own (dropped afterwards), with NBDURABLE_KEY set."""
    import uuid

    import psycopg

    monkeypatch.setenv("NBDURABLE_KEY", "test-team-key-" + "k" * 16)
    namespace = f"t_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in pg_server else "?"
    yield f"{pg_server}{sep}namespace={namespace}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{namespace}" CASCADE')


@pytest.fixture
def private_pg(monkeypatch):
    """A PostgreSQL server of the test's own, which it may stop and restart.

    See ``pg_util.PrivateServer``; the shared server of ``pg_server`` is never
    stopped. Fails, never skips, where no PostgreSQL binaries are installed.
    """
    from pg_util import PrivateServer

    monkeypatch.setenv("NBDURABLE_KEY", "test-team-key-" + "k" * 16)
    problem = None
    try:
        server = PrivateServer()
    except RuntimeError as exc:
        problem = str(exc).splitlines()[0]
    if problem is not None:  # outside the except: one line, no chained traceback
        pytest.fail(problem, pytrace=False)
    yield server
    server.close()
