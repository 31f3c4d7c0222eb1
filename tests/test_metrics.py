"""Every service serves Prometheus `/metrics` that `promtool` accepts, and every query of the
Grafana dashboard names a metric a real service serves.

A real Solo runs in this process with each service's metrics port set; one launch, one gateway
request and one proxy request give the counters something to count. `promtool` is Debian's
`prometheus` package (scripts/test-deps.sh installs it; CI always has it).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml
from tests.conftest import WAIT_S, OpenApi, StartPlane

from einsora.api.testing import eventually
from einsora.cli.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "einsora.json"
PORTS = {
    f"{name}_metrics_port": 0
    for name in ("api", "scheduler", "accounting", "gateway", "proxy", "agent")
}
_METRIC = re.compile(r"\beinsora_[a-z0-9_]+")


async def _scrape(start_plane: StartPlane, api_of: OpenApi) -> dict[str, str]:
    """Each service's /metrics after some traffic, by service: a launch that runs and is
    removed (an allocation metered), one that waits in the queue, a gateway request and a
    proxy request."""
    plane = await start_plane(driver="sim", settings=PORTS, sim_inventory="1x l40s-48gb")
    api = await api_of(plane)
    first = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    await api.wait_state(first["id"], "running")
    second = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "l40s-48gb"})
    await api.wait_state(second["id"], "queued")
    async with aiohttp.ClientSession() as http:

        async def pages() -> dict[str, str]:
            found = {}
            for name, port in _ports(plane).items():
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    assert resp.status == 200, name
                    found[name] = await resp.text()
            return found

        # The scheduler reads its queue into the gauge at most once a second.
        await eventually(lambda: _has(pages, "einsora_scheduler_queue_depth{"), within_s=WAIT_S)
        await api.ok("DELETE", f"/v1/workloads/{first['id']}")
        await api.wait_state(second["id"], "running")
        await eventually(lambda: _has(pages, "einsora_gpu_seconds_metered_total{"), within_s=WAIT_S)
        gateway = f"http://127.0.0.1:{plane.settings.gateway_port}/v1/models"
        async with http.get(gateway) as resp:
            assert resp.status == 401  # no key: counted all the same
        assert plane.proxy is not None
        async with http.get(f"http://127.0.0.1:{plane.proxy.port}/") as resp:
            assert resp.status == 404
        return await pages()


async def _has(pages: Callable[[], Awaitable[dict[str, str]]], prefix: str) -> bool:
    return any(
        line.startswith(prefix) for page in (await pages()).values() for line in page.splitlines()
    )


def _ports(plane: ControlPlane) -> dict[str, int]:
    services = {
        "api": plane.api,
        "scheduler": plane.scheduler,
        "accounting": plane.accounting,
        "gateway": plane.gateway,
        "proxy": plane.proxy,
        "agent": plane.agent,
    }
    ports = {}
    for name, service in services.items():
        port = getattr(service, "metrics_port", None)
        assert isinstance(port, int), f"{name} serves no /metrics"
        ports[name] = port
    return ports


def _sample_names(page: str) -> set[str]:
    return {
        line.split("{")[0].split(" ")[0]
        for line in page.splitlines()
        if line and not line.startswith("#")
    }


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


async def test_every_dashboard_query_names_a_metric_a_real_service_serves(
    start_plane: StartPlane, api_of: OpenApi
) -> None:
    pages = await _scrape(start_plane, api_of)
    served = set().union(*(_sample_names(page) for page in pages.values()))
    queries = _queries()
    assert len(queries) >= 20
    named = {m for q in queries for m in _METRIC.findall(q)}
    assert named - served == set(), f"queries name metrics no service serves: {named - served}"
    # Each service serves its own figures, and the dashboard shows some of each.
    for service, page in pages.items():
        own = {m for m in _sample_names(page) if m.startswith("einsora_")}
        assert own & named, f"the dashboard shows nothing of {service}"
    running = [
        line
        for line in pages["agent"].splitlines()
        if line.startswith("einsora_agent_driver_actions_total{")
        and 'action="start"' in line
        and 'outcome="ok"' in line
    ]
    assert running
    assert float(running[0].rsplit(" ", 1)[1]) >= 1


PROMTOOL = shutil.which("promtool")


def _promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian's prometheus package; scripts/test-deps.sh "
    "installs it where it can, and CI always has it)",
)
async def test_promtool_accepts_every_services_metrics_and_every_dashboard_query(
    start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    assert PROMTOOL is not None
    pages = await _scrape(start_plane, api_of)
    for service, page in pages.items():
        checked = await asyncio.to_thread(_promtool, "check", "metrics", stdin=page)
        assert checked.returncode == 0, f"{service}: {checked.stdout}{checked.stderr}"
    # PromQL is checked by promtool as recording rules: a typo in a query fails here.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"einsora:dashboard:{i}", "expr": expr}
                    for i, expr in enumerate(_queries())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = await asyncio.to_thread(_promtool, "check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
