"""What to run for a workload: its command line, environment, directories and readiness probe.

A notebook is a real Jupyter server on a free port whose token comes from the control plane; it
is handed over in a 0600 file (`JUPYTER_TOKEN_FILE`), never on the command line (visible to every
user in /proc) and never in a log line (Jupyter logs `?token=...` for a token it did not make).
An endpoint runs its runtime (`runtimes.plans`) serving its model, checked first
(`runtimes.models`), or for the `command` runtime `spec.command` serving on `$PORT`. Workloads
get a small environment of their own, not the agent's: the agent's may hold bus credentials.
Every plan, whatever its kind, ends with the variables that tell the workload its booked GPUs
(`devices.visible_env`: none at all when it was booked none); a spec may not set them.

A workload that runs as a user of its own (ADR-0007) has its files in a private directory the
agent does not write into: the plan names the directories and the token file, and `runas`, as
that user, makes them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from einsora.agent.drivers import devices
from einsora.agent.drivers.base import StartFailed
from einsora.agent.drivers.probe import Probe
from einsora.agent.runtimes import available, models, plans
from einsora.common.schemas import DesiredWorkload, EndpointRuntime, WorkloadKind

if TYPE_CHECKING:  # a module that imports the drivers
    from einsora.agent.downloads import DownloadPolicy

PASSED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR")
"""The only variables of the agent's own environment a workload inherits."""


@dataclass(frozen=True)
class WorkloadDirs:
    """A workload's directories: the agent's `<data_dir>/workloads/<id>/`, and its own.

    The agent's (`root`) holds `logs/`, its captured output, and for a workload of its own user
    its uid and the agent's copy of its token (for the probe), all closed to the workload. Its
    own (`own`) holds `home/` (its files, its current directory, Jupyter's root), `jupyter/`
    (Jupyter's runtime, data and config, IPython's dir, the token file) and `tmp/`: `root`
    itself when it runs as the agent's user, else its private directory `private`.
    """

    root: Path
    private: Path | None = None

    @property
    def own(self) -> Path:
        return self.root if self.private is None else self.private

    @property
    def home(self) -> Path:
        return self.own / "home"

    @property
    def tmp(self) -> Path:
        return self.own / "tmp"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def stdout(self) -> Path:
        return self.logs / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.logs / "stderr.log"

    @property
    def jupyter(self) -> Path:
        return self.own / "jupyter"

    @property
    def token_file(self) -> Path:
        """Where the workload reads its token."""
        return self.jupyter / "token"

    @property
    def probe_token_file(self) -> Path:
        """Where the agent's probe reads it: never inside a private directory."""
        return self.token_file if self.private is None else self.root / "token"

    @property
    def launch_file(self) -> Path:
        """What `runas` starts (read, then deleted, by it)."""
        return self.root / "launch.json"

    def create(self) -> None:
        """The agent's directories, and the workload's own when they are the same."""
        self.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        made = (
            (self.root, self.logs)
            if self.private is not None
            else (self.root, self.home, self.logs)
        )
        for path in made:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)


