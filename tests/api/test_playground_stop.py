"""Stop in the playground, in real headless Chromium against real servers (synthetic pipelines).

Each panel's Stop (or Escape) aborts its request: the page is ready again at once with a "stopped"
note and what already streamed, the server ends the request in every stage long before the answer
would have (the orchestrator's in-flight count, the engines' held requests, its aborted count), and
the next request runs whole. Speech Stop also silences what is still queued to play. A stop before the
first byte, then a new request in the same tick, gets the new answer and nothing of the old one.
"""

from __future__ import annotations

import asyncio
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.browser_support import browser_page

PROMPT = "Tell me something"
WORD_STEP_MS = 30
WORDS = 150
"""A chat answer of WORDS words, one every WORD_STEP_MS: 4.5 s to stream whole."""
SAMPLES_PER_WORD = 12_000
"""Speech: half a second of audio per word (24 kHz), so it plays on long after it has streamed."""
ABORTED_IN_S = 1.0
"""Longest a Stop may take to end the request in the orchestrator (the answer needs WORDS * WORD_STEP_MS)."""
IDLE_IN_S = 2.0
"""... and in every stage's engine (a synthetic step is at most FIRST_STEP_MS)."""
FIRST_STEP_MS = 1500
"""`first_slow`: each step, so the first byte comes only after this."""

READY = ("!document.getElementById('{p}-stop').checkVisibility() "
         "&& document.getElementById('{b}').disabled === false")

# Every sound the page starts and has not ended yet (a stopped one ends at once).
SOUNDING = """(() => {
  window.__sounding = new Set();
  const start = AudioBufferSourceNode.prototype.start;
  AudioBufferSourceNode.prototype.start = function (...args) {
    window.__sounding.add(this);
    this.addEventListener("ended", () => window.__sounding.delete(this));
    return start.apply(this, args);
  };
})();"""


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", stages=[
        {"stage_id": 0, "engine_extras": {"chunks": WORDS, "step_delay_ms": WORD_STEP_MS}},
        {"stage_id": 2, "engine_extras": {"samples": SAMPLES_PER_WORD}},
    ]) as server:
        yield server


@pytest.fixture(scope="module")
async def first_slow():
    async with serve("synthetic", stages=[{"stage_id": 0, "engine_extras": {"step_delay_ms": FIRST_STEP_MS}}]) as server:
        yield server


async def _ready(page, panel: str, button: str) -> None:
    await page.wait_for_function(READY.format(p=panel, b=button))


async def _ended_early(srv: Server, aborted_before: int) -> None:
    """The server ended the request (not the client only): at once in the orchestrator, then in every engine."""
    t0 = time.monotonic()
    await eventually(lambda: srv.orch.statistics().requests_in_flight == 0, ABORTED_IN_S)
    await eventually(lambda: idle(srv.orch), IDLE_IN_S)
    assert srv.orch.statistics().requests_aborted == aborted_before + 1
    assert time.monotonic() - t0 < WORDS * WORD_STEP_MS / 1000


