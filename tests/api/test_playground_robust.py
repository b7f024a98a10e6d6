"""The playground as a demanding user drives it, in real headless Chromium against real servers.

A chat answer the server fails mid-stream says so (not a silent half answer); a FLAC file is sent as
FLAC and a text file is refused before anything is sent; a network drop is said, the health pill reads
"unreachable" whichever tab is shown (a live region), and "healthy" once a request gets through again; at
320 px nothing scrolls sideways and the pipeline graph's words stay readable; the tabs are a tab list the arrow
keys, Home and End move through. A wrong key on Talk brings the key prompt before any socket opens; chat's
spoken answer offers the model's voices; a server listing no models says so. With two models served (`omni-run --model A --model B`),
a model switch ends the Talk session and its microphone and clears the last model's answers; a double
click on "Start talking" opens one realtime socket; a server that goes away ends the session and the
health pill says it is unreachable.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.api.test_pipelines import MultiRun
from tests.browser_support import browser_page

PROMPT = "Tell me something"
FAIL_AT_CHUNK = 3
"""The thinker fails each request at this chunk: after the stream's headers and its first words."""
STEP_DELAY_MS = 150
"""Time between the thinker's chunks: the route reads the first chunk (and sends the headers) well before
the failure, even on a loaded machine. (An error that comes before the first chunk is read drops the
unread chunks and is answered with its HTTP status instead: a 500 in the browser's console.)"""


def _tone(path: Path, seconds: float, rate: int = 24_000, subtype: str = "PCM_16") -> Path:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(path, (np.sin(2 * np.pi * 220 * t) * 0.3).astype(np.float32), rate, subtype=subtype)
    return path


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic") as server:
        yield server


@pytest.fixture(scope="module")
async def failing():
    async with serve("synthetic", stages=[{"stage_id": 0, "engine_extras": {"fail_on_chunk": FAIL_AT_CHUNK, "step_delay_ms": STEP_DELAY_MS}}]) as server:
        yield server


async def test_a_chat_answer_failed_mid_stream_shows_the_servers_error(failing: Server) -> None:
    async with browser_page(failing.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& document.getElementById('error').textContent !== ''")
        error = await page.get_by_test_id("error").inner_text()
        assert "fail" in error.lower(), error  # the server's in-band error, not a silently short answer
        assert bp.errors == [], bp.errors
    await eventually(lambda: idle(failing.orch), timeout_s=10)


async def test_chat_file_types_then_a_network_drop(srv: Server, tmp_path) -> None:
    flac = _tone(tmp_path / "question.flac", 0.5, subtype="PCM_16")
    notes = tmp_path / "notes.txt"
    notes.write_text("not audio")
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-file").set_input_files(flac)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& document.getElementById('chat-output').textContent !== ''")
        assert await page.get_by_test_id("error").is_hidden()  # it was read as FLAC, not refused as bad WAV
        posts = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        await page.get_by_test_id("chat-file").set_input_files(notes)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('error').textContent.includes('notes.txt')")
        assert "WAV, MP3 or FLAC" in await page.get_by_test_id("error").inner_text()
        assert posts == []  # said in the page, nothing sent

        await page.get_by_test_id("chat-file").set_input_files([])
        await page.context.set_offline(True)  # the network drops while the Chat tab is shown
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& document.getElementById('error').textContent.includes('did not answer')")
        assert await page.get_by_test_id("health").inner_text() == "unreachable"  # not "healthy" still
        assert await page.get_by_role("status").filter(has_text="unreachable").count() == 1  # a screen reader hears it
        await page.context.set_offline(False)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('health').textContent === 'healthy'")
        await page.wait_for_function("document.getElementById('chat-send').disabled === false")
        assert await page.get_by_test_id("error").is_hidden()
        assert await page.get_by_test_id("chat-output").inner_text() != ""
        assert [e for e in bp.errors if "ERR_INTERNET_DISCONNECTED" not in e] == [], bp.errors
        assert bp.refused == [], bp.refused
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_narrow_screen_and_keyboard_tabs(srv: Server, tmp_path) -> None:
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.set_viewport_size({"width": 320, "height": 640})
        await page.locator("body[data-ready=true]").wait_for()
        names = await page.get_by_role("tablist").get_by_role("tab").all_inner_texts()
        assert names == ["Talk", "Chat", "Speak", "Pipeline"], names
        for name in names:
            await page.get_by_role("tab", name=name).click()
            width = await page.evaluate("document.documentElement.scrollWidth")
            assert width <= 320, (name, width)  # nothing sticks out sideways
        await page.get_by_test_id("stage-2").wait_for()  # (the Pipeline tab, its graph drawn)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 320
        # The graph scrolls in its box rather than shrinking its words to specks.
        text = await page.evaluate("document.querySelector('[data-testid=stage-0-times]').getBoundingClientRect().height")
        assert text >= 9, text
        await page.screenshot(path=str(tmp_path / "narrow.png"), full_page=True)
        await page.get_by_role("tab", name="Chat").focus()
        await page.keyboard.press("ArrowRight")
        assert await page.get_by_role("tab", name="Speak").get_attribute("aria-selected") == "true"
        assert await page.get_by_role("tabpanel").get_attribute("id") == "panel-speak"
        assert await page.evaluate("document.activeElement.dataset.tab") == "speak"
        await page.keyboard.press("End")
        assert await page.evaluate("document.activeElement.dataset.tab") == "pipeline"
        assert await page.get_by_role("tabpanel").get_attribute("id") == "panel-pipeline"
        await page.keyboard.press("Home")
        assert await page.evaluate("document.activeElement.dataset.tab") == "talk"
        assert await page.get_by_role("tab", name="Talk").get_attribute("aria-selected") == "true"
        assert bp.errors == [], bp.errors


