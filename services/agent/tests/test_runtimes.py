"""Endpoint runtimes on the process driver: each runtime's command line, GPU selection and
readiness probe; model files resolved, downloaded over real HTTPS and checked before any runtime
starts (pickles and broken files fail the workload with the check's reason, secrets in a URI
never shown); and which runtimes a machine reports."""

from __future__ import annotations

import importlib
import logging
import pickle
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from ipaddress import ip_network
from pathlib import Path

import gguf
import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from safetensors.numpy import save_file

from einsora.agent import inventory, sim_inventory
from einsora.agent.downloads import DownloadPolicy
from einsora.agent.drivers import StartFailed
from einsora.agent.drivers.launch import WorkloadDirs, endpoint_plan, prepare
from einsora.agent.runtimes import available, models, plans
from einsora.agent.workload_python import WorkloadPython
from einsora.common.catalog import Catalog
from einsora.common.schemas import (
    DesiredWorkload,
    EndpointSpec,
    ObservedPhase,
    Resources,
    Target,
    WorkloadKind,
)
from einsora.testing.agent import ControlPlane, Processes, StartAgent

MODEL = Path("/srv/models/tiny.gguf")
LOOPBACK = DownloadPolicy(allow=(ip_network("127.0.0.0/8"),))
"""The owner of this machine allows downloads from it (the test's origin is on 127.0.0.1)."""
GPUS = ["GPU-1111", "GPU-2222"]


def make_gguf(path: Path) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny")
    writer.add_context_length(2048)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<s>", "</s>", "hello", "world"])
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_safetensors(path: Path) -> Path:
    save_file({"embed": np.zeros((4, 8), dtype=np.float32)}, str(path))
    return path


def a_pickle() -> bytes:
    return pickle.dumps({"weight": [0.0, 1.0]}, protocol=pickle.HIGHEST_PROTOCOL)


def endpoint(
    workload_id: str, spec: dict[str, object], name: str = "", gpus: list[str] | None = None
) -> DesiredWorkload:
    return DesiredWorkload(
        workload_id=workload_id,
        tenant_id="t-test",
        kind=WorkloadKind.endpoint,
        class_name="cpu-1c-2g",
        target=Target.running,
        name=name,
        spec=spec,
        resources=Resources(gpus=gpus or []),
    )


def refusal(error: pytest.ExceptionInfo[StartFailed]) -> str:
    assert error.value.code == "start_failed"
    return error.value.message


# --- command lines ----------------------------------------------------------------------------


def test_llamacpp_serves_the_gguf_under_the_endpoint_name() -> None:
    spec = EndpointSpec(model=str(MODEL), runtime="llamacpp", args=["--n_threads", "2"])
    plan = plans.llamacpp(spec, model=MODEL, name="chat", port=8123, python="/py", gpus=[])
    assert plan.argv == [
        "/py",
        "-m",
        "llama_cpp.server",
        "--model",
        str(MODEL),
        "--model_alias",
        "chat",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--n_ctx",
        "2048",
        "--n_threads",
        "2",
    ]
    assert plan.readiness_path == "/v1/models"
    # No GPU given, none seen (and NVIDIA's toolkit gives what it launches none).
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    sized = plans.llamacpp(
        spec.model_copy(update={"context_length": 8192, "args": []}),
        model=MODEL,
        name="chat",
        port=1,
        python="/py",
        gpus=GPUS[:1],
    )
    assert sized.argv[-2:] == ["--n_ctx", "8192"]
    assert sized.env == {"CUDA_VISIBLE_DEVICES": "GPU-1111", "NVIDIA_VISIBLE_DEVICES": "GPU-1111"}


def test_vllm_runs_on_the_workloads_gpus_only() -> None:
    spec = EndpointSpec(model="/srv/qwen", runtime="vllm", args=["--dtype", "half"])
    plan = plans.vllm(spec, model=Path("/srv/qwen"), name="qwen", port=9000, gpus=GPUS)
    assert plan.argv == [
        "vllm",
        "serve",
        "/srv/qwen",
        "--served-model-name",
        "qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--dtype",
        "half",
    ]
    assert plan.env == {
        "CUDA_VISIBLE_DEVICES": "GPU-1111,GPU-2222",
        "NVIDIA_VISIBLE_DEVICES": "GPU-1111,GPU-2222",
    }
    assert plan.readiness_path == "/health"
    sized = plans.vllm(
        spec.model_copy(update={"context_length": 4096}),
        model=Path("/srv/qwen"),
        name="qwen",
        port=9000,
        gpus=GPUS,
    )
    assert sized.argv[9:] == ["--max-model-len", "4096", "--dtype", "half"]
    with pytest.raises(StartFailed) as error:
        plans.vllm(spec, model=Path("/srv/qwen"), name="qwen", port=9000, gpus=[])
    assert "needs an NVIDIA GPU" in refusal(error)


