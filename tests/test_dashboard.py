"""The dashboard in a real browser against a real Solo (issue 18): the slow `dashboard` tier.

`einsora solo` runs as a user runs it (a subprocess on a terminal, free ports, the `process`
driver: a notebook is a real Jupyter), and Debian's Chromium, driven by Playwright, does what a
person does: signs in from the first start's one-time link, launches a notebook and watches its
timeline reach `running` without reloading, opens it (its own site loads in a new tab, where a
kernel runs `1+1`), parks and resumes it, makes and revokes an API token and a gateway key,
meets a validation error beside its field, and signs out (the old cookie no longer works).
axe-core, from the dashboard's own node_modules, checks every page in both colour schemes;
each page is photographed at 1280 and 390 px wide, light and dark, into the artifacts folder
(`EINSORA_TEST_ARTIFACTS`, default `artifacts/dashboard/`; never committed).

`make test-dashboard` builds the dashboard first, then runs this; `.ci/run` runs it after
`make test`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, RUN_1_PLUS_1
from tests.test_solo import Solo, _free_port, _workload_uids

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dashboard" / "dist"
AXE = ROOT / "dashboard" / "node_modules" / "axe-core" / "axe.min.js"
ARTIFACTS = Path(os.environ.get("EINSORA_TEST_ARTIFACTS", ROOT / "artifacts")) / "dashboard"
WIDTHS = (1280, 390)
SCHEMES = ("light", "dark")
SERIOUS = ("serious", "critical")
TIMEOUT_MS = 90_000

pytestmark = [
    pytest.mark.dashboard,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Debian's chromium is not installed (scripts/test-deps.sh installs it as root)",
    ),
    pytest.mark.skipif(
        not (DIST / "index.html").exists() or not AXE.exists(),
        reason="the dashboard is not built (`make test-dashboard` builds it; it needs Node 20+)",
    ),
]


@dataclass
class Running:
    """The Solo under test: its address, the first start's link, and the owner's token."""

    solo: Solo
    url: str
    link: str
    token: str


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("dashboard")
    env = dict(os.environ)
    for key in ("EINSORA_TOKEN", "EINSORA_API", "EINSORA_NATS_URL"):
        env.pop(key, None)
    api_port = _free_port()
    env.update(
        {
            "EINSORA_DATA_DIR": str(tmp / "data"),
            "EINSORA_API_PORT": str(api_port),
            "EINSORA_PROXY_PORT": str(_free_port()),
            "EINSORA_GATEWAY_PORT": str(_free_port()),
            "EINSORA_NATS_PORT": str(_free_port()),
            "EINSORA_DASHBOARD_DIR": str(DIST),
            "XDG_CONFIG_HOME": str(tmp / "config"),
        }
    )
    solo = Solo(tmp / "data", env)
    try:
        out = solo.start(on_a_terminal=True)  # the link is printed to a terminal only
        found = re.search(r"^\s+(http://\S+/sign-in#link=sil_\S+)$", out, re.MULTILINE)
        assert found, out
        token = (tmp / "data" / "owner.token").read_text().strip()
        yield Running(solo, f"http://127.0.0.1:{api_port}", found.group(1), token)
    finally:
        _remove_everything(solo, env)
        if solo.proc is not None and solo.proc.poll() is None:
            solo.stop()
        _kill_workloads(tmp, tmp / "data")


def _remove_everything(solo: Solo, env: dict[str, str]) -> None:
    """The test's workloads must not outlive it (Solo leaves them running by design)."""
    if solo.proc is None or solo.proc.poll() is not None:
        return
    listed = solo.cli("ls", "--json")
    if listed.returncode == 0:
        for w in json.loads(listed.stdout):
            if w["state"] not in ("removed", "removing"):
                solo.cli("rm", w["id"], "--wait")


