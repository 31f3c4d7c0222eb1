"""The agent runs each workload with the driver its desired entry names, and fails one whose
driver it does not have, saying which it has (issue 21). A process agent, no engine asked for."""

from __future__ import annotations

from einsora.agent.engines import EngineOptions
from einsora.common.schemas import ObservedPhase, WorkloadKind
from einsora.testing.agent import ControlPlane, StartAgent

NO_ENGINES = EngineOptions(libvirt=False, docker=False)


async def test_a_workload_naming_a_driver_this_machine_lacks_fails_saying_which_it_has(
    start_agent: StartAgent, control: ControlPlane
) -> None:
    await start_agent(machine_id="m-plain", engines=NO_ENGINES)
    inventory = await control.inventory("m-plain")
    assert inventory is not None
    assert inventory.drivers == ["process"]
    assert inventory.engines == []
    vm = ControlPlane.workload(
        "w-vm", kind=WorkloadKind.vm, access_token="a-vm-token", driver="libvirt"
    )
    await control.put_desired("m-plain", 1, [vm])
    failed = await control.wait_workload(
        "m-plain", "w-vm", lambda w: w.phase is ObservedPhase.failed
    )
    assert failed.reason.startswith("this machine has no libvirt driver (it has process)")
