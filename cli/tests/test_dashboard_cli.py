"""`einsora dashboard`, run as a real subprocess against a real api: it prints a one-time link
that signs its opener in as the caller, once (ADR-0019)."""

from __future__ import annotations

from pathlib import Path

from einsora.api.testing import RunningApi, cli_env, einsora, link_code, sign_in


async def test_the_link_printed_signs_in_as_the_caller_once(
    api: RunningApi, tmp_path: Path
) -> None:
    env = cli_env(api, tmp_path, BROWSER="false")  # no browser here: it is printed
    code, out, err = await einsora(env, "dashboard", "--print")
    assert code == 0, err
    [url] = [line for line in out.splitlines() if "/sign-in#link=sil_" in line]
    assert url.startswith(api.url + "/sign-in#link=")
    anon = api.client(None)
    _, began = await sign_in(anon, "/v1/sessions/link", {"code": link_code(url)})
    assert (began.body["user"]["username"], began.body["operator"]) == ("owner", True)
    again = await anon.post("/v1/sessions/link", {"code": link_code(url)})
    assert again.status == 401


def test_solos_greeting_prints_the_link_to_a_terminal_only() -> None:
    from einsora.cli.solo import dashboard_lines

    url = "http://127.0.0.1:8080"
    shown = dashboard_lines(url, built=True, link_path="/sign-in#link=sil_x", on_terminal=True)
    assert f"{url}/sign-in#link=sil_x" in "\n".join(shown)
    piped = dashboard_lines(url, built=True, link_path="/sign-in#link=sil_x", on_terminal=False)
    assert "sil_x" not in "\n".join(piped)  # a log file is no place for a credential
    assert "einsora dashboard" in "\n".join(piped)
    unbuilt = dashboard_lines(url, built=False, link_path="/sign-in#link=sil_x", on_terminal=True)
    assert "make dashboard" in "\n".join(unbuilt)
    assert "sil_x" not in "\n".join(unbuilt)
