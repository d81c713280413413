"""Sections 1, 2 and part of 5: sub-step record/replay, growth, bytes on disk per step."""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import peers, seed
from bench.report import Table
from bench.stats import Summary, fmt_bytes, fmt_ratio, fmt_us, perf_ns, quiesce

SIZE_LABEL = {100: "100 B", 1_000: "1 KB", 10_000: "10 KB", 1_000_000: "1 MB"}


def size_label(n: int) -> str:
    return SIZE_LABEL.get(n) or fmt_bytes(n)


#: peers that must always run: a failure there is a failure of the benchmark
REQUIRED = {"nbdurable", "raw diskcache set/get", "raw SQLite WAL insert/select"}


@dataclass
class Result:
    record: Summary
    replay: Summary
    bytes_per_step: float
    record_wall_us: float  # per step, see peers.Phase.wall_ns
    replay_wall_us: float


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _run_peer(
    p: peers.Peer, d: Path, n: int, deadline: float | None
) -> tuple[peers.Phase, peers.Phase, float]:
    quiesce()
    rec = p.record(d, n, deadline)
    steps = len(rec.times)
    size = peers.disk_usage(d) / max(steps, 1)
    quiesce()
    rep = p.replay(d, steps)
    if rep.calls:
        raise RuntimeError(
            f"{p.name} did not replay: {rep.calls} of {steps} steps called their function again"
        )
    if len(rep.times) != steps:
        raise RuntimeError(f"{p.name} replayed {len(rep.times)} steps, expected {steps}")
    return rec, rep, size


