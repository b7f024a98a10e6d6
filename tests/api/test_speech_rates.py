"""Speech rates, seeds and voices, on a real server driven by the openai SDK: pcm is OpenAI's 24 kHz whatever
the model's rate, every response says its rate, the text-in socket keeps one seed, chat checks `audio.voice`."""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import numpy as np
import openai
import pytest
import soundfile as sf

from omni_actors.api.app import build_app
from omni_actors.api.audio_codec import encode_file
from omni_actors.api.server import start_server
from omni_actors.config.pipeline import get_pipeline
from omni_actors.config.speech import SpeechSpec
from tests.api.conftest import Server, make_deploy, running

MODEL_RATE = 22050
"""The synthetic vocoder's rate here: Piper's, not the 24 kHz of OpenAI's pcm."""
SAMPLES = 2400
CHUNKS = 4
PCM_SAMPLES = round(CHUNKS * SAMPLES * 24000 / MODEL_RATE)
VOICES = ("tone", "hum")
TEXT = "hello big world"
WS_TIMEOUT_S = 30


@contextlib.asynccontextmanager
async def serve_voiced(samples: int = SAMPLES, **first_stage: Any) -> AsyncIterator[Server]:
    """The synthetic pipeline declaring built-in voices at MODEL_RATE (as a TTS model does), real workers;
    `samples` per audio chunk, and `first_stage`: more deploy fields of its first stage (`max_queue`, ...)."""
    pipe = msgspec.structs.replace(get_pipeline("synthetic"), speech=SpeechSpec(voices=VOICES, sample_rate=MODEL_RATE))
    stages = [{"stage_id": 0, "engine_extras": {"chunks": CHUNKS}, **first_stage}, {"stage_id": 1},
              {"stage_id": 2, "engine_extras": {"sample_rate": MODEL_RATE, "samples": samples}}]
    deploy = make_deploy("synthetic", stages=stages)
    async with running(deploy, pipeline=pipe) as orch:
        http = await start_server(build_app(orch), "127.0.0.1", 0, deploy.server)
        try:
            yield Server(orch, http.url, None, http)
        finally:
            await http.close()


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    async with serve_voiced() as s:
        yield s


async def _speech(srv: Server, fmt: str, **extra: Any) -> tuple[bytes, int]:
    raw = await srv.client().audio.speech.with_raw_response.create(
        model="synthetic", input=TEXT, voice="alloy", response_format=fmt, extra_body=extra or None)
    return raw.content, int(raw.headers["x-sample-rate"])


