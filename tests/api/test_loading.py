"""`omni-run` listens while its models load, and says so (api/loading.py).

A real `omni-run` (synthetic pipeline) whose talker worker is held before its code
runs (a sitecustomize hook waiting on a FIFO): while it is held, `/health` is a 503
"loading" naming the talker, a chat through the openai SDK is a 503 with code
`loading` and Retry-After, `/v1/models` and `/v1/status` answer, and the playground
in Chromium shows the load; once released, everything answers as usual.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import openai
import pytest
import requests

from tests.browser_support import browser_page
from tests.shutdown_support import HELD, STARTING_LINE, OmniRun, hooked, release

HTTP_TIMEOUT_S = 10.0


@pytest.fixture
def held(tmp_path: Path):
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    run = OmniRun(tmp_path, hooked(tmp_path, HELD.format(line=STARTING_LINE, fifo=str(fifo))))
    try:
        run.wait_for(r"server\.listening")
        run.wait_for(STARTING_LINE)
        yield run, fifo
    finally:
        release(fifo)
        run.kill()


def _chat(run: OmniRun) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{run.url}/v1", api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT_S)
    return client.chat.completions.create(model="synthetic", messages=[{"role": "user", "content": "hi"}])


def test_the_api_answers_loading_until_every_stage_is_ready(held) -> None:
    run, fifo = held
    health = requests.get(f"{run.url}/health", timeout=HTTP_TIMEOUT_S)
    assert health.status_code == 503 and health.headers["Retry-After"]
    assert health.json()["status"] == "loading"
    assert "talker" in [s["model_stage"] for s in health.json()["unhealthy_stages"]]
    with pytest.raises(openai.InternalServerError) as refused:
        _chat(run)
    assert refused.value.status_code == 503 and refused.value.code == "loading"
    assert refused.value.response.headers["Retry-After"] and "talker" in refused.value.message
    models = requests.get(f"{run.url}/v1/models", timeout=HTTP_TIMEOUT_S)
    assert [m["id"] for m in models.json()["data"]] == ["synthetic"]
    status = requests.get(f"{run.url}/v1/status", timeout=HTTP_TIMEOUT_S).json()
    assert status["healthy"] is False
    release(fifo)
    run.wait_for(r"server\.ready")
    assert requests.get(f"{run.url}/health", timeout=HTTP_TIMEOUT_S).json() == {"status": "ok"}
    assert _chat(run).choices[0].message.content
    run.signal(signal.SIGTERM)
    assert run.wait() == 0, run.output
    run.assert_clean()


async def test_the_playground_shows_the_load_then_its_panels(held, tmp_path: Path) -> None:
    run, fifo = held
    async with browser_page(run.url + "/") as bp:
        page = bp.page
        loading = page.get_by_test_id("loading")
        await loading.wait_for()
        assert "talker" in await loading.inner_text()
        assert await page.get_by_test_id("health").inner_text() == "loading"
        await page.screenshot(path=str(tmp_path / "loading.png"))
        release(fifo)
        await page.locator("body[data-ready=true]").wait_for()
        assert await loading.is_hidden()
        assert "Chat" in await page.locator("#tabs button").all_inner_texts()
        # the page's only refusals were /health's 503s while the models loaded
        assert {path for status, path in bp.refused} == {"/health"}, bp.refused
        assert all("503" in e for e in bp.errors), bp.errors
    run.signal(signal.SIGTERM)
    assert run.wait() == 0, run.output
    run.assert_clean()
