"""The shared end-to-end checks of a TTS family, driven by the openai SDK against a real server.

A family's test module (test_<family>_speech.py) defines the fixtures `fam` (a `Family`),
`model_dir` (its tiny folder), `data_dir` and `srv` (`serve_family` for the module: the
folder served as `omni-run --model DIR` serves it, with a private voice store), most simply
as `fam, model_dir, data_dir, srv = family_fixtures(FAMILY)`, and imports the `test_*`
functions below. Custom voices are checked across a server restart.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import av
import numpy as np
import openai
import pytest
import soundfile as sf
from aiohttp import web

from omni_actors.api.app import build_app
from omni_actors.api.voice_store import VoiceStore
from omni_actors.api.voices import VOICES_KEY
from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from omni_actors.store import Store
from tests.api.conftest import Server, eventually, idle, running

TEXT = "Hello there, how are you?"
KEY = "speech-key"


@dataclass(frozen=True)
class Family:
    pipeline: str
    rate: int
    frame: int
    """Samples per code frame (audio comes in whole frames)."""
    voices: tuple[str, ...]

    @property
    def model(self) -> str:
        return f"tiny-{self.pipeline}"


@contextlib.asynccontextmanager
async def serve_family(folder: Path, data: Path) -> AsyncIterator[Server]:
    """The folder served with detected pipeline and default placement (as `omni-run --model`)."""
    deploy = served_folder(str(folder), {"model": str(folder), "server": {"api_keys": [KEY]}})
    store = Store(data)
    async with running(deploy) as orch:
        app = build_app(orch)
        app[VOICES_KEY] = VoiceStore(store)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        try:
            yield Server(orch, f"http://{host}:{port}", KEY)
        finally:
            await runner.cleanup()
            store.close()


def family_fixtures(family: Family) -> tuple:
    """The module-scoped fixtures `fam`, `model_dir` (the tiny folder), `data_dir` and `srv` of a family."""

    @pytest.fixture(scope="module")
    def fam() -> Family:
        return family

    @pytest.fixture(scope="module")
    def model_dir(tmp_path_factory) -> Path:
        return make_tiny(family.pipeline, tmp_path_factory.mktemp("models") / family.model, seed=0)

    @pytest.fixture(scope="module")
    def data_dir(tmp_path_factory) -> Path:
        return tmp_path_factory.mktemp("data")

    @pytest.fixture(scope="module")
    async def srv(model_dir, data_dir) -> AsyncIterator[Server]:
        async with serve_family(model_dir, data_dir) as server:
            yield server

    return fam, model_dir, data_dir, srv


PCM_RATE = 24000
"""The speech API's pcm: OpenAI's 24 kHz 16-bit mono, whatever the model's rate."""


def _decode(data: bytes, fmt: str, rate: int) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, PCM_RATE
    if fmt in ("wav", "flac"):
        audio, rate = sf.read(io.BytesIO(data), dtype="float32")
        return audio, rate
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(stream)]
        return np.concatenate(frames), stream.rate


async def _wav(srv: Server, fam: Family, **kw) -> tuple[np.ndarray, int]:
    resp = await srv.client().audio.speech.create(model=fam.model, input=TEXT, response_format="wav", **kw)
    audio, rate = sf.read(io.BytesIO(resp.content), dtype="float32")
    return audio, rate


async def test_detected_served_and_voices_listed(srv: Server, fam: Family) -> None:
    assert srv.orch.pipeline.name == fam.pipeline
    model = await srv.client().models.retrieve(fam.model)
    assert model.model_extra["voices"] == list(fam.voices)


async def test_audio_at_the_family_rate_deterministic_for_a_seed(srv: Server, fam: Family) -> None:
    a, rate = await _wav(srv, fam, voice=fam.voices[0], extra_body={"seed": 7})
    b, _ = await _wav(srv, fam, voice=fam.voices[0], extra_body={"seed": 7})
    c, _ = await _wav(srv, fam, voice=fam.voices[0], extra_body={"seed": 8})
    assert rate == fam.rate
    assert a.size and a.size % fam.frame == 0  # whole code frames
    assert a.size == b.size and np.allclose(a, b, atol=1e-4)
    assert a.size != c.size or not np.allclose(a, c, atol=1e-3)
    await eventually(lambda: idle(srv.orch))


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
async def test_every_format_decodes(srv: Server, fam: Family, fmt: str) -> None:
    resp = await srv.client().audio.speech.create(model=fam.model, input=TEXT, voice="alloy",
                                                  response_format=fmt, extra_body={"seed": 1})
    audio, rate = _decode(resp.content, fmt, fam.rate)
    assert audio.size > 0.5 * rate and rate in ((PCM_RATE,) if fmt == "pcm" else (fam.rate, 48000))
    if fmt != "opus":  # (Ogg Opus decodes at 48 kHz whatever rate it was encoded at, which the header gives)
        assert resp.response.headers["X-Sample-Rate"] == str(rate)


