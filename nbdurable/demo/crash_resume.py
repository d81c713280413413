"""``nbdurable demo``: the point of nbdurable in one command, on a fresh machine.

It copies the bundled research-agent notebook (sixty sub-questions, each a
search and an answer, then a synthesis and a mail) into a working directory,
and runs it with the simulated model, search and mail of :mod:`nbdurable.demo.sim`
(offline; different text on every call; latency; token counts):

1. a first attempt whose kernel is killed for real (``os._exit``) inside the
   answer call of sub-question ``crash_at`` (0-based, as in ``answer:40``);
2. the resume, through the same code as ``nbdurable run``.

With ``store`` (``nbdurable demo --store DIR_OR_URL``) both attempts record
into that store instead of one beside the notebook, in a run of the demo's
own, ``demo-<time>-<random>``, so that no earlier demo (or anyone's notebook)
on a shared store replays into it. A ``postgresql://`` team store needs
``NBDURABLE_KEY``: with the team's key set, the demo records in the URL's
namespace like any notebook; without one, it signs with :data:`DEMO_KEY` (a
public key, said so on the first lines) in the namespace :data:`DEMO_NAMESPACE`
unless the URL names one, so a demo never writes records the team's key would
refuse into the team's namespace.

Then it prints what each attempt spent (calls, tokens, dollars, time) beside
what restarting from zero would have spent, and how many times the
notification, sent with an idempotency key, was delivered. Calls and tokens
are counted from the simulator's ledger, which records every call that
reached the "provider", including the one the crash cut short.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import UsageProblem

SUBQUESTIONS = 60
#: Seconds per simulated call: long enough to watch, short enough for a demo.
DEFAULT_LATENCY = 0.03
NOTEBOOK = "research_agent.ipynb"
_MARKER = ".nbdurable-demo"  # marks a directory the demo may reset
#: Signs the demo's records on a team store when NBDURABLE_KEY is not set. Public:
#: it protects nothing, which is why it is only used in a namespace of its own.
DEMO_KEY = "nbdurable-demo-key-public-not-a-secret"
DEMO_NAMESPACE = "nbdurable_demo"
_OURS = (NOTEBOOK, "ledger.jsonl", "ledger.crashed", "mailbox.sqlite", ".nbdurable", _MARKER)


def _workdir(directory: Path | None) -> Path:
    """A fresh working directory: new, empty, or a previous demo's (reset)."""
    if directory is None:
        return Path(tempfile.mkdtemp(prefix="nbdurable-demo-"))
    path = directory.expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise UsageProblem(f"--dir {path} is a file; give a new or empty directory")
    if path.exists():
        present = {p.name for p in path.iterdir()}
        if present and not (_MARKER in present and present <= set(_OURS)):
            raise UsageProblem(
                f"--dir {path} is not empty and holds no earlier demo; give a new or empty "
                "directory (the demo writes a notebook, a store, a ledger and a mailbox there)"
            )
        for name in present:  # only our own files: checked just above
            p = path / name
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / _MARKER).write_text("made by nbdurable demo; it may reset this directory\n")
    except OSError as exc:  # a file in the way, a read-only or virtual file system
        raise UsageProblem(
            f"--dir {path}: cannot make the demo's directory there "
            f"({exc.strerror or exc}); give a directory you can write"
        ) from None
    return path


@dataclass(frozen=True)
class _Where:
    """Where the demo records: the store, its run, the key it signs with."""

    store: str | Path | None = None  # None: beside the notebook
    run: str | None = None  # None: the notebook's own run
    env: dict[str, str] = field(default_factory=dict)  # NBDURABLE_KEY, if the demo's
    note: str | None = None  # said first: why the demo key


def _on_store(store: str) -> _Where:
    """Where ``--store`` puts the demo (see the module docstring)."""
    from ..store import opener

    run = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    if not opener.is_url(store):
        return _Where(Path(store).expanduser().absolute(), run)
    if os.environ.get("NBDURABLE_KEY"):
        return _Where(store, run)
    parts = urlsplit(store)
    query = dict(parse_qsl(parts.query))
    if "namespace" not in query:
        query["namespace"] = DEMO_NAMESPACE
        store = urlunsplit(parts._replace(query=urlencode(query)))
    note = (
        "NBDURABLE_KEY is not set, so the demo signs its records with its own public demo key "
        f"(NBDURABLE_KEY={DEMO_KEY}) in namespace {query['namespace']}: set NBDURABLE_KEY to "
        "your team's key to run it in the team's namespace."
    )
    return _Where(store, run, {"NBDURABLE_KEY": DEMO_KEY}, note)


