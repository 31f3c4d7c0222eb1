"""Redaction: no planted secret of any kind survives `redact` or a log line, wherever it is
nested (a dict's key or value, a list, inside a longer string or a URI), each is listed with its
path, and innocent data comes out unchanged.

The innocent data here is drawn from an alphabet without `e`, `h`, `k`, `p`, `s`, `z`, `_`,
`-`, `=` or `:`, so it can spell no secret and no word that names one (`auth`, `pass`); each
planted secret holds a capital letter or a symbol, so it cannot appear in the innocent data by
chance. The shapes are those a user puts a secret in: a spec's args, env, URIs and headers.
"""

from __future__ import annotations

import io
import json
import logging
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from einsora.common import logs
from einsora.common.redaction import REDACTED, member_path, redact, redact_text, secret_named_by

INNOCENT = "abcdfgijlmnoqrtuvwxy0123456789 ./"
ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "_-"

innocent_text = st.text(INNOCENT, max_size=24)
innocent_key = st.text(INNOCENT, min_size=1, max_size=12)
innocent_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | innocent_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(innocent_key, children, max_size=4)
    ),
    max_leaves=12,
)


@dataclass(frozen=True)
class Secret:
    """A planted secret: the text planted, the part of it that must not survive, its kind."""

    text: str
    core: str
    kind: str


def _core(alphabet: str, min_size: int) -> st.SearchStrategy[str]:
    """Random secret characters, with a capital and a digit so nothing innocent holds them."""
    return st.builds(
        lambda body, cap, digit: body + cap + digit,
        st.text(alphabet, min_size=min_size, max_size=min_size + 24),
        st.sampled_from(string.ascii_uppercase),
        st.sampled_from(string.digits),
    )


def _prefixed(prefix: str, alphabet: str, size: int, kind: str) -> st.SearchStrategy[Secret]:
    return _core(alphabet, size).map(lambda c: Secret(prefix + c, prefix + c, kind))


