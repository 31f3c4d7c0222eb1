"""Write the api's OpenAPI document to dashboard/src/api/openapi.json, the file the dashboard's
types are generated from (`make dashboard-types`; tests/test_dashboard_types.py fails while it
differs from what the api serves)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from einsora.api.app import openapi_document

SNAPSHOT = Path(__file__).resolve().parents[1] / "src" / "api" / "openapi.json"


def render() -> str:
    return json.dumps(openapi_document(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    SNAPSHOT.write_text(render())
    print(f"wrote {SNAPSHOT}", file=sys.stderr)
