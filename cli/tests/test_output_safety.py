"""What the CLI prints cannot be turned against the person reading it, and a closed pipe is quiet.

A server-provided string with control characters (ANSI sequences, CR, C1, bidi overrides, line
separators) is printed with each of them escaped visibly; `einsora` run as a real subprocess
against a real api shows a hostile workload name that way, and exits with 141 and nothing on
stderr when its output's reader has already gone (`einsora ls | head -1`).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from einsora.api.testing import EINSORA, RunningApi, cli_env
from einsora.cli import render

HOSTILE = "prod\u202egnp.exe\x1b[31m\u2028forged\x85row\r"
HOSTILE_SHOWN = "prod\\u202egnp.exe\\x1b[31m\\u2028forged\\x85row\\x0d"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x07", "\\x1b[2J\\x07"),  # C0: clear the screen, ring the bell
        ("a\rb\nc\td", "a\\x0db\\x0ac\\x09d"),  # overwrite, new row, misalign
        ("\x7f\x85\x9b", "\\x7f\\x85\\x9b"),  # DEL and C1 (NEL, CSI)
        ("abc\u202edef", "abc\\u202edef"),  # right-to-left override
        ("\u2066x\u2069\u200f\u061c", "\\u2066x\\u2069\\u200f\\u061c"),  # isolates and marks
        ("l\u2028m\u2029n", "l\\u2028m\\u2029n"),  # line and paragraph separators
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("tag\U000e0041", "tag\\U000e0041"),  # invisible tag characters
        ("lone\ud800", "lone\\ud800"),  # a lone surrogate, which would not even encode
    ],
)
def test_control_characters_are_shown_escaped(raw: str, shown: str) -> None:
    assert render.escape(raw) == shown


@pytest.mark.parametrize("text", ["notebook-1", "Überprüfung", "実験 ノート", "🎉 launch", "a b"])
def test_ordinary_text_is_printed_as_it_is(text: str) -> None:
    assert render.escape(text) == text


def test_a_table_cell_cannot_add_rows_or_move_the_cursor() -> None:
    out = io.StringIO()
    render.table([("w-1", HOSTILE, 3), ("w-2", None, "ok")], ["id", "name\x1b[8m", "n"], out)
    printed = out.getvalue()
    assert len(printed.splitlines()) == 3  # the header and two rows, none forged
    assert HOSTILE_SHOWN in printed
    assert "NAME\\X1B[8M" in printed
    assert all(c == "\n" or c.isprintable() for c in printed), repr(printed)


async def _hostile_workload(api: RunningApi) -> str:
    """A workload whose stored name holds control characters (as a row written before names
    were checked would)."""
    made = await api.owner.post("/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    assert made.status == 201, made.text
    assert api.service.store is not None
    async with api.service.store.write() as conn:
        await conn.execute(
            sa.text("UPDATE workloads SET name = :name WHERE id = :id"),
            {"name": HOSTILE, "id": made.body["id"]},
        )
    workload_id: str = made.body["id"]
    return workload_id


async def _einsora(env: dict[str, str], *args: str, stdout: int) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        EINSORA, *args, env=env, stdout=stdout, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, out or b"", err


async def test_a_hostile_name_from_the_server_is_printed_escaped(
    api: RunningApi, tmp_path: Path
) -> None:
    workload_id = await _hostile_workload(api)
    env = cli_env(api, tmp_path)
    for args in (["ls"], ["show", workload_id], ["ls", "--json"]):
        code, out, err = await _einsora(env, *args, stdout=asyncio.subprocess.PIPE)
        assert code == 0, err
        printed = out.decode()
        assert all(c == "\n" or c.isprintable() for c in printed), (args, printed)
        if args[-1] != "--json":
            assert HOSTILE_SHOWN in printed, printed
        else:
            assert json.loads(printed)[0]["name"] == HOSTILE  # exact, for scripts
    code, out, _ = await _einsora(env, "ls", stdout=asyncio.subprocess.PIPE)
    assert len(out.decode().splitlines()) == 2  # the header and the one workload


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"], ["show"], ["events"]])
async def test_a_reader_that_went_away_gets_no_traceback(
    api: RunningApi, tmp_path: Path, command: list[str]
) -> None:
    workload_id = await _hostile_workload(api)
    args = command + ([workload_id] if command[0] in ("show", "events") else [])
    reader, writer = os.pipe()
    os.close(reader)  # the reader is gone before the first byte, as `head` may be
    try:
        code, _, err = await _einsora(cli_env(api, tmp_path), *args, stdout=writer)
    finally:
        os.close(writer)
    assert err == b"", err.decode()  # no traceback, no "Exception ignored"
    assert code == 141
