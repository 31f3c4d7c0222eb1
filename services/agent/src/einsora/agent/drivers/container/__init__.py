"""The `docker` driver: notebooks and endpoints in Docker Engine containers (see `driver`)."""

from einsora.agent.drivers.container.driver import ContainerHandle, DockerDriver, DockerOptions

__all__ = ["ContainerHandle", "DockerDriver", "DockerOptions"]
