"""Einsora's shared core, used by every service and by the agent.

It holds what two parts of Einsora must agree on: the message schemas, the names on the bus,
settings, logging and ids. It must never depend on a server library (SQLAlchemy, Starlette,
uvicorn): the agent installs it alone on GPU hosts.
"""

__all__: list[str] = []
