"""What the docker driver asks Docker Engine for, without an engine: the create arguments of a
GPU endpoint and of a notebook (golden), GPUs as NVIDIA DeviceRequests by uuid, ports on
127.0.0.1 only (issue 21)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from einsora.agent.drivers.container import config
from einsora.agent.engines import kata_runtime

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str, value: dict[str, Any]) -> None:
    text = json.dumps(value, indent=2, sort_keys=True, default=list) + "\n"
    path = GOLDEN / name
    if os.environ.get("EINSORA_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_a_gpu_endpoint_gets_device_requests_for_its_own_gpus() -> None:
    plan = config.ContainerPlan(
        workload_id="w-llm",
        machine_id="m-1",
        driver="docker",
        image="vllm/vllm-openai:v0.9",
        port=8000,
        command=["vllm", "serve", "/models/m", "--port", "$PORT"],
        env={"HF_HUB_OFFLINE": "1"},
        gpus=["GPU-5d3c", "GPU-9a1e"],
        cpus=8,
        memory_mib=65536,
    )
    kwargs = config.create_kwargs(plan)
    _golden("container_gpu_endpoint.json", kwargs)
    assert kwargs["device_requests"] == [
        {
            "Driver": "nvidia",
            "Count": 0,
            "DeviceIDs": ["GPU-5d3c", "GPU-9a1e"],
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    assert kwargs["ports"] == {"8000/tcp": ("127.0.0.1", None)}  # never on every address


def test_a_notebook_in_kata_reads_its_token_from_a_read_only_file() -> None:
    plan = config.ContainerPlan(
        workload_id="w-nb",
        machine_id="m-1",
        driver="docker-kata",
        image="jupyter/base-notebook:2024",
        port=8888,
        command=config.notebook_command(8888, "/home/jovyan"),
        volume_path="/home/jovyan",
        token_file="/var/lib/einsora/workloads/w-nb/token",
        runtime="kata",
    )
    kwargs = config.create_kwargs(plan)
    _golden("container_kata_notebook.json", kwargs)
    assert "JUPYTER_TOKEN" not in kwargs["environment"]  # `docker inspect` shows the environment
    assert kwargs["volumes"]["/var/lib/einsora/workloads/w-nb/token"]["mode"] == "ro"
    assert "device_requests" not in kwargs


def test_a_kata_runtime_is_found_by_name() -> None:
    assert kata_runtime(["io.containerd.runc.v2", "runc"]) is None
    assert kata_runtime(["runc", "io.containerd.kata.v2"]) == "io.containerd.kata.v2"


def test_a_container_booked_no_gpu_gets_none_whatever_its_spec_says() -> None:
    # A CUDA image says NVIDIA_VISIBLE_DEVICES=all, and so may a spec: on an engine whose
    # default runtime is NVIDIA's, that would be every GPU of the machine. The agent's word wins.
    plan = config.ContainerPlan(
        workload_id="w-cpu",
        machine_id="m-1",
        driver="docker",
        image="nvidia/cuda:12.4.1-base-ubuntu22.04",
        port=8000,
        command=["python3", "-m", "http.server", "$PORT"],
        env={"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"},
    )
    kwargs = config.create_kwargs(plan)
    assert "device_requests" not in kwargs
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert kwargs["environment"]["CUDA_VISIBLE_DEVICES"] == ""
