"""Redaction: every secret in a JSON value or a log line replaced by `REDACTED`, and listed.

One place decides what a secret looks like, for the workload export and for every log line: a
value under a name that names one (`HF_TOKEN`, `PGPASSWORD`, `ENCRYPTION_KEY`, `apiKey`, the
item after `--api-key` in a list of arguments, `value` beside `"name": "DB_PASS"`;
`secret_names` decides which names), a value that is one (`hf_…`, `sk-…`, `glpat-…`,
`sk_live_…`, `AIza…`, our own `tsk_…`, `esk_…`, `agt_…`, `agk_…`, GitHub, Slack and AWS keys,
JSON web tokens), or one inside a longer string (a URI's `user:pass@` or `<token>@`, a Slack
webhook's path, a `?token=` or `?auth=` query value, an `Authorization: Token …` or `X-Api-Key: …`
header, a cookie, a PEM private key, `PGPASSWORD=…`, `--password …`). Nothing is removed
silently: `redact` lists every replacement by its JSON path and the kind of secret found. It
errs towards redacting: a false alarm costs a listed `REDACTED`, a miss leaks a credential. It
leaves a name that only describes a secret (`token_id`, `max_tokens`, `KEYBOARD`), `--port 8080`
and prose (`token: expired`) as they are.

Standard library only: the logging formatters use it on every line, and the CLI imports it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple, TypedDict

from einsora.common.secret_names import secret_named_by

__all__ = [
    "REDACTED",
    "Redaction",
    "member_path",
    "redact",
    "redact_text",
    "scan",
    "secret_named_by",
]

REDACTED = "REDACTED"


class Redaction(TypedDict):
    """One replacement: where (a JSON path from the root, `$.spec.env.HF_TOKEN`) and why."""

    path: str
    kind: str


# --- secrets inside text ----------------------------------------------------------------------


class _Shape(NamedTuple):
    """One shape of a secret in text. The group `s` is the secret; the rest of the match is
    kept (a URI's scheme and user, a header's name and scheme, a flag), so a reader still sees
    what it was. `accept`, when given, decides on a match (does its name name a secret?)."""

    kind: str
    pattern: re.Pattern[str]
    accept: Callable[[re.Match[str]], bool] | None = None


def _named(match: re.Match[str]) -> bool:
    """A `NAME=value`, `"NAME": "value"` or `--name value` whose name names a secret (an
    `Authorization` header has its shape of its own, which keeps the scheme)."""
    return secret_named_by(match["name"]) not in (None, "authorization header")


def _named_with_a_credential(match: re.Match[str]) -> bool:
    """`NAME: value` is also prose (the join token was refused, and why), so a value counts
    when it looks like a credential (a digit in it, or long and not only letters), not a word,
    a path or `(prose`; a password's value always does."""
    kind = secret_named_by(match["name"])
    if kind is None or kind == "authorization header":
        return False
    value = match["s"]
    if kind == "password" and not match["name"].lower().endswith("pass"):
        return True  # not `One pass: the bus…`
    if value.startswith(("/", "./", "~/")):
        return False
    if len(value) >= 16:
        return not value.isalpha()
    return len(value) >= 6 and any(c.isdigit() for c in value)


def _a_credential_after_its_scheme(match: re.Match[str]) -> bool:
    """After a scheme (`Basic dXNlcjpwYXNz`) any credential; without one, a value with a
    digit or a symbol: `Authorization: Bearer tsk_…` in a note names a scheme, holds none."""
    return match["scheme"] is not None or not match["s"].isalpha()


def _token_like(match: re.Match[str]) -> bool:
    """A URI's user alone (`https://<token>@host`) is a token when it is long and mixes
    letters and digits, as generated ones do; `git@`, `ann@` are users."""
    user = match["s"]
    return any(c.isdigit() for c in user) and any(c.isalpha() for c in user)


def _query_named(match: re.Match[str]) -> bool:
    """In a URL's query a bare `key` is one too (`?key=AIza…`)."""
    return match["name"].lower() == "key" or secret_named_by(match["name"]) is not None


_NAME = r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)"
_STARTS_A_WORD = r"(?<![A-Za-z0-9_.-])-{0,2}"  # also the `--` of a flag
_STARTS_AN_ARG = r"(?<![^\s\"'\[(,])-{1,2}"  # a flag: after a space, a quote or `[`, `(`, `,`


def _prefixed(kind: str, prefix: str, rest: str) -> _Shape:
    """A token that says what it is by its prefix (`hf_…`, `glpat-…`)."""
    return _Shape(kind, re.compile(rf"(?<![A-Za-z0-9_-])(?P<s>(?:{prefix}){rest})"))