async def test_pcm_is_24khz_and_every_format_says_its_rate(srv: Server) -> None:
    pcm, rate = await _speech(srv, "pcm")
    assert rate == 24000 and len(pcm) == 2 * PCM_SAMPLES
    wav, wav_rate = await _speech(srv, "wav")
    native, sr = sf.read(io.BytesIO(wav), dtype="float32")
    assert wav_rate == sr == MODEL_RATE and native.size == CHUNKS * SAMPLES
    # the same audio, resampled: the tone of each chunk is where it was
    heard = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    spectrum = [np.argmax(np.abs(np.fft.rfft(x[: x.size // 4]))) * r / (x.size // 4)
                for x, r in ((native, MODEL_RATE), (heard, 24000))]
    assert abs(spectrum[0] - spectrum[1]) < 20
    for fmt in ("flac", "mp3", "opus", "aac"):
        data, said = await _speech(srv, fmt)
        assert said == (24000 if fmt == "opus" else MODEL_RATE), fmt
        if fmt in ("flac", "mp3"):
            assert sf.info(io.BytesIO(data)).samplerate == said


async def test_streamed_pcm_is_24khz_too(srv: Server) -> None:
    async with srv.client().audio.speech.with_streaming_response.create(
            model="synthetic", input=TEXT, voice="alloy", response_format="pcm",
            extra_body={"stream": True}) as resp:
        assert resp.headers["x-sample-rate"] == "24000"
        data = b"".join([part async for part in resp.iter_bytes()])
    assert len(data) == 2 * PCM_SAMPLES
    async with srv.client().audio.speech.with_streaming_response.create(
            model="synthetic", input=TEXT, voice="alloy", response_format="pcm",
            extra_body={"stream_format": "sse"}) as resp:
        assert resp.headers["x-sample-rate"] == "24000"
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([part async for part in resp.iter_bytes()])
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    assert sum(len(base64.b64decode(e["audio"])) for e in events
                                 if e["type"] == "speech.audio.delta") == 2 * PCM_SAMPLES


async def test_sse_says_the_rate_of_its_bytes_as_the_other_modes_do(srv: Server) -> None:
    """docs/speech.md said SSE answers have no X-Sample-Rate; each has the rate of the bytes in its deltas."""
    for fmt, rate in (("mp3", MODEL_RATE), ("opus", 24000), ("wav", MODEL_RATE)):
        async with srv.client().audio.speech.with_streaming_response.create(
                model="synthetic", input=TEXT, voice="alloy", response_format=fmt,
                extra_body={"stream_format": "sse"}) as resp:
            said = int(resp.headers["x-sample-rate"])
            raw = b"".join([part async for part in resp.iter_bytes()])
        events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: ")]
        data = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
        assert said == rate, fmt
        if fmt != "opus":  # (libsndfile reads mp3 and a streamed wav; an Ogg Opus stream says 48 kHz)
            assert sf.info(io.BytesIO(data)).samplerate == said, fmt


async def test_streamed_flac_is_the_same_samples_as_the_whole_file(srv: Server) -> None:
    """(flac is encoded at the end even when streamed: see audio_codec.py; a client still gets a whole file.)"""
    whole, _ = await _speech(srv, "flac")
    async with srv.client().audio.speech.with_streaming_response.create(
            model="synthetic", input=TEXT, voice="alloy", response_format="flac",
            extra_body={"stream": True}) as resp:
        streamed = b"".join([part async for part in resp.iter_bytes()])
    a, b = (sf.read(io.BytesIO(x), dtype="int16")[0] for x in (whole, streamed))
    assert a.size == CHUNKS * SAMPLES and np.array_equal(a, b)


async def _events_until(ws: aiohttp.ClientWebSocketResponse, last: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while not got or got[-1]["type"] not in (last, "error"):
        got.append(json.loads((await ws.receive(timeout=WS_TIMEOUT_S)).data))
    return got


async def test_text_socket_says_its_rate_and_speaks_every_clause_with_one_seed(
        srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    seeds: list[Any] = []
    submit = srv.orch.submit
    monkeypatch.setattr(srv.orch, "submit", lambda spec: (seeds.append(spec.params.get("seed")), submit(spec))[1])
    async with aiohttp.ClientSession() as http, http.ws_connect(f"{srv.url}/v1/audio/speech/stream") as ws:
        created = (await _events_until(ws, "session.created"))[-1]["session"]
        assert created["response_format"] == "pcm" and created["sample_rate"] == 24000
        assert isinstance(created["seed"], int)
        for text, clauses in (("One, two, three.", 3), ("Four, five.", 2)):
            await ws.send_str(json.dumps({"type": "input_text.append", "text": text}))
            await ws.send_str(json.dumps({"type": "input_text.done"}))
            events = await _events_until(ws, "speech.audio.done")
            assert events[-1]["type"] == "speech.audio.done", events[-1]
            audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
            assert len(audio) == 2 * round(clauses * CHUNKS * SAMPLES * 24000 / MODEL_RATE)  # one text, one stream
        assert len(seeds) == 5 and set(seeds) == {created["seed"]}
        await ws.send_str(json.dumps({"type": "session.update", "session": {**created, "response_format": "wav",
                                                                            "seed": 7}}))
        updated = (await _events_until(ws, "session.updated"))[-1]
        assert updated["type"] == "session.updated", updated
        assert (updated["session"]["sample_rate"], updated["session"]["seed"]) == (MODEL_RATE, 7)
        await ws.send_str(json.dumps({"type": "input_text.append", "text": "Six, seven."}))
        await ws.send_str(json.dumps({"type": "input_text.done"}))
        await _events_until(ws, "speech.audio.done")
        assert seeds[5:] == [7, 7]


async def test_chat_refuses_an_unknown_voice_as_speech_does(srv: Server) -> None:
    client = srv.client()
    messages = [{"role": "user", "content": TEXT}]
    with pytest.raises(openai.BadRequestError) as speech:
        await client.audio.speech.create(model="synthetic", input=TEXT, voice="nobody")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as chat:
        await client.chat.completions.create(model="synthetic", messages=messages, max_tokens=2,
                                             modalities=["text", "audio"],
                                             audio={"voice": "nobody", "format": "wav"})  # type: ignore[typeddict-item]
    assert (speech.value.code, speech.value.param) == ("unknown_voice", "voice")
    assert (chat.value.code, chat.value.param) == ("unknown_voice", "audio.voice")
    assert "'nobody'" in chat.value.message and "tone" in chat.value.message
    for voice in ("hum", "alloy"):  # a built-in voice, and an OpenAI name mapped onto one
        out = await client.chat.completions.create(model="synthetic", messages=messages, max_tokens=2,
                                                   modalities=["text", "audio"],
                                                   audio={"voice": voice, "format": "wav"})  # type: ignore[typeddict-item]
        assert out.choices[0].message.audio is not None


async def test_a_lone_surrogate_escape_is_named_not_called_truncated(srv: Server) -> None:
    r"""msgspec calls a high surrogate escape with no low one after it ("\ud800") near the body's end "Input data
    was truncated" (elsewhere "unexpected end of escaped utf-16 surrogate pair"), which sent a client looking for a
    cut-off body; the 400 says what is wrong and where."""
    async with aiohttp.ClientSession() as s:
        for text, lone in ((rb"hi \uDBFF", rb"\uDBFF"), (rb"hi \ud800 there", rb"\ud800"),
                           (rb"hi \\\ud800\u0041", rb"\ud800")):  # an escaped backslash, then the escape
            body = b'{"model": "synthetic", "voice": "alloy", "input": "' + text + b'"}'
            async with s.post(srv.url + "/v1/audio/speech", data=body,
                              headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 400, (text, resp.status)
                error = (await resp.json())["error"]
            assert error["code"] == "invalid_json" and error["param"] is None, (text, error)
            assert "lone UTF-16 surrogate" in error["message"] and "truncated" not in error["message"], error
            assert f"{lone.decode()} at byte {body.index(lone)}" in error["message"], error
        async with s.post(srv.url + "/v1/audio/speech", headers={"Content-Type": "application/json"},
                          data=rb'{"model": "synthetic", "voice": "alloy", "input": "a \\ud800 b \ud83d\ude00"}'
                          ) as resp:  # an escaped backslash then "ud800" is text, and a whole pair is fine
            assert resp.status == 200, await resp.text()
            await resp.read()


async def test_chat_pcm16_is_24khz_too(srv: Server) -> None:
    """OpenAI's chat audio pcm16 is 24 kHz (the playground plays it so): a 22.05 kHz model's is resampled."""
    ask = {"model": "synthetic", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 2,
           "modalities": ["text", "audio"]}
    wav, pcm = [(await srv.client().chat.completions.create(**ask, audio={"voice": "tone", "format": fmt})
                 ).choices[0].message.audio for fmt in ("wav", "pcm16")]  # type: ignore[call-overload]
    assert wav is not None and pcm is not None
    native, rate = sf.read(io.BytesIO(base64.b64decode(wav.data)))
    assert rate == MODEL_RATE and len(base64.b64decode(pcm.data)) == 2 * round(native.size * 24000 / MODEL_RATE)


async def test_a_voice_is_not_checked_where_the_pipeline_lists_none() -> None:
    deploy = make_deploy("synthetic")
    async with running(deploy) as orch:
        http = await start_server(build_app(orch), "127.0.0.1", 0, deploy.server)
        try:
            out = await Server(orch, http.url, None, http).client().chat.completions.create(
                model="synthetic", messages=[{"role": "user", "content": TEXT}], max_tokens=2,
                modalities=["text", "audio"], audio={"voice": "anyone", "format": "wav"})  # type: ignore[typeddict-item]
        finally:
            await http.close()
    assert out.choices[0].message.audio is not None


def test_a_file_keeps_its_channels_and_an_mp3_takes_a_rate_it_can_carry() -> None:
    """audio_generation's files: [C, S] stays C channels; 10 kHz (no mp3 rate) is resampled, not refused."""
    t = np.arange(10_000) / 10_000
    stereo = np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 880 * t)]).astype(np.float32) * 0.5
    for fmt, rate in (("wav", 10_000), ("flac", 10_000), ("mp3", 11_025)):
        audio, got = sf.read(io.BytesIO(encode_file(stereo, 10_000, fmt)))
        assert got == rate and audio.shape[1] == 2, fmt
        assert abs(audio.shape[0] - rate) < 0.1 * rate
    pcm = np.frombuffer(encode_file(stereo, 10_000, "pcm"), "<i2").reshape(-1, 2)
    assert pcm.shape == (10_000, 2) and np.abs(pcm[:, 0] / 32767 - stereo[0]).max() < 1e-3
