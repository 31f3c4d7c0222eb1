"""The sentences of the timeline: every reason the scheduler gives, in words a person reads.

A reason says what happened and, when the workload waits, what would change that. Reasons are
built here only, so their wording stays consistent and is easy to review.
"""

from __future__ import annotations

from einsora.common.schemas import Gpu
from einsora.scheduler.capacity import Demand, holds_emptied
from einsora.scheduler.model import Machine, Preemption

MACHINE_LOST = "machine lost"
"""Every failure because a machine stopped reporting starts with these words."""


def _gib(mib: float) -> str:
    return f"{mib / 1024:g} GiB"


def _what(demand: Demand) -> str:
    if demand.gpu:
        return f"{demand.count} {demand.class_name}"
    return (
        f"{demand.cpus:g} cores and {_gib(demand.memory_mib)} ({demand.count} {demand.class_name})"
    )


def placed(machine_id: str, free_before: str, total: str) -> str:
    return f"placed on {machine_id} (best fit: {free_before} of {total} free)"


def devices_given(gpus: list[Gpu]) -> str:
    """Which devices a placement books, named so a person can find them (`nvidia-smi -L`)."""
    named = [
        f"MIG {g.mig_profile} slice {g.uuid} of {g.parent_uuid}" if g.mig else g.uuid for g in gpus
    ]
    return "given " + ", ".join(named)


def devices_unconfined(note: str, gpus: int) -> str:
    """A process workload on a machine that cannot confine device nodes: said, not hidden."""
    held = f"its {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "no GPU"
    return (
        f"only CUDA_VISIBLE_DEVICES keeps it to {held} on this machine, whose device nodes are "
        f"not confined ({note or 'its agent does not say whether they can be'})"
    )


def route_refused(machine_id: str, why: str) -> str:
    """A running workload's agent reported where it answers, and that is not believed."""
    return (
        f"not reachable through the proxy or the gateway: {machine_id}'s agent reported where it "
        f"answers, but {why}, so no route was written"
    )


def placed_on_disk_machine(machine_id: str) -> str:
    return f"placed on {machine_id}, which holds its working directory"


def moved_from_disk_machine(machine_id: str, old_machine_id: str, why: str) -> str:
    return (
        f"placed on {machine_id}; {old_machine_id}, which held its working directory, {why}, "
        f"so it starts with a fresh one and the old one is deleted"
    )


def queued(region: str, demand: Demand, ahead: int) -> str:
    waiting = {0: "none ahead", 1: "1 workload ahead"}.get(ahead, f"{ahead} workloads ahead")
    return (
        f"no machine in region {region} has {_what(demand)} free; {waiting}; it starts as "
        "soon as capacity frees (a workload parks, is removed or fails, or a machine joins)"
    )


def never_fits(region: str, demand: Demand, largest: int) -> str:
    if demand.gpu and largest == 0:
        return (
            f"no machine in region {region} offers {demand.class_name}; it waits until a "
            "machine with that class joins"
        )
    if demand.gpu:
        return (
            f"no machine in region {region} has {demand.count} {demand.class_name} at all "
            f"(the largest has {largest}); it waits until such a machine joins, or launch it "
            f"with a count of at most {largest}"
        )
    return (
        f"no machine in region {region} has {_what(demand)} in total; it waits until a "
        "larger machine joins, or launch it with a smaller class or count"
    )


def quarantined(machines: list[str]) -> str:
    """Only quarantined devices keep the machines that would hold it from holding it; each of
    `machines` names one and how many are quarantined (`filters/health.py`)."""
    shown = "; ".join(machines[:3])
    more = f"; and {len(machines) - 3} more" if len(machines) > 3 else ""
    return (
        f"machines that would hold it have quarantined devices: {shown}{more}; it waits until "
        "an operator clears them, or launch it with a smaller count"
    )


OWNER_LENDS = ": its owner lends "
"""In every note that says a machine would hold a workload but for what its owner lends."""


def lend_too_small(machine: Machine, demand: Demand) -> str | None:
    """`machine` would hold `demand` emptied with all of its inventory, but not within what its
    owner lends (e.g. "m-1: its owner lends 4 of 8 cores"); None when the lend is not why."""
    if holds_emptied(machine, demand) or not holds_emptied(machine, demand, lent=False):
        return None
    if demand.gpu:
        lent = len(machine.lent_gpus_by_class.get(demand.class_name, []))
        total = len(machine.gpus_by_class.get(demand.class_name, []))
        short = [f"{lent} of {total} {demand.class_name}"]
    else:
        short = []
        if machine.lent_cpus < demand.cpus:
            short.append(f"{machine.lent_cpus:g} of {machine.inventory.cpus} cores")
        if machine.lent_memory_mib < demand.memory_mib:
            lent_gib = _gib(machine.lent_memory_mib).removesuffix(" GiB")
            short.append(f"{lent_gib} of {_gib(machine.inventory.memory_mib)} of memory")
    return f"{machine.machine_id}{OWNER_LENDS}{' and '.join(short)}"


