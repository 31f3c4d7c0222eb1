"""What a new user waits for: `einsora solo` from cold to `/readyz`, and a notebook from
`einsora launch notebook --wait` to running.

Each run uses a fresh data dir and free ports (the first start also creates the store, the bus's
streams and the owner). Runs `RUNS` times and prints the median and the worst.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report

EINSORA = str(Path(sys.executable).parent / "einsora")
RUNS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def one_run() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        api_port = free_port()
        env = {
            **os.environ,
            "EINSORA_DATA_DIR": tmp,
            "EINSORA_API_PORT": str(api_port),
            "EINSORA_PROXY_PORT": str(free_port()),
            "EINSORA_GATEWAY_PORT": str(free_port()),
            "EINSORA_NATS_PORT": str(free_port()),
        }
        t0 = time.perf_counter()
        solo = subprocess.Popen(
            [EINSORA, "solo"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            while not ready(api_port):
                if solo.poll() is not None or time.perf_counter() - t0 > 120:
                    raise RuntimeError("einsora solo did not become ready")
                time.sleep(0.01)
            cold_start = time.perf_counter() - t0
            t1 = time.perf_counter()
            launched = subprocess.run(
                [EINSORA, "launch", "notebook", "--class", "cpu-1c-2g", "--wait", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            to_running = time.perf_counter() - t1
            if launched.returncode != 0:
                raise RuntimeError(f"launch failed: {launched.stderr}")
            workload = json.loads(launched.stdout)
            subprocess.run(
                [EINSORA, "rm", workload["id"]],
                env=env,
                capture_output=True,
                timeout=60,
                check=False,
            )
        finally:
            solo.send_signal(signal.SIGTERM)
            solo.wait(30)
        return cold_start, to_running


def main() -> None:
    starts, launches = [], []
    for _ in range(RUNS):
        cold, launch = one_run()
        starts.append(cold)
        launches.append(launch)
    figures = {
        "cold_start_median_s": round(statistics.median(starts), 2),
        "cold_start_max_s": round(max(starts), 2),
        "launch_wait_notebook_median_s": round(statistics.median(launches), 2),
        "launch_wait_notebook_max_s": round(max(launches), 2),
    }
    report(
        "solo",
        [
            (
                "`einsora solo` to /readyz (fresh data dir)",
                f"median {figures['cold_start_median_s']} s, worst {figures['cold_start_max_s']} s",
            ),
            (
                "`launch notebook --wait` to running",
                f"median {figures['launch_wait_notebook_median_s']} s, "
                f"worst {figures['launch_wait_notebook_max_s']} s",
            ),
        ],
        figures,
    )


if __name__ == "__main__":
    main()
