"""Helpers of the PostgreSQL tests: statements on the server beside the store under test."""

from __future__ import annotations

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