def runtime_missing(region: str, demand: Demand) -> str:
    extra = {"llamacpp": " (pip install 'einsora-agent[llamacpp]' there)"}.get(
        demand.runtime or "", ""
    )
    return (
        f"no machine in region {region} with {_what(demand)} can serve the {demand.runtime} "
        f"runtime, so none is fit for it; it waits until one that has it reports{extra}"
    )


def unknown_class(class_name: str) -> str:
    return (
        f"class {class_name} is not in the catalog, so it cannot be placed; launch it again "
        "with a listed class"
    )


def starting(machine_id: str) -> str:
    return f"{machine_id} is starting it"


def running(machine_id: str) -> str:
    return f"running on {machine_id}"


def failed(machine_id: str, why: str) -> str:
    return f"failed on {machine_id}: {why or 'the machine gave no reason'}"


def parking(machine_id: str) -> str:
    return f"parking on {machine_id} as asked; its devices are released once it has stopped"


def parked(machine_id: str | None, how: str = "") -> str:
    """`how`: the agent's words on how it parked it (a VM: "with a managed save …")."""
    if machine_id is None:
        return "parked as asked before it was placed; resume it to queue it again"
    if how:
        return f"parked on {machine_id} {how}; its devices are free"
    return f"parked on {machine_id}; its working directory is kept there and its devices are free"


def removing(machine_id: str) -> str:
    return f"removing from {machine_id} as asked; its working directory is deleted"


def removed(machine_id: str | None) -> str:
    if machine_id is None:
        return "removed as asked"
    return f"removed from {machine_id}; its working directory is deleted"


def removed_while_lost(machine_id: str) -> str:
    return (
        f"removed as asked; {machine_id} is not reporting, so its working directory there is "
        "deleted when the machine returns"
    )


def not_applied(refusal: str) -> str:
    """`refusal`: the lifecycle table's sentence, the words the api's 409 would have said."""
    return f"{refusal}; nothing changed"


def overtaken(action: str, later: str) -> str:
    """An intent delivered after a later one of the same workload (its first delivery was held
    by a scheduler that then stopped): the later one was its owner's last word."""
    return f"{action} not applied: a {later} asked after it was applied first; nothing changed"


def nothing_to_park(state: str) -> str:
    return f"nothing to park: the workload is {state} but holds no place on a machine"


def suspect(machine_id: str, silent_s: float, lost_after_s: float) -> str:
    return (
        f"{machine_id} has not reported for {silent_s:.0f} s; if it stays silent for "
        f"{lost_after_s:.0f} s its workloads fail and their devices are released"
    )


def reports_again(machine_id: str) -> str:
    return f"{machine_id} reports again"


MACHINE_REVOKED = "machine revoked"


def revoked(machine_id: str) -> str:
    return (
        f"{MACHINE_REVOKED}: {machine_id}'s enrolment was revoked, so it is cut off and its "
        "devices are released; resume it to place it on another machine"
    )


def removed_while_revoked(machine_id: str) -> str:
    return f"removed as asked; {machine_id} was revoked, so nothing of it runs there any more"


def lost(machine_id: str, silent_s: float) -> str:
    return (
        f"{MACHINE_LOST}: {machine_id} has not reported for {silent_s:.0f} s; its devices are "
        "released; resume it to place it again"
    )


def machine_back(machine_id: str) -> str:
    return f"{machine_id} is back; it is told to stop what it still runs for this workload"


def failed_while_cut_off(machine_id: str, why: str) -> str:
    """A machine back from being lost says how the workload ended there meanwhile (its agent
    stopped it itself, cut off: ADR-0029)."""
    return (
        f"failed on {machine_id} while it was cut off from the control plane: {why}; resume "
        "it to place it again"
    )


def device_gone(machine_id: str, uuid: str) -> str:
    return (
        f"GPU {uuid} on {machine_id} is quarantined or gone, so the workload using it was "
        "stopped; resume it to place it again"
    )


OWNER_RECLAIMED = "owner reclaimed the machine"
"""Every preemption because the owner reclaimed a machine starts with these words."""
NO_LONGER_SHARED = "the machine is no longer shared with your tenant"
"""Every preemption because a machine was made private or an invitation revoked starts so."""
NO_LONGER_LENT = "the machine's owner no longer lends what it holds"
"""Every preemption because the owner narrowed what it lends starts with these words."""


