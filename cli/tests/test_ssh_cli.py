"""`einsora ssh`: the system's ssh with this command as its ProxyCommand, and a refusal said
plainly when there is no VM to reach (the connection itself is tested with a real VM in
tests/test_vms.py, the engine tier)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from einsora.api.testing import RunningApi, cli_env, einsora
from einsora.cli.commands.ssh import _site, ssh_argv


def test_ssh_runs_with_this_command_as_its_proxy_and_the_vms_own_host_key_alias() -> None:
    args = argparse.Namespace(
        id="w-abc",
        api="https://einsora.example:8443",
        user="debian",
        identity="~/.ssh/id_ed25519",
        options=["ServerAliveInterval=15"],
        command=["--", "uname", "-a"],
    )
    assert ssh_argv(args) == [
        "ssh",
        "-o",
        f"ProxyCommand={sys.executable} -m einsora.common.cli ssh --stdio w-abc "
        "--api https://einsora.example:8443",
        "-o",
        "HostKeyAlias=einsora-w-abc",
        "-o",
        "ServerAliveInterval=15",
        "-i",
        "~/.ssh/id_ed25519",
        "-l",
        "debian",
        "einsora-w-abc",
        "uname",
        "-a",
    ]


def test_a_localhost_site_is_dialed_at_loopback_with_its_own_host_and_origin() -> None:
    assert _site("http://w-abc.localhost:8082/_einsora/enter?ticket=t") == (
        "http://127.0.0.1:8082",
        "w-abc.localhost:8082",
        "http://w-abc.localhost:8082",
    )
    assert _site("https://w-abc.einsora.example/_einsora/enter?ticket=t")[0] == (
        "https://w-abc.einsora.example:443"
    )


async def test_ssh_to_a_workload_that_is_not_there_is_refused_plainly(
    api: RunningApi, tmp_path: Path
) -> None:
    code, out, err = await einsora(cli_env(api, tmp_path), "ssh", "--stdio", "w-nothere")
    assert code == 1
    assert "not found" in err.lower() or "no workload" in err.lower(), err
    assert "request ID:" in err
    assert out == ""