PASSWORDS = ALNUM + "!$%*~^"
secrets = st.one_of(
    _prefixed("hf_", ALNUM, 16, "huggingface token"),
    _prefixed("sk-", URLSAFE, 16, "openai-style api key"),
    _prefixed("sk-proj-", URLSAFE, 16, "openai-style api key"),
    _prefixed("tsk_", URLSAFE, 20, "api token"),
    _prefixed("esk_", URLSAFE, 20, "gateway key"),
    _prefixed("agt_", URLSAFE, 20, "machine join token"),
    _prefixed("agk_", URLSAFE, 20, "machine credential"),
    _prefixed("ghp_", ALNUM, 20, "github token"),
    _prefixed("gho_", ALNUM, 20, "github token"),
    _prefixed("ghs_", ALNUM, 20, "github token"),
    _prefixed("github_pat_", ALNUM + "_", 20, "github token"),
    _prefixed("glpat-", URLSAFE, 20, "gitlab token"),
    _prefixed("sk_live_", ALNUM, 16, "stripe key"),
    _prefixed("rk_live_", ALNUM, 16, "stripe key"),
    _prefixed("sk_test_", ALNUM, 16, "stripe key"),
    _prefixed("xoxb-", ALNUM + "-", 10, "slack token"),
    _prefixed("xoxp-", ALNUM + "-", 10, "slack token"),
    _prefixed("AIza", URLSAFE, 33, "google api key"),
    _prefixed("ya29.", URLSAFE, 20, "google oauth token"),
    _prefixed("npm_", ALNUM, 34, "npm token"),
    _prefixed("pypi-", URLSAFE, 60, "pypi token"),
    st.text(string.ascii_uppercase + string.digits, min_size=16, max_size=16).map(
        lambda c: Secret("AKIA" + c, "AKIA" + c, "aws access key id")
    ),
    st.tuples(_core(URLSAFE, 8), _core(URLSAFE, 8), _core(URLSAFE, 8)).map(
        lambda p: Secret(
            f"eyJ{p[0]}.eyJ{p[1]}.{p[2]}", f"eyJ{p[0]}.eyJ{p[1]}.{p[2]}", "json web token"
        )
    ),
    _core(URLSAFE + "./+", 8).map(lambda c: Secret(f"Bearer {c}", c, "bearer credential")),
    st.tuples(
        st.sampled_from(["Authorization", "authorization", "Proxy-Authorization"]),
        st.sampled_from(["Token", "Bot", "ApiKey", ""]),
        _core(URLSAFE + "./+", 8),
    ).map(
        lambda p: Secret(
            f"{p[0]}: {p[1]} {p[2]}".replace(":  ", ": "), p[2], "authorization header"
        )
    ),
    st.tuples(
        st.sampled_from(["X-Api-Key", "X-Auth-Token", "Private-Token", "api-key"]),
        _core(URLSAFE, 6),
    ).map(lambda p: Secret(f"{p[0]}: {p[1]}", p[1], "secret assignment")),
    _core(URLSAFE, 8).map(lambda c: Secret(f"Cookie: session={c}; theme=dark", c, "cookie")),
    _core(ALNUM, 16).map(
        lambda c: Secret(f"https://{c}@git.example.org/org/repo.git", c, "token in a URI")
    ),
    st.tuples(_core(string.ascii_uppercase + string.digits, 8), _core(ALNUM, 20)).map(
        lambda p: Secret(
            f"https://hooks.slack.com/services/T{p[0]}/B{p[0]}/{p[1]}", p[1], "slack webhook"
        )
    ),
    st.tuples(st.sampled_from(["https", "s3", "postgresql", "redis"]), _core(PASSWORDS, 6)).map(
        lambda p: Secret(f"{p[0]}://ann:{p[1]}@db.example.org:5432/x", p[1], "password in a URI")
    ),
    st.tuples(
        st.sampled_from(
            [
                "token",
                "key",
                "sig",
                "access_token",
                "X-Amz-Signature",
                "auth",
                "api_key",
                "apikey",
                "client_secret",
                "X-Goog-Credential",
            ]
        ),
        _core(URLSAFE + "%.", 6),
    ).map(
        lambda p: Secret(
            f"https://store.example.org/model.gguf?a=1&{p[0]}={p[1]}", p[1], "secret in a URL query"
        )
    ),
    st.tuples(
        st.sampled_from(
            [
                "{}={}",  # a variable, as `env` or a shell writes it
                "{} = {}",  # an ini file's
                '{{"{}": "{}"}}',  # JSON written into a line
                "--{}={}",  # a flag and its value
            ]
        ),
        st.sampled_from(
            [
                "password",
                "DB_PASSWORD",
                "api_key",
                "secret",
                "PGPASSWORD",
                "DB_PASS",
                "ENCRYPTION_KEY",
                "MYSQL_ROOT_PASSWORD",
                "AUTH_TOKEN",
                "aws_secret_access_key",
                "SENTRY_DSN",
                "hf-token",
            ]
        ),
        _core(PASSWORDS, 6),
    ).map(lambda p: Secret(p[0].format(p[1], p[2]), p[2], "secret assignment")),
    st.tuples(
        st.sampled_from(["api-key", "token", "password", "secret", "hf-token", "auth"]),
        _core(PASSWORDS, 6),
    ).map(lambda p: Secret(f"--{p[0]} {p[1]}", p[1], "secret flag")),
    st.lists(st.text(ALNUM + "+/", min_size=64, max_size=64), min_size=1, max_size=3).map(
        lambda lines: Secret(
            "-----BEGIN RSA PRIVATE KEY-----\n"
            + "\n".join(lines)
            + "Q9\n-----END RSA PRIVATE KEY-----",
            "\n".join(lines) + "Q9",
            "private key",
        )
    ),
)
"""One secret of each kind above, as it shows up in a spec, a reason or a log line."""

named_secrets = st.tuples(
    st.sampled_from(
        [
            ("HF_TOKEN", "token"),
            ("password", "password"),
            ("apiKey", "api key"),
            ("aws_secret_access_key", "secret"),
            ("clientSecret", "secret"),
            ("Authorization", "authorization header"),
            ("private-key", "private key"),
            ("PGPASSWORD", "password"),
            ("DB_PASS", "password"),
            ("ENCRYPTION_KEY", "encryption key"),
            ("SENTRY_DSN", "connection string"),
            ("BASIC_AUTH", "credential"),
            ("X-Api-Key", "api key"),
            ("Cookie", "cookie"),
            ("accesskey", "access key"),
        ]
    ),
    _core(PASSWORDS, 6),
)
"""A value that is only secret by its key's name."""


@dataclass(frozen=True)
class Planted:
    """A document with secrets planted, and for each the path it must be listed at."""

    document: Any
    secrets: list[tuple[Secret, str]]


