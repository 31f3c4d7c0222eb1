"""`einsora launch --fallback`, `show` and `regions`, run as real subprocesses against a real
api (ADR-0022)."""

from __future__ import annotations

import json
from pathlib import Path

from einsora.api.testing import RunningApi, cli_env, einsora, eventually
from einsora.common.bus import bind_bucket, names
from einsora.common.schemas import RegionStatus, utcnow
from einsora.common.testing import Bus


async def test_launch_with_a_chain_and_show_it(api: RunningApi, tmp_path: Path) -> None:
    env = cli_env(api, tmp_path)
    code, out, err = await einsora(
        env,
        "launch",
        "notebook",
        "--class",
        "l40s-48gb",
        "--fallback",
        "class:a100-80gb",
        "--fallback",
        "class:cpu-8c-32g",
        "--fallback-after",
        "60",
        "--json",
    )
    assert code == 0, err
    workload = json.loads(out)
    assert workload["fallback"] == [{"class": "a100-80gb"}, {"class": "cpu-8c-32g"}]
    assert workload["fallback_after_s"] == 60
    code, out, err = await einsora(env, "show", workload["id"])
    assert code == 0, err
    [chain] = [line for line in out.splitlines() if line.startswith("fallback")]
    assert chain.split(None, 1)[1] == "a100-80gb → cpu-8c-32g (after 60 s each)"


async def test_a_bad_step_is_a_usage_error_or_the_apis_refusal(
    api: RunningApi, tmp_path: Path
) -> None:
    env = cli_env(api, tmp_path)
    code, _, err = await einsora(env, "launch", "vm", "--class", "l40s-48gb", "--fallback", "gpu")
    assert code == 2
    assert "is not KIND:VALUE with KIND one of class, machine, region, model, replicas" in err
    code, _, err = await einsora(
        env, "launch", "vm", "--class", "l40s-48gb", "--fallback", "region:mars"
    )
    assert code == 1
    assert "fallback.0: no region 'mars'" in err
    assert "request ID: " in err


async def test_regions_lists_each_schedulers_liveness(
    api: RunningApi, bus: Bus, tmp_path: Path
) -> None:
    status = RegionStatus(region="office", at=utcnow(), period_s=5, machines=3, free={"l4-24gb": 2})
    await bind_bucket(bus.js, names.REGIONS).put(names.region_key("office"), status.to_bytes())

    async def listed() -> bool:
        regions = (await api.owner.get("/v1/regions")).body["items"]
        return any(r["name"] == "office" for r in regions)

    await eventually(listed)
    code, out, err = await einsora(cli_env(api, tmp_path), "regions")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["office"][:5] == ["office", "up", "0", "l4-24gb:2", "0"]
    assert rows["local"][1] == "unknown"