async def test_chat_stop_keeps_the_words_so_far_and_frees_the_server(srv: Server, tmp_path) -> None:
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        assert await page.get_by_test_id("chat-stop").is_hidden()  # nothing to stop yet
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-output').textContent.split(' ').length >= 5")
        assert await page.get_by_test_id("chat-send").is_disabled()
        aborted = srv.orch.statistics().requests_aborted
        await page.get_by_test_id("chat-stop").click()
        await _ready(page, "chat", "chat-send")
        assert await page.get_by_test_id("chat-note").inner_text() == "stopped"
        assert await page.get_by_test_id("error").is_hidden()  # a stop is not an error
        await _ended_early(srv, aborted)
        kept = await page.get_by_test_id("chat-output").inner_text()
        assert 5 <= len(kept.split()) < WORDS, kept  # what had streamed stays, and no more came
        await asyncio.sleep(0.3)
        assert await page.get_by_test_id("chat-output").inner_text() == kept
        await page.screenshot(path=str(tmp_path / "chat-stopped.png"))

        # The next request runs whole; the note goes with the new request.
        await page.get_by_test_id("chat-send").click()
        assert await page.get_by_test_id("chat-note").inner_text() == ""
        await _ready(page, "chat", "chat-send")
        assert len((await page.get_by_test_id("chat-output").inner_text()).split()) == WORDS
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_speak_stop_mid_stream_and_while_it_still_plays(srv: Server) -> None:
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.add_init_script(SOUNDING)
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-speak").click()
        await page.get_by_test_id("speak-input").fill(PROMPT)
        await page.get_by_test_id("speak-button").click()
        await page.wait_for_function("window.__sounding.size >= 3")  # playing while it streams
        aborted = srv.orch.statistics().requests_aborted
        await page.keyboard.press("Escape")  # the keyboard's Stop
        await _ready(page, "speak", "speak-button")
        await page.wait_for_function("window.__sounding.size === 0")  # silenced, not left to play out
        assert await page.get_by_test_id("speak-note").inner_text() == "stopped"
        await _ended_early(srv, aborted)
        seconds = float(await page.evaluate("document.getElementById('speak-audio').dataset.seconds"))
        assert 0 < seconds < WORDS * SAMPLES_PER_WORD / 24_000  # what came, kept as a clip to play again

        # Streamed whole, it plays on: Speak is free again, Stop stays until the voice ends or is stopped.
        await page.get_by_test_id("speak-button").click()
        await page.wait_for_function("document.getElementById('speak-button').disabled === false")
        assert await page.get_by_test_id("speak-stop").is_visible()
        assert await page.evaluate("window.__sounding.size") > 0
        await page.get_by_test_id("speak-stop").click()
        await page.wait_for_function("window.__sounding.size === 0")
        await _ready(page, "speak", "speak-button")
        assert await page.get_by_test_id("speak-note").inner_text() == "stopped"
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_stop_before_the_first_byte_then_a_new_request_at_once(first_slow: Server) -> None:
    expected = await first_slow.client().chat.completions.create(
        model="synthetic", messages=[{"role": "user", "content": "one two three four"}])
    async with browser_page(first_slow.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        posts: list[str] = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-input").press("Enter")  # Enter sends
        await eventually(lambda: first_slow.orch.statistics().requests_in_flight == 1, 10)
        assert await page.get_by_test_id("chat-output").inner_text() == ""  # no byte of the answer yet
        aborted = first_slow.orch.statistics().requests_aborted
        # Stop and send the next question in the same tick: the old answer must not leak into the new one.
        await page.get_by_test_id("chat-input").fill("one two three four")
        await page.evaluate("document.getElementById('chat-stop').click(); document.getElementById('chat-send').click()")
        await eventually(lambda: first_slow.orch.statistics().requests_aborted == aborted + 1, ABORTED_IN_S)
        await page.wait_for_function("document.getElementById('chat-output').textContent !== ''")
        await _ready(page, "chat", "chat-send")
        assert await page.get_by_test_id("chat-output").inner_text() == expected.choices[0].message.content
        assert await page.get_by_test_id("chat-note").inner_text() == ""
        assert await page.get_by_test_id("error").is_hidden()
        assert len(posts) == 2, posts
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(first_slow.orch), timeout_s=10)


IMAGE_STEP_MS = 100
IMAGE_STEPS = 100


@pytest.fixture(scope="module")
async def image_srv():
    async with serve("synthetic_image", stages=[{"stage_id": 0, "engine_extras": {"step_delay_ms": IMAGE_STEP_MS}}]) as server:
        yield server


async def test_image_stop_keeps_the_bar_where_it_got_to(image_srv: Server) -> None:
    async with browser_page(image_srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("image-prompt").fill("a red square")
        await page.get_by_test_id("image-size").fill("32x32")
        await page.get_by_test_id("image-steps").fill(str(IMAGE_STEPS))
        await page.get_by_test_id("image-button").dblclick()  # a double click: one request
        bar = "document.getElementById('image-progress')"
        await page.wait_for_function(f"Number({bar}.dataset.steps || 0) >= 3")
        aborted = image_srv.orch.statistics().requests_aborted
        await page.get_by_test_id("image-stop").click()
        await _ready(page, "image", "image-button")
        t0 = time.monotonic()
        await eventually(lambda: image_srv.orch.statistics().requests_in_flight == 0, ABORTED_IN_S)
        await eventually(lambda: idle(image_srv.orch), IDLE_IN_S)
        assert time.monotonic() - t0 < IMAGE_STEPS * IMAGE_STEP_MS / 1000 / 2
        assert image_srv.orch.statistics().requests_aborted == aborted + 1
        assert await page.get_by_test_id("image-status").inner_text() == "stopped"
        assert await page.evaluate(f"!{bar}.matches(':indeterminate') && {bar}.value > 0 && {bar}.value < 0.95")

        await page.get_by_test_id("image-steps").fill("3")
        await page.get_by_test_id("image-steps").press("Enter")  # Enter in a field sends too
        await page.wait_for_function(f"{bar}.value === 1")
        await _ready(page, "image", "image-button")
        assert await page.locator("#image-result img").count() == 1
        assert await page.get_by_test_id("image-status").inner_text() == ""
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(image_srv.orch), timeout_s=10)


ASR_CHUNKS = 150


@pytest.fixture(scope="module")
async def asr_srv():
    async with serve("synthetic_asr", stages=[{"stage_id": 0, "engine_extras": {"chunks": ASR_CHUNKS,
                                                                                "step_delay_ms": WORD_STEP_MS}}]) as server:
        yield server


def _clip(path: Path, seconds: float = 0.5, rate: int = 16_000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.sin(np.arange(int(seconds * rate)) * 0.05) * 8000).astype("<i2").tobytes())
    return path


