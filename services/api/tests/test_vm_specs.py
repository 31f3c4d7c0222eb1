"""A VM's spec, and a container spec, are checked at launch: a wrong field is a 422 naming it,
and nothing is stored (issue 21)."""

from __future__ import annotations

from typing import Any

from einsora.api.testing import RunningApi


async def test_a_bad_vm_or_container_spec_is_a_422_naming_the_field(api: RunningApi) -> None:
    vm: list[tuple[dict[str, Any], str]] = [
        ({"image": "/img/a.qcow2", "image_format": "vmdk"}, "spec.image_format"),
        ({"image": "/img/a.qcow2", "vcpus": 0}, "spec.vcpus"),
        ({"image": "/img/a.qcow2", "vcpus": 4}, "spec.vcpus"),  # cpu-1c-2g has one core
        ({"image": "/img/a.qcow2", "memory_mib": 4096}, "spec.memory_mib"),
        ({"image": "/img/a.qcow2", "ssh_key": "ssh-ed25519 AAAA\nssh-rsa BBBB"}, "spec.ssh_key"),
        ({"image": "/img/a.qcow2", "ssh_key": "not a key"}, "spec.ssh_key"),
        ({"image": "/img/a.qcow2", "image_sha256": "abc"}, "spec.image_sha256"),
        ({"image": "/img/a.qcow2", "readiness": "ping"}, "spec.readiness"),
        ({"image": "/img/a.qcow2", "park": "hibernate"}, "spec.park"),
        ({"image": "/img/a.qcow2", "boot": {"initrd": "/i"}}, "spec.boot.kernel"),
        ({"image": ""}, "spec.image"),
    ]
    for spec, field in vm:
        answer = await api.owner.post(
            "/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g", "spec": spec}
        )
        assert answer.status == 422, (spec, answer.body)
        assert answer.body["details"][0]["field"] == field, answer.body
        assert answer.body["request_id"] == answer.request_id
    container = await api.owner.post(
        "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g", "spec": {"image": ""}}
    )
    assert container.status == 422
    assert container.body["details"][0]["field"] == "spec.image"
    assert (await api.owner.get("/v1/workloads")).body["items"] == []

    good = {"image": "/img/a.qcow2", "vcpus": 1, "ssh_key": "ssh-ed25519 AAAA me@host"}
    made = await api.owner.post("/v1/workloads", {"kind": "vm", "class": "cpu-1c-2g", "spec": good})
    assert made.status == 201, made.body
    gpu = await api.owner.post(
        "/v1/workloads", {"kind": "vm", "class": "l40s-48gb", "spec": {**good, "vcpus": 16}}
    )
    assert gpu.status == 201, gpu.body  # a GPU class books devices, not cores