def _containers(node: Any, path: str) -> Iterator[tuple[Any, str]]:
    if isinstance(node, dict):
        yield node, path
        for key, item in node.items():
            yield from _containers(item, member_path(path, key))
    elif isinstance(node, list):
        yield node, path
        for i, item in enumerate(node):
            yield from _containers(item, f"{path}[{i}]")


@st.composite
def planted(draw: st.DrawFn) -> Planted:
    """Innocent JSON with one to four secrets put anywhere in it, as values or inside longer
    strings in a dict or a list (a secret in a key is tested on its own, below)."""
    document = {"spec": draw(innocent_json), "more": [draw(innocent_json)]}
    found: list[tuple[Secret, str]] = []
    for _ in range(draw(st.integers(1, 4))):
        secret = draw(secrets)
        value = draw(
            st.sampled_from(
                [
                    secret.text,
                    f"{draw(innocent_text)} {secret.text} {draw(innocent_text)}",
                    f"{draw(innocent_text)}\n{secret.text}",
                ]
            )
        )
        places = list(_containers(document, "$"))
        container, path = places[draw(st.integers(0, len(places) - 1))]
        if isinstance(container, dict):
            key = draw(innocent_key)
            while key in container:
                key += "x"
            container[key] = value
            found.append((secret, member_path(path, key)))
        else:
            container.append(value)
            found.append((secret, f"{path}[{len(container) - 1}]"))
    return Planted(document, found)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(planted())
def test_no_planted_secret_survives_and_each_is_listed_at_its_path(plant: Planted) -> None:
    clean, found = redact(plant.document)
    text = json.dumps(clean)
    listed = {(r["path"], r["kind"]) for r in found}
    for secret, path in plant.secrets:
        assert secret.core not in text, (secret, text)
        assert (path, secret.kind) in listed, (secret, path, found)
    assert all(r["path"] in {p for _, p in plant.secrets} for r in found), found


@SETTINGS
@given(innocent_json)
def test_innocent_data_is_unchanged(document: Any) -> None:
    assert redact(document) == (document, [])


def test_a_realistic_spec_without_secrets_is_unchanged() -> None:
    spec = {
        "image": "ghcr.io/example/server:1.2",
        "command": ["serve", "--port", "$PORT", "--max-tokens", "512"],
        "model": "https://huggingface.co/google/gemma-3-270m/resolve/main/model.gguf",
        "env": {"MODE": "fast", "TOKENIZER": "gpt2", "TOKEN_FILE": "/run/secrets/hf"},
        "max_tokens": 512,
        "tokenizer": "gpt2",
        "token_id": "tk-01HX",
        "key_id": "gk-01HX",
        "secret_name": "db-credentials",
        "notes": "send `Authorization: Bearer tsk_…`; Bearer authentication; passed 3 checks",
    }
    assert redact(spec) == (spec, [])


@SETTINGS
@given(named_secrets, st.sampled_from(["value", "number", "list"]))
def test_a_key_that_names_a_secret_redacts_its_value_whole(
    named: tuple[tuple[str, str], str], shape: str
) -> None:
    (key, kind), core = named
    value: Any = {"value": core, "number": 123456, "list": [core, {"x": core}]}[shape]
    clean, found = redact({"env": {key: value, "MODE": "fast"}})
    assert clean["env"]["MODE"] == "fast"
    assert core not in json.dumps(clean)
    if shape == "list":
        assert clean["env"][key] == [REDACTED, {"x": REDACTED}]
        assert [r["path"] for r in found] == [
            f"{member_path('$.env', key)}[0]",
            f"{member_path('$.env', key)}[1].x",
        ]
    else:
        assert clean["env"][key] == REDACTED
        assert found == [{"path": member_path("$.env", key), "kind": kind}]


@SETTINGS
@given(secrets)
def test_a_secret_in_a_key_renames_the_key(secret: Secret) -> None:
    clean, found = redact({"env": {secret.text: "on", REDACTED: "taken"}})
    assert secret.core not in json.dumps(clean)
    assert clean["env"][REDACTED] == "taken"  # a redacted key overwrites nothing
    (renamed,) = set(clean["env"]) - {REDACTED}
    # Its value too, when the key also names a secret (`DB_PASSWORD=…`).
    assert clean["env"][renamed] in ("on", REDACTED)
    assert {"path": member_path("$.env", renamed), "kind": f"{secret.kind} in a key"} in found


def test_a_redacted_value_is_not_listed_again() -> None:
    once, found = redact({"password": "hunter2X9", "url": "https://ann:hunter2X9@db/x"})
    assert len(found) == 2
    assert redact(once) == (once, [])


