"""The playground as a demanding user drives it, second round: keys, model switches mid-answer, errors.

Against `omni-run --deploy` serving two pipelines in real headless Chromium: Shift+Enter is a new line
and Enter sends; Escape with nothing running does nothing, and ends a Talk session; a model switch
mid-answer ends the request on the server too (`/v1/status`), without a "stopped" note; a request
that fails while another tab is shown keeps its error with its own panel (the tab is marked) instead
of showing it under the wrong one; a click with nothing to send says what is missing; "spoken answer"
is offered only for a model that speaks. Record: a double
click records once (the second click does not stop a microphone still opening), a Stop then
Transcribe in the same tick sends the clip just recorded, and Escape ends a recording as its Stop does.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.api.conftest import eventually
from tests.api.test_pipelines import MultiRun
from tests.browser_support import browser_page

STEP_MS = 30
WORDS = 150
"""`slow` answers WORDS words, one every STEP_MS: 4.5 s whole."""
FAIL_AT = 20
"""`broken` fails each answer at this word, after its headers and first words."""
ENDED_IN_S = 1.0


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiRun]:
    tmp = tmp_path_factory.mktemp("two")
    deploy = tmp / "two.json"  # (YAML is a superset of JSON)
    deploy.write_text(json.dumps({"pipelines": [
        {"pipeline": "synthetic", "served_model_name": "slow",
         "stages": [{"stage_id": 0, "engine_extras": {"chunks": WORDS, "step_delay_ms": STEP_MS}}]},
        {"pipeline": "synthetic_text", "served_model_name": "broken",
         "stages": [{"stage_id": 0, "engine_extras": {"chunks": WORDS, "step_delay_ms": STEP_MS,
                                                      "fail_on_chunk": FAIL_AT}}]},
        {"pipeline": "synthetic_asr", "served_model_name": "asr"},
    ]}))
    run = MultiRun(tmp, "--deploy", str(deploy))
    try:
        run.wait_ready()
        yield run
    finally:
        if run.proc.poll() is None:
            run.stop()


def _in_flight(run: MultiRun, model: str) -> int:
    with urllib.request.urlopen(f"{run.url}/v1/status") as resp:
        status = json.load(resp)
    (pipeline,) = [p for p in status["pipelines"] if model in p["models"]]
    return pipeline["requests_in_flight"]


async def test_keys_model_switch_mid_answer_and_errors_kept_with_their_panel(two: MultiRun, tmp_path: Path) -> None:
    mic = tmp_path / "silence.wav"
    sf.write(mic, np.zeros(24_000, np.float32), 24_000, subtype="PCM_16")
    async with browser_page(two.url + "/", fake_mic=mic) as bp:
        page = bp.page
        posts: list[str] = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        await page.locator("body[data-ready=true]").wait_for()
        # Each pipeline once, by its served name: its pipeline's own name (in /v1/models too) is not another model.
        assert await page.locator("#model option").all_inner_texts() == ["slow", "broken", "asr"]
        await page.get_by_test_id("model-select").select_option("slow")

        # Talk: Escape ends the session as its Stop does.
        await page.get_by_test_id("talk-button").click()
        await page.wait_for_function("document.getElementById('talk-state').textContent === 'listening'")
        await page.keyboard.press("Escape")
        await page.wait_for_function("window.__playground.talk === null")
        assert await page.get_by_test_id("talk-button").inner_text() == "Start talking"

        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-send").click()  # nothing typed: said, and the prompt gets the focus
        assert "type a question" in await page.get_by_test_id("chat-note").inner_text()
        assert await page.evaluate("document.activeElement.id") == "chat-input"
        await page.keyboard.type("Tell me")
        await page.keyboard.press("Shift+Enter")  # a new line, not a send
        await page.keyboard.type("something")
        assert await page.get_by_test_id("chat-input").input_value() == "Tell me\nsomething"
        assert posts == []
        await page.keyboard.press("Escape")  # nothing running: nothing happens
        await page.keyboard.press("Enter")
        await page.wait_for_function("document.getElementById('chat-output').textContent.split(' ').length >= 5")
        assert await page.get_by_test_id("chat-note").inner_text() == ""
        assert _in_flight(two, "slow") == 1

        # A model switch mid-answer: the page is ready for the new model at once, the server ends the old answer.
        await page.get_by_test_id("chat-speak").check()  # this model speaks: a spoken answer is offered
        await page.get_by_test_id("model-select").select_option("broken")
        t0 = time.monotonic()
        await page.get_by_test_id("tab-chat").click()
        assert await page.get_by_test_id("chat-send").is_enabled() and await page.get_by_test_id("chat-stop").is_hidden()
        assert await page.get_by_test_id("chat-output").inner_text() == ""
        assert await page.get_by_test_id("chat-note").inner_text() == ""  # not a stop of the user's
        # a text model: no spoken answer to ask for (the send below fails at its word, not as a 400 for audio)
        assert await page.get_by_test_id("chat-speak").is_hidden()
        await eventually(lambda: _in_flight(two, "slow") == 0, ENDED_IN_S)
        assert time.monotonic() - t0 < WORDS * STEP_MS / 1000 / 2

        # A failure while another tab is shown stays with its panel: not shown under Pipeline, its tab marked.
        await page.get_by_test_id("chat-input").fill("Tell me something")
        await page.get_by_test_id("chat-send").click()
        await page.get_by_test_id("tab-pipeline").click()
        await page.wait_for_function("document.querySelector('[data-tab=chat]').classList.contains('failed')")
        assert await page.get_by_test_id("error").is_hidden()
        await page.screenshot(path=str(tmp_path / "failed-elsewhere.png"))
        await page.get_by_test_id("tab-chat").click()
        assert "synthetic failure" in await page.get_by_test_id("error").inner_text()
        assert not await page.evaluate("document.querySelector('[data-tab=chat]').classList.contains('failed')")
        assert len((await page.get_by_test_id("chat-output").inner_text()).split()) == FAIL_AT  # its words stay
        assert await page.get_by_test_id("chat-send").is_enabled()
        await page.get_by_test_id("chat-send").click()  # a new try clears the old error
        await page.wait_for_function("document.getElementById('error').hidden")
        await page.wait_for_function("document.getElementById('error').textContent.includes('synthetic failure')")
        assert [e for e in bp.errors if "status of" not in e] == [], bp.errors


MIC_OPEN = "window.__mics.some(s => s.getAudioTracks().some(t => t.readyState === 'live'))"
# Every microphone stream the page opens.
COUNT_MICS = """(() => {
  window.__mics = [];
  const open = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  navigator.mediaDevices.getUserMedia = async (c) => { const s = await open(c); window.__mics.push(s); return s; };
})();"""


async def test_record_double_click_then_stop_and_transcribe_at_once(two: MultiRun, tmp_path: Path) -> None:
    mic = tmp_path / "tone.wav"
    t = np.arange(3 * 24_000) / 24_000
    sf.write(mic, (np.sin(2 * np.pi * 220 * t) * 0.3).astype(np.float32), 24_000, subtype="PCM_16")
    async with browser_page(two.url + "/", fake_mic=mic) as bp:
        page = bp.page
        await page.add_init_script(COUNT_MICS)
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("model-select").select_option("asr")
        await page.get_by_test_id("tab-transcribe").click()
        await page.get_by_test_id("transcribe-record").dblclick()  # one recording, still running
        await page.wait_for_function("parseFloat((document.getElementById('transcribe-file-recorded')"
                                     ".textContent.match(/[0-9.]+/) || ['0'])[0]) >= 0.5")
        assert await page.get_by_test_id("transcribe-record").inner_text() == "Stop"
        assert await page.evaluate("window.__mics.length") == 1
        # Stop, and Transcribe before the microphone has even closed: the clip is sent, not "pick a file".
        await page.evaluate("document.getElementById('transcribe-file-record').click();"
                            "document.getElementById('transcribe-button').click()")
        assert (await page.get_by_test_id("transcribe-recorded").inner_text()).startswith("recorded ")
        await page.wait_for_function("document.getElementById('transcribe-button').disabled === false "
                                     "&& document.getElementById('transcribe-output').textContent !== ''")
        assert "samples at" in await page.get_by_test_id("transcribe-output").inner_text()
        assert await page.get_by_test_id("error").is_hidden()
        assert not await page.evaluate(MIC_OPEN)
        # Escape ends a recording as its Stop does (the microphone closed, the clip kept).
        await page.get_by_test_id("transcribe-record").click()
        await page.wait_for_function(MIC_OPEN)
        await page.wait_for_function("document.getElementById('transcribe-file-record').textContent === 'Stop'")
        await page.keyboard.press("Escape")
        assert await page.get_by_test_id("transcribe-record").inner_text() == "Record"
        assert (await page.get_by_test_id("transcribe-recorded").inner_text()).startswith("recorded ")
        await page.wait_for_function(f"!({MIC_OPEN})")
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
