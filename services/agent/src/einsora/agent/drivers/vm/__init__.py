"""The `libvirt` driver: `vm` workloads as libvirt domains (see `driver`)."""

from einsora.agent.drivers.vm.driver import LibvirtDriver, VmHandle, VmOptions, domain_name

__all__ = ["LibvirtDriver", "VmHandle", "VmOptions", "domain_name"]
