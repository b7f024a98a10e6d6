"""The playground under its own Content-Security-Policy (as a user's browser holds it: the other browser
tests bypass it), and the Pipeline tab of a stage with two replicas: each replica drawn, the stage's limit
the one admission applies (each replica's queue limit times its replicas), a killed replica's restart
shown live. Talk, Chat (spoken answer) and Speak run under the CSP with no console error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.browser_support import browser_page

REPLICAS = 2
MAX_QUEUE = 3
"""Stage 0's queue limit per replica: the stage admits MAX_QUEUE * REPLICAS before a 429."""
RESTART_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", stages=[{"stage_id": 0, "num_replicas": REPLICAS, "max_queue": MAX_QUEUE}]) as server:
        yield server


async def test_panels_under_the_csp_and_a_replica_restart_seen_live(srv: Server, tmp_path: Path) -> None:
    mic = tmp_path / "silence.wav"
    sf.write(mic, np.zeros(24_000, np.float32), 24_000, subtype="PCM_16")
    async with browser_page(srv.url + "/", fake_mic=mic, api_key=API_KEY, enforce_csp=True) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        # Talk: the microphone's worklet (a module from this server) and the socket start under the CSP.
        await page.get_by_test_id("talk-button").click()
        await page.locator("[data-testid=talk-state]:text-is('listening')").wait_for()
        await page.get_by_test_id("talk-button").click()
        await page.locator("[data-testid=talk-state]:text-is('idle')").wait_for()
        # Chat's spoken answer and Speak's clip are blob: players.
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill("Tell me something")
        await page.get_by_test_id("chat-speak").check()
        await page.get_by_test_id("chat-send").click()
        await page.locator("[data-testid=chat-audio]:not([hidden])").wait_for()
        await page.get_by_test_id("tab-speak").click()
        await page.get_by_test_id("speak-input").fill("Hello from the playground.")
        await page.get_by_test_id("speak-button").click()
        await page.locator("[data-testid=speak-audio][data-seconds]:not([hidden])").wait_for()
        assert await page.evaluate("document.getElementById('speak-audio').src.startsWith('blob:')")

        await page.get_by_test_id("tab-pipeline").click()
        await page.get_by_test_id(f"replica-0-{REPLICAS - 1}").wait_for()
        assert await page.locator("#pipeline-graph .replica.ready").count() == REPLICAS + 2
        # The stage's limit is what admission applies: each replica's queue limit, times its replicas.
        label = await page.get_by_test_id("stage-0").get_attribute("aria-label")
        assert f"in flight 0 / limit {MAX_QUEUE * REPLICAS}," in label, label
        assert await page.locator("#pipeline-graph [data-field=load]").first.text_content() == \
            f"in flight 0 / limit {MAX_QUEUE * REPLICAS}"

        # A replica's worker dies: the supervisor restarts it, and the graph says so by that replica.
        (dead,) = [r.pid for r in srv.orch.statistics().stages[0].replicas if r.replica == REPLICAS - 1]
        os.kill(dead, signal.SIGKILL)
        await eventually(lambda: srv.orch.statistics().stages[0].replicas[REPLICAS - 1].restarts == 1
                         and srv.orch.statistics().stages[0].healthy, timeout_s=RESTART_TIMEOUT_S)
        restarted = page.locator(f"[data-testid=replica-0-{REPLICAS - 1}][aria-label*='ready,'][aria-label*='1 restarts']")
        await restarted.wait_for()  # (the tab's next refresh)
        assert f"pid {dead}," not in await restarted.get_attribute("aria-label")
        assert "0 restarts" in await page.get_by_test_id("replica-0-0").get_attribute("aria-label")
        await page.locator("[data-testid=health]:text-is('healthy')").wait_for()
        await page.screenshot(path=str(tmp_path / "pipeline-replicas.png"))
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    assert (tmp_path / "pipeline-replicas.png").stat().st_size > 0
    await eventually(lambda: idle(srv.orch), timeout_s=10)
