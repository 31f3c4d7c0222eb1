"""`einsora --help`, `einsora ls` and each service's `--help` load no server stack.

Each case runs the real entry point (`einsora.common.cli.main`) in a fresh interpreter and
reads `sys.modules` after it: the parser is built from every installed package's commands, so
one heavy import at the top of any `register` module (or of its package's `__init__`) shows
here. This checks what is imported, not how long it takes.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from einsora.common.testing import subprocess_env

SERVER_MODULES = (
    "sqlalchemy",
    "alembic",
    "uvicorn",
    "starlette",
    "fastapi",
    "asyncssh",
    "aiohttp",  # the client speaks urllib; aiohttp (client or server) belongs to services
    "nats",
    # Not a server, but 0.3 s of imports on its own: the CLI's parser and client do without.
    "pydantic",
    "pydantic_settings",
)

PROBE = """
import json, sys
from einsora.common import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as exc:  # --help exits through argparse
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded_by(argv: list[str], tmp_path: Path) -> tuple[int, set[str]]:
    """Run `einsora ARGV` in a fresh interpreter; its exit code and every module it loaded."""
    env = subprocess_env(
        XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data")
    )
    env.pop("EINSORA_API", None)
    env.pop("EINSORA_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    last = done.stdout.strip().splitlines()[-1]
    result = json.loads(last)
    return result["code"], set(result["modules"])


def servers_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in SERVER_MODULES)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_help_lists_every_command_and_loads_no_server(tmp_path: Path) -> None:
    code, modules = loaded_by(["--help"], tmp_path)
    assert code == 0
    assert servers_in(modules) == []
    # The parser was really built from the installed packages' commands.
    assert {"einsora.api.command", "einsora.cli.solo", "einsora.cli.commands"} <= modules


def test_ls_reaches_for_the_api_without_loading_a_server(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    code, modules = loaded_by(["ls", "--api", url], tmp_path)
    assert code == 3  # it ran through the client and found no api there
    assert "einsora.cli.client" in modules
    assert servers_in(modules) == []


@pytest.mark.parametrize(
    ("command", "server"),
    [
        *((name, f"einsora.{name}.service") for name in ("api", "scheduler", "accounting")),
        *((name, f"einsora.{name}.service") for name in ("agent", "proxy", "gateway")),
        ("solo", "einsora.cli.controlplane"),
    ],
)
def test_a_service_commands_help_loads_not_its_server(
    command: str, server: str, tmp_path: Path
) -> None:
    code, modules = loaded_by([command, "--help"], tmp_path)
    assert code == 0
    assert servers_in(modules) == []
    assert server not in modules


def test_python_dash_m_of_a_package_still_runs_its_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "einsora.accounting", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: einsora accounting" in done.stdout
    assert "--log-format" in done.stdout
