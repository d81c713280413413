"""Well-known key formats are found and redacted; ordinary data is left alone."""

from __future__ import annotations

import base64
import hashlib
import os
import pickle
import random
import uuid

import pytest

from nbdurable.redact import find_keys, redact_keys, redact_text

# Built from pieces, so that no key-shaped literal sits in the source.
OPENAI = "sk-" + "proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" + "_-QQ7"
OPENAI_OLD = "sk-" + "T3BlbkFJ" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0"
ANTHROPIC = "sk-ant-" + "api03-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe-AAAA"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"  # AWS's own documentation example
AWS_TEMP = "ASIA" + "Y34FZKBOKMUTVV7A"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"  # documentation example
GITHUB = "ghp_" + "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" + "abcdefghijklmnopqrstuvwxyz_ABCDEFGHIJ"
GOOGLE = "AIza" + "SyA-1234567890abcdefghijklmnopqrstu"

KEYS = {
    "openai": [OPENAI, OPENAI_OLD],
    "anthropic": [ANTHROPIC],
    "aws": [AWS_ID, AWS_TEMP],
    "github": [GITHUB, GITHUB_PAT, "gho_" + GITHUB[4:], "ghs_" + GITHUB[4:]],
    "google": [GOOGLE],
}


@pytest.mark.parametrize(
    ("kind", "key"), [(kind, key) for kind, keys in KEYS.items() for key in keys]
)
def test_each_format_is_found_in_text_and_bytes(kind, key):
    for text in (key, f"api_key = '{key}'", f'{{"key": "{key}"}}', f"Bearer {key}\n"):
        assert find_keys(text) == [kind], text
        assert find_keys(text.encode()) == [kind], text
        out, kinds = redact_keys(text)
        assert kinds == [kind] and key not in out and f"[redacted {kind} key]" in out
        out_b, kinds_b = redact_keys(text.encode())
        assert kinds_b == [kind] and key.encode() not in out_b


def test_anthropic_key_is_not_also_an_openai_key():
    assert find_keys(ANTHROPIC) == ["anthropic"]


def test_aws_secret_next_to_its_id_or_after_its_label():
    creds = f"[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n"
    out, kinds = redact_keys(creds)
    assert kinds == ["aws"] and AWS_ID not in out and AWS_SECRET not in out
    labelled = f'{{"SecretAccessKey": "{AWS_SECRET}"}}'
    assert AWS_SECRET not in redact_keys(labelled)[0]
    # a lone 40-character run, with no id or label near it, is not taken for one
    assert find_keys(f"value: {AWS_SECRET}") == []


def test_keep_length_keeps_a_pickle_valid():
    value = {"note": f"key {OPENAI} and {GITHUB}", "n": 3}
    raw = pickle.dumps(value)
    out, kinds = redact_keys(raw, keep_length=True)
    assert kinds == ["github", "openai"] and len(out) == len(raw)
    back = pickle.loads(out)
    assert back["n"] == 3 and OPENAI not in back["note"] and GITHUB not in back["note"]
    assert back["note"].startswith("key [redacted openai key]")


def test_ordinary_data_does_not_fire():
    rng = os.urandom
    samples = [
        hashlib.sha256(b"x").hexdigest(),
        hashlib.sha1(b"x").hexdigest().upper(),
        str(uuid.uuid4()),
        uuid.uuid4().hex,
        "The task-management-system-for-everyone ships 2024; sk-learn-is-not-a-key-at-all.",
        "risk-0123456789abcdefghijklmnop and desk-1234567890abcdefghijkl",
        "AKIA is a prefix; AKIAFOO is too short; MASKIAIOSFODNN7EXAMPLE is inside a word",
        "ghp_short, github_pat_, AIza_short",
    ]
    # base64 of random bytes (an image's worth), plus runs that contain key
    # prefixes by chance: inside a base64 run they are not keys
    blob = base64.b64encode(rng(300_000)).decode()
    samples.append(blob)
    samples.append(blob[:1000] + AWS_ID + blob[1000:2000])
    samples.append(blob[:1000] + "AIza" + GOOGLE[4:] + blob[1000:2000])
    samples.append(base64.urlsafe_b64encode(rng(100_000)).decode()[:500] + "sk-" + OPENAI[3:] + "x")
    samples.append("data:image/png;base64," + blob[:5000])
    for sample in samples:
        assert find_keys(sample) == [], sample[:80]
        assert find_keys(sample.encode()) == [], sample[:80]
        assert redact_keys(sample) == (sample, [])


