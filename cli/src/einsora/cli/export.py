"""`einsora export`: the server's `einsora.workload-export/v1` document of one workload.

The api assembles and redacts the document (`GET /v1/workloads/{id}/export`), so the CLI, the
dashboard and a script all get the same one, and redaction lives in one place.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from einsora.cli.client import ApiClient


def fetch_export(client: ApiClient, workload_id: str) -> dict[str, Any]:
    """The workload's export, as the api answers it."""
    document: dict[str, Any] = client.get(
        f"/v1/workloads/{urllib.parse.quote(workload_id, safe='')}/export"
    )
    return document
