"""Talk in the playground, for real: Chromium's fake microphone speaks a question to the assistant.

The question is the server's own voice (its /v1/audio/speech), written to a WAV that
Chromium plays as the microphone (`--use-file-for-fake-audio-capture`). The page
streams it to /v1/realtime through its AudioWorklet, the server's VAD ends the turn,
and the answer's words appear in `talk-transcript` while its audio plays.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from assistant_support import assistant_dir, normalize

from omni_actors.api.realtime.audio import WIRE_RATE, resample
from omni_actors.cli import bundled_deploy
from omni_actors.config.deploy import load_deploy
from tests.api.conftest import Server, eventually, idle, serve_deploy
from tests.browser_support import browser_page

__all__ = ["assistant_dir"]

KEY = "playground-key"
QUESTION = "What is the capital of France?"
LEAD_S, TAIL_S = 0.5, 40.0
"""Silence around the question: the tail ends the turn and keeps the looping fake mic quiet."""


@pytest.fixture(scope="module")
async def srv(assistant_dir):
    deploy = load_deploy(bundled_deploy(), {"model": str(assistant_dir), "server": {"api_keys": [KEY]}})
    async with serve_deploy(deploy, KEY) as server:
        yield server


async def question_wav(srv: Server, path) -> None:
    spoken = await srv.client().audio.speech.create(model="assistant", voice="alloy", input=QUESTION,
                                                    response_format="wav")
    wave, rate = sf.read(io.BytesIO(spoken.content), dtype="float32")
    wave = resample(wave.reshape(-1), int(rate), WIRE_RATE)
    pad = lambda s: np.zeros(int(s * WIRE_RATE), np.float32)  # noqa: E731
    sf.write(path, np.concatenate([pad(LEAD_S), wave, pad(TAIL_S)]), WIRE_RATE, subtype="PCM_16")


@pytest.mark.timeout(600)  # the assistant's start (vLLM) and a spoken turn on 2 cores
async def test_talk_hears_the_question_and_speaks_the_answer(srv: Server, tmp_path) -> None:
    mic = tmp_path / "question.wav"
    await question_wav(srv, mic)
    async with browser_page(srv.url + "/", fake_mic=mic, api_key=KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("talk-button").click()
        await page.wait_for_function("document.getElementById('talk-transcript').textContent.length > 0 "
                                     "&& window.__playground.talk.playedSeconds > 0.5")
        await page.wait_for_function("/paris/i.test(document.getElementById('talk-transcript').textContent)")
        heard = await page.get_by_test_id("talk-user").inner_text()
        await page.screenshot(path=str(tmp_path / "talk.png"))
        await page.get_by_test_id("talk-button").click()  # stop: the socket closes
        await page.wait_for_function("window.__playground.talk === null")
        assert bp.errors == [] and bp.refused == []
    assert normalize(heard)[:len(normalize(QUESTION))] == normalize(QUESTION), heard
    assert (tmp_path / "talk.png").stat().st_size > 0
    await eventually(lambda: srv.orch.statistics().requests_in_flight == 0, timeout_s=30)
    await eventually(lambda: idle(srv.orch), timeout_s=10)
