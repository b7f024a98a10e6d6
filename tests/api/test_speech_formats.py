"""Speech files as players and parsers read them, on a real server driven by the openai SDK: a whole WAV states
its sizes (Python's `wave` module believes them), a streamed one keeps the open-ended header."""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import AsyncIterator

import pytest

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
