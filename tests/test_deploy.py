"""The Lab's compose file and the Datacenter's Helm chart are valid, without a cluster or an engine.

- the chart renders offline (helm-python-sdk: Helm's own Go SDK, no binary) with its default
  values and with an external NATS and Postgres, lints without errors, and every manifest is
  valid against the Kubernetes schemas (kubernetes-validate, strict);
- `docker-compose config` (Debian's v1, no engine needed) accepts the compose file;
- the cluster's node configs are accepted by the real `nats-server -t`, with the auth section
  `einsora bus-config` writes;
- each service's Dockerfile installs that service's package alone (`uv sync --package`).

The official NATS chart, a dependency of ours, cannot be fetched here (its repository is not a
package registry this machine reaches): the chart is rendered without it, and the one lint
finding allowed is that it is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from einsora.common.embedded_nats import nats_server_binary

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "einsora"
COMPOSE = ROOT / "deploy" / "compose"
KUBERNETES = "1.30.0"
SERVICES = ("api", "scheduler", "accounting", "gateway", "proxy")

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is a dev dependency")

EXTERNAL = {
    "nats": {"enabled": False},
    "externalNats": {"url": "nats://nats-0:4222,nats://nats-1:4222,nats://nats-2:4222"},
    "postgres": {"bundled": False, "external": {"existingSecret": "einsora-db"}},
    "workloadTokensKey": "a" * 64,
}


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name="cell", namespace="einsora")
    return [
        doc
        for name, text in rendered.items()
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


@pytest.mark.parametrize("values", [{}, EXTERNAL], ids=["bundled", "external"])
def test_the_chart_renders_and_every_manifest_is_valid_kubernetes(values: dict[str, Any]) -> None:
    manifests = _render(values)
    for manifest in manifests:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    kinds = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    for service in SERVICES:
        assert ("Deployment", f"cell-einsora-{service}") in kinds
        assert ("Service", f"cell-einsora-{service}") in kinds
    assert (("StatefulSet", "cell-einsora-postgres") in kinds) is (values == {})
    (pdb,) = [m for m in manifests if m["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    deployments = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Deployment"}
    assert deployments["cell-einsora-scheduler"]["spec"]["replicas"] == 2  # leader and standby
    for deployment in deployments.values():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            assert container["readinessProbe"]
            assert container["livenessProbe"]
            assert container["resources"]["requests"]["cpu"]
            env = {e["name"]: e for e in container["env"]}
            assert env["EINSORA_NATS_REPLICAS"]["value"] == "3"
            assert "," in env["EINSORA_NATS_URL"]["value"] or values == {}
        seeds = [i["key"] for v in spec["volumes"] if "secret" in v for i in v["secret"]["items"]]
        component = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        assert f"{component}.nk" in seeds  # each service mounts its own identity's seed


def test_the_chart_lints_clean_but_for_the_nats_chart_it_cannot_fetch_here() -> None:
    found = helm.lint(str(CHART))
    assert found["errors"] == []
    serious = [m for m in found["messages"] if m["severity"] >= 2]
    assert [m["error"] for m in serious] == ["chart directory is missing these dependencies: nats"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (nats,) = chart["dependencies"]
    assert nats["name"] == "nats"
    assert nats["repository"] == "https://nats-io.github.io/k8s/helm/charts/"
    assert nats["condition"] == "nats.enabled"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nats"]["config"]["merge"]["jetstream"]["sync_interval"] == "always"
    assert values["nats"]["config"]["cluster"]["replicas"] == 3


def test_the_validator_refuses_what_kubernetes_would() -> None:
    (deployment, *_) = [m for m in _render(EXTERNAL) if m["kind"] == "Deployment"]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


COMPOSE_TOOL = shutil.which("docker-compose")


@pytest.mark.skipif(
    COMPOSE_TOOL is None,
    reason="docker-compose is not installed (Debian's docker-compose; scripts/test-deps.sh "
    "installs it where it can, and CI always has it)",
)
def test_compose_config_accepts_the_lab_cell() -> None:
    assert COMPOSE_TOOL is not None
    env = {**os.environ, "POSTGRES_PASSWORD": "not-a-secret"}
    done = subprocess.run(
        [COMPOSE_TOOL, "-f", "docker-compose.yml", "--profile", "sim", "config"],
        cwd=COMPOSE,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    services = config["services"]
    assert {"nats-1", "nats-2", "nats-3", "postgres", "bus-config", "agent-sim"} <= set(services)
    for name in ("api", "scheduler-a", "scheduler-b", "accounting", "gateway", "proxy"):
        env_of = services[name]["environment"]
        assert env_of["EINSORA_NATS_REPLICAS"] == "3", name
        assert env_of["EINSORA_NATS_URL"].count("nats://") == 3, name
        assert env_of["EINSORA_NATS_CREDENTIALS_DIR"] == "/run/einsora/bus", name
    keys = {
        services[s]["environment"]["EINSORA_SCHEDULER_TOKENS_KEY"]
        for s in ("scheduler-a", "scheduler-b")
    }
    assert len(keys) == 1  # leader and standby derive the same workload tokens
    # Without a password it refuses, naming what to set.
    bare = {k: v for k, v in os.environ.items() if k != "POSTGRES_PASSWORD"}
    refused = subprocess.run(
        [COMPOSE_TOOL, "-f", "docker-compose.yml", "config"],
        cwd=COMPOSE,
        capture_output=True,
        text=True,
        env=bare,
        timeout=120,
        check=False,
    )
    assert refused.returncode != 0
    assert "POSTGRES_PASSWORD" in refused.stderr


def test_the_real_nats_server_accepts_each_nodes_config(tmp_path: Path) -> None:
    bus = tmp_path / "bus"
    made = subprocess.run(
        [
            str(Path(sys.executable).parent / "einsora"),
            "bus-config",
            "--credentials-dir",
            str(bus),
            "--out",
            str(bus / "auth.conf"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    for node in (1, 2, 3):
        text = (COMPOSE / "nats" / f"nats-{node}.conf").read_text()
        assert "sync_interval: always" in text
        assert text.count("nats-route://") == 3
        conf = tmp_path / f"nats-{node}.conf"
        conf.write_text(text.replace("/data", str(tmp_path / f"data-{node}")))
        checked = subprocess.run(
            [str(nats_server_binary()), "-t", "-c", str(conf)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("service", [*SERVICES, "agent"])
def test_each_service_image_installs_its_own_package(service: str) -> None:
    dockerfile = (ROOT / "deploy" / "docker" / f"{service}.Dockerfile").read_text()
    assert f"uv sync --frozen --no-dev --no-editable --package einsora-{service}" in dockerfile
    assert f'ENTRYPOINT ["einsora", "{service}"]' in dockerfile
    assert "USER einsora" in dockerfile
    compose = (COMPOSE / "docker-compose.yml").read_text()
    assert f"deploy/docker/{service}.Dockerfile" in compose