def test_mlx_serves_the_model_with_mlx_lm() -> None:
    spec = EndpointSpec(model="/srv/mlx-model", runtime="mlx", args=["--log-level", "INFO"])
    plan = plans.mlx(spec, model=Path("/srv/mlx-model"), port=7000, python="/py")
    assert plan.argv == [
        "/py",
        "-m",
        "mlx_lm.server",
        "--model",
        "/srv/mlx-model",
        "--host",
        "127.0.0.1",
        "--port",
        "7000",
        "--log-level",
        "INFO",
    ]
    assert plan.readiness_path == "/v1/models"


def test_args_reach_the_runtime_as_they_are_never_through_a_shell() -> None:
    hostile = ["--chat_format", "x; rm -rf / $(whoami) `id`", "'quoted' \"too\""]
    spec = EndpointSpec(model=str(MODEL), runtime="llamacpp", args=hostile)
    plan = plans.llamacpp(spec, model=MODEL, name="m", port=1, python="/py", gpus=[])
    assert plan.argv[-3:] == hostile


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"runtime": "onnx"}, "spec.runtime"),
        ({"runtime": "llamacpp", "args": "--n_ctx 4"}, "spec.args"),
        ({"replicas": 0}, "spec.replicas"),
        ({"context_length": 3}, "spec.context_length"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(StartFailed) as error:
        plans.read_spec(spec)
    assert field in refusal(error)


def test_the_endpoint_plan_probes_its_runtime_and_names_it(tmp_path: Path) -> None:
    dirs = WorkloadDirs(tmp_path / "workloads" / "w-1")
    dirs.create()
    model = make_gguf(tmp_path / "tiny.gguf")
    workload = endpoint("w-1", {"model": str(model), "runtime": "llamacpp"}, name="chat")
    if not available.has_llamacpp_server():
        with pytest.raises(StartFailed) as error:
            endpoint_plan(workload, dirs, sys.executable, model)
        assert "pip install 'einsora-agent[llamacpp]'" in refusal(error)
        return
    plan = endpoint_plan(workload, dirs, sys.executable, model)
    assert plan.runtime == "llamacpp"
    assert plan.model == model
    assert plan.argv[:3] == [sys.executable, "-m", "llama_cpp.server"]
    assert plan.argv[plan.argv.index("--port") + 1] == str(plan.port)
    assert (plan.probe.path, plan.probe.expect_status, plan.probe.port) == (
        "/v1/models",
        200,
        plan.port,
    )
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""


def test_a_vllm_endpoint_without_a_gpu_is_refused_before_anything_else(tmp_path: Path) -> None:
    dirs = WorkloadDirs(tmp_path / "workloads" / "w-2")
    dirs.create()
    model = make_safetensors(tmp_path / "model.safetensors")
    workload = endpoint("w-2", {"model": str(model), "runtime": "vllm"})
    with pytest.raises(StartFailed) as error:
        endpoint_plan(workload, dirs, sys.executable, model)
    assert "needs an NVIDIA GPU" in refusal(error)
    with_gpu = workload.model_copy(update={"resources": Resources(gpus=GPUS)})
    if available.vllm_installed():
        plan = endpoint_plan(with_gpu, dirs, sys.executable, model)
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "GPU-1111,GPU-2222"
        assert (plan.probe.path, plan.runtime) == ("/health", "vllm")
    else:
        with pytest.raises(StartFailed) as error:
            endpoint_plan(with_gpu, dirs, sys.executable, model)
        assert "vLLM is not installed" in refusal(error)


async def test_a_model_runtime_needs_spec_model(tmp_path: Path) -> None:
    dirs = WorkloadDirs(tmp_path / "workloads" / "w-3")
    dirs.create()
    with pytest.raises(StartFailed) as error:
        await prepare(endpoint("w-3", {"runtime": "llamacpp"}), dirs, sys.executable)
    assert "needs spec.model" in refusal(error)


# --- model files ------------------------------------------------------------------------------


async def test_local_files_and_file_uris_are_checked_and_accepted(tmp_path: Path) -> None:
    gguf_file = make_gguf(tmp_path / "tiny.gguf")
    tensors = make_safetensors(tmp_path / "model.safetensors")
    cache = tmp_path / "cache"
    assert await models.resolve(str(gguf_file), cache) == gguf_file
    assert await models.resolve(f"file://{tensors}", cache) == tensors
    assert not cache.exists()  # nothing was downloaded


async def resolve_refusal(model: str, cache: Path) -> str:
    with pytest.raises(StartFailed) as error:
        await models.resolve(model, cache)
    return refusal(error)


async def test_pickles_and_broken_files_are_refused_with_the_check(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (tmp_path / "model.pkl").write_bytes(a_pickle())
    (tmp_path / "renamed.gguf").write_bytes(a_pickle())
    good = make_safetensors(tmp_path / "good.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(good[:12])
    reason = await resolve_refusal(str(tmp_path / "model.pkl"), cache)
    assert ".pkl files can hold a Python pickle" in reason
    reason = await resolve_refusal(str(tmp_path / "renamed.gguf"), cache)
    assert "is not a GGUF file: it starts with a Python pickle's bytes" in reason
    reason = await resolve_refusal(str(tmp_path / "cut.safetensors"), cache)
    assert "truncated" in reason
    reason = await resolve_refusal(str(tmp_path / "absent.gguf"), cache)
    assert "does not exist" in reason


async def test_relative_paths_and_other_schemes_are_refused_without_their_secrets(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    assert "relative path" in await resolve_refusal("models/tiny.gguf", cache)
    reason = await resolve_refusal("http://alice:hunter2@example.com/m.gguf?sig=s3cr3t", cache)
    assert "http:// is not supported" in reason
    assert "hunter2" not in reason
    assert "s3cr3t" not in reason
    reason = await resolve_refusal("s3://bucket/m.gguf", cache)
    assert "s3:// is not supported" in reason
    reason = await resolve_refusal("file://otherhost/m.gguf", cache)
    assert "another host" in reason


# --- downloads, over real HTTPS ---------------------------------------------------------------


@dataclass
class Origin:
    """A local HTTPS server of model files, and a client context that trusts it."""

    port: int
    trust: ssl.SSLContext
    fetched: dict[str, int]

    def url(self, path: str) -> str:
        return f"https://alice:hunter2@127.0.0.1:{self.port}{path}?sig=s3cr3t"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make the test server's certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest_asyncio.fixture
async def origin(tmp_path: Path, certificate: tuple[Path, Path]) -> AsyncIterator[Origin]:
    cert, key = certificate
    files = {
        "/models/tiny.gguf": make_gguf(tmp_path / "served.gguf").read_bytes(),
        "/models/renamed.gguf": a_pickle(),
    }
    fetched: dict[str, int] = {}

    async def serve(request: web.Request) -> web.StreamResponse:
        fetched[request.path] = fetched.get(request.path, 0) + 1
        if request.path == "/models/cut.gguf":
            response = web.StreamResponse(headers={"Content-Length": "100000"})
            await response.prepare(request)
            await response.write(b"GGUF" + b"\0" * 1000)
            assert request.transport is not None
            request.transport.close()  # the origin dies mid-file
            return response
        if request.path not in files:
            return web.Response(status=404, text="no such model")
        return web.Response(body=files[request.path])

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_side)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Origin(port, ssl.create_default_context(cafile=str(cert)), fetched)
    finally:
        await runner.cleanup()


async def test_an_https_model_is_downloaded_once_checked_and_its_secrets_kept(
    origin: Origin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cache = tmp_path / "agent" / "models"
    uri = origin.url("/models/tiny.gguf")
    path = await models.resolve(uri, cache, policy=LOOPBACK, ssl_context=origin.trust)
    assert path.parent == cache
    assert path.name.endswith("-tiny.gguf")
    assert path.read_bytes() == make_gguf(tmp_path / "again.gguf").read_bytes()
    assert list(cache.iterdir()) == [path]  # no partial file left behind
    again = await models.resolve(uri, cache, policy=LOOPBACK, ssl_context=origin.trust)
    assert again == path
    assert origin.fetched["/models/tiny.gguf"] == 1  # reused, not fetched again
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "downloading" in logged
    for secret in ("hunter2", "s3cr3t"):
        assert secret not in logged
        assert secret not in path.name


async def test_a_download_that_fails_or_is_a_pickle_is_refused_leaving_nothing(
    origin: Origin, tmp_path: Path
) -> None:
    cache = tmp_path / "models"

    async def refused(path: str) -> str:
        with pytest.raises(StartFailed) as error:
            await models.resolve(origin.url(path), cache, policy=LOOPBACK, ssl_context=origin.trust)
        reason = refusal(error)
        assert "hunter2" not in reason
        assert "s3cr3t" not in reason
        return reason

    assert "HTTP 404" in await refused("/models/absent.gguf")
    reason = await refused("/models/cut.gguf")
    assert "broke off" in reason or "stopped after" in reason
    assert list(cache.iterdir()) == []  # the cut download was not kept
    reason = await refused("/models/renamed.gguf")
    assert "it starts with a Python pickle's bytes" in reason
    assert ".bin files can hold a Python pickle" in await refused("/models/pytorch_model.bin")
    assert "/models/pytorch_model.bin" not in origin.fetched  # refused by name, never fetched


async def test_a_server_certificate_that_is_not_trusted_is_refused(
    origin: Origin, tmp_path: Path
) -> None:
    with pytest.raises(StartFailed) as error:
        await models.resolve(origin.url("/models/tiny.gguf"), tmp_path / "models", policy=LOOPBACK)
    assert "TLS" in refusal(error)
    assert "hunter2" not in refusal(error)


# --- through the agent ------------------------------------------------------------------------


async def test_refused_models_fail_the_workload_with_the_check(
    control: ControlPlane, start_agent: StartAgent, tmp_path: Path
) -> None:
    renamed = tmp_path / "renamed.gguf"
    renamed.write_bytes(a_pickle())
    weights = tmp_path / "pytorch_model.bin"
    weights.write_bytes(a_pickle())
    tensors = make_safetensors(tmp_path / "model.safetensors")
    await start_agent(machine_id="m-rt1")
    await control.put_desired(
        "m-rt1",
        1,
        [
            endpoint("w-renamed", {"model": str(renamed), "runtime": "llamacpp"}),
            endpoint("w-bin", {"model": str(weights), "runtime": "vllm"}, gpus=GPUS),
            endpoint("w-nogpu", {"model": str(tensors), "runtime": "vllm"}),
            endpoint("w-bad", {"model": str(tensors), "runtime": "tensorrt"}),
        ],
    )
    state = await control.wait_observed(
        "m-rt1",
        lambda s: (
            len(s.workloads) == 4 and all(w.phase is ObservedPhase.failed for w in s.workloads)
        ),
    )
    reasons = {w.workload_id: w.reason for w in state.workloads}
    assert "is not a GGUF file: it starts with a Python pickle's bytes" in reasons["w-renamed"]
    assert ".bin files can hold a Python pickle" in reasons["w-bin"]
    assert "needs an NVIDIA GPU" in reasons["w-nogpu"]
    assert "spec.runtime" in reasons["w-bad"]


async def test_a_command_endpoint_runs_as_before_and_names_its_runtime(
    control: ControlPlane,
    start_agent: StartAgent,
    processes: Processes,
    workload_python: WorkloadPython,
) -> None:
    await start_agent(machine_id="m-rt2")
    web_server = endpoint("w-cmd", {"command": workload_python.http_server()})
    await control.put_desired("m-rt2", 1, [web_server])
    seen = await control.wait_workload("m-rt2", "w-cmd", lambda w: w.phase is ObservedPhase.running)
    processes.track(seen.pid)
    assert seen.endpoint is not None
    assert seen.endpoint.runtime == "command"


# --- which runtimes a machine reports ---------------------------------------------------------


def test_a_process_machine_reports_what_is_installed() -> None:
    found = inventory.collect("m-inv", "local", ["process"]).runtimes
    assert found[0] == "command"
    assert ("llamacpp" in found) == available.has_llamacpp_server()
    assert ("mlx" in found) == available.has_mlx()
    assert ("vllm" in found) == available.has_vllm()


def test_llamacpp_is_reported_only_with_its_server_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))  # found before any installed llama_cpp
    assert not available.has_llamacpp_server()  # the library alone cannot serve
    (package / "server").mkdir()
    (package / "server" / "__init__.py").write_text("")
    importlib.invalidate_caches()
    extras = all(available.findable(m) for m in available.LLAMACPP_SERVER_NEEDS)
    assert available.has_llamacpp_server() == extras
    for module in available.LLAMACPP_SERVER_NEEDS:
        if not available.findable(module):
            (tmp_path / f"{module}.py").write_text("")
    importlib.invalidate_caches()
    assert available.has_llamacpp_server()
    assert "llamacpp" in available.available_runtimes(["process"])


async def test_sim_machines_report_every_runtime(
    control: ControlPlane, start_agent: StartAgent
) -> None:
    machine = sim_inventory.parse("2x l40s-48gb, 16 cpu", Catalog.load())
    assert machine.inventory("m-x", "local", ["sim"]).runtimes == [
        "llamacpp",
        "vllm",
        "mlx",
        "command",
    ]
    await start_agent(machine_id="m-rt3", driver="sim")
    reported = await control.inventory("m-rt3")
    assert reported is not None
    assert sorted(reported.runtimes) == ["command", "llamacpp", "mlx", "vllm"]
