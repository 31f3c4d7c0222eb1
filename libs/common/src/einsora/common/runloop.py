"""Running a command's event loop: uvloop where the package that needs speed installed it.

The proxy and Solo depend on uvloop (it roughly halves the proxy's per-request loop overhead);
the agent and the other services do not need it, so `einsora.common` does not depend on it and
falls back to the standard loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
