"""A sim endpoint (the product's simulated model) as its own process, for the gateway benchmark.

`python bench/tools/sim_upstream.py PORT MODEL` serves the OpenAI API on 127.0.0.1:PORT until
killed.
"""

from __future__ import annotations

import asyncio
import sys

from einsora.agent.runtimes.sim_server import SimEndpointServer
from einsora.common import runloop


async def main(port: int, model: str) -> None:
    server = SimEndpointServer(model, port=port)
    await server.start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    runloop.run(main(int(sys.argv[1]), sys.argv[2]))
