"""The origin policy in headless Chromium: the page served at ``/`` connects; a page from
another site (a second local HTTP server that Chromium reaches as ``http://evil.example``)
is refused, unless ``server.allowed_origins`` lists it.

Fake ASR/LLM (only the connection is under test). Needs Debian's ``chromium`` and Playwright.
"""

from __future__ import annotations

import http.server
import threading

import pytest

from client_fakes import real_tts_engines, start_hub
from conftest import scaled
from test_browser import CHROMIUM, chromium_args, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(scaled(120)),
              pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")]

PROBE = """<!doctype html><title>another site</title><script>
window.result = null;
const ws = new WebSocket("ws://127.0.0.1:%(port)d/v1/realtime");
ws.onmessage = (m) => { window.result = window.result || "open: " + JSON.parse(m.data).type; };
ws.onclose = (e) => { window.result = window.result || "closed: " + e.code; };
</script>"""


class ProbeSite:
    """A second web server on another port serving a page that opens a WebSocket to voxloop."""

    def __init__(self) -> None:
        self.hub_port = 0
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = (PROBE % {"port": site.hub_port}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self) -> str:
        return f"http://evil.example:{self.port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


async def probe(browser, site: ProbeSite, hub) -> str:
    site.hub_port = hub.port
    page = await browser.new_page()
    await page.goto(site.url())
    result = await wait_for(page, "window.result", 10)
    await page.close()
    return result


async def test_browser_page_connects_and_other_sites_are_refused(tts_engines, tmp_path):
    playwright = pytest.importorskip("playwright.async_api", reason="playwright (dev extra) is not installed")
    site = ProbeSite()
    hub = await start_hub(tts_engines)
    try:
        async with playwright.async_playwright() as p:
            args = [*chromium_args(tmp_path / "none.wav"), "--no-proxy-server",
                    "--host-resolver-rules=MAP evil.example 127.0.0.1"]
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{hub.port}/")  # the server's own page
            await wait_for(page, "window.voxloop && window.voxloop.connected", 20)
            await page.close()
            assert await probe(browser, site, hub) == "closed: 1006"  # 403 before the upgrade
            assert hub.metrics.rejected.labels(reason="origin")._value.get() == 1
            # The same page once its origin is listed: proof that the origin was the reason.
            allowed = await start_hub(tts_engines, f"server.allowed_origins=http://evil.example:{site.port}")
            try:
                assert await probe(browser, site, allowed) == "open: session.created"
            finally:
                await allowed.stop()
            await browser.close()
    finally:
        await hub.stop()
        site.close()
