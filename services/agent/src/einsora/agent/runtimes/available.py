"""Which endpoint runtimes this machine can serve, for its inventory (`Inventory.runtimes`).

The scheduler places an endpoint only on a machine that reports its runtime, and says so when
none does. The checks find what is installed without importing it (importing llama.cpp loads
its native library; vLLM takes seconds): `command` runs whatever the user names, so the
process driver always has it; `llamacpp` needs llama-cpp-python with its server extra beside
the agent; `vllm` its executable or module, and an NVIDIA GPU; `mlx` a Mac with Apple Silicon
and `mlx-lm`. The sim driver simulates every runtime.
"""

from __future__ import annotations

import importlib.util
import platform
import shutil
from collections.abc import Sequence
from pathlib import Path

from einsora.agent.nvml import nvidia_gpus
from einsora.common.schemas import EndpointRuntime

ALL = [r.value for r in EndpointRuntime]

LLAMACPP_SERVER_NEEDS = ("uvicorn", "fastapi", "sse_starlette", "pydantic_settings")
"""What `llama-cpp-python[server]` adds; without them `llama_cpp.server` does not start."""


def findable(module: str) -> bool:
    """Whether top-level `module` is installed (never imports it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def has_llamacpp_server() -> bool:
    """llama-cpp-python and its server: the `llama_cpp/server` package is looked for in the
    installed package's directory, as `find_spec("llama_cpp.server")` would import llama_cpp."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    server = any(
        (Path(location) / "server" / "__init__.py").is_file()
        or (Path(location) / "server.py").is_file()
        for location in spec.submodule_search_locations
    )
    return server and all(findable(m) for m in LLAMACPP_SERVER_NEEDS)


def vllm_installed() -> bool:
    """vLLM's `vllm` executable is on PATH, or its module is installed beside the agent."""
    return shutil.which("vllm") is not None or findable("vllm")


def has_vllm(nvidia: int | None = None) -> bool:
    """vLLM is installed and the machine has NVIDIA GPUs (`nvidia`: how many, when known)."""
    if not vllm_installed():
        return False
    return (len(nvidia_gpus()) if nvidia is None else nvidia) > 0


def has_mlx() -> bool:
    """A Mac with Apple Silicon, and mlx-lm installed."""
    return platform.system() == "Darwin" and platform.machine() == "arm64" and findable("mlx_lm")


def available_runtimes(drivers: Sequence[str], nvidia: int | None = None) -> list[str]:
    """The runtimes the agent's `drivers` can serve here, as `EndpointRuntime` values."""
    if "sim" in drivers:
        return list(ALL)
    if "process" not in drivers:
        return []
    found = [EndpointRuntime.command.value]
    if has_llamacpp_server():
        found.append(EndpointRuntime.llamacpp.value)
    if has_vllm(nvidia):
        found.append(EndpointRuntime.vllm.value)
    if has_mlx():
        found.append(EndpointRuntime.mlx.value)
    return found
