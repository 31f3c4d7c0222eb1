"""Server-sent events are cut into whole events however the bytes arrive, LF or CR LF framed.

llama-cpp-python's server (through sse-starlette) ends lines with CR LF, vLLM and the sim
endpoint with LF; a TCP read may end anywhere, even inside a terminator.
"""

from __future__ import annotations

import pytest

from einsora.gateway.answers import StreamReader
from einsora.gateway.counting import Api
from einsora.gateway.sse import EventSplitter, event_data

EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"alpha"}}]}',
    b'data: {"choices":[{"index":0,"delta":{"content":" bravo"}}]}',
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}',
    b"data: [DONE]",
]


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_events_come_out_whole_and_unchanged_whatever_the_reads(end: bytes, piece: int) -> None:
    framed = [e.replace(b"\n", end) + end + end for e in EVENTS]
    stream = b"".join(framed)
    splitter = EventSplitter()
    out: list[bytes] = []
    for i in range(0, len(stream), piece):
        out.extend(splitter.feed(stream[i : i + piece]))
    assert out == framed
    assert splitter.rest() == b""


def test_the_requested_usage_chunk_is_read_and_dropped_and_the_text_kept() -> None:
    reader = StreamReader(Api.chat, drop_usage=True)
    passed = [e for e in EVENTS if reader.read(e + b"\n\n")]
    assert passed == [EVENTS[0], EVENTS[1], EVENTS[3]]
    assert reader.text() == "alpha bravo"
    assert reader.usage is not None
    assert (reader.usage.prompt_tokens, reader.usage.completion_tokens) == (5, 2)


def test_a_usage_chunk_the_client_asked_for_is_passed() -> None:
    reader = StreamReader(Api.chat, drop_usage=False)
    assert all(reader.read(e + b"\n\n") for e in EVENTS)


def test_multi_line_data_is_joined() -> None:
    assert event_data(b"event: x\ndata: a\ndata:b\n\n") == b"a\nb"
    assert event_data(b": a comment\n\n") is None
