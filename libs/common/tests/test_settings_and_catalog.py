import json
from pathlib import Path

import pytest

from einsora.common.catalog import Accelerator, Catalog
from einsora.common.errors import ConfigError
from einsora.common.settings import Settings


def test_settings_come_from_einsora_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EINSORA_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("EINSORA_NATS_PORT", "4333")
    settings = Settings()
    assert settings.data_dir == tmp_path
    assert settings.effective_nats_url == "nats://127.0.0.1:4333"
    assert settings.effective_database_url == f"sqlite+aiosqlite:///{tmp_path / 'einsora.db'}"


def test_data_dir_defaults_to_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EINSORA_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert Settings().data_dir == tmp_path / "einsora"


def test_default_catalog_has_the_cpu_classes_and_matches_nvml_names() -> None:
    catalog = Catalog.load()
    for name in ("cpu-1c-2g", "cpu-2c-4g", "cpu-4c-16g", "cpu-8c-32g"):
        c = catalog.get(name)
        assert c is not None
        assert c.accelerator is Accelerator.cpu
    l40s = catalog.class_for_gpu("NVIDIA L40S", 46068)
    assert l40s is not None
    assert l40s.name == "l40s-48gb"
    assert catalog.class_for_gpu("NVIDIA L40S", 20000) is None


def test_operator_file_extends_the_catalog(tmp_path: Path) -> None:
    extra = tmp_path / "classes.json"
    extra.write_text(
        json.dumps(
            [
                {
                    "name": "mi300x-192gb",
                    "accelerator": "nvidia",
                    "model": "MI300X",
                    "memory_gib": 192,
                }
            ]
        )
    )
    catalog = Catalog.load(extra)
    assert catalog.get("mi300x-192gb") is not None
    assert catalog.get("cpu-1c-2g") is not None


def test_a_bad_catalog_file_is_a_clear_error(tmp_path: Path) -> None:
    extra = tmp_path / "classes.json"
    extra.write_text(json.dumps([{"name": "Bad Name", "accelerator": "nvidia"}]))
    with pytest.raises(ConfigError, match=r"classes\.json"):
        Catalog.load(extra)