@dataclass(frozen=True)
class LaunchPlan:
    """One process to start: argv, environment, current directory, and how to see it ready."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    port: int
    probe: Probe
    own_dirs: tuple[Path, ...] = field(default=())
    """The workload's own directories, made before it starts (by its own user, if it has one)."""
    token_copy: Path | None = None
    """For a workload of its own user: where its user writes its token before it starts."""
    runtime: str | None = None
    """What serves an endpoint (an `EndpointRuntime` value); None for other workloads."""
    model: Path | None = None
    """The checked model file (or directory) an endpoint's runtime loads."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the workload binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def base_env(
    dirs: WorkloadDirs, workload_id: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The passed part of the agent's environment, its own home and user when the workload
    has a user of its own, then `extra` (the spec's)."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_ENV}
    env.setdefault("PATH", os.defpath)
    if dirs.private is not None:
        env.update(
            {
                "HOME": str(dirs.home),
                "USER": workload_id,
                "LOGNAME": workload_id,
                "TMPDIR": str(dirs.tmp),
            }
        )
    env.update(extra or {})
    return env


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by the agent's user only (no newline added)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _own_dirs(dirs: WorkloadDirs, *more: Path) -> tuple[Path, ...]:
    own = (dirs.home, *more) if dirs.private is None else (dirs.home, dirs.tmp, *more)
    if dirs.private is None:  # the agent's user is the workload's: make them now
        for path in own:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return own


def models_dir(dirs: WorkloadDirs) -> Path:
    """Where the agent keeps downloaded models: `<data_dir>/models/`."""
    return dirs.root.parent.parent / "models"


async def prepare(
    workload: DesiredWorkload,
    dirs: WorkloadDirs,
    python: str,
    downloads: DownloadPolicy | None = None,
) -> LaunchPlan:
    """`plan`, once an endpoint's model is resolved and checked (downloaded if need be, as the
    machine owner's `downloads` policy allows), or StartFailed saying what is wrong."""
    model = None
    if workload.kind is WorkloadKind.endpoint:
        spec = plans.read_spec(workload.spec)
        if spec.runtime is not EndpointRuntime.command:
            if spec.model is None:
                raise StartFailed(
                    f"the {spec.runtime.value} runtime needs spec.model: the path or https URI "
                    "of a .gguf or .safetensors file (or a directory of safetensors)"
                )
            model = await models.resolve(spec.model, models_dir(dirs), policy=downloads)
    return plan(workload, dirs, python, model)


def plan(
    workload: DesiredWorkload, dirs: WorkloadDirs, python: str, model: Path | None = None
) -> LaunchPlan:
    """The launch plan of `workload`, or StartFailed saying what is wrong with its spec.
    `model`: an endpoint's checked model (`prepare` resolves it)."""
    if workload.kind is WorkloadKind.notebook:
        made = notebook_plan(workload, dirs, python)
    elif workload.kind is WorkloadKind.endpoint:
        made = endpoint_plan(workload, dirs, python, model)
    else:
        raise _no_driver_for(workload)
    env = {**made.env, **devices.visible_env(workload.resources.gpus)}
    return dataclasses.replace(made, env=env)


def _no_driver_for(workload: DesiredWorkload) -> StartFailed:
    return StartFailed(
        f"the process driver cannot run a {workload.kind.value} workload; "
        "this machine needs a driver for it (e.g. libvirt for a vm)"
    )


def _spec_env(workload: DesiredWorkload) -> dict[str, str]:
    env = workload.spec.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise StartFailed("spec.env must be an object of strings to strings")
    told = sorted(set(env) & set(devices.VISIBLE))
    if told:
        raise StartFailed(
            f"spec.env may not set {', '.join(told)}: a workload sees the GPUs it was booked, "
            "and the agent says which"
        )
    return dict(env)


def jupyter_server_dir() -> Path | None:
    """Where jupyter-server is installed beside the agent, if it is."""
    spec = importlib.util.find_spec("jupyter_server")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def notebook_plan(workload: DesiredWorkload, dirs: WorkloadDirs, python: str) -> LaunchPlan:
    if not workload.access_token:
        raise StartFailed("a notebook needs its access token from the control plane; none came")
    if importlib.util.find_spec("jupyter_server") is None:
        raise StartFailed(
            "jupyter-server is not installed beside the agent: "
            "pip install 'einsora-agent[notebook]' on this machine"
        )
    jupyter = dirs.jupyter
    own = _own_dirs(dirs, *(jupyter / sub for sub in ("runtime", "data", "config", "ipython")))
    write_secret(dirs.probe_token_file, workload.access_token)  # Jupyter reads it as it is
    port = free_port()
    env = base_env(dirs, workload.workload_id, _spec_env(workload))
    env.update(
        {
            "JUPYTER_TOKEN_FILE": str(dirs.token_file),
            "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
            "JUPYTER_DATA_DIR": str(jupyter / "data"),
            "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "IPYTHONDIR": str(jupyter / "ipython"),
        }
    )
    argv = [
        python,
        "-m",
        "jupyter_server",
        "--no-browser",
        "--allow-root",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={dirs.home}",
    ]
    probe = Probe(
        kind="http",
        port=port,
        path="/api/status",
        expect_status=200,
        token_file=str(dirs.probe_token_file),
    )
    return LaunchPlan(
        argv=argv,
        env=env,
        cwd=dirs.home,
        port=port,
        probe=probe,
        own_dirs=own,
        token_copy=None if dirs.private is None else dirs.token_file,
    )