def _kill_workloads(tmp: Path, data_dir: Path) -> None:
    import psutil

    uids = _workload_uids(data_dir)
    for proc in psutil.process_iter(["cwd", "uids"]):
        try:
            mine = proc.info["cwd"] and proc.info["cwd"].startswith(str(tmp))
            if mine or proc.info["uids"].real in uids:
                proc.kill()
        except psutil.Error:
            pass


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        await chromium.close()


class Watch:
    """What a page says to the console: a Content-Security-Policy violation or an uncaught
    error fails the test (the dashboard runs nothing inline and throws nothing)."""

    def __init__(self, page: Any) -> None:
        self.problems: list[str] = []
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        text = message.text
        if message.type == "error" and (
            "Content Security Policy" in text or "Uncaught" in text or "TypeError" in text
        ):
            self.problems.append(text)


async def axe(page: Any, name: str) -> None:
    """axe-core on the page as it is: no serious or critical violation."""
    # Evaluated through the DevTools protocol, as a script of the page's own would never be:
    # the dashboard's CSP allows no inline script, and a test must not loosen it.
    await page.evaluate(AXE.read_text() + "\n;0")
    result = await page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.length,"
        " target: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))"
    )
    serious = [v for v in result if v["impact"] in SERIOUS]
    assert serious == [], f"{name}: {serious}"


async def photograph(page: Any, name: str, width: int, scheme: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}-{width}-{scheme}.png"), full_page=True)


async def new_page(
    browser: Any, *, width: int = 1280, scheme: str = "light", state: Any = None
) -> Any:
    context = await browser.new_context(
        viewport={"width": width, "height": 900},
        color_scheme=scheme,
        storage_state=state,
        accept_downloads=True,
    )
    context.set_default_timeout(30_000)
    return await context.new_page()


def _sign_in_link(running: Running) -> str:
    """A fresh one-time link, as `einsora dashboard` prints it for the owner."""
    printed = running.solo.cli("dashboard", "--print")
    assert printed.returncode == 0, printed.stderr
    [url] = [line for line in printed.stdout.splitlines() if "#link=sil_" in line]
    return url.strip()


async def _api(
    running: Running, method: str, path: str, json: Any = None, **headers: str
) -> tuple[int, Any]:
    sent = {"Authorization": f"Bearer {running.token}", **headers}
    if "Cookie" in headers:
        del sent["Authorization"]
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, running.url + path, headers=sent, json=json) as answer,
    ):
        body = await answer.json() if answer.content_type == "application/json" else None
        return answer.status, body


