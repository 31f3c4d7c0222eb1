"""Stopping Solo ends even when one service's stop hangs: it is left behind, named with where it
waits, and the services started before it still stop (Ctrl-C never hangs on one part)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from einsora.cli import controlplane
from einsora.cli.controlplane import ControlPlane
from einsora.common.settings import Settings


class _Part:
    """A part of the plane that records its stop; `hangs` makes its stop wait for ever."""

    def __init__(self, name: str, *, hangs: bool = False) -> None:
        self.name = name
        self.hangs = hangs
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self.hangs:
            await self._wait_for_ever()
        self.stopped = True

    async def _wait_for_ever(self) -> None:
        await asyncio.Event().wait()


async def test_a_stop_that_hangs_is_left_behind_and_the_rest_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controlplane, "STOP_S", 0.2)
    plane = ControlPlane(Settings(data_dir=tmp_path, nats_port=0, api_port=0))
    first, stuck, last = _Part("first"), _Part("stuck", hangs=True), _Part("last")
    for part in (first, stuck, last):
        await plane._start(part)

    await asyncio.wait_for(plane.stop(), 10)

    assert first.stopped
    assert last.stopped
    assert not stuck.stopped
    (left,) = plane.stuck
    assert left.startswith("stuck, waiting at:")
    assert "_wait_for_ever" in left  # where its stop waits, for whoever reads the failure
