"""A Python interpreter that the agent's workloads can run (the agent picks it as root).

Under a root agent, workloads run as users of their own (ADR-0007), who cannot run a Python that
lives in a private home (a venv whose interpreter is under /root, say): the agent then refuses
to start them, naming the path. Tests that run real workloads there need one they can run: the
agent's own when they can reach it; else a small wrapper, in a directory open to all, that runs
the system's python3 of the same version with the agent's packages (Jupyter) on PYTHONPATH.
Given as the agent's `python`, it serves notebooks as well as endpoints' commands.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from einsora.agent.drivers import isolation

SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


@dataclass(frozen=True)
class WorkloadPython:
    """A Python that workloads can run."""

    path: str

    def http_server(self) -> list[str]:
        """An endpoint command: Python's own HTTP server on `$PORT`."""
        return [self.path, "-m", "http.server", "$PORT", "--bind", "127.0.0.1"]


def reachable(path: str | Path, *, final: int = isolation.X) -> bool:
    """Whether a workload's own user (the last uid of the range: it owns nothing) may use it."""
    uid = isolation.FIRST_UID + isolation.UID_COUNT - 1
    return isolation.first_blocked(path, uid, uid, final=final) is None


def find(scratch: Path) -> WorkloadPython | str:
    """A Python that this agent's workloads can run, or why there is none. A wrapper, if one
    is needed, is written into `scratch` (a directory that workloads may enter)."""
    if os.geteuid() != 0 or reachable(sys.executable):
        return WorkloadPython(sys.executable)
    packages = sysconfig.get_paths()["purelib"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in SYSTEM_PYTHONS:
        if not (os.path.exists(candidate) and reachable(candidate)):
            continue
        out = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if out.stdout.strip() != version or not reachable(packages, final=isolation.R):
            continue
        wrapper = scratch / f"python{version}"
        # Jupyter finds its data (JupyterLab's built app, extensions, kernel specs) and the
        # config that enables its server extensions under sys.prefix, which is now the
        # system's: point it at the agent's environment.
        data = Path(sys.prefix) / "share" / "jupyter"
        config = Path(sys.prefix) / "etc" / "jupyter"
        jupyter = (
            f"JUPYTER_PATH={shlex.quote(str(data))}\n"
            f"JUPYTERLAB_DIR={shlex.quote(str(data / 'lab'))}\n"
            f"JUPYTER_CONFIG_PATH={shlex.quote(str(config))}\n"
            "export JUPYTER_PATH JUPYTERLAB_DIR JUPYTER_CONFIG_PATH\n"
            if data.is_dir()
            else ""
        )
        wrapper.write_text(
            f"#!/bin/sh\nPYTHONPATH={shlex.quote(packages)}\nexport PYTHONPATH\n{jupyter}"
            f'exec {shlex.quote(candidate)} "$@"\n'
        )
        wrapper.chmod(0o755)
        if reachable(wrapper, final=isolation.R | isolation.X):
            return WorkloadPython(str(wrapper))
        return f"{scratch} cannot be entered by a workload's own user"
    return (
        f"the agent's Python {sys.executable} cannot be run by a workload's own unprivileged "
        f"user, and no system python{version} that can (with {packages} readable) was found"
    )
