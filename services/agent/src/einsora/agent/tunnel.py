"""AgentTunnel: the outbound tunnel through which the control plane reaches this machine's
workloads, for a machine that accepts no inbound connection (behind NAT, say).

The agent dials the control plane's tunnel hub over TCP and then plays the SSH *server* on that
socket (asyncssh's reverse direction, ADR-0015). The hub, the SSH client, authenticates with its
own key, which the agent pins (it was given the hub's public key at enrolment); the hub knows
this machine by the host key made here at enrolment. The only thing the hub may ask is a
`direct-tcpip` channel to 127.0.0.1 (or localhost) on a port of one of this machine's workloads;
sessions, shells, exec, SFTP, agent and X11 forwarding, remote listeners and every other
destination are refused, and each refusal is logged. The private key never leaves its file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import asyncssh

from einsora.common.bus.consumer import retry_delay
from einsora.common.errors import ConfigError
from einsora.common.runloop import raise_if_cancelled
from einsora.common.ssh_keys import key_line, load_or_make_key, quiet_asyncssh

log = logging.getLogger("einsora.agent.tunnel")

CIPHERS = ("aes256-gcm@openssh.com", "aes128-gcm@openssh.com", "chacha20-poly1305@openssh.com")
"""AES-GCM first: about 1.6 times chacha20's throughput where the CPU has AES instructions."""
KEEPALIVE_S = 15.0
"""A silent hub is given up after three of these, and dialed again."""
LOGIN_S = 10.0
CONNECT_S = 20.0
"""A dial that has no answer (an address that drops packets) is given up after this."""
STABLE_S = 30.0
"""A tunnel that stayed up this long resets the back-off."""
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})


def make_host_key(path: Path) -> str:
    """This machine's tunnel host key (ed25519, 0600), made if missing: its OpenSSH public line,
    which enrolment records as the machine's `tunnel_key`."""
    return key_line(load_or_make_key(path, what="tunnel host key"))


class _AgentServer(asyncssh.SSHServer):
    """One tunnel connection's SSH server: the hub's pinned key, workloads' ports, nothing else."""

    def __init__(self, tunnel: AgentTunnel) -> None:
        self._tunnel = tunnel
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn

    def begin_auth(self, username: str) -> bool:
        return True  # always authenticate: by the pinned key, never by a password

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        # Reached only for a key that is not the pinned one (that one matched already).
        log.warning("tunnel peer offered a key that is not the control plane's; refused")
        return False

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> asyncssh.SSHTCPSession[bytes] | bool:
        allowed = self._tunnel.allowed_ports()
        if dest_host not in LOCAL_HOSTS or dest_port not in allowed:
            log.warning(
                "tunnel channel refused: not a workload's port on this machine",
                extra={"host": dest_host[:64], "port": dest_port},
            )
            return False
        assert self._conn is not None
        # Always the IPv4 loopback, whatever `localhost` resolves to here.
        return self._conn.forward_connection("127.0.0.1", dest_port)  # type: ignore[return-value]

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        log.warning("tunnel remote listener refused", extra={"port": listen_port})
        return False

    def session_requested(self) -> bool:
        log.warning("tunnel session refused (no shell, exec or file transfer)")
        return False


class AgentTunnel:
    """Keeps this machine's tunnel to the hub at `address` up until `stop()`.

    `start()` returns at once; the tunnel dials in the background, and again after any failure
    with a capped, jittered back-off. `connected` is set while the tunnel is up. `on_refused` is
    called each time the hub refuses this machine's key (not enrolled there, or revoked).
    """

    def __init__(
        self,
        address: tuple[str, int],
        host_key: Path,
        hub_key: str,
        allowed_ports: Callable[[], set[int]],
        *,
        machine_id: str,
        on_refused: Callable[[], None] | None = None,
        retry_first_s: float = 0.5,
        retry_cap_s: float = 30.0,
    ) -> None:
        self._address = address
        self._host_key = load_or_make_key(host_key, what="tunnel host key")
        try:
            self._hub_keys = asyncssh.import_authorized_keys(hub_key.strip() + "\n")
        except (ValueError, asyncssh.KeyImportError) as exc:
            raise ConfigError("the tunnel hub's key is not an OpenSSH public key") from exc
        self.allowed_ports = allowed_ports
        self.machine_id = machine_id
        self._on_refused = on_refused
        self._retry_first_s = retry_first_s
        self._retry_cap_s = retry_cap_s
        self.connected = asyncio.Event()
        self._conn: asyncssh.SSHServerConnection | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        quiet_asyncssh()
        self._task = asyncio.create_task(self._run(), name=f"tunnel {self.machine_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._conn is not None:
            self._conn.close()
            await self._conn.wait_closed()
            self._conn = None
        self.connected.clear()

    async def _run(self) -> None:
        failures = 0
        host, port = self._address
        loop = asyncio.get_running_loop()
        while True:
            # asyncssh dials under `wait_for`, which drops a `stop()` that races a refused
            # handshake; the refusal is then caught below and the loop would dial for ever.
            raise_if_cancelled()
            try:
                self._conn = await asyncssh.connect_reverse(
                    host, port, server_factory=lambda: _AgentServer(self), options=self._options()
                )
            except (OSError, asyncssh.Error) as exc:
                failures += 1
                self._log_failure(exc)
            else:
                up_at = loop.time()
                self.connected.set()
                log.info("tunnel connected", extra={"machine": self.machine_id, "port": port})
                await self._conn.wait_closed()
                # One that closes soon after it opened is failing too (cut as soon as let in).
                failures = 0 if loop.time() - up_at > STABLE_S else failures + 1
                self.connected.clear()
                self._conn = None
                log.warning("tunnel closed; dialing again", extra={"machine": self.machine_id})
            await asyncio.sleep(
                retry_delay(
                    max(failures, 1),
                    first_s=self._retry_first_s,
                    cap_s=self._retry_cap_s,
                    jitter=0.5,
                )
            )

    def _log_failure(self, exc: Exception) -> None:
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            # The hub knows no live enrolment with this key: not enrolled here, or revoked.
            log.warning(
                "tunnel refused by the control plane: this machine's key is not enrolled",
                extra={"machine": self.machine_id},
            )
            if self._on_refused is not None:
                self._on_refused()
        else:
            log.warning(
                "tunnel could not connect; retrying",
                extra={"machine": self.machine_id, "error": exc.__class__.__name__},
            )

    def _options(self) -> asyncssh.SSHServerConnectionOptions:
        # Nothing from ~/.ssh or /etc/ssh: no authorized_keys, config or CA bundle of the host's.
        return asyncssh.SSHServerConnectionOptions(
            config=None,
            server_host_keys=[self._host_key],
            authorized_client_keys=self._hub_keys,
            x509_trusted_certs=None,
            x509_trusted_cert_paths=None,
            gss_host=None,
            password_auth=False,
            kbdint_auth=False,
            agent_forwarding=False,
            x11_forwarding=False,
            allow_scp=False,
            allow_pty=False,
            encryption_algs=CIPHERS,
            keepalive_interval=KEEPALIVE_S,
            keepalive_count_max=3,
            login_timeout=LOGIN_S,
            connect_timeout=CONNECT_S,
        )
