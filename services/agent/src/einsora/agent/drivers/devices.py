"""Holding a process workload to the GPUs it was booked: its environment, and its device nodes.

Every workload is told its GPUs by uuid (`CUDA_VISIBLE_DEVICES`, and `NVIDIA_VISIBLE_DEVICES`
for what it launches in turn); a workload booked none is told none. Telling is not holding: a
process may unset the variable and open another workload's `/dev/nvidia<N>`. So where the
agent runs as root on Linux, each workload on a machine with NVIDIA GPUs also gets a cgroup of
its own whose device rules let it open only its own GPUs' nodes (and a MIG slice's capability
nodes), besides the driver's shared ones (`nvidiactl`, `nvidia-uvm`): a cgroup v2 device program
(eBPF, as runc and crun attach one), else the cgroup v1 device controller. `runas` joins the
cgroup while still root, so the workload and everything it starts are inside from their first
instruction, and an unprivileged process cannot leave it.

`probe` says, once, which of the two this machine offers; the inventory reports it and the
placement note repeats it, so nothing claims a confinement that is not there. Standard library
only: the program is ten instructions plus two per device, assembled here.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from einsora.agent.nvml import NVIDIA_MAJOR
from einsora.common.schemas import Confinement, DeviceConfinement, Gpu

log = logging.getLogger("einsora.agent")

VISIBLE = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
"""The variables that tell a workload its GPUs; a spec may not set them."""
NO_DEVICES = "void"
"""`NVIDIA_VISIBLE_DEVICES` for no GPU: NVIDIA's container toolkit gives a container started
with it none (an empty value would give a CUDA image all of them)."""
GPU_MINORS = 254
"""`/dev/nvidia0` to `/dev/nvidia253` are GPUs; 254 is `nvidia-modeset`, 255 `nvidiactl`."""
GROUP = "einsora-workloads"
"""The cgroup, under the agent's own, that holds one cgroup per confined workload."""

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
_DEV_CHAR = 2


def visible_env(gpus: Sequence[str]) -> dict[str, str]:
    """The environment that tells a workload its GPUs: exactly these, or none at all."""
    joined = ",".join(gpus)
    return {"CUDA_VISIBLE_DEVICES": joined, "NVIDIA_VISIBLE_DEVICES": joined or NO_DEVICES}


def _numbers(values: Iterable[str]) -> set[tuple[int, int]]:
    found = set()
    for value in values:
        major, _, minor = value.partition(":")
        if major.isdigit() and minor.isdigit():
            found.add((int(major), int(minor)))
    return found


@dataclass(frozen=True)
class DeviceRules:
    """Which device nodes a workload may open: its own GPUs' (`allowed`), never another GPU's
    (`denied`; every NVIDIA GPU minor not allowed is denied too), anything else as before."""

    allowed: frozenset[tuple[int, int]] = frozenset()
    denied: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def of(cls, gpus: Sequence[Gpu], booked: Sequence[str]) -> DeviceRules:
        mine = set(booked)
        allowed = set().union(*(_numbers(g.device_numbers) for g in gpus if g.uuid in mine))
        others = set().union(*(_numbers(g.device_numbers) for g in gpus if g.uuid not in mine))
        return cls(frozenset(allowed), frozenset(others - allowed))

    @property
    def gpu_minors_allowed(self) -> list[int]:
        return sorted(m for major, m in self.allowed if major == NVIDIA_MAJOR and m < GPU_MINORS)

    @property
    def denied_elsewhere(self) -> list[tuple[int, int]]:
        """Denied nodes the blanket rule on NVIDIA GPU minors does not cover (MIG caps)."""
        return sorted(
            (major, m) for major, m in self.denied if not (major == NVIDIA_MAJOR and m < GPU_MINORS)
        )

    def v1_denials(self) -> list[str]:
        """The cgroup v1 `devices.deny` lines (v1 has no ranges: one line a node)."""
        allowed = set(self.gpu_minors_allowed)
        lines = [f"c {NVIDIA_MAJOR}:{m} rwm" for m in range(GPU_MINORS) if m not in allowed]
        lines += [f"c {major}:{m} rwm" for major, m in self.denied_elsewhere]
        return lines