async def test_transcribe_stop_keeps_the_words_heard(asr_srv: Server, tmp_path) -> None:
    clip = _clip(tmp_path / "clip.wav")
    async with browser_page(asr_srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-transcribe").click()
        await page.get_by_test_id("transcribe-file").set_input_files(clip)
        await page.get_by_test_id("transcribe-button").click()
        await page.wait_for_function("document.getElementById('transcribe-output').textContent !== ''")
        aborted = asr_srv.orch.statistics().requests_aborted
        await page.get_by_test_id("transcribe-stop").click()
        await _ready(page, "transcribe", "transcribe-button")
        t0 = time.monotonic()
        await eventually(lambda: asr_srv.orch.statistics().requests_in_flight == 0, ABORTED_IN_S)
        await eventually(lambda: idle(asr_srv.orch), IDLE_IN_S)
        assert time.monotonic() - t0 < ASR_CHUNKS * WORD_STEP_MS / 1000 / 2
        assert asr_srv.orch.statistics().requests_aborted == aborted + 1
        assert await page.get_by_test_id("transcribe-note").inner_text() == "stopped"
        heard = await page.get_by_test_id("transcribe-output").inner_text()
        assert "samples at" in heard  # the words so far stay
        assert not await page.evaluate("document.getElementById('transcribe-output').classList.contains('live')")

        await page.get_by_test_id("transcribe-button").click()
        await _ready(page, "transcribe", "transcribe-button")
        assert await page.get_by_test_id("transcribe-output").inner_text() == heard
        assert await page.get_by_test_id("transcribe-note").inner_text() == ""
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(asr_srv.orch), timeout_s=10)


VIDEO_STEPS = 1000
"""About 18 s of denoising on two cores, for the tiny Wan2.2 at 32x32."""
VIDEO_IDLE_IN_S = 5.0
"""Longest the worker may take to drop a deleted job (its step in flight, on busy cores)."""
JOB_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    from tests.api.model_server import serve_tiny

    yield from serve_tiny(tmp_path_factory.mktemp("wan"), "wan2_2")


async def _until_idle(client, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.get("/status", cast_to=object)
        if all(s["in_flight"] == 0 and s["engine_requests"] == 0 for s in status["stages"]):
            return
        assert time.monotonic() < deadline, status["stages"]
        await asyncio.sleep(0.1)


def _is_create(response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/v1/videos")


@pytest.mark.slow  # (default-suite budget: the slow run, `-m slow`, keeps it)
async def test_video_stop_deletes_the_job_on_the_server(wan, tmp_path) -> None:
    import openai

    client = wan.client()
    async with browser_page(wan.url + "/") as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-videos").click()
        await page.get_by_test_id("video-prompt").fill("a boat at sea")
        await page.get_by_test_id("video-size").fill("32x32")
        await page.get_by_test_id("video-seconds").fill("0.25")
        await page.get_by_test_id("video-steps").fill(str(VIDEO_STEPS))
        async with page.expect_response(_is_create) as created:
            await page.get_by_test_id("video-button").click()
        job = await (await created.value).json()
        await page.wait_for_function("document.getElementById('video-progress').value > 0", timeout=JOB_TIMEOUT_MS)
        await page.get_by_test_id("video-stop").click()
        await _ready(page, "video", "video-button")  # ready at once; the server's job ends between steps
        await page.wait_for_function("document.getElementById('video-status').textContent === 'stopped'")
        assert await page.evaluate("sessionStorage.getItem('omni-actors.video-job')") is None  # (a reload follows nothing)
        assert await page.evaluate("document.getElementById('video-progress').value") < 50  # far from done
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(job["id"])  # deleted, its work aborted
        assert not any("video.completed" in line and job["id"] in line for line in wan.lines)
        # The DELETE answered once the run ended in the orchestrator; the worker drops it after its step.
        await _until_idle(client, VIDEO_IDLE_IN_S)

        # Stopped while the create is still on its way: the job it makes is deleted once the page hears of it.
        held: asyncio.Queue = asyncio.Queue()
        await page.route("**/v1/videos", lambda route: held.put_nowait(route) if route.request.method == "POST"
                         else route.continue_())
        await page.get_by_test_id("video-button").click()
        route = await asyncio.wait_for(held.get(), 30)
        await page.keyboard.press("Escape")
        await _ready(page, "video", "video-button")
        assert await page.get_by_test_id("video-status").inner_text() == "stopping…"
        async with page.expect_response(lambda r: r.request.method == "DELETE") as deleted:
            await route.continue_()
        assert (await deleted.value).status == 200
        await page.wait_for_function("document.getElementById('video-status').textContent === 'stopped'")
        assert await page.evaluate("sessionStorage.getItem('omni-actors.video-job')") is None
        await page.unroute("**/v1/videos")
        assert client.videos.list().data == []

        # The next job runs whole and plays.
        await page.get_by_test_id("video-steps").fill("12")
        await page.get_by_test_id("video-button").click()
        await page.wait_for_function("!document.getElementById('video-result').hidden", timeout=JOB_TIMEOUT_MS)
        assert await page.get_by_test_id("video-status").inner_text() == "completed"
        await page.screenshot(path=str(tmp_path / "video-after-stop.png"))
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    assert [v.status for v in client.videos.list().data] == ["completed"]
