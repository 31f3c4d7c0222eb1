"""Secret names: whether a name (a JSON key, an environment variable, a `--flag`, a header, a
query parameter) says that its value is a secret, and which kind.

Redaction asks it of every key in a document and of every `NAME=value`, `NAME: value` and
`--name value` in a string, so one list decides for all of them: `PGPASSWORD`, `DB_PASS`,
`ENCRYPTION_KEY`, `hfToken`, `--api-key`, `X-Api-Key`, `SENTRY_DSN`, `BASIC_AUTH`. A name
counts by its words (`max_tokens`, `tokenizer` and `keyboard` hold none), and not when its last
word describes a secret rather than holds one (`token_id`, `password_file`, `auth_url`).

Standard library only, like `redaction`: the logging formatters ask it of every field name.
"""

from __future__ import annotations

import functools
import itertools
import re

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

_WHOLE_WORDS = {
    "pass": "password",
    "pwd": "password",
    "secret": "secret",
    "secrets": "secret",
    "token": "token",
    "apikey": "api key",
    "credential": "credential",
    "credentials": "credential",
    "auth": "credential",
    "authorization": "authorization header",
    "cookie": "cookie",
    "cookies": "cookie",
    "dsn": "connection string",
    "sig": "signature",
    "signature": "signature",
}
_INSIDE_A_WORD = (("password", "password"), ("passwd", "password"), ("passphrase", "password"))
"""Found anywhere in a word: `PGPASSWORD`, `mysqlrootpasswd`."""
_WORD_ENDINGS = (("token", "token"), ("secret", "secret"), ("apikey", "api key"))
"""Found at the end of a word: `HFTOKEN`, `clientsecret`, `openaiapikey`."""
_NOT_A_PASS = frozenset({"bypass", "compass", "surpass", "overpass", "underpass", "trespass"})
"""Words ending in `pass` (`PGPASS`, `SMTPPASS` are passwords) that are not one."""
_SECRET_KEY_PREFIXES = (
    "access", "secret", "private", "signing", "encryption", "master", "session", "auth",
    "license", "client", "account", "storage", "service", "webhook", "deploy", "ssh",
)  # fmt: skip
"""`accesskey`, `privatekey`…: a word of two run together, as JSON keys often are."""
_NOT_SECRET_KEY_QUALIFIERS = frozenset(
    {
        "public", "pub", "authorized", "sort", "partition", "primary", "foreign", "cache", "kv",
        "routing", "idempotency", "dedup", "lookup", "row", "shard", "group", "hash", "object",
        "map", "dict", "hot", "short", "cut",
    }
)  # fmt: skip
"""`PUBLIC_KEY`, `sort_key`: a key that is an index, a name or a public half, not a secret."""
_KEY_ENCODINGS = frozenset({"b", "base", "hex", "pem", "der", "raw", "value", "data", "v"})
"""What may follow a key's last word (`API_KEY_B64`, `SIGNING_KEY_V2`): a key that goes on
(`HostKeyAlias`, `KEY_VAULT`) names something about a key, not the key."""
_NOT_SECRET_LAST = frozenset(
    {
        "id", "ids", "name", "names", "type", "kind", "count", "counts", "limit", "limits",
        "len", "length", "size", "ttl", "file", "path", "dir", "url", "uri", "endpoint",
        "expiry", "expires", "at", "ref", "hash", "sha256", "prefix", "header", "env",
        "mode", "method", "scheme", "provider", "enabled", "disabled", "required", "algorithm",
        "version", "format",
    }
)  # fmt: skip
"""A name ending in one of these describes a secret (`token_id`, `secret_name`), not holds one."""


@functools.lru_cache(maxsize=4096)  # a service logs the same few field names again and again
def secret_named_by(name: str) -> str | None:
    """The kind of secret a value holds by its name (`HF_TOKEN`: a token), or None.
    `max_tokens`, `tokenizer` and a bare `key` (a dict's, a bucket's) name none: whole words
    count, a token is singular, and a key is a secret with what it is a key to (`API_KEY`)."""
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words or words[-1] in _NOT_SECRET_LAST:
        return None
    for word in words:
        kind = _word_kind(word)
        if kind is not None:
            return kind
    for i, (first, second) in enumerate(itertools.pairwise(words)):
        if (
            second in ("key", "keys")
            and first not in _NOT_SECRET_KEY_QUALIFIERS
            and all(w.isdigit() or w in _KEY_ENCODINGS for w in words[i + 2 :])
        ):
            return f"{first} key"
        if (first, second) == ("connection", "string"):
            return "connection string"
    return None


def _word_kind(word: str) -> str | None:
    if word in _WHOLE_WORDS:
        return _WHOLE_WORDS[word]
    for inside, kind in _INSIDE_A_WORD:
        if inside in word:
            return kind
    for ending, kind in _WORD_ENDINGS:
        if word.endswith(ending):
            return kind
    if word.endswith("pass") and word not in _NOT_A_PASS:
        return "password"
    for prefix in _SECRET_KEY_PREFIXES:
        if word in (f"{prefix}key", f"{prefix}keys"):
            return f"{prefix} key"
    return None