# --- the cgroup v2 device program --------------------------------------------------------


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(rules: DeviceRules) -> bytes:
    """The BPF_PROG_TYPE_CGROUP_DEVICE program of `rules`: 1 lets an access through, 0 denies
    it. Its context is (access << 16 | type, major, minor), three 32-bit words."""
    # Instructions as (opcode, dst, src, label or offset, imm); labels resolved at the end.
    ldx_w, and_k, jne_k, jeq_k, jgt_k, ja, mov_k, exit_ = (
        0x61, 0x54, 0x55, 0x15, 0x25, 0x05, 0xB7, 0x95,
    )  # fmt: skip
    code: list[tuple[int, int, int, str | int, int]] = [
        (ldx_w, 2, 1, 0, 0),  # r2 = type and access
        (and_k, 2, 0, 0, 0xFFFF),  # r2 = type
        (ldx_w, 3, 1, 4, 0),  # r3 = major
        (ldx_w, 4, 1, 8, 0),  # r4 = minor
        (jne_k, 2, 0, "allow", _DEV_CHAR),
        (jne_k, 3, 0, "other", NVIDIA_MAJOR),
        (jgt_k, 4, 0, "allow", GPU_MINORS - 1),
        *((jeq_k, 4, 0, "allow", m) for m in rules.gpu_minors_allowed),
        (ja, 0, 0, "deny", 0),
    ]
    labels = {"other": len(code)}
    for major, minor in rules.denied_elsewhere:
        at = len(code)
        code += [
            (jne_k, 3, 0, at + 3 - (at + 1), major),
            (jne_k, 4, 0, at + 3 - (at + 2), minor),
            (ja, 0, 0, "deny", 0),
        ]
    labels["allow"] = len(code)
    code += [(mov_k, 0, 0, 0, 1), (exit_, 0, 0, 0, 0)]
    labels["deny"] = len(code)
    code += [(mov_k, 0, 0, 0, 0), (exit_, 0, 0, 0, 0)]
    out = []
    for pc, (op, dst, src, target, imm) in enumerate(code):
        off = labels[target] - (pc + 1) if isinstance(target, str) else target
        out.append(_insn(op, dst, src, off, imm))
    return b"".join(out)


class _Bpf:
    """The two bpf(2) calls this needs, through libc."""

    def __init__(self) -> None:
        number = _SYS_BPF.get(platform.machine())
        if number is None:
            raise OSError(errno.ENOSYS, f"bpf(2) is not known on {platform.machine()}")
        self.number = number
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _call(self, command: int, attr: bytes) -> int:
        buffer = ctypes.create_string_buffer(attr.ljust(128, b"\0"), 128)
        result = int(self.libc.syscall(self.number, command, buffer, 128))
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return result

    def load(self, code: bytes) -> int:
        """A loaded device program's fd."""
        insns = ctypes.create_string_buffer(code, len(code))
        license_ = ctypes.create_string_buffer(b"GPL")
        attr = struct.pack(
            "<IIQQ",
            _BPF_PROG_TYPE_CGROUP_DEVICE,
            len(code) // 8,
            ctypes.addressof(insns),
            ctypes.addressof(license_),
        )
        return self._call(_BPF_PROG_LOAD, attr)

    def attach(self, cgroup: Path, program_fd: int) -> None:
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attr = struct.pack("<IIII", fd, program_fd, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI)
            self._call(_BPF_PROG_ATTACH, attr)
        finally:
            os.close(fd)


# --- where the hierarchies are --------------------------------------------------------------


