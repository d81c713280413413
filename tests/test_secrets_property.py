"""No planted secret reaches the store or an export, on either engine (a seeded property).

Secrets of every format the redaction knows (OpenAI, Anthropic, AWS, GitHub,
Google, Slack, Stripe, JWTs, ``Authorization`` Bearer and Basic credentials,
a URL's password, a URL's ``key``/``token``/``password`` value) and values of
secret-looking environment variables are drawn at random from a seed, then
planted at random positions, after random delimiters, into everything a
notebook controls: printed output (stdout, stderr, a display, a cell's
result), values (strings, nested structures, ``bytes`` and ``bytearray`` of
random lengths, a large ``bytes``), variable names, step names, sub-step ids,
arguments and results (``step()`` and ``@recorded``), URLs, errors (a
message long enough to be cut), and HTTP requests and responses of a
``--http`` step (an echo server on 127.0.0.1 sends every request header back
as a response header and in its body).

One real kernel runs the notebook per engine (a diskcache directory, a
PostgreSQL namespace); then every byte of the store (every file; every row of
every table of the namespace) and every export (``status``, ``status --json``,
``export``, ``export --values``, ``export --format jsonl``) is searched for each
secret and for its first half: none may be found.

The seed is ``NBDURABLE_SEED`` if set, else drawn anew; a failure names it,
so ``NBDURABLE_SEED=<seed> pytest tests/test_secrets_property.py`` repeats it.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import random
import string
import threading
from pathlib import Path

import pytest
from kernel_util import make_notebook, run_notebook

pytestmark = pytest.mark.kernel

SEED = int(os.environ.get("NBDURABLE_SEED") or random.SystemRandom().randrange(2**32))

_ALNUM = string.ascii_letters + string.digits
_UPPER = string.ascii_uppercase + string.digits


def _run(rng: random.Random, chars: str, n: int) -> str:
    """``n`` random ``chars`` holding a digit and a letter (every format that requires one)."""
    out = [rng.choice(chars) for _ in range(n)]
    out[rng.randrange(n)] = rng.choice(string.digits)
    return "".join(out)


def draw_secrets(rng: random.Random) -> dict[str, tuple[str, str]]:
    """``{kind: (secret, how it is written)}``; the second holds the first in its context."""
    b64 = base64.urlsafe_b64encode
    jwt = ".".join(
        "eyJ" + b64(json.dumps(part).encode()).decode().rstrip("=")[3:]
        for part in ({"alg": "HS256", "n": _run(rng, _ALNUM, 8)}, {"sub": _run(rng, _ALNUM, 12)})
    )
    jwt += "." + _run(rng, _ALNUM + "_-", 32)
    basic = base64.b64encode(f"user{rng.randrange(99)}:{_run(rng, _ALNUM, 14)}".encode()).decode()
    bearer = _run(rng, _ALNUM, 32)
    password = _run(rng, _ALNUM, 14)
    query = _run(rng, _ALNUM, 20)
    keys = {
        "openai": "sk-proj-" + _run(rng, _ALNUM + "_-", 40),
        "anthropic": "sk-ant-api03-" + _run(rng, _ALNUM + "_-", 40),
        "aws": "AKIA" + _run(rng, _UPPER, 16),
        "github": "ghp_" + _run(rng, _ALNUM, 36),
        "google": "AIza" + _run(rng, _ALNUM + "_-", 35),
        "slack": "xoxb-" + _run(rng, string.digits, 12) + "-" + _run(rng, _ALNUM, 24),
        "stripe": "sk_live_" + _run(rng, _ALNUM, 24),
        "jwt": jwt,
    }
    out = {kind: (key, key) for kind, key in keys.items()}
    out["bearer"] = (bearer, f"Authorization: Bearer {bearer}")
    out["basic"] = (basic, f"Authorization: Basic {basic}")
    out["userinfo"] = (password, f"https://me:{password}@api.example.com/v1")
    name = rng.choice(["key", "token", "password", "api_key"])
    out["query"] = (query, f"https://api.example.com/v1/ask?q=1&{name}={query}")
    # environment secrets: of any shape (one fit for a name), read by the notebook
    out["env"] = (_run(rng, _ALNUM + "-.~", 28), "")
    out["env_name"] = ("Tk" + _run(rng, _ALNUM, 22), "")
    return out


#: Characters that end a key as far as the user is concerned: after any of them a
#: key is still a key. (Inside a word, ``xsk-proj-...`` is no key by any rule.)
_DELIMS = [
    " ",
    "=",
    "/",
    ":",
    "\n",
    "\t",
    "(",
    "'",
    '"',
    ",",
    ";",
    ".",
    "@",
    "#",
    "|",
    "{",
    "?key=",
]


def planter(rng: random.Random, secrets: dict[str, tuple[str, str]]):
    """``plant(kind)``: random words, a delimiter, the secret as written, a delimiter, words."""

    def words(n: int) -> str:
        return " ".join(
            "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9)))
            for _ in range(n)
        )

    def plant(kind: str, before: int | None = None) -> str:
        secret, written = secrets[kind]
        if kind.startswith("env"):  # found as a substring: glued to anything
            written = secret
            left, right = rng.choice(["", "x", " ", "="]), rng.choice(["", "y", " ", "&"])
        else:
            left, right = rng.choice(_DELIMS), rng.choice(_DELIMS)
            if kind in ("aws", "google") and left in "/=" and right in "/=+":
                # between base64 characters on both sides, an AWS id or a Google key is
                # taken for part of a base64 run (a documented limit): one side plain
                right = rng.choice(_DELIMS[4:])
        head = words(rng.randint(0, 12) if before is None else before)
        return head + left + written + right + words(rng.randint(0, 12))

    return plant


def build_cells(rng: random.Random, secrets: dict[str, tuple[str, str]], echo: str) -> list[str]:
    """The notebook: setup, then one cell per way a secret gets in."""
    plant = planter(rng, secrets)
    kinds = list(secrets)
    env_of = {"env": "PROP_API_KEY", "env_name": "PROP_SERVICE_TOKEN"}

    def lit(kind: str, before: int | None = None) -> str:
        """An expression for a planted text: a literal, or built from the environment."""
        text = plant(kind, before)
        if kind in env_of:
            secret = secrets[kind][0]
            a, b = text.split(secret, 1)
            return f"({a!r} + os.environ[{env_of[kind]!r}] + {b!r})"
        return repr(text)

    cells = [
        "%load_ext nbdurable\nimport os, sys, requests\nfrom nbdurable import step, recorded\n"
        "def echo(x):\n    return x\n"
        "def size(x):\n    return len(x)\n"
        "@recorded\ndef passthrough(x):\n    return x"
    ]
    # printed output: stdout, stderr, a display and the cell's own result
    body = ["%%step printed"]
    for kind in kinds:
        body.append(f"print({lit(kind)})")
        body.append(f"sys.stderr.write({lit(kind)} + '\\n')")
    body.append(f"display({lit(rng.choice(kinds))})")
    body.append(lit(rng.choice(kinds)))
    cells.append("\n".join(body))
    # values: strings, nested structures, bytes of random lengths, a large bytes;
    # and a plain value beside them, which is recorded
    body = ["%%step held", "plain = 41 + 1"]
    for i, kind in enumerate(kinds):
        body.append(f"s_{i} = {lit(kind)}")
        body.append(
            f"nest_{i} = {{'a': [1, ({lit(kind)}, {{'b': {lit(kind)}}})], 'c': {{{lit(kind)}}}}}"
        )
        # (a random length: the pickle's length byte before the secret is any letter)
        body.append(f"b_{i} = {lit(kind, before=0)}.encode() + b'.' * {rng.randint(0, 300)}")
        body.append(f"ba_{i} = bytearray({lit(kind)}.encode())")
    at = rng.randrange(2_000_000)
    big = rng.choice(kinds)
    body.append(f"large = bytearray(2_000_000); large[{at}:{at}] = {lit(big)}.encode()")
    body.append("large = bytes(large)")
    cells.append("\n".join(body))
    # variable names, and a step name, holding an identifier-shaped secret
    names = [secrets[k][0] for k in ("github", "aws", "stripe")] + ["Tk_" + secrets["env_name"][0]]
    cells.append("%%step named\n" + "\n".join(f"{n} = {i}" for i, n in enumerate(names)))
    cells.append("%%step reads_named\ntotal = " + " + ".join(names))  # names as inputs
    for kind in ("openai", "aws", "jwt", "env_name"):
        cells.append(f"%%step ask_{secrets[kind][0]}\nx = 1")
    # sub-step ids (refused), arguments and results
    body = ["%%step subs"]
    for kind in kinds:
        body.append(
            f"try:\n    step('ask:' + {lit(kind)}, size, 'x')\nexcept ValueError:\n    pass"
        )
        body.append(f"n_{kind} = step('size_{kind}', size, {lit(kind)})")
        body.append(f"r_{kind} = step('echo_{kind}', echo, {lit(kind)})")
        body.append(f"p_{kind} = passthrough({lit(kind)})")
    body.append(f"raw = step('raw', echo, {lit(rng.choice(kinds))}.encode())")
    cells.append("\n".join(body))
    # errors: a message long enough to be cut, the secret anywhere (across the cut too)
    for kind in kinds:
        cells.append(
            f"%%step fails_{kind}\nraise RuntimeError({lit(kind, before=rng.randint(0, 90))})"
        )
    # HTTP: the request's URL, headers and body hold secrets; the echo sends them back
    body = ["%%step --http web"]
    for kind in kinds:
        # (in a URL, a space would be sent as %20: a credential after its label is planted
        # as a token= value there, so that what is searched for is what is sent)
        if kind in env_of:
            url = f"{echo!r} + '/echo?x=1&token=' + os.environ[{env_of[kind]!r}]"
        elif kind in ("bearer", "basic"):
            url = repr(f"{echo}/echo?x=1&token={secrets[kind][0]}")
        else:
            url = repr(f"{echo}/echo?x=1&note={secrets[kind][1]}")
        body.append(
            f"got = requests.post({url}, "
            f"headers={{'Authorization': 'Bearer ' + {lit(kind)}.split()[-1], "
            f"'X-Note': ' '.join({lit(kind)}.split())}}, data={lit(kind)}.encode())"
        )
        body.append(f"reply_{kind} = len(got.content)")
    cells.append("\n".join(body))
    return cells


class _Echo(http.server.BaseHTTPRequestHandler):
    """Every request header back as ``X-Echo-<name>``; path, headers and body in the body."""

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        reply = json.dumps(
            {"path": self.path, "headers": dict(self.headers), "body": body.decode("latin-1")}
        ).encode()
        self.send_response(200)
        for k, v in self.headers.items():
            self.send_header(f"X-Echo-{k}", v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _exports(nb: Path, capsys) -> str:
    from nbdurable import cli

    said = []
    for argv in (
        ["status", str(nb)],
        ["status", str(nb), "--json"],
        ["export", str(nb)],
        ["export", str(nb), "--values"],
        ["export", str(nb), "--values", "--format", "jsonl"],
    ):
        code = cli.main(argv)
        out = capsys.readouterr()
        assert code == 0, (SEED, argv, out.err)
        said.append(out.out + out.err)
    return "\n".join(said)


def _leaks(secrets: dict[str, tuple[str, str]], where: str, data: bytes) -> list[str]:
    """``kind in where`` for every secret (or the first half of one) found in ``data``."""
    found = []
    for kind, (secret, _) in secrets.items():
        for part in (secret, secret[: len(secret) // 2]):
            if part.encode() in data:
                at = data.find(part.encode())
                found.append(f"{kind} in {where}: ...{data[max(0, at - 80) : at + 20]!r}")
                break
    return found


def _pg_bytes(url: str) -> bytes:
    from pg_util import namespace, pg_sql

    ns = namespace(url)
    out = []
    for (table,) in pg_sql(
        url, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (ns,)
    ):
        for row in pg_sql(url, f'SELECT * FROM "{ns}"."{table}"'):
            for cell in row:
                out.append(
                    bytes(cell) if isinstance(cell, bytes | memoryview) else str(cell).encode()
                )
    return b"\n".join(out)


def _planted_run(tmp_path: Path, store: str, echo: str, capsys, monkeypatch) -> list[str]:
    import nbformat

    rng = random.Random(SEED)
    secrets = draw_secrets(rng)
    nb_path = tmp_path / "planted.ipynb"
    nb = make_notebook(build_cells(rng, secrets, echo))
    nbformat.write(nb, nb_path)
    env = {
        "NBDURABLE_STORE": store,
        "NBDURABLE_NOTEBOOK": str(nb_path),
        "PROP_API_KEY": secrets["env"][0],
        "PROP_SERVICE_TOKEN": secrets["env_name"][0],
        "NO_PROXY": "127.0.0.1",
    }
    out = run_notebook(nb, cwd=tmp_path, env=env, allow_errors=True, timeout=120)
    ran = [c for c in out.cells if c.get("outputs")]
    assert len(ran) > 5, (SEED, "the notebook did not run")
    web = out.cells[-1].outputs
    assert not any(o.get("output_type") == "error" for o in web), (SEED, web)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return secrets, _exports(nb_path, capsys)


def test_no_planted_secret_reaches_the_disk_store(tmp_path, echo_server, capsys, monkeypatch):
    store = tmp_path / "store"
    secrets, said = _planted_run(tmp_path, str(store), echo_server, capsys, monkeypatch)
    found = _leaks(secrets, "the exports", said.encode())
    files = [p for p in store.rglob("*") if p.is_file()]
    assert files, "the store was written"
    for path in files:
        found += _leaks(secrets, str(path.relative_to(store)), path.read_bytes())
    assert not found, f"NBDURABLE_SEED={SEED}:\n" + "\n".join(found)


@pytest.mark.postgres
def test_no_planted_secret_reaches_the_postgres_store(
    tmp_path, pg_url, echo_server, capsys, monkeypatch
):
    secrets, said = _planted_run(tmp_path, pg_url, echo_server, capsys, monkeypatch)
    found = _leaks(secrets, "the exports", said.encode())
    data = _pg_bytes(pg_url)
    assert data, "the store was written"
    found += _leaks(secrets, "a row", data)
    # blobs too large for a row live in files beside nothing: the namespace is all
    assert not found, f"NBDURABLE_SEED={SEED}:\n" + "\n".join(found)