def endpoint_plan(
    workload: DesiredWorkload, dirs: WorkloadDirs, python: str, model: Path | None = None
) -> LaunchPlan:
    """An endpoint's runtime serving its model, or its `command`."""
    spec = plans.read_spec(workload.spec)
    if spec.runtime is EndpointRuntime.command:
        return command_plan(workload, dirs)
    if model is None:
        raise StartFailed(f"the {spec.runtime.value} runtime needs its model checked first")
    port = free_port()
    runtime = plans.runtime_plan(
        spec,
        model=model,
        name=workload.name or workload.workload_id,
        port=port,
        python=python,
        gpus=workload.resources.gpus,
    )
    _check_installed(spec.runtime)
    env = base_env(dirs, workload.workload_id, _spec_env(workload))
    env.update(runtime.env)
    probe = Probe(kind="http", port=port, path=runtime.readiness_path, expect_status=200)
    return LaunchPlan(
        argv=runtime.argv,
        env=env,
        cwd=dirs.home,
        port=port,
        probe=probe,
        own_dirs=_own_dirs(dirs),
        runtime=spec.runtime.value,
        model=model,
    )


def _check_installed(runtime: EndpointRuntime) -> None:
    """StartFailed saying what to install when this machine lacks `runtime` (the scheduler
    should not have placed it here: the inventory says what is installed)."""
    if runtime is EndpointRuntime.llamacpp and not available.has_llamacpp_server():
        raise StartFailed(
            "llama-cpp-python's server is not installed beside the agent: "
            "pip install 'einsora-agent[llamacpp]' on this machine"
        )
    if runtime is EndpointRuntime.vllm and not available.vllm_installed():
        raise StartFailed("vLLM is not installed on this machine: pip install vllm")
    if runtime is EndpointRuntime.mlx and not available.has_mlx():
        raise StartFailed(
            "the mlx runtime needs a Mac with Apple Silicon and mlx-lm: pip install mlx-lm"
        )


def command_plan(workload: DesiredWorkload, dirs: WorkloadDirs) -> LaunchPlan:
    """The user's own server, `spec.command` with `$PORT` where the port goes."""
    command = workload.spec.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(a, str) and a for a in command)
    ):
        raise StartFailed(
            'an endpoint needs spec.command, a list of strings such as ["python", "-m", '
            '"http.server", "$PORT"]'
        )
    readiness = workload.spec.get("readiness", "http")
    if readiness not in ("http", "tcp"):
        raise StartFailed(f'spec.readiness must be "http" or "tcp", not {readiness!r}')
    path = workload.spec.get("readiness_path", "/")
    if not isinstance(path, str) or not path.startswith("/"):
        raise StartFailed(f'spec.readiness_path must be a path starting with "/", not {path!r}')
    port = free_port()
    argv = [a.replace("${PORT}", str(port)).replace("$PORT", str(port)) for a in command]
    env = base_env(dirs, workload.workload_id, _spec_env(workload))
    env["PORT"] = str(port)
    probe = Probe(kind=readiness, port=port, path=path)
    return LaunchPlan(
        argv=argv,
        env=env,
        cwd=dirs.home,
        port=port,
        probe=probe,
        own_dirs=_own_dirs(dirs),
        runtime=EndpointRuntime.command.value,
    )