def preempting(machine_id: str, why: Preemption, at: str) -> str:
    """`at`: when it will be preempted (HH:MM:SS UTC), after the grace and its minimum runtime."""
    if why is Preemption.reclaimed:
        return f"the owner reclaimed {machine_id}; preempted at {at} UTC unless released"
    if why is Preemption.unshared:
        return (
            f"{machine_id} is no longer shared with your tenant; preempted at {at} UTC unless "
            "released"
        )
    return (
        f"{machine_id}'s owner no longer lends what it holds; preempted at {at} UTC unless the "
        "owner lends it again"
    )


def lent_again(machine_id: str) -> str:
    return f"{machine_id}'s owner lends enough again; it is no longer preempted"


def preempted(machine_id: str, why: Preemption) -> str:
    words = {
        Preemption.reclaimed: OWNER_RECLAIMED,
        Preemption.unshared: NO_LONGER_SHARED,
        Preemption.unlent: NO_LONGER_LENT,
    }[why]
    return (
        f"{words} ({machine_id}); it was stopped there and its devices released; resume it to "
        "place it on another machine"
    )


# --- the fallback chain (ADR-0022) ---------------------------------------------------------
# A step's clause names the step and says why it has no room ("l40s-48gb: none free in local
# (3 of 3 in use)"); a note joins it to the step tried next; a queued reason joins them all.


def step_unknown_class(label: str) -> str:
    return f"{label}: not a class of this region's catalog"


def step_over_quota(label: str, refusal: str) -> str:
    """`refusal`: quotas.refusal's sentence; only what is over is kept."""
    return f"{label}: {refusal.partition('; it starts')[0]}"


def step_no_such_machine(label: str, region: str) -> str:
    return f"{label}: not a machine of region {region} that takes work"


def step_machine_away(label: str, how: str) -> str:
    return f"{label}: the machine {how}"


def step_never_fits(label: str, why: str) -> str:
    return f"{label}: {why}"


def step_gpus_busy(label: str, where: str, free: int, total: int, wanted: int) -> str:
    if free == 0:
        return f"{label}: none free {where} ({total} of {total} in use)"
    return f"{label}: {free} of {total} free {where}, {wanted} needed"


def step_cpu_busy(label: str, where: str, what: str) -> str:
    return f"{label}: no machine has {what} free {where}"


def step_behind(label: str, room: str, ahead: int) -> str:
    if ahead == 0:
        return f"{label}: {room}, but none it may use takes it now"
    waiting = "1 workload is" if ahead == 1 else f"{ahead} workloads are"
    return f"{label}: {room}, but {waiting} ahead of it"


def step_region_down(label: str, why: str) -> str:
    """`why`: RegionStatus.why_down's sentence, or that none has reported."""
    return f"{label}: {why}"


def region_never_heard(region: str) -> str:
    return f"no scheduler of region {region} has reported"


def step_fewer_replicas(replica: int, accepted: int) -> str:
    if replica <= accepted:
        return f"fewer replicas ({accepted}): this is replica {replica}, one of those kept"
    enough = "1 is" if accepted == 1 else f"{accepted} are"
    return (
        f"fewer replicas ({accepted}): {enough} enough, so replica {replica} waits without "
        "holding up other workloads, and gives way to them"
    )


def trying(clause: str, label: str) -> str:
    """A note: the step before had no room, so the chain moves on."""
    return f"{clause}; trying {label}"


def handed_over(clause: str | None, region: str) -> str:
    """The note of a region step: the workload is now the next region's."""
    lead = f"{clause}; trying" if clause else "its fallback chain goes on in"
    return f"{lead} region {region}, whose scheduler takes it from here"


def chain_exhausted(clauses: list[str], next_label: str | None, next_at: str | None) -> str:
    """Queued: no step it reached has room. `next_label`/`next_at`: the step its timer
    reaches next, and when (HH:MM:SS UTC)."""
    said = "; ".join(clauses)
    if next_label is not None and next_at is not None:
        return (
            f"no step of its fallback chain has room yet: {said}; it starts on the first of "
            f"these that frees, in this order, and {next_label} is tried too from {next_at} UTC"
        )
    return (
        f"no step of its fallback chain has room: {said}; it starts on the first of these "
        "that frees, in this order"
    )


def placed_as(text: str, machine_id: str, class_name: str, index: int, steps: int) -> str:
    """`text`: the placement sentence ("placed on m-… (best fit …)"); says the class it is
    placed as and which step of its chain that is (0: as asked)."""
    step = "as asked" if index == 0 else f"fallback step {index} of {steps}"
    return text.replace(
        f"placed on {machine_id}", f"placed on {machine_id} as {class_name}, {step}", 1
    )


def evicted_moves(why: str) -> str:
    return f"{why}; it opted in to fallback, so it is placed again by its chain"
