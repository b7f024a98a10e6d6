"""The playground opened by a host name over plain http (omni-run on another machine): the browser offers
no microphone to such a page, and Talk says so in words, with the way round it (https, or localhost
through a tunnel), instead of "Cannot read properties of undefined (reading 'getUserMedia')"; no socket is
opened and Talk is ready again; Record says the same. Speak, which needs no microphone, plays there."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.api.conftest import API_KEY, Server, serve
from tests.browser_support import browser_page

HOST = "gpu-box.test"
"""The name the page is opened by (Chromium maps it to the server's 127.0.0.1: not a secure origin)."""


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic") as server:
        yield server


async def test_talk_on_a_page_over_plain_http_says_why_there_is_no_microphone(srv: Server, tmp_path) -> None:
    port = urlsplit(srv.url).port
    async with browser_page(srv.url + "/", api_key=API_KEY, host_alias=HOST) as bp:
        page = bp.page
        sockets = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        await page.locator("body[data-ready=true]").wait_for()
        assert await page.evaluate("[location.hostname, window.isSecureContext]") == [HOST, False]
        await page.get_by_test_id("talk-button").click()
        error = page.get_by_test_id("error")
        await error.wait_for()  # (shown once Talk has given up)
        said = await error.inner_text()
        assert said.startswith(f"microphone: the browser offers none to a page served over plain http from {HOST}")
        assert f"http://localhost:{port}/" in said and f"ssh -L {port}:localhost:{port} {HOST}" in said, said
        assert "undefined" not in said
        await page.locator("[data-testid=talk-state]:text-is('idle')").wait_for()  # (its session ended)
        await page.locator("[data-testid=talk-button]:enabled:text-is('Start talking')").wait_for()
        assert sockets == [] and await page.evaluate("window.__playground.talk") is None
        await page.screenshot(path=str(tmp_path / "talk-insecure.png"))

        await page.get_by_test_id("tab-speak").click()  # (playback needs no secure page)
        await page.get_by_test_id("speak-input").fill("Hello from another machine.")
        await page.get_by_test_id("speak-button").click()
        await page.wait_for_function("Number(document.getElementById('speak-audio').dataset.seconds || 0) > 0")

        # Record (Transcribe's, here on the model made to say it transcribes) says the same, once.
        async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/v1/models", headers=srv.headers) as resp:
            models = await resp.json()
        for model in models["data"]:
            model["output_types"] = [*model["output_types"], "transcript"]
        await page.route("**/v1/models", lambda route: route.fulfill(json=models))
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-transcribe").click()
        await page.get_by_test_id("transcribe-record").click()
        await error.wait_for()
        said = await error.inner_text()
        assert said.startswith("microphone: the browser offers none to a page served over plain http"), said
        assert said.count("microphone:") == 1, said
        assert await page.get_by_test_id("transcribe-record").inner_text() == "Record"
        assert await page.get_by_test_id("transcribe-record").is_enabled()
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)

