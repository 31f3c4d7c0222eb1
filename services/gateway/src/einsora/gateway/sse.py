"""Server-sent events, split as they arrive: just enough parsing to pass each event on whole.

An event ends at a blank line. Servers end lines with LF (vLLM, the sim endpoint) or CR LF
(llama-cpp-python, through sse-starlette); both are recognised, and each event is handed on
with its bytes unchanged.
"""

from __future__ import annotations

_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
_DATA = b"data:"


class EventSplitter:
    """Cuts a byte stream into whole SSE events (each with its terminating blank line)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events completed by `chunk`, in order."""
        data = self._buffer + chunk if self._buffer else chunk
        events: list[bytes] = []
        start = 0
        while True:
            end = _event_end(data, start)
            if end < 0:
                break
            events.append(data[start:end])
            start = end
        self._buffer = data[start:]
        return events

    def rest(self) -> bytes:
        """What came after the last whole event (a stream cut mid-event leaves some)."""
        rest, self._buffer = self._buffer, b""
        return rest


def _event_end(data: bytes, start: int) -> int:
    """The index just past the first event terminator at or after `start`, or -1."""
    best = -1
    for end in _ENDS:
        at = data.find(end, start)
        if at >= 0 and (best < 0 or at + len(end) < best):
            best = at + len(end)
    return best


def event_data(event: bytes) -> bytes | None:
    """An event's `data` (its data lines joined by LF), or None when it has none."""
    if _DATA not in event:
        return None
    lines = []
    for line in event.splitlines():
        if line.startswith(_DATA):
            value = line[len(_DATA) :]
            lines.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(lines) if lines else None
