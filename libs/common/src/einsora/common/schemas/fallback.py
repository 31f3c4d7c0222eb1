"""A workload's fallback chain, as it travels in intents (ADR-0022).

`fallback` is an ordered list of opt-in substitutes, each one of `{"class": …}` (another GPU
or CPU class), `{"machine": …}` (one machine; the api adds the machine's region), `{"region":
…}` (the next region's scheduler), `{"model": …}` (an endpoint's: another endpoint the gateway
sends requests to when no replica of this one answers) and `{"replicas": n}` (an endpoint's
replicas beyond the first `n` stop holding up other workloads). The api validates them; the
scheduler walks them (`einsora.scheduler.fallback`). A `Handover` goes with an intent a region
step republishes to the next region, so that region's scheduler carries on where the first
stopped: at which step, after which event (`seq`), since when it waits, and why the steps before
had no room.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from einsora.common.schemas.base import Message
from einsora.common.vocab import WorkloadState

MAX_STEPS = 8
"""The longest chain a workload may have."""
MAX_FALLBACK_AFTER_S = 7 * 24 * 3600.0
"""The longest wait before the next step (INTENTS keeps an intent 7 days)."""


class StepKind(StrEnum):
    """What one fallback step substitutes."""

    class_ = "class"
    machine = "machine"
    region = "region"
    model = "model"
    replicas = "replicas"


_ONE_OF = "exactly one of class, machine, region, model or replicas"


class FallbackStep(BaseModel):
    """One substitute. A machine step also carries the machine's region, which the api fills
    in from its enrolment (a user names only the machine)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    class_name: str | None = Field(default=None, alias="class", min_length=1, max_length=64)
    machine: str | None = Field(default=None, min_length=1, max_length=128)
    region: str | None = Field(default=None, min_length=1, max_length=64)
    model: str | None = Field(default=None, min_length=1, max_length=64)
    replicas: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_substitute(self) -> FallbackStep:
        given = [
            k
            for k, v in (
                ("class", self.class_name),
                ("machine", self.machine),
                ("model", self.model),
                ("replicas", self.replicas),
            )
            if v is not None
        ]
        if self.region is not None and self.machine is None:
            given.append("region")
        if len(given) != 1:
            raise ValueError(f"a step names {_ONE_OF}")
        return self

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {k: v for k, v in dumped.items() if v is not None}

    @property
    def kind(self) -> StepKind:
        if self.class_name is not None:
            return StepKind.class_
        if self.machine is not None:
            return StepKind.machine
        if self.model is not None:
            return StepKind.model
        if self.replicas is not None:
            return StepKind.replicas
        return StepKind.region

    def label(self) -> str:
        """How the timeline names the step: `a100-80gb`, `m-…`, `region office`."""
        kind = self.kind
        if kind is StepKind.class_:
            return str(self.class_name)
        if kind is StepKind.machine:
            return str(self.machine)
        if kind is StepKind.region:
            return f"region {self.region}"
        if kind is StepKind.model:
            return f"model {self.model}"
        return f"fewer replicas ({self.replicas})"


def steps_of(value: object) -> object:
    """Legacy intents listed fallback classes as plain names: each is a class step."""
    if isinstance(value, list):
        return [{"class": v} if isinstance(v, str) else v for v in value]
    return value


class Handover(Message):
    """What a region step passes to the next region's scheduler with the intent.

    The intent's id is derived from the workload and `seq` (`handover_intent_id`), so every
    replay of the hop publishes the same id and the next region applies it once.
    """

    from_region: str
    asked_region: str
    """The region the user asked for: where the chain's first step is."""
    step: int = Field(ge=0)
    """The chain step (0: the class as asked) the next region starts at."""
    seq: int = Field(ge=0)
    """The workload's last event: the next region's events continue after it."""
    since: datetime
    """When the chain started waiting (`fallback_after_s` counts from it)."""
    reached: int = Field(ge=-1)
    """The furthest step tried before (its notes are on the timeline already)."""
    state: WorkloadState = WorkloadState.pending
    """Its state when handed over (pending, queued, or preempted or failed when its chain
    moves it after an eviction)."""
    explained: list[str] = Field(default_factory=list, max_length=MAX_STEPS + 1)
    """Why each step before had no room, for the whole explanation if none has."""


class ModelFallback(Message):
    """`model_fallbacks/<endpoint id>`: the models the gateway sends an endpoint's requests to,
    in order, when no replica of it answers (its `{"model": …}` steps; written by the api)."""

    workload_id: str
    tenant_id: str
    model: str
    """The endpoint's own name: the model clients ask for."""
    fallback: list[str] = Field(max_length=MAX_STEPS)
