"""qwen3_tts, Base variant: voice cloning from a custom voice's clip (and transcript), openai SDK, real server.

A Base folder has no built-in voices: `/v1/models/{id}` lists none and says it takes custom
voices; a custom voice's clip conditions the audio (speaker embedding, and with a transcript
the clip's codes in context); built-in names, no voice and `instructions` are 400s.
"""

from __future__ import annotations

import io

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.api.conftest import Server, eventually, idle
from tests.models.speech_family import TEXT, Family, _wav, family_fixtures

FAMILY = Family("qwen3_tts-base", rate=24000, frame=1920, voices=())
MAX_FRAMES = 20
"""The tiny folder's generation_config max_new_tokens: a request makes at most this many frames."""
CLIP_S = 2.0
"""Reference clips are longer than any answer (25 frames > MAX_FRAMES): audio that held the clip would show."""

fam, model_dir, data_dir, srv = family_fixtures(FAMILY)


def _tone(hz: float, seconds: float = CLIP_S, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32),
             rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
async def voices(srv: Server) -> dict[str, str]:
    """Three custom voices under one consent: a low tone with and without its transcript, and a high tone."""
    client = srv.client()
    consent = await client.audio.voice_consents.create(recording=("consent.wav", _tone(200, 1.0), "audio/wav"),
                                                       language="en-US", name="me")
    made = {}
    for name, hz, transcript in (("low", 180, "A low hum."), ("low_untold", 180, None), ("high", 700, "A whistle.")):
        extra = {"transcript": transcript} if transcript else {}
        voice = await client.audio.voices.create(audio_sample=(f"{name}.wav", _tone(hz), "audio/wav"),
                                                 consent=consent.id, name=name, extra_body=extra)
        made[name] = voice.id
    return made


async def test_base_folder_lists_no_voices_and_takes_custom_ones(srv: Server) -> None:
    assert srv.orch.pipeline.name == "qwen3_tts" and srv.orch.pipeline.speech.cloning
    model = await srv.client().models.retrieve(FAMILY.model)
    assert model.model_extra["voices"] == [] and model.model_extra["custom_voices"] is True


async def test_a_cloned_voice_is_deterministic_and_the_clip_conditions_it(srv: Server, voices) -> None:
    a, rate = await _wav(srv, FAMILY, voice={"id": voices["low"]}, extra_body={"seed": 5})
    b, _ = await _wav(srv, FAMILY, voice={"id": voices["low"]}, extra_body={"seed": 5})
    high, _ = await _wav(srv, FAMILY, voice={"id": voices["high"]}, extra_body={"seed": 5})
    untold, _ = await _wav(srv, FAMILY, voice={"id": voices["low_untold"]}, extra_body={"seed": 5})
    assert rate == 24000 and a.size and a.size % FAMILY.frame == 0
    assert a.size == b.size and np.allclose(a, b, atol=1e-4)
    for other in (high, untold):  # another clip; the same clip without its transcript (no codes in context)
        assert other.size != a.size or not np.allclose(other, a, atol=1e-3)
    for audio in (a, high, untold):  # only the new frames are spoken, never the 2 s clip
        assert 0 < audio.size <= MAX_FRAMES * FAMILY.frame
    await eventually(lambda: idle(srv.orch))


async def test_sse_stream_of_a_cloned_voice_matches_the_whole_answer(srv: Server, voices) -> None:
    whole, _ = await _wav(srv, FAMILY, voice={"id": voices["low"]}, extra_body={"seed": 6})
    body = {"model": FAMILY.model, "input": TEXT, "voice": {"id": voices["low"]}, "response_format": "pcm",
            "stream_format": "sse", "seed": 6}
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(srv.url + "/v1/audio/speech",
                                                                        json=body) as resp:
        assert resp.status == 200
        data = [line async for line in resp.content if line.startswith(b"data: ")]
    import base64
    import json

    events = [json.loads(line[6:]) for line in data]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    streamed = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    assert events[-1]["type"] == "speech.audio.done" and streamed.size == whole.size
    assert np.abs(streamed - whole).max() < 2e-3


async def test_base_refuses_builtin_voices_no_voice_and_instructions(srv: Server, voices) -> None:
    client = srv.client()
    for name in ("alloy", "vivian"):
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice=name)
        body = err.value.body
        assert body["param"] == "voice" and body["code"] == "custom_voice_required" and "custom voice" in body["message"]
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(
            srv.url + "/v1/audio/speech", json={"model": FAMILY.model, "input": TEXT}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice={"id": voices["low"]},
                                         instructions="Whisper.")
    assert err.value.body["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice={"id": "voice_missing"})
    assert err.value.body["param"] == "voice"
