"""Secrets from the environment never reach the store (real kernels).

An API key lives in ``OPENAI_API_KEY``; a step holds it in a variable, a
model response echoes it, and a cell prints it. After the run not one byte
of the store directory contains it; the warnings name the step, the
variable and the environment variable, never the secret; the sub-step whose
response held the key is called again next time, the clean one replays.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text

pytestmark = pytest.mark.kernel

SECRET = "sk-test-0123456789abcdefSECRET"

CELLS = [
    "%load_ext nbdurable\n"
    "import os\n"
    "from nbdurable import step\n"
    "def _count(what):\n"
    "    with open(os.environ['CALLS'], 'a') as f:\n"
    "        f.write(what + '\\n')\n"
    "def leaky_model(prompt):\n"
    "    _count('leaky')\n"
    "    return f\"echo {prompt} (auth {os.environ['OPENAI_API_KEY']})\"\n"
    "def clean_model(prompt):\n"
    "    _count('clean')\n"
    "    return f'answer to {prompt}'",
    "%%step creds\napi_key = os.environ['OPENAI_API_KEY']\nsettings = {'model': 'small'}",
    "%%step ask\n"
    "r1 = step('leaky', leaky_model, 'hi')\n"
    "r2 = step('clean', clean_model, 'hi')\n"
    "print(r2)",
    "%%step show\nprint('token:', os.environ['OPENAI_API_KEY'])",
]


def _store_bytes(store: Path) -> bytes:
    return b"".join(p.read_bytes() for p in store.rglob("*") if p.is_file())


def test_secrets_are_never_written(tmp_path):
    calls = tmp_path / "calls.log"
    env = {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "secrets.ipynb"),
        "OPENAI_API_KEY": SECRET,
        "CALLS": str(calls),
    }
    first = run_notebook(make_notebook(CELLS), cwd=tmp_path, env=env)
    store = tmp_path / "store"
    data = _store_bytes(store)
    assert data, "the store was written"
    assert SECRET.encode() not in data, "the secret reached the store"

    warnings = "".join(stream_text(outputs_of(first, i), "stderr") for i in range(1, 4))
    assert SECRET not in warnings, "a warning showed the secret"
    assert "step 'creds'" in warnings and "api_key (the value of $OPENAI_API_KEY)" in warnings
    assert "sub-step 'leaky' of step 'ask'" in warnings and "$OPENAI_API_KEY" in warnings
    assert "step 'show': its outputs or source showed the value of $OPENAI_API_KEY" in warnings
    assert calls.read_text().split() == ["leaky", "clean"]

    second = run_notebook(make_notebook(CELLS), cwd=tmp_path, env=env)
    assert SECRET.encode() not in _store_bytes(store)
    # The call whose result held the key was not recorded: it runs again.
    # The clean call replays.
    assert calls.read_text().split() == ["leaky", "clean", "leaky"]
    # `settings` beside the secret was recorded and restored; `show` replays
    # its output with the secret redacted.
    shown = stream_text(outputs_of(second, 3))
    assert "[redacted $OPENAI_API_KEY]" in shown and SECRET not in shown


# -- keys typed literally into the notebook ---------------------------------------------

LITERAL = {
    "openai": "sk-proj-Zq81literalKEYforTHEtest0123456789",
    "anthropic": "sk-ant-api03-literalKEYforTHEtest0123456789",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "a1B2" * 9,
    "google": "AIza" + "Sy0123456789abcdefghijklmnopqrstuvw",
}


def literal_cells(base_url: str) -> list[str]:
    return [
        "%load_ext nbdurable\nimport openai\nfrom nbdurable import step",
        # a plain cell is never recorded: the client's key stays in the kernel
        f"client = openai.OpenAI(api_key={LITERAL['openai']!r}, base_url={base_url!r})",
        "%%step lit\n"
        f"claude_key = {LITERAL['anthropic']!r}\n"
        "model = 'small'\n"
        f"print('aws', {LITERAL['aws']!r}, 'gh', {LITERAL['github']!r})\n"
        "r = step('ask', client.chat.completions.create, model=model,\n"
        "         messages=[{'role': 'user', 'content': 'hello'}])\n"
        f"echo = step('echo', lambda: 'key ' + {LITERAL['google']!r})\n"
        "print(r.choices[0].message.content)",
    ]


def test_literal_keys_are_never_written(tmp_path):
    from llm_server import LLMServer

    pytest.importorskip("openai")
    env = {
        "NBDURABLE_DIR": str(tmp_path / "store"),
        "NBDURABLE_NOTEBOOK": str(tmp_path / "keys.ipynb"),
    }
    with LLMServer(lifetime=300) as server:
        cells = literal_cells(server.openai_base_url)
        first = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
        assert server.total == 1
        store = tmp_path / "store"
        data = _store_bytes(store)
        for kind, key in LITERAL.items():
            assert key.encode() not in data, f"the literal {kind} key reached the store"
        warnings = stream_text(outputs_of(first, 2), "stderr")
        assert "step 'lit'" in warnings
        assert "claude_key (a literal anthropic key)" in warnings
        assert "sub-step 'echo' of step 'lit' returned a value holding a literal google key" in (
            " ".join(warnings.split())
        )
        said = "showed literal anthropic, aws, github and google keys; it was recorded as [redact"
        assert said in " ".join(warnings.split())
        for kind, key in LITERAL.items():
            assert key not in warnings, f"a warning showed the {kind} key"
        # every file of the store is its owner's alone
        modes = {p.name: p.stat().st_mode & 0o777 for p in store.rglob("*") if p.is_file()}
        assert modes and set(modes.values()) == {0o600}, modes

        # `claude_key` was not saved: the body runs again, the model call replays
        second = run_notebook(make_notebook(cells), cwd=tmp_path, env=env)
        assert server.total == 1
        shown = stream_text(outputs_of(second, 2))
        assert "aws [redacted aws key] gh [redacted github key]" not in shown  # ran again: real
        assert f"aws {LITERAL['aws']} gh {LITERAL['github']}" in shown
        assert stream_text(outputs_of(first, 2)).splitlines()[-1] == shown.splitlines()[-1]
        data = _store_bytes(store)
        for key in LITERAL.values():
            assert key.encode() not in data


def test_settings_never_show_a_store_password():
    """``configure()`` returns its Settings, which a notebook prints (and a step records)."""
    from nbdurable.config import Settings

    shown = repr(Settings(store="postgresql://me:s3cret@db:5432/team?namespace=a&password=p4ss"))
    assert "s3cret" not in shown and "p4ss" not in shown, shown
    assert "postgresql://me:***@db:5432/team?namespace=a&password=***" in shown, shown


def _write_paths(kind: str) -> list[str]:
    """The cells that plant the key of ``kind`` (``KEY_<kind>``) in every write path."""
    k = f"KEY_{kind}"
    return [
        f"{k} = os.environ['LEAKED_{kind.upper()}']",
        # after '=' in printed output and in a URL the step prints
        f"%%step prints_{kind}\nprint('api_key=' + {k})\n"
        f"print('https://api.example.com/v1?api_key=' + {k})",
        # bytes of a length whose pickle puts a letter or digit just before the key
        f"%%step raw_{kind}\nblob51 = ({k} + ' ' * 60).encode()[:51]\n"
        f"blob80 = ({k} + ' ' * 90).encode()[:80]",
        # a sub-step id holding the key: refused in one line, nothing recorded under it
        f"%%step ids_{kind}\nstep(f'ask:{{{k}}}', len, 'x')",
        # a failure whose message holds the key across the 500th character
        f"%%step fails_{kind}\nraise RuntimeError('x' * 480 + ' auth failed for key ' + {k})",
    ]


#: One key of each format the redaction knows, built from pieces (no key-shaped literal
#: in the source), each long enough that its first 30 characters are still telling.
PLANTED = {
    "openai": "sk-" + "proj-" + "Lk9Jh8Gf7Ds6Aq5Wz4Xc3Vb2Nm1" * 3,
    "anthropic": "sk-ant-" + "api03-" + "Qw1Er2Ty3Ui4Op5As6Df7Gh8Jk9" * 2,
    "github": "ghp_" + "Zx9Cv8Bn7Ml6Kj5Hg4Fd3Sa2Qw1Er0Ty9Ui8",
    "google": "AIza" + "SyB-9876543210zyxwvutsrqponmlkjihgf",
    "slack": "xoxb-" + "210987654321-" + "QwErTyUiOpAsDfGhJkLz",
    "stripe": "sk_" + "live_" + "51HzQwErTyUiOpAsDfGhJkLzXc",
}


def test_a_literal_key_leaks_through_no_write_path(tmp_path, capsys, monkeypatch):
    """Each key format, planted in printed output (after ``=``, in a URL), in bytes of
    awkward lengths, in a sub-step id and in a failure's message, in one kernel: nothing
    of any reaches the store, ``status`` or ``export``."""
    import nbformat

    from nbdurable import cli

    store = tmp_path / "store"
    env = {"NBDURABLE_DIR": str(store), "NBDURABLE_NOTEBOOK": str(tmp_path / "nb.ipynb")}
    env.update({f"LEAKED_{kind.upper()}": key for kind, key in PLANTED.items()})
    cells = ["%load_ext nbdurable\nimport os\nfrom nbdurable import step"]
    for kind in PLANTED:
        cells += _write_paths(kind)
    nb = make_notebook(cells)
    nbformat.write(nb, tmp_path / "nb.ipynb")
    out = run_notebook(nb, cwd=tmp_path, env=env, allow_errors=True, timeout=300)
    stored = _store_bytes(store)
    monkeypatch.setenv("NBDURABLE_DIR", str(store))
    monkeypatch.delenv("NBDURABLE_NOTEBOOK", raising=False)
    said = ""
    for argv in (["status", str(tmp_path / "nb.ipynb"), "--json"],
                 ["export", str(tmp_path / "nb.ipynb"), "--values"]):  # fmt: skip
        assert cli.main(argv) == 0
        said += capsys.readouterr().out
    for i, (kind, key) in enumerate(PLANTED.items()):
        refused = stream_text(outputs_of(out, 1 + 5 * i + 3), "stderr")
        assert refused.startswith(f"UsageError: a sub-step id holds a literal {kind} key"), (
            kind,
            refused,
        )
        assert key not in refused
        assert key.encode() not in stored and key[:30].encode() not in stored, kind
        assert key[:30] not in said, kind
        assert f"[redacted {kind} key]" in said, kind  # its failure, as export shows it