def _spent(calls: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    from .sim import cost

    tokens = sum(int(c.get("tokens", 0)) for c in calls)
    return {
        "calls": len(calls),
        "by_kind": dict(Counter(c["kind"] for c in calls)),
        "tokens": tokens,
        "cost": round(cost(tokens), 6),
        "seconds": round(seconds, 3),
    }


def _plus(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    kinds = Counter(a["by_kind"]) + Counter(b["by_kind"])
    return {
        "calls": a["calls"] + b["calls"],
        "by_kind": dict(kinds),
        "tokens": a["tokens"] + b["tokens"],
        "cost": round(a["cost"] + b["cost"], 6),
        "seconds": round(a["seconds"] + b["seconds"], 3),
    }


def _mail(mailbox: Path) -> dict[str, Any]:
    from .sim import MailProvider

    box = MailProvider(mailbox)
    with closing(sqlite3.connect(mailbox)) as con:
        rows = con.execute("SELECT key, id FROM sent").fetchall()
    return {
        "delivered": box.delivered(),
        "attempts": box.attempts(),
        "idempotency_keys": [r[0] for r in rows],
        "message_ids": [r[1] for r in rows],
    }


def run_demo(
    crash_at: int = 40,
    directory: Path | None = None,
    latency: float | None = None,
    as_json: bool = False,
    quiet: bool = False,
    store: str | None = None,
) -> int:
    """Run the demo; returns the exit code (0 when it showed what it should).

    ``store``: a directory or a ``postgresql://`` URL to record into (see the
    module docstring); None: a store beside the notebook.
    """
    from ..store import open_store

    if not 0 <= crash_at < SUBQUESTIONS:
        raise UsageProblem(
            f"--crash-at {crash_at} is not a sub-question: expected 0 to {SUBQUESTIONS - 1}"
        )
    latency = DEFAULT_LATENCY if latency is None else latency
    if store is None:
        return _attempts(crash_at, directory, latency, as_json, quiet, _Where())
    where = _on_store(store)
    # This process opens the store too (progress, leases): the key is set here for
    # the demo's length, and in the kernels' environment.
    added = [k for k in where.env if k not in os.environ]
    os.environ.update(where.env)
    try:
        open_store(where.store).close()  # a store that does not open: one line, before any work
        return _attempts(crash_at, directory, latency, as_json, quiet, where)
    finally:
        for k in added:
            os.environ.pop(k, None)


def _attempts(
    crash_at: int, directory: Path | None, latency: float, as_json: bool, quiet: bool, where: _Where
) -> int:
    """The two attempts and the report (see :func:`run_demo`)."""
    from ..run import ConsoleProgress, Progress, run_notebook
    from .sim import ledger_calls

    work = _workdir(directory)
    notebook = work / NOTEBOOK
    notebook.write_bytes((resources.files("nbdurable") / "notebooks" / NOTEBOOK).read_bytes())
    ledger, mailbox = work / "ledger.jsonl", work / "mailbox.sqlite"
    target = work / ".nbdurable" if where.store is None else where.store
    run_name = where.run
    env = {
        **where.env,
        "NBDURABLE_SIM_LEDGER": str(ledger),
        "NBDURABLE_SIM_MAILBOX": str(mailbox),
        "NBDURABLE_SIM_LATENCY": str(latency),
        # The simulator counts answer calls from 1; sub-questions count from 0.
        "NBDURABLE_SIM_CRASH_AT": str(crash_at + 1),
    }
    talk = not (quiet or as_json)

    def say(text: str = "") -> None:
        if talk:
            print(text, flush=True)

    def progress() -> Progress:
        return ConsoleProgress() if talk else Progress()

    if where.note and not quiet:  # said even with --json: where the records went, and why
        print(f"nbdurable demo: {where.note}", file=sys.stdout if talk else sys.stderr)
    say(
        f"nbdurable demo: a research agent asks {SUBQUESTIONS} sub-questions (a search and an "
        "answer each), writes a report and mails it."
    )
    say(
        f"The model, search and mail are simulated offline ({latency:g} s per call). "
        f"Working in {work}"
    )
    if run_name is not None:
        say(f"Recording run {run_name!r} in {_shown(target)}")
    say()
    say(f"1) First attempt: the kernel will be killed inside answer:{crash_at}.")
    first = run_notebook(
        notebook, retries=0, store=target, run_name=run_name, env=env, progress=progress()
    )
    first_calls = ledger_calls(ledger)
    if first.status != "kernel died":
        print(
            f"nbdurable demo: error: the first attempt was meant to die in answer:{crash_at} "
            f"but ended with {first.status!r}; see {notebook}",
            file=sys.stderr,
        )
        return 1
    say()
    say(f"2) Resume: nbdurable run {notebook}")
    resume = run_notebook(notebook, store=target, run_name=run_name, env=env, progress=progress())
    if resume.exit_code != 0:
        print(
            f"nbdurable demo: error: the resume ended with {resume.status!r} "
            f"(exit {resume.exit_code}); see {notebook}",
            file=sys.stderr,
        )
        return resume.exit_code
    calls = ledger_calls(ledger)
    resume_calls = calls[len(first_calls) :]
    # A call the crash cut short is in the ledger (it reached the provider) with no output.
    returned = [c for c in first_calls if c.get("out")]
    saved_seconds = float((resume.saved or {}).get("seconds", 0.0))
    spent_first = _spent(first_calls, first.seconds)
    spent_resume = _spent(resume_calls, resume.seconds)
    # Without nbdurable the rerun repeats every call of a complete run; its time is
    # the resume's plus what the resume replayed instead of recomputing.
    restart = _spent(returned + resume_calls, resume.seconds + saved_seconds)
    with_nbd, without = _plus(spent_first, spent_resume), _plus(spent_first, restart)
    summary = {
        "dir": str(work),
        "notebook": str(notebook),
        "crash_at": crash_at,
        "latency": latency,
        "ledger": str(ledger),
        "store": _shown(target),
        "run": resume.run_id,
        "demo_key": bool(where.env),
        "first_attempt": spent_first,
        "resume": spent_resume,
        "restart_from_zero": restart,
        "with_nbdurable": with_nbd,
        "without_nbdurable": without,
        "saved": {
            k: round(without[k] - with_nbd[k], 6) for k in ("calls", "tokens", "cost", "seconds")
        },
        "kernel_deaths": first.deaths + resume.deaths,
        "replayed": {
            "steps": (resume.saved or {}).get("steps"),
            "calls": (resume.saved or {}).get("calls"),
        },
        "notification": _mail(mailbox),
    }
    if as_json:
        print(json.dumps(summary, indent=2))
    elif not quiet:
        say()
        say(_table(summary, target, run_name, bool(where.env)))
    return 0


def _shown(target: str | Path) -> str:
    from ..store import opener
    from ..store._pg import display

    return display(target) if opener.is_url(target) else str(target)


def _table(s: dict[str, Any], store: str | Path, run: str | None, demo_key: bool) -> str:
    cols = [
        ("first attempt", s["first_attempt"], ""),
        ("resume (nbdurable)", s["resume"], ""),
        ("restart from zero", s["restart_from_zero"], "≈ "),
    ]
    rows = [("", *(c[0] for c in cols))]
    rows.append(("model + search calls", *(f"{c[1]['calls']:,}" for c in cols)))
    rows.append(("tokens", *(f"{c[1]['tokens']:,}" for c in cols)))
    rows.append(("cost", *(f"${c[1]['cost']:.3f}" for c in cols)))
    rows.append(("time", *(f"{c[2]}{c[1]['seconds']:.1f} s" for c in cols)))
    w0 = max(len(r[0]) for r in rows)
    widths = [max(len(r[i]) for r in rows) for i in range(1, 4)]
    lines = [
        "  ".join([r[0].ljust(w0), *(v.rjust(w) for v, w in zip(r[1:], widths, strict=True))])
        for r in rows
    ]

    def total(d: dict[str, Any]) -> str:
        return (
            f"{d['calls']:,} calls, {d['tokens']:,} tokens, ${d['cost']:.3f}, {d['seconds']:.1f} s"
        )

    saved, mail = s["saved"], s["notification"]
    nb = s["notebook"]
    # The demo's store is the default one beside the notebook, unless NBDURABLE_DIR
    # points the commands elsewhere, or --store put it elsewhere (in a run of its own).
    given = run is not None or os.environ.get("NBDURABLE_DIR")
    hint = f" --store {shlex.quote(_shown(store))}" if given else ""
    hint += f" --run {run}" if run is not None else ""
    key = f"NBDURABLE_KEY={DEMO_KEY} " if demo_key else ""
    lines += [
        "(the provider's ledger; the runner's `calls: N made` above counts recorded calls:",
        " the one call the crash cut never returned, and the mail send is no model call)",
        "",
        f"with nbdurable     first attempt + resume:            {total(s['with_nbdurable'])}",
        f"without nbdurable  first attempt + restart from zero: {total(s['without_nbdurable'])}",
        f"saved              {saved['calls']:,} calls, {saved['tokens']:,} tokens, "
        f"${saved['cost']:.3f}, ≈ {saved['seconds']:.1f} s",
        "",
        f"notification delivered: {mail['delivered']} (send attempts: {mail['attempts']}; "
        "idempotency key " + ", ".join(mail["idempotency_keys"]) + ")",
        "",
        "Look around:",
        f"  {key}nbdurable status {nb}{hint}",
        f"  {key}nbdurable export {nb}{hint} --values",
        f"  {key}nbdurable run {nb}{hint}      # again: every step replays, no call is made",
    ]
    return "\n".join(lines)
