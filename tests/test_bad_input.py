"""Bad input, property-tested (issue #5): one clear line, and the store untouched.

Properties, each checked by hypothesis (derandomized and without an example
database, so every CI run sees the same examples):

1. ``%step LINE`` / ``%%step LINE``: any line either works or raises one
   ``UsageError`` whose message is a single short line. A refused line leaves
   the store byte for byte as it was; afterwards the store passes its
   integrity check and the step recorded beforehand replays in a fresh session.
2. ``step(id, fn)``: a non-str id raises ``TypeError``; an empty, overlong
   or control-character id raises ``UsageProblem``; both are one line, come
   before ``fn`` runs and write nothing. Every other id is kept exactly:
   recorded, replayed by a fresh session without calling ``fn``, and distinct
   from ids that differ only by Unicode normalization, case or trailing white
   space, and from the same text in another scope.
3. ``nbdurable ARGV``: bad usage exits 2 with exactly one line on stderr and
   never a traceback; a refused command (and any read-only one) leaves the
   store byte for byte as it was and creates no file. No test here starts a
   kernel: ``run`` and ``demo`` are stubbed to fail loudly if they would.

Plus single cases the properties led to: unnamed steps whose saved cell ids
share a ``/`` prefix, ids and notebook paths that are not valid UTF-8, and
the spellings of one notebook path (``../nb.ipynb``, absolute, ...), which
must all name the run its kernel records.

Everything runs in this process on a plain ``InteractiveShell``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import tempfile
import unicodedata
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from kernel_util import make_notebook

import nbdurable
from nbdurable import cli
from nbdurable.durable import session as engine
from nbdurable.identity import stepline
from nbdurable.ipython.host import session_for
from nbdurable.store import RUN_SCOPE, open_store

# When a property fails, hypothesis' pytest plugin imports its patch writer
# (libcst), whose import raises mypy_extensions' DeprecationWarning; under
# `filterwarnings = error` that turns the failure report into a pytest
# INTERNALERROR. Import it once here, with that warning ignored.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    with contextlib.suppress(ImportError):
        import hypothesis.extra._patching  # noqa: F401

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    # Each example opens a store and runs a step: slow by hypothesis' measure, on purpose.
    suppress_health_check=[HealthCheck.too_slow],
)

# -- the one-line rule ------------------------------------------------------------

#: Never in a one-line message: line breaks as ``str.splitlines`` knows them, and
#: other control characters, which move the cursor or start ANSI sequences in a
#: terminal and in Jupyter's output area (user text must be shown with repr()).
_NOT_IN_A_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
MAX_MESSAGE = 300


def assert_one_line(message: str, *, limit: int | None = MAX_MESSAGE) -> None:
    assert message.strip(), "an empty error message"
    bad = _NOT_IN_A_LINE.search(message)
    assert bad is None, f"{bad.group()!r} at index {bad.start()} of the message: {message[:400]!r}"
    if limit is not None:
        assert len(message) < limit, f"a {len(message)}-character message: {message[:400]!r}…"


# -- a notebook with a recorded run, and a copy of its store ----------------------------

KEEP_BODY = "kept = 42\nkept_sub = step('a/b', str, 7)"
PLAIN_BODY = "plain = kept + 1"
CELLS = [
    "%load_ext nbdurable\nfrom nbdurable import step",
    f"%%step keep\n{KEEP_BODY}",
    f"%%step\n{PLAIN_BODY}",
]
#: Relative to the working directory of every test (``<root>/cwd``).
NOTEBOOK = "../nb.ipynb"
STORE = "../store"


NOTEBOOK_TEXT = nbformat.writes(make_notebook(CELLS))


def _no_kernel(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a bad-input test would have started a kernel")


@dataclass
class Env:
    root: Path
    shell: InteractiveShell = field(repr=False)
    #: The pristine store: key -> verified record.
    before: dict[str, Any] = field(repr=False)

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def pristine(self) -> Path:
        return self.root / "pristine"

    def restore(self) -> None:
        """Close the session; put the pristine store and notebook back."""
        engine.reset_session()
        _close_panel()
        shutil.rmtree(self.store)
        shutil.copytree(self.pristine, self.store)
        (self.root / "nb.ipynb").write_text(NOTEBOOK_TEXT)

    def files(self) -> list[str]:
        """Every file outside the store (none may appear)."""
        return sorted(
            str(p.relative_to(self.root))
            for p in self.root.rglob("*")
            if not p.is_relative_to(self.store) and not p.is_relative_to(self.pristine)
        )


def _close_panel() -> None:
    # `%step panel` leaves a live panel listening to the engine; close it with its session.
    from nbdurable.ipython import panel as steppanel

    if steppanel._panel is not None:
        steppanel._panel.close()


def snapshot(directory: Path) -> dict[str, Any]:
    """Every key of the store with its verified record (signed bytes: equal records are
    equal bytes); checks the store's integrity on the way."""
    with open_store(directory) as s:
        assert s.check(fix=False) == [], "the store fails its integrity check"
        keys = [k for prefix in ("meta/", "r/") for k in s.scan(prefix)]
        out: dict[str, Any] = {k: s.get(k) for k in keys}
        for k in s.scan("b/"):
            blob = s.get_blob(k[2:])
            out[k] = blob and (bytes(blob.stream), [bytes(b) for b in blob.buffers])
        return out


