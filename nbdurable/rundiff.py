"""Two runs of a notebook side by side: which steps differ, and how.

``nbdurable diff NB RUN_A RUN_B`` and :func:`nbdurable.compare` read two runs
of one store (a notebook's own run and its named runs, ``%step run NAME``)
and compare them step by step, from the records alone: no kernel, nothing
unpickled. A step is *same* when both runs recorded it with the same code,
the same inputs, the same outputs, the same variables (by fingerprint) and
the same sub-steps (ids, arguments and results by digest); otherwise each
difference is one short line:

- ``code`` changed; ``input 'topic'`` differs (with the two briefs the
  records kept, ``'cats'`` / ``'dogs'``);
- ``outputs``: a unified diff of their text (at most :data:`DIFF_LINES` lines;
  outputs are recorded redacted, so no secret shows);
- ``variable 'plan'``: its briefs, ``dict of 3`` / ``dict of 4`` (a value is
  never loaded: big ones are compared by fingerprint, shown by type/shape; the
  variables a step saved in one pickle, by their briefs, or, when those are alike,
  one line saying their saved values differ);
- ``sub-step 'q:3'``: only in one run, other arguments, or another result.

Each run's time, calls and tokens are given per step and in total, so "this
prompt against that one" reads as a table. A step only one run recorded is
``only in A`` / ``only in B``; one neither did is left out.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .clients.usage import Tally
from .store import RunKeys, Store
from .store.view import read_header

#: At most this many lines of an output diff per step.
DIFF_LINES = 12


@dataclass
class Side:
    """One run's record of a step: what the table shows of it."""

    recorded: bool = False
    seconds: float = 0.0
    calls: int = 0
    tokens: int = 0


@dataclass
class StepDiff:
    """One step of the comparison."""

    key: str
    label: str
    cell: int | None
    #: "same", "differs", "only in A", "only in B"
    verdict: str
    #: what differs, one short line each (empty when same)
    lines: list[str] = field(default_factory=list)
    a: Side = field(default_factory=Side)
    b: Side = field(default_factory=Side)


def _side(header: dict[str, Any] | None) -> Side:
    if header is None:
        return Side()
    tokens = Tally.from_json(header.get("tokens")).total
    return Side(
        True,
        float(header.get("duration") or 0.0),
        int(header.get("substeps") or 0),
        tokens.input + tokens.output,
    )


def _text(outputs: Any) -> str:
    parts = []
    for out in outputs if isinstance(outputs, list) else ():
        if not isinstance(out, dict):
            continue
        if out.get("output_type") == "stream":
            parts.append(str(out.get("text", "")))
        elif isinstance(out.get("data"), dict) and "text/plain" in out["data"]:
            plain = out["data"]["text/plain"]
            parts.append(("".join(plain) if isinstance(plain, list) else str(plain)) + "\n")
        elif out.get("output_type") == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def _subs(store: Store, prefix: str) -> dict[str, tuple[Any, Any]]:
    """Sub-step id -> (arguments' fingerprint, digest of the recorded result)."""
    from .store.admin import substep_rows

    return {
        str(row["id"]): (row.get("args_fp"), row.get("sha256", row.get("error")))
        for row in substep_rows(store, prefix, False)
    }


def _vars(header: dict[str, Any]) -> dict[str, Any]:
    """Variable name -> what tells its value: its own fingerprint, or None for one of the
    step's shared pickle (whose fingerprint is the whole blob's: see ``_joint``).
    """
    out = {}
    for v in header.get("variables") or ():
        if isinstance(v, dict):
            fp = v.get("content") or v.get("fp") or v.get("ref")
            out[v.get("name")] = None if str(fp).startswith("blob:") else fp
    return out


def _joint(header: dict[str, Any]) -> set[str]:
    """The blob digests of a step's shared variables (changes when any of them does)."""
    return {
        str(v.get("fp")).split("/", 1)[0]
        for v in header.get("variables") or ()
        if isinstance(v, dict) and str(v.get("fp")).startswith("blob:")
    }


def _pair(a: Any, b: Any) -> str:
    return f"{a if a is not None else '?'} / {b if b is not None else '?'}"


