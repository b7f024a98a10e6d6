"""Every route of the synthetic text -> codes -> audio pipeline, called with the real openai SDK."""

from __future__ import annotations

import base64
import io

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from openapi_spec_validator import validate

from tests.api.conftest import Server, eventually, idle, post, serve

PROMPT = "hello big world"
SAMPLES = 2400  # synthetic vocoder samples per chunk
RATE = 24000


@pytest.fixture(scope="module")
async def srv():
    stages = [
        {"stage_id": 0, "engine_extras": {"chunks": 4, "step_delay_ms": 2}},
        {"stage_id": 1, "engine_extras": {"payload_bytes": 1 << 17}},  # codes travel through shm
        {"stage_id": 2},
    ]
    async with serve("synthetic", stages=stages,
                     server={"max_body_mb": 0.25, "served_model_name": "acme/omni-test"}) as s:
        yield s


async def test_health_and_models(srv: Server) -> None:
    async with aiohttp.ClientSession() as session, session.get(srv.url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"
    client = srv.client()
    models = await client.models.list()
    assert [m.id for m in models.data] == ["acme/omni-test", "synthetic"]
    assert {m.object for m in models.data} == {"model"}
    model = await client.models.retrieve("acme/omni-test")
    assert model.pipeline == "synthetic" and model.output_types == ["audio", "text"] and model.object == "model"
    async with aiohttp.ClientSession() as session, session.get(srv.url + "/v1/models/acme/omni-test",
                                                       headers={"Authorization": f"Bearer {srv.key}"}) as resp:
        assert resp.status == 200 and (await resp.json())["id"] == "acme/omni-test"  # a slash, unescaped


async def test_chat_text(srv: Server) -> None:
    out = await srv.client().chat.completions.create(
        model="acme/omni-test", messages=[{"role": "user", "content": PROMPT}], max_tokens=4, temperature=0.5)
    assert out.choices[0].message.content == "hello big world hello"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens == 4
    assert out.choices[0].message.audio is None
    assert idle(srv.orch)


async def test_chat_text_streaming_with_usage(srv: Server) -> None:
    stream = await srv.client().chat.completions.create(
        model="acme/omni-test", messages=[{"role": "user", "content": PROMPT}], max_tokens=5, stream=True,
        stream_options={"include_usage": True})
    deltas, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(deltas) == "hello big world hello big"
    assert finish == "stop" and usage is not None and usage.completion_tokens == 5


async def test_chat_audio_out(srv: Server) -> None:
    out = await srv.client().chat.completions.create(
        model="acme/omni-test", messages=[{"role": "user", "content": PROMPT}], max_tokens=3,
        modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    msg = out.choices[0].message
    assert msg.content == "hello big world"
    assert msg.audio is not None and msg.audio.transcript and msg.audio.expires_at > 0
    audio, rate = sf.read(io.BytesIO(base64.b64decode(msg.audio.data)))
    assert rate == RATE and audio.shape == (3 * SAMPLES,)
    assert 0.05 < np.abs(audio).max() <= 0.11  # the synthetic vocoder's 0.1 sine


async def test_chat_audio_out_streaming(srv: Server) -> None:
    stream = await srv.client().chat.completions.create(
        model="acme/omni-test", messages=[{"role": "user", "content": PROMPT}], max_tokens=3, stream=True,
        modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"})
    pcm, text, transcripts, ids = b"", "", [], set()
    async for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        audio = getattr(delta, "audio", None)
        if audio:
            ids.add(audio.id)
            pcm += base64.b64decode(audio.data or "")
            transcripts.append(audio.transcript or "")
    assert text == "hello big world"
    assert len(pcm) == 3 * SAMPLES * 2 and len(ids) == 1
    assert "".join(transcripts).split() == ["hello", "big", "world"]


async def test_chat_n_choices_whole_and_streamed_with_audio(srv: Server) -> None:
    """n > 1: each choice is its own pipeline request; choices come back indexed, usage adds up."""
    client, msgs = srv.client(), [{"role": "user", "content": PROMPT}]
    out = await client.chat.completions.create(model="acme/omni-test", messages=msgs, max_tokens=3, n=3, seed=7,
                                               modalities=["text", "audio"], audio={"voice": "a", "format": "wav"})
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(c.message.content == "hello big world" and c.message.audio.data for c in out.choices)
    assert len({c.message.audio.id for c in out.choices}) == 3
    assert out.usage.completion_tokens == 9
    stream = await client.chat.completions.create(model="acme/omni-test", messages=msgs, max_tokens=4, n=2,
                                                  stream=True, stream_options={"include_usage": True})
    text, finish, usage = {0: "", 1: ""}, {}, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert text == {0: "hello big world hello", 1: "hello big world hello"}
    assert finish == {0: "stop", 1: "stop"} and usage.completion_tokens == 8
    # (the client may read [DONE] a moment before the route has left its calls: then idle, nothing left over)
    await eventually(lambda: idle(srv.orch) and srv.orch.statistics().requests_in_flight == 0)


def _wav_b64(seconds: float, rate: int = 16000) -> str:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(int(seconds * rate), np.float32), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def _png_data_url() -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 6), (10, 20, 30)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def test_chat_audio_and_image_in(srv: Server) -> None:
    content = [
        {"type": "text", "text": "describe these"},
        {"type": "image_url", "image_url": {"url": _png_data_url()}},
        {"type": "input_audio", "input_audio": {"data": _wav_b64(0.2), "format": "wav"}},
    ]
    out = await srv.client().chat.completions.create(
        model="acme/omni-test", messages=[{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": content}], max_tokens=2)
    assert out.choices[0].message.content == "describe these"


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "pcm"])
async def test_speech_formats(srv: Server, fmt: str) -> None:
    resp = await srv.client().audio.speech.create(model="acme/omni-test", input=PROMPT, voice="alloy",
                                                  response_format=fmt)
    data = resp.content
    if fmt == "pcm":
        assert len(data) == 4 * SAMPLES * 2
        return
    audio, rate = sf.read(io.BytesIO(data))
    assert rate in (RATE, 48000) and audio.size > 0


def _pitches_hz(audio: np.ndarray, chunk: float) -> list[float]:
    """The tone in the middle half of each vocoder chunk (`chunk` samples long), to 1 Hz."""
    found = []
    for i in range(round(audio.size / chunk)):
        seg = audio[round(i * chunk + chunk / 4) : round(i * chunk + 3 * chunk / 4)]
        spectrum = np.abs(np.fft.rfft(seg * np.hanning(seg.size), n=RATE))
        found.append(float(np.argmax(spectrum)))  # bins of 1 Hz
    return found


@pytest.mark.parametrize("speed", [0.5, 2.0])  # (at 4x a 0.1 s chunk is shorter than the stretch's frames)
async def test_speech_speed_changes_duration_not_pitch(srv: Server, speed: float) -> None:
    """The synthetic voice (a tone a chunk, each its own) has no speed knob: the API stretches it in time."""
    client = srv.client()
    plain, fast = [await client.audio.speech.create(model="acme/omni-test", input=PROMPT, voice="alloy",
                                                    response_format="pcm", speed=s) for s in (1.0, speed)]
    a, b = (np.frombuffer(r.content, "<i2").astype(np.float32) for r in (plain, fast))
    assert b.size == round(a.size / speed)
    tones, kept = _pitches_hz(a, SAMPLES), _pitches_hz(b, SAMPLES / speed)
    assert len(set(tones)) > 1 and len(kept) == len(tones)
    assert all(abs(x - y) <= 4 for x, y in zip(tones, kept, strict=True)), (tones, kept)  # resampled: x speed
    assert 0.8 < np.sqrt(np.mean(b**2) / np.mean(a**2)) < 1.2


async def test_speech_with_streaming_response(srv: Server) -> None:
    client = srv.client()
    for fmt in ("wav", "pcm", "mp3"):
        parts = []
        async with client.audio.speech.with_streaming_response.create(
                model="acme/omni-test", input=PROMPT, voice="alloy", response_format=fmt,
                extra_body={"stream": True}) as resp:
            assert resp.headers.get("transfer-encoding") == "chunked"
            async for part in resp.iter_bytes():
                parts.append(part)
        data = b"".join(parts)
        if fmt == "pcm":
            assert len(data) == 4 * SAMPLES * 2
        else:
            audio, _ = sf.read(io.BytesIO(data))
            assert audio.size > 0


async def test_speech_sse(srv: Server) -> None:
    body = {"model": "acme/omni-test", "input": PROMPT, "response_format": "pcm", "stream_format": "sse"}
    status, raw = await post(srv, "/v1/audio/speech", body)
    assert status == 200
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    import json

    parsed = [json.loads(e) for e in events]
    deltas = [p for p in parsed if p["type"] == "speech.audio.delta"]
    assert sum(len(base64.b64decode(d["audio"])) for d in deltas) == 4 * SAMPLES * 2
    assert parsed[-1]["type"] == "speech.audio.done" and parsed[-1]["usage"]["input_tokens"] == 3


async def test_metrics_and_openapi(srv: Server) -> None:
    await srv.client().chat.completions.create(
        model="acme/omni-test", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    async with aiohttp.ClientSession() as session:
        async with session.get(srv.url + "/metrics") as resp:
            text = await resp.text()
        async with session.get(srv.url + "/openapi.json") as resp:
            spec = await resp.json()
    assert 'omni_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in text
    assert "omni_time_to_first_token_seconds_count" in text
    assert 'omni_stage_queue_depth{model_stage="vocoder",pipeline="acme/omni-test",stage_id="2"} 0.0' in text
    validate(spec)
    assert {"/v1/chat/completions", "/v1/audio/speech", "/v1/models"} <= set(spec["paths"])