def test_paths_that_are_not_plain_names_are_quoted() -> None:
    _, found = redact({"my env": {"it's": ["hf_" + "A" * 30]}})
    assert found == [{"path": "$['my env']['it\\'s'][0]", "kind": "huggingface token"}]


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("HF_TOKEN", "token"),
        ("githubToken", "token"),
        ("PASSWORD", "password"),
        ("api-key", "api key"),
        ("max_tokens", None),
        ("tokenizer", None),
        ("token_id", None),
        ("secret_name", None),
        ("keyboard", None),
        ("PGPASSWORD", "password"),
        ("DB_PASS", "password"),
        ("SMTPPASS", "password"),
        ("ENCRYPTION_KEY", "encryption key"),
        ("encryptionKey", "encryption key"),
        ("X-Api-Key", "api key"),
        ("secretkey", "secret key"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
        ("SENTRY_DSN", "connection string"),
        ("connection_string", "connection string"),
        ("BASIC_AUTH", "credential"),
        ("X-Amz-Signature", "signature"),
        ("set-cookie", "cookie"),
        ("secrets", "secret"),
        ("KEYBOARD", None),
        ("key", None),
        ("keys", None),
        ("hotkey", None),
        ("PUBLIC_KEY", None),
        ("sort_key", None),
        ("ssh_authorized_keys", None),
        ("BYPASS", None),
        ("passthrough", None),
        ("author", None),
        ("AUTH_URL", None),
        ("password_file", None),
        ("auth_mode", None),
        ("HostKeyAlias", None),
        ("KEY_VAULT", None),
        ("API_KEY_B64", "api key"),
        ("SIGNING_KEY_V2", "signing key"),
    ],
)
def test_which_keys_name_a_secret(key: str, kind: str | None) -> None:
    assert secret_named_by(key) == kind


@SETTINGS
@given(
    st.sampled_from(["--api-key", "--token", "-password", "--hf-token", "--secret", "--auth"]),
    _core(PASSWORDS, 6),
)
def test_the_value_after_a_secret_flag_in_a_list_of_args_is_redacted(flag: str, core: str) -> None:
    args = ["serve", flag, core, "--port", "8080", "--model", "meta-llama/Llama-3-8B"]
    clean, found = redact({"args": args})
    assert clean["args"] == [*args[:2], REDACTED, *args[3:]]
    assert [r["path"] for r in found] == ["$.args[2]"]


def test_a_flag_followed_by_a_flag_has_no_value_to_redact() -> None:
    args = ["serve", "--token", "--port", "8080", "--max-tokens", "512", "--api-key"]
    assert redact({"args": args}) == ({"args": args}, [])


@SETTINGS
@given(named_secrets, st.sampled_from(["name", "key"]))
def test_a_variable_listed_by_name_and_value_is_redacted(
    named: tuple[tuple[str, str], str], field: str
) -> None:
    (key, kind), core = named
    env = [{field: key, "value": core}, {field: "MODE", "value": "fast"}]
    clean, found = redact({"env": env})
    assert clean["env"] == [{field: key, "value": REDACTED}, {field: "MODE", "value": "fast"}]
    assert found == [{"path": "$.env[0].value", "kind": kind}]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (
            "docker run -e PGPASSWORD=s3cr3t -e MODE=fast img",
            "docker run -e PGPASSWORD=REDACTED -e MODE=fast img",
        ),
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic REDACTED"),
        (
            "curl -H 'Authorization: Token abc123def456' -H 'X-Api-Key: 9f8e7d6c5b4a' x",
            "curl -H 'Authorization: Token REDACTED' -H 'X-Api-Key: REDACTED' x",
        ),
        (
            '["--api-key", "abc123", "--port", "8080"]',
            '["--api-key", "REDACTED", "--port", "8080"]',
        ),
        ("{'DB_PASS': 'xyz', 'KEYBOARD': 'us'}", "{'DB_PASS': 'REDACTED', 'KEYBOARD': 'us'}"),
        (
            "AccountName=acct;AccountKey=AbC/dEf+123==;EndpointSuffix=core.windows.net",
            "AccountName=acct;AccountKey=REDACTED;EndpointSuffix=core.windows.net",
        ),
        (
            "SENTRY_DSN=https://abcdef0123456789abcdef0123456789@o1.ingest.sentry.io/4",
            "SENTRY_DSN=REDACTED",
        ),
        ("--password 'my secret pw' --port 1", "--password 'REDACTED' --port 1"),
    ],
)
def test_secrets_in_lines_as_people_write_them_are_redacted(line: str, shown: str) -> None:
    assert redact_text(line) == shown