async def test_sign_in_launch_watch_open_park_resume_keys_tokens_and_errors(
    running: Running, browser: Any
) -> None:
    from playwright.async_api import expect

    page = await new_page(browser)
    watch = Watch(page)
    # The first start's link: exchanged at once, and gone from the address bar.
    await page.goto(running.link)
    await expect(page).to_have_url(f"{running.url}/workloads")
    await expect(page.get_by_role("heading", name="Workloads", level=1)).to_be_visible()
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "einsora_session"]
    assert (cookie["domain"], cookie["httpOnly"], cookie["sameSite"]) == (
        "127.0.0.1",
        True,
        "Strict",
    )
    assert cookie["secure"] is False  # plain HTTP on this machine; Secure under TLS
    await expect(page.get_by_text("No workloads yet")).to_be_visible()
    await axe(page, "workloads (empty)")
    await photograph(page, "workloads-empty", 1280, "light")

    # Launch a notebook and watch it reach running, live, in the same document.
    await page.get_by_role("link", name="Launch", exact=True).click()
    await page.get_by_label("Notebook").check()
    await page.get_by_label("Class", exact=True).select_option("cpu-1c-2g")
    await page.get_by_role("button", name="Launch", exact=True).click()
    await expect(page).to_have_url(re.compile(r"/workloads/w-[0-9a-z]{20}$"))
    workload_id = page.url.rsplit("/", 1)[1]
    await page.evaluate("window.__sameDocument = true")
    running_entry = page.locator("ol.timeline li.transition", has_text="running")
    await expect(running_entry.first).to_be_visible(timeout=TIMEOUT_MS)
    await expect(page.locator("#workload-state")).to_have_text("running")
    assert await page.evaluate("window.__sameDocument === true")  # never reloaded
    await axe(page, "workload")

    # Open: the workload's own site, in a new tab, where a kernel runs 1+1.
    async with page.context.expect_page() as opened:
        await page.get_by_role("button", name="Open", exact=True).click()
    site = await opened.value
    site_url = re.compile(rf"^http://{workload_id}\.localhost:\d+/lab")
    await site.wait_for_url(site_url, timeout=60_000)
    assert "ticket=" not in site.url
    await site.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
    assert await site.evaluate(RUN_1_PLUS_1) == "2"
    site_cookies = {c["name"] for c in await page.context.cookies(site.url)}
    assert "einsora_session" not in site_cookies  # the dashboard's cookie never goes there
    await site.close()

    # Park and resume, each seen live.
    await page.get_by_role("button", name="Park", exact=True).click()
    await expect(page.locator("#workload-state")).to_have_text("parked", timeout=TIMEOUT_MS)
    await page.get_by_role("button", name="Resume", exact=True).click()
    await expect(page.locator("#workload-state")).to_have_text("running", timeout=TIMEOUT_MS)
    async with page.expect_download() as downloaded:
        await page.get_by_role("link", name="Download full log").click()
    export = await (await downloaded.value).path()
    assert '"einsora.workload-export/v1"' in await asyncio.to_thread(Path(export).read_text)

    # A refusal is shown beside the field it names, with nothing launched.
    await page.get_by_role("link", name="Workloads", exact=True).click()
    await expect(page.locator(f"tr[data-workload='{workload_id}']")).to_have_attribute(
        "data-state", "running"
    )
    await page.get_by_role("link", name="Launch", exact=True).click()
    await page.get_by_label("Model endpoint").check()
    model = page.get_by_label("Model file")
    await model.fill("/models/weights.bin")
    await page.get_by_role("button", name="Launch", exact=True).click()
    await expect(page.locator("#launch-model-error")).to_be_visible()
    await expect(model).to_have_attribute("aria-invalid", "true")
    assert "/launch" in page.url
    await axe(page, "launch with an error")
    await photograph(page, "launch-error", 1280, "light")

    # An API token: made (shown once, copied), used, revoked.
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=running.url)
    await page.get_by_role("link", name="API tokens").click()
    await page.get_by_label("Name", exact=True).fill("e2e")
    await page.get_by_role("button", name="Make token").click()
    secret = await page.get_by_role("textbox", name="Token e2e").input_value()
    assert secret.startswith("tsk_")
    await page.get_by_role("region", name="Token e2e").get_by_role("button", name="Copy").click()
    assert await page.evaluate("navigator.clipboard.readText()") == secret
    status, _ = await _api(running, "GET", "/v1/me", Authorization=f"Bearer {secret}")
    assert status == 200
    row = page.locator("tr[data-token]", has_text="e2e")
    await row.get_by_role("button", name="Revoke token e2e").click()
    await page.get_by_role("dialog").get_by_role("button", name="Revoke").click()
    await expect(row).to_have_count(0)
    status, _ = await _api(running, "GET", "/v1/me", Authorization=f"Bearer {secret}")
    assert status == 401

    # A gateway key: made (shown once), listed, revoked.
    await page.get_by_role("link", name="Gateway keys").click()
    await page.get_by_label("Name", exact=True).fill("e2e-key")
    await page.get_by_role("button", name="Make key").click()
    key = await page.get_by_role("textbox", name="Key e2e-key").input_value()
    assert key.startswith("esk_")
    key_row = page.locator("tr[data-key]", has_text="e2e-key")
    await expect(key_row).to_have_count(1)
    await key_row.get_by_role("button", name="Revoke key e2e-key").click()
    await page.get_by_role("dialog").get_by_role("button", name="Revoke").click()
    await expect(key_row).to_have_count(0)
    status, keys = await _api(running, "GET", "/v1/gateway/keys")
    assert status == 200
    assert keys["items"] == []

    # Remove, confirmed: the notebook goes, live.
    await page.goto(f"{running.url}/workloads/{workload_id}")
    await page.get_by_role("button", name="Remove", exact=True).click()
    await page.get_by_role("dialog").get_by_role("button", name="Remove").click()
    await expect(page.locator("#workload-state")).to_have_text("removed", timeout=TIMEOUT_MS)
    assert watch.problems == []