# Order matters: a block or a URI first, so its parts are not reported twice under lesser
# kinds; then shapes named by a header, a parameter, a variable or a flag; then the tokens
# that name themselves by their prefix.
_SHAPES: tuple[_Shape, ...] = (
    _Shape(
        "private key",
        re.compile(
            r"(?P<s>-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
            r".*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z))",
            re.S,
        ),
    ),
    _Shape(
        "password in a URI",
        re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,31}://[^\s/@:?#]*:(?P<s>[^\s/?#]+)@"),
    ),
    _Shape(
        "token in a URI",
        re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,31}://(?P<s>[a-z0-9._~%+-]{16,})@"),
        _token_like,
    ),
    _Shape(
        "slack webhook",
        re.compile(r"(?i)\bhooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[\w/-]+)"),
    ),
    _Shape(
        "discord webhook",
        re.compile(r"(?i)\bdiscord(?:app)?\.com/api/webhooks/(?P<s>[0-9]+/[\w-]+)"),
    ),
    _Shape(
        "secret in a URL query",
        re.compile(r"[?&;](?P<name>[A-Za-z0-9_.-]+)=(?P<s>[^&;#\s\"'<>]+)"),
        _query_named,
    ),
    _Shape(
        "bearer credential",
        # A header's credential has a digit or a symbol; `Bearer authentication` is prose.
        re.compile(
            r"\b(?:Bearer|Basic|bearer)\s+(?P<s>(?=[A-Za-z]*[0-9._~+/=-])[A-Za-z0-9._~+/=-]{8,})"
        ),
    ),
    _Shape(
        "authorization header",
        # Any scheme (`Token`, `Basic`, `Digest`, `Bot`…: a word, no digit) is kept, and its
        # credential replaced.
        re.compile(
            r"(?i)(?<![A-Za-z0-9_])(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?"
            r"(?:(?P<scheme>[A-Za-z][A-Za-z-]*)[ \t]+)?(?P<s>[A-Za-z0-9._~+/=-]{6,})"
        ),
        _a_credential_after_its_scheme,
    ),
    _Shape(
        "cookie",
        re.compile(
            # Its pairs to the end of the line (`session cookie: sign in again` is prose).
            r"(?i)(?<![A-Za-z0-9_])(?:set-)?cookie[\"']?[ \t]*:[ \t]*[\"']?"
            r"(?P<s>[^\s=;\"']+=[^\r\n\"']*)"
        ),
    ),
    _Shape(
        "secret assignment",
        re.compile(
            _STARTS_A_WORD + _NAME + r"[\"']?[ \t]*[:=][ \t]*(?P<q>[\"'])(?P<s>[^\"'\n]+)(?P=q)"
        ),
        _named,
    ),
    _Shape(
        "secret assignment",
        re.compile(_STARTS_A_WORD + _NAME + r"[ \t]*=[ \t]*(?P<s>[^\s&\"',;]+)"),
        _named,
    ),
    _Shape(
        "secret assignment",
        re.compile(_STARTS_A_WORD + _NAME + r"[\"']?[ \t]*:[ \t]*(?P<s>[^\s\"',;]+)"),
        _named_with_a_credential,
    ),
    _Shape(
        "secret flag",
        re.compile(_STARTS_AN_ARG + _NAME + r"[ \t]+(?P<q>[\"'])(?P<s>[^\"'\n]+)(?P=q)"),
        _named,
    ),
    _Shape(
        "secret flag",
        # `--api-key KEY` on a command line, or `"--api-key", "KEY"` in a list written out.
        re.compile(
            _STARTS_AN_ARG
            + _NAME
            + r"(?:[ \t]+|[\"'],[ \t]*[\"'])(?P<s>(?=[^\s\"']*[A-Za-z0-9])[^\s\"'-][^\s\"']*)"
        ),
        _named,
    ),
    _prefixed("api token", "tsk_", r"[A-Za-z0-9_-]{16,}"),
    _prefixed("gateway key", "esk_", r"[A-Za-z0-9_-]{16,}"),
    _prefixed("machine join token", "agt_", r"[A-Za-z0-9_-]{16,}"),
    _prefixed("machine credential", "agk_", r"[A-Za-z0-9_-]{16,}"),
    _prefixed("huggingface token", "hf_", r"[A-Za-z0-9]{16,}"),
    _prefixed("openai-style api key", "sk-", r"[A-Za-z0-9_-]{16,}"),
    _prefixed("github token", r"gh[pousr]_", r"[A-Za-z0-9]{20,}"),
    _prefixed("github token", "github_pat_", r"[A-Za-z0-9_]{20,}"),
    _prefixed("gitlab token", r"glpat-|gldt-|glrt-|glptt-|glcbt-", r"[A-Za-z0-9_-]{20,}"),
    _prefixed("stripe key", r"sk_live_|rk_live_|sk_test_|rk_test_|whsec_", r"[A-Za-z0-9]{16,}"),
    _prefixed("slack token", r"xox[a-z]-|xapp-", r"[A-Za-z0-9-]{10,}"),
    _prefixed("google api key", "AIza", r"[A-Za-z0-9_-]{30,}"),
    _prefixed("google oauth token", r"ya29\.", r"[A-Za-z0-9_-]{20,}"),
    _prefixed("npm token", "npm_", r"[A-Za-z0-9]{30,}"),
    _prefixed("pypi token", "pypi-", r"[A-Za-z0-9_-]{50,}"),
    _Shape(
        "aws access key id",
        re.compile(r"(?<![A-Z0-9])(?P<s>(?:AKIA|ASIA)[A-Z0-9]{16})(?![A-Z0-9])"),
    ),
    _Shape(
        "json web token",
        re.compile(
            r"(?<![A-Za-z0-9_-])(?P<s>eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"
        ),
    ),
)


