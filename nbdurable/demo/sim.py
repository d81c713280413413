"""A simulated model, search engine and mail provider that work offline.

They behave like the real things where it matters for durable execution:
every call returns different text (non-deterministic), takes time, and costs
tokens. Each real call is appended to a ledger file (``NBDURABLE_SIM_LEDGER``,
one JSON line per call, fsynced), so a demo or a test can count exactly which
calls were made, across kernel crashes.

``NBDURABLE_SIM_CRASH_AT=N`` kills the kernel (``os._exit``) in the middle of
the N-th answer call, once: a marker file beside the ledger remembers that the
crash happened, so the resumed run goes through.

The mail provider deduplicates on the idempotency key, like real email,
payment and queue APIs: a second send with the same key is a no-op that
returns the first send's receipt.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

#: Price per 1,000 tokens, a plausible mid-size model (input and output alike).
PRICE_PER_1K_TOKENS = 0.01
_WORDS = (
    "durable replay ledger agent retrieval evidence latency budget token cache "
    "checkpoint source claim summary finding risk cost trend signal model".split()
)


def _latency() -> float:
    return float(os.environ.get("NBDURABLE_SIM_LATENCY", "0.02"))


def _ledger() -> Path | None:
    p = os.environ.get("NBDURABLE_SIM_LEDGER")
    return Path(p) if p else None


def digest(text: str) -> str:
    """A short hash of a returned text, as written in the ledger's ``out`` field."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _log(kind: str, arg: str, tokens: int, out: str = "") -> None:
    path = _ledger()
    if path is None:
        return
    entry = {"kind": kind, "arg": arg, "tokens": tokens, "out": out, "t": time.time()}
    line = json.dumps(entry)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _text(n_words: int) -> str:
    rnd = random.Random(uuid.uuid4().int)
    return " ".join(rnd.choice(_WORDS) for _ in range(n_words)) + f" [{uuid.uuid4().hex[:8]}]"


def _call(kind: str, arg: str, words: int, sleep: bool = True) -> tuple[str, int]:
    tokens = words * 4 // 3 + len(arg) // 4 + 20
    text = _text(words)
    _log(kind, arg, tokens, digest(text))
    if sleep:
        time.sleep(_latency())
    return text, tokens


def llm_plan(topic: str, n: int = 60) -> dict[str, Any]:
    """Plan a research run: a title and ``n`` subquestions."""
    title, tokens = _call("plan", topic, 12)
    qs = [f"Q{i + 1}: what does the evidence say about {topic}, angle {i + 1}?" for i in range(n)]
    return {"title": f"{topic}: {title}", "subquestions": qs, "tokens": tokens}


def search_web(query: str) -> list[str]:
    """Three snippets for ``query``."""
    text, _ = _call("search", query, 30)
    return [text[:60], text[60:120], text[120:]]


_answer_lock = threading.Lock()


def llm_answer(question: str, docs: list[str]) -> str:
    """Answer ``question`` from ``docs``; may crash the kernel (see module docstring)."""
    crash_at = os.environ.get("NBDURABLE_SIM_CRASH_AT")
    ledger = _ledger()
    if crash_at and ledger is not None:
        # Counting and logging under one lock: answers made from several
        # threads at once (asyncio.to_thread, a pool) must not both see N-1.
        with _answer_lock:
            answers = _count(ledger, "answer")
            marker = ledger.with_suffix(".crashed")
            if answers + 1 == int(crash_at) and not marker.exists():
                _log("answer", question, 0)  # the call was made; its result never returns
                marker.write_text("crashed\n")
                os._exit(137)
            text, _tokens = _call("answer", question, 60, sleep=False)
        time.sleep(_latency())
        return text
    text, _ = _call("answer", question, 60)
    return text


def llm_synthesize(topic: str, findings: list[str]) -> str:
    """A report over all findings."""
    text, _ = _call("synthesize", topic, 120)
    return f"Report on {topic} ({len(findings)} findings): {text}"


def _count(ledger: Path, kind: str) -> int:
    if not ledger.exists():
        return 0
    with open(ledger, encoding="utf-8") as f:
        return sum(1 for line in f if json.loads(line)["kind"] == kind)


def ledger_calls(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every call in a ledger file, in order."""
    p = Path(path)
    if not p.exists():
        return []
    with open(p, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class MailProvider:
    """A local mail API that deduplicates on idempotency keys (SQLite file)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = str(path or os.environ.get("NBDURABLE_SIM_MAILBOX", "mailbox.sqlite"))
        with closing(sqlite3.connect(self.path)) as con, con:
            con.execute(
                "CREATE TABLE IF NOT EXISTS sent (key TEXT PRIMARY KEY, id TEXT, "
                "recipient TEXT, body TEXT, at REAL)"
            )
            con.execute("CREATE TABLE IF NOT EXISTS attempts (key TEXT, at REAL)")

    def send(self, to: str, body: str, idempotency_key: str) -> dict[str, Any]:
        """Send once per key; a repeated key returns the original receipt."""
        with closing(sqlite3.connect(self.path)) as con, con:
            con.execute("INSERT INTO attempts VALUES (?, ?)", (idempotency_key, time.time()))
            row = con.execute("SELECT id FROM sent WHERE key = ?", (idempotency_key,)).fetchone()
            if row:
                return {"id": row[0], "duplicate": True}
            msg_id = "msg-" + uuid.uuid4().hex[:12]
            con.execute(
                "INSERT INTO sent VALUES (?, ?, ?, ?, ?)",
                (idempotency_key, msg_id, to, body, time.time()),
            )
            return {"id": msg_id, "duplicate": False}

    def delivered(self) -> int:
        """How many messages were actually delivered."""
        with closing(sqlite3.connect(self.path)) as con, con:
            return int(con.execute("SELECT COUNT(*) FROM sent").fetchone()[0])

    def attempts(self) -> int:
        """How many send calls reached the provider."""
        with closing(sqlite3.connect(self.path)) as con, con:
            return int(con.execute("SELECT COUNT(*) FROM attempts").fetchone()[0])


def cost(tokens: int) -> float:
    """Dollars for ``tokens`` at :data:`PRICE_PER_1K_TOKENS`."""
    return tokens / 1000 * PRICE_PER_1K_TOKENS