async def test_a_wrong_key_on_talk_asks_for_the_key_before_any_socket(srv: Server) -> None:
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        sockets = []
        page.on("websocket", lambda ws: sockets.append(ws))
        await page.locator("body[data-ready=true]").wait_for()
        await page.evaluate("window.__playground.key = 'wrong'")  # (the key stops working)
        await page.get_by_test_id("talk-button").click()
        await page.get_by_test_id("key-form").wait_for()  # the key prompt, not "the connection was refused"
        assert "not accepted" in await page.get_by_test_id("error").inner_text()
        assert await page.evaluate("document.activeElement.id") == "key-input"
        assert sockets == [] and await page.evaluate("window.__playground.talk") is None
        assert await page.get_by_test_id("talk-button").is_enabled()
        assert {path for _, path in bp.refused} == {"/v1/models"}, bp.refused


async def test_chat_offers_the_models_voices_for_its_spoken_answer(srv: Server) -> None:
    voices = ["nova", "echo"]

    async def with_voices(route) -> None:  # the synthetic model declares none: this one lists two
        resp = await route.fetch()
        body = await resp.json()
        for model in body["data"]:
            model["voices"] = voices
        await route.fulfill(response=resp, json=body)

    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.route("**/v1/models", with_voices)
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        assert await page.locator("#chat-voice option").all_inner_texts() == voices
        await page.get_by_test_id("chat-voice").select_option("echo")
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-speak").check()
        async with page.expect_request("**/v1/chat/completions") as sent:
            await page.get_by_test_id("chat-send").click()
        assert (await sent.value).post_data_json["audio"]["voice"] == "echo"  # not always "alloy"
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& !document.getElementById('chat-audio').hidden")
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_a_server_listing_no_models_says_so(srv: Server) -> None:
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.route("**/v1/models", lambda route: route.fulfill(json={"object": "list", "data": []}))
        await page.reload()
        await page.wait_for_function("document.getElementById('error').textContent.includes('lists no models')")
        assert await page.get_by_test_id("error").is_visible()
        assert bp.errors == [], bp.errors  # no uncaught TypeError (state.models[0])


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiRun]:
    run = MultiRun(tmp_path_factory.mktemp("two"), "--model", "synthetic", "--model", "synthetic_asr")
    try:
        run.wait_ready()
        yield run
    finally:
        if run.proc.poll() is None:
            run.stop()


MIC_LIVE = "window.__playground.talk?.stream?.getAudioTracks().some(t => t.readyState === 'live') ?? false"


async def test_model_switch_ends_talk_and_clears_answers_then_the_server_goes_away(two: MultiRun, tmp_path) -> None:
    mic = _tone(tmp_path / "mic.wav", 3.0)
    async with browser_page(two.url + "/", fake_mic=mic) as bp:
        page = bp.page
        sockets = []
        page.on("websocket", lambda ws: sockets.append(ws))
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& document.getElementById('chat-output').textContent !== ''")

        await page.get_by_test_id("tab-talk").click()
        await page.get_by_test_id("talk-button").dblclick()  # a double click: one session
        await page.wait_for_function("document.getElementById('talk-state').textContent === 'listening'")
        assert len(sockets) == 1, [ws.url for ws in sockets]
        assert await page.evaluate(MIC_LIVE)
        tracks = await page.evaluate_handle("window.__playground.talk.stream.getAudioTracks()")

        await page.get_by_test_id("model-select").select_option("synthetic_asr")  # no Talk tab there
        await page.wait_for_function("window.__playground.talk === null")
        await page.wait_for_function("ts => ts.every(t => t.readyState === 'ended')", arg=tracks)
        await eventually(lambda: all(ws.is_closed() for ws in sockets), timeout_s=10)
        await page.get_by_test_id("model-select").select_option("synthetic")
        await page.get_by_test_id("tab-chat").click()
        assert await page.get_by_test_id("chat-output").inner_text() == ""  # the last model's answer is gone
        assert await page.get_by_test_id("talk-button").inner_text() == "Start talking"

        await page.get_by_test_id("tab-talk").click()
        await page.get_by_test_id("talk-button").click()
        await page.wait_for_function("document.getElementById('talk-state').textContent === 'listening'")
        await page.get_by_test_id("tab-pipeline").click()
        await page.locator("[data-testid=stage-0]").wait_for()
        two.signal(signal.SIGTERM)  # the server goes away under the open session
        assert two.wait() == 0
        two.assert_clean(workers_timeout_s=15.0)
        await page.wait_for_function("window.__playground.talk === null")
        assert await page.get_by_test_id("talk-button").inner_text() == "Start talking"
        await page.wait_for_function("document.getElementById('health').textContent === 'unreachable'")
        assert await page.get_by_test_id("error").inner_text() != ""
        assert [e for e in bp.errors if "ERR_CONNECTION_REFUSED" not in e] == [], bp.errors