def _mounts(mounts: Path) -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of each cgroup mount."""
    found: list[tuple[str, str, set[str]]] = []
    try:
        text = mounts.read_text()
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[1], parts[2], set(parts[3].split(","))))
    return found


def _own(cgroup_file: Path) -> dict[str, str]:
    """This process's cgroup path by hierarchy: `""` for v2, `devices` for v1's."""
    own: dict[str, str] = {}
    try:
        text = cgroup_file.read_text()
    except OSError:
        return own
    for line in text.splitlines():
        _id, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":
            own[""] = path
        for name in controllers.split(","):
            own.setdefault(name, path)
    return own


@dataclass
class Confiner:
    """Makes, fills and removes workloads' device cgroups, by the method `probe` found."""

    method: Confinement | None = None
    note: str = ""
    parent: Path | None = None
    """The cgroup that holds the workloads' own (`<the agent's cgroup>/einsora-workloads`)."""
    _bpf: _Bpf | None = field(default=None, repr=False)

    @property
    def report(self) -> DeviceConfinement:
        return DeviceConfinement(method=self.method, note=self.note)

    @classmethod
    def probe(
        cls,
        *,
        mounts: Path = Path("/proc/self/mounts"),
        cgroup_file: Path = Path("/proc/self/cgroup"),
    ) -> Confiner:
        """What this machine offers, tried for real once (a cgroup made, a program attached
        or a rule written, then removed): cgroup v2 where it works, else v1, else neither and
        why."""
        found, tried = cls.working(mounts=mounts, cgroup_file=cgroup_file)
        if found:
            return found[0]
        if platform.system() != "Linux":
            return cls(note=f"device nodes are confined on Linux only, not {platform.system()}")
        if os.geteuid() != 0:
            return cls(
                note="the agent does not run as root, so its workloads run as its own user and "
                "their device nodes are not confined"
            )
        if not tried:
            tried.append("no cgroup v2 hierarchy and no cgroup v1 device controller is mounted")
        return cls(note="device nodes cannot be confined here (" + "; ".join(tried) + ")")

    @classmethod
    def working(
        cls,
        *,
        mounts: Path = Path("/proc/self/mounts"),
        cgroup_file: Path = Path("/proc/self/cgroup"),
    ) -> tuple[list[Confiner], list[str]]:
        """Every method that works here, v2 first, and why each other one did not."""
        if platform.system() != "Linux" or os.geteuid() != 0:
            return [], []
        own = _own(cgroup_file)
        found: list[Confiner] = []
        tried: list[str] = []
        for point, kind, options in _mounts(mounts):
            if kind == "cgroup2" and "" in own:
                what = f"cgroup v2 at {point}"
                try:
                    candidate = cls(Confinement.cgroup2, parent=Path(point + own[""]) / GROUP)
                    candidate._bpf = _Bpf()
                except OSError as exc:
                    tried.append(f"{what}: {exc.strerror or exc}")
                    continue
            elif kind == "cgroup" and "devices" in options and "devices" in own:
                what = f"cgroup v1 devices at {point}"
                candidate = cls(Confinement.cgroup1, parent=Path(point + own["devices"]) / GROUP)
            else:
                continue
            why = candidate.tried()
            if why is None:
                found.append(candidate)
            else:
                tried.append(f"{what}: {why}")
        found.sort(key=lambda c: c.method is not Confinement.cgroup2)
        return found, tried

    def tried(self) -> str | None:
        """Confine a probe cgroup for real, then remove it: None when that worked, else why."""
        try:
            cgroup = self.confine(f"probe-{os.getpid()}", DeviceRules())
        except OSError as exc:
            return exc.strerror or str(exc)
        if cgroup is not None:
            self.release(cgroup)
        return None

    def confine(self, workload_id: str, rules: DeviceRules) -> Path | None:
        """A fresh cgroup for `workload_id` holding `rules`: its path (its `cgroup.procs` is
        what the workload's first process joins), None when this machine cannot confine.
        Raises OSError when it can but this time could not."""
        if self.method is None or self.parent is None:
            return None
        cgroup = self.parent / workload_id
        self.release(cgroup)  # a cgroup left from an earlier run starts again, empty
        cgroup.mkdir(parents=True)
        try:
            if self.method is Confinement.cgroup2:
                assert self._bpf is not None
                fd = self._bpf.load(program(rules))
                try:
                    self._bpf.attach(cgroup, fd)
                finally:
                    os.close(fd)
            else:
                deny = cgroup / "devices.deny"
                for line in rules.v1_denials():
                    deny.write_text(line)
        except OSError:
            self.release(cgroup)
            raise
        return cgroup

    @staticmethod
    def holds(cgroup: Path, pid: int) -> bool:
        """Whether process `pid` is in `cgroup` (an adopted workload is still confined)."""
        try:
            return str(pid) in (cgroup / "cgroup.procs").read_text().split()
        except OSError:
            return False

    @staticmethod
    def release(cgroup: Path) -> None:
        """Remove a workload's cgroup once its processes are gone (they were stopped first);
        one still busy is left, and said in the log."""
        try:
            cgroup.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning(
                "a workload's device cgroup could not be removed",
                extra={"cgroup": str(cgroup), "error": exc.strerror or str(exc)},
            )


def has_nvidia_nodes(dev: Path = Path("/dev")) -> bool:
    """Whether this host has GPU device nodes (`/dev/nvidia0` …), whatever NVML said."""
    return any(dev.glob("nvidia[0-9]*"))
