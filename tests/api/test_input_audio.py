"""Client audio is bounded and checked the same way on every route, before it is decoded or resampled.

Chat `input_audio` (synthetic pipeline) and /v1/audio/transcriptions (synthetic_asr, whose
transcript says how many samples at what rate reached it) over real HTTP: a WAV declaring
1 Hz, a too-long clip, a header-only WAV and NaN samples are each a 400 naming the field and
the limit, answered without reaching a stage; the workers keep serving.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import struct
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from omni_actors import settings as settings_mod
from omni_actors.audio import Resampler, pcm16, resample
from tests.api.conftest import Server, post, serve

CHAT = "/v1/chat/completions"
TRANSCRIBE = "/v1/audio/transcriptions"
AUDIO_PARAM = "messages[0].content[0].input_audio.data"


def wav(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def wav_declaring(rate: int, n_bytes: int) -> bytes:
    """A PCM16 mono WAV of n_bytes of silence whose header says `rate` Hz."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + n_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", n_bytes) + bytes(n_bytes))


ONE_HZ = wav_declaring(1, 20_000)
"""20 KB of samples at 1 Hz: resampled to 16 kHz it would be 160 M samples."""
HEADER_ONLY = wav(np.zeros(0, np.float32), 16_000)
NAN = wav(np.array([0.1, np.nan, np.inf, 0.2] * 100, np.float32), 16_000, "FLOAT")
GOOD = wav(np.zeros(1600, np.float32), 16_000)


@pytest.fixture(scope="module")
async def chat_srv():
    async with serve("synthetic") as s:
        yield s


@pytest.fixture(scope="module")
async def asr_srv():
    async with serve("synthetic_asr") as s:
        yield s


def chat_body(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
    return {"model": "synthetic", "messages": [{"role": "user", "content": [part]}], "max_tokens": 2}


async def transcribe(srv: Server, data: bytes) -> tuple[int, Any]:
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("file", data, filename="a.wav", content_type="audio/wav")
    form.add_field("model", "synthetic_asr")
    async with aiohttp.ClientSession(headers=srv.headers) as http, http.post(srv.url + TRANSCRIBE,
                                                                            data=form) as resp:
        return resp.status, await resp.json()


CASES = [
    pytest.param(ONE_HZ, "audio_rate_out_of_range", "input_audio_min_rate_hz", id="1-hz-wav"),
    pytest.param(HEADER_ONLY, "empty_audio", "no samples", id="header-only-wav"),
    pytest.param(NAN, "invalid_audio", "NaN", id="nan-float-wav"),
]


@pytest.mark.parametrize(("data", "code", "says"), CASES)
async def test_bad_audio_is_the_same_400_in_chat_and_transcription(
        chat_srv: Server, asr_srv: Server, data: bytes, code: str, says: str) -> None:
    before = chat_srv.orch.statistics().requests_total, asr_srv.orch.statistics().requests_total
    status, body = await post(chat_srv, CHAT, chat_body(data))
    assert status == 400 and body["error"]["param"] == AUDIO_PARAM and body["error"]["code"] == code, body
    assert says in body["error"]["message"] and AUDIO_PARAM in body["error"]["message"]
    status, body = await transcribe(asr_srv, data)
    assert status == 400 and body["error"]["param"] == "file" and body["error"]["code"] == code, body
    assert says in body["error"]["message"]
    assert (chat_srv.orch.statistics().requests_total, asr_srv.orch.statistics().requests_total) == before
    # the workers are alive and serve the next request
    status, body = await transcribe(asr_srv, GOOD)
    assert (status, body["text"]) == (200, "1600 samples at 16000 Hz"), body
    status, body = await post(chat_srv, CHAT, chat_body(GOOD))
    assert status == 200 and body["choices"][0]["message"]["content"], body


async def test_duration_limit_names_its_setting(chat_srv: Server, asr_srv: Server,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings_mod, "_settings", dataclasses.replace(settings_mod.settings(), max_input_audio_s=0.05))
    status, body = await transcribe(asr_srv, GOOD)  # 0.1 s
    assert (status, body["error"]["code"], body["error"]["param"]) == (400, "audio_too_long", "file"), body
    assert "max_input_audio_s" in body["error"]["message"]
    raw_pcm = bytes(2 * 4800)  # 0.2 s of raw pcm16 at 24 kHz: checked from its length
    status, body = await post(chat_srv, CHAT, chat_body(raw_pcm, "pcm16"))
    assert (status, body["error"]["code"], body["error"]["param"]) == (400, "audio_too_long", AUDIO_PARAM), body


async def test_upload_at_another_rate_reaches_the_stage_at_its_own_rate(asr_srv: Server) -> None:
    status, body = await transcribe(asr_srv, wav(np.zeros(4410, np.float32), 44_100))
    assert (status, body["text"]) == (200, "4410 samples at 44100 Hz"), body


@pytest.mark.parametrize(("src", "dst"), [(44_100, 16_000), (8_000, 24_000)])
def test_stream_resampler_matches_the_whole_clip(src: int, dst: int) -> None:
    x = (0.5 * np.sin(2 * np.pi * 300 * np.arange(src) / src)).astype(np.float32)
    r = Resampler(src, dst)
    chunked = np.concatenate([r.push(x[i:i + 1000]) for i in range(0, x.size, 1000)] + [r.flush()])
    whole = resample(x, src, dst)
    assert whole.size == dst and np.array_equal(whole, chunked)
    ref = 0.5 * np.sin(2 * np.pi * 300 * np.arange(dst) / dst)
    assert np.abs(whole[100:-100] - ref[100:-100]).max() < 1e-3


@pytest.mark.parametrize(("field", "size"), [("language", 300), ("prompt", 70_000)])
async def test_transcription_text_fields_are_bounded(asr_srv: Server, field: str, size: int) -> None:
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("file", GOOD, filename="a.wav", content_type="audio/wav")
    form.add_field("model", "synthetic_asr")
    form.add_field(field, "x" * size)
    async with aiohttp.ClientSession(headers=asr_srv.headers) as http, http.post(asr_srv.url + TRANSCRIBE,
                                                                                data=form) as resp:
        body = await resp.json()
    assert (resp.status, body["error"]["param"]) == (400, field), body


def test_pcm16_clips_and_writes_nan_as_silence_without_touching_its_input() -> None:
    x = np.array([0.5, -0.25, np.nan, np.inf, -np.inf, 1.5, -2.0, 0.0], np.float32)
    before = x.copy()
    out = np.frombuffer(pcm16(x), dtype="<i2")
    assert out.tolist() == [16383, -8191, 0, 32767, -32767, 32767, -32767, 0]
    assert np.array_equal(x, before, equal_nan=True)
    assert pcm16(x.astype(np.float64)) == pcm16(x)
