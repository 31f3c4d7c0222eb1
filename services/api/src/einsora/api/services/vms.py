"""The spec of a VM, and of a notebook or endpoint that names a container image, checked at
launch: a field that is wrong is a 422 naming it, before anything is stored.

A VM's spec without `image` is accepted, as an endpoint without a model is: only the `sim`
driver runs it (a real machine fails it, saying it needs `spec.image`). A VM may not ask for more
cores or memory than its CPU class books (GPU classes book devices, not cores: they leave
`vcpus` and `memory_mib` to the spec). The image itself is checked by the agent that runs it,
where the file is.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from einsora.api.errors import field_error
from einsora.common.catalog import Accelerator, MachineClass
from einsora.common.schemas import ContainerSpec, VmSpec


def _first_problem(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors(include_input=False, include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    return (f"spec.{where}" if where else "spec"), str(first["msg"])


def _validated(model: type[BaseModel], spec: dict[str, Any]) -> Any:
    try:
        return model.model_validate(spec)
    except ValidationError as exc:
        raise field_error(*_first_problem(exc)) from exc


def check_vm_spec(spec: dict[str, Any], machine_class: MachineClass | None) -> VmSpec:
    """The VM's spec, or a 422 naming the field that is wrong (or the class: a VM is given
    whole GPUs by passthrough, and a MIG slice cannot be passed through)."""
    if machine_class is not None and machine_class.mig_profile is not None:
        raise field_error(
            "class",
            f"{machine_class.name} is a MIG slice, and a VM is given whole GPUs only (by VFIO "
            "passthrough): choose a class of whole GPUs, or run a notebook or endpoint",
        )
    vm: VmSpec = _validated(VmSpec, spec)
    if machine_class is not None and machine_class.accelerator is Accelerator.cpu:
        if vm.vcpus is not None and vm.vcpus > machine_class.cpus:
            raise field_error(
                "spec.vcpus",
                f"at most the {machine_class.cpus:g} cores of class {machine_class.name}",
            )
        if vm.memory_mib is not None and vm.memory_mib > machine_class.memory_mib:
            raise field_error(
                "spec.memory_mib",
                f"at most the {machine_class.memory_mib} MiB of class {machine_class.name}",
            )
    return vm


def check_container_spec(spec: dict[str, Any]) -> ContainerSpec | None:
    """A notebook's or endpoint's container fields when its spec names an `image`, or a 422."""
    if "image" not in spec:
        return None
    container: ContainerSpec = _validated(ContainerSpec, spec)
    return container
