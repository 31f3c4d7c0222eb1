"""`einsora activity`, run as a real subprocess against a real api.

It prints the log as a table (newest first) and `--json` as the api answered it, filters by
user and action, and `--export jsonl|csv -o FILE` writes the api's export whole; a member is
refused with the api's message.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from einsora.api.testing import RunningApi, cli_env, einsora, new_member, new_tenant


async def test_activity_lists_filters_and_exports(api: RunningApi, tmp_path: Path) -> None:
    acme, ann = await new_tenant(api, "acme", "ann")
    carl = await new_member(api, acme, "carl", by=ann)
    launched = await carl.post(
        "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"}, headers={"X-Request-ID": "r1"}
    )
    assert launched.status == 201
    refused = await carl.post(f"/v1/workloads/{launched.body['id']}/resume")
    assert refused.status == 409
    env = cli_env(api, tmp_path, ann.token)

    code, out, err = await einsora(env, "activity")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["AT", "USER", "ACTION", "TARGET", "OUTCOME", "REQUEST", "ID"]
    newest, launch = lines[1].split(), lines[2].split()
    assert newest[1:5] == ["carl", "workload.resume", launched.body["id"], "failed"]
    assert launch[1:] == ["carl", "workload.create", launched.body["id"], "ok", "201", "r1"]

    code, out, err = await einsora(
        env, "activity", "--json", "--user", "carl", "--action", "workload.*"
    )
    assert code == 0, err
    entries = json.loads(out)
    assert [(e["action"], e["status"]) for e in entries] == [
        ("workload.resume", 409),
        ("workload.create", 201),
    ]
    code, out, err = await einsora(env, "activity", "--json", "--limit", "1")
    assert code == 0, err
    assert len(json.loads(out)) == 1
    assert "only the newest 1 entries" in err

    everything = (await ann.get("/v1/activity", limit="200")).body["items"]
    jsonl = tmp_path / "activity.jsonl"
    code, _, err = await einsora(env, "activity", "--export", "jsonl", "-o", str(jsonl))
    assert code == 0, err
    assert [json.loads(line) for line in jsonl.read_text().splitlines()] == everything
    code, out, err = await einsora(
        env, "activity", "--export", "csv", "-o", "-", "--action", "workload.create"
    )
    assert code == 0, err
    assert [r["request_id"] for r in csv.DictReader(io.StringIO(out))] == ["r1"]

    # Only with a file; a member is refused by the api, with its message.
    code, _, err = await einsora(env, "activity", "--export", "csv")
    assert code == 2
    assert "go together" in err
    code, _, err = await einsora(cli_env(api, tmp_path, carl.token), "activity")
    assert code == 1
    assert "only a tenant's admins" in err
    assert "HTTP 403" in err
    code, _, err = await einsora(
        cli_env(api, tmp_path, carl.token), "activity", "--export", "jsonl", "-o", "-"
    )
    assert code == 1
    assert "HTTP 403" in err
