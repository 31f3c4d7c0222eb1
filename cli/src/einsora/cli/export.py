"""`einsora.workload-export/v1`: a workload's inputs, timeline and usage in one JSON document,
every secret replaced by `REDACTED` and every redaction listed, so nothing is removed silently.
"""

from __future__ import annotations

import re
import urllib.parse
from datetime import UTC, datetime
from typing import Any

from einsora.cli.client import ApiClient, ApiRefused

SCHEMA = "einsora.workload-export/v1"
REDACTED = "REDACTED"
_SECRET_KEY = re.compile(r"(token|secret|password|passwd|api[_-]?key|credential|auth)", re.I)
_TOKEN_VALUE = re.compile(r"^(tsk_|sk-|hf_|ghp_)[A-Za-z0-9_-]{8,}$")


def redact(value: Any, path: str = "$") -> tuple[Any, list[dict[str, str]]]:
    """A copy of `value` with secrets replaced, and the list of what was replaced and why."""
    found: list[dict[str, str]] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, item in node.items():
                child = f"{where}.{key}"
                if _SECRET_KEY.search(str(key)) and item not in (None, "", REDACTED):
                    found.append({"path": child, "reason": f"key {key!r} names a secret"})
                    out[key] = REDACTED
                else:
                    out[key] = walk(item, child)
            return out
        if isinstance(node, list):
            return [walk(item, f"{where}[{i}]") for i, item in enumerate(node)]
        if isinstance(node, str):
            return _redact_string(node, where, found)
        return node

    return walk(value, path), found


def _redact_string(text: str, where: str, found: list[dict[str, str]]) -> str:
    if _TOKEN_VALUE.match(text):
        found.append({"path": where, "reason": "value looks like a token"})
        return REDACTED
    if "://" in text:
        parts = urllib.parse.urlsplit(text)
        if parts.password:
            netloc = f"{parts.username}:{REDACTED}@{parts.hostname}"
            if parts.port:
                netloc += f":{parts.port}"
            found.append({"path": where, "reason": "password in a URI"})
            return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return text


def build_export(client: ApiClient, workload_id: str) -> dict[str, Any]:
    workload = client.get(f"/v1/workloads/{workload_id}")
    timeline = client.paginate(f"/v1/workloads/{workload_id}/events")
    try:
        usage = client.get("/v1/usage", workload=workload_id)
    except ApiRefused as exc:
        if exc.status != 404:
            raise
        usage = None
    inputs, redactions = redact(workload, "$.inputs")
    timeline_clean, more = redact(timeline, "$.timeline")
    return {
        "schema": SCHEMA,
        "exported_at": datetime.now(UTC).isoformat(),
        "workload_id": workload_id,
        "inputs": inputs,
        "timeline": timeline_clean,
        "usage": usage,
        "redactions": redactions + more,
    }
