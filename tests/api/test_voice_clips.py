"""A custom voice's sample has a floor: under a second is a 400 naming `audio_sample` when the voice is made;
a voice stored before that floor existed, with a clip too short for the model's encoders, is a 400 naming
`voice` at speech time on every cloning family (qwen3_tts Base failed 1050-1279 samples, Higgs-Audio-V2
1-118, with a 500), and a clip just long enough speaks. Real servers, the unmodified openai SDK."""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import numpy as np
import openai
import pytest
import soundfile as sf

from omni_actors.api.app import build_app
from omni_actors.api.server import start_server
from omni_actors.api.voice_store import VoiceStore
from omni_actors.api.voices import MIN_SAMPLE_S, VOICES_KEY
from omni_actors.config.pipeline import get_pipeline
from omni_actors.config.speech import SpeechSpec
from omni_actors.models.tiny import make_tiny
from omni_actors.store import Store
from tests.api.conftest import Server, eventually, idle, make_deploy, running, serve_deploy
from tests.models.speech_family import serve_family

RATE = 24000


def _tone(samples: int, rate: int = RATE) -> np.ndarray:
    """A 180 Hz tone peaking at 0.3 from its first sample (a cosine: a 1-sample clip is not silence)."""
    t = np.arange(samples) / rate
    return (0.3 * np.cos(2 * np.pi * 180 * t)).astype(np.float32)


def _wav(samples: int, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, _tone(samples, rate), rate, format="WAV")
    return buf.getvalue()


async def _consent(srv: Server) -> str:
    made = await srv.client().audio.voice_consents.create(recording=("c.wav", _wav(RATE), "audio/wav"),
                                                          language="en-US", name="me")
    return made.id


async def test_a_sample_under_the_floor_or_silent_is_refused_when_the_voice_is_made(tmp_path: Path) -> None:
    assert MIN_SAMPLE_S == 1.0
    async with serve_deploy(make_deploy("synthetic"), None, tmp_path) as srv:
        client, consent = srv.client(), await _consent(srv)
        for samples, rate in ((1, RATE), (1200, RATE), (RATE - 1, RATE), (15_999, 16_000)):
            with pytest.raises(openai.BadRequestError) as err:
                await client.audio.voices.create(audio_sample=("v.wav", _wav(samples, rate), "audio/wav"),
                                                 consent=consent, name="short", extra_body={"transcript": "hm"})
            body = err.value.body
            assert body["param"] == "audio_sample" and body["code"] == "audio_too_short", body
            assert f"at least 1 s of the speaker ({rate} samples at {rate} Hz)" in body["message"], body
            # the length itself, which "0.000 s" hid for a few samples
            assert f": {samples} sample{'' if samples == 1 else 's'} at {rate} Hz (" in body["message"], body
            assert " 0 ms" not in body["message"] and "0.000" not in body["message"], body
        silent = {"zeros": np.zeros(RATE, np.float32), "hiss": _tone(RATE) * 10 ** (-70 / 20) / 0.3}
        for what, samples in silent.items():  # a clone of silence is no voice: -60 dBFS peak is the floor
            buf = io.BytesIO()
            sf.write(buf, samples, RATE, format="WAV", subtype="FLOAT")
            with pytest.raises(openai.BadRequestError) as err:
                await client.audio.voices.create(audio_sample=("v.wav", buf.getvalue(), "audio/wav"),
                                                 consent=consent, name=what, extra_body={"transcript": "hm"})
            body = err.value.body
            assert body["param"] == "audio_sample" and body["code"] == "audio_silent", (what, body)
            assert "below the -60 dBFS floor" in body["message"], body
        for samples, rate in ((RATE, RATE), (16_000, 16_000)):
            made = await client.audio.voices.create(audio_sample=("v.wav", _wav(samples, rate), "audio/wav"),
                                                    consent=consent, name="ok", extra_body={"transcript": "hm"})
            assert made.id.startswith("voice_")
        async with aiohttp.ClientSession() as s, s.get(srv.url + "/v1/audio/voices") as resp:
            assert [v["name"] for v in (await resp.json())["data"]] == ["ok", "ok"]  # none of the short ones


async def _speak(srv: Server, model: str, voice: str) -> tuple[int, dict | None]:
    try:
        resp = await srv.client().audio.speech.create(model=model, input="Hello there.", voice={"id": voice},
                                                      response_format="wav", extra_body={"seed": 1})
    except openai.APIStatusError as err:
        return err.status_code, err.body
    audio, _ = sf.read(io.BytesIO(resp.content), dtype="float32")
    assert audio.size > 0
    return 200, None


