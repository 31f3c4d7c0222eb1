"""`einsora usage` and `einsora quota`, run as real subprocesses against a real api.

`quota set` changes only the parts it is given and `none` clears one; a refusal prints the api's
message and request ID. `usage` prints the report as a table, `--json` as the api answered it,
and says why when accounting cannot answer.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from einsora.accounting.service import AccountingService
from einsora.accounting.testing import (
    GatewayPlayer,
    SchedulerPlayer,
    events_done,
    held,
    tokens_done,
)
from einsora.api.testing import RunningApi, cli_env, einsora, new_member, new_tenant
from einsora.common.settings import Settings
from einsora.common.testing import Bus


async def test_quota_set_changes_only_the_parts_given(api: RunningApi, tmp_path: Path) -> None:
    tenant_id, _ = await new_tenant(api, "physics", "ann")
    env = cli_env(api, tmp_path)
    code, out, err = await einsora(
        env, "quota", "set", "physics", "--max-gpus", "l40s-48gb=4", "--max-gpus", "h100-80gb=2"
    )
    assert code == 0, err
    assert "l40s-48gb GPUs" in out
    code, out, err = await einsora(env, "quota", "set", tenant_id, "--max-gpus-total", "8")
    assert code == 0, err
    code, out, err = await einsora(env, "quota", "set", "physics", "--gpu-hours-per-7d", "100.5")
    assert code == 0, err
    quota = (await api.owner.get(f"/v1/tenants/{tenant_id}/quota")).body["quota"]
    assert quota["max_gpus"] == {"h100-80gb": 2, "l40s-48gb": 4}
    assert (quota["max_gpus_total"], quota["gpu_hours_per_7d"]) == (8, 100.5)

    code, out, err = await einsora(
        env, "quota", "set", "physics", "--max-gpus", "h100-80gb=none", "--max-gpus-total", "none"
    )
    assert code == 0, err
    code, out, err = await einsora(env, "quota", "show", "physics", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown == (await api.owner.get(f"/v1/tenants/{tenant_id}/quota")).body
    assert shown["quota"]["max_gpus"] == {"l40s-48gb": 4}
    assert shown["quota"]["max_gpus_total"] is None
    assert shown["quota"]["gpu_hours_per_7d"] == 100.5

    code, out, err = await einsora(env, "quota", "show", "physics")
    assert code == 0, err
    [hours] = [line for line in out.splitlines() if line.startswith("GPU-hours in 7 days")]
    assert hours.split()[-2:] == ["100.5", "0.00"]
    [total] = [line for line in out.splitlines() if line.startswith("GPUs in all")]
    assert "no limit" in total

    code, out, err = await einsora(env, "quota", "set", "physics", "--clear")
    assert code == 0, err
    cleared = (await api.owner.get(f"/v1/tenants/{tenant_id}/quota")).body["quota"]
    assert (cleared["max_gpus"], cleared["max_gpus_total"], cleared["gpu_hours_per_7d"]) == (
        {},
        None,
        None,
    )


async def test_a_refused_quota_prints_the_apis_message(api: RunningApi, tmp_path: Path) -> None:
    _, admin = await new_tenant(api, "physics", "ann")
    env = cli_env(api, tmp_path)
    code, _, err = await einsora(env, "quota", "set", "physics", "--max-gpus", "k80-12gb=1")
    assert code == 1
    assert "k80-12gb" in err
    assert "request ID: " in err
    code, _, err = await einsora(cli_env(api, tmp_path, admin.token), "quota", "set", "physics")
    assert code == 1
    assert "only the operator" in err
    code, _, err = await einsora(env, "quota", "set", "physics", "--max-gpus", "l40s-48gb")
    assert code == 2
    assert "CLASS=N" in err


async def test_usage_says_why_when_accounting_cannot_answer(
    api: RunningApi, tmp_path: Path
) -> None:
    code, _, err = await einsora(cli_env(api, tmp_path), "usage", "--group-by", "class")
    assert code == 1
    assert "accounting" in err
    assert "HTTP 503" in err
    assert "request ID: " in err
    code, _, err = await einsora(cli_env(api, tmp_path), "usage", "--from", "yesterday")
    assert code == 1
    assert "from" in err
    assert "HTTP 422" in err


async def test_usage_prints_the_report_as_a_table_and_as_json(
    api: RunningApi, bus: Bus, tmp_path: Path, data_dir: Path
) -> None:
    tenant_id, ann = await new_tenant(api, "physics", "ann")
    bob = await new_member(api, tenant_id, "bob", by=ann)
    made = await bob.post("/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    key = await bob.post("/v1/gateway/keys", {"name": "bob's"})
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=2)
    url = f"sqlite+aiosqlite:///{tmp_path / 'accounting.db'}"
    accounting = AccountingService(Settings(nats_url=bus.url, database_url=url, data_dir=data_dir))
    await accounting.start()
    try:
        what = held(2, placed_class="l40s-48gb", cpus=4)
        await SchedulerPlayer(bus.js).run_for(
            made.body["id"], start, start + timedelta(hours=1.5), tenant_id=tenant_id, metered=what
        )
        gateway = GatewayPlayer(bus.js)
        await gateway.send(
            gateway.usage(start, tenant_id=tenant_id, key_id=key.body["id"], prompt=7, completion=3)
        )
        await events_done(bus.js)
        await tokens_done(bus.js)
        window = ("--from", (start - timedelta(hours=1)).isoformat())

        env = cli_env(api, tmp_path, ann.token)
        code, out, err = await einsora(env, "usage", "--group-by", "user", *window)
        assert code == 0, err
        header, *rows = out.splitlines()
        assert header.startswith("usage by user from ")
        assert rows[0].split()[:3] == ["USER", "GPU-HOURS", "CPU-CORE-HOURS"]
        assert [r.split() for r in rows[1:]] == [["bob", "3.00", "6.00", "7", "3"]]

        code, out, err = await einsora(env, "usage", "--group-by", "user", "--json", *window)
        assert code == 0, err
        printed = json.loads(out)
        answer = await ann.get(
            "/v1/usage", params={"group_by": "user", "from": window[1], "to": printed["to"]}
        )
        assert printed == answer.body
    finally:
        await accounting.stop()
