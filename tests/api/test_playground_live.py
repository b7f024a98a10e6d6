"""The playground's live states, in real headless Chromium against a real server (synthetic pipelines).

Talk: the user's words show while they are heard (transcription deltas), then the completed
transcript replaces them. No synthetic pipeline transcribes a conversation's input (so Talk does not
ask them to), and the realtime socket is played by the test (Playwright's WebSocket route) with the server's event
shapes; the real assistant's spoken turn is tests/models/test_assistant_serving.py's last test.
Images: an edit is not streamed, so the progress bar is indeterminate ("working") until it answers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re

import numpy as np
import pytest
import soundfile as sf

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.api.image_family_support import png
from tests.browser_support import browser_page

WIRE_RATE = 24_000
SOCKET_TIMEOUT_S = 30.0
ITEM = "item_user_1"


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic") as server:
        yield server


def _event(type_: str, **fields) -> str:
    return json.dumps({"type": type_, "event_id": f"event_{type_}", **fields})


async def test_talk_shows_the_users_words_as_they_are_heard(srv: Server, tmp_path) -> None:
    mic = tmp_path / "silence.wav"
    sf.write(mic, np.zeros(WIRE_RATE, np.float32), WIRE_RATE, subtype="PCM_16")
    sockets: asyncio.Queue = asyncio.Queue()

    def on_socket(ws) -> None:
        sent: list[dict] = []
        ws.on_message(lambda m: sent.append(json.loads(m)))
        sockets.put_nowait((ws, sent))

    async with browser_page(srv.url + "/", fake_mic=mic, api_key=API_KEY) as bp:
        page = bp.page
        await page.route_web_socket(re.compile(r"/v1/realtime\?model=synthetic$"), on_socket)
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("talk-button").click()
        ws, sent = await asyncio.wait_for(sockets.get(), SOCKET_TIMEOUT_S)
        await page.wait_for_function("document.getElementById('talk-state').textContent === 'listening'")
        # the synthetic model has no speech recognizer: transcripts are not asked of it (the server
        # would answer each turn with `.failed`); the assistant's are, tests/models/test_assistant_serving.py
        assert sent[0]["type"] == "session.update" and "input_audio_transcription" not in sent[0]["session"]

        user = "document.getElementById('talk-user')"
        ws.send(_event("input_audio_buffer.speech_started", item_id=ITEM, audio_start_ms=0))
        for delta in ("What is", " the capital"):
            ws.send(_event("conversation.item.input_audio_transcription.delta", item_id=ITEM, content_index=0,
                           delta=delta))
        await page.wait_for_function(f"{user}.textContent === 'What is the capital'")
        assert await page.locator("#talk-user .live").count() == 1  # shown as still being heard
        await page.screenshot(path=str(tmp_path / "talk-live.png"))

        ws.send(_event("conversation.item.input_audio_transcription.completed", item_id=ITEM, content_index=0,
                       transcript="What is the capital of France?"))
        await page.wait_for_function(f"{user}.textContent === 'What is the capital of France?'")
        assert await page.locator("#talk-user .live").count() == 0

        # a second turn gets a line of its own; a failed one keeps what was heard
        ws.send(_event("conversation.item.input_audio_transcription.delta", item_id="item_user_2", content_index=0,
                       delta="And Spain"))
        ws.send(_event("conversation.item.input_audio_transcription.failed", item_id="item_user_2", content_index=0,
                       error={"type": "transcription_error", "message": "x"}))
        await page.locator("#talk-user .failed").wait_for()
        lines = await page.locator("#talk-user > div").all_inner_texts()
        assert lines == ["What is the capital of France?", "And Spain"], lines
        assert await page.get_by_test_id("talk-transcript").inner_text() == ""  # the assistant's side untouched

        await page.get_by_test_id("talk-button").click()  # stop
        await page.wait_for_function("window.__playground.talk === null")
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_speaking_over_the_answer_stops_its_playback_at_once(srv: Server, tmp_path) -> None:
    mic = tmp_path / "silence.wav"
    sf.write(mic, np.zeros(WIRE_RATE, np.float32), WIRE_RATE, subtype="PCM_16")
    sockets: asyncio.Queue = asyncio.Queue()
    async with browser_page(srv.url + "/", fake_mic=mic, api_key=API_KEY) as bp:
        page = bp.page
        await page.route_web_socket(re.compile(r"/v1/realtime\?model=synthetic$"), sockets.put_nowait)
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("talk-button").click()
        ws = await asyncio.wait_for(sockets.get(), SOCKET_TIMEOUT_S)
        await page.wait_for_function("document.getElementById('talk-state').textContent === 'listening'")
        ws.send(_event("response.created", response={"id": "resp_1", "status": "in_progress"}))
        tone = (np.sin(np.arange(WIRE_RATE // 2) * 0.05) * 8000).astype("<i2").tobytes()
        for _ in range(6):  # 3 s of answer, queued to play back to back
            ws.send(_event("response.output_audio.delta", response_id="resp_1", item_id="item_a", output_index=0,
                           content_index=0, delta=base64.b64encode(tone).decode()))
        player = "window.__playground.talk.player"
        await page.wait_for_function(f"{player}.sources.size === 6 && {player}.playedSeconds === 3")
        assert await page.get_by_test_id("talk-state").inner_text() == "speaking"
        ws.send(_event("input_audio_buffer.speech_started", item_id=ITEM, audio_start_ms=500))  # the user talks
        await page.wait_for_function(f"{player}.sources.size === 0 && {player}.next === 0")
        assert await page.get_by_test_id("talk-state").inner_text() == "hearing you"
        await page.get_by_test_id("talk-button").click()  # stop
        await page.wait_for_function("window.__playground.talk === null")
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)


@pytest.fixture(scope="module")
async def image_srv():
    async with serve("synthetic_image") as server:
        yield server


async def test_an_image_edit_shows_working_then_counts_its_steps(image_srv: Server, tmp_path) -> None:
    picture = tmp_path / "in.png"
    picture.write_bytes(png(np.full((32, 32, 3), 128, np.uint8)))
    held: asyncio.Queue = asyncio.Queue()
    async with browser_page(image_srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.route("**/v1/images/edits", held.put_nowait)  # held until the test has looked
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("image-prompt").fill("a grey square, but blue")
        await page.get_by_test_id("image-size").fill("32x32")
        await page.get_by_test_id("image-file").set_input_files(picture)
        await page.get_by_test_id("image-button").click()
        route = await asyncio.wait_for(held.get(), SOCKET_TIMEOUT_S)
        bar = "document.getElementById('image-progress')"
        assert await page.evaluate(f"{bar}.matches(':indeterminate')")  # working, nothing to count
        assert await page.get_by_test_id("image-status").inner_text() == "working…"
        await page.screenshot(path=str(tmp_path / "image-working.png"))
        await route.continue_()
        await page.wait_for_function(f"{bar}.value === 1 && !{bar}.matches(':indeterminate')")
        assert await page.evaluate(f"{bar}.dataset.steps") == "20"  # a step event each (the last "decode"), then the image
        assert await page.locator("#image-result img").count() == 1
        # named for a screen reader by its prompt
        assert await page.get_by_role("img", name="image for: a grey square, but blue", exact=True).count() == 1
        assert await page.get_by_test_id("image-status").inner_text() == ""
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(image_srv.orch), timeout_s=10)
