"""Speech files as players and parsers read them, on a real server driven by the openai SDK: a whole WAV states
its sizes (Python's `wave` module believes them), a streamed one keeps the open-ended header; AAC of any model
rate opens (FFmpeg's decoder reads it back)."""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import AsyncIterator

import av
import numpy as np
import pytest

from omni_actors.api.speech_audio import SpeechEncoder, wire_rate
from tests.api.conftest import Server
from tests.api.test_speech_rates import CHUNKS, MODEL_RATE, SAMPLES, TEXT, serve_voiced


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[Server]:
    async with serve_voiced() as s:
        yield s


@pytest.mark.parametrize("speed", [1.0, 2.0])
async def test_a_whole_wav_states_its_sizes(srv: Server, speed: float) -> None:
    raw = await srv.client().audio.speech.with_raw_response.create(
        model="synthetic", input=TEXT, voice="alloy", response_format="wav", speed=speed)
    body = raw.content
    assert int(raw.headers["content-length"]) == len(body)
    riff, data = struct.unpack("<I", body[4:8])[0], struct.unpack("<I", body[40:44])[0]
    assert (riff, data) == (len(body) - 8, len(body) - 44)
    with wave.open(io.BytesIO(body)) as w:
        assert w.getframerate() == MODEL_RATE and w.getnchannels() == 1 and w.getsampwidth() == 2
        frames = w.getnframes()
        assert frames == data // 2 == len(w.readframes(frames)) // 2
    if speed == 1.0:
        assert frames == CHUNKS * SAMPLES
    else:  # twice as fast: about half the samples
        assert abs(frames - CHUNKS * SAMPLES / 2) < SAMPLES


async def test_a_streamed_wav_keeps_the_open_ended_header(srv: Server) -> None:
    async with srv.client().audio.speech.with_streaming_response.create(
            model="synthetic", input=TEXT, voice="alloy", response_format="wav", stream_format="audio") as resp:
        body = await resp.read()
    assert body[4:8] == body[40:44] == b"\xff\xff\xff\xff"
    assert len(body) == 44 + 2 * CHUNKS * SAMPLES


@pytest.mark.parametrize(("rate", "carried"), [(7000, 7350), (192_000, 96_000), (22_050, 22_050)])
async def test_aac_of_a_rate_it_cannot_carry_is_resampled_not_a_failure(rate: int, carried: int) -> None:
    """FFmpeg's AAC encoder opens only at AAC's own rates: speech from a model at another rate was a 500
    (`avcodec_open2` refused); it goes out at the nearest AAC rate, as mp3 and opus do, and says so."""
    enc = SpeechEncoder("aac", rate)
    t = np.arange(rate) / rate
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    body = b"".join([await enc.feed(tone[i : i + 4000]) for i in range(0, rate, 4000)]) + await enc.finish()
    assert enc.out_rate == wire_rate("aac", rate) == carried
    with av.open(io.BytesIO(body)) as box:
        frames = list(box.decode(audio=0))
    assert {f.sample_rate for f in frames} == {carried}
    heard = sum(f.samples for f in frames) / carried
    assert 1.0 <= heard < 1.3, heard  # one second, plus the encoder's priming and last-frame padding
