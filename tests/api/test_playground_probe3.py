"""The playground as a demanding user drives it, third round: a phone's width, names, long answers, restarts.

In real headless Chromium against real servers. At 375 px the Videos, Images and Speak panels (the custom
voice form open) fit: nothing scrolls sideways, every field stays inside its card at a readable size, and a
long unbroken word (a file name) wraps; tabs, panels, progress bars and a failed tab have names a screen
reader reads (not "Chat !"). A long answer keeps its newest words in view as it streams, unless the reader
scrolled up to read. A server restarted mid-session refuses a request while it loads (503 "loading"): the
page shows the load and sends it again once loaded, instead of an error under a pill reading "healthy"; its
Pipeline tab meanwhile reads "loading" too, not "degraded".
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.browser_support import browser_page
from tests.shutdown_support import HELD, STAGES, STARTING_LINE, OmniRun, hooked, release

WIDTH = 375
WORDS = 200
STEP_MS = 6
"""The answer: WORDS words (more than a phone's screen holds), one every STEP_MS (1.2 s whole)."""
READABLE_PX = 14
LONG_NAME = "a_recording_named_by_a_phone_" + "x" * 80 + ".txt"

FITS = """([panel, readable]) => {
  const card = document.getElementById(panel).getBoundingClientRect();
  const out = [];
  for (const el of document.querySelectorAll(`#${panel} input, #${panel} select, #${panel} textarea, #${panel} button`)) {
    if (!el.offsetParent) continue;  // (not shown)
    const r = el.getBoundingClientRect(), size = parseFloat(getComputedStyle(el).fontSize);
    if (r.left < card.left || r.right > card.right || size < readable) out.push(`${el.id} ${r.left}-${r.right} ${size}px`);
  }
  return { sideways: document.documentElement.scrollWidth, out };
}"""
"""Controls of a panel outside its card, or smaller than READABLE_PX; how wide the page scrolls."""


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", stages=[{"stage_id": 0, "engine_extras": {"chunks": WORDS, "step_delay_ms": STEP_MS}}]) as server:
        yield server


async def every_output(route) -> None:
    """The synthetic model as one that also makes images and videos and clones voices (layout only)."""
    resp = await route.fetch()
    body = await resp.json()
    for model in body["data"]:
        model["output_types"] = [*model["output_types"], "image", "video"]
        model["custom_voices"] = True
    await route.fulfill(response=resp, json=body)


async def test_videos_images_and_voices_fit_a_phone_and_everything_has_a_name(srv: Server, tmp_path: Path) -> None:
    notes = tmp_path / LONG_NAME
    notes.write_text("not audio")
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.set_viewport_size({"width": WIDTH, "height": 700})
        await page.route("**/v1/models", every_output)
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-videos").click()
        assert await page.get_by_role("tabpanel", name="Videos").is_visible()
        assert await page.get_by_role("progressbar", name="video progress").count() == 1
        fits = await page.evaluate(FITS, ["panel-videos", READABLE_PX])
        assert fits == {"sideways": WIDTH, "out": []}, fits
        await page.screenshot(path=str(tmp_path / "videos-375.png"), full_page=True)

        await page.get_by_test_id("tab-images").click()
        assert await page.get_by_role("progressbar", name="image progress").count() == 1
        fits = await page.evaluate(FITS, ["panel-images", READABLE_PX])
        assert fits == {"sideways": WIDTH, "out": []}, fits

        await page.get_by_test_id("tab-speak").click()
        await page.get_by_test_id("speak-clone").locator("summary").click()  # the custom voice form, open
        await page.get_by_test_id("clone-transcript").wait_for()
        fits = await page.evaluate(FITS, ["panel-speak", READABLE_PX])
        assert fits == {"sideways": WIDTH, "out": []}, fits
        await page.screenshot(path=str(tmp_path / "voices-375.png"), full_page=True)
        # By keyboard: Enter in the form's fields makes the voice; what is missing is said by its button, and
        # the focus goes there (not an error at the foot of the page, the focus left behind).
        await page.get_by_test_id("clone-name").focus()
        await page.keyboard.press("Enter")
        assert await page.get_by_test_id("clone-status").inner_text() == "a custom voice needs a name"
        assert await page.evaluate("document.activeElement.id") == "clone-name"
        await page.keyboard.type("hum")
        await page.keyboard.press("Enter")
        assert "needs a reference clip" in await page.get_by_test_id("clone-status").inner_text()
        assert await page.evaluate("document.activeElement.id") == "clone-sample"
        assert await page.get_by_test_id("error").is_hidden()

        # A message with a long unbroken word (the file's name) wraps instead of pushing the page sideways,
        # and the failed tab's name says it has an error (the red "!" is not read out).
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill("Tell me something")
        await page.get_by_test_id("chat-file").set_input_files(notes)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('error').textContent.includes('.txt')")
        assert await page.evaluate("document.documentElement.scrollWidth") == WIDTH
        await page.get_by_test_id("tab-speak").click()
        chat = page.get_by_role("tab", name="Chat", exact=True)
        assert await chat.count() == 1, await page.get_by_role("tablist").aria_snapshot()
        assert await chat.get_attribute("aria-description") == "has an error"

        # A key that stops working on a panel other than Talk: asked for again, then back on that panel.
        await page.get_by_test_id("tab-images").click()
        await page.get_by_test_id("image-prompt").fill("a red square")
        await page.evaluate("window.__playground.key = 'revoked'")
        await page.keyboard.press("Enter")  # (from the prompt, a keyboard's send)
        await page.get_by_test_id("key-form").wait_for()
        assert await page.evaluate("document.activeElement.id") == "key-input"
        assert "not accepted" in await page.get_by_test_id("error").inner_text()
        assert await page.get_by_test_id("image-button").is_enabled()  # not left busy
        await page.keyboard.type(API_KEY)
        await page.keyboard.press("Enter")
        await page.wait_for_function("document.getElementById('error').hidden")
        assert await page.get_by_role("tabpanel").get_attribute("id") == "panel-images"
        assert await page.get_by_test_id("image-prompt").input_value() == "a red square"  # what was typed stays
        assert await page.evaluate("document.activeElement.id") == "image-prompt"  # the focus back where it was
        assert await page.get_by_test_id("key-form").is_hidden()
        assert bp.refused == [(401, "/v1/images/generations")], bp.refused
        assert [e for e in bp.errors if "status of 401" not in e] == [], bp.errors


async def test_a_long_answer_keeps_its_end_in_view_unless_the_reader_scrolled_up(srv: Server) -> None:
    end = "document.getElementById('chat-output').getBoundingClientRect().bottom"
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.set_viewport_size({"width": WIDTH, "height": 640})
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill("a long answer " + "y" * 120)  # (a word wider than the page)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false")
        assert len((await page.get_by_test_id("chat-output").inner_text()).split()) == WORDS
        bottom = await page.evaluate(end)
        assert 0 < bottom <= await page.evaluate("window.innerHeight"), bottom  # the answer's end is in view
        assert await page.evaluate("document.documentElement.scrollWidth") == WIDTH

        # The reader scrolls up to read while it streams: the page stays where they are.
        await page.evaluate("window.scrollTo(0, 0)")
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("window.scrollY > 100")  # (following the answer as it grows)
        await page.evaluate("window.scrollTo(0, 0)")
        await page.wait_for_function("document.getElementById('chat-send').disabled === false")
        assert await page.evaluate("window.scrollY") == 0
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)


