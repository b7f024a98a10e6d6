"""The playground's Speak panel on a model that only clones voices (tiny qwen3_tts Base), in real headless Chromium.

The model lists no built-in voices, so the page offers none (no "alloy" to be refused with
`custom_voice_required`) and says a voice must be made; the upload makes a consent and a voice
through the server's own routes, selects the voice, and the page speaks in it (what the server refuses, a
consent too short, a silent clip, is said by the form's button with the focus on that field); after a reload
the voice is listed again, and "Delete voice" asks, then removes it from the server (or, deleted elsewhere
meanwhile, from the list).
"""

from __future__ import annotations

import aiohttp
import numpy as np
import soundfile as sf

from tests.api.conftest import Server, eventually, idle
from tests.browser_support import browser_page
from tests.models.speech_family import KEY, Family, family_fixtures

FAMILY = Family("qwen3_tts-base", rate=24000, frame=1920, voices=())
CLIP_RATE = 16_000

fam, model_dir, data_dir, srv = family_fixtures(FAMILY)


def _tone(path, hz: float, seconds: float, amplitude: float = 0.3) -> None:
    t = np.arange(int(seconds * CLIP_RATE)) / CLIP_RATE
    sf.write(path, (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32), CLIP_RATE, subtype="PCM_16")


async def _refused_by_the_button(page, field: str) -> str:
    """The form's answer once the server refused it: said by the button (not at the panel's foot), the focus
    on the field the error names."""
    await page.wait_for_function("document.getElementById('clone-status').classList.contains('failed')")
    assert await page.get_by_test_id("error").is_hidden()
    assert await page.evaluate("document.activeElement.id") == field
    said = await page.get_by_test_id("clone-status").inner_text()
    await page.evaluate("document.getElementById('clone-status').classList.remove('failed')")  # (for the next)
    return said


async def _voices(srv: Server) -> list[dict]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as s, s.get(srv.url + "/v1/audio/voices") as resp:
        return (await resp.json())["data"]