@contextlib.contextmanager
def durable_env() -> Iterator[Env]:
    """A notebook with a recorded, pinned step ``keep``, a cell-id step and a run-scope call."""
    # The shell (and its history database under ~/.ipython) exists before HOME moves.
    shell = InteractiveShell.instance()
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        root = Path(tmp)
        for sub in ("cwd", "home"):
            (root / sub).mkdir()
        mp.setenv("NBDURABLE_DIR", str(root / "store"))
        mp.setenv("NBDURABLE_NOTEBOOK", str(root / "nb.ipynb"))
        mp.setenv("HOME", str(root / "home"))  # `~` in a generated path lands here
        for name in ("JPY_SESSION_NAME", "NBDURABLE_RUN", "NBDURABLE_TAKEOVER"):
            mp.delenv(name, raising=False)
        mp.chdir(root / "cwd")
        mp.setattr("nbdurable.run.attempts._Run", _no_kernel)
        mp.setattr("nbdurable.demo.run_demo", _no_kernel)
        (root / "nb.ipynb").write_text(NOTEBOOK_TEXT)

        engine.reset_session()
        nbdurable.load_ipython_extension(shell)
        names = ("step", "kept", "kept_sub", "plain", "x", "got", "CALLS", "r1", "r2", "odd")
        saved = {n: shell.user_ns[n] for n in names if n in shell.user_ns}
        try:
            shell.user_ns["step"] = nbdurable.step
            shell.run_cell_magic("step", "keep", KEEP_BODY)
            shell.run_cell_magic("step", "", PLAIN_BODY)
            nbdurable.step("outside", str, 1)
            shell.run_line_magic("step", "pin keep")
            engine.reset_session()
            shutil.copytree(root / "store", root / "pristine")
            yield Env(root, shell, snapshot(root / "store"))
        finally:
            engine.reset_session()
            _close_panel()
            nbdurable.unload_ipython_extension(shell)
            for n in names:
                shell.user_ns.pop(n, None)
            shell.user_ns.update(saved)


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    """One recorded notebook for the module; each example restores it (``Env.restore``).

    Module-scoped, so hypothesis runs every example against it without the
    function-scoped-fixture health check.
    """
    with durable_env() as e:
        yield e


def assert_keep_replays(env: Env) -> None:
    """A fresh session replays ``keep`` from the store, sub-step included."""
    engine.reset_session()
    ns = env.shell.user_ns
    ns.pop("kept", None)
    ns.pop("kept_sub", None)
    env.shell.run_cell_magic("step", "keep", KEEP_BODY)
    assert engine.get_session().status.get("name:keep") == ("replayed", "")
    assert (ns["kept"], ns["kept_sub"]) == (42, "7")


def magic(env: Env, kind: str, line: str) -> bool:
    """Run ``%step line`` or ``%%step line`` (body ``x = 1``); False if it raised UsageError.

    Any other exception propagates and fails the test. The magic is called
    as IPython's ``run_*_magic`` calls it, minus IPython's own ``$var``
    expansion of the line (its parser takes a second per 10,000 characters).
    """
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            if kind == "line":
                env.shell.find_line_magic("step")(line)
            else:
                env.shell.find_cell_magic("step")(line, "x = 1")
    except UsageError as exc:
        assert_one_line(str(exc))
        return False
    return True