def test_environment_secrets_still_work_alongside():
    secrets = {"MY_TOKEN": b"plain-secret-value-123"}
    text, names = redact_text(f"token plain-secret-value-123 and {OPENAI}", secrets)
    assert names == ["MY_TOKEN"] and "[redacted $MY_TOKEN]" in text
    text, kinds = redact_keys(text)
    assert kinds == ["openai"] and OPENAI not in text and "$MY_TOKEN" in text


def test_a_variable_naming_a_place_is_not_a_secret():
    from nbdurable.redact import secrets_in_env

    env = {
        "TIKTOKEN_CACHE_DIR": "/tmp/llama_index/tiktoken_cache",  # llama-index sets it
        "SSH_KEY_FILE": "/home/me/.ssh/id_ed25519",
        "OPENAI_API_KEY": "sk-proj-0123456789abcdef",
        "GITHUB_TOKEN": "ghp_0123456789abcdef",
    }
    assert sorted(secrets_in_env(env)) == ["GITHUB_TOKEN", "OPENAI_API_KEY"]


SLACK = "xoxb-" + "123456789012-" + "AbCdEfGhIjKlMnOp"
STRIPE = "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
JWT = (
    "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFU"
)


@pytest.mark.parametrize(("kind", "key"), [("slack", SLACK), ("stripe", STRIPE), ("jwt", JWT)])
def test_more_formats(kind, key):
    assert find_keys(f"x = '{key}'") == [kind]
    assert key not in redact_keys(f"{key}\n")[0]


@pytest.mark.parametrize(
    "text",
    [
        f"api_key={OPENAI}",
        f"OPENAI_API_KEY={OPENAI}",
        f"id={AWS_ID}",
        f"https://api.example.com/v1?api_key={OPENAI}&x=1",
        f"https://api.example.com/v1/{GOOGLE}",
    ],
)
def test_a_key_after_an_equals_sign_or_a_slash_is_found(text):
    out, kinds = redact_keys(text)
    assert kinds and not any(k in out for k in (OPENAI, AWS_ID, GOOGLE)), out


@pytest.mark.parametrize("n", [40, 51, 80, 255, 256, 300])
def test_a_key_in_pickled_bytes_of_any_length_is_found(n):
    key = (OPENAI * 10)[:n]
    for value in (key.encode(), key):
        raw = pickle.dumps(value)
        assert find_keys(raw) == ["openai"], (n, raw[:12])


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer abcdef0123456789xyz", "abcdef0123456789xyz"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==", "dXNlcjpwYXNzd29yZDEyMw=="),
        # base64 with no digit and no padding ("user32:EIzQClvMhkjabcd"): one Basic
        # credential in ~60 is so; the property test found it
        ("Authorization: Basic dXNlcjMyOkVJelFDbHZNaGtqYWJjZA", "dXNlcjMyOkVJelFDbHZNaGtqYWJjZA"),
        ("postgresql://me:s3cret-pw@db.example.com/team", "s3cret-pw"),
        ("https://x.example.com/feed?token=abcd1234efgh&page=2", "abcd1234efgh"),
        ("https://x.example.com/?password=hunter2hunter2", "hunter2hunter2"),
    ],
)
def test_credentials_known_by_their_label(text, secret):
    out, kinds = redact_keys(text)
    assert kinds == ["credential"] and secret not in out, out


