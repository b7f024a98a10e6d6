"""The playground's Talk panel on a full-duplex model (tiny Moshi), in real headless Chromium.

The page opens a realtime session as it does for any model; a duplex session takes its
session.update (VAD off, whatever is asked), then answers while the fake microphone plays:
the model's audio plays continuously in one long response, and stopping ends the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from omni_actors.api.realtime.audio import WIRE_RATE
from tests.api.conftest import idle
from tests.api.realtime.conftest import RtServer, serve_rt
from tests.browser_support import browser_page
from tests.conftest import eventually

PLAYED_S = 1.0
"""Seconds of the model's audio the page must have played."""
CLOSE_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
async def srv(tiny_moshi: Path) -> AsyncIterator[RtServer]:
    stages = [{"stage_id": 0, "max_num_seqs": 2, "engine_extras": {"frame_budget": 0}}]
    async with serve_rt("moshi", model=str(tiny_moshi), stages=stages) as server:
        yield server


async def test_talk_on_a_duplex_model_plays_its_answer_while_the_user_talks(srv: RtServer, tmp_path) -> None:
    mic = tmp_path / "voice.wav"
    voice = (np.random.default_rng(3).standard_normal(4 * WIRE_RATE) * 0.2).astype(np.float32)
    sf.write(mic, voice, WIRE_RATE, subtype="PCM_16")
    async with browser_page(srv.url + "/", fake_mic=mic, api_key=srv.key) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        tabs = await page.locator("#tabs button").all_inner_texts()
        assert "Talk" in tabs and "Chat" not in tabs  # a duplex model is served only as realtime sessions
        await page.get_by_test_id("talk-button").click()
        await page.wait_for_function(f"window.__playground.talk && window.__playground.talk.playedSeconds >= {PLAYED_S}")
        assert await page.get_by_test_id("talk-state").inner_text() == "speaking"
        assert srv.stats().duplex.sessions_live == 1
        await page.screenshot(path=str(tmp_path / "talk-duplex.png"))
        await page.get_by_test_id("talk-button").click()  # stop: the socket closes
        await page.wait_for_function("window.__playground.talk === null")
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and idle(srv.orch), CLOSE_TIMEOUT_S)