async def test_sign_out_ends_the_session_on_the_server(running: Running, browser: Any) -> None:
    from playwright.async_api import expect

    page = await new_page(browser)
    await page.goto(_sign_in_link(running))
    await expect(page).to_have_url(f"{running.url}/workloads")
    [cookie] = [c for c in await page.context.cookies() if c["name"] == "einsora_session"]
    old = f"einsora_session={cookie['value']}"
    assert (await _api(running, "GET", "/v1/me", Cookie=old))[0] == 200
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/sign-in"))
    await expect(page.get_by_role("heading", name="Sign in to Einsora")).to_be_visible()
    status, body = await _api(running, "GET", "/v1/me", Cookie=old)  # the old cookie, replayed
    assert status == 401
    assert body["error"] == "session_ended"
    await page.goto(f"{running.url}/workloads")
    await expect(page).to_have_url(re.compile(r"/sign-in\?next=%2Fworkloads"))
    await axe(page, "sign in")


async def test_a_member_joins_from_an_invitation_link(running: Running, browser: Any) -> None:
    from playwright.async_api import expect

    admin = await new_page(browser)
    await admin.goto(_sign_in_link(running))
    await expect(admin).to_have_url(f"{running.url}/workloads")
    await admin.get_by_role("link", name="Members").click()
    await admin.get_by_label("Username", exact=True).fill("ann")
    await admin.get_by_role("button", name="Invite").click()
    link = await admin.get_by_label("Invitation link").input_value()
    assert link.startswith(f"{running.url}/join#code=inv_")
    await axe(admin, "members")

    member = await new_page(browser, scheme="dark")
    await member.goto(link)
    await expect(member).to_have_url(f"{running.url}/join")  # the code left the address bar
    await axe(member, "join")
    await member.get_by_label("Password", exact=True).fill("correct horse battery staple")
    await member.get_by_label("The same password again").fill("correct horse battery staple")
    await member.get_by_role("button", name="Join").click()
    await expect(member).to_have_url(f"{running.url}/workloads")
    await expect(member.get_by_role("link", name="ann")).to_be_visible()
    # She signs in with it next time.
    again = await new_page(browser)
    await again.goto(f"{running.url}/sign-in")
    await again.get_by_label("Username").fill("ann")
    await again.get_by_label("Password").fill("correct horse battery staple")
    await again.get_by_role("button", name="Sign in").click()
    await expect(again).to_have_url(f"{running.url}/workloads")


async def test_join_a_machine_and_download_usage_as_csv(running: Running, browser: Any) -> None:
    from playwright.async_api import expect

    page = await new_page(browser, width=390)
    await page.goto(_sign_in_link(running))
    await expect(page).to_have_url(f"{running.url}/workloads")
    await page.get_by_role("link", name="Machines").click()
    await expect(page.locator("li.machine")).to_have_count(1)  # this machine
    await page.get_by_role("button", name="Join a machine").click()
    await page.get_by_role("button", name="Make a join token").click()
    command = await page.get_by_label("Join command").text_content()
    token = await page.get_by_role("textbox", name="Join token").input_value()
    assert token.startswith("agt_")
    assert command is not None
    assert "einsora agent join" in command
    assert token in command
    await axe(page, "machines, joining")
    await photograph(page, "machines-join", 390, "light")

    await page.get_by_role("link", name="Usage").click()
    async with page.expect_download() as downloaded:
        await page.get_by_role("button", name="Download CSV").click()
    csv = await asyncio.to_thread(Path(await (await downloaded.value).path()).read_text)
    assert csv.splitlines()[0] == "group,gpu_hours,cpu_core_hours,prompt_tokens,completion_tokens"


