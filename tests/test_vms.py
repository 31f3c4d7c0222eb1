"""A guest's VM, end to end on a real libvirtd (the engine tier): placed on the libvirt driver
of a machine shared with the guest, while the guest's notebook is refused that machine's
process driver; its web UI through the access proxy; its serial console in the browser's
terminal socket; `einsora ssh` through a one-time ticket; park (a managed save, said on the
timeline) and resume with its disk; remove.

Everything real: api, scheduler, proxy and an agent with the process and libvirt drivers in
this process over an embedded nats-server, the tiny guest under TCG.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncssh
import pytest
from tests.conftest import Api, OpenApi, StartPlane, tenant_admin

from einsora.api.testing import eventually
from einsora.cli.controlplane import ControlPlane
from einsora.common.testing import subprocess_env
from einsora.proxy.vm_access import STATIC
from einsora.testing.pytest_engines import LibvirtEngine

pytestmark = pytest.mark.engines

BOOT_S = 180.0
EINSORA = str(Path(sys.executable).parent / "einsora")


class Site:
    """The VM's site on the proxy, entered with a ticket as a browser would."""

    def __init__(self, plane: ControlPlane, api: Api, workload_id: str) -> None:
        assert plane.proxy is not None
        self.port = plane.proxy.port
        self.api = api
        self.workload_id = workload_id
        self.host = f"{workload_id}.localhost:{self.port}"
        self.origin = f"http://{self.host}"
        self.cookie = ""

    async def enter(self, http: aiohttp.ClientSession) -> str:
        access = await self.api.ok("POST", f"/v1/workloads/{self.workload_id}/access")
        url = urlsplit(access["url"])
        async with http.get(
            f"http://127.0.0.1:{self.port}{url.path}?{url.query}",
            headers={"Host": self.host},
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303, await resp.text()
            self.cookie = f"einsora-site={resp.cookies['einsora-site'].value}"
            return resp.headers["Location"]

    def headers(self, **more: str) -> dict[str, str]:
        return {"Host": self.host, "Cookie": self.cookie, **more}


async def _events(api: Api, workload_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await api.ok("GET", f"/v1/workloads/{workload_id}/events"))[
        "items"
    ]
    return items


async def _console_says(site: Site, http: aiohttp.ClientSession, command: str, want: str) -> str:
    """Type `command` on the VM's serial console through the proxy; what came back once `want`
    was seen."""
    seen = b""
    async with http.ws_connect(
        f"http://127.0.0.1:{site.port}/_einsora/console/ws",
        headers=site.headers(Origin=site.origin),
    ) as ws:
        await ws.send_bytes(f"\r{command}\r".encode())
        async with asyncio.timeout(30):
            while want.encode() not in seen:
                msg = await ws.receive()
                assert msg.type == aiohttp.WSMsgType.BINARY, msg
                seen += msg.data
    return seen.decode(errors="replace")


async def _ssh(env: dict[str, str], workload_id: str, key: Path, command: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        EINSORA,
        "ssh",
        workload_id,
        "-l",
        "root",
        "-i",
        str(key),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "--",
        command,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, (proc.returncode, out, err)
    return out.decode()


async def test_a_guests_vm_runs_on_libvirt_is_reached_through_the_proxy_parks_and_resumes(
    libvirt_engine: LibvirtEngine, start_plane: StartPlane, api_of: OpenApi, tmp_path: Path
) -> None:
    plane = await start_plane(driver="process", engines=libvirt_engine.options())
    owner = await api_of(plane)
    assert plane.agent is not None
    machine = plane.agent.machine_id
    tenant_id, guest = await tenant_admin(owner, "visitors")
    await owner.ok("PATCH", f"/v1/machines/{machine}", {"sharing": "invite-only"})
    invitation = await owner.ok(
        "POST", f"/v1/machines/{machine}/invitations", {"tenant": tenant_id}
    )
    await guest.ok("POST", f"/v1/machine-invitations/{invitation['id']}/accept")

    # The guest's notebook would run on the host's kernel: refused, and the timeline says why.
    notebook = await guest.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})

    async def refused() -> bool:
        return any(
            f"{machine}: only weak isolation (process) for a notebook" in e["reason"]
            for e in await _events(guest, notebook["id"])
        )

    await eventually(refused, within_s=30)

    key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    key_file.write_bytes(key.export_private_key("openssh"))
    key_file.chmod(0o600)
    spec = libvirt_engine.vm_spec(ssh_key=key.export_public_key("openssh").decode().strip())
    vm = await guest.ok(
        "POST", "/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g", "name": "box", "spec": spec}
    )
    running = await guest.wait_state(vm["id"], "running", within_s=BOOT_S)
    assert running["placement"]["machine"] == machine
    scheduled = next(e for e in await _events(guest, vm["id"]) if e["state"] == "scheduled")
    assert "; driver libvirt: a vm runs in a VM (strong isolation), " in scheduled["reason"]
    assert (await guest.ok("GET", f"/v1/workloads/{notebook['id']}"))["state"] == "queued"

    async with aiohttp.ClientSession() as http:
        site = Site(plane, guest, vm["id"])
        assert await site.enter(http) == "/"  # it serves a web UI: the site opens there
        async with http.get(f"http://127.0.0.1:{site.port}/", headers=site.headers()) as resp:
            assert resp.status == 200
            assert "served from its data disk" in await resp.text()
        async with http.get(
            f"http://127.0.0.1:{site.port}/_einsora/console", headers=site.headers()
        ) as resp:
            assert resp.status == 200
            assert "/_einsora/console/console.js" in await resp.text()
        async with http.get(
            f"http://127.0.0.1:{site.port}/_einsora/console/console.js", headers=site.headers()
        ) as resp:
            built = (STATIC / "console.js").is_file()
            assert resp.status == (200 if built else 503)
        said = await _console_says(site, http, "echo console-$((6*7))", "console-42")
        assert "console-42" in said
        # A socket from another origin is refused: the session cookie alone is not enough.
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(
                f"http://127.0.0.1:{site.port}/_einsora/console/ws",
                headers=site.headers(Origin="http://evil.localhost"),
            )

    env = subprocess_env(
        EINSORA_API=f"http://127.0.0.1:{plane.api_port}",
        EINSORA_TOKEN=guest.token,
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    assert await _ssh(env, vm["id"], key_file, "echo kept > /data/kept; sync; uname -s") == (
        "Linux\n"
    )

    await guest.ok("POST", f"/v1/workloads/{vm['id']}/park")
    await guest.wait_state(vm["id"], "parked", within_s=60)
    parked = [e for e in await _events(guest, vm["id"]) if e["state"] == "parked"][-1]
    assert f"parked on {machine} with a managed save in " in parked["reason"]
    await guest.ok("POST", f"/v1/workloads/{vm['id']}/resume")
    await guest.wait_state(vm["id"], "running", within_s=BOOT_S)
    assert await _ssh(env, vm["id"], key_file, "cat /data/kept") == "kept\n"

    await guest.ok("DELETE", f"/v1/workloads/{vm['id']}")
    await guest.wait_state(vm["id"], "removed", within_s=60)
    assert not (libvirt_engine.vm_dir / vm["id"]).exists()


TYPE_AND_READ = """
async (command) => {
  const c = window.einsoraConsole;
  const open = () => c && c.socket.readyState === WebSocket.OPEN;
  for (let i = 0; i < 300 && !open(); i++) { await new Promise(r => setTimeout(r, 100)); }
  if (!open()) { return 'the console socket did not open'; }
  c.term.paste('\\r' + command + '\\r');
  for (let i = 0; i < 300; i++) {
    const lines = [];
    const buffer = c.term.buffer.active;
    for (let y = 0; y < buffer.length; y++) {
      lines.push(buffer.getLine(y).translateToString(true));
    }
    const text = lines.join('\\n');
    if (text.includes('browser-42')) { return text; }
    await new Promise(r => setTimeout(r, 100));
  }
  return 'no answer in the terminal';
}
"""


@pytest.mark.skipif(
    not Path("/usr/bin/chromium").exists(),
    reason="Debian's chromium is not installed (scripts/test-deps.sh installs it as root)",
)
@pytest.mark.skipif(
    not (STATIC / "console.js").is_file(),
    reason="the console's terminal is not built (make console needs npm)",
)
async def test_the_serial_console_works_in_chromium(
    libvirt_engine: LibvirtEngine, start_plane: StartPlane, api_of: OpenApi
) -> None:
    from playwright.async_api import async_playwright
    from tests.test_browser import CHROMIUM, CHROMIUM_ARGS

    plane = await start_plane(driver="process", engines=libvirt_engine.options())
    owner = await api_of(plane)
    spec = libvirt_engine.vm_spec()
    del spec["http_port"]  # no web UI: its site opens at its console
    vm = await owner.ok("POST", "/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g", "spec": spec})
    await owner.wait_state(vm["id"], "running", within_s=BOOT_S)
    access = await owner.ok("POST", f"/v1/workloads/{vm['id']}/access")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = await browser.new_page()
        await page.goto(access["url"])
        assert page.url.endswith("/_einsora/console")
        shown = await page.evaluate(TYPE_AND_READ, "echo browser-$((40+2))")
        await browser.close()
    assert "browser-42" in shown, shown
    await owner.ok("DELETE", f"/v1/workloads/{vm['id']}")
    await owner.wait_state(vm["id"], "removed", within_s=60)
