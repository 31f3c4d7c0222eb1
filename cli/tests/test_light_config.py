"""The CLI's pydantic-free configuration agrees with `Settings`.

`einsora.cli.config` reads the ports and data dir from `EINSORA_*` itself, so that `einsora ls`
need not import pydantic. If `Settings` changes, these fail until the copy follows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from einsora.cli import config
from einsora.common.errors import ConfigError
from einsora.common.settings import Settings


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"EINSORA_API_PORT": "9090", "EINSORA_GATEWAY_PORT": "9092"},
        {"einsora_api_port": "7070"},  # Settings matches the names in any case
        {"EINSORA_DATA_DIR": "/srv/einsora"},
        {"XDG_DATA_HOME": "/xdg/data"},
    ],
)
def test_ports_and_data_dir_are_read_as_settings_reads_them(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("EINSORA_API_PORT", "EINSORA_GATEWAY_PORT", "EINSORA_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert config.local_port("api_port") == settings.api_port
    assert config.local_port("gateway_port") == settings.gateway_port
    assert config.local_data_dir() == settings.data_dir


def test_a_bad_port_in_the_environment_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EINSORA_API_PORT", "eighty")
    with pytest.raises(ConfigError, match="EINSORA_API_PORT must be a port number"):
        config.local_port("api_port")