def check_magic(env: Env, kind: str, line: str) -> None:
    env.restore()
    ok = magic(env, kind, line)
    ran_keep = "name:keep" in engine.get_session().status  # `%%step keep` re-recorded it
    engine.reset_session()
    after = snapshot(env.store)
    if not ok:
        assert after == env.before, "a refused line changed the store"
    cleared = kind == "line" and _first_word(line) == "clear"
    if not (ok and (cleared or ran_keep)):
        assert_keep_replays(env)
    assert env.files() == ["cwd", "home", "nb.ipynb"]


def _first_word(line: str) -> str | None:
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    return words[0] if words else None


# -- strategies for magic lines --------------------------------------------------------

#: Any character a line can hold: control characters and lone surrogates (JSON
#: from a frontend can carry both) included, a newline not.
LINE_CHAR = st.characters(exclude_categories=(), exclude_characters="\n")
NASTY = [
    "", " ", "~", ".", "..", "../../x", "a/b", "/", "/etc/passwd", "~/x", "nb.ipynb",
    "-", "--", "-x", "--all", "--force", "-f", "--help", "'", '"', "\\", "'unclosed",
    '"a b"', "keep", "name:keep", "~run", "é", "e\u0301", "\U0001f642", "\x00",
    "\x1b[2J", "\r", "\x0b", "\x85", "\u2028", "\ud800", "a" * 129, "x" * 600,
    "%step", "%%step", "None", "0", "--inputs", "[x", "*.ipynb",
]  # fmt: skip
HUGE = st.builds(
    lambda unit, n: (unit * n)[:n],
    st.text(LINE_CHAR, min_size=1, max_size=8),
    st.integers(300, 10_000),
)
TOKEN = st.one_of(st.sampled_from(NASTY), st.text(LINE_CHAR, max_size=12), HUGE)
TOKENS = st.lists(TOKEN, max_size=4)
COMMAND_LINES = st.tuples(st.sampled_from(stepline.STEP_COMMANDS), TOKENS)
#: Step names, valid (at most 128 characters) and just too long.
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,140}", fullmatch=True)
VALID_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}", fullmatch=True).filter(
    lambda n: n not in stepline.STEP_COMMANDS
)
LINES = st.one_of(
    st.text(LINE_CHAR, max_size=40),
    TOKENS.map(" ".join),
    TOKENS.map(lambda ts: " ".join(map(shlex.quote, ts))),
    COMMAND_LINES.map(lambda t: " ".join((t[0], *t[1]))),
    COMMAND_LINES.map(lambda t: " ".join(map(shlex.quote, (t[0], *t[1])))),
    HUGE,
)
HEADERS = st.one_of(
    LINES,
    st.tuples(
        NAMES,
        st.sampled_from(
            ["", " --force", " -f", " --force x", " --bogus", " --inputs", " --inputs '[x'"]
        ),
    ).map("".join),
)


# -- 1. magic arguments ------------------------------------------------------------------


@PROPERTY
@given(line=LINES)
@example(line="pin " + "x" * 400)  # echoes the whole name
@example(line="bogus" * 80)  # echoes the whole command
@example(line="list a\x0bb")  # echoes the raw argument
@example(line="list '\x1b[2J'")
@example(line="clear nope\u2028x")
def test_step_line_magic_refuses_bad_lines_in_one_line_and_keeps_the_store(env, line):
    check_magic(env, "line", line)


@PROPERTY
@given(line=HEADERS)
@example(line="a " + "b" * 400)  # echoes every name
@example(line="--" + "x" * 400)  # echoes the whole option
@example(line="a '\x1b[2J'")
def test_step_cell_magic_refuses_bad_headers_in_one_line_and_keeps_the_store(env, line):
    check_magic(env, "cell", line)


@pytest.mark.parametrize(
    "kind, line",
    [
        ("line", "list"),
        ("line", "pin keep"),
        ("line", "unpin keep"),
        ("line", "run other"),
        ("line", "run"),
        ("line", "takeover"),
        ("line", "panel"),
        ("cell", "other"),
        ("cell", "other --force"),
        ("cell", "other --inputs '*.ipynb' 'data/**/*.csv'"),
        ("cell", ""),
    ],
)
def test_good_magic_lines_work_and_keep_the_recorded_step(env, kind, line):
    env.restore()
    assert magic(env, kind, line)
    assert_keep_replays(env)