@pytest.mark.parametrize(
    "text",
    [
        "a basic internationalization guide",
        "max_tokens=1024, tokens used: 1234567890123456",
        "see https://example.com/path?page=2 and https://example.com:8080/a",
        "the token limit is 4096",
        "Basic Internationalization Guide",
        "a Bearer instrumentation of everything",
    ],
)
def test_prose_and_ordinary_urls_do_not_fire(text):
    assert redact_keys(text) == (text, [])


def test_a_pickle_opcode_by_chance_in_base64_does_not_fire():
    # A "C" two places or an "X"/"B" five places before a key-shaped run is
    # common in base64 (one run in twenty): the pickled-bytes lookbehinds once
    # fired on it. Seeded, so every run tries the same two thousand samples.
    rng = random.Random(29)
    tail = "sk-" + OPENAI[3:] + "x"
    for _ in range(2000):
        sample = base64.urlsafe_b64encode(rng.randbytes(400)).decode()[:500] + tail
        assert find_keys(sample.encode()) == [], sample[-60:]
    # the leak the lookbehinds were written for is still caught, in every protocol
    for protocol in (2, 3, 4, 5):
        for n in (40, 51, 80, 255, 256, 300):
            key = (OPENAI * 10)[:n]
            for value in (key, key.encode(), [key, 1], {"k": key.encode()}):
                raw = pickle.dumps(value, protocol=protocol)
                assert find_keys(raw) == ["openai"], (protocol, n, raw[:12])


@pytest.mark.parametrize(
    "text",
    [
        f"#{OPENAI}/p and more",  # a plain edge before, a slash after
        f"url=/{GITHUB}=x",  # both loose: a key with _ or - cannot lie in base64
        f"print('a\\n{AWS_ID}=')",  # after an escape written in source
        f"x = '\\t{ANTHROPIC}'",
    ],
)
def test_a_key_before_a_slash_or_after_an_escape_is_found(text):
    out, kinds = redact_keys(text)
    assert kinds and not any(k in out for k in (OPENAI, GITHUB, AWS_ID, ANTHROPIC)), out
    assert find_keys(text.encode()) == kinds


def test_a_key_joined_to_a_name_is_found_in_names_only():
    from nbdurable.redact import name_key_names

    assert name_key_names(f"ask_{OPENAI}") == ["openai key"]
    assert name_key_names(f"run.{AWS_ID}") == ["aws key"]
    assert name_key_names("task_size.v2:final_sk_test") == []
    # in a value, _ glues a key-shaped run to URL-safe base64: no key there
    assert find_keys(f"abc_{OPENAI}") == []


def test_every_header_is_masked_as_the_store_writes_it(store):
    from nbdurable.redact import masked_header

    header = {"inputs": {AWS_ID: "fp", "plain": "fp"}, "why": f"auth {GITHUB}", "n": 3}
    masked = masked_header(header, {})
    assert masked == {
        "inputs": {"[redacted aws key]": "fp", "plain": "fp"},
        "why": "auth [redacted github key]",
        "n": 3,
    }
    ordinary = {"inputs": {"x": "fp"}, "fn": "POST http://127.0.0.1:8000/v1?page=2"}
    assert masked_header(ordinary, {}) == ordinary
    plain = {"inputs": {"x": "fp"}, "fn": "__main__.ask", "n": 1}
    assert masked_header(plain, {}) is plain  # no hint of a key: not even copied
    store.put("r/x", header)
    raw = store.read("r/x")
    assert AWS_ID.encode() not in raw and GITHUB.encode() not in raw


