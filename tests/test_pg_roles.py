"""One namespace per team, least privilege: a team's role cannot read or write another's.

A server of the test's own (``private_pg``), set up as docs/postgres.md's "One
namespace per team" tells an administrator to: the administrator opens each
team's namespace once (which creates its tables) and grants the team's role
the rights to use its rows and nothing more. Each role then records and
replays in its own namespace; in the other team's, opening is refused in one
line and no row is read or written; nor can a team role create a namespace
of its own.
"""

from __future__ import annotations

import psycopg
import pytest

from nbdurable.errors import StoreError
from nbdurable.store import open_store

pytestmark = pytest.mark.postgres

#: What docs/postgres.md tells an administrator to run, per team (NS: the namespace).
GRANTS = (
    "CREATE ROLE {role} LOGIN",
    "REVOKE CREATE ON DATABASE postgres FROM PUBLIC",
    "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
    "GRANT USAGE ON SCHEMA {ns} TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {ns} TO {role}",
    "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {ns} TO {role}",
)


def _as(url: str, role: str, ns: str) -> str:
    return url.replace("postgres@", f"{role}@", 1) + f"?namespace={ns}"


def test_a_team_role_reaches_only_its_own_namespace(private_pg):
    admin = private_pg.url
    teams = {"team_a": "nbd_role_a", "team_b": "nbd_role_b"}
    for ns in teams:
        open_store(f"{admin}?namespace={ns}").close()  # the administrator creates it
    with psycopg.connect(admin, autocommit=True) as conn:
        for ns, role in teams.items():
            for sql in GRANTS:
                conn.execute(sql.format(role=role, ns=ns))

    # Each team records and reads back in its own namespace.
    for ns, role in teams.items():
        with open_store(_as(admin, role, ns)) as store:
            store.put("r/x/meta", {"kind": "run", "run": ns})
            assert store.get("r/x/meta")[0]["run"] == ns

    def rows() -> dict[str, int]:
        with psycopg.connect(admin) as conn:
            return {ns: conn.execute(f"SELECT count(*) FROM {ns}.kv").fetchone()[0] for ns in teams}

    before = rows()
    # ... and cannot open the other's, nor make a namespace of its own.
    for url in (_as(admin, "nbd_role_a", "team_b"), _as(admin, "nbd_role_b", "team_a"),
                _as(admin, "nbd_role_a", "team_c")):  # fmt: skip
        with pytest.raises(StoreError) as err:
            open_store(url).close()
        assert "permission denied" in str(err.value) and "\n" not in str(err.value), err.value
    with psycopg.connect(admin) as conn:
        made = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'team_c'"
        ).fetchone()[0]
    assert rows() == before and made == 0, (rows(), before, made)