ORDINARY = [
    "--port 8080",
    "serve --port 8080 --max-tokens 512 --model meta-llama/Llama-3-8B",
    "PATH=/usr/local/bin:/usr/bin",
    "KEYBOARD=us",
    "MAX_TOKENS=512",
    "TOKENIZER=gpt2",
    "TOKEN_FILE=/run/secrets/hf",
    "sort_key=created_at",
    "BYPASS_CACHE=1",
    "ssh://git@github.com/org/repo.git",
    "https://ann@example.org/notes",
    "https://huggingface.co/meta-llama/Llama-3-8B/resolve/main/config.json?download=true",
    "https://example.org/search?q=keys&page=2",
    "token: expired",
    "https://example.org refused the join token: unknown, used up or expired",
    "Rate limit reached for this key: 60 requests per minute",
    "Owner token: /home/ann/.local/share/einsora/owner-token",
    "Authorization: see the docs",
    "send `Authorization: Bearer tsk_…`",
    "authorized keys: 3",
    "the cookie jar is empty",
    "malformed session cookie: sign in again",
    "One pass: (machine ids put, bucket keys deleted).",
    "Reads a stream's events as they pass: usage, generated text",
    "join again with `einsora agent join URL --token … --force`",
    "-o HostKeyAlias=ann-workstation",
    "passed 3 checks, bypassed 1",
    "key w-01HX.2024-05-01T10:00 at its limit",
]
"""Text a spec, a reason or a log line holds that names no secret and holds none."""


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_not_taken_for_a_secret(text: str) -> None:
    assert redact_text(text) == text
    assert redact({"notes": text, "key": text, "args": text.split()}) == (
        {"notes": text, "key": text, "args": text.split()},
        [],
    )


# --- log lines --------------------------------------------------------------------------------


def _line(formatter: logging.Formatter, message: str, **fields: Any) -> str:
    record = logging.LogRecord("einsora.test", logging.WARNING, __file__, 1, message, (), None)
    for key, value in fields.items():
        setattr(record, key, value)
    return formatter.format(record)


FORMATTERS: list[Callable[[], logging.Formatter]] = [
    logs.JsonFormatter,
    logs.HumanFormatter,
    lambda: logs.TextFormatter("%(levelname)s %(message)s"),
]


@SETTINGS
@given(secrets, innocent_text, st.sampled_from(FORMATTERS), st.sampled_from(["message", "field"]))
def test_no_planted_secret_survives_a_log_line(
    secret: Secret, around: str, formatter: Callable[[], logging.Formatter], where: str
) -> None:
    text = f"{around} {secret.text} {around}"
    if where == "message":
        line = _line(formatter(), text, workload_id="w-1")
    else:
        line = _line(formatter(), "calling out", detail=text, nested={"a": [text]})
    assert secret.core not in line
    assert REDACTED in line


@SETTINGS
@given(named_secrets, st.sampled_from(FORMATTERS))
def test_a_field_that_names_a_secret_is_redacted_in_a_log_line(
    named: tuple[tuple[str, str], str], formatter: Callable[[], logging.Formatter]
) -> None:
    (key, _), core = named
    line = _line(formatter(), "joined", **{key.replace("-", "_"): core})
    assert core not in line


def test_bound_context_and_tracebacks_are_redacted_too() -> None:
    secret = "tsk_" + "Q" * 30
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("einsora.test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with logs.bind(request_id=f"r-1 {secret}"):
            try:
                raise ValueError(f"refused Bearer {secret}")
            except ValueError:
                logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert secret not in line
    assert entry["request_id"] == f"r-1 {REDACTED}"
    assert "Bearer REDACTED" in entry["exc"]


@pytest.mark.parametrize("formatter", [logs.JsonFormatter(), logs.HumanFormatter()])
def test_an_ordinary_log_line_is_unchanged(formatter: logging.Formatter) -> None:
    line = _line(formatter, "workload placed on m-7", workload_id="w-01HX", tries=3, ok=True)
    assert "workload placed on m-7" in line
    assert "w-01HX" in line
    assert REDACTED not in line
    assert redact_text("workload placed on m-7 after 3 tries") == (
        "workload placed on m-7 after 3 tries"
    )
