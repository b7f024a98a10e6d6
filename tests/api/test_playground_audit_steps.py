"""A number of steps typed in Images or Videos is sent as typed: 0 is the server's to refuse (its 400 shown),
not quietly replaced by the model's default under a field that says 0; an empty field asks for the default.
Images generate and edit on the synthetic image pipeline; Videos' create is read at the browser (the model
made to say it makes video, the answer a 400, as the server gives a bad field)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from PIL import Image

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.browser_support import browser_page

CREATE_SEEN_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic_image") as server:
        yield server


async def _finished(page, stop: str) -> None:
    """The panel's request has ended (its Stop hidden again)."""
    await page.locator(f"#{stop}[hidden]").wait_for(state="attached")


async def test_steps_typed_are_sent_as_typed(srv: Server, tmp_path) -> None:
    png = tmp_path / "in.png"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(png)
    async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/v1/models", headers=srv.headers) as resp:
        models = await resp.json()
    for model in models["data"]:
        model["output_types"] = [*model["output_types"], "video"]
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        error, images = page.get_by_test_id("error"), page.locator("[data-testid=image-result] img")
        await page.get_by_test_id("image-prompt").fill("a red cube")
        await page.get_by_test_id("image-size").fill("64x48")
        for edit in (False, True):
            if edit:
                await page.get_by_test_id("image-file").set_input_files(png)
            await page.get_by_test_id("image-steps").fill("0")
            await page.get_by_test_id("image-button").click()
            await _finished(page, "image-stop")
            assert "num_inference_steps" in await error.inner_text(), (edit, await error.inner_text())
            assert await images.count() == 0
            await page.get_by_test_id("image-steps").fill("")  # the model's default
            await page.get_by_test_id("image-button").click()
            await _finished(page, "image-stop")
            assert await error.is_hidden() and await images.count() == 1, edit
        assert bp.refused == [(400, "/v1/images/generations"), (400, "/v1/images/edits")]

        creates: asyncio.Queue[dict] = asyncio.Queue()

        async def refuse(route) -> None:
            creates.put_nowait(route.request.post_data_json)
            await route.fulfill(status=400, json={"error": {"message": "refused by the test", "type":
                                                            "invalid_request_error", "param": None, "code": None}})

        await page.route("**/v1/models", lambda route: route.fulfill(json=models))
        await page.route("**/v1/videos", refuse)
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-videos").click()
        await page.get_by_test_id("video-prompt").fill("waves")
        for typed, sent in (("0", 0), ("", None)):
            await page.get_by_test_id("video-steps").fill(typed)
            await page.get_by_test_id("video-button").click()
            async with asyncio.timeout(CREATE_SEEN_TIMEOUT_S):
                body = await creates.get()
            assert body.get("num_inference_steps") == sent, (typed, body)
            await _finished(page, "video-stop")
            assert "refused by the test" in await error.inner_text()
        assert [e for e in bp.errors if "status of 400" not in e] == [], bp.errors
    await eventually(lambda: idle(srv.orch), timeout_s=10)