def _may_hold_secret(text: str) -> bool:
    """Whether `text` has anything every shape above needs (lower-cased; a name that names a
    secret holds one of the first words): an ordinary log line has none, and costs a `lower()`
    and a chain of substring searches, a few hundred nanoseconds, instead of every pattern.
    Spelled out as one `or` chain: three times faster than a loop over a tuple, and ten times
    faster than one regular expression."""
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
        or "auth" in low
        or "cookie" in low
        or "dsn" in low
        or "connection" in low
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
        or "glpat-" in low
        or "gldt-" in low
        or "glrt-" in low
        or "glptt-" in low
        or "glcbt-" in low
        or "_live_" in low
        or "_test_" in low
        or "whsec_" in low
        or "xox" in low
        or "xapp-" in low
        or "slack" in low
        or "discord" in low
        or "aiza" in low
        or "ya29." in low
        or "npm_" in low
        or "pypi-" in low
        or "akia" in low
        or "asia" in low
        or "eyj" in low
    )


def scan(text: str) -> tuple[str, list[str]]:
    """`text` with each secret in it replaced, and the kind of each one replaced, in order."""
    if not _may_hold_secret(text):
        return text, []
    kinds: list[str] = []
    for shape in _SHAPES:
        text = _replace(shape, text, kinds)
    return text, kinds


def _replace(shape: _Shape, text: str, kinds: list[str]) -> str:
    """`text` with each secret of `shape` replaced. A match its `accept` refuses is searched
    again from its value on (in `name: token: <credential>` the name's value is no secret,
    and the token's is); one redacted already is passed."""
    parts: list[str] = []
    done = at = 0
    while (match := shape.pattern.search(text, at)) is not None:
        if match["s"] == REDACTED:
            at = match.end()
        elif shape.accept is not None and not shape.accept(match):
            at = max(match.start("s"), match.start() + 1)
        else:
            kinds.append(shape.kind)
            parts += (text[done : match.start("s")], REDACTED)
            done = at = match.end("s")
    return "".join((*parts, text[done:])) if parts else text


def redact_text(text: str) -> str:
    """A log line (or any text) with every secret in it replaced by `REDACTED`."""
    return scan(text)[0]


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
        pair = _variable_named(node)
        for raw_key, item in node.items():
            key = str(raw_key)
            clean_key, kinds = scan(key)
            if kinds:
                clean_key = _free_key(clean_key, node, out)
            child = member_path(path, clean_key)
            found.extend({"path": child, "kind": f"{kind} in a key"} for kind in kinds)
            by_name = secret_named_by(key) or (pair if key == "value" else None)
            out[clean_key] = _walk(item, child, named or by_name, found)
        return out
    if isinstance(node, list | tuple):
        items: list[Any] = []
        after: str | None = None  # what a flag just before says this item is (`--api-key`)
        for i, item in enumerate(node):
            flag = _FLAG.fullmatch(item) if isinstance(item, str) else None
            if flag or (isinstance(item, str) and not any(c.isalnum() for c in item)):
                after = None  # a flag, or a placeholder (`--token …`): no value
            items.append(_walk(item, f"{path}[{i}]", named or after, found))
            after = secret_named_by(flag["name"]) if flag else None
        return items
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


_FLAG = re.compile(r"-{1,2}(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)")
"""A command-line flag alone in a list of arguments: its value is the next item."""


def _variable_named(node: dict[Any, Any]) -> str | None:
    """The kind of secret `value` holds in `{"name": "DB_PASS", "value": …}`, a variable as
    Kubernetes, Compose and most APIs list them (`key` for `name`, in some)."""
    name = node.get("name", node.get("key"))
    if "value" not in node or not isinstance(name, str):
        return None
    return secret_named_by(name)


def _free_key(key: str, original: dict[Any, Any], taken: dict[str, Any]) -> str:
    """`key`, or `key-2`, `key-3`…: a redacted key must not overwrite another member."""
    candidate, n = key, 1
    while candidate in taken or candidate in original:
        n += 1
        candidate = f"{key}-{n}"
    return candidate
