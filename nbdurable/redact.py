r"""Keeping secrets out of the store.

The values of environment variables whose names look secret (``*KEY*``,
``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, any case; not those that name a
place, ``*_DIR``, ``*_PATH``, ``*_FILE``, ``*_HOME``, ``*_CACHE``) must never be
written to the store. Before a value is written, its bytes are searched for each such
secret (as UTF-8 text, which is how pickle stores a ``str``); a value that
contains one is not written, and the warning names the step, the variable
and the environment variable, never the secret itself.

Keys typed literally into a notebook (``client = OpenAI(api_key="sk-...")``)
are found by their well-known formats (OpenAI, Anthropic, AWS, GitHub,
Google, Slack, Stripe, JWTs: :data:`KEY_FORMATS`) after any delimiter and
before any (``api_key=sk-...``, ``.../v1/AIza.../models``, ``"\nsk-..."``
written in source), but not inside a base64 run (see ``_EDGE_BEFORE_KEY``),
and inside a pickle (after a string's or bytes' opcode and a length that can
hold the key); credentials by what stands before them (an ``Authorization``
scheme's token, a URL's password, a URL's ``key``, ``token`` or ``password``
parameter), wherever nbdurable writes: a value holding one is not written,
like an environment secret; outputs and a step's source have it replaced by
``[redacted openai key]`` (:func:`scrub` masks both kinds, before any cut).
In a name (a step's, a sub-step id, a variable's) a key is also found after
``_``, ``.`` and ``:`` (:func:`name_key_names`). Such a finding is named
``"openai key"`` (a kind and `` key``) where an environment secret is named
by its variable; :func:`said` words a list of both for a warning.

Text, bytes, bytearrays and memoryviews of bytes are searched where they lie,
never copied (:func:`searchable`: ``secret in view`` is no substring search).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import os
import re
from typing import Any

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
#: A variable that names a place holds a path, not a secret: llama-index sets
#: ``TIKTOKEN_CACHE_DIR`` to its cache folder, ssh tools ``*_KEY_FILE``.
_PLACE_NAME = re.compile(r"_(DIR|PATH|FILE|HOME|CACHE)$", re.IGNORECASE)
#: Shorter values are too likely to occur by chance ("1", "true") to hunt for.
MIN_SECRET_LENGTH = 8
#: Our own store key may be a secret too, but it is not a user secret to hunt.
_OURS = {"NBDURABLE_KEY"}


def secrets_in_env(environ: dict[str, str] | None = None) -> dict[str, bytes]:
    """``{variable name: value as UTF-8}`` for secret-looking environment variables.

    Called before every write, so it reads ``os.environ``'s raw storage and
    remembers which names look secret, instead of decoding every variable
    each time (a few microseconds, not a hundred).
    """
    global _last_env
    if environ is not None:
        items: Any = ((k.encode(), v.encode("utf-8")) for k, v in environ.items())
    else:
        raw = getattr(os.environ, "_data", None)
        if raw is None:  # pragma: no cover - every CPython has it
            return secrets_in_env(dict(os.environ))
        # The environment as last read, compared whole (names and values, in C):
        # a changed or added variable is seen at once, and an unchanged one costs
        # no loop in Python per write.
        seen, found = _last_env  # (one read: another thread may replace the pair)
        if raw == seen:
            return dict(found)
        items = raw.items()
    out: dict[str, bytes] = {}
    for key, value in items:
        looks = _looks_secret.get(key)
        if looks is None:
            name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
            looks = _looks_secret[key] = (
                bool(_SECRET_NAME.search(name))
                and not _PLACE_NAME.search(name)
                and name not in _OURS
            )
        if looks:
            val = value if isinstance(value, bytes) else value.encode("utf-8")
            if len(val.strip()) >= MIN_SECRET_LENGTH:
                name = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
                out[name] = val
    if environ is None:
        _last_env = (dict(raw), dict(out))
    return out


_looks_secret: dict[Any, bool] = {}
#: (os.environ's raw storage as last read, the secrets found in it)
_last_env: tuple[Any, dict[str, bytes]] = (None, {})


def find_secrets(data: bytes | str, secrets: dict[str, bytes] | None = None) -> list[str]:
    """Names of the environment variables whose secret value occurs in ``data``."""
    secrets = secrets_in_env() if secrets is None else secrets
    if not secrets:
        return []
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return sorted(name for name, value in secrets.items() if value in raw)


def redact_text(text: str, secrets: dict[str, bytes] | None = None) -> tuple[str, list[str]]:
    """``text`` with every secret replaced by ``[redacted $NAME]``, and the names found."""
    secrets = secrets_in_env() if secrets is None else secrets
    found = []
    for name, value in secrets.items():
        plain = value.decode("utf-8", "replace")
        if plain in text:
            text = text.replace(plain, f"[redacted ${name}]")
            found.append(name)
    return text, sorted(found)


# -- well-known key formats ----------------------------------------------------

# Characters that may neither precede nor follow a key: those of keys and of
# base64 (standard and URL-safe) runs.
# (after an escape written in source or JSON, ``"\\nsk-..."``, a key starts too)
_EDGE_BEFORE = r"(?:(?<![A-Za-z0-9_+/=-])|(?<=\\[nrt]))"
_EDGE_AFTER = r"(?![A-Za-z0-9_+/=-])"
# A key is found after any delimiter and before any: ``=``, ``/`` and ``+``
# too (``api_key=sk-...``, ``.../v1/AIza.../models``). Where one edge is such
# a character the other must be a plain one: a key-shaped run inside a base64
# run (where ``/``, ``=`` and ``+`` abound) is no key. Keys whose fixed part
# holds ``-``, ``_`` or ``.`` (:data:`_NOT_IN_BASE64`) cannot lie inside a
# standard base64 run, nor beside ``/``, ``+`` in a URL-safe one: both their
# edges may be loose. (``_`` joins a key to a name, as in ``f"ask_{key}"``:
# :func:`name_key_names` looks after it, in names only, since in URL-safe
# base64 it is as common as a letter.)
_EDGE_BEFORE_KEY = r"(?:(?<![A-Za-z0-9_+-])|(?<=\\[nrt]))"
_EDGE_AFTER_KEY = r"(?![A-Za-z0-9_-])"


#: ``kind: pattern`` (as text); order matters where one prefix contains another.
KEY_FORMATS: dict[str, str] = {
    # (a digit is required: hyphenated prose such as "sk-learn-..." has none)
    "anthropic": r"sk-ant-(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{20,}",
    "openai": r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?(?=[A-Za-z_-]*[0-9])[A-Za-z0-9_-]{20,}",
    "aws": r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",
    "github": r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    "google": r"AIza[0-9A-Za-z_-]{35}",
    "slack": r"xox[abposr]-(?=[A-Za-z-]*[0-9])[A-Za-z0-9-]{10,}",
    "stripe": r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",
    "jwt": r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
}
#: Credentials known by what stands before them, in any format: an
#: ``Authorization`` scheme's token, a URL's password, a URL's key, token or
#: password parameter. Taken only where no key format matched.
_LABELLED = {
    "credential": (
        # A digit, or a capital after a small letter, is required: "a basic
        # internationalization guide" is prose. Base64 may have neither digit nor
        # padding ("user32:..." encodes to "dXNlcjMy..."), but a capital after a
        # small letter it has (its "user" is always "dXNl").
        r"(?i:(?<![A-Za-z0-9_])(?:bearer|basic|token))[ \t]+"
        # (each run's class leaves out what ends it: linear, whatever follows the label)
        r"(?P<secret>(?=[A-Za-z._~+/-]*[0-9]|[A-Z0-9._~+/-]*[a-z][a-z0-9._~+/-]*[A-Z])"
        r"[A-Za-z0-9._~+/-]{16,}=*)",
        r"://[^/\s:@]{1,64}:(?P<secret>[^/\s@]{3,})@",
        r"[?&;](?i:api[_-]?key|key|token|access[_-]?token|auth|password|passwd|pwd|secret)"
        r"=(?P<secret>[^&\s#\"';]{8,})",
    ),
}
# An AWS secret key has no prefix: 40 characters of base64. It is taken only
# after its usual label, or within a few lines after an access key id.
_AWS_SECRET_LABELLED = (
    r"(?i:aws_secret_access_key|secret_access_key|secretaccesskey)"
    r"[\"']?\s*[:=]\s*[\"']?(?P<secret>[A-Za-z0-9/+]{40})" + _EDGE_AFTER
)
_AWS_SECRET_NEAR = _EDGE_BEFORE + r"[A-Za-z0-9/+]{40}" + _EDGE_AFTER
_NEAR = 300  # characters after an access key id in which a bare secret key is taken


# In bytes, a key may also follow a pickle opcode and its length: a short
# string's (``\x8c`` and one byte, which may well be a letter: 0x2b is "+"),
# short bytes' (``C`` and one byte: a 51-byte key's is "3"), a longer string's
# or bytes' (``X`` or ``B`` and four little-endian bytes, whose last is a letter
# only for a string of 700 MB or more). A letter before ``C`` or ``X`` five
# places back is common in text and base64 (one run in twenty), so a key
# admitted only by such a lookbehind is kept only if the length it follows can
# hold it (see :func:`_pickled_fits`).
_PICKLED = r"|(?<=\x8c[\x00-\xff])|(?<=C[\x00-\xff])|(?<=[XB][\x00-\xff]{4})"
#: Bytes that no edge lets stand before a key: a key after one of them was
#: admitted by a pickle opcode's lookbehind.
_KEY_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-")
_EDGE_BEFORE_BYTES = "(?:" + _EDGE_BEFORE + _PICKLED + ")"
_EDGE_BEFORE_KEY_BYTES = "(?:" + _EDGE_BEFORE_KEY + _PICKLED + ")"


def _compile(pattern: str) -> tuple[re.Pattern[str], re.Pattern[bytes]]:
    """``pattern`` for text, and for bytes (where pickle opcodes may stand before a key)."""
    as_bytes = (
        pattern.replace("{KEY_BEFORE}", _EDGE_BEFORE_KEY_BYTES)
        .replace(_EDGE_BEFORE, _EDGE_BEFORE_BYTES)
        .encode("latin-1")
    )
    return re.compile(pattern.replace("{KEY_BEFORE}", _EDGE_BEFORE_KEY)), re.compile(as_bytes)


#: Kinds whose keys hold a ``-``, ``_`` or ``.`` in their fixed part (see _EDGE_BEFORE_KEY).
_NOT_IN_BASE64 = frozenset({"openai", "anthropic", "github", "slack", "stripe", "jwt"})


def _key_pattern(kind: str, pattern: str) -> str:
    """``pattern`` between its edges: both may be loose, or one (see _EDGE_BEFORE_KEY)."""
    if kind in _NOT_IN_BASE64:
        return f"{{KEY_BEFORE}}(?:{pattern}){_EDGE_AFTER_KEY}"
    return (
        f"(?:{{KEY_BEFORE}}(?:{pattern}){_EDGE_AFTER}|{_EDGE_BEFORE}(?:{pattern}){_EDGE_AFTER_KEY})"
    )


_KEYS = {kind: _compile(_key_pattern(kind, pattern)) for kind, pattern in KEY_FORMATS.items()}
_AWS_LABELLED = _compile(_AWS_SECRET_LABELLED)
_AWS_NEAR = _compile(_AWS_SECRET_NEAR)
_LABELLED_RE = {kind: [_compile(p) for p in patterns] for kind, patterns in _LABELLED.items()}


def _spans_in(data: Any) -> list[tuple[int, int, str]]:
    """``(start, end, kind)`` of every key in ``data``, overlapping ones included."""
    which = 0 if isinstance(data, str) else 1  # bytes, or a buffer of them
    spans: list[tuple[int, int, str]] = []
    for kind, patterns in _KEYS.items():
        spans += [(m.start(), m.end(), kind) for m in patterns[which].finditer(data)]
    aws_ids = [s for s in spans if s[2] == "aws"]
    for m in _AWS_LABELLED[which].finditer(data):
        spans.append((m.start("secret"), m.end("secret"), "aws"))
    for _, end, _ in aws_ids:
        for m in _AWS_NEAR[which].finditer(data, end):
            if m.start() > end + _NEAR:
                break
            spans.append((m.start(), m.end(), "aws"))
    for kind, patterns in _LABELLED_RE.items():
        for pattern in patterns:
            for m in pattern[which].finditer(data):
                a, b = m.start("secret"), m.end("secret")
                if not any(s < b and a < e for s, e, _ in spans):  # a key format said it
                    spans.append((a, b, kind))
    return spans


#: What every key format (or the AWS secret's label) holds: the patterns run only
#: in windows around these, so a large value without any costs a few ``find`` calls.
_HINTS = ("sk-", "AKIA", "ASIA", "ABIA", "ACCA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
          "github_pat_", "AIza", "ecret", "ECRET", "xox", "_live_", "_test_", "eyJ",
          "earer", "EARER", "asic", "ASIC", "oken ", "OKEN ", "://", "key=", "KEY=",
          "oken=", "OKEN=", "auth=", "AUTH=", "assword=", "ASSWORD=", "passwd=",
          "PASSWD=", "pwd=", "PWD=", "ecret=", "ECRET=")  # fmt: skip
_HINTS_B = tuple(h.encode() for h in _HINTS)
#: A window reaches this far before a hint (a label's start) and after it (the
#: longest key, or an AWS id, the gap to its secret key and that key).
_BEFORE, _AFTER = 64, 640


#: Any hint, in one pass: twice as fast as a ``find`` per hint, and works on a
#: memoryview. A hint that starts inside another's match is not reported; its
#: window would reach at most a hint's length (11) further than the other's,
#: well within the margin of _AFTER.
def _trie(words: tuple[str, ...]) -> str:
    """A pattern matching any of ``words``, factored on common prefixes.

    ``re`` tries an alternation of literals one by one at each position; as
    a trie (``A(?:KIA|SIA|...)``) a position is left at its first character
    that starts no word: a header's few hundred characters take a third of
    the time. Where one word extends another, the longer one is matched.
    """
    tree: dict[str, Any] = {}
    for word in words:
        node = tree
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def pattern(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + pattern(node[ch]) for ch in sorted(node) if ch]
        if not alts:
            return ""
        if "" in node:
            return "(?:" + "|".join(alts) + ")?"
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return pattern(tree)


_ANY_HINT = re.compile(_trie(_HINTS))
_ANY_HINT_B = re.compile(_trie(_HINTS).encode())


def searchable(data: Any) -> Any:
    """``data`` as text, bytes, a bytearray or a byte-format memoryview, never copied.

    A view of a whole ``bytes`` or ``bytearray`` (a value's out-of-band buffer)
    is that object, whose ``find`` is a substring search; ``x in view`` is not.
    """
    if isinstance(data, memoryview):
        base = data.obj
        if isinstance(base, bytes | bytearray) and data.nbytes == len(base) and data.contiguous:
            return base
        return data.cast("B") if data.format != "B" or data.ndim != 1 else data
    return data


def _windows(data: Any, end: int) -> list[tuple[int, int]]:
    """Merged ``(start, end)`` windows of ``data[:end]`` around every hint."""
    hints = _ANY_HINT if isinstance(data, str) else _ANY_HINT_B
    found = [
        (max(0, m.start() - _BEFORE), min(end, m.start() + _AFTER))
        for m in hints.finditer(data, 0, end)
    ]  # in order of start
    merged: list[tuple[int, int]] = []
    for a, b in found:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


def _pickled_fits(data: Any, start: int, end: int) -> bool:
    r"""True unless ``data[start:end]`` stands after a key character (so a pickle
    opcode's lookbehind admitted it) with no opcode whose length holds it.

    A pickled string or bytes ends before the pickle does (at least its STOP
    follows) and holds the whole key, or ends where the key's match runs on into
    a memo opcode (``q`` or ``r`` of protocols 2 and 3, which are key
    characters; protocol 4's ``\x94`` is not). Ordinary text or base64 that
    merely has a ``C`` or ``X`` at the right place names a length that runs
    past the end or stops inside the key.
    """
    if isinstance(data, str) or start == 0 or data[start - 1] not in _KEY_CHARS:
        return True
    if start >= 2 and data[start - 2] == 0x5C and data[start - 1] in b"nrt":
        return True  # after an escape (see _EDGE_BEFORE_KEY)
    lengths = []
    if start >= 2 and data[start - 2] in (0x8C, 0x43):  # SHORT_BINUNICODE, SHORT_BINBYTES
        lengths.append(data[start - 1])
    if start >= 5 and data[start - 5] in (0x58, 0x42):  # BINUNICODE, BINBYTES
        lengths.append(int.from_bytes(bytes(data[start - 4 : start]), "little"))
    for n in lengths:
        after = start + n
        if after < len(data) and (after >= end or data[after] in (0x71, 0x72)):
            return True
    return False


def _spans(data: Any, end: int | None = None) -> list[tuple[int, int, str]]:
    """``(start, end, kind)`` of every key in ``data[:end]``, not overlapping, in order.

    ``data`` is text, bytes or a bytearray.
    """
    spans: list[tuple[int, int, str]] = []
    for a, b in _windows(data, len(data) if end is None else end):
        spans += [
            (s + a, e + a, kind)
            for s, e, kind in _spans_in(data[a:b])
            if _pickled_fits(data, s + a, e + a)
        ]
    spans.sort()
    kept: list[tuple[int, int, str]] = []
    for span in spans:
        if kept and span[0] < kept[-1][1]:
            continue  # inside one already taken (an id's window may meet a labelled secret)
        kept.append(span)
    return kept


def find_keys(data: Any, end: int | None = None) -> list[str]:
    """The kinds of well-known keys (``"openai"``, ``"aws"``, ...) in ``data[:end]``.

    ``data``: text, bytes, a bytearray or a memoryview of bytes (not copied).
    """
    return sorted({kind for _, _, kind in _spans(searchable(data), end)})


def key_names(data: Any, end: int | None = None) -> list[str]:
    """:func:`find_keys` as finding names: ``["openai key"]`` (see :func:`said`)."""
    return [f"{kind} key" for kind in find_keys(data, end)]


#: What joins words into a name: a key may follow any of them there.
_NAME_JOINS = re.compile(r"[_.:]")


def name_key_names(name: str) -> list[str]:
    """:func:`key_names` of a name (a step's, a sub-step's id, a variable's).

    In a name, ``_`` ``.`` and ``:`` join words, so a key is also looked for
    after each of them (``ask_sk-proj-...``): a name is short, and one refused
    by chance costs a rename, never a record.
    """
    return list(_name_key_names(name))


# A pure function of the name, asked of every sub-step id on every call (the same
# ids, run after run): remembered, as ``re`` remembers its compiled patterns.
@functools.lru_cache(maxsize=4096)
def _name_key_names(name: str) -> tuple[str, ...]:
    found = set(key_names(name))
    for m in _NAME_JOINS.finditer(name):
        found.update(key_names(name[m.end() :]))
    return tuple(sorted(found))


def scrub(text: str, secrets: dict[str, bytes] | None = None) -> tuple[str, list[str]]:
    """``text`` with environment secrets and well-known keys masked, and what was found.

    The one gate of a text nbdurable writes: run it before any cut, so a secret
    straddling the cut is masked whole.
    """
    text, names = redact_text(text, secrets)
    text, kinds = redact_keys(text)
    return text, names + [f"{kind} key" for kind in kinds]


def scrub_name(name: str, secrets: dict[str, bytes] | None = None) -> tuple[str, list[str]]:
    """A name (a variable's) masked as :func:`scrub` does, keys after ``_`` ``.`` ``:`` too."""
    masked, found = scrub(name, secrets)
    for kind in name_key_names(masked):
        masked = f"[redacted {kind}]"  # a name is short: what is left of it says nothing
        found.append(kind)
    return masked, sorted(set(found))


def masked_header(
    header: dict[str, Any], secrets: dict[str, bytes] | None = None
) -> dict[str, Any]:
    """A record's header with every secret in it masked: the store's last gate.

    The write paths mask what they know to be text (outputs, source, errors:
    :data:`_SCRUBBED`, not searched again) and refuse names; what else a
    header holds (the names of a step's inputs, a variable's name, a repr) is
    masked here, as it is written: a string by :func:`scrub`, a mapping's key
    (a name) by :func:`scrub_name`. A masked name never equals the live one,
    so a record that held one is not replayed as if it matched: its body runs
    again. Returns ``header`` itself (no copy) when masking would change
    nothing: when its strings, joined, hold no hint of a key and no
    environment secret (one regular-expression pass and a ``find`` per
    secret), or when the strings that do (an URL holds ``://``) mask to
    themselves.
    """
    secrets = secrets_in_env() if secrets is None else secrets
    strings: list[str] = []
    names: set[int] = set()  # indices in strings of a mapping's keys
    _strings(header, strings, names)
    text = "\n".join(strings)
    hints = [m.start() for m in _ANY_HINT.finditer(text)]
    found = [v for v in (v.decode("utf-8", "replace") for v in secrets.values()) if v in text]
    if not hints and not found:
        return header
    # Which strings _masked would scrub: those holding a hint (no hint holds
    # the newline that joins them) or a secret found in the whole.
    starts = list(itertools.accumulate((len(x) + 1 for x in strings[:-1]), initial=0))
    suspects = {bisect.bisect_right(starts, at) - 1 for at in hints}
    suspects.update(i for i, x in enumerate(strings) if any(v in x for v in found))
    # A string is masked by what it holds alone: each suspect once, as a name or a value.
    masks: tuple[dict[str, str], dict[str, str]] = ({}, {})
    for i in suspects:
        x, as_name = strings[i], i in names
        masks[as_name][x] = (scrub_name if as_name else scrub)(x, secrets)[0]
    if all(k == v for m in masks for k, v in m.items()):
        return header
    return _masked(header, masks)


#: Header fields their write paths masked already (outputs, a step's source).
_SCRUBBED = frozenset({"outputs", "printed", "source"})
#: Types whose values hold no string: not walked.
_NO_STRINGS = frozenset((int, float, bool, type(None)))


def _strings(value: Any, out: list[str], names: set[int], skip: frozenset[str] = _SCRUBBED) -> None:
    """Every string in ``value`` (as :func:`_masked` walks it) into ``out``; mapping keys'
    indices into ``names``. Only the header's own fields are ``skip``-ped: a variable
    called ``source`` among a step's inputs is searched like any other.
    """
    if type(value) in _NO_STRINGS:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k in skip:
                continue
            if isinstance(k, str):
                names.add(len(out))
                out.append(k)
            if type(v) is str:
                out.append(v)
            elif type(v) not in _NO_STRINGS:
                _strings(v, out, names, frozenset())
    elif isinstance(value, list | tuple):
        for v in value:
            if type(v) is str:
                out.append(v)
            elif type(v) not in _NO_STRINGS:
                _strings(v, out, names, frozenset())


def _masked(
    value: Any, masks: tuple[dict[str, str], dict[str, str]], skip: frozenset[str] = _SCRUBBED
) -> Any:
    """``value`` rebuilt with each string of ``masks`` (values, names) replaced by its mask
    (the header's own ``skip`` fields kept as they are, as :func:`_strings` walks it).
    """
    if isinstance(value, str):
        return masks[0].get(value, value)
    if isinstance(value, dict):
        return {
            (masks[1].get(k, k) if isinstance(k, str) else k): (
                v if k in skip else _masked(v, masks, frozenset())
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_masked(v, masks, frozenset()) for v in value]
    return value


def said(names: list[str]) -> str:
    """Findings for a warning: ``the value of $OPENAI_API_KEY``, ``literal aws and github keys``."""
    env = [f"${n}" for n in names if not n.endswith(" key")]
    kinds = [n[: -len(" key")] for n in names if n.endswith(" key")]
    parts = [f"the value of {', '.join(env)}"] if env else []
    if len(kinds) == 1:
        parts.append(f"a literal {kinds[0]} key")
    elif kinds:
        parts.append(f"literal {', '.join(kinds[:-1])} and {kinds[-1]} keys")
    return " and ".join(parts)


def redact_keys(data: Any, *, keep_length: bool = False) -> tuple[Any, list[str]]:
    """``data`` (text or bytes) with every well-known key replaced, and the kinds found.

    A key becomes ``[redacted KIND key]``; with ``keep_length=True`` it becomes
    that label cut or padded with ``*`` to the key's own length, so byte
    offsets and lengths around it stay valid.
    """
    spans = _spans(data)
    if not spans:
        return data, []
    is_bytes = isinstance(data, bytes)
    parts: list[Any] = []
    pos = 0
    for start, end, kind in spans:
        label = f"[redacted {kind} key]"
        if keep_length:
            label = (label + "*" * (end - start))[: end - start]
        parts += [data[pos:start], label.encode() if is_bytes else label]
        pos = end
    parts.append(data[pos:])
    joined = (b"" if is_bytes else "").join(parts)
    return joined, sorted({kind for _, _, kind in spans})