# -- 2. sub-step ids -------------------------------------------------------------------------

_runs = itertools.count()


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a recorded sub-step ran again instead of replaying")


def fresh_session(env: Env, run: str) -> engine.Session:
    engine.reset_session()
    session = session_for(env.shell)
    session.set_run(run)
    return session


#: The body of step ``in_step`` in calls(): every call in one execution.
CALLS = "got = [step(i, f) for i, f in CALLS]"


class returning:  # noqa: N801 (used as a function)
    """A sub-step function returning ``value``; while ``armed``, calling it fails.

    A replay must be given the same function as the recorded call (an edited
    one is called again), so the replay uses an armed one that compares the
    same: its fingerprint is its value (the escape hatch), never ``armed``.
    """

    armed = False

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        if type(self).armed:
            raise AssertionError("a recorded sub-step ran again instead of replaying")
        return self.value

    def __nbdurable_fingerprint__(self) -> str:
        return repr(self.value)


def calls(env: Env, pairs: list[tuple[str, Any]], *, in_step: str | None) -> list[Any]:
    """``[step(id, fn) for id, fn in pairs]`` outside any step, or inside step ``in_step``."""
    if in_step is None:
        return [nbdurable.step(sub_id, fn) for sub_id, fn in pairs]
    env.shell.user_ns["CALLS"] = pairs
    engine.get_session().steps.run_step(CALLS, name=in_step, force=True)
    return env.shell.user_ns["got"]


def replayed(env: Env, pairs: list[tuple[str, Any]], *, in_step: str | None) -> list[Any]:
    """What ``step(id, returning(value))`` returns for each pair when it must not run."""
    returning.armed = True
    try:
        return calls(env, [(i, returning(v)) for i, v in pairs], in_step=in_step)
    finally:
        returning.armed = False


NON_STR_IDS = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.binary(max_size=20),
    st.tuples(st.text(max_size=5), st.integers()),
    st.lists(st.text(max_size=5), max_size=3),
    st.builds(Path, st.text(max_size=10)),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CONTROL = st.sampled_from([chr(c) for c in range(0x20)] + ["\x7f"])
VALID_CHAR = st.characters(
    exclude_categories=("Cs",),  # lone surrogates: see the test of their own below
    exclude_characters="".join(chr(c) for c in range(0x20)) + "\x7f",
)
BAD_STR_IDS = st.one_of(
    st.just(""),
    st.builds(
        lambda unit, n: (unit * n)[:n], st.text(min_size=1, max_size=6), st.integers(513, 20_000)
    ),
    st.tuples(st.text(max_size=20), CONTROL, st.text(max_size=20)).map("".join),
)
PATHLIKE_IDS = [
    "../x", "../../etc/passwd", "a/b", "/", "//", "a//b", "/a/", "~", "~/x", "~run",
    "~run/x", "name:keep", "name:keep/a/b", "u/x", "s/x", "b/" + "0" * 64, "r/", "meta/format",
    ".", "..", " ", "\u00a0", "\ufeff", "\u200b", "\u202e", "\x85", "\u2028", "é", "e\u0301",
    "\U0001f642", "x" * 512, "%s", "{}", "\\", "*", "?", "'", '"', "C:\\x", "nul",
]  # fmt: skip
VALID_IDS = st.one_of(
    st.sampled_from(PATHLIKE_IDS),
    st.text(VALID_CHAR, min_size=1, max_size=40),
    st.builds(lambda unit, n: (unit * n)[:n], st.text(VALID_CHAR, min_size=1), st.integers(1, 512)),
)


@PROPERTY
@given(bad=NON_STR_IDS)
def test_non_str_ids_raise_a_one_line_type_error_and_write_nothing(env, bad):
    env.restore()
    fresh_session(env, "ids")
    with pytest.raises(TypeError) as err:
        nbdurable.step(bad, _must_not_run)
    # A TypeError, and a bad input to nbdurable: a notebook shows it in one line.
    assert isinstance(err.value, nbdurable.UsageProblem)
    assert_one_line(str(err.value))
    engine.reset_session()
    assert snapshot(env.store) == env.before


