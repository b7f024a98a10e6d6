"""The playground at `/`, in real headless Chromium against a real server (synthetic pipeline).

The page asks for the API key once (a wrong key is said to be wrong, selected to be typed over)
and keeps it for the tab; it shows the panels the
pipeline can serve; chat streams text; speak plays the voice; the pipeline view draws
every stage with its replicas, updated in place with a name per stage and replica; a status refused
with 401 brings the key prompt, not "unreachable". A screenshot of each panel lands in the test's temp dir.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import omni_actors
from omni_actors.api.playground import ASSETS
from omni_actors.api.speech import MAX_INPUT_CHARS as MAX_SPEECH_CHARS
from tests.api.conftest import API_KEY, Server, eventually, idle, serve
from tests.browser_support import browser_page

PROMPT = "Tell me something"


STEP = {"engine_extras": {"step_delay_ms": 1}}
"""Each synthetic step takes a millisecond: without it a step took microseconds, and the status
route's mean step (in ms, two decimals) could round to 0."""


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", stages=[{"stage_id": s, **STEP} for s in (0, 1, 2)]) as server:
        yield server


def test_every_playground_file_and_module_is_served() -> None:
    """A module the page imports but the server does not list would be a 404: the page would not start."""
    folder = Path(omni_actors.__file__).parent / "playground"
    assert {p.name for p in folder.iterdir() if p.suffix in {".html", ".css", ".js"}} == set(ASSETS)
    for js in folder.glob("*.js"):
        imported = set(re.findall(r'from "\./([^"]+)"', js.read_text()))
        assert imported <= set(ASSETS), (js.name, imported - set(ASSETS))


