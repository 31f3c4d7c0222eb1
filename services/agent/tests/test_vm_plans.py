"""The libvirt driver's plain parts, without libvirt: the domain XML (golden, GPUs passed
through), what is read back from a domain, KVM and passthrough judged from sysfs, the NoCloud
seed, and where a VM's image may come from (issue 21)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from einsora.agent import hostvirt
from einsora.agent.drivers.base import StartFailed
from einsora.agent.drivers.vm import images
from einsora.agent.drivers.vm.domain import (
    DomainPlan,
    Forward,
    domain_xml,
    pci_address,
    read_domain,
)
from einsora.agent.drivers.vm.seed import read_seed, write_seed
from einsora.agent.inventory import with_passthrough
from einsora.common.schemas import Gpu, VmSpec

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str, text: str) -> None:
    """Compare with the golden file (EINSORA_UPDATE_GOLDEN=1 writes it instead)."""
    path = GOLDEN / name
    if os.environ.get("EINSORA_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def _plan(**more: object) -> DomainPlan:
    fields: dict[str, object] = {
        "name": "einsora-w-gpu",
        "workload_id": "w-gpu",
        "machine_id": "m-1",
        "vcpus": 8,
        "memory_mib": 65536,
        "kvm": True,
        "disk": "/var/lib/einsora-vms/w-gpu/disk.qcow2",
        "seed": "/var/lib/einsora-vms/w-gpu/seed.iso",
        "forwards": (Forward("ssh", 40022, 22), Forward("http", 40080, 8888)),
        "hostdevs": ("0000:65:00.0", "0000:b3:00.0"),
        "ports": {"ssh": 40022, "http": 40080, "console": 40100},
    }
    fields.update(more)
    return DomainPlan(**fields)  # type: ignore[arg-type]


def test_a_kvm_domain_with_two_gpus_passed_through() -> None:
    _golden("domain_passthrough.xml", domain_xml(_plan()))


def test_a_software_emulated_domain_booting_a_kernel() -> None:
    plan = _plan(
        kvm=False,
        hostdevs=(),
        vcpus=1,
        memory_mib=256,
        kernel="/var/lib/einsora-vms/images/k.boot",
        initrd="/var/lib/einsora-vms/images/i.boot",
        cmdline="console=ttyS0 quiet",
    )
    _golden("domain_tcg_kernel.xml", domain_xml(plan))


def test_a_domain_says_which_workload_and_machine_it_is_and_where_its_console_is() -> None:
    xml = domain_xml(_plan())
    facts = read_domain(xml)
    assert (facts.workload_id, facts.machine_id) == ("w-gpu", "m-1")
    assert facts.ports == {"ssh": 40022, "http": 40080, "console": 40100}
    assert facts.hostdevs == 2
    assert facts.console_pty is None  # defined, not running: libvirt names the pty when it runs
    live = xml.replace('<serial type="pty">', '<serial type="pty"><source path="/dev/pts/7"/>')
    assert read_domain(live).console_pty == "/dev/pts/7"
    assert read_domain("<domain><name>other</name></domain>").workload_id is None


@pytest.mark.parametrize("bad", ["65:00.0", "0000:65:00", "0000:65:20.0", "0000:1ff:00.0", "x"])
def test_a_pci_address_is_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="not a PCI address"):
        pci_address(bad)


def _device(sysfs: Path, address: str, group: int, pci_class: str = "0x030200") -> None:
    device = sysfs / "bus" / "pci" / "devices" / address
    device.mkdir(parents=True)
    (device / "class").write_text(pci_class + "\n")
    groups = sysfs / "kernel" / "iommu_groups" / str(group)
    (groups / "devices").mkdir(parents=True, exist_ok=True)
    os.symlink(groups, device / "iommu_group")
    os.symlink(device, groups / "devices" / address)


def test_kvm_is_real_only_with_kvm_intel_or_kvm_amd(tmp_path: Path) -> None:
    (tmp_path / "module" / "kvm").mkdir(parents=True)
    (tmp_path / "module" / "kvm_pvm").mkdir()  # /dev/kvm exists, but boots no ordinary guest
    assert not hostvirt.available(tmp_path)
    (tmp_path / "module" / "kvm_amd").mkdir()
    assert hostvirt.available(tmp_path)


def test_passthrough_needs_an_iommu_group_of_the_gpus_own_functions(tmp_path: Path) -> None:
    _device(tmp_path, "0000:65:00.0", 30)
    _device(tmp_path, "0000:65:00.1", 30, "0x040300")  # its audio function
    _device(tmp_path, "0000:64:00.0", 30, "0x060400")  # a PCI bridge
    alone = hostvirt.passthrough("0000:65:00.0", tmp_path)
    assert (alone.iommu_group, alone.possible) == (30, True)
    assert "vfio-pci" in alone.note

    _device(tmp_path, "0000:b3:00.0", 41)
    _device(tmp_path, "0000:b4:00.0", 41, "0x010802")  # an NVMe drive in the same group
    shared = hostvirt.passthrough("0000:b3:00.0", tmp_path)
    assert (shared.iommu_group, shared.possible) == (41, False)
    assert shared.note.startswith("IOMMU group 41 also holds 0000:b4:00.0")

    (tmp_path / "bus" / "pci" / "devices" / "0000:c1:00.0").mkdir(parents=True)
    no_iommu = hostvirt.passthrough("0000:c1:00.0", tmp_path)
    assert (no_iommu.iommu_group, no_iommu.possible) == (None, False)
    assert "intel_iommu=on" in no_iommu.note
    assert hostvirt.normal_address("00000000:65:00.0") == "0000:65:00.0"

    gpus = with_passthrough(
        [
            Gpu(index=0, uuid="GPU-a", model="L40S", memory_mib=46068, pci_address="0000:65:00.0"),
            Gpu(index=1, uuid="GPU-b", model="L40S", memory_mib=46068, pci_address="0000:b3:00.0"),
            Gpu(index=2, uuid="GPU-c", model="L40S", memory_mib=46068),
        ],
        tmp_path,
    )
    assert [(g.iommu_group, g.passthrough) for g in gpus] == [
        (30, True),
        (41, False),
        (None, False),
    ]


def test_the_nocloud_seed_carries_the_key_and_the_users_own_data(tmp_path: Path) -> None:
    key = 'ssh-ed25519 AAAAC3Nza me@"laptop"'
    write_seed(tmp_path / "a.iso", workload_id="w-1", hostname="box", ssh_key=key, given=None)
    seed = read_seed(tmp_path / "a.iso")
    assert '"instance-id": "w-1"' in seed["meta-data"]
    assert '"public-keys": [\n  "ssh-ed25519 AAAAC3Nza me@\\"laptop\\""' in seed["meta-data"]
    assert seed["user-data"].startswith("#cloud-config\n")
    assert "ssh_authorized_keys" in seed["user-data"]
    mine = "#cloud-config\npackages: [htop]\n"
    write_seed(tmp_path / "b.iso", workload_id="w-1", hostname="box", ssh_key=None, given=mine)
    assert read_seed(tmp_path / "b.iso")["user-data"] == mine
    assert (tmp_path / "b.iso").stat().st_mode & 0o777 == 0o644


def test_a_local_image_must_lie_in_an_allowed_directory(tmp_path: Path) -> None:
    allowed = tmp_path / "images"
    allowed.mkdir()
    (allowed / "disk.qcow2").write_bytes(b"x")
    assert images.local_path(str(allowed / "disk.qcow2"), "spec.image", (allowed,)) == (
        allowed / "disk.qcow2"
    )
    assert images.local_path(f"file://{allowed}/disk.qcow2", "spec.image", (allowed,)) == (
        allowed / "disk.qcow2"
    )
    outside = tmp_path / "secret"
    outside.write_text("root:x:0:0")
    (allowed / "escape.raw").symlink_to(outside)  # a link out of it is followed, then refused
    for source, says in [
        ("/etc/shadow", "outside the directories this machine's owner allows"),
        (str(allowed / "escape.raw"), "outside the directories this machine's owner allows"),
        ("images/disk.qcow2", "relative path"),
        ("file://elsewhere/disk.qcow2", "a file on another host"),
        (str(allowed / "missing.qcow2"), "no such file"),
    ]:
        with pytest.raises(StartFailed, match=says):
            images.local_path(source, "spec.image", (allowed,))


needs_qemu_img = pytest.mark.skipif(
    shutil.which("qemu-img") is None,
    reason="qemu-img is not installed (Debian's qemu-utils: bash scripts/engine-deps.sh)",
)


@needs_qemu_img
def test_an_image_is_checked_by_qemu_img_before_use(tmp_path: Path) -> None:
    def make(name: str, *args: str) -> Path:
        path = tmp_path / name
        qemu_img = shutil.which("qemu-img") or "qemu-img"
        subprocess.run([qemu_img, "create", "-q", *args, str(path), "16M"], check=True)
        return path

    base = make("base.qcow2", "-f", "qcow2")
    assert images.info(base, None, "spec.image") == ("qcow2", 16 * 1024 * 1024)
    raw = make("disk.raw", "-f", "raw")
    assert images.info(raw, "raw", "spec.image")[0] == "raw"
    layered = make("layered.qcow2", "-f", "qcow2", "-F", "qcow2", "-b", str(base))
    with pytest.raises(StartFailed, match="has a backing file"):
        images.info(layered, None, "spec.image")
    with pytest.raises(StartFailed, match="is a vmdk image; only qcow2 or raw are taken"):
        images.info(make("other.vmdk", "-f", "vmdk"), None, "spec.image")
    # A format named by the spec is forced: a raw image is never probed as something else.
    assert images.info(base, "raw", "spec.image")[0] == "raw"
    imported = images.import_file(base, tmp_path / "vm-images", "qcow2")
    assert imported.parent == tmp_path / "vm-images"
    assert imported.stat().st_mode & 0o777 == 0o644
    assert images.import_file(base, tmp_path / "vm-images", "qcow2") == imported  # once


def test_a_vm_specs_readiness_follows_what_it_serves() -> None:
    assert VmSpec(image="/i").readiness_kind == "ssh"
    assert VmSpec(image="/i", http_port=8080).readiness_kind == "http"
    assert VmSpec(image="/i", http_port=8080, readiness="agent").readiness_kind == "agent"