PILL_WORDS = """(() => {
  const pill = document.getElementById("health");
  window.__pill = [];
  new MutationObserver(() => window.__pill.push(pill.textContent)).observe(pill, { childList: true, characterData: true, subtree: true });
})()"""
"""Every word the health pill says from now on, in `window.__pill` (none while it keeps saying the same)."""


@pytest.fixture
def restarted(tmp_path: Path):
    """A running `omni-run`; `.restart()` stops it and starts one on the same port whose talker is held
    loading until `release(fifo)`."""
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    runs = [OmniRun(tmp_path, STAGES)]

    def restart() -> OmniRun:
        runs[0].signal(signal.SIGTERM)
        assert runs[0].wait() == 0, runs[0].output
        runs[0].assert_clean(workers_timeout_s=15.0)
        runs.append(OmniRun(tmp_path, hooked(tmp_path, HELD.format(line=STARTING_LINE, fifo=str(fifo))),
                            port=runs[0].port))
        runs[-1].wait_for(r"server\.listening")
        runs[-1].wait_for(STARTING_LINE)
        return runs[-1]

    try:
        runs[0].wait_ready()
        yield runs[0], restart, fifo
    finally:
        release(fifo)
        for run in runs:
            run.kill()


@pytest.mark.slow  # two omni-run starts (16-28 s on 2 cores)
async def test_a_server_restarted_mid_session_is_waited_for_then_answers(restarted) -> None:
    first, restart, fifo = restarted
    async with browser_page(first.url + "/") as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill("Tell me something")
        second = restart()
        await page.get_by_test_id("chat-send").click()  # refused while the new server loads: 503 "loading"
        await page.get_by_test_id("loading").wait_for()
        assert "talker" in await page.get_by_test_id("loading").inner_text()
        assert await page.get_by_test_id("health").inner_text() == "loading"  # not "healthy" still
        assert await page.get_by_test_id("error").is_hidden()
        assert await page.get_by_test_id("chat-stop").is_visible()  # the request waits: Stop still ends it
        # The Pipeline tab, opened meanwhile, reads stages not ready yet: loading, not "degraded".
        await page.evaluate(PILL_WORDS)
        await page.get_by_test_id("tab-pipeline").click()
        await page.locator("#pipeline-graph .stage.unhealthy").first.wait_for()
        async with page.expect_response(lambda r: r.url.endswith("/v1/status")):  # (and its next refresh)
            pass
        assert await page.evaluate("window.__pill") == [], await page.evaluate("window.__pill")
        assert await page.get_by_test_id("health").inner_text() == "loading"
        await page.get_by_test_id("tab-chat").click()
        release(fifo)
        await page.wait_for_function("document.getElementById('chat-send').disabled === false")
        assert await page.get_by_test_id("chat-output").inner_text() != ""  # sent again once loaded
        assert await page.get_by_test_id("error").is_hidden() and await page.get_by_test_id("loading").is_hidden()
        await page.wait_for_function("document.getElementById('health').textContent === 'healthy'")
        # Only the refusals of the load itself: the chat's 503 and /health's while it loaded.
        assert {path for _, path in bp.refused} <= {"/v1/chat/completions", "/health"}, bp.refused
        assert [e for e in bp.errors if "status of 503" not in e] == [], bp.errors
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.output
    second.assert_clean()