async def test_status_route_describes_the_pipeline(srv: Server) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(f"{srv.url}/v1/status") as resp:
            assert resp.status == 401  # like every API route, it needs the key
        async with session.get(f"{srv.url}/v1/status", headers=srv.headers) as resp:
            status = await resp.json()
        async with session.get(f"{srv.url}/") as resp:  # the page itself is public
            assert resp.status == 200 and "text/html" in resp.headers["content-type"]
        async with session.get(f"{srv.url}/playground/secrets.py") as resp:
            assert resp.status == 404
    assert status["pipeline"] == "synthetic" and status["healthy"] is True
    assert [s["stage_id"] for s in status["stages"]] == [0, 1, 2]
    assert [s["inputs"] for s in status["stages"]] == [[], [0], [1]]
    assert all(r["ready"] for s in status["stages"] for r in s["replicas"])
    assert [s["first_output_ms"] for s in status["stages"]] == [None, None, None]  # nothing served yet

    await srv.client().chat.completions.create(
        model="synthetic", messages=[{"role": "user", "content": PROMPT}], modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"})
    # steps reach the orchestrator with each worker's next heartbeat
    await eventually(lambda: all(st.replicas[0].steps for st in srv.orch.statistics().stages), timeout_s=10)
    async with aiohttp.ClientSession() as session, session.get(f"{srv.url}/v1/status", headers=srv.headers) as resp:
        status = await resp.json()
    for stage in status["stages"]:  # every stage answered the request: its share and its step time
        assert stage["first_output_ms"] > 0 and stage["step_ms"] > 0, stage
        assert stage["replicas"][0]["steps"] >= 1 and stage["replicas"][0]["step_ms"] > 0, stage


async def test_playground_key_chat_speak_and_pipeline(srv: Server, tmp_path) -> None:
    expected = await srv.client().chat.completions.create(
        model="synthetic", messages=[{"role": "user", "content": PROMPT}])
    async with browser_page(srv.url + "/") as bp:
        page = bp.page
        await page.get_by_test_id("key-form").wait_for()  # the API needs a key: the page asks once
        assert await page.evaluate("document.activeElement.id") == "key-input"  # the keyboard is where the key goes
        # The pill says why nothing shows yet (the server answered: it wants a key), not "…" for ever.
        await page.locator("[data-testid=health]:text-is('API key needed')").wait_for()
        await page.keyboard.type("wrong-key")
        await page.keyboard.press("Enter")
        # A wrong key is said to be wrong (not "needs a key" again), and it is selected to be typed over.
        await page.wait_for_function("document.getElementById('error').textContent.includes('not accepted')")
        assert await page.get_by_test_id("key-form").is_visible()
        typed = await page.evaluate("[document.activeElement.id, document.activeElement.selectionStart,"
                                    " document.activeElement.selectionEnd]")
        assert typed == ["key-input", 0, len("wrong-key")], typed
        await page.keyboard.type(API_KEY)
        await page.get_by_test_id("key-save").click()
        await page.locator("body[data-ready=true]").wait_for()
        tabs = await page.locator("#tabs button").all_inner_texts()
        assert tabs == ["Talk", "Chat", "Speak", "Pipeline"]  # text + audio: no images or videos

        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& document.getElementById('chat-output').textContent.length > 0")
        assert await page.get_by_test_id("chat-output").inner_text() == expected.choices[0].message.content
        await page.screenshot(path=str(tmp_path / "chat.png"))

        await page.get_by_test_id("tab-speak").click()
        # The server speaks at most MAX_SPEECH_CHARS a request: the count says so before sending, a paste of
        # more is kept whole and said to be too long (not cut off unsaid), and Speak sends nothing then.
        speak_input, count = page.get_by_test_id("speak-input"), page.get_by_test_id("speak-count")
        await speak_input.fill("x" * (MAX_SPEECH_CHARS + 904))  # (a paste)
        assert len(await speak_input.input_value()) == MAX_SPEECH_CHARS + 904
        assert await count.inner_text() == f"{MAX_SPEECH_CHARS + 904} / {MAX_SPEECH_CHARS} characters"
        assert "over" in await count.get_attribute("class")
        assert await speak_input.get_attribute("aria-invalid") == "true"
        too_long = f"{MAX_SPEECH_CHARS + 904} characters: at most {MAX_SPEECH_CHARS} can be spoken at once (904 too many)"
        assert await page.get_by_test_id("speak-note").inner_text() == too_long
        await page.get_by_test_id("speak-button").click()  # refused by the page (no 400: bp.refused below)
        assert await page.evaluate("document.activeElement.id") == "speak-input"
        assert await page.get_by_test_id("speak-stop").is_hidden()
        await speak_input.fill("\U0001f600" * MAX_SPEECH_CHARS)  # characters as the server counts them (not UTF-16's)
        assert await count.inner_text() == f"{MAX_SPEECH_CHARS} / {MAX_SPEECH_CHARS} characters"
        assert "over" not in await count.get_attribute("class")
        assert await speak_input.get_attribute("aria-invalid") is None
        assert await page.get_by_test_id("speak-note").inner_text() == ""
        assert await page.get_by_test_id("speak-audio").is_hidden()  # no empty player before a clip to play
        await page.get_by_test_id("speak-input").fill("Hello from the playground.")
        await page.get_by_test_id("speak-button").click()
        await page.wait_for_function("Number(document.getElementById('speak-audio').dataset.seconds || 0) > 0")
        duration = await page.evaluate(
            "new Promise(r => { const a = document.getElementById('speak-audio');"
            " if (a.readyState >= 1) r(a.duration); else a.onloadedmetadata = () => r(a.duration); })")
        assert duration > 0  # the finished clip is a playable WAV
        assert await page.get_by_test_id("speak-audio").is_visible()
        await page.screenshot(path=str(tmp_path / "speak.png"))
        for _ in range(2):  # more clicks: each closes the audio context the one before opened
            await page.evaluate("document.getElementById('speak-audio').dataset.seconds = ''")
            await page.get_by_test_id("speak-button").click()
            await page.wait_for_function("Number(document.getElementById('speak-audio').dataset.seconds || 0) > 0 "
                                         "&& document.getElementById('speak-button').disabled === false")
        # By keyboard: Enter on Speak moves the focus to its Stop (Speak, disabled, would drop it to the top of
        # the page), and back to Speak once the voice has ended.
        await page.get_by_test_id("speak-button").focus()
        await page.keyboard.press("Enter")
        assert await page.evaluate("document.activeElement.id") == "speak-stop"
        await page.wait_for_function("document.getElementById('speak-stop').hidden "
                                     "&& document.activeElement.id === 'speak-button'")
        assert await page.evaluate("window.__audioContexts.filter(c => c.state !== 'closed').length") == 1

        await page.get_by_test_id("tab-pipeline").click()
        await page.locator("[data-testid=stage-2]").wait_for()
        assert await page.locator("#pipeline-graph .stage.healthy").count() == 3
        assert await page.locator("#pipeline-graph .replica.ready").count() == 3
        assert await page.locator("#pipeline-graph .edge").count() == 2
        times = await page.get_by_test_id("stage-2-times").text_content()  # an SVG <text>
        assert re.fullmatch(r"step [\d.]+ ms · first out [\d.]+ ms", times), times
        # Each refresh updates the same nodes (a hovered replica keeps its tooltip), and each stage and
        # replica has a name a screen reader reads: its health and load.
        await page.evaluate("window.__dot = document.querySelector('#pipeline-graph circle');"
                            " window.__dot.removeAttribute('aria-label')")
        await page.wait_for_function("document.querySelector('#pipeline-graph circle') !== window.__dot"
                                     " || window.__dot.hasAttribute('aria-label')")  # the next refresh
        assert await page.evaluate("window.__dot.isConnected")
        label = await page.evaluate("window.__dot.getAttribute('aria-label')")
        assert re.fullmatch(r"stage 0 replica 0: ready, pid \d+, 0 in flight, 0 restarts, .*", label), label
        label = await page.get_by_test_id("stage-2").get_attribute("aria-label")
        assert re.fullmatch(r"stage 2 \S+ \(\w+\): healthy, in flight 0 / limit \d+, step [\d.]+ ms · .*", label), label
        # A keyboard reaches each replica (Tab, from the tab) and reads on focus what a hover shows, by it;
        # Escape hides that and stays there. The panel is named by its tab.
        assert await page.get_by_role("tabpanel", name="Pipeline").is_visible()
        await page.get_by_test_id("tab-pipeline").focus()
        await page.keyboard.press("Tab")
        assert await page.evaluate("document.activeElement.dataset.testid") == "replica-0-0"
        tip = page.get_by_test_id("pipeline-tip")
        await tip.wait_for()
        assert await tip.inner_text() == await page.get_by_test_id("replica-0-0").get_attribute("aria-label")
        await page.keyboard.press("Tab")
        focused = page.get_by_role("img", name=re.compile(r"^stage 1 replica 0: ready, pid \d+"))
        assert await focused.evaluate("el => el === document.activeElement")
        assert (await tip.inner_text()).startswith("stage 1 replica 0: ready")
        box, near = await focused.bounding_box(), await tip.bounding_box()
        assert abs(near["y"] + near["height"] - box["y"]) < 20 or abs(near["y"] - box["y"] - box["height"]) < 20
        await page.keyboard.press("Escape")
        assert await tip.is_hidden()
        assert await focused.evaluate("el => el === document.activeElement")
        await page.screenshot(path=str(tmp_path / "pipeline.png"))

        # The key stops working mid-session: the page asks again, then comes back where the user was.
        await page.evaluate("window.__playground.key = 'revoked'")
        await page.get_by_test_id("key-form").wait_for()  # (the next status refresh's 401)
        assert "not accepted" in await page.get_by_test_id("error").inner_text()
        assert await page.get_by_test_id("health").inner_text() == "API key needed"  # it answered: not "unreachable"
        await page.keyboard.type(API_KEY)
        await page.keyboard.press("Enter")
        await page.wait_for_function("document.getElementById('error').hidden")
        assert await page.get_by_test_id("key-form").is_hidden()
        assert await page.get_by_role("tabpanel").get_attribute("id") == "panel-pipeline"  # not back at Talk
        await page.locator("[data-testid=stage-2]").wait_for()

        await page.reload()  # the key is kept for the tab: no second ask
        await page.locator("body[data-ready=true]").wait_for()
        assert await page.get_by_test_id("key-form").is_hidden()
        stored = await page.evaluate("sessionStorage.getItem('omni-actors.api-key')")
        assert json.dumps(stored) == json.dumps(API_KEY)
        # Only the first loads, key-less then with the wrong key, may have logged errors (their 401 answers).
        assert {path for status, path in bp.refused if status != 401} == set(), bp.refused
        assert [e for e in bp.errors if "status of 401" not in e] == [], bp.errors
    assert all(p.stat().st_size > 0 for p in tmp_path.glob("*.png")) and len(list(tmp_path.glob("*.png"))) == 3
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_chat_takes_an_audio_file_and_plays_the_spoken_answer(srv: Server, tmp_path) -> None:
    import base64

    import numpy as np
    import soundfile as sf

    clip = tmp_path / "question.wav"
    sf.write(clip, (np.sin(np.arange(12_000) * 0.05) * 0.3).astype(np.float32), 24_000, subtype="PCM_16")
    content = [{"type": "text", "text": PROMPT},
               {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip.read_bytes()).decode(),
                                                       "format": "wav"}}]
    expected = await srv.client().chat.completions.create(
        model="synthetic", messages=[{"role": "user", "content": content}], modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "pcm16"})
    spoken = expected.choices[0].message.audio
    async with browser_page(srv.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-chat").click()
        await page.get_by_test_id("chat-input").fill(PROMPT)
        await page.get_by_test_id("chat-file").set_input_files(clip)
        await page.get_by_test_id("chat-speak").check()
        await page.get_by_test_id("chat-send").click()
        await page.wait_for_function("document.getElementById('chat-send').disabled === false "
                                     "&& !document.getElementById('chat-audio').hidden")
        assert await page.get_by_test_id("chat-output").inner_text() == spoken.transcript
        duration = await page.evaluate(
            "new Promise(r => { const a = document.getElementById('chat-audio');"
            " if (a.readyState >= 1) r(a.duration); else a.onloadedmetadata = () => r(a.duration); })")
        pcm_seconds = len(base64.b64decode(spoken.data)) / 2 / 24_000
        assert abs(duration - pcm_seconds) < 0.01  # the whole answer, as a playable WAV
        await page.screenshot(path=str(tmp_path / "chat-audio.png"))
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    await eventually(lambda: idle(srv.orch), timeout_s=10)
