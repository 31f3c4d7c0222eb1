"""What a loop that talks to the bus or the store goes on after, and how it says so (issue 35).

Which failures are transient is decided in one place, `transient.is_transient` (with an
`EinsoraError` that says a retry can help, such as `BusUnavailable`: `startup.retryable`). A
loop outlives every one of them, and may outlive some others it names (a refusal by the bus
that it retries anyway, as it always did); what it does not name still ends it, as before: a
loop that swallowed every bug would hide it.

How it says a failure it outlives is the same everywhere: a transient one is "not now", a
WARNING with what it was and no traceback (a NATS node restarting would otherwise fill the log
with them); any other is a fault a person must see, an ERROR with its traceback.

    try:
        await step()
    except Exception as exc:
        if not outlives(exc, nats.errors.Error):
            raise
        log_failure(log, "step failed; retrying", exc)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

from einsora.common.startup import retryable


def outlives(exc: BaseException, *also: type[BaseException]) -> bool:
    """Whether a loop goes on after `exc`: every transient failure, and those of `also` (the
    failures that are not transient but that this loop retries all the same)."""
    return retryable(exc) or isinstance(exc, also)


def log_failure(
    log: logging.Logger, message: str, exc: BaseException, extra: Mapping[str, object] | None = None
) -> None:
    """Say a failure a loop goes on after: a transient one at WARNING with its `repr`, any
    other at ERROR with its traceback."""
    fields = {**(extra or {}), "error": repr(exc)}
    if retryable(exc):
        log.warning(message, extra=fields)
    else:
        log.error(message, extra=fields, exc_info=exc)


@contextlib.contextmanager
def outlived(*also: type[BaseException]) -> Iterator[None]:
    """For a best-effort step (a cleanup, a last word at stop): pass over a failure the loop
    would outlive (`outlives(exc, *also)`); raise any other."""
    try:
        yield
    except Exception as exc:
        if not outlives(exc, *also):
            raise
