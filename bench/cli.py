"""The `einsora` CLI as a person meets it: whole processes, timed from spawn to exit.

Runs a Solo-like control plane in this process (Solo's own `ControlPlane`: an embedded
nats-server, the api on SQLite, scheduler, accounting, proxy, gateway, and a sim agent whose
one machine holds 1,100 CPUs), then runs the venv's `einsora` script 20 times for each of:
- `einsora --help` (the parser and its imports);
- `einsora launch notebook --class cpu-1c-2g --wait`, until the sim notebook runs (`launch
  --wait` still polls the timeline; it moves to the event stream later);
- `einsora ls` against the api holding 1,000 workloads, all running, once they are.
Median and max of each, in milliseconds. Targets on a 2-core machine (issue 16): `--help` and
`ls` <= 300 ms. Figures, never pass/fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report

from einsora.cli.controlplane import ControlPlane
from einsora.common import logs
from einsora.common.settings import Settings

RUNS = 20
WORKLOADS = 1_000
EINSORA = str(Path(sys.executable).parent / "einsora")
NOTEBOOK_CLASS = "cpu-1c-2g"
SIM_MACHINE = "1100 cpu, 4096 GiB"
"""Room for every workload, so that all 1,000 run and `launch --wait` never queues."""


class Plane:
    """A ControlPlane served on its own thread and event loop, while this thread times CLIs."""

    def __init__(self, data_dir: Path) -> None:
        settings = Settings(
            data_dir=data_dir,
            api_port=0,
            proxy_port=0,
            gateway_port=0,
            nats_port=0,
            tunnel_port=0,
            # The api's rate limits and workload cap, off: 1,000 launches from one token is
            # what they are there to refuse.
            api_requests_per_minute=0,
            api_launches_per_minute=0,
            tenant_max_workloads=0,
        )
        self.plane = ControlPlane(
            settings,
            agent_driver="sim",
            agent_options={"sim_inventory": SIM_MACHINE, "heartbeat_s": 1.0},
        )
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="plane", daemon=True)

    def __enter__(self) -> Plane:
        self._thread.start()
        self._started.wait(120)
        if self._error is not None:
            raise self._error
        if not self._started.is_set():
            raise SystemExit("the control plane did not start within 120 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        try:
            await self.plane.start()
        except BaseException as exc:
            self._error = exc
            self._started.set()
            await self.plane.stop()
            return
        self._started.set()
        await self._stop.wait()
        if self.plane.agent is not None:
            await self.plane.agent.stop_workloads()
        await self.plane.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.plane.api_port}"

    @property
    def token(self) -> str:
        return (self.plane.settings.data_dir / "owner.token").read_text().strip()

    def running(self) -> int:
        return self.plane.running_workloads()


def post_workload(base: str, token: str) -> None:
    body = json.dumps({"kind": "notebook", "class": NOTEBOOK_CLASS}).encode()
    request = urllib.request.Request(  # noqa: S310
        f"{base}/v1/workloads",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310
        if resp.status != 201:
            raise SystemExit(f"POST /v1/workloads answered {resp.status}")


def timed(argv: list[str], env: dict[str, str], what: str) -> list[float]:
    """RUNS wall times (seconds) of `einsora ARGV` as a whole process; each must exit 0."""
    samples = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        done = subprocess.run(
            [EINSORA, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
            check=False,
        )
        samples.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"{what} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return samples


def ms(samples: list[float]) -> tuple[float, float]:
    return round(statistics.median(samples) * 1000, 1), round(max(samples) * 1000, 1)


def until_running(plane: Plane, count: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while plane.running() < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{plane.running()} of {count} workloads running after {within_s} s")
        time.sleep(0.2)


def main() -> None:
    logs.configure("WARNING", "json")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_CONFIG_HOME": f"{tmp}/config", "XDG_DATA_HOME": f"{tmp}/xdg"}
        env.pop("EINSORA_TOKEN", None)
        env.pop("EINSORA_API", None)
        help_s = timed(["--help"], env, "einsora --help")
        with Plane(Path(tmp) / "plane") as plane:
            client_env = {**env, "EINSORA_API": plane.url, "EINSORA_TOKEN": plane.token}
            launch_s = timed(
                ["launch", "notebook", "--class", NOTEBOOK_CLASS, "--wait"],
                client_env,
                "einsora launch --wait",
            )
            with ThreadPoolExecutor(8) as pool:
                seeded = [
                    pool.submit(post_workload, plane.url, plane.token)
                    for _ in range(WORKLOADS - RUNS)
                ]
                for future in seeded:
                    future.result()
            until_running(plane, WORKLOADS, 300)
            ls_s = timed(["ls"], client_env, "einsora ls")

    help_ms, ls_ms, launch_ms = ms(help_s), ms(ls_s), ms(launch_s)
    figures = {
        "help_median_ms": help_ms[0],
        "help_max_ms": help_ms[1],
        "ls_median_ms": ls_ms[0],
        "ls_max_ms": ls_ms[1],
        "ls_workloads": WORKLOADS,
        "launch_wait_median_ms": launch_ms[0],
        "launch_wait_max_ms": launch_ms[1],
        "runs": RUNS,
    }
    report(
        "cli",
        [
            ("einsora --help", f"median {help_ms[0]} ms, max {help_ms[1]} ms (target <= 300)"),
            (
                f"einsora ls ({WORKLOADS:,} workloads)",
                f"median {ls_ms[0]} ms, max {ls_ms[1]} ms (target <= 300)",
            ),
            (
                "einsora launch notebook --wait (sim)",
                f"median {launch_ms[0]} ms, max {launch_ms[1]} ms",
            ),
            ("runs of each, whole processes", str(RUNS)),
        ],
        figures,
    )


if __name__ == "__main__":
    main()
