"""Readiness probes: a workload is running once its probe answers.

Kept free of any HTTP library (the agent installs with few dependencies): a TCP connect, or one
HTTP/1.1 GET whose status line is read and judged. The token of a notebook is read from its
token file at probe time and sent in a header, never in a URL or a log line.

A probe's timeout is the time the *workload* had to answer. The agent's own event loop may stall
(a burst of work elsewhere in the process); an answer that arrived meanwhile waits in the socket,
and a plain deadline would expire before the loop got to read it, blaming the workload for the
agent's stall. So the timeout is counted in ticks, and a tick that comes late counts as one tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

PROBE_TIMEOUT_S: Final = 2.0
"""How long a workload has to answer its readiness probe."""
TICK_S: Final = 0.1
"""How often a probe in flight looks at its clock. However late a tick comes (the agent's loop
stalled), it uses up at most `2 * TICK_S` of the probe's timeout."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class Probe:
    """How to tell that a workload serving at `host:port` is ready.

    `kind` is `tcp` (a connection is accepted), `http` (a GET of `path` answers with
    `expect_status`, or with any status below 500 when it is None) or `ssh` (an SSH server
    greets: a forwarded port accepts connections before anything listens behind it, so only
    the greeting tells).
    """

    kind: Literal["tcp", "http", "ssh"]
    port: int
    host: str = "127.0.0.1"
    path: str = "/"
    expect_status: int | None = None
    token_file: str | None = None
    """A file holding a token to send as `Authorization: token …`."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "port": self.port,
            "host": self.host,
            "path": self.path,
            "expect_status": self.expect_status,
            "token_file": self.token_file,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Probe:
        kind = data.get("kind")
        if kind not in ("tcp", "http", "ssh"):
            raise ValueError(f"unknown probe kind {kind!r}")
        return cls(
            kind=kind,
            port=int(data["port"]),
            host=str(data.get("host", "127.0.0.1")),
            path=str(data.get("path", "/")),
            expect_status=None if data.get("expect_status") is None else int(data["expect_status"]),
            token_file=None if data.get("token_file") is None else str(data["token_file"]),
        )


async def check(probe: Probe, limit_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the probe answers within `limit_s` (never raises)."""
    return await failure(probe, limit_s) is None


async def failure(probe: Probe, limit_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the probe answers within `limit_s` of the workload's time, else why not, in
    words (never raises; never names the token)."""
    try:
        return await within(_check(probe), limit_s)
    except TimeoutError:
        return f"no answer on port {probe.port} within {limit_s:g} s"
    except ConnectionRefusedError:
        return f"connection refused on port {probe.port}"
    except asyncio.IncompleteReadError:
        return f"the connection on port {probe.port} closed before an answer"
    except OSError as exc:
        return f"port {probe.port}: {exc.strerror or exc}"
    except ValueError as exc:
        return str(exc)


async def within(work: Awaitable[_T], limit_s: float) -> _T:
    """`work`'s result, or TimeoutError once it used `limit_s` of the loop's responsive time:
    a stall of the loop itself (a tick that came late) counts as one tick only."""
    task = asyncio.ensure_future(work)
    left = limit_s
    last = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=max(min(TICK_S, left), 0.0))
            if done:
                return task.result()
            now = time.monotonic()
            left -= min(now - last, 2 * TICK_S)
            last = now
            if left <= 0:
                raise TimeoutError
    finally:
        task.cancel()  # no-op when done; else its own cleanup (closing the socket) runs next


async def http_status(
    host: str, port: int, path: str, headers: dict[str, str] | None = None
) -> int:
    """The status code of one GET (raises OSError or ValueError when there is no answer)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        status_line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = status_line.decode("latin-1").split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
    return int(parts[1])


def _read_token(path: str) -> str:
    return Path(path).read_text().strip()


async def _check(probe: Probe) -> str | None:
    if probe.kind == "tcp":
        _, writer = await asyncio.open_connection(probe.host, probe.port)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None
    if probe.kind == "ssh":
        reader, writer = await asyncio.open_connection(probe.host, probe.port)
        try:
            greeting = await reader.readline()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if not greeting.startswith(b"SSH-"):
            return f"no SSH server greets on port {probe.port} yet"
        return None
    headers: dict[str, str] = {}
    if probe.token_file is not None:
        headers["Authorization"] = f"token {_read_token(probe.token_file)}"
    status = await http_status(probe.host, probe.port, probe.path, headers)
    if probe.expect_status is not None:
        ok = status == probe.expect_status
        wanted = str(probe.expect_status)
    else:
        ok, wanted = status < 500, "below 500"
    return None if ok else f"GET {probe.path} answered {status}, not {wanted}"
