"""Dial-out only, for real: a machine in a network namespace of the test's own joins Solo, and
its notebook opens in Chromium through the access proxy, over the tunnel its agent dialed.

The namespace reaches the host over one veth pair. In it, the project's own `einsora agent
join` and `einsora agent --driver process` run as subprocesses (`ip netns exec`): they dial
the api, NATS and the tunnel hub on the host side, and nothing in the namespace listens beyond
its loopback, so nothing on the host can connect in. The control plane's own (sim) machine is
too small for the notebook, which can only land on the joined machine. Revocation ends it all:
the workload fails, and the agent stops it and exits non-zero, saying why.

Needs root, iproute2 and Debian's Chromium (as `test_browser.py`); skipped, with the reason,
elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.conftest import Api, StartPlane
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, RUN_1_PLUS_1

from einsora.common.testing import subprocess_env, until

EINSORA = Path(sys.executable).parent / "einsora"
IP = shutil.which("ip") or "/usr/sbin/ip"
LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp{,6}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces and veth pairs"),
    pytest.mark.skipif(not Path(IP).exists(), reason="needs iproute2's `ip`"),
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Debian's chromium is not installed (scripts/test-deps.sh installs it as root)",
    ),
]


@dataclass(frozen=True)
class Netns:
    """A network namespace of this test's own, joined to the host by a veth pair."""

    name: str
    host_ip: str
    """The host's end: the control plane listens here."""
    ns_ip: str
    """The machine's address."""

    def exec(self, *argv: str) -> list[str]:
        return [IP, "netns", "exec", self.name, *argv]


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)


def _free_subnet() -> int:
    """A /24 of 10.231.0.0/16 that no interface of the host uses (runs may overlap)."""
    used = _ip("-o", "-4", "addr").stdout
    for n in random.sample(range(1, 255), 254):
        if f" 10.231.{n}." not in used:
            return n
    raise AssertionError("every 10.231.<n>.0/24 is in use on this host")


