"""The frontend reads cells with nbdurable's own vocabulary, never a hand copy.

``js/src/vocabulary.json`` is written by ``python -m nbdurable.states``; the
cell marks' TypeScript imports it, and the prebuilt extension bundles it.
These tests fail when the file or the committed build lags the Python side
(re-run ``python -m nbdurable.states > js/src/vocabulary.json`` and ``js/build.sh``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbdurable
from nbdurable import states
from nbdurable.identity import keys, stepline

ROOT = Path(nbdurable.__file__).parent.parent
VOCAB = ROOT / "js" / "src" / "vocabulary.json"
BUNDLE = ROOT / "nbdurable" / "labextension" / "static"


def test_the_frontends_vocabulary_file_is_the_generated_one():
    assert json.loads(VOCAB.read_text(encoding="utf-8")) == states.vocabulary()


def test_the_vocabulary_is_what_the_magic_and_the_views_use():
    vocab = states.vocabulary()
    assert vocab["commands"] == list(stepline.STEP_COMMANDS)
    assert re.fullmatch(vocab["name_pattern"], "plan_2:a-b.c")
    assert not re.fullmatch(vocab["name_pattern"], "2plan")
    # The name rule is the one validate_name applies.
    for name in ("ok", "_x", "a" * 128, "a" * 129, "bad name", "1x"):
        fits = re.fullmatch(vocab["name_pattern"], name) is not None
        try:
            keys.validate_name(name)
            valid = True
        except nbdurable.UsageProblem:
            valid = False
        assert fits == valid, name
    from nbdurable.ipython.rows import STATE_HELP

    assert STATE_HELP == {n: s.help for n, s in states.STATES.items()}


def test_the_committed_build_bundles_this_vocabulary():
    # Every string of the vocabulary is in the built JavaScript: a build made
    # before the vocabulary changed fails here.
    built = "".join(p.read_text(encoding="utf-8") for p in BUNDLE.glob("*.js"))
    strings = [states.vocabulary()["name_pattern"], *stepline.STEP_COMMANDS]
    for name, state in states.vocabulary()["states"].items():
        strings += [name, state["glyph"], state["next_run"]]
    missing = [s for s in strings if json.dumps(s, ensure_ascii=False)[1:-1] not in built]
    assert not missing, f"the prebuilt extension lacks {missing}: run js/build.sh"


def test_the_step_line_splits_as_shlex_does() -> None:
    """A plain line is split without shlex's per-character loop, into the same words;
    a line with quotes, backslashes or unusual whitespace still goes through shlex."""
    import random
    import shlex

    from nbdurable.identity import stepline

    alphabet = ["a", "b", "-", "_", ".", ":", " ", "\t", "\r", "\n", "\f", "\v", "\xa0",
                "'", '"', "\\", "#", "*", "--force", "--inputs", "x*"]  # fmt: skip
    rnd = random.Random(7)
    plain = 0
    for _ in range(3000):
        line = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(12)))
        if stepline._PLAIN_WORDS.fullmatch(line):
            plain += 1
            assert line.split() == shlex.split(line), repr(line)
    assert 300 < plain < 2900
    assert stepline._PLAIN_WORDS.fullmatch(" plan  --force\t--inputs a* ")
    for odd in ("'plan'", 'a "b c"', "a\\ b", "a\fb", "a\xa0b"):
        assert not stepline._PLAIN_WORDS.fullmatch(odd)
