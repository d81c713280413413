"""Tokens saved by replay equal the tokens the server reported, everywhere they are shown.

A notebook makes OpenAI and Anthropic calls, plain and streamed, through the
real SDKs against tests/llm_server.py (which sums the usage it reports).
Run once by ``nbdurable run`` (everything made), then again (everything
replayed): the second run's summary, its ``--json``, ``%step list``, the
panel's text and the replay notes say the tokens saved, and they equal the
server's totals; with ``configure(prices=...)`` the cost is those tokens at
those prices. A step whose body runs again (it keeps a lock, which cannot
be saved) counts the tokens of the sub-steps it replays.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from kernel_util import REPO_ROOT, kernel_name, make_notebook
from llm_server import LLMServer

pytestmark = pytest.mark.kernel

pytest.importorskip("openai")
pytest.importorskip("anthropic")

PRICES = {"m": (0.5, 1.5), "c": (3.0, 15.0)}


def cells(server: LLMServer) -> list[str]:
    o, a = server.openai_base_url, server.anthropic_base_url
    msg = "[{'role': 'user', 'content': %r}]"
    return [
        "%load_ext nbdurable\nimport threading, openai, anthropic, nbdurable\n"
        "from nbdurable import step\n"
        f"nbdurable.configure(prices={PRICES!r})\n"
        f"client = openai.OpenAI(api_key='sk-test', base_url={o!r})\n"
        f"claude = anthropic.Anthropic(api_key='sk-ant-test', base_url={a!r})",
        "%%step plain\n"
        "r = step('o', client.chat.completions.create, model='m-2024',\n"
        f"         messages={msg % 'one two'})\n"
        "print('USAGE m', r.usage.prompt_tokens, r.usage.completion_tokens)\n"
        "m = step('a', claude.messages.create, model='c', max_tokens=9,\n"
        f"         messages={msg % 'three'})\n"
        "print('USAGE c', m.usage.input_tokens, m.usage.output_tokens)",
        "%%step streamed\n"
        "lock = threading.Lock()  # cannot be saved: this body runs on every run\n"
        f"s = step('os', client.chat.completions.create, model='m', messages={msg % 'four'},\n"
        "         stream=True, stream_options={'include_usage': True})\n"
        "chunks = list(s)\n"
        "print('USAGE m', chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens)\n"
        f"with step('as', claude.messages.stream, model='c', max_tokens=9,\n"
        f"          messages={msg % 'five six'}) as st:\n"
        "    final = st.get_final_message()\n"
        "print('USAGE c', final.usage.input_tokens, final.usage.output_tokens)",
        "%step list",
        "from nbdurable.durable.session import run_summary\nprint(run_summary()['tokens'])",
    ]


def usage_lines(text: str) -> list[tuple[str, int, int]]:
    """The ``USAGE model input output`` lines a cell printed."""
    return [(m, int(i), int(o)) for m, i, o in re.findall(r"^USAGE (\S+) (\d+) (\d+)$", text, re.M)]


def nbd(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NBDURABLE_", "JPY_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["NBDURABLE_DIR"] = str(cwd / "store")
    return subprocess.run(
        [sys.executable, "-m", "nbdurable", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_tokens_saved_equal_the_servers_usage(tmp_path):
    kernel_name()
    with LLMServer(lifetime=600) as server:
        nb = tmp_path / "llm.ipynb"
        nbformat.write(make_notebook(cells(server)), nb)
        first = nbd("run", nb, "--json", "--output", tmp_path / "first.ipynb", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert server.total == 4
        assert json.loads(first.stdout)["tokens_saved"] == {"input": 0, "output": 0}
        made = nbformat.read(tmp_path / "first.ipynb", as_version=4)
        per_cell = [usage_lines("".join(o.get("text", "") for o in c.outputs)) for c in made.cells]
        replies = per_cell[1] + per_cell[2]
        # the SDK objects report what the server counted
        used = server.stats()["usage"]
        want = {"input": used["input_tokens"], "output": used["output_tokens"]}
        assert want == {
            "input": sum(i for _, i, _ in replies),
            "output": sum(o for _, _, o in replies),
        }
        total = want["input"] + want["output"]
        price = sum(i / 1000 * PRICES[m][0] + o / 1000 * PRICES[m][1] for m, i, o in replies)

        second = nbd("run", nb, "--json", "--output", tmp_path / "out.ipynb", cwd=tmp_path)
        assert second.returncode == 0, second.stderr
        assert server.total == 4, "the second run sent requests"
        summary = json.loads(second.stdout)
        assert summary["tokens_saved"] == want
        assert summary["cost_saved"] == pytest.approx(price, rel=1e-6)

        out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
        texts = ["".join(o.get("text", "") for o in c.outputs) for c in out.cells]
        assert usage_lines(texts[1]) + usage_lines(texts[2]) == replies  # identical replies
        # %step list: the kernel's line, and a tokens column per step
        listing = texts[3].splitlines()
        assert f"{total:,} tokens" in listing[0]
        head = re.split(r"\s{2,}", listing[1])
        assert head[6] == "tokens"
        by_step = {re.split(r"\s{2,}", r)[1]: re.split(r"\s{2,}", r)[6] for r in listing[2:]}
        step_tokens = [sum(i + o for _, i, o in lines) for lines in per_cell[1:3]]
        assert by_step == {"plain": f"{step_tokens[0]:,}", "streamed": f"{step_tokens[1]:,}"}
        notes = [
            o["data"]["text/plain"]
            for o in out.cells[1].outputs
            if o.get("output_type") == "display_data"
        ]
        assert len(notes) == 1 and f"{step_tokens[0]:,} tokens" in notes[0]
        assert texts[4].strip() == repr(want)

        # the human summary says it too
        third = nbd("run", nb, "--output", tmp_path / "third.ipynb", cwd=tmp_path)
        assert third.returncode == 0 and server.total == 4
        assert f"{total:,} tokens (${price:.4f}) saved" in third.stdout + third.stderr
