"""`einsora ssh ID`: the system's `ssh` to a VM, through the access proxy; never an open port.

Each connection takes a one-time access ticket (`POST /v1/workloads/{id}/access`), redeems it
at the VM's site for that site's session cookie, and opens `/_einsora/ssh` there: a WebSocket
whose binary messages are the bytes of one TCP connection to the VM's SSH port, reached on its
machine directly or through the machine's tunnel. `ssh` runs this command itself as its
`ProxyCommand` (`einsora ssh --stdio ID`), so its host key checks, agent and options work as
usual; the VM's SSH server (and the key its NoCloud seed gave it) is the gate beyond the proxy.
The VM's host key is remembered under the alias `einsora-<id>`.

aiohttp is imported only in `--stdio` mode: `einsora --help` stays light.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import sys
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from einsora.cli.client import ApiClient

SSH_PATH = "/_einsora/ssh"
CHUNK = 65536


def _args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="the VM's workload id")
    parser.add_argument("-l", dest="user", help="the user to log in as on the VM")
    parser.add_argument("-i", dest="identity", help="the private key to offer (ssh -i)")
    parser.add_argument(
        "-o", dest="options", action="append", default=[], help="an ssh option (ssh -o)"
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="be the connection itself on stdin and stdout (what ssh runs as ProxyCommand)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="a command to run on the VM")


def proxy_command(workload_id: str, api: str | None) -> str:
    """What `ssh` runs to reach the VM: this command in `--stdio` mode."""
    argv = [sys.executable, "-m", "einsora.common.cli", "ssh", "--stdio", workload_id]
    if api:
        argv += ["--api", api]
    return shlex.join(argv)


def ssh_argv(args: argparse.Namespace) -> list[str]:
    """The `ssh` command line for `einsora ssh` with `args`."""
    alias = f"einsora-{args.id}"
    argv = [
        "ssh",
        "-o",
        f"ProxyCommand={proxy_command(args.id, getattr(args, 'api', None))}",
        "-o",
        f"HostKeyAlias={alias}",
    ]
    for option in args.options:
        argv += ["-o", option]
    if args.identity:
        argv += ["-i", args.identity]
    if args.user:
        argv += ["-l", args.user]
    argv.append(alias)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return argv + command


def _ssh(client: ApiClient, args: argparse.Namespace) -> int:  # noqa: RET503 - exec never returns
    if args.stdio:
        return asyncio.run(bridge(client, args.id))
    if shutil.which("ssh") is None:
        print("einsora: no ssh client on this machine (install OpenSSH's)", file=sys.stderr)
        return 2
    argv = ssh_argv(args)
    sys.stdout.flush()
    os.execvp(argv[0], argv)  # noqa: S606 - the user's own ssh, with its own arguments


def _site(url: str) -> tuple[str, str, str]:
    """(the address to dial, the site's Host, the site's origin) of an access link. A
    `*.localhost` site is dialed at 127.0.0.1: Python does not resolve those names."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    dial = "127.0.0.1" if host == "localhost" or host.endswith(".localhost") else host
    return f"{parts.scheme}://{dial}:{port}", parts.netloc, f"{parts.scheme}://{parts.netloc}"


async def bridge(client: ApiClient, workload_id: str) -> int:
    """stdin and stdout as one TCP connection to the VM's SSH port, through the proxy."""
    import aiohttp

    access = client.post(f"/v1/workloads/{workload_id}/access")
    parts = urlsplit(access["url"])
    base, host, origin = _site(access["url"])
    enter = f"{base}{parts.path}?{parts.query}"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        async with session.get(enter, headers={"Host": host}, allow_redirects=False) as entered:
            if entered.status != 303:
                text = (await entered.text()).strip()
                print(f"einsora: the VM's site refused the ticket: {text}", file=sys.stderr)
                return 1
            jar: SimpleCookie = SimpleCookie()
            for value in entered.headers.getall("Set-Cookie", []):
                jar.load(value)
        cookie = "; ".join(f"{k}={m.value}" for k, m in jar.items())
        headers = {"Host": host, "Origin": origin, "Cookie": cookie}
        try:
            ws = await session.ws_connect(base + SSH_PATH, headers=headers, max_msg_size=0)
        except aiohttp.WSServerHandshakeError as exc:
            print(f"einsora: the VM's SSH port is not reachable ({exc.status})", file=sys.stderr)
            return 1
        async with ws:
            await _pump(ws)
    return 0


async def _pump(ws: Any) -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def up() -> None:
        while data := await reader.read(CHUNK):
            await ws.send_bytes(data)

    async def down() -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                return
            await loop.run_in_executor(None, _write_all, msg.data)

    tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(sys.stdout.fileno(), view)
        view = view[written:]


COMMANDS = [
    ("ssh", "ssh to a VM through the access proxy (a one-time ticket per connection)", _args, _ssh)
]
