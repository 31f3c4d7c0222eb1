"""Which log format a service writes, and what a human line holds.

A terminal here is a real pseudo-terminal (`os.openpty`), so `isatty()` answers as it does
for a person's shell; anything else (a file, a pipe, a journal) gets JSON lines.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
from collections.abc import Iterator
from typing import TextIO

import pytest

from einsora.common import logs
from einsora.common.errors import ConfigError
from einsora.common.settings import Settings

HUMAN_LINE = re.compile(r"^\d\d:\d\d:\d\d (?P<level>\S+) +(?P<logger>\S+) (?P<rest>.*)$")


@pytest.fixture
def terminal() -> Iterator[tuple[TextIO, int]]:
    """A text stream on a pty's terminal side, and the pty's reading side."""
    reader, side = os.openpty()
    stream = open(side, "w", buffering=1, encoding="utf-8")  # noqa: SIM115
    try:
        yield stream, reader
    finally:
        stream.close()
        os.close(reader)


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def read_terminal(reader: int) -> list[str]:
    return os.read(reader, 65536).decode().replace("\r\n", "\n").splitlines()


def test_a_terminal_gets_human_lines_with_the_bound_fields(terminal: tuple[TextIO, int]) -> None:
    stream, reader = terminal
    assert logs.configure("INFO", "auto", stream) == "human"
    with logs.bind(request_id="req-1", tenant="t-1"):
        logging.getLogger("einsora.api").info("workload created", extra={"workload": "w-1"})
    (line,) = read_terminal(reader)
    match = HUMAN_LINE.match(line)
    assert match is not None, line
    assert match["level"] == "INFO"
    assert match["logger"] == "einsora.api"
    assert match["rest"] == "workload created request_id=req-1 tenant=t-1 workload=w-1"


def test_anything_but_a_terminal_gets_json_lines() -> None:
    out = io.StringIO()
    assert logs.configure("INFO", "auto", out) == "json"
    with logs.bind(request_id="req-2"):
        logging.getLogger("einsora.scheduler").warning("queue full", extra={"depth": 3})
    entry = json.loads(out.getvalue())
    assert entry["level"] == "warning"
    assert entry["logger"] == "einsora.scheduler"
    assert entry["message"] == "queue full"
    assert entry["request_id"] == "req-2"
    assert entry["depth"] == 3


def test_a_named_format_wins_over_the_stream(terminal: tuple[TextIO, int]) -> None:
    stream, reader = terminal
    assert logs.configure("INFO", "json", stream) == "json"
    logging.getLogger("einsora.x").info("to a collector")
    (line,) = read_terminal(reader)
    assert json.loads(line)["message"] == "to a collector"
    out = io.StringIO()
    assert logs.configure("INFO", "human", out) == "human"
    assert logs.configure("INFO", "text", out) == "human"  # the older name still works


def test_values_a_person_could_misread_are_quoted_or_escaped() -> None:
    out = io.StringIO()
    logs.configure("INFO", "human", out)
    logging.getLogger("einsora.x").info(
        "named\nforged line",
        extra={"workload_name": "my notebook", "empty": "", "eq": "a=b", "bell": "x\x07"},
    )
    (line,) = out.getvalue().splitlines()
    assert line.endswith(
        'named\\x0aforged line workload_name="my notebook" empty="" eq="a=b" bell=x\\x07'
    ), line


def test_the_level_filters_and_a_traceback_follows_its_line() -> None:
    out = io.StringIO()
    logs.configure("warning", "human", out)
    log = logging.getLogger("einsora.x")
    log.info("hidden")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("it failed")
    text = out.getvalue()
    assert "hidden" not in text
    first, *rest = text.splitlines()
    assert HUMAN_LINE.match(first) is not None
    assert first.endswith("einsora.x it failed")
    assert rest[0].startswith("Traceback")
    assert rest[-1] == "RuntimeError: boom"


@pytest.mark.parametrize(("level", "fmt"), [("loud", "json"), ("INFO", "xml")])
def test_a_bad_level_or_format_is_a_config_error_naming_it(level: str, fmt: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown log (level|format) '({level}|{fmt})'"):
        logs.configure(level, fmt, io.StringIO())


def test_flags_take_any_case_and_refuse_other_values(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    logs.add_arguments(parser)
    args = parser.parse_args(["--log-format", "JSON", "--log-level", "Debug"])
    assert (args.log_format, args.log_level) == ("json", "debug")
    assert parser.parse_args(["--log-format", "text"]).log_format == "text"
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-format", "xml"])
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_a_flag_wins_then_the_environment_then_auto(
    terminal: tuple[TextIO, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, _ = terminal
    monkeypatch.delenv("EINSORA_LOG_FORMAT", raising=False)
    monkeypatch.delenv("EINSORA_LOG_LEVEL", raising=False)
    assert logs.configure_from(Settings(), stream=stream) == "human"  # nothing set: auto
    assert logging.getLogger().level == logging.INFO
    monkeypatch.setenv("EINSORA_LOG_FORMAT", "json")
    monkeypatch.setenv("EINSORA_LOG_LEVEL", "ERROR")
    assert logs.configure_from(Settings(), stream=stream) == "json"
    assert logging.getLogger().level == logging.ERROR
    assert logs.configure_from(Settings(), "debug", "human", stream) == "human"
    assert logging.getLogger().level == logging.DEBUG
