"""POST /v1/audio/speech as a demanding outside client drives it: the documented input limit, built-in voice
names in any case, and a custom voice deleted while the text-in socket speaks in it. A real server (the synthetic pipeline declaring a voice and cloning), the unmodified openai SDK
and raw HTTP."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
import soundfile as sf

from omni_actors.api.speech import MAX_INPUT_CHARS
from tests.api.conftest import Server
from tests.api.test_voice_clips import RATE, _cloning_synthetic, _wav
from tests.models.speech_family import speech_until_done

MODEL = "synthetic"


@pytest.fixture(scope="module")
async def srv(tmp_path_factory) -> AsyncIterator[Server]:
    async with _cloning_synthetic(tmp_path_factory.mktemp("data")) as server:
        yield server


async def _speak(srv: Server, **kw) -> int:
    """Samples of the WAV the SDK gets back."""
    resp = await srv.client().audio.speech.create(model=MODEL, response_format="wav", **kw)
    audio, _ = sf.read(io.BytesIO(resp.content), dtype="float32")
    return audio.size


async def test_input_past_openais_4096_characters_is_a_400_naming_input(srv: Server) -> None:
    """OpenAI documents 4096 characters; 16384 were taken (far past any family's frame budget)."""
    assert MAX_INPUT_CHARS == 4096
    assert await _speak(srv, input="\U0001f600" * 4096, voice="tone")  # characters, not bytes or tokens
    for text in ("x" * 4097, "word " * 3000):
        with pytest.raises(openai.BadRequestError) as err:
            await _speak(srv, input=text, voice="tone")
        body = err.value.body
        assert body["param"] == "input" and body["code"] == "string_above_max_length", body
        assert f"input is {len(text)} characters; at most 4096" in body["message"], body
    async with aiohttp.ClientSession() as s, s.post(srv.url + "/v1/audio/speech", json={
            "model": MODEL, "input": "x" * 4097, "stream_format": "sse"}) as resp:
        assert resp.status == 400 and resp.content_type == "application/json"  # before any stream opens


async def test_built_in_voice_names_are_matched_in_any_case(srv: Server) -> None:
    """OpenAI's names spoke in any case ("ALLOY"), the model's own were a 400 unless spelt as listed ("Tone",
    qwen3_tts's "Vivian", Dia's "s1"), though every stage matches them without case."""
    plain = await _speak(srv, input="Hi.", voice="tone")
    for name in ("TONE", "Tone", "ALLOY"):
        assert await _speak(srv, input="Hi.", voice=name) == plain, name
    with pytest.raises(openai.BadRequestError) as err:
        await _speak(srv, input="Hi.", voice="tones")
    assert err.value.body["param"] == "voice" and err.value.body["code"] == "unknown_voice", err.value.body


async def test_a_custom_voice_deleted_mid_text_still_speaks_the_rest_of_it(srv: Server) -> None:
    """The text-in socket read the voice again for every clause: once it was deleted, each clause after was an
    `error`. A text keeps the voice it started with; the next text is refused."""
    client = srv.client()
    consent = await client.audio.voice_consents.create(recording=("c.wav", _wav(RATE), "audio/wav"),
                                                       language="en-US", name="me")
    voice = await client.audio.voices.create(audio_sample=("v.wav", _wav(RATE), "audio/wav"), consent=consent.id,
                                             name="going", extra_body={"transcript": ""})
    async with aiohttp.ClientSession() as s, s.ws_connect(
            srv.url.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json({"type": "session.update", "session": {"voice": {"id": voice.id}}})
        assert (await ws.receive_json())["type"] == "session.updated"
        await ws.send_json({"type": "input_text.append", "text": "One, two, "})
        first = await ws.receive_json()
        assert first["type"] == "speech.audio.delta", first
        assert (await client.audio.voices.delete(voice.id)).deleted
        await ws.send_json({"type": "input_text.append", "text": "three, four."})
        await ws.send_json({"type": "input_text.done"})
        events, pcm = await speech_until_done(ws, [first])
        assert [e for e in events if e["type"] == "error"] == [], events
        assert len(pcm) and events[-1]["usage"]["input_tokens"] == 4  # (words: the synthetic pipeline's usage)
        await ws.send_json({"type": "input_text.append", "text": "Five."})
        await ws.send_json({"type": "input_text.done"})
        err = await ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "voice", err
        assert err["error"]["code"] == "unknown_voice", err


async def test_whitespace_only_instructions_are_none_as_empty_ones_are(srv: Server) -> None:
    """"" was taken on a model without style prompts while "  " was a 400 naming `instructions`: both say nothing."""
    plain = await _speak(srv, input="Hi.", voice="tone")
    for blank in ("", "   ", "\n\t"):
        assert await _speak(srv, input="Hi.", voice="tone", instructions=blank) == plain, repr(blank)
    with pytest.raises(openai.BadRequestError) as err:
        await _speak(srv, input="Hi.", voice="tone", instructions=" calm ")
    assert (err.value.body["param"], err.value.body["code"]) == ("instructions", "unsupported_parameter"), err.value.body