@PROPERTY
@given(bad=BAD_STR_IDS)
def test_bad_str_ids_raise_a_one_line_usage_problem_and_write_nothing(env, bad):
    env.restore()
    fresh_session(env, "ids")
    with pytest.raises(nbdurable.UsageProblem) as err:
        nbdurable.step(bad, _must_not_run)
    assert isinstance(err.value, ValueError)
    assert_one_line(str(err.value))
    engine.reset_session()
    assert snapshot(env.store) == env.before


@PROPERTY
@given(sub_id=VALID_IDS)
def test_every_other_id_is_recorded_and_replayed_exactly_in_both_scopes(env, sub_id):
    run = f"ids-{next(_runs)}"
    fresh_session(env, run)
    outside, inside = ["outside", sub_id], ["inside", sub_id]
    assert calls(env, [(sub_id, returning(outside))], in_step=None) == [outside]
    assert calls(env, [(sub_id, returning(inside))], in_step="ids") == [inside]
    session = fresh_session(env, run)
    assert replayed(env, [(sub_id, outside)], in_step=None) == [outside]
    assert replayed(env, [(sub_id, inside)], in_step="ids") == [inside]
    for scope in (RUN_SCOPE, "name:ids"):  # the id is kept exactly
        assert session.store.has(session.keys.sub(scope, sub_id)), scope


def _variants(base: str) -> list[str]:
    """``base`` as other spellings a human might call "the same id"."""
    forms = [base, base.lower(), base.upper(), base.casefold(), base.swapcase()]
    forms += [unicodedata.normalize(f, base) for f in ("NFC", "NFD", "NFKC", "NFKD")]
    forms += [base + " ", base + "  ", base + "\u00a0", base + "\u3000", " " + base]
    return [f for f in dict.fromkeys(forms) if 0 < len(f) <= 512 and not _CONTROL.search(f)]


@PROPERTY
@given(base=st.text(VALID_CHAR, min_size=1, max_size=20))
@example(base="é")  # NFC "é" vs NFD "e\u0301"
@example(base="Search")
@example(base="ﬁle")  # NFKC folds the ligature
@example(base="\u212a")  # KELVIN SIGN: NFC is "K"
@example(base="straße")  # upper() is "STRASSE"
def test_ids_differing_by_normalization_case_or_trailing_space_never_collide(env, base):
    forms = _variants(base)
    run = f"forms-{next(_runs)}"
    fresh_session(env, run)
    for in_step in (None, "ids"):
        values = [[in_step, "value of", f] for f in forms]
        pairs = [(f, returning(v)) for f, v in zip(forms, values, strict=True)]
        assert calls(env, pairs, in_step=in_step) == values
    fresh_session(env, run)
    for in_step in (None, "ids"):
        values = [[in_step, "value of", f] for f in forms]
        pairs = list(zip(forms, values, strict=True))
        assert replayed(env, pairs, in_step=in_step) == values


@PROPERTY
@given(name=VALID_NAMES, tail=VALID_IDS)
@example(name="x", tail="y")
def test_a_run_scope_id_never_collides_with_a_step_scoped_one(env, name, tail):
    """``r/<run>/u/~run/name:x/y`` (outside steps) vs ``r/<run>/u/name:x/y`` (in step x)."""
    outside = f"name:{name}/{tail}"[:512]
    run = f"scopes-{next(_runs)}"
    fresh_session(env, run)
    assert calls(env, [(outside, returning("outside"))], in_step=None) == ["outside"]
    assert calls(env, [(tail, returning("in the step"))], in_step=name) == ["in the step"]
    fresh_session(env, run)
    assert replayed(env, [(outside, "outside")], in_step=None) == ["outside"]
    assert replayed(env, [(tail, "in the step")], in_step=name) == ["in the step"]
    # Clearing the step leaves the run-scope call alone.
    assert magic(env, "line", f"clear {name}")
    fresh_session(env, run)
    assert replayed(env, [(outside, "outside")], in_step=None) == ["outside"]


def _notebook_json(cells: list[tuple[str, str]]) -> str:
    """nbformat 4.5 JSON written by hand (so nbformat does not check the cell ids)."""
    return json.dumps(
        {
            "nbformat": 4,
            "nbformat_minor": 5,
            "metadata": {},
            "cells": [
                {
                    "cell_type": "code",
                    "id": cid,
                    "metadata": {},
                    "outputs": [],
                    "execution_count": None,
                    "source": source,
                }
                for cid, source in cells
            ],
        }
    )


