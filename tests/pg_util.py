"""Helpers of the PostgreSQL tests: statements on the server beside the store under test,
and a server of a test's own (:class:`PrivateServer`) for the faults that stop one."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg

# Parameters of a store URL that are not libpq's.
_OURS = ("namespace", "chunk_size", "statement_timeout")


def pg_sql(url: str, sql: str, args: tuple = ()) -> list[tuple]:
    """Run one statement on the server of ``url`` (its own connection); its rows, if any."""
    parts = urlsplit(url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in _OURS])
    with psycopg.connect(parts._replace(query=query).geturl(), autocommit=True) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def namespace(url: str) -> str:
    """The namespace (PostgreSQL schema) of a store URL."""
    return dict(parse_qsl(urlsplit(url).query))["namespace"]


def terminate(url: str) -> int:
    """Terminate every server session of the store at ``url``; how many there were."""
    rows = pg_sql(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (f"nbdurable-{namespace(url)}",),
    )
    return len(rows)


class PrivateServer:
    """A PostgreSQL server of the test's own, to stop and restart at will.

    ``initdb`` in a fresh temporary directory, then ``pg_ctl`` on a free
    port of 127.0.0.1 (trust authentication, database ``postgres``), from the
    binaries of Debian's ``postgresql`` package (NBDURABLE_TEST_PG_BIN, else
    the newest ``/usr/lib/postgresql/*/bin``). PostgreSQL refuses to run as
    root, so as root every command runs as the ``postgres`` user (``runuser``).
    The shared server of the other tests is never touched.
    """

    def __init__(self, parent: str | None = None) -> None:
        self.bindir = _bindir()
        # Not pytest's tmp_path: as root, that is private to root and the server's
        # user could not enter it.
        self.dir = Path(tempfile.mkdtemp(prefix="nbd-pg-", dir=parent))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self.dir, "postgres")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        # --no-sync only speeds up creating the files; the server itself runs
        # with fsync and synchronous_commit on, as a real one does.
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [*self._as, str(self.bindir / tool), *args],
            cwd=self.dir,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{tool} {args} failed: {done.stdout}{done.stderr}{log[-2000:]}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session is ended at once; ``immediate``: a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Stop the server, ending every session, and start it again."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server if it runs, and remove its files."""
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def _bindir() -> Path:
    env = os.environ.get("NBDURABLE_TEST_PG_BIN")
    found = (
        [Path(env)]
        if env
        else sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    )
    if not found or not (found[-1] / "initdb").exists():
        raise RuntimeError(
            "no PostgreSQL binaries (initdb, pg_ctl) to start a server of the test's own: "
            "apt-get install postgresql, or set NBDURABLE_TEST_PG_BIN to their directory"
        )
    return found[-1]


class TurnCounter:
    """A TCP relay to a server that counts round trips: the client's turns to speak.

    Each time the client sends after the server last spoke is one round trip
    (the client waited for an answer before going on); statements the client
    queues and sends together, without waiting in between, count once.
    ``url`` is the store URL ``target`` with its host and port replaced by the
    relay's. Connections are relayed until :meth:`close`.
    """

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        user = f"{parts.username}@" if parts.username else ""
        self.url = parts._replace(netloc=f"{user}127.0.0.1:{port}").geturl()
        self.turns = 0
        self._lock = threading.Lock()
        self._server_spoke: dict[int, bool] = {}
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._socks += [client, server]
            self._server_spoke[id(client)] = True
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._relay, args=(src, dst, up, id(client)), daemon=True
                ).start()

    def _relay(self, src: socket.socket, dst: socket.socket, up: bool, conn: int) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self._lock:
                    if up and self._server_spoke[conn]:
                        self.turns += 1
                    self._server_spoke[conn] = not up
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def count(self) -> int:
        """Round trips so far (reset with ``turns = 0``)."""
        with self._lock:
            return self.turns

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
