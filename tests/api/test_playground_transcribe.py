"""The playground's Transcribe panel, in real headless Chromium against a transcript-only pipeline.

A model that makes transcripts gets the panel; a file goes to /v1/audio/transcriptions streamed,
and the page ends on the text the SDK gets for the same file. (synthetic_asr says what it heard,
"N samples at R Hz": a tiny random ASR checkpoint's words are often none at all.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
import soundfile as sf

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.browser_support import browser_page


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    async with serve("synthetic_asr") as server:
        yield server


async def test_transcribe_streams_the_words_of_a_file_as_the_sdk_gets_them(srv: Server, tmp_path) -> None:
    clip = tmp_path / "speech.wav"
    sf.write(clip, (np.random.default_rng(2).standard_normal(16_000) * 0.1).astype(np.float32), 16_000,
             subtype="PCM_16")
    expected = (await srv.client().audio.transcriptions.create(
        model=srv.orch.pipeline.name, file=clip.open("rb"))).text
    assert expected == "16000 samples at 16000 Hz", expected
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        tabs = await page.locator("#tabs button").all_inner_texts()
        assert tabs == ["Transcribe", "Pipeline"], tabs  # transcripts only: no chat, no talk
        await page.get_by_test_id("transcribe-button").click()  # nothing picked: said, nothing sent
        # said beside the button, the file input focused (as every panel does), not as an error
        assert "pick an audio file" in await page.get_by_test_id("transcribe-note").inner_text()
        assert await page.evaluate("document.activeElement.id") == "transcribe-file"
        assert await page.get_by_test_id("error").is_hidden()
        await page.get_by_test_id("transcribe-file").set_input_files(clip)
        await page.get_by_test_id("transcribe-button").click()
        await page.wait_for_function("document.getElementById('transcribe-button').disabled === false "
                                     "&& !document.getElementById('transcribe-output').classList.contains('live') "
                                     "&& document.getElementById('error').textContent === ''")
        assert await page.evaluate("document.getElementById('transcribe-output').textContent") == expected
        await page.screenshot(path=str(tmp_path / "transcribe.png"))
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)
