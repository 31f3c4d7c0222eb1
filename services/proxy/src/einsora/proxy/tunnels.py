"""TunnelHub: where agents of machines that accept no inbound connection dial their tunnel.

The agent opens a TCP connection to the hub and then plays the SSH *server* on it; the hub plays
the SSH *client* (asyncssh's reverse direction, ADR-0015), so it can open `direct-tcpip` channels
to `127.0.0.1:<port>` on the agent's machine. The hub knows a connection's machine only by the
SSH host key the agent proves it holds, looked up in the machines' enrolments: an unknown key, a
key two enrolments claim, or a revoked enrolment is refused, and a revocation (or a deleted
enrolment) closes the machine's connection at once.

For every tunnelled route the hub serves a unix socket at `socket_path(tunnel_dir, machine,
port)` that forwards to that port through the machine's tunnel; the proxy and the gateway connect
to it, so a missing socket means the tunnel is down. It never opens anything else through a
tunnel (no session, shell, exec or file transfer), and never logs a key's private part.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path

import asyncssh

from einsora.common.errors import PortInUse
from einsora.common.runloop import raise_if_cancelled
from einsora.common.schemas import Enrolment
from einsora.common.ssh_keys import key_line, load_or_make_key, quiet_asyncssh
from einsora.common.tunnel_clients import socket_path

log = logging.getLogger("einsora.proxy.tunnels")

CIPHERS = ("aes256-gcm@openssh.com", "aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com")
"""AES-GCM first: about 1.6 times chacha20's throughput where the CPU has AES instructions."""
KEEPALIVE_S = 15.0
"""A silent peer is dropped after three of these (a network gone, not an idle tunnel)."""
LOGIN_S = 10.0
SOCKET_PATH_MAX = 107
"""The longest unix socket path the kernel takes (108 bytes with the final NUL)."""

Forward = tuple[str, int]
"""A machine id and a port on that machine."""


def _key_id(line: str) -> tuple[str, ...]:
    # An enrolment may keep the key's comment; only the algorithm and the key itself count.
    return tuple(line.split()[:2])


class _HubClient(asyncssh.SSHClient):
    """One connection's SSH client: decides which machine the peer is by its host key."""

    def __init__(self, hub: TunnelHub) -> None:
        self._hub = hub
        self.machine_id: str | None = None
        self.key: str = ""

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.key = key_line(key)
        self.machine_id = self._hub.machine_of(self.key)
        if self.machine_id is None:
            self._hub.refusals += 1
            log.warning(
                "tunnel refused: its key is not an enrolled machine's", extra={"addr": addr}
            )
        return self.machine_id is not None


