"""Does a workload on a real NVIDIA machine get exactly its own GPU, and nothing without one?

One short, bounded command for a machine with NVIDIA GPUs (ADR-0025): it starts `einsora solo`
with a fresh data dir and free ports, reads the inventory and the offered classes, launches a
probe endpoint on a GPU class, one on `cpu-1c-2g` (and one on a MIG slice where a GPU is in MIG
mode), and reads what each saw: its uid, `CUDA_VISIBLE_DEVICES`, torch's view of CUDA, a timed
4096² float16 matmul and which `/dev/nvidia*` nodes it could open. Then it parks the GPU
workload and checks that its process left the GPU. It only reads the GPU's settings (never
`nvidia-smi -mig/-pm/-r/-c`), removes its workloads and stops Solo whatever happens, and ends
with one JSON object (`findings`: what was wrong; `ok`: none).

    .venv/bin/python bench/gpu_check.py                      # on a GPU machine
    .venv/bin/python bench/gpu_check.py --gpu-inventory tests/fixtures/nvml/h200x3-mig.json

Without `nvidia-smi` or `/dev/nvidia0` it is a dry run on the recorded H200 snapshot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).parent))

from _harness import report

ROOT = Path(__file__).resolve().parents[1]
EINSORA = str(Path(sys.executable).parent / "einsora")
FIXTURE = ROOT / "tests" / "fixtures" / "nvml" / "h200.json"
MARKER = "EINSORA_GPU_CHECK "
T = TypeVar("T")
PROBE = r"""
import errno, glob, http.server, json, os, sys, time
r = {"pid": os.getpid(), "uid": os.getuid(), "errors": {}, "nodes": {},
     "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}}
for p in sorted(glob.glob("/dev/nvidia[0-9]*") + glob.glob("/dev/nvidia-caps/nvidia-cap*")):
    try:
        os.close(os.open(p, os.O_RDONLY)); r["nodes"][p] = "opened"
    except OSError as e:
        r["nodes"][p] = errno.errorcode.get(e.errno, str(e.errno))  # EPERM: its cgroup refused
def step(name, fn):
    try: return fn()
    except BaseException as e: r["errors"][name] = (type(e).__name__ + ": " + str(e))[:300]
def exact():
    a = torch.arange(16, dtype=torch.float16, device="cuda").reshape(4, 4)
    want = [[float(sum((4 * i + k) * (4 * k + j) for k in range(4))) for j in range(4)]
            for i in range(4)]
    return (a @ a).float().cpu().tolist() == want
def matmul():
    n, it = 4096, 10
    a = torch.randn(n, n, dtype=torch.float16, device="cuda")
    b = torch.randn(n, n, dtype=torch.float16, device="cuda")
    for _ in range(3): c = a @ b
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(it): c = a @ b
    torch.cuda.synchronize()
    return round(2 * n ** 3 * it / (time.perf_counter() - t) / 1e12, 1)
torch = step("import_torch", lambda: __import__("torch"))
if torch is not None:
    r["torch"] = torch.__version__
    r["cuda_available"] = step("cuda_available", torch.cuda.is_available)
    r["device_count"] = step("device_count", torch.cuda.device_count)
    if r["cuda_available"]:
        r["device_names"] = step("device_names", lambda: [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
        r["device_uuid"] = step("uuid", lambda: str(torch.cuda.get_device_properties(0).uuid))
        r["exact_ok"] = step("exact", exact)
        r["matmul_fp16_tflops"] = step("matmul", matmul)
print("EINSORA_GPU_CHECK " + json.dumps(r), flush=True)
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.BaseHTTPRequestHandler)
server.serve_forever()
"""


Json = dict[str, Any]


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        return max(0.0, min(cap, self.end - time.monotonic()))


def poll(fn: Callable[[], T | None], seconds: float, step: float = 0.2) -> T | None:
    """`fn()` until it is not None or `seconds` pass (then its last answer)."""
    end = Deadline(seconds)
    while (got := fn()) is None and end.left(1) > 0:
        time.sleep(step)
    return got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def workload_python() -> str:
    """`python3` from PATH, if any user can run it (a workload runs as its own uid under a root
    Solo): not one in /root, nor this virtualenv's (no torch there)."""
    found = shutil.which("python3") or "/usr/bin/python3"
    real = os.path.realpath(found)
    if any(p.startswith(("/root", sys.prefix)) for p in (found, real)):
        return "/usr/bin/python3"
    return found


class Solo:
    """`einsora solo` on a fresh data dir and free ports, and its API."""

    def __init__(self, tmp: Path, inventory: Path | None) -> None:
        self.data, self.log, self.api = tmp / "data", tmp / "solo.log", free_port()
        self.env = {**os.environ, "EINSORA_DATA_DIR": str(self.data)}
        self.env["EINSORA_API_PORT"] = str(self.api)
        for name in ("PROXY", "GATEWAY", "NATS"):
            self.env[f"EINSORA_{name}_PORT"] = str(free_port())
        if inventory is not None:
            self.env["EINSORA_GPU_INVENTORY"] = str(inventory.resolve())
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def start(self, deadline: Deadline) -> float:
        t0 = time.monotonic()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [EINSORA, "solo"], env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        if not poll(lambda: self.ready() or None, deadline.left(90), 0.1):
            raise RuntimeError(f"einsora solo did not become ready: {self.log_tail()}")
        self.token = (self.data / "owner.token").read_text().strip()
        return time.monotonic() - t0

    def ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"einsora solo exited {self.proc.returncode}: {self.log_tail()}")
        try:
            url = f"http://127.0.0.1:{self.api}/readyz"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def call(self, method: str, path: str, body: Json | None = None) -> Any:
        url, data = f"http://127.0.0.1:{self.api}{path}", json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        request = urllib.request.Request(
            url, data=data if body is not None else None, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as resp:  # noqa: S310 (http only)
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path}: {exc.code} {exc.read()[:500]!r}") from None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)  # its group: what it left behind
            self.proc.wait(10)


def launch(solo: Solo, class_name: str, token: str) -> str:
    command = [workload_python(), "-c", PROBE, "$PORT", token]
    spec = {"runtime": "command", "command": command, "readiness": "tcp", "start_timeout_s": 120}
    body = {"kind": "endpoint", "class": class_name, "spec": spec}
    return str(solo.call("POST", "/v1/workloads", body)["id"])


def wait_states(solo: Solo, since: dict[str, float], want: str, seconds: float) -> dict[str, Json]:
    """Each workload's state once all reach `want` (or fail), and seconds from `since`."""
    done: dict[str, Json] = {}

    def step() -> bool | None:
        for wid in set(since) - set(done):
            state = solo.call("GET", f"/v1/workloads/{wid}")["state"]
            if state in (want, "failed", "removed"):
                done[wid] = {"state": state, "s": round(time.monotonic() - since[wid], 2)}
        return True if len(done) == len(since) else None

    poll(step, seconds)
    return {wid: done.get(wid, {"state": "still not " + want, "s": None}) for wid in since}


def read_report(solo: Solo, wid: str, seconds: float) -> Json:
    """The probe's report from the workload's captured stdout (the agent's, root's to read)."""
    logs = solo.data / "workloads" / wid / "logs"

    def step() -> Json | None:
        path = logs / "stdout.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        for line in reversed([ln for ln in lines if ln.startswith(MARKER)]):
            with contextlib.suppress(ValueError):  # a line still being written
                return dict(json.loads(line[len(MARKER) :]))
        return None

    got = poll(step, seconds)
    stderr = logs / "stderr.log"
    tail = stderr.read_text(errors="replace")[-800:] if stderr.exists() else ""
    return got if got is not None else {"no_report": True, "stderr_tail": tail}


def compute_apps() -> list[Json] | None:
    """What `nvidia-smi` says runs on the GPUs (read-only); None without nvidia-smi."""
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split(",") for line in out.stdout.splitlines() if "," in line]
    return [{"pid": int(p), "used_memory_mib": int(m)} for p, m in rows if p.strip().isdigit()]


