"""Redaction: every secret in a JSON value or a log line replaced by `REDACTED`, and listed.

One place decides what a secret looks like, for the workload export and for every log line:
a key that names one (`HF_TOKEN`, `password`, `apiKey`), a value that is one (`hf_…`, `sk-…`,
our own `tsk_…`, `esk_…`, `agt_…`, `agk_…`, GitHub and AWS keys, JSON web tokens), or one
inside a longer string (a URI's `user:pass@`, a `?token=` query value, a `Bearer …` header, a
PEM private key, `password=…`). Nothing is removed silently: `redact` lists every replacement
by its JSON path and the kind of secret found. It errs towards redacting: a false alarm costs
a listed `REDACTED`, a miss leaks a credential.

Standard library only: the logging formatters use it on every line, and the CLI imports it.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from typing import Any, TypedDict

REDACTED = "REDACTED"


class Redaction(TypedDict):
    """One replacement: where (a JSON path from the root, `$.spec.env.HF_TOKEN`) and why."""

    path: str
    kind: str


# --- secrets inside text ----------------------------------------------------------------------

_NAMING_WORDS = (
    r"(?:password|passwd|pwd|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)"
)
_NAME_PREFIX = r"(?:[A-Za-z0-9]+[_.-])*"

# Each pattern marks the secret with the group `s`; the text around it in the match is kept
# (the scheme and user of a URI, the `Bearer ` of a header), so a reader still sees what it was.
# Order matters: a block or a URI first, so its parts are not reported twice under lesser kinds.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "private key",
        re.compile(
            r"(?P<s>-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
            r".*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z))",
            re.S,
        ),
    ),
    (
        "password in a URI",
        re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s/@:?#]*:(?P<s>[^\s/?#]+)@"),
    ),
    (
        "secret in a URL query",
        re.compile(
            r"(?i)[?&;]" + _NAME_PREFIX + r"(?:token|key|apikey|sig|signature|password|passwd|"
            r"pwd|secret|credential)=(?P<s>[^&#\s\"'<>]+)"
        ),
    ),
    (
        "secret assignment",
        re.compile(
            r"(?i)(?<![A-Za-z0-9])" + _NAME_PREFIX + _NAMING_WORDS + r"[\"']?\s*[:=]\s*"
            r"(?P<q>[\"'])(?P<s>[^\"'\n]+)(?P=q)"
        ),
    ),
    (
        "secret assignment",
        re.compile(
            r"(?i)(?<![A-Za-z0-9])" + _NAME_PREFIX + _NAMING_WORDS + r"=(?P<s>[^\s&\"',;]+)"
        ),
    ),
    (
        "password",
        re.compile(r"(?i)(?<![A-Za-z0-9])(?:password|passwd|pwd|passphrase):\s*(?P<s>[^\s\"',;]+)"),
    ),
    (
        "bearer credential",
        # A header's credential has a digit or a symbol; `Bearer authentication` is prose.
        re.compile(
            r"\b(?:Bearer|Basic|bearer)\s+(?P<s>(?=[A-Za-z]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{8,})"
        ),
    ),
    ("api token", re.compile(r"(?<![A-Za-z0-9_])(?P<s>tsk_[A-Za-z0-9_-]{16,})")),
    ("gateway key", re.compile(r"(?<![A-Za-z0-9_])(?P<s>esk_[A-Za-z0-9_-]{16,})")),
    ("machine join token", re.compile(r"(?<![A-Za-z0-9_])(?P<s>agt_[A-Za-z0-9_-]{16,})")),
    ("machine credential", re.compile(r"(?<![A-Za-z0-9_])(?P<s>agk_[A-Za-z0-9_-]{16,})")),
    ("huggingface token", re.compile(r"(?<![A-Za-z0-9_])(?P<s>hf_[A-Za-z0-9]{16,})")),
    ("openai-style api key", re.compile(r"(?<![A-Za-z0-9_])(?P<s>sk-[A-Za-z0-9_-]{16,})")),
    (
        "github token",
        re.compile(
            r"(?<![A-Za-z0-9_])(?P<s>gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"
        ),
    ),
    ("slack token", re.compile(r"(?<![A-Za-z0-9_])(?P<s>xox[abprs]-[A-Za-z0-9-]{10,})")),
    ("aws access key id", re.compile(r"(?<![A-Z0-9])(?P<s>(?:AKIA|ASIA)[A-Z0-9]{16})(?![A-Z0-9])")),
    (
        "json web token",
        re.compile(
            r"(?<![A-Za-z0-9_-])(?P<s>eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
        ),
    ),
)


def _may_hold_secret(text: str) -> bool:
    """Whether `text` has anything every pattern above needs (lower-cased): an ordinary log
    line has none, and costs a `lower()` and a chain of substring searches, a few hundred
    nanoseconds, instead of every pattern. Spelled out as one `or` chain: three times faster
    than a loop over a tuple, and ten times faster than one regular expression."""
    low = text.lower()
    return (
        "key" in low
        or "token" in low
        or "pass" in low
        or "://" in low
        or "secret" in low
        or "sig" in low
        or "pwd" in low
        or "credential" in low
        or "bearer" in low
        or "basic" in low
        or "-----begin" in low
        or "tsk_" in low
        or "esk_" in low
        or "agt_" in low
        or "agk_" in low
        or "hf_" in low
        or "sk-" in low
        or "ghp_" in low
        or "gho_" in low
        or "ghu_" in low
        or "ghs_" in low
        or "ghr_" in low
        or "github_pat_" in low
        or "xox" in low
        or "akia" in low
        or "asia" in low
        or "eyj" in low
    )


def scan(text: str) -> tuple[str, list[str]]:
    """`text` with each secret in it replaced, and the kind of each one replaced, in order."""
    if not _may_hold_secret(text):
        return text, []
    kinds: list[str] = []
    for kind, pattern in _PATTERNS:
        text = pattern.sub(_replacer(kind, kinds), text)
    return text, kinds


def _replacer(kind: str, kinds: list[str]) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        if match["s"] == REDACTED:
            return match[0]  # redacted already: nothing new to list
        kinds.append(kind)
        start, end = match.start("s") - match.start(), match.end("s") - match.start()
        return match[0][:start] + REDACTED + match[0][end:]

    return replace


def redact_text(text: str) -> str:
    """A log line (or any text) with every secret in it replaced by `REDACTED`."""
    return scan(text)[0]


# --- keys that name a secret ------------------------------------------------------------------

_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_SECRET_WORDS = {
    "password": "password",
    "passwd": "password",
    "pwd": "password",
    "passphrase": "password",
    "secret": "secret",
    "token": "token",
    "apikey": "api key",
    "credential": "credential",
    "credentials": "credential",
    "authorization": "authorization header",
    "cookie": "cookie",
}
_SECRET_PAIRS = {
    ("api", "key"): "api key",
    ("access", "key"): "access key",
    ("private", "key"): "private key",
    ("session", "key"): "session key",
    ("signing", "key"): "signing key",
}
_NOT_SECRET_LAST = frozenset(
    {
        "id", "ids", "name", "names", "type", "kind", "count", "counts", "limit", "limits",
        "len", "length", "size", "ttl", "file", "path", "dir", "url", "uri", "endpoint",
        "expiry", "expires", "at", "ref", "hash", "sha256", "prefix", "header", "env",
    }
)  # fmt: skip
"""A key ending in one of these describes a secret (`token_id`, `secret_name`), not holds one."""


@functools.lru_cache(maxsize=4096)  # a service logs the same few field names again and again
def secret_named_by(key: str) -> str | None:
    """The kind of secret a key's value holds by its name (`HF_TOKEN`: a token), or None.
    `max_tokens` and `tokenizer` name none: whole words count, and a token is singular."""
    words = [w.lower() for w in _WORDS.findall(key)]
    if not words or words[-1] in _NOT_SECRET_LAST:
        return None
    for word in words:
        if word in _SECRET_WORDS:
            return _SECRET_WORDS[word]
    for pair in itertools.pairwise(words):
        if pair in _SECRET_PAIRS:
            return _SECRET_PAIRS[pair]
    return None


# --- JSON values ------------------------------------------------------------------------------

_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def member_path(parent: str, key: str) -> str:
    """`$.a.b` for a plain name, `$['a b']` for any other."""
    if _PLAIN_NAME.match(key):
        return f"{parent}.{key}"
    quoted = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{parent}['{quoted}']"


def redact(value: Any, root: str = "$") -> tuple[Any, list[Redaction]]:
    """A copy of the JSON value `value` with every secret replaced by `REDACTED`, and the
    list of replacements, each with its path under `root`. A value under a key that names a
    secret is replaced whole (every string or number in it, when it is an object or a list);
    a secret in a key itself renames the key."""
    found: list[Redaction] = []
    return _walk(value, root, None, found), found


def _walk(node: Any, path: str, named: str | None, found: list[Redaction]) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for raw_key, item in node.items():
            key = str(raw_key)
            clean_key, kinds = scan(key)
            if kinds:
                clean_key = _free_key(clean_key, node, out)
            child = member_path(path, clean_key)
            found.extend({"path": child, "kind": f"{kind} in a key"} for kind in kinds)
            out[clean_key] = _walk(item, child, named or secret_named_by(key), found)
        return out
    if isinstance(node, list | tuple):
        return [_walk(item, f"{path}[{i}]", named, found) for i, item in enumerate(node)]
    if isinstance(node, str):
        if named is not None:
            if node in ("", REDACTED):
                return node
            kinds = scan(node)[1]
            found.append({"path": path, "kind": kinds[0] if kinds else named})
            return REDACTED
        clean, kinds = scan(node)
        found.extend({"path": path, "kind": kind} for kind in kinds)
        return clean
    if named is not None and isinstance(node, int | float) and not isinstance(node, bool):
        found.append({"path": path, "kind": named})
        return REDACTED
    return node


def _free_key(key: str, original: dict[Any, Any], taken: dict[str, Any]) -> str:
    """`key`, or `key-2`, `key-3`…: a redacted key must not overwrite another member."""
    candidate, n = key, 1
    while candidate in taken or candidate in original:
        n += 1
        candidate = f"{key}-{n}"
    return candidate
