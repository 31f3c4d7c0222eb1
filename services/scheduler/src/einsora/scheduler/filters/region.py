"""Filter 1, region and liveness: is the machine of this region and still enrolled (lasting),
and is it reporting and settled (now)?"""

from __future__ import annotations

from einsora.scheduler.model import Liveness, Machine

QUESTION = "Is the machine of this region, enrolled, reporting and settled?"


def lasting(machine: Machine) -> bool:
    """Whether the machine could ever take work here (its liveness aside: it may come back).
    The book holds only its own region's machines (a machine's region is its enrolment's:
    `machines.py`), so enrolled is the whole question."""
    return not machine.revoked


def now(machine: Machine) -> bool:
    """Whether it takes work now: reporting, and past the generation it settles at."""
    return machine.placeable


def refusal(machine: Machine) -> str:
    """Why it takes no work now, as a phrase after its name."""
    if machine.revoked:
        return "is no longer enrolled"
    if machine.liveness is not Liveness.alive:
        return "is not reporting"
    return "is settling"