def test_only_the_header_s_own_scrubbed_fields_are_left_alone():
    from nbdurable.redact import masked_header

    # outputs/printed/source at the top are masked by their write paths; a variable
    # of the same name inside seen/made/inputs is user data and searched like any other
    header = {"seen": {"source": f"x = {OPENAI}"}, "inputs": {"printed": [f"k={GITHUB}"]}}
    masked = masked_header(header, {})
    assert OPENAI not in repr(masked) and GITHUB not in repr(masked), masked
    assert masked["seen"]["source"] == "x = [redacted openai key]"
    top = {"source": "already masked by its write path"}
    assert masked_header(top, {}) is top


def test_a_header_whose_hints_mask_to_nothing_is_not_copied_and_masks_what_it_must():
    """The gate's answer for each string is :func:`scrub`'s (a name's: scrub_name's)."""
    from nbdurable.redact import masked_header, scrub, scrub_name

    url = {"id": "https://api.example.com/v1/models?x=1", "t": ("a", 1), "callee": {"c": "fp"}}
    assert masked_header(url, {}) is url  # a URL is a hint (://), yet holds no key
    env = {"MY_TOKEN": b"s3cr3t-value-1"}
    cases = [
        {"id": f"https://api.example.com/v1?key={GITHUB}", "n": None},
        {"inputs": {f"ask_{OPENAI}": "fp", "x": "://"}, "why": ["plain", "s3cr3t-value-1"]},
        {"a": "line one\ns3cr3t", "b": "-value-1 next", "outputs": [f"auth {GITHUB}"]},
        {"nested": [{"k": (f"Bearer {GITHUB}", 2.5)}], "same": f"Bearer {GITHUB}"},
    ]

    def reference(value, secrets):  # every string scrubbed alone, as before the gate
        if isinstance(value, str):
            return scrub(value, secrets)[0]
        if isinstance(value, dict):
            return {
                (scrub_name(k, secrets)[0] if isinstance(k, str) else k): (
                    v if k in ("outputs", "printed", "source") else reference(v, secrets)
                )
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return [reference(v, secrets) for v in value]
        return value

    for case in cases:
        assert masked_header(case, env) == reference(case, env), case
    assert GITHUB not in str(masked_header(cases[0], env))
    assert "s3cr3t-value-1" not in str(masked_header(cases[1], env))
    assert OPENAI not in str(masked_header(cases[1], env))


def test_a_secret_set_changed_or_removed_in_the_environment_is_seen_at_once(monkeypatch):
    from nbdurable.redact import masked_header, secrets_in_env

    monkeypatch.setenv("NBD_TEST_TOKEN", "first-secret-1234")
    assert secrets_in_env()["NBD_TEST_TOKEN"] == b"first-secret-1234"
    monkeypatch.setenv("NBD_TEST_TOKEN", "other-secret-5678")  # same length, new value
    assert secrets_in_env()["NBD_TEST_TOKEN"] == b"other-secret-5678"
    assert masked_header({"why": "other-secret-5678"}) == {"why": "[redacted $NBD_TEST_TOKEN]"}
    got = secrets_in_env()
    got.clear()  # a caller's copy: the next call still knows it
    assert "NBD_TEST_TOKEN" in secrets_in_env()
    monkeypatch.delenv("NBD_TEST_TOKEN")
    assert "NBD_TEST_TOKEN" not in secrets_in_env()


def test_a_long_run_after_a_label_is_searched_in_linear_time():
    # A lookahead whose two runs overlapped tried every split of a long lowercase
    # run after "Bearer" (40,000 characters: 40 s). Each run now excludes what ends
    # it. The pattern itself, on a megabyte (redact_keys looks only in windows around
    # a label): a quadratic search would not end here.
    from nbdurable.redact import _LABELLED_RE

    text_pattern = _LABELLED_RE["credential"][0][0]
    assert text_pattern.search("Bearer " + "a" * 1_000_000) is None
    assert text_pattern.search("Bearer " + "a" * 1_000_000 + "Z") is not None
    assert text_pattern.search("Bearer " + "A" * 1_000_000) is None
    assert redact_keys("Authorization: Bearer " + "a" * 300 + "Z")[1] == ["credential"]