@pytest.mark.parametrize(("family", "refused", "spoken"), [
    ("qwen3_tts-base", (1, 1000, 1050, 1200, 1279), 1280),  # the ECAPA-TDNN's reflect pads need 5 mel frames
    ("higgs_audio_v2", (1, 100, 118, 959), 960),  # HuBERT needs ~120 samples; the floor is one 40 ms frame
])
async def test_a_stored_voice_too_short_for_the_model_is_a_400_naming_voice(
        tmp_path: Path, family: str, refused: tuple[int, ...], spoken: int) -> None:
    folder = make_tiny(family, tmp_path / f"tiny-{family}", seed=0)
    data = tmp_path / "data"
    async with serve_family(folder, data) as srv:
        consent = await _consent(srv)
        store = Store(data)  # voices made before the floor existed, straight into the server's store
        try:
            short = {n: VoiceStore(store).add_voice(f"v{n}", consent, _tone(n), RATE, "Hm.").id for n in refused}
            enough = VoiceStore(store).add_voice("enough", consent, _tone(spoken), RATE, "Hm.").id
        finally:
            store.close()
        for samples, vid in short.items():
            status, body = await _speak(srv, folder.name, vid)
            assert status == 400, (samples, status, body)
            assert body["param"] == "voice" and body["code"] == "rejected_by_stage", body
            assert vid in body["message"] and "too short" in body["message"], body
            assert body["message"].startswith("invalid request: voice"), body  # no "stage 0 failed: ValueError"
        assert await _speak(srv, folder.name, enough) == (200, None)
        await eventually(lambda: idle(srv.orch))


@contextlib.asynccontextmanager
async def _cloning_synthetic(data: Path) -> AsyncIterator[Server]:
    """The synthetic pipeline declaring that it clones (the API reads a voice's clip before any stage runs)."""
    pipe = msgspec.structs.replace(get_pipeline("synthetic"), speech=SpeechSpec(voices=("tone",), cloning=True))
    deploy = make_deploy("synthetic")
    store = Store(data)
    async with running(deploy, pipeline=pipe) as orch:
        app = build_app(orch)
        app[VOICES_KEY] = VoiceStore(store)
        http = await start_server(app, "127.0.0.1", 0, deploy.server)
        try:
            yield Server(orch, http.url, None, http)
        finally:
            await http.close()
            store.close()


@pytest.mark.parametrize("damage", ["garbage", "missing"])
async def test_a_voice_whose_stored_sample_is_damaged_is_a_400_naming_voice(tmp_path: Path, damage: str) -> None:
    """A sample file removed or overwritten on disk was a LibsndfileError and a 500 with a traceback."""
    async with _cloning_synthetic(tmp_path) as srv:
        client, consent = srv.client(), await _consent(srv)
        made = await client.audio.voices.create(audio_sample=("v.wav", _wav(RATE), "audio/wav"),
                                                consent=consent, name="v", extra_body={"transcript": ""})
        assert (await client.audio.speech.create(model="synthetic", input="Hi.", voice={"id": made.id})).content
        store = Store(tmp_path)  # a silent voice stored before uploads were checked for silence
        try:
            hushed = VoiceStore(store).add_voice("hushed", consent, np.zeros(RATE, np.float32), RATE, "")
        finally:
            store.close()
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.speech.create(model="synthetic", input="Hi.", voice={"id": hushed.id})
        assert err.value.body["param"] == "voice" and err.value.body["code"] == "audio_silent", err.value.body
        assert hushed.id in err.value.body["message"], err.value.body
        sample = next(tmp_path.rglob(f"{made.id}.wav"))
        if damage == "missing":
            sample.unlink()
        else:
            sample.write_bytes(b"not a wav file")
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.speech.create(model="synthetic", input="Hi.", voice={"id": made.id})
        body = err.value.body
        assert body["param"] == "voice" and body["code"] == "unknown_voice", body
        assert made.id in body["message"] and "no readable sample" in body["message"], body
        await eventually(lambda: idle(srv.orch))


async def test_a_prompt_voice_is_refused_naming_type(tmp_path: Path) -> None:
    """OpenAI's prompt voices (the SDK's `voices.create(type="prompt", prompt=...)`) were refused as an unknown
    form field `prompt`, never reaching the "prompt voices are not supported" answer meant for them."""
    async with serve_deploy(make_deploy("synthetic"), None, tmp_path) as srv:
        client = srv.client()
        for kwargs in ({"name": "deep", "prompt": "a deep, calm voice", "type": "prompt"},
                       {"name": "deep", "prompt": "a deep, calm voice", "type": "prompt", "model": "auto"}):
            with pytest.raises(openai.BadRequestError) as err:
                await client.audio.voices.create(**kwargs)
            body = err.value.body
            assert body["param"] == "type" and body["code"] == "unsupported_value", body
            assert "prompt voices are not supported" in body["message"], body
        consent = await _consent(srv)
        with pytest.raises(openai.BadRequestError) as err:  # an audio sample voice with a prompt's field
            await client.audio.voices.create(audio_sample=("v.wav", _wav(RATE), "audio/wav"), consent=consent,
                                             name="v", extra_body={"prompt": "deep"})
        assert err.value.body["param"] == "prompt" and err.value.body["code"] == "unsupported_value", err.value.body
        async with aiohttp.ClientSession() as s, s.get(srv.url + "/v1/audio/voices") as resp:
            assert (await resp.json())["data"] == []