def test_sub_steps_of_cells_whose_ids_share_a_slash_prefix_never_collide(env):
    """Unnamed steps are keyed by the saved cell id: ``id:a`` and ``id:a/b``.

    Sub-step ``b/c`` of cell ``a`` and sub-step ``c`` of cell ``a/b`` would
    both be ``r/<run>/u/id:a/b/c`` if the cell id went into the key as it is.
    """
    first = "r1 = step('b/c', lambda: 'from cell a')"
    second = "r2 = step('c', lambda: 'from cell a/b')"
    env.restore()
    (env.root / "nb.ipynb").write_text(
        _notebook_json([("a", f"%%step\n{first}"), ("a/b", f"%%step\n{second}")])
    )
    env.shell.run_cell_magic("step", "", first)
    env.shell.run_cell_magic("step", "", second)
    assert env.shell.user_ns["r1"] == "from cell a"
    assert env.shell.user_ns["r2"] == "from cell a/b"


# -- ids and paths that are not UTF-8 -------------------------------------------------------


@pytest.mark.parametrize("sub_id", ["\udcff.txt", "\ud800"])
def test_an_id_with_a_lone_surrogate_is_refused_in_one_line_or_kept_exactly(env, sub_id):
    """``os.listdir`` gives ``'\\udcff.txt'`` for a file named ``b'\\xff.txt'``."""
    run = f"surrogates-{next(_runs)}"
    fresh_session(env, run)
    try:
        value = nbdurable.step(sub_id, returning("value"))
    except nbdurable.UsageProblem as exc:
        assert_one_line(str(exc))
        return
    assert value == "value"
    fresh_session(env, run)
    assert replayed(env, [(sub_id, "value")], in_step=None) == ["value"]


def test_a_notebook_path_that_is_not_utf8_still_records_and_replays(env):
    env.restore()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NBDURABLE_NOTEBOOK", os.fsdecode(bytes(env.root) + b"/\xff.ipynb"))
        env.shell.run_cell_magic("step", "odd", "odd = 1")
        engine.reset_session()
        env.shell.run_cell_magic("step", "odd", "odd = 1")
        assert engine.get_session().status.get("name:odd") == ("replayed", "")


# -- 3. CLI arguments ----------------------------------------------------------------------------

#: argv strings hold no NUL; lone surrogates they may (undecodable bytes).
ARG_CHAR = st.characters(exclude_categories=(), exclude_characters="\x00")
ARG = st.text(ARG_CHAR, max_size=16)
PATH_SAMPLES = [
    "", ".", "..", "/", "~", "~/nb.ipynb", "../../x", "a/b", "missing.ipynb",
    "/dev/null", "/proc/self", STORE, "x" * 300, "a/" * 2_100,
    "a\nb.ipynb", "\x1b[2J.ipynb", "é.ipynb", "\udcff.ipynb", "-", "--", "-x.ipynb",
    "~nosuchuser/nb.ipynb",
]  # fmt: skip
PATHS = st.one_of(st.sampled_from(PATH_SAMPLES), ARG)
NOTEBOOKS = st.one_of(st.just(NOTEBOOK), PATHS)
NUMBER_SAMPLES = [
    "-1", "0", "1", "x", "", " ", "1.5", "1e309", "nan", "inf", "-inf", "0x10",
    "\u0663", "1_000", "9" * 30, "3 ", "1e-9",
]  # fmt: skip
NUMBERS = st.one_of(
    st.sampled_from(NUMBER_SAMPLES),
    st.integers().map(str),
    st.floats().map(str),
    ARG,
)
AGES = st.one_of(
    st.sampled_from(["30d", "0", "0s", "-1d", "1e309d", "nan", "infd", "d", "", " ", "2w", "12x"]),
    st.tuples(NUMBERS, st.sampled_from(["", "s", "m", "h", "d", "w", "y"])).map("".join),
    ARG,
)
STEPS = st.one_of(st.sampled_from(["keep", "name:keep", "nope", "~run", "cell #3"]), ARG, HUGE)
RUNS = st.one_of(st.sampled_from(["nb.ipynb", "other", "../x", "a b", "x" * 129]), ARG)
UNKNOWN = st.one_of(st.sampled_from(["--bogus", "-z", "--run=", "--=x", "---", "-"]), ARG)


