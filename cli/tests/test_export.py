"""`einsora export`, run as a real subprocess against a real api: it writes the server's
`einsora.workload-export/v1` document (secrets already redacted there) to a file or stdout,
says how many redactions it holds, and a workload the caller cannot see is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from einsora.api.testing import RunningApi, cli_env, einsora, new_tenant

HF_TOKEN = "hf_" + "Q7" * 17


async def test_export_writes_the_servers_document(api: RunningApi, tmp_path: Path) -> None:
    _, ann = await new_tenant(api, "physics", "ann")
    spec = {"env": {"HF_TOKEN": HF_TOKEN, "MODE": "fast"}, "model": "s3://u:pw9Secret@b/x"}
    made = await ann.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": spec})
    assert made.status == 201, made.text
    workload_id = made.body["id"]
    env = cli_env(api, tmp_path, ann.token)

    target = tmp_path / "export.json"
    code, out, err = await einsora(env, "export", workload_id, "-o", str(target))
    assert code == 0, err
    assert out == ""
    assert err.strip() == f"wrote {target} (2 redactions)"
    document = json.loads(target.read_text())
    assert document["schema"] == "einsora.workload-export/v1"
    assert document["workload"]["spec"]["env"] == {"HF_TOKEN": "REDACTED", "MODE": "fast"}
    assert {r["path"] for r in document["redactions"]} == {
        "$.workload.spec.env.HF_TOKEN",
        "$.workload.spec.model",
    }
    assert HF_TOKEN not in target.read_text()

    code, out, err = await einsora(env, "export", workload_id)
    assert code == 0, err
    printed = json.loads(out)
    assert printed["workload"] == document["workload"]
    assert printed["redactions"] == document["redactions"]

    code, out, err = await einsora(env, "export", "w-01nonexistent0000000000", "-o", str(target))
    assert code != 0
    assert "no workload 'w-01nonexistent0000000000'" in err
    assert json.loads(target.read_text()) == document  # a refusal leaves the file as it was