def substeps(cfg: Any, root: Path, chosen: list[peers.Peer]) -> tuple[Table, Table, dict]:
    """Section 1 (and the per-step sizes of section 5)."""
    t = Table(
        "1. Sub-steps: record and replay, per step",
        [
            "system",
            "value",
            "n",
            "record median",
            "record p99",
            "record wall/step",
            "replay median",
            "replay p99",
            "replay wall/step",
            "record ×nbd",
            "replay ×nbd",
        ],
    )
    sizes = Table(
        "5a. Store size: bytes on disk per recorded step",
        ["system"] + [size_label(s) for s in cfg.sizes],
    )
    results: dict[tuple[str, int], Result] = {}
    skipped: dict[str, str] = {}
    for p in chosen:
        try:
            p.check()
        except peers.Unavailable as exc:
            skipped[p.name] = str(exc)
    for size in cfg.sizes:
        n_all = cfg.steps[size] + cfg.warmup
        peers.VALUES[:] = peers.make_values(size, n_all)
        for p in chosen:
            if p.name in skipped:
                continue
            n = n_all
            if p.grows:
                n = min(n, cfg.grow_cap.get(size, n))
            d = root / f"sub-{_slug(p.name)}-{size}"
            try:
                rec, rep, per_step = _run_peer(p, d, n, time.monotonic() + cfg.budget)
            except Exception as exc:
                if p.name in REQUIRED:
                    raise
                skipped[p.name] = f"failed at {size_label(size)}: {exc!r}"
                traceback.print_exc()
                continue
            finally:
                p.close()
            w = min(cfg.warmup, len(rec.times) // 4)
            steps = len(rec.times)
            results[(p.name, size)] = Result(
                Summary.of(rec.times[w:]),
                Summary.of(rep.times[w:]),
                per_step,
                rec.wall_ns / 1e3 / steps,
                rep.wall_ns / 1e3 / steps,
            )
            shutil.rmtree(d, ignore_errors=True)
        base = results.get(("nbdurable", size))
        for p in chosen:
            r = results.get((p.name, size))
            if r is None:
                continue
            t.add(
                p.name,
                size_label(size),
                r.record.n,
                fmt_us(r.record.median_us),
                fmt_us(r.record.p99_us),
                fmt_us(r.record_wall_us),
                fmt_us(r.replay.median_us),
                fmt_us(r.replay.p99_us),
                fmt_us(r.replay_wall_us),
                fmt_ratio(r.record.median_us / base.record.median_us) if base else "–",
                fmt_ratio(r.replay.median_us / base.replay.median_us) if base else "–",
            )
    for p in chosen:
        if p.name in skipped and not any((p.name, s) in results for s in cfg.sizes):
            continue
        cells = []
        for s in cfg.sizes:
            r = results.get((p.name, s))
            per = r.bytes_per_step if r else float("nan")
            cells.append(f"{fmt_bytes(per)} ({per / s:.2g}×)" if r else "–")
        sizes.add(p.name, *cells)
    t.skipped = [f"{k}: {v}" for k, v in skipped.items()]
    sizes.skipped = list(t.skipped)
    t.notes += [
        "per-call times from the caller's side (inside the workflow body for DBOS and LangGraph); "
        f"the first {cfg.warmup} steps of each run are warm-up and not counted",
        "×nbd = this row's median / nbdurable's median for the same value size (above 1: "
        "nbdurable is faster)",
        "wall/step = the whole run / its steps, warm-up included: a record run until the system "
        "hands control back (LangGraph's deferred writes flushed), a replay run from opening the "
        "store (the seed and LangGraph load their whole log there) to the last step; DBOS's "
        "launch and recovery-queue wait (~1 s, fixed) are left out",
        "replay = a fresh instance on the same directory (new Store / new DBOS launch / new "
        "checkpointer connection); opening it is not counted per step",
        "the seed's record cost grows with its log (section 2), so it gets fewer steps at "
        "large values (n column)",
        "LangGraph saves a task's result on a background thread (put_writes is submitted to "
        "an executor), so its per-call record time does not include the SQLite write",
        "durability as each ships: nbdurable WAL + synchronous=NORMAL (survives a process "
        "crash; 'power' = synchronous=FULL); DBOS SQLite: rollback journal, synchronous=FULL; "
        "LangGraph SqliteSaver: WAL, synchronous=FULL; joblib and the seed: no fsync",
    ]
    sizes.notes += [
        "allocated blocks on disk after the record run (SQLite files, value files) divided by "
        "the steps recorded; (×) = per-step bytes / value size",
    ]
    return t, sizes, results


# -- section 2: growth ------------------------------------------------------------------


def _window(mark: int) -> tuple[int, int]:
    """The steps whose cost is reported "at ``mark`` steps": the last ≤100 before it."""
    w = min(100, int(mark * 0.8))
    return mark - w, mark


def _seed_at(d: Path, mark: int) -> tuple[Summary, Summary, float]:
    """The seed's per-step cost with ``mark - w`` steps already in its log.

    Its cost depends only on what the log holds, so the log is prefilled (one
    write) instead of recording every earlier step, which at 10,000 steps
    would take many minutes.
    """
    lo, hi = _window(mark)
    shutil.rmtree(d, ignore_errors=True)
    cp = seed.Checkpoint(peers.RUN_ID, path=str(d))
    cp.done.update({peers.step_id(i): peers.VALUES[i] for i in range(lo - 1)})
    if lo:
        cp.record(peers.step_id(lo - 1), peers.VALUES[lo - 1])
    quiesce()
    rec = []
    for i in range(lo, hi):
        t0 = perf_ns()
        seed.step(cp, peers.step_id(i), peers.produce, i)
        rec.append(perf_ns() - t0)
    t0 = perf_ns()
    cp = seed.Checkpoint(peers.RUN_ID, path=str(d))
    open_us = (perf_ns() - t0) / 1e3
    rep = []
    before = peers.CALLS[0]
    for i in range(lo, hi):
        t0 = perf_ns()
        seed.step(cp, peers.step_id(i), peers.produce, i)
        rep.append(perf_ns() - t0)
    assert peers.CALLS[0] == before, "the seed did not replay"
    shutil.rmtree(d, ignore_errors=True)
    return Summary.of(rec), Summary.of(rep), open_us


def growth(cfg: Any, root: Path, chosen: list[peers.Peer]) -> tuple[Table, dict]:
    """Section 2: per-step cost at 100, 1,000 and 10,000 steps in one run."""
    marks = cfg.growth_marks
    t = Table(
        f"2. Growth: per-step cost at {', '.join(f'{m:,}' for m in marks)} steps in one run "
        f"({size_label(cfg.growth_value)} values)",
        [
            "system",
            "at step",
            "record median",
            "record p99",
            "replay median",
            "replay p99",
            "record ×nbd",
            "open log",
        ],
    )
    top = max(marks)
    peers.VALUES[:] = peers.make_values(cfg.growth_value, top)
    out: dict[tuple[str, int], tuple[Summary, Summary]] = {}
    for p in chosen:
        if p.name not in cfg.growth_peers:
            continue
        try:
            p.check()
        except peers.Unavailable as exc:
            t.skipped.append(f"{p.name}: {exc}")
            continue
        d = root / f"growth-{_slug(p.name)}"
        opens: dict[int, float] = {}
        try:
            if isinstance(p, peers.SeedJson):
                for m in marks:
                    rec_s, rep_s, opens[m] = _seed_at(d, m)
                    out[(p.name, m)] = (rec_s, rep_s)
            else:
                # Runs whose figures the targets judge are repeated and their windows
                # pooled, so a burst of load from elsewhere during one run's window
                # cannot decide "flat" or "not flat" on its own.
                runs = cfg.growth_repeats if p.name in cfg.growth_repeat_peers else 1
                recs: dict[int, list[int]] = {m: [] for m in marks}
                reps: dict[int, list[int]] = {m: [] for m in marks}
                reached = top
                for _ in range(runs):
                    shutil.rmtree(d, ignore_errors=True)
                    quiesce()
                    rec = p.record(d, top, time.monotonic() + cfg.growth_budget)
                    quiesce()
                    rep = p.replay(d, len(rec.times))
                    p.close()
                    if rep.calls:
                        raise RuntimeError(f"did not replay: {rep.calls} calls made again")
                    reached = min(reached, len(rec.times))
                    opens[len(rec.times)] = rep.open_ns / 1e3
                    for m in marks:
                        lo, hi = _window(m)
                        if len(rec.times) >= hi:
                            recs[m] += rec.times[lo:hi]
                            reps[m] += rep.times[lo:hi]
                for m in marks:
                    if reached < m:
                        t.notes.append(
                            f"{p.name} reached {reached:,} steps within the "
                            f"{cfg.growth_budget:.0f} s budget, not {m:,}"
                        )
                        break
                    out[(p.name, m)] = (Summary.of(recs[m]), Summary.of(reps[m]))
        except Exception as exc:
            if p.name in REQUIRED:
                raise
            t.skipped.append(f"{p.name}: failed: {exc!r}")
            traceback.print_exc()
            continue
        finally:
            p.close()
            shutil.rmtree(d, ignore_errors=True)
        for m in marks:
            got = out.get((p.name, m))
            if got is None:
                continue
            base = out.get(("nbdurable", m))
            op = opens.get(m)
            t.add(
                p.name,
                f"{m:,}",
                fmt_us(got[0].median_us),
                fmt_us(got[0].p99_us),
                fmt_us(got[1].median_us),
                fmt_us(got[1].p99_us),
                fmt_ratio(got[0].median_us / base[0].median_us) if base else "–",
                fmt_us(op) if op is not None else "",
            )
    t.notes += [
        "'at step N' = the last 100 steps before step N (for small N, the last 80%: steps "
        "20-99 for N=100); "
        f"{' and '.join(cfg.growth_repeat_peers)} run {cfg.growth_repeats} times, their "
        "windows pooled",
        "nbdurable and the others record every step in one run, then replay the whole run "
        "from a fresh instance; 'open log' is opening the store before that replay",
        "the seed's per-step cost depends only on how much its log holds, so for each N its log "
        "is prefilled to N-100 steps in one write and the next 100 steps are timed; 'open log' "
        "is its Checkpoint() loading the whole JSON file",
    ]
    return t, out