def _opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(values.map(lambda v: [flag, v]), values.map(lambda v: [f"{flag}={v}"]))


COMMON = [_opt("--run", RUNS), _opt("--store", PATHS), st.just(["--json"]), UNKNOWN.map(list)]
OPTIONS = {
    "run": COMMON
    + [
        _opt("--retries", NUMBERS),
        _opt("--timeout", NUMBERS),
        _opt("--cwd", PATHS),
        _opt("-o", PATHS),
        _opt("--kernel", ARG),
        st.just(["--takeover"]),
        st.just(["-q"]),
    ],
    "status": COMMON,
    "clear": [*COMMON, STEPS.map(lambda s: [s]), st.just(["--all"])],
    "pin": [*COMMON, STEPS.map(lambda s: [s])],
    "unpin": [*COMMON, STEPS.map(lambda s: [s])],
    "export": [*COMMON, _opt("--format", st.one_of(st.sampled_from(["json", "jsonl"]), ARG))]
    + [st.just(["--values"])],
    "ls": [_opt("--store", PATHS), st.just(["--json"]), UNKNOWN.map(list)],
    "gc": [
        _opt("--store", PATHS),
        _opt("--older-than", AGES),
        st.just(["--dry-run"]),
        st.just(["--json"]),
        UNKNOWN.map(list),
    ],
    # A notebook that does not exist, as for `run`: it must fail before any kernel.
    "verify": COMMON
    + [_opt("--timeout", NUMBERS), _opt("--cwd", PATHS), _opt("-o", PATHS), st.just(["-q"])],
    "diff": [
        RUNS.map(lambda r: [r]),
        _opt("--step", STEPS),
        _opt("--store", PATHS),
        st.just(["--json"]),
        UNKNOWN.map(list),
    ],
    "fork": [*COMMON, RUNS.map(lambda r: [r]), _opt("--from", STEPS)],
    # Always with a bad value: `demo` with good arguments would start kernels.
    "demo": [_opt("--crash-at", NUMBERS), _opt("--dir", PATHS), UNKNOWN.map(list)],
}
BAD_LATENCY = st.sampled_from(["-1", "11", "nan", "inf", "x", "", "1e309", "10.000001"])
MUTATING = {"clear", "pin", "unpin", "gc", "fork"}


def _argv(command: str) -> st.SearchStrategy[list[str]]:
    pieces = st.lists(st.one_of(*OPTIONS[command]), max_size=4)
    if command in ("run", "verify"):  # no such notebook: must fail before any kernel
        head = PATHS.map(lambda p: [p])
    elif command in ("ls", "gc"):
        head = st.just([])
    elif command == "demo":
        head = _opt("--latency", BAD_LATENCY)
    else:
        head = NOTEBOOKS.map(lambda p: [p])
    return st.tuples(head, pieces).map(lambda t: [command, *t[0], *(a for p in t[1] for a in p)])


def nbd(argv: list[str]) -> tuple[int, str, str]:
    """``nbdurable ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse exits on bad usage, --help and --version
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def check_cli(env: Env, argv: list[str]) -> tuple[int, str, str]:
    env.restore()
    code, out, err = nbd(argv)
    assert "Traceback" not in out + err, err
    assert code in (0, 2), (code, out, err)
    if code == 2:
        assert err.endswith("\n") and err.count("\n") == 1, f"not one line: {err!r}"
        assert_one_line(err[:-1], limit=None)
    after = snapshot(env.store)
    if code != 0 or not argv or argv[0] not in MUTATING or "--dry-run" in argv:
        assert after == env.before, "the store changed"
    assert env.files() == ["cwd", "home", "nb.ipynb"], "a file appeared"
    return code, out, err


@pytest.mark.parametrize(
    ("call", "said"),
    [
        ('step("", len, "a")', "a sub-step id must not be empty: pass a non-empty str"),
        ('step(123, len, "a")', "a sub-step id must be a str, got int"),
        ('step("a", 42)', "step('a', fn, ...): fn must be callable, got int"),
    ],
)
def test_bad_api_arguments_in_a_plain_cell_are_one_line(env, capsys, call, said):
    """Outside a step too, a bad argument is IPython's one-line UsageError."""
    env.restore()
    shell = InteractiveShell.instance()
    capsys.readouterr()
    result = shell.run_cell(call)
    err = capsys.readouterr().err
    assert not result.success
    assert err.startswith(f"UsageError: {said}") and err.count("\n") == 1, err
    assert snapshot(env.store) == env.before