def step_lines(
    ha: dict[str, Any], hb: dict[str, Any], subs_a: dict[str, Any], subs_b: dict[str, Any]
) -> list[str]:
    """What differs between two records of one step, one short line each (A, then B)."""
    lines = []
    if ha.get("source_fp") != hb.get("source_fp"):
        lines.append("code differs")
    seen_a, seen_b = ha.get("seen") or {}, hb.get("seen") or {}
    ins_a, ins_b = ha.get("inputs") or {}, hb.get("inputs") or {}
    for name in sorted(set(ins_a) | set(ins_b)):
        if ins_a.get(name) != ins_b.get(name):
            lines.append(f"input {name!r}: {_pair(seen_a.get(name), seen_b.get(name))}")
    text_a, text_b = _text(ha.get("outputs")), _text(hb.get("outputs"))
    if text_a != text_b:
        diff = list(
            difflib.unified_diff(
                text_a.splitlines(), text_b.splitlines(), "A", "B", n=0, lineterm=""
            )
        )[2:]
        shown = [ln for ln in diff if not ln.startswith("@@")]
        lines.append("outputs differ:")
        lines += [f"  {ln[:200]}" for ln in shown[:DIFF_LINES]]
        if len(shown) > DIFF_LINES:
            lines.append(f"  ... {len(shown) - DIFF_LINES} more lines")
    elif ha.get("outputs") != hb.get("outputs"):
        lines.append("outputs differ (not in their text: images, widgets or metadata)")
    vars_a, vars_b = _vars(ha), _vars(hb)
    made_a, made_b = ha.get("made") or {}, hb.get("made") or {}
    told = False
    for name in sorted(set(vars_a) | set(vars_b)):
        if name not in vars_a or name not in vars_b:
            lines.append(f"variable {name!r} only in {'B' if name not in vars_a else 'A'}")
            told = True
        elif vars_a[name] is None or vars_b[name] is None:  # saved together: by their briefs
            if made_a.get(name) != made_b.get(name):
                lines.append(f"variable {name!r}: {_pair(made_a.get(name), made_b.get(name))}")
                told = True
        elif vars_a[name] != vars_b[name]:
            lines.append(f"variable {name!r}: {_pair(made_a.get(name), made_b.get(name))}")
            told = True
    if not told and _joint(ha) != _joint(hb):
        lines.append("saved variables differ (their short forms are alike)")
    for sub_id in sorted(set(subs_a) | set(subs_b)):
        got_a, got_b = subs_a.get(sub_id), subs_b.get(sub_id)
        if got_a == got_b:
            continue
        if got_a is None or got_b is None:
            lines.append(f"sub-step {sub_id!r} only in {'B' if got_a is None else 'A'}")
        elif got_a[0] != got_b[0]:
            lines.append(f"sub-step {sub_id!r}: called with other arguments")
        else:
            lines.append(f"sub-step {sub_id!r}: returned another result")
    return lines


def diff_runs(
    store: Store,
    run_a: str,
    run_b: str,
    notebook: Path | None = None,
    only: str | None = None,
) -> list[StepDiff]:
    """The steps of ``run_a`` and ``run_b``, in notebook order, compared (see the module).

    ``only``: a step's key, name or label; the others are left out.
    """
    from . import status

    rows = {}
    for run in (run_a, run_b):
        for info in status.step_infos(store, run, notebook):
            if info.key not in rows or rows[info.key].position is None:
                rows[info.key] = info
    ka, kb = RunKeys(run_a), RunKeys(run_b)
    out = []
    for info in sorted(rows.values(), key=lambda i: (i.position is None, i.position or 0)):
        if only is not None and only not in (info.key, info.label, info.label.strip("'")):
            continue
        ha, hb = read_header(store, ka.step(info.key)), read_header(store, kb.step(info.key))
        if ha is None and hb is None:
            continue
        cell = info.position + 1 if info.position is not None else None
        row = StepDiff(info.key, info.label, cell, "same", [], _side(ha), _side(hb))
        if ha is None or hb is None:
            row.verdict = "only in B" if ha is None else "only in A"
        else:
            subs_a = _subs(store, ka.subs_prefix(info.key))
            subs_b = _subs(store, kb.subs_prefix(info.key))
            row.lines = step_lines(ha, hb, subs_a, subs_b)
            row.verdict = "differs" if row.lines else "same"
        out.append(row)
    return out


def totals(rows: list[StepDiff]) -> dict[str, dict[str, float]]:
    """Each run's seconds, calls and tokens over the compared steps."""
    return {
        side: {
            "seconds": round(sum(getattr(r, side).seconds for r in rows), 3),
            "calls": sum(getattr(r, side).calls for r in rows),
            "tokens": sum(getattr(r, side).tokens for r in rows),
        }
        for side in ("a", "b")
    }


def to_json(run_a: str, run_b: str, rows: list[StepDiff]) -> dict[str, Any]:
    """The ``--json`` form of a comparison."""
    return {
        "a": run_a,
        "b": run_b,
        "steps": [asdict(r) for r in rows],
        "differ": [r.label for r in rows if r.verdict != "same"],
        "totals": totals(rows),
    }


def table(run_a: str, run_b: str, rows: list[StepDiff]) -> list[dict[str, Any]]:
    """One dict per step: ``step``, ``cell``, ``verdict``, ``what``, and each run's
    ``seconds``, ``calls`` and ``tokens`` (what :func:`nbdurable.compare` shows).
    """
    return [
        {
            "step": r.label,
            "cell": r.cell,
            "verdict": r.verdict,
            "what": "; ".join(ln.strip() for ln in r.lines),
            f"seconds {run_a}": r.a.seconds,
            f"seconds {run_b}": r.b.seconds,
            f"calls {run_a}": r.a.calls,
            f"calls {run_b}": r.b.calls,
            f"tokens {run_a}": r.a.tokens,
            f"tokens {run_b}": r.b.tokens,
        }
        for r in rows
    ]


def check_runs(store: Store, *runs: str) -> None:
    """Raise :class:`UsageProblem` naming the store's runs if one of ``runs`` is unknown."""
    from .errors import UsageProblem
    from .store import admin

    for run in runs:
        if not admin.known_run(store, run):
            known = ", ".join(repr(r) for r in admin.run_names(store)) or "none"
            raise UsageProblem(f"no run {run!r} in the store at {store.path} (runs: {known})")
