"""Fixtures shared by the test files, and the environment every process they start inherits."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbdurable.store import open_store


def _compile_nbdurable_for_children() -> None:
    """Compile nbdurable once, so the kernels and CLI processes the tests start load bytecode.

    CI (and some machines) set PYTHONDONTWRITEBYTECODE=1, under which nothing
    ever wrote nbdurable's bytecode: every one of the suite's ~1,500 kernels
    compiled its modules from source, about 0.16 of a kernel's 0.9
    CPU-seconds. Installed packages are compiled by pip; this compiles the
    checkout's package into its ``__pycache__`` folders (ignored by git), as
    any import without that setting would. Children keep the setting, so a
    module a test writes and rewrites within one second (same size, same
    mtime) is never loaded from stale bytecode. Files already compiled cost a
    stat each. Done by the process pytest was started as, before any xdist
    worker (they import this file too) or child starts.
    """
    import compileall
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    compileall.compile_dir(Path(__file__).resolve().parent.parent / "nbdurable", quiet=1)


_compile_nbdurable_for_children()


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


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_store(request, tmp_path):
    """A fresh store on each engine: a directory, then a namespace of the test server."""
    s = open_store(tmp_path / "store") if request.param == "disk" else None
    if s is None:
        s = open_store(request.getfixturevalue("pg_url"))
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


# -- where the suite's CPU time goes (opt-in) ----------------------------------------------


def _cpu_seconds() -> float:
    """This process's CPU time plus that of every child it has waited for (kernels, CLIs)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With NBDURABLE_TEST_CPU=FILE, append each test's wall and CPU seconds to FILE.

    CPU includes the kernels and other processes the test started and reaped,
    so the sum over a run is what the suite costs the machine, which a
    durations list (wall time, shared cores) does not show. Kernels started
    by the test are counted too (``jupyter_client`` launches). ``python
    tests/cpu_report.py FILE`` sums it by file. Setup and teardown are
    included: a module-scoped fixture's setup is charged to its file's first
    test, its teardown (where its kernels are reaped) to the last.
    """
    import os

    path = os.environ.get("NBDURABLE_TEST_CPU")
    if not path:
        yield
        return
    import json
    import time

    before, started = _cpu_seconds(), time.monotonic()
    kernels_before = _KERNELS[0]
    yield
    row = {
        "test": item.nodeid,
        "wall": round(time.monotonic() - started, 3),
        "cpu": round(_cpu_seconds() - before, 3),
        "kernels": _KERNELS[0] - kernels_before,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


_KERNELS = [0]


def _count_kernel_launches() -> None:
    """With NBDURABLE_TEST_CPU set, count this process's kernel launches in ``_KERNELS``."""
    import os

    if not os.environ.get("NBDURABLE_TEST_CPU"):
        return
    from jupyter_client import launcher, provisioning

    real = launcher.launch_kernel

    def counted(*args, **kwargs):
        _KERNELS[0] += 1
        return real(*args, **kwargs)

    launcher.launch_kernel = counted
    local = provisioning.local_provisioner
    if getattr(local, "launch_kernel", None) is real:
        local.launch_kernel = counted


_count_kernel_launches()


# -- the order files start in ------------------------------------------------------------

#: The test files that keep one process longest (wall seconds on a 2-core machine, two
#: runs with NBDURABLE_TEST_CPU: 60-190 s each), longest first. pytest-xdist hands out
#: files with the most tests first (its default), which left these, with two or three
#: tests each, for the end of a run, one process running a two-minute file alone while
#: the others had finished. They start first; every other file follows in its
#: collection order (``--no-loadscope-reorder`` in pyproject.toml).
LONGEST_FIRST = (
    "tests/fidelity/test_fidelity_state.py",
    "tests/test_bench_smoke.py",
    "tests/fidelity/test_fidelity_edits.py",
    "tests/test_postgres_kernels.py",
    "tests/test_library_objects.py",
    "tests/test_llm_kernel.py",
    "tests/test_clients.py",
    "tests/test_sidebar.py",
    "tests/test_cell_marks.py",
    "tests/test_verify.py",
    "tests/test_faults.py",
    "tests/test_approval_kernels.py",
    "tests/test_run_exits.py",
    "tests/test_browser.py",
    "tests/test_memory.py",
    "tests/test_engine.py",
    "tests/test_db_writes.py",
    "tests/test_approval_browser.py",
)


def pytest_collection_modifyitems(config, items):
    """Put the files of :data:`LONGEST_FIRST` first, in that order (a stable sort: the
    tests of a file keep theirs)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