@pytest.mark.parametrize(
    "argv",
    [
        ["status", NOTEBOOK, "--store", "no/such/store"],  # mistyped: not "all pending"
        ["status", NOTEBOOK, "--why", "nosuchstep"],
        ["status", NOTEBOOK, "--why", "keep", "--store", "no/such/store"],
    ],
    ids=" ".join,
)
def test_cli_read_only_commands_refuse_what_is_not_there(env, argv):
    code, out, err = check_cli(env, argv)
    assert code == 2 and not out, (out, err)


@pytest.mark.parametrize("command", list(OPTIONS))
@settings(PROPERTY, max_examples=40)
@given(data=st.data())
def test_cli_bad_arguments_exit_2_with_one_line_and_keep_the_store(env, command, data):
    check_cli(env, data.draw(_argv(command), label="argv"))


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "x" * 300 + ".ipynb"],  # a file name too long for the file system
        ["run", "x" * 300 + ".ipynb"],
        ["ls", "--store", "y" * 300],
        ["status", "a\nb.ipynb"],  # echoed into the message as it is
        ["status", NOTEBOOK, "--run", "\x1b[2J"],
        ["bogus\x1b[2J"],
        ["status", NOTEBOOK, "extra\u2028arg"],
        [],
        ["--bogus"],
        ["demo", "--latency", "11"],
        ["status", "~nosuchuser/nb.ipynb"],  # `~user` of no user: expanduser() raises
        ["ls", "--store=--"],  # argparse gives the option [] instead of a str
        ["status", NOTEBOOK, "--run=--"],
        ["gc", "--older-than=--"],
        ["gc", "--older-than", "1e12"],  # a cutoff before year 1: time.localtime() overflows
        ["gc", "--older-than", "1e12", "--dry-run"],
    ],
    ids=lambda a: repr(a)[:40],
)
def test_cli_known_bad_arguments(env, argv):
    check_cli(env, argv)


@settings(PROPERTY, max_examples=40)
@given(argv=st.lists(st.one_of(UNKNOWN, st.sampled_from(["--version", "-h"])), max_size=3))
def test_cli_top_level_arguments(env, argv):
    if argv and argv[0] in OPTIONS:
        return  # a real command: covered above, per command
    check_cli(env, argv)


@pytest.mark.parametrize("spelling", [NOTEBOOK, "../cwd/../nb.ipynb", "./" + NOTEBOOK, "ABSOLUTE"])
def test_cli_spellings_of_one_notebook_name_the_run_its_kernel_records(env, spelling):
    """The kernel records to run ``nb.ipynb`` (its path relative to the store's parent)."""
    env.restore()
    path = str(env.root / "nb.ipynb") if spelling == "ABSOLUTE" else spelling
    code, out, err = check_cli(env, ["status", path, "--json"])
    assert code == 0, err
    status = json.loads(out)
    assert status["run"] == "nb.ipynb", status
    assert {s["key"]: s["state"] for s in status["steps"]}["name:keep"] == "pinned", status


@pytest.mark.parametrize(
    "argv",
    [
        ["status", NOTEBOOK],
        ["status", NOTEBOOK, "--json", "--run", "nb.ipynb"],
        ["export", NOTEBOOK, "--format", "jsonl", "--values"],
        ["ls", "--json"],
        ["gc", "--dry-run", "--older-than", "0s"],
        ["--version"],
        ["status", "-h"],
        ["pin", NOTEBOOK, "keep"],
        ["unpin", NOTEBOOK, "name:keep"],
        ["clear", NOTEBOOK, "keep"],
        ["gc", "--older-than", "0s", "--store", STORE],
    ],
    ids=" ".join,
)
def test_cli_good_arguments_exit_0(env, argv):
    code, out, err = check_cli(env, argv)
    assert code == 0 and not err, (out, err)
