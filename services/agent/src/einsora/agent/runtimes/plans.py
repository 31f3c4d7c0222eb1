"""Launch plans of the model runtimes: the command line, environment and readiness probe of
llama.cpp, vLLM and MLX serving one model file.

Each runtime serves its model under the endpoint's name (the `model` clients send) on
127.0.0.1 and a port the agent chose; the gateway is what clients reach. A spec's `args` go to
the runtime as they are, as separate arguments, never through a shell. These are pure functions
of the spec, so every command line is unit-tested without the runtime installed; `launch` turns
a plan into a process, and the `command` runtime (the user's own server) is built there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from einsora.agent.drivers import devices
from einsora.agent.drivers.base import StartFailed
from einsora.common.schemas import EndpointRuntime, EndpointSpec

HOST = "127.0.0.1"
LLAMACPP_CONTEXT = 2048
"""llama.cpp's context when the spec names none (its server's own default is 2048 too)."""


@dataclass(frozen=True)
class RuntimePlan:
    """What a runtime needs to serve: its argv, what it adds to the workload's environment, and
    the path its readiness probe GETs (answered 200 once the model is loaded)."""

    runtime: EndpointRuntime
    argv: list[str]
    port: int
    readiness_path: str
    env: dict[str, str] = field(default_factory=dict)


def spec_problem(exc: ValidationError, prefix: str = "spec") -> str:
    """Which fields of a spec are wrong and why, named as the user wrote them (`spec.args`),
    without their values (a spec may carry a secret)."""
    problems = "; ".join(
        f"{'.'.join([prefix, *(str(p) for p in e['loc'])])}: {e['msg']}"
        for e in exc.errors(include_input=False, include_url=False)
    )
    return f"the endpoint's spec is not valid: {problems}"


def read_spec(spec: Mapping[str, Any]) -> EndpointSpec:
    """An endpoint workload's `spec`, or StartFailed naming the field that is wrong."""
    try:
        return EndpointSpec.model_validate(spec)
    except ValidationError as exc:
        raise StartFailed(spec_problem(exc)) from exc


def gpu_env(gpus: Sequence[str]) -> dict[str, str]:
    """The workload sees its own GPUs only: none at all when it was given none."""
    return devices.visible_env(gpus)


def llamacpp(
    spec: EndpointSpec, *, model: Path, name: str, port: int, python: str, gpus: Sequence[str]
) -> RuntimePlan:
    """llama-cpp-python's server (`llama_cpp.server`) with the GGUF `model`."""
    argv = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--n_ctx",
        str(spec.context_length or LLAMACPP_CONTEXT),
        *spec.args,
    ]
    return RuntimePlan(EndpointRuntime.llamacpp, argv, port, "/v1/models", gpu_env(gpus))


def vllm(
    spec: EndpointSpec, *, model: Path, name: str, port: int, gpus: Sequence[str]
) -> RuntimePlan:
    """`vllm serve` on the workload's GPUs (StartFailed without any: vLLM needs one)."""
    if not gpus:
        raise StartFailed(
            "the vllm runtime needs an NVIDIA GPU and this endpoint was given none: "
            "ask for a GPU class, or use the llamacpp runtime on CPUs"
        )
    context = ["--max-model-len", str(spec.context_length)] if spec.context_length else []
    argv = [
        "vllm",
        "serve",
        str(model),
        "--served-model-name",
        name,
        "--host",
        HOST,
        "--port",
        str(port),
        *context,
        *spec.args,
    ]
    return RuntimePlan(EndpointRuntime.vllm, argv, port, "/health", gpu_env(gpus))


def mlx(spec: EndpointSpec, *, model: Path, port: int, python: str) -> RuntimePlan:
    """`mlx_lm.server` with the safetensors `model` (Apple Silicon; it has no option to name
    the model it serves)."""
    argv = [
        python,
        "-m",
        "mlx_lm.server",
        "--model",
        str(model),
        "--host",
        HOST,
        "--port",
        str(port),
        *spec.args,
    ]
    return RuntimePlan(EndpointRuntime.mlx, argv, port, "/v1/models")


def runtime_plan(
    spec: EndpointSpec,
    *,
    model: Path,
    name: str,
    port: int,
    python: str,
    gpus: Sequence[str],
) -> RuntimePlan:
    """The plan of a model runtime (not `command`, which `launch` builds)."""
    if spec.runtime is EndpointRuntime.llamacpp:
        return llamacpp(spec, model=model, name=name, port=port, python=python, gpus=gpus)
    if spec.runtime is EndpointRuntime.vllm:
        return vllm(spec, model=model, name=name, port=port, gpus=gpus)
    if spec.runtime is EndpointRuntime.mlx:
        return mlx(spec, model=model, port=port, python=python)
    raise ValueError(f"{spec.runtime.value} is not a model runtime")
