"""A service told to stop while its NATS server is gone stops cleanly: exit 0, no traceback.

nats-py's close writes what the client still holds to a transport uvloop has closed already;
the agent and the scheduler used to end on that RuntimeError (exit 1, a traceback), which a
supervisor reads as a crash and an operator as a bug.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from einsora.common.bus import connect, provision
from einsora.common.embedded_nats import EmbeddedNats
from einsora.common.testing import subprocess_env

EINSORA = str(Path(sys.executable).parent / "einsora")


def _command(service: str, url: str, tmp: Path) -> list[str]:
    common = ["--nats", url, "--log-format", "json"]
    if service == "agent":
        return [EINSORA, "agent", "--machine-id", "m-stop", "--sim-machines", "20",
                "--data-dir", str(tmp / "agent"), *common]  # fmt: skip
    if service == "scheduler":
        database = f"sqlite+aiosqlite:///{tmp}/scheduler.db"
        return [EINSORA, "scheduler", "--database-url", database, *common]
    database = f"sqlite+aiosqlite:///{tmp}/accounting.db"
    return [EINSORA, "accounting", "--database-url", database, *common]


@pytest.mark.slow
@pytest.mark.parametrize("service", ["agent", "scheduler", "accounting"])
async def test_a_service_stops_cleanly_after_its_nats_server_is_gone(
    service: str, tmp_path: Path
) -> None:
    server = EmbeddedNats(tmp_path / "nats", port=0)
    server.start()
    try:
        nc = await connect(server.url, name="test")
        await provision(nc.jetstream())
        await nc.close()
        log = tmp_path / f"{service}.log"
        proc = _spawn(_command(service, server.url, tmp_path), log)
        try:
            await _until_started(log, proc)
            server.kill()
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, 20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = _text(log)
        assert code == 0, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        server.stop()


def _spawn(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=subprocess_env())


def _text(log: Path) -> str:
    return log.read_text() if log.exists() else ""


async def _until_started(log: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until the service has said it is up (each logs a line with 'ready' or 'started')."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        text = _text(log)
        if 'ready"' in text or "started" in text:
            return
        assert proc.poll() is None, f"exited early: {text[-3000:]}"
        assert loop.time() < deadline, f"did not start: {text[-3000:]}"
        await asyncio.sleep(0.1)