async def test_speak_makes_uses_and_deletes_a_custom_voice(srv: Server, tmp_path) -> None:
    consent, clip = tmp_path / "consent.wav", tmp_path / "clip.wav"
    short, silent = tmp_path / "short.wav", tmp_path / "silent.wav"
    _tone(consent, 200, 1.0)
    _tone(clip, 180, 2.0)
    _tone(short, 200, 0.3)
    _tone(silent, 180, 2.0, amplitude=0.0)
    async with browser_page(srv.url + "/", api_key=KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        assert await page.locator("#tabs button").all_inner_texts() == ["Speak", "Pipeline"]
        await page.get_by_test_id("tab-speak").click()
        await page.get_by_test_id("speak-voice-needed").wait_for()  # says a voice must be uploaded
        assert await page.locator("#speak-voice option").count() == 0  # no "alloy" to be refused
        await page.get_by_test_id("speak-input").fill("Hello in my own voice.")
        await page.get_by_test_id("speak-button").click()  # refused by the page, not by a 400
        # It says by its button what is missing, and the focus goes to the form that makes a voice.
        assert "custom voice" in await page.get_by_test_id("speak-note").inner_text()
        assert await page.evaluate("document.activeElement.id") == "clone-name"
        await page.screenshot(path=str(tmp_path / "voice-needed.png"))

        await page.get_by_test_id("clone-name").fill("hum")
        await page.get_by_test_id("clone-transcript").fill("A low hum.")
        await page.get_by_test_id("clone-sample").set_input_files(silent)
        await page.get_by_test_id("clone-consent-file").set_input_files(short)
        await page.get_by_test_id("clone-button").click()  # the consent is refused (400 naming `recording`)
        assert "consent recording is too short" in await _refused_by_the_button(page, "clone-consent-file")
        await page.get_by_test_id("clone-consent-file").set_input_files(consent)
        await page.get_by_test_id("clone-name").press("Enter")  # the consent is made, the silent clip refused
        assert "audio sample is silent" in await _refused_by_the_button(page, "clone-sample")
        await page.get_by_test_id("clone-sample").set_input_files(clip)
        await page.get_by_test_id("clone-button").click()  # (under the consent made just now)
        await page.wait_for_function("document.getElementById('clone-status').textContent.startsWith('made voice')")
        picked = await page.evaluate("(() => { const s = document.getElementById('speak-voice');"
                                     " return [s.selectedOptions[0].text, s.value]; })()")
        assert picked[0] == "hum (custom)" and picked[1].startswith('{"id":"voice_'), picked
        assert await page.get_by_test_id("speak-voice-needed").is_hidden()
        assert await page.get_by_test_id("error").is_hidden() and await page.get_by_test_id("speak-note").inner_text() == ""

        await page.get_by_test_id("speak-button").click()
        await page.wait_for_function("Number(document.getElementById('speak-audio').dataset.seconds || 0) > 0")
        await page.screenshot(path=str(tmp_path / "voice-made.png"))

        await page.reload()  # the voice and its consent are the server's: listed again
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-speak").click()
        await page.locator("#speak-voice option", has_text="hum (custom)").wait_for(state="attached")
        assert await page.get_by_test_id("speak-voice-needed").is_hidden()
        await page.locator("#clone-consent option", has_text="hum (en-US)").wait_for(state="attached")
        consents = await page.locator("#clone-consent option").all_text_contents()
        assert consents == ["new: upload the recording", "hum (en-US)"], consents
        assert [v["name"] for v in await _voices(srv)] == ["hum"]

        await page.locator("#speak-voice").select_option(label="hum (custom)")
        await page.get_by_test_id("speak-voice-delete").focus()  # shown for a custom voice only
        await page.keyboard.press("Enter")  # asks first: it cannot be undone; the focus on the answer that keeps it
        confirm = page.get_by_test_id("speak-voice-confirm")
        asked = " ".join((await confirm.inner_text()).split())
        assert asked == "Delete voice hum? This cannot be undone. Delete Keep", asked
        assert await page.evaluate("document.activeElement.id") == "speak-voice-delete-keep"
        assert await page.get_by_test_id("speak-voice-delete").is_hidden()  # (the question stands in its place)
        await page.keyboard.press("Escape")  # kept: the question goes, the focus back on "Delete voice"
        assert await confirm.is_hidden() and await page.evaluate("document.activeElement.id") == "speak-voice-delete"
        await page.keyboard.press("Enter")
        await page.get_by_test_id("speak-voice-delete-keep").press("Enter")  # kept again, by its button
        assert await page.evaluate("document.activeElement.id") == "speak-voice-delete"
        assert [v["name"] for v in await _voices(srv)] == ["hum"]  # asked twice, kept twice
        await page.keyboard.press("Enter")
        await page.keyboard.press("Shift+Tab")  # from Keep to Delete
        await page.keyboard.press("Enter")
        await page.wait_for_function("document.getElementById('clone-status').textContent === 'deleted voice hum'")
        # None left: the keyboard carries on in the form that makes one (open), not from the top of the page.
        assert await page.evaluate("document.activeElement.id") == "clone-name"
        assert await page.evaluate("document.getElementById('speak-clone').open")
        assert await page.locator("#speak-voice option").count() == 0
        await page.get_by_test_id("speak-voice-needed").wait_for()  # back to "make one first"
        assert await page.get_by_test_id("speak-voice-delete").is_hidden() and await confirm.is_hidden()
        assert [e for e in bp.errors if "status of 400" not in e] == [], bp.errors
        assert bp.refused == [(400, "/v1/audio/voice_consents"), (400, "/v1/audio/voices")], bp.refused
    assert await _voices(srv) == []  # gone on the server; its consent stays for the next voice
    assert len(list(tmp_path.glob("*.png"))) == 2
    await eventually(lambda: idle(srv.orch))


async def _record(page, which: str, seconds: float) -> str:
    """Record / Stop beside a file input, once the page has taken `seconds` of the (fake) microphone."""
    await page.get_by_test_id(f"clone-{which}-record").click()
    await page.wait_for_function(f"parseFloat((document.querySelector('[data-testid=clone-{which}-recorded]')"
                                 f".textContent.match(/[0-9.]+/) || ['0'])[0]) >= {seconds}")
    await page.get_by_test_id(f"clone-{which}-record").click()
    return await page.get_by_test_id(f"clone-{which}-recorded").inner_text()


async def test_a_voice_and_its_consent_can_be_recorded_in_the_page(srv: Server, tmp_path) -> None:
    """Chromium's fake microphone plays a tone; Record/Stop makes each clip a WAV the form sends."""
    mic = tmp_path / "mic.wav"
    _tone(mic, 220, 3.0)
    async with browser_page(srv.url + "/", fake_mic=mic, api_key=KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-speak").click()
        await page.get_by_test_id("clone-name").fill("mic")
        sample = await _record(page, "sample", 1.5)
        consent = await _record(page, "consent", 1.5)  # (a consent under 1 s is refused, as a sample is)
        assert sample.startswith("recorded ") and consent.startswith("recorded "), (sample, consent)
        assert float(sample.split()[1]) >= 1.5 and float(consent.split()[1]) >= 1.5
        await page.get_by_test_id("clone-button").click()
        await page.wait_for_function("document.getElementById('clone-status').textContent.startsWith('made voice')")
        assert await page.get_by_test_id("clone-consent-recorded").inner_text() == ""  # (used: a new one is asked for)
        await page.get_by_test_id("speak-input").fill("Hello in a recorded voice.")
        await page.get_by_test_id("speak-button").click()
        await page.wait_for_function("Number(document.getElementById('speak-audio').dataset.seconds || 0) > 0")
        await page.screenshot(path=str(tmp_path / "voice-recorded.png"))
        (voice,) = await _voices(srv)
        assert voice["name"] == "mic"
        # Deleted elsewhere meanwhile (another tab, the API): the page's Delete takes it off the list too,
        # rather than an error and a voice still offered that the server no longer has.
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as s, \
                s.delete(f"{srv.url}/v1/audio/voices/{voice['id']}") as resp:
            assert resp.status == 200, await resp.text()
        await page.get_by_test_id("speak-voice-delete").click()
        await page.get_by_test_id("speak-voice-delete-yes").click()
        await page.wait_for_function("document.getElementById('clone-status').textContent "
                                     "=== 'voice mic was already deleted'")
        assert await page.locator("#speak-voice option").count() == 0
        assert await page.get_by_test_id("error").is_hidden()
        assert await page.get_by_test_id("speak-voice-delete").is_hidden()
        # Its consent deleted elsewhere too: the next voice under it is refused (400 naming `consent`), said by
        # the button; the consent is no longer offered, the focus on the picker that now asks for a new one.
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as s:
            async with s.get(f"{srv.url}/v1/audio/voice_consents") as resp:
                (consent_row,) = [c for c in (await resp.json())["data"] if c["name"] == "mic"]
            async with s.delete(f"{srv.url}/v1/audio/voice_consents/{consent_row['id']}") as resp:
                assert resp.status == 200, await resp.text()
        assert await page.locator("#clone-consent").input_value() == consent_row["id"]  # (the one made above)
        await page.get_by_test_id("clone-name").fill("mic2")
        await page.get_by_test_id("clone-name").press("Enter")
        await page.wait_for_function("document.getElementById('clone-status').classList.contains('failed')")
        assert "does not exist" in await page.get_by_test_id("clone-status").inner_text()
        assert await page.get_by_test_id("error").is_hidden()
        assert await page.evaluate("document.activeElement.id") == "clone-consent"
        offered = await page.locator("#clone-consent option").all_text_contents()
        assert offered[0] == "new: upload the recording" and "mic (en-US)" not in offered, offered
        assert await page.get_by_test_id("clone-consent-file").is_visible()
        assert [e for e in bp.errors if "status of 404" not in e and "status of 400" not in e] == [], bp.errors
        assert bp.refused == [(404, f"/v1/audio/voices/{voice['id']}"), (400, "/v1/audio/voices")], bp.refused
    assert await _voices(srv) == []
    await eventually(lambda: idle(srv.orch))
