"""HTTP routes, one FastAPI `APIRouter` per noun; `ROUTERS` in the order requests try them.

The launch and list routes come first: a request tries the routes in turn until one matches.
"""

from __future__ import annotations

from fastapi import APIRouter

from einsora.api.routers import (
    access,
    activity,
    catalog,
    events,
    export,
    gateway_keys,
    health,
    limits,
    machine_sharing,
    machines,
    quotas,
    sessions,
    tenants,
    tokens,
    usage,
    workloads,
)

ROUTERS: tuple[APIRouter, ...] = (
    workloads.router,
    export.router,
    events.router,
    access.router,
    catalog.router,
    machines.router,
    machine_sharing.router,
    tenants.router,
    limits.router,
    quotas.router,
    usage.router,
    activity.router,
    tokens.router,
    sessions.router,
    gateway_keys.router,
    health.router,
)