async def test_speed_changes_duration(srv: Server, fam: Family) -> None:
    slow, _ = await _wav(srv, fam, voice=fam.voices[1], speed=0.25, extra_body={"seed": 3})
    fast, _ = await _wav(srv, fam, voice=fam.voices[1], speed=4.0, extra_body={"seed": 3})
    assert 12 < slow.size / fast.size < 20  # 16x, give or take the resampler's edges


def _usage_counts_tokens(usage: dict, samples: int, fam: Family) -> None:
    """The AR stage's tokens: its prompt in, a token (step) per code frame out, at least."""
    frames = int(samples * fam.rate / PCM_RATE / fam.frame)
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens"] >= frames > 0, (usage, frames)


async def test_sse_deltas_arrive_before_done(srv: Server, fam: Family) -> None:
    body = {"model": fam.model, "input": TEXT, "voice": "verse", "response_format": "pcm",
            "stream_format": "sse", "seed": 2}
    events = []
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(
            srv.url + "/v1/audio/speech", json=body) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        async for line in resp.content:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and kinds.count("speech.audio.done") == 1
    assert kinds.count("speech.audio.delta") >= 2  # the codec's first window, then the rest
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    samples = len(pcm) // 2  # 24 kHz: whole code frames at the model's rate, resampled
    _usage_counts_tokens(events[-1]["usage"], samples, fam)
    assert len(pcm) % 2 == 0 and abs(samples - round(samples * fam.rate / PCM_RATE / fam.frame) * fam.frame
                                     * PCM_RATE / fam.rate) < 0.01 * PCM_RATE, samples


async def test_plain_streaming_sends_encoded_bytes(srv: Server, fam: Family) -> None:
    async with srv.client().audio.speech.with_streaming_response.create(
            model=fam.model, input=TEXT, voice=fam.voices[0], response_format="mp3",
            extra_body={"stream_format": "audio", "seed": 4}) as resp:
        assert resp.headers.get("transfer-encoding") == "chunked"
        data = b"".join([part async for part in resp.iter_bytes()])
    audio, _ = _decode(data, "mp3", fam.rate)
    assert audio.size > fam.rate // 2


