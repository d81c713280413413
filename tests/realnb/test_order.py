"""The order and the time limit in which CI judges the real-notebook corpus (no kernel)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_realnb as corpus  # noqa: E402

NAMES = [s.name for s in corpus.SPECS]


def test_ci_set_comes_first_and_every_notebook_once():
    for turn in ("", "a1b2", "ffff"):
        order = corpus.judging_order(NAMES, turn)
        assert sorted(order) == sorted(NAMES)
        assert set(order[: len(corpus.CI_SET)]) == set(corpus.CI_SET)


def test_the_turn_moves_where_the_rest_starts():
    rest = [n for n in NAMES if n not in corpus.CI_SET]
    starts = {corpus.judging_order(NAMES, f"commit{i}")[len(corpus.CI_SET)] for i in range(40)}
    assert len(starts) > 5  # 40 commits start the rest at many places, not one
    # a rotation: neighbours stay neighbours
    order = corpus.judging_order(NAMES, "commit7")[len(corpus.CI_SET) :]
    k = rest.index(order[0])
    assert order == rest[k:] + rest[:k]


def test_past_the_deadline_only_ci_set_is_judged(monkeypatch):
    judged: list[str] = []

    def fake_judge(spec):
        judged.append(spec.name)
        return corpus.Result(spec.name)

    monkeypatch.setattr(corpus, "judge", fake_judge)
    names = [n for n in NAMES if not corpus._missing(corpus.BY_NAME[n])]
    c = corpus.Corpus(names, deadline=time.time() - 1)
    try:
        results = {n: c.result(n) for n in c.futures}
    finally:
        c.close()
    assert {n for n, r in results.items() if r is not None} == set(corpus.CI_SET) & set(names)
    assert sorted(judged) == sorted(set(corpus.CI_SET) & set(names))


def test_a_notebook_starts_only_if_it_can_be_judged_in_time(monkeypatch):
    monkeypatch.setattr(corpus, "judge", lambda spec: corpus.Result(spec.name))
    light = min((n for n in NAMES if n not in corpus.CI_SET), key=corpus.SECONDS.get)
    heavy = max(NAMES, key=corpus.SECONDS.get)
    names = [n for n in (light, heavy) if not corpus._missing(corpus.BY_NAME[n])]
    between = (corpus.SECONDS[light] + corpus.SECONDS[heavy]) / 2
    c = corpus.Corpus(names, deadline=time.time() + between)
    try:
        judged = {n for n in c.futures if c.result(n) is not None}
    finally:
        c.close()
    assert judged == {light} & set(names)