def _pids_in(name: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", name).stdout.split()]


@pytest.fixture
def netns() -> Iterator[Netns]:
    """Whatever happens: every process left in it is killed, the veth and the namespace go."""
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"einsora-t{tag}", f"ez{tag}h", f"ez{tag}n"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` does not work here: {made.stderr.strip()}")
    n = _free_subnet()
    ns = Netns(name, host_ip=f"10.231.{n}.1", ns_ip=f"10.231.{n}.2")
    try:
        for args in (
            ("link", "add", host_if, "type", "veth", "peer", "name", ns_if),
            ("link", "set", ns_if, "netns", name),
            ("addr", "add", f"{ns.host_ip}/30", "dev", host_if),
            ("link", "set", host_if, "up"),
            ("-n", name, "addr", "add", f"{ns.ns_ip}/30", "dev", ns_if),
            ("-n", name, "link", "set", ns_if, "up"),
            ("-n", name, "link", "set", "lo", "up"),
        ):
            done = _ip(*args)
            assert done.returncode == 0, (args, done.stderr)
        yield ns
    finally:
        # A failed test may leave the agent's workloads running; they live in here only.
        for pid in _pids_in(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ip("link", "del", host_if)
        _ip("netns", "del", name)


async def _listeners(ns: Netns) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Every listening TCP socket in the namespace (its /proc/net is the reader's)."""
    found: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        proc = await asyncio.create_subprocess_exec(
            *ns.exec("cat", table), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err
        for line in out.decode().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            host = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(host)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            found.append((ip, int(port, 16)))
    return found


async def _dial(host: str, port: int) -> str:
    """What a TCP connection from the host to `host:port` meets."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=3.0)
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timed out"
    writer.close()
    await writer.wait_closed()
    return "accepted"


async def _joined_machine(api: Api, machine_id: str, agent: asyncio.subprocess.Process) -> Any:
    """The machine as the api lists it once its agent has reported its inventory."""
    deadline = time.monotonic() + 60
    while True:
        assert agent.returncode is None, f"the agent exited with {agent.returncode}"
        items = (await api.ok("GET", "/v1/machines"))["items"]
        machine = next((m for m in items if m["id"] == machine_id), None)
        if machine is not None and machine["inventory"] is not None:
            return machine
        assert time.monotonic() < deadline, f"{machine_id} reported nothing: {machine}"
        await asyncio.sleep(0.2)


async def test_a_machine_that_accepts_no_inbound_connection_serves_a_notebook_to_chromium(
    netns: Netns, start_plane: StartPlane, tmp_path: Path
) -> None:
    from playwright.async_api import async_playwright

    # A short sockets dir: a unix socket's path has at most 107 bytes, and pytest's are long.
    sockets = Path(tempfile.mkdtemp(prefix="einsora-t"))
    data_dir = tmp_path / "machine"
    agent_log = tmp_path / "agent.log"
    env = subprocess_env(EINSORA_DATA_DIR=str(data_dir), EINSORA_LOG_FORMAT="text")
    agent: asyncio.subprocess.Process | None = None
    try:
        plane = await start_plane(
            driver="sim",
            sim_inventory="1 cpu, 1 GiB",
            settings={"nats_listen": netns.host_ip, "tunnel_sockets_dir": sockets},
        )
        proxy, hub = plane.proxy, plane.proxy.hub if plane.proxy is not None else None
        assert proxy is not None
        assert hub is not None
        owner_token = (plane.settings.data_dir / "owner.token").read_text().strip()
        async with aiohttp.ClientSession() as http:
            # Everything listens on the host's end of the veth only, not on 127.0.0.1.
            api = Api(http, f"http://{netns.host_ip}:{plane.api_port}", owner_token)
            token = await api.ok("POST", "/v1/machines/join-tokens", {})
            assert token["tunnel"] is True

            # The token on stdin, out of `ps`.
            join = await asyncio.create_subprocess_exec(
                *netns.exec(str(EINSORA), "agent", "join", api.base, "--token", "-"),
                "--data-dir",
                str(data_dir),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
            )
            said, _ = await asyncio.wait_for(join.communicate(token["token"].encode()), 60)
            joined = said.decode()
            assert join.returncode == 0, joined
            found = re.search(r" as machine ([\w-]+):", joined)
            assert found is not None, joined
            machine_id = found[1]
            assert token["token"] not in joined

            with agent_log.open("wb") as out:
                agent = await asyncio.create_subprocess_exec(
                    *netns.exec(str(EINSORA), "agent", "--driver", "process"),
                    *("--data-dir", str(data_dir), "--heartbeat", "2", "--grace", "3"),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            machine = await _joined_machine(api, machine_id, agent)
            assert machine["enrolment"]["tunnel"] is True

            launched_at = time.monotonic()
            body = {"kind": "notebook", "class": "cpu-1c-2g"}
            workload = await api.ok("POST", "/v1/workloads", body)
            running = await api.wait_state(workload["id"], "running", within_s=90)
            print(f"launch → running: {time.monotonic() - launched_at:.2f} s")
            assert running["placement"]["machine"] == machine_id

            # Routed through the machine's tunnel, and that tunnel is up.
            await until(lambda: proxy.route(workload["id"]) is not None, what="routed")
            route = proxy.route(workload["id"])
            assert route is not None
            assert route.via_tunnel
            assert route.machine_id == machine_id
            await until(lambda: hub.connected(machine_id), within_s=30, what="tunnel up")

            # In Chromium, through the proxy: the sites' `*.localhost` names lead to the host's
            # end of the veth, where the proxy listens.
            access = await api.ok("POST", f"/v1/workloads/{workload['id']}/access")
            args = [*CHROMIUM_ARGS, f"--host-resolver-rules=MAP *.localhost {netns.host_ip}"]
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=args)
                try:
                    page = await browser.new_page()
                    await page.goto(access["url"])
                    assert "/lab" in page.url
                    await page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
                    result = await page.evaluate(RUN_1_PLUS_1)
                finally:
                    await browser.close()
            assert result == "2"

            # Dial-out only, with the kernel running too: nothing in the namespace listens beyond
            # its loopback, and the host can connect to none of the ports that listen in there.
            listeners = await _listeners(netns)
            print(f"listening in {netns.name}: {sorted((str(a), p) for a, p in listeners)}")
            assert route.port in {port for _, port in listeners}
            assert all(address.is_loopback for address, _ in listeners), listeners
            for port in sorted({route.port} | {port for _, port in listeners}):
                met = await _dial(netns.ns_ip, port)
                print(f"host → {netns.ns_ip}:{port}: {met}")
                assert met in ("refused", "timed out")

            # Revoked: the workload fails with the reason; the agent stops it, and exits
            # non-zero saying why, leaving nothing running in the namespace.
            revoked_at = time.monotonic()
            await api.ok("DELETE", f"/v1/machines/{machine_id}")
            await api.wait_state(workload["id"], "failed")
            events = (await api.ok("GET", f"/v1/workloads/{workload['id']}/events"))["items"]
            assert events[-1]["reason"].startswith("machine revoked"), events[-1]
            code = await asyncio.wait_for(agent.wait(), 60)
            print(f"revoke → agent exited ({code}): {time.monotonic() - revoked_at:.2f} s")
            assert code != 0
            assert "machine revoked" in agent_log.read_text()
            await until(lambda: not _pids_in(netns.name), within_s=10, what="nothing left")
    except BaseException:
        if agent_log.exists():
            print(f"--- the agent's output ---\n{agent_log.read_text()}")
        raise
    finally:
        if agent is not None and agent.returncode is None:
            agent.terminate()
            try:
                await asyncio.wait_for(agent.wait(), 20)
            except TimeoutError:
                agent.kill()
                await agent.wait()
        shutil.rmtree(sockets, ignore_errors=True)