async def test_sign_in_with_the_keyboard_alone(running: Running, browser: Any) -> None:
    from playwright.async_api import expect

    status, _ = await _api(running, "GET", "/v1/me")
    assert status == 200
    page = await new_page(browser)
    await page.goto(_sign_in_link(running))
    await expect(page).to_have_url(f"{running.url}/workloads")
    focused = "document.activeElement.textContent"
    # Backwards from the page's heading (focused when a page opens) through the header's
    # controls to the skip link, then into the page and on to Launch: all by keyboard.
    passed = []
    for _ in range(15):
        await page.keyboard.press("Shift+Tab")
        passed.append(await page.evaluate(focused))
        if passed[-1] == "Skip to content":
            break
    assert passed[-1] == "Skip to content", passed
    assert {"Workloads", "Machines", "Usage", "Gateway keys", "API tokens", "Members"} <= set(
        passed
    )
    await page.keyboard.press("Enter")
    for _ in range(15):
        await page.keyboard.press("Tab")
        if await page.evaluate(focused) == "Launch":
            break
    assert await page.evaluate(focused) == "Launch"
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Launch", level=1)).to_be_visible()
    await expect(page.get_by_role("heading", name="Launch", level=1)).to_be_focused()


PAGES = (
    ("workloads", "/workloads", "Workloads"),
    ("workload", "/workloads/{id}", None),
    ("launch", "/launch", "Launch"),
    ("machines", "/machines", "Machines"),
    ("usage", "/usage", "Usage"),
    ("gateway-keys", "/gateway-keys", "Gateway keys"),
    ("tokens", "/tokens", "API tokens"),
    ("members", "/members", "Members"),
    ("account", "/account", "Account"),
)


async def test_every_page_at_both_widths_in_both_schemes_passes_axe(
    running: Running, browser: Any
) -> None:
    from playwright.async_api import expect

    # Something to show: a notebook and an endpoint that wait for a GPU this machine lacks
    # (they stay queued, and run nothing).
    for body in (
        {"kind": "notebook", "class": "l40s-48gb", "name": "train"},
        {
            "kind": "endpoint",
            "class": "l40s-48gb",
            "name": "chat",
            "spec": {"runtime": "llamacpp", "model": "/models/chat.gguf"},
        },
    ):
        status, made = await _api(running, "POST", "/v1/workloads", json=body)
        assert status == 201, made
    workload_id = made["id"]  # the endpoint: its page shows the gateway's code
    signing = await new_page(browser)
    await signing.goto(_sign_in_link(running))
    await expect(signing).to_have_url(f"{running.url}/workloads")
    state = await signing.context.storage_state()
    for width in WIDTHS:
        for scheme in SCHEMES:
            page = await new_page(browser, width=width, scheme=scheme, state=state)
            watch = Watch(page)
            for name, path, heading in PAGES:
                if "{id}" in path:
                    if workload_id is None:
                        continue
                    path = path.replace("{id}", workload_id)
                await page.goto(running.url + path)
                title = page.get_by_role("heading", level=1)
                await expect(title).to_be_visible()
                if heading is not None:
                    await expect(title).to_have_text(heading)
                await expect(page.locator("[aria-busy='true']")).to_have_count(0, timeout=30_000)
                await axe(page, f"{name} at {width} px, {scheme}")
                await photograph(page, name, width, scheme)
            await page.context.close()
            assert watch.problems == [], (width, scheme, watch.problems)
    signed_out = await new_page(browser, width=390, scheme="dark")
    await signed_out.goto(f"{running.url}/sign-in")
    await axe(signed_out, "sign in at 390 px, dark")
    await photograph(signed_out, "sign-in", 390, "dark")