def leftovers(token: str) -> list[int]:
    """Pids of this run's workload processes (their command line holds `token`)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if token.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
    return pids


def given(note: str) -> list[str]:
    """The uuids a placement note says were given ("given GPU-…, GPU-…"; a slice's in "given
    MIG 1g.18gb slice MIG-… of GPU-…")."""
    part = note.split("given ", 1)[1].split("; ")[0] if "given " in note else ""
    named = [[w for w in it.split() if w.startswith(("GPU-", "MIG-"))] for it in part.split(", ")]
    return [words[0] for words in named if words]


def must_refuse(inv: Json, booked: list[str], nodes: dict[str, str]) -> list[str]:
    """The nodes its device cgroup must refuse (agent/drivers/devices.py): every GPU's
    `/dev/nvidia<N>` but its own, and other slices' MIG capability nodes."""
    mine: set[str] = set()
    theirs: set[str] = set()
    for gpu in inv["gpus"]:
        for number in gpu["device_numbers"]:
            major, minor = number.split(":")
            node = (
                f"/dev/nvidia{minor}" if major == "195" else f"/dev/nvidia-caps/nvidia-cap{minor}"
            )
            (mine if gpu["uuid"] in booked else theirs).add(node)
    gpu_nodes = {p for p in nodes if p[len("/dev/nvidia") :].isdigit()}
    return sorted(p for p in (gpu_nodes | theirs) - mine if p in nodes)


def check(name: str, r: Json, note: str | None, inv: Json, dry: bool) -> list[str]:
    """What is wrong in what one probe saw (`note`: a GPU workload's placement note)."""
    if r.get("no_report"):
        return [f"{name}: no report from its probe: {r.get('stderr_tail', '')[-300:]}"]
    found, env, booked = [], r["env"], given(note or "")
    if note is not None and not booked:
        found.append(f"{name}: its placement note names no GPU: {note!r}")
    want = (",".join(booked), ",".join(booked) or "void")
    if (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"]) != want:
        found.append(f"{name} is told {env}, booked {booked}")
    if note is None and (r.get("cuda_available") or r.get("device_count")):
        found.append(f"{name} sees {r.get('device_count')} CUDA devices")
    if note is not None and not dry:
        got = (r.get("device_count"), r.get("exact_ok"), bool(r.get("matmul_fp16_tflops")))
        if got != (1, True, True):
            found.append(f"{name}: CUDA devices, exact, timed matmul: {got}: {r['errors']}")
    method = (inv["device_confinement"] or {}).get("method")
    let = [p for p in must_refuse(inv, booked, r["nodes"]) if r["nodes"][p] != "EPERM"]
    if method and let:
        found.append(f"{name} could open {let} though device nodes are confined ({method})")
    return found


def inventory_of(solo: Solo) -> Json | None:
    items = solo.call("GET", "/v1/machines")["items"]
    return dict(items[0]["inventory"]) if items and items[0].get("inventory") else None


def offered(solo: Solo) -> list[Json] | None:
    keys = ("name", "automatic", "mig_profile", "free", "accelerator")
    items = solo.call("GET", "/v1/classes?limit=200")["items"]
    listed = [{k: c.get(k) for k in keys} for c in items if c["regions"]]
    return [c for c in listed if c["accelerator"] != "cpu"] or None


def discover(solo: Solo, out: Json, deadline: Deadline) -> tuple[str, str | None]:
    """The inventory and offered GPU classes into `out`; the GPU class and MIG class to use."""
    inv = poll(lambda: inventory_of(solo), deadline.left(30))
    if inv is None:
        raise RuntimeError("no machine reported its inventory")
    keys = ("model", "uuid", "memory_mib", "mig", "mig_profile", "parent_uuid", "mig_mode")
    gpus = [{k: g.get(k) for k in (*keys, "device_numbers")} for g in inv["gpus"]]
    out["inventory"] = {"gpus": gpus, "device_confinement": inv.get("device_confinement")}
    out["classes"] = poll(lambda: offered(solo), deadline.left(20)) or []
    nvidia = [c for c in out["classes"] if c.pop("accelerator") == "nvidia" and c["free"] != 0]
    whole = [c["name"] for c in nvidia if c["mig_profile"] is None]
    slices = [c["name"] for c in nvidia if c["mig_profile"] is not None]
    if not whole + slices:
        raise RuntimeError(f"no NVIDIA class is offered: {out['classes']}")
    gpu_class = (whole + slices)[0]
    if not any(g["mig_mode"] for g in gpus):
        out["mig"] = "not in MIG mode"
    elif not whole or not slices:
        out["mig"] = "the gpu workload is on a slice" if slices else "no MIG class offered"
    return gpu_class, slices[0] if whole and slices else None


def run_workloads(solo: Solo, out: Json, deadline: Deadline, token: str, ids: list[str]) -> None:
    """Launch the probes (their ids into `ids`), read what they saw, park the GPU one."""
    gpu_class, mig_class = discover(solo, out, deadline)
    out["gpu_class"], out["mig_class"] = gpu_class, mig_class
    out["workload_python"] = workload_python()
    runs = {"gpu": gpu_class, "cpu": "cpu-1c-2g", **({"mig": mig_class} if mig_class else {})}
    launched, since = {}, {}
    for name, class_name in runs.items():
        since[wid := launch(solo, class_name, token)] = time.monotonic()
        launched[name] = wid
        ids.append(wid)
    states, inv = wait_states(solo, since, "running", deadline.left(150)), out["inventory"]
    for name, wid in launched.items():
        prefix, state = "" if name == "gpu" else f"{name}_", states[wid]["state"]
        out[f"{prefix}launch_to_running_s"] = states[wid]["s"]
        events = solo.call("GET", f"/v1/workloads/{wid}/events?limit=200")["items"]
        notes = [e["reason"] for e in events if e["state"] == "scheduled"]
        out[f"{prefix}placement_note"] = notes[-1] if notes else ""
        report_s = deadline.left(20 if state == "running" else 2)
        out[f"{name}_workload"] = report = read_report(solo, wid, report_s)
        note = None if name == "cpu" else out[f"{prefix}placement_note"]
        if state != "running":
            reason = events[-1]["reason"] if events else "no timeline"
            out["findings"].append(f"{name} workload is {state}: {reason}")
        if state == "running" or not report.get("no_report"):
            out["findings"] += check(f"{name} workload", report, note, inv, out["dry_run"])
    if states[launched["gpu"]]["state"] == "running":
        park(solo, out, launched["gpu"], deadline)


def park(solo: Solo, out: Json, wid: str, deadline: Deadline) -> None:
    """Park the GPU workload: its process must be gone, from the GPU too."""
    pid = out["gpu_workload"].get("pid")

    def listed(apps: list[Json] | None) -> bool:
        return apps is not None and any(a["pid"] == pid for a in apps)

    out["compute_apps_running"] = before = compute_apps()
    out["gpu_pid_in_compute_apps"] = listed(before) if before is not None else None
    solo.call("POST", f"/v1/workloads/{wid}/park")
    parked = wait_states(solo, {wid: time.monotonic()}, "parked", deadline.left(60))[wid]
    out["park_s"] = parked["s"]
    if parked["state"] != "parked":
        out["findings"].append(f"gpu workload did not park: {parked['state']}")

    def gone() -> bool | None:
        apps = out["compute_apps_parked"] = compute_apps()
        return True if not Path(f"/proc/{pid}").exists() and not listed(apps) else None

    out["gpu_pid_gone_after_park"] = None if pid is None else bool(poll(gone, deadline.left(10)))
    if out["gpu_pid_gone_after_park"] is False:
        out["findings"].append(f"park did not free the GPU: pid {pid} is still there")


def clean_up(solo: Solo, ids: list[str], token: str) -> None:
    """Remove the workloads, stop Solo, and kill whatever of this run is left."""
    for wid in ids:
        with contextlib.suppress(Exception):
            solo.call("DELETE", f"/v1/workloads/{wid}")
    with contextlib.suppress(Exception):
        wait_states(solo, dict.fromkeys(ids, time.monotonic()), "removed", 15)
    solo.stop()
    for pid in leftovers(token):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def rows(out: Json) -> list[tuple[str, str]]:
    inv, gpu, cpu = (out.get(k) or {} for k in ("inventory", "gpu_workload", "cpu_workload"))
    models = [g["model"] + " (MIG mode)" * g["mig_mode"] for g in inv.get("gpus", [])]
    return [
        ("dry run", f"{out['dry_run']} {out.get('dry_run_reason', '')}"),
        ("solo to /readyz", f"{out.get('solo_start_to_ready_s')} s"),
        ("inventory", ", ".join(models) or "no GPUs"),
        ("device confinement", str(inv.get("device_confinement"))),
        ("gpu class, to running", f"{out.get('gpu_class')}, {out.get('launch_to_running_s')} s"),
        ("gpu placement note", str(out.get("placement_note"))),
        ("gpu workload sees", f"{gpu.get('env')}, {gpu.get('device_names')}"),
        (
            "gpu matmul fp16",
            f"{gpu.get('matmul_fp16_tflops')} TFLOP/s, exact {gpu.get('exact_ok')}",
        ),
        ("cpu workload sees", f"{cpu.get('env')}, {cpu.get('device_count')} CUDA devices"),
        ("park", f"{out.get('park_s')} s, pid gone: {out.get('gpu_pid_gone_after_park')}"),
        ("mig", str(out.get("mig") or (out.get("mig_workload") or {}).get("env"))),
        ("findings", "; ".join(out["findings"]) or "none"),
        *([("error", out["error"])] if "error" in out else []),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--gpu-inventory", type=Path, metavar="FILE", help="dry run on a snapshot")
    parser.add_argument("--timeout", type=float, default=240, metavar="S", help="overall deadline")
    args = parser.parse_args()
    t0, deadline, inventory = time.monotonic(), Deadline(args.timeout), args.gpu_inventory
    out: Json = {"dry_run": inventory is not None, "findings": []}
    if inventory is None and not (shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()):
        inventory, out["dry_run"] = FIXTURE, True
        out["dry_run_reason"] = f"no nvidia-smi and no /dev/nvidia0: replaying {FIXTURE.name}"
    out["gpu_inventory"] = str(inventory) if inventory else None
    token = f"einsora-gpu-check-{secrets.token_hex(6)}"
    with tempfile.TemporaryDirectory(
        prefix="einsora-gpu-check-", ignore_cleanup_errors=True
    ) as tmp:
        solo, ids = Solo(Path(tmp), inventory), list[str]()
        try:
            if inventory is not None and not inventory.is_file():
                raise FileNotFoundError(f"no GPU inventory file {inventory}")
            out["solo_start_to_ready_s"] = round(solo.start(deadline), 2)
            run_workloads(solo, out, deadline, token, ids)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            if solo.proc is not None and solo.proc.poll() is not None:
                out["error"] += f" (einsora solo exited {solo.proc.returncode})"
            out["solo_log_tail"] = solo.log_tail()
        finally:
            clean_up(solo, ids, token)
    out["ok"] = not out["findings"] and "error" not in out
    out["total_s"] = round(time.monotonic() - t0, 1)
    report("gpu_check", rows(out), out)
    return 1 if "error" in out and "gpu_workload" not in out else 0


if __name__ == "__main__":
    sys.exit(main())
