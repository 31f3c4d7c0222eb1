"""A real notebook opened in a real browser through the access proxy.

Solo's parts run in this process with the `process` driver, so the notebook is a real Jupyter
server; Debian's Chromium, driven by Playwright, follows the access link, sees JupyterLab load,
starts a kernel over a WebSocket and evaluates `1+1`. The workload's token must not appear in any
URL the browser visited, any response it received, or any log line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tests.conftest import OpenApi, StartPlane

from einsora.cli.controlplane import ControlPlane

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="Debian's chromium is not installed (scripts/test-deps.sh installs it as root)",
    ),
]

RUN_1_PLUS_1 = """
async () => {
  const made = await fetch('/api/kernels', {method: 'POST', body: '{}',
                                            headers: {'Content-Type': 'application/json'}});
  if (!made.ok) { return 'kernel start failed: ' + made.status; }
  const kernel = await made.json();
  const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host
              + '/api/kernels/' + kernel.id + '/channels?session_id=e2e';
  return await new Promise((resolve) => {
    const ws = new WebSocket(url);
    const timer = setTimeout(() => resolve('timeout'), 30000);
    ws.onerror = () => resolve('websocket error');
    ws.onopen = () => ws.send(JSON.stringify({
      header: {msg_id: 'run-1', username: 'e2e', session: 'e2e', msg_type: 'execute_request',
               version: '5.3', date: new Date().toISOString()},
      parent_header: {}, metadata: {}, channel: 'shell', buffers: [],
      content: {code: '1+1', silent: false, store_history: false, user_expressions: {},
                allow_stdin: false, stop_on_error: true}}));
    ws.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      if (msg.msg_type === 'execute_result') {
        clearTimeout(timer); ws.close(); resolve(msg.content.data['text/plain']);
      }
    };
  });
}
"""


async def test_a_notebook_opens_in_chromium_and_runs_code(
    start_plane: StartPlane, api_of: OpenApi, caplog: pytest.LogCaptureFixture
) -> None:
    from playwright.async_api import async_playwright

    caplog.set_level(logging.DEBUG)
    plane = await start_plane(driver="process")
    api = await api_of(plane)
    workload = await api.ok("POST", "/v1/workloads", {"kind": "notebook", "class": "cpu-1c-2g"})
    await api.wait_state(workload["id"], "running", within_s=90)
    access = await api.ok("POST", f"/v1/workloads/{workload['id']}/access")
    token = _workload_token(plane, workload["id"])

    seen_urls: list[str] = []
    bodies: list[bytes] = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = await browser.new_page()
        page.on("request", lambda req: seen_urls.append(req.url))

        async def keep(response: object) -> None:
            try:
                bodies.append(await response.body())  # type: ignore[attr-defined]
            except Exception:
                bodies.append(b"")

        page.on("response", keep)
        await page.goto(access["url"])
        assert "/lab" in page.url
        assert "ticket=" not in page.url
        await page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
        result = await page.evaluate(RUN_1_PLUS_1)
        cookies = await page.context.cookies()
        await browser.close()

    assert result == "2"
    [cookie] = [c for c in cookies if c["name"] == "einsora-site"]
    assert cookie["httpOnly"]
    assert cookie["sameSite"] == "Lax"
    assert cookie["domain"] == f"{workload['id']}.localhost"  # host-only
    assert all(token not in url for url in seen_urls)
    assert all(token.encode() not in body for body in bodies)
    leaks = [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records if token in r.getMessage()]
    assert leaks == []


def _workload_token(plane: ControlPlane, workload_id: str) -> str:
    """The workload's own token, read from where the proxy reads it (its route)."""
    assert plane.proxy is not None
    route = plane.proxy.route(workload_id)
    assert route is not None
    assert route.token
    token: str = route.token
    return token
