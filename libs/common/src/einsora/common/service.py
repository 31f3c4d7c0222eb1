"""The shape every service has, so a command runs one alone and Solo runs them all.

A service is built from `Settings` (and its own options), `start()` returns once it serves,
and `stop()` stops it cleanly and may be called twice. Solo starts them in order and stops
them in reverse; they still talk to each other only over NATS.
"""

from __future__ import annotations

from typing import Protocol


class Service(Protocol):
    """A part of Einsora that Solo or its own command can run."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