async def test_bad_voice_instructions_and_sizes_are_400s(srv: Server, fam: Family) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice="nobody")
    body = err.value.body
    assert body["param"] == "voice" and f"'{fam.voices[0]}'" in body["message"] and "alloy" in body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice=fam.voices[0], instructions="whisper")
    assert err.value.body["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice="x" * 500)
    assert err.value.body["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice=fam.voices[0], instructions="x" * 10_000)
    assert err.value.body["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=fam.model, input=TEXT, voice={"id": "voice_missing"})
    assert err.value.body["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:  # was the stage's rejection, naming no field
        await client.audio.speech.create(model=fam.model, input=" \n\t ", voice=fam.voices[0])
    assert err.value.body["param"] == "input"


def _clip(seconds: float = 1.0, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


async def test_custom_voices_clone_and_survive_a_restart(srv: Server, fam: Family, model_dir, data_dir) -> None:
    client = srv.client()
    consent = await client.audio.voice_consents.create(recording=("consent.wav", _clip(), "audio/wav"),
                                                       language="en-US", name="me")
    assert consent.id.startswith("cons_") and consent.name == "me"
    assert (await client.audio.voice_consents.retrieve(consent.id)).language == "en-US"
    renamed = await client.audio.voice_consents.update(consent.id, name="still me")
    assert renamed.name == "still me"
    listed = [c.id async for c in client.audio.voice_consents.list(limit=1)]
    assert consent.id in listed
    voice = await client.audio.voices.create(audio_sample=("me.wav", _clip(2.0), "audio/wav"),
                                             consent=consent.id, name="my voice",
                                             extra_body={"transcript": "A low hum."})
    assert voice.id.startswith("voice_") and voice.type == "audio_sample"
    plain, _ = await _wav(srv, fam, voice=fam.voices[0], extra_body={"seed": 5})
    cloned, rate = await _wav(srv, fam, voice={"id": voice.id}, extra_body={"seed": 5})
    assert rate == fam.rate and cloned.size and (cloned.size != plain.size or not np.allclose(cloned, plain))
    with pytest.raises(openai.ConflictError):
        await client.audio.voice_consents.delete(consent.id)
    # a restart: new workers, a new app, the store reopened from disk
    async with serve_family(model_dir, data_dir) as again:
        c2 = again.client()
        async with aiohttp.ClientSession(headers=again.headers) as s, s.get(again.url + "/v1/audio/voices") as r:
            ids = [v["id"] for v in (await r.json())["data"]]
        assert voice.id in ids
        again_cloned, _ = await _wav(again, fam, voice={"id": voice.id}, extra_body={"seed": 5})
        assert again_cloned.size == cloned.size and np.allclose(again_cloned, cloned, atol=1e-4)
        assert (await c2.audio.voices.delete(voice.id)).deleted
        assert (await c2.audio.voice_consents.delete(consent.id)).deleted
        with pytest.raises(openai.NotFoundError):
            await c2.audio.voice_consents.retrieve(consent.id)


async def speech_until_done(ws, events: list[dict] | None = None) -> tuple[list[dict], bytes]:
    """The text-in socket's events up to `speech.audio.done` (after `events`, already read) and the
    PCM of their deltas."""
    events = list(events or [])
    while not events or events[-1]["type"] != "speech.audio.done":
        events.append(await ws.receive_json())
    return events, b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


async def test_text_in_socket_speaks_before_done_in_order(srv: Server, fam: Family) -> None:
    """WebSocket /v1/audio/speech/stream: text token by token; the first audio arrives before
    input_text.done is sent; a bad update is an `error` and the session lives on; two texts in a row."""
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.ws_connect(
            srv.url.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json({"type": "session.update", "session": {"voice": "nobody"}})
        err = await ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "session.voice"  # (as session.model is named)
        await ws.send_json({"type": "session.update", "session": {"voice": fam.voices[1], "response_format": "pcm",
                                                                 "seed": 9}})
        assert (await ws.receive_json())["session"]["voice"] == fam.voices[1]
        for token in ["Hello", " there", ",", " friend", ".", " And", " then"]:
            await ws.send_json({"type": "input_text.append", "text": token})
        first = await ws.receive_json()  # sent before input_text.done: the first clauses speak already
        assert first["type"] == "speech.audio.delta"
        await ws.send_json({"type": "input_text.append", "text": " goodbye."})
        await ws.send_json({"type": "input_text.done"})
        events, pcm = await speech_until_done(ws, [first])
        _usage_counts_tokens(events[-1]["usage"], len(pcm) // 2, fam)
        # the same text again in the same session gives the same audio (clauses in text order)
        await ws.send_json({"type": "input_text.append", "text": "Hello there, friend. And then goodbye."})
        await ws.send_json({"type": "input_text.done"})
        _, pcm2 = await speech_until_done(ws)
        assert len(pcm) == len(pcm2) and len(pcm) >= 3 * 2 * fam.frame
        a, b = (np.frombuffer(x, "<i2").astype(np.int32) for x in (pcm, pcm2))
        assert np.abs(a - b).max() <= 4
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_text_in_socket_closed_mid_text_leaves_nothing_running(srv: Server, fam: Family) -> None:
    async with aiohttp.ClientSession(headers=srv.headers) as s:
        ws = await s.ws_connect(srv.url.replace("http", "ws") + "/v1/audio/speech/stream")
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json({"type": "input_text.append", "text": "One, two, three, four, five, six. Seven"})
        assert (await ws.receive_json())["type"] == "speech.audio.delta"
        await ws.close()
    await eventually(lambda: idle(srv.orch), timeout_s=10)
    # the server is fine afterwards
    audio, rate = await _wav(srv, fam, voice=fam.voices[0], extra_body={"seed": 1})
    assert rate == fam.rate and audio.size
