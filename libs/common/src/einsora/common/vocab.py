"""The words of the domain that are plain enums: what a user launches, a workload's states,
what serves an endpoint.

Kept apart from the message schemas, which import pydantic: the CLI's parser needs these words
and `einsora --help` must not pay 0.3 s for pydantic. `einsora.common.schemas` re-exports them.
"""

from __future__ import annotations

from enum import StrEnum


class WorkloadKind(StrEnum):
    """What a user launches."""

    notebook = "notebook"
    endpoint = "endpoint"
    vm = "vm"


class WorkloadState(StrEnum):
    """Where a workload is in its life."""

    pending = "pending"
    queued = "queued"
    scheduled = "scheduled"
    starting = "starting"
    running = "running"
    parking = "parking"
    parked = "parked"
    removing = "removing"
    removed = "removed"
    failed = "failed"
    preempted = "preempted"
    """Stopped because its machine's owner took the machine back (reclaimed it, or no longer
    shares it with the workload's tenant); a resume places it again elsewhere."""


class EndpointRuntime(StrEnum):
    """What serves an endpoint's model (DESIGN.md, "Workloads")."""

    llamacpp = "llamacpp"
    """llama.cpp through `llama-cpp-python[server]`: GGUF files, any machine."""
    vllm = "vllm"
    """vLLM: NVIDIA GPUs, safetensors (or GGUF) weights."""
    mlx = "mlx"
    """`mlx-lm`'s server: Apple Silicon."""
    command = "command"
    """Any OpenAI-compatible server the user names, listening on `$PORT`."""