class TunnelHub:
    """Accepts agents' tunnels on `host:port` and serves a socket per tunnelled route.

    `enrolments()` is the enrolments bucket as it is now; `forwards()` the (machine, port) of
    every tunnelled route. Call `refresh()` when the enrolments change, `forwards_changed()`
    when the routes do.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        client_key: Path,
        tunnel_dir: Path,
        enrolments: Callable[[], Mapping[str, Enrolment]],
        forwards: Callable[[], Iterable[Forward]] = lambda: (),
    ) -> None:
        self._host = host
        self.port = port
        self._key = load_or_make_key(client_key, what="tunnel key", public_beside=True)
        self._dir = tunnel_dir
        self._enrolments = enrolments
        self._forwards_wanted = forwards
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._conns: dict[str, asyncssh.SSHClientConnection] = {}
        self._keys: dict[str, str] = {}
        self._forwards: dict[
            Forward, tuple[asyncssh.SSHClientConnection, asyncssh.SSHListener]
        ] = {}
        self._dirty = asyncio.Event()
        self._check_pending = False
        self.refusals = 0
        """Handshakes refused for a key no live enrolment holds, since start."""
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def public_key(self) -> str:
        """The hub's client key as one OpenSSH line: what agents pin at enrolment."""
        return key_line(self._key)

    def connected(self, machine_id: str) -> bool:
        return machine_id in self._conns

    def machine_of(self, key: str) -> str | None:
        """The machine whose live (unrevoked) enrolment holds `key`; None if none or several."""
        owners = self._owners().get(_key_id(key), [])
        if len(owners) > 1:
            log.error("tunnel key claimed by several machines; refused", extra={"machines": owners})
        return owners[0] if len(owners) == 1 else None

    def _owners(self) -> dict[tuple[str, ...], list[str]]:
        owners: dict[tuple[str, ...], list[str]] = {}
        for key, enrolment in self._enrolments().items():
            if key == enrolment.machine_id and not enrolment.revoked and enrolment.tunnel_key:
                owners.setdefault(_key_id(enrolment.tunnel_key), []).append(enrolment.machine_id)
        return owners

    async def start(self) -> None:
        quiet_asyncssh()
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._dir, 0o700)
        for stale in self._dir.glob("*/*.sock"):  # a previous run's: their tunnels are gone
            stale.unlink(missing_ok=True)
        if len(str(self._dir)) + 1 + 22 + 11 > SOCKET_PATH_MAX:
            log.error(
                "tunnel socket dir is too long for unix sockets; choose a shorter EINSORA_DATA_DIR",
                extra={"dir": str(self._dir)},
            )
        try:
            self._acceptor = await asyncssh.listen_reverse(
                self._host,
                self.port,
                client_factory=lambda: _HubClient(self),
                acceptor=self._accepted,
                error_handler=self._failed,
                options=self._options(),
            )
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUse(
                    f"cannot listen on {self._host}:{self.port} for tunnels: the port is taken; "
                    "choose another with EINSORA_TUNNEL_PORT"
                ) from exc
            raise
        self.port = self._acceptor.get_port()
        self._spawn(self._reconcile_loop(), "tunnel forwards")
        log.info("tunnel hub listening", extra={"port": self.port})

    def _options(self) -> asyncssh.SSHClientConnectionOptions:
        # Nothing from ~/.ssh (config, known_hosts, agent, CA bundles): only our pinned keys.
        return asyncssh.SSHClientConnectionOptions(
            config=None,
            username="einsora-hub",
            client_keys=[self._key],
            known_hosts=([], [], []),  # trust is decided by validate_host_public_key alone
            agent_path=None,
            gss_host=None,
            x509_trusted_certs=None,
            x509_trusted_cert_paths=None,
            encryption_algs=CIPHERS,
            keepalive_interval=KEEPALIVE_S,
            keepalive_count_max=3,
            login_timeout=LOGIN_S,
        )

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for machine_id in list(self._conns):
            await self.cut(machine_id)
        for forward in list(self._forwards):
            self._close_forward(forward)

    def refresh(self) -> None:
        """The enrolments changed: cut at once every tunnel whose machine lost its enrolment
        (revoked, deleted, or its key changed), and re-check the forwards."""
        if not self._check_pending:  # a burst (a mirror's full re-read) is checked once
            self._check_pending = True
            asyncio.get_running_loop().call_soon(self._check_enrolments)

    def _check_enrolments(self) -> None:
        self._check_pending = False
        owners = self._owners()
        for machine_id, conn in list(self._conns.items()):
            if owners.get(_key_id(self._keys[machine_id])) != [machine_id]:
                log.warning("tunnel cut: enrolment revoked or gone", extra={"machine": machine_id})
                self._drop(machine_id, conn)
        self._dirty.set()

    def forwards_changed(self) -> None:
        """The tunnelled routes changed: serve the sockets they need, close the others."""
        self._dirty.set()

    async def cut(self, machine_id: str) -> None:
        """Close a machine's tunnel (it may dial again; refresh() decides whether it is let in)."""
        conn = self._conns.get(machine_id)
        if conn is not None:
            self._drop(machine_id, conn)
            await conn.wait_closed()
        for forward in [f for f in self._forwards if f[0] == machine_id]:
            self._close_forward(forward)

    async def open_connection(
        self, machine_id: str, port: int
    ) -> tuple[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]]:
        """A stream to `127.0.0.1:port` on the machine, through its tunnel."""
        conn = self._conns.get(machine_id)
        if conn is None:
            raise ConnectionRefusedError(f"{machine_id}'s tunnel is not connected")
        return await conn.open_connection("127.0.0.1", port)

    def _accepted(self, conn: asyncssh.SSHClientConnection) -> None:
        client = conn.get_owner()
        assert isinstance(client, _HubClient)
        machine_id = client.machine_id
        if machine_id is None or self.machine_of(client.key) != machine_id:
            conn.close()  # revoked between its handshake and now
            return
        old = self._conns.get(machine_id)
        if old is not None:  # the agent dialed again: its old connection is dead or dying
            self._drop(machine_id, old)
        self._conns[machine_id] = conn
        self._keys[machine_id] = client.key
        peer = conn.get_extra_info("peername")
        log.info("tunnel connected", extra={"machine": machine_id, "addr": peer and peer[0]})
        self._spawn(self._watch(machine_id, conn), f"tunnel {machine_id}")
        self._dirty.set()

    def _failed(self, conn: asyncssh.SSHClientConnection | None, exc: Exception) -> None:
        log.info("tunnel handshake failed", extra={"error": exc.__class__.__name__})

    def _drop(self, machine_id: str, conn: asyncssh.SSHClientConnection) -> None:
        if self._conns.get(machine_id) is conn:
            del self._conns[machine_id]
            self._keys.pop(machine_id, None)
        conn.close()
        self._dirty.set()

    async def _watch(self, machine_id: str, conn: asyncssh.SSHClientConnection) -> None:
        await conn.wait_closed()
        if self._conns.get(machine_id) is conn:
            log.info("tunnel closed", extra={"machine": machine_id})
            self._drop(machine_id, conn)

    async def _reconcile_loop(self) -> None:
        while True:
            raise_if_cancelled()
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._reconcile()
            except Exception:
                # A hub that stopped reconciling would serve dead sockets for ever: go on.
                log.exception("tunnel forwards failed to reconcile; retrying")
                await asyncio.sleep(1.0)
                self._dirty.set()

    async def _reconcile(self) -> None:
        wanted = set(self._forwards_wanted())
        for forward, (conn, _) in list(self._forwards.items()):
            if forward not in wanted or self._conns.get(forward[0]) is not conn:
                self._close_forward(forward)
        for machine_id, port in sorted(wanted):
            conn_now = self._conns.get(machine_id)
            if conn_now is None or (machine_id, port) in self._forwards:
                continue
            try:
                path = socket_path(self._dir, machine_id, port)
                path.parent.mkdir(mode=0o700, exist_ok=True)
                listener = await conn_now.forward_local_path_to_port(str(path), "127.0.0.1", port)
            except (OSError, ValueError, asyncssh.Error) as exc:
                log.error(
                    "tunnel forward not served",
                    extra={"machine": machine_id, "port": port, "error": repr(exc)},
                )
                continue
            self._forwards[(machine_id, port)] = (conn_now, listener)

    def _close_forward(self, forward: Forward) -> None:
        _, listener = self._forwards.pop(forward)
        listener.close()
        path = socket_path(self._dir, *forward)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: another port's socket is still there
            path.parent.rmdir()

    def _spawn(self, work: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
