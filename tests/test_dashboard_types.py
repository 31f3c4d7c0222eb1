"""The dashboard's API types are the api's own (issue 18): the OpenAPI document they are
generated from (dashboard/src/api/openapi.json) must be the one the api serves now, so the UI
and the API cannot drift silently. After changing the API, `make dashboard-types` regenerates
both it and dashboard/src/api/schema.d.ts (`make test` checks the .d.ts where Node is present:
the `dashboard-check` target)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from einsora.api.app import openapi_document

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "dashboard" / "src" / "api" / "openapi.json"
SCRIPT = ROOT / "dashboard" / "scripts" / "openapi_snapshot.py"


def test_the_dashboards_api_document_is_the_one_the_api_serves() -> None:
    committed = json.loads(SNAPSHOT.read_text())
    assert committed == openapi_document(), (
        "dashboard/src/api/openapi.json is stale: the API changed; run `make dashboard-types` "
        "and fix what the TypeScript check then finds"
    )


def test_the_snapshot_is_written_as_the_script_writes_it() -> None:
    spec = importlib.util.spec_from_file_location("openapi_snapshot", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert SNAPSHOT.read_text() == module.render()
