"""The one error base of Einsora: a machine-readable code, a message a person can act on, and
whether a retry can help.

HTTP edges turn these into status codes with the request ID; message handlers turn them into
acks (`nak` with a delay when `retryable`, `term` otherwise).
"""

from __future__ import annotations


class EinsoraError(Exception):
    """Base of every error Einsora raises on purpose."""

    code: str = "error"
    retryable: bool = False

    def __init__(self, message: str, *, code: str | None = None, retryable: bool | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable


class BusUnavailable(EinsoraError):
    """NATS cannot be reached (at start-up) or went away for longer than we wait."""

    code = "bus_unavailable"
    retryable = True


class PortInUse(EinsoraError):
    """A port we were asked to listen on is taken by another process."""

    code = "port_in_use"


class ConfigError(EinsoraError):
    """A setting or a declared file is invalid."""

    code = "config_error"
