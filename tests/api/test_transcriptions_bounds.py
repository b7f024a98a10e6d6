"""/v1/audio/transcriptions at the documented bound on an upload's length (max_input_audio_s, 3600 s by
default), checked before decoding: from the file's header where it states the length (FLAC from libsndfile's
frame count, WebM from the container's duration, which Matroska writes on the container only), else from
its packets' timestamps, demuxed but not decoded (a WebM a browser's MediaRecorder wrote, with no duration;
a FLAC stream of unknown length; an MP3 or ADTS AAC file, whose length libsndfile and FFmpeg only
estimate from its bitrate)."""

from __future__ import annotations

import dataclasses
import io
import re
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from omni_actors import settings as settings_mod
from tests.api.conftest import Server
from tests.api.test_transcriptions import SECONDS, _encoded, asr_srv, call, form

__all__ = ["asr_srv"]  # the module-scoped synthetic_asr server

OPUS_RATE = 48_000
OPUS_FRAME = 960
"""One 20 ms Opus packet's samples at 48 kHz."""
DECODED_PEAK_BYTES = 24 * 2**20
"""More Python-heap memory than refusing a 400 s upload takes without decoding it; decoding the 300 s the
limit lets through holds 300 * 48000 float32 samples (55 MiB) before it is refused."""


@pytest.fixture
def limit_s(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Set max_input_audio_s for one test (the server runs in this process and reads it per request)."""
    def set_limit(seconds: float) -> None:
        monkeypatch.setattr(settings_mod, "_settings",
                            dataclasses.replace(settings_mod.settings(), max_input_audio_s=seconds))
    yield set_limit


class _Unseekable(io.RawIOBase):
    """A sink FFmpeg cannot seek back in, as a browser's MediaRecorder streams its WebM: the Matroska muxer
    then writes no Duration."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += bytes(b)
        return len(b)


def _webm_without_duration(seconds: float) -> bytes:
    """`seconds` of Opus silence in a WebM with no duration (one encoded packet muxed over and over: fast)."""
    import av

    out = _Unseekable()
    with av.open(out, "w", format="webm") as box:
        stream = box.add_stream("libopus", rate=OPUS_RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, OPUS_FRAME), np.float32), format="flt", layout="mono")
        frame.rate, frame.pts = OPUS_RATE, 0
        first = next(p for _ in range(8) for p in stream.encode(frame))
        for i in range(int(seconds * OPUS_RATE / OPUS_FRAME)):
            packet = av.Packet(bytes(first))
            packet.stream, packet.time_base = stream, first.time_base
            packet.pts = packet.dts = first.pts + i * first.duration
            packet.duration = first.duration
            box.mux(packet)
    return bytes(out.data)


def _unknown_length_flac(samples: np.ndarray, rate: int) -> bytes:
    """A FLAC stream whose STREAMINFO says "total samples unknown" (0), as an encoder writing to a pipe does."""
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="FLAC")
    data = bytearray(buf.getvalue())
    field = slice(21, 26)  # "fLaC", the block header, then 18 bits in: the low 36 bits of bytes 21-25
    data[field] = (int.from_bytes(data[field], "big") & ~((1 << 36) - 1)).to_bytes(5, "big")
    return bytes(data)


def _encoded_at(container: str, codec: str, parts: list[tuple[float, int]], rate: int = 16_000) -> bytes:
    """Noise encoded in `parts` (seconds, bit rate) one after another, each a file of its own, concatenated
    (as MP3 and ADTS allow): a header-less stream whose first frames' bitrate is not the rest's."""
    import av

    rng = np.random.default_rng(0)
    files = []
    for seconds, bit_rate in parts:
        buf = io.BytesIO()
        with av.open(buf, "w", format=container, options={"write_xing": "0"} if container == "mp3" else {}) as box:
            stream = box.add_stream(codec, rate=rate, layout="mono")
            stream.bit_rate = bit_rate
            x = (0.2 * rng.standard_normal(int(seconds * rate))).astype(np.float32)
            step = 1152 if codec == "libmp3lame" else 1024
            for at in range(0, x.size, step):
                frame = av.AudioFrame.from_ndarray(x[None, at : at + step], format="flt", layout="mono")
                frame.rate, frame.pts = rate, at
                for packet in stream.encode(frame):
                    box.mux(packet)
            for packet in stream.encode(None):
                box.mux(packet)
        files.append(buf.getvalue())
    return b"".join(files)


async def _heard(srv: Server, data: bytes) -> tuple[int, int]:
    """(samples, rate) the recognizer was given for `data` (synthetic_asr says "N samples at R Hz")."""
    said = await srv.client().audio.transcriptions.create(model="synthetic_asr", file=("a.bin", data))
    heard = re.fullmatch(r"(\d+) samples at (\d+) Hz", said.text)
    assert heard, said.text
    return int(heard[1]), int(heard[2])


async def test_an_hour_and_a_second_of_flac_is_refused_from_its_header(asr_srv: Server) -> None:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(3601 * 8000, np.int16), 8000, format="FLAC")  # ~90 kB of silence
    before = asr_srv.orch.statistics().requests_total
    status, err = await call(asr_srv, data=form(file=buf.getvalue(), model="synthetic_asr"))
    assert (status, err["param"], err["code"]) == (400, "file", "audio_too_long"), err
    assert "audio of 3601.0 s is over the limit of 3600 s (max_input_audio_s" in err["message"], err
    assert asr_srv.orch.statistics().requests_total == before


async def test_a_webm_over_the_bound_is_refused_from_its_container_duration(
        asr_srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WebM's stream has no duration, so the whole file was decoded (an hour of 48 kHz opus: ~700 MB of
    samples and half a minute of CPU for a 1.7 MB upload) until the count of decoded samples passed the
    limit, and the error said the limit's length ("audio of 1.0 s"), not the file's."""
    monkeypatch.setattr(settings_mod, "_settings", dataclasses.replace(settings_mod.settings(), max_input_audio_s=1.0))
    for container, codec, rate in (("webm", "libopus", 48_000), ("mp4", "aac", 16_000)):
        status, err = await call(asr_srv, data=form(file=_encoded(container, codec, rate), model="synthetic_asr"))
        assert (status, err["param"], err["code"]) == (400, "file", "audio_too_long"), err
        said = re.match(r"audio of ([\d.]+) s is over the limit of 1 s", err["message"])
        assert said and abs(float(said[1]) - SECONDS) <= 0.15, (container, err)  # (give or take codec padding)


async def test_a_webm_without_a_duration_is_refused_from_its_packets_without_decoding(
        asr_srv: Server, limit_s: Any) -> None:
    """A WebM as a browser records it states no duration: it was decoded until the samples made passed the
    limit (at the default hour: ~700 MB of samples and ten seconds of CPU for a 2 MB upload). Its packets'
    timestamps say its length without decoding them; the refusal comes from them."""
    limit_s(300.0)
    data = _webm_without_duration(400.0)
    with pytest.raises(sf.LibsndfileError):
        sf.info(io.BytesIO(data))
    tracemalloc.start()
    try:
        status, err = await call(asr_srv, data=form(file=data, model="synthetic_asr"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (status, err["param"], err["code"]) == (400, "file", "audio_too_long"), err
    assert err["message"] == "audio of more than 300 s is over the limit of 300 s (max_input_audio_s; field `file`)"
    assert peak < DECODED_PEAK_BYTES, f"{peak / 2**20:.0f} MiB held while refusing: the audio was decoded"
    samples, rate = await _heard(asr_srv, _webm_without_duration(3.0))  # within the limit: decoded whole
    assert rate == OPUS_RATE and abs(samples - 3 * OPUS_RATE) <= 0.1 * OPUS_RATE


async def test_a_flac_stream_of_unknown_length_is_heard_whole(asr_srv: Server, limit_s: Any) -> None:
    """libsndfile reports such a stream as 2**63 frames: it was refused as "audio of 576460752303423.5 s"."""
    data = _unknown_length_flac(np.full(3 * 16_000, 0.01, np.float32), 16_000)
    assert sf.info(io.BytesIO(data)).frames == 2**63 - 1
    assert await _heard(asr_srv, data) == (3 * 16_000, 16_000)
    limit_s(2.0)
    status, err = await call(asr_srv, data=form(file=data, model="synthetic_asr"))
    assert (status, err["code"]) == (400, "audio_too_long"), err
    assert err["message"].startswith("audio of more than 2 s is over the limit of 2 s (max_input_audio_s"), err


async def test_mp3_and_adts_lengths_are_measured_not_estimated_from_the_bitrate(
        asr_srv: Server, limit_s: Any) -> None:
    """An MP3 without a Xing / LAME header (and any ADTS AAC) states no length; libsndfile and FFmpeg estimate
    one from the size and the first frames' bitrate. A dense start under-estimates it: libsndfile read only
    its estimate (3.5 s of 32 s: the rest of the speech silently dropped). A sparse start over-estimates it:
    a 5 s file was refused as too long for a 10 s limit ("audio of 83.2 s")."""
    cut = _encoded_at("mp3", "libmp3lame", [(2.0, 160_000), (30.0, 8_000)])
    assert sf.info(io.BytesIO(cut)).duration < 5  # (what libsndfile believes)
    samples, rate = await _heard(asr_srv, cut)
    assert rate == 16_000 and abs(samples / rate - 32.0) <= 0.2, samples / rate
    limit_s(10.0)
    status, err = await call(asr_srv, data=form(file=cut, model="synthetic_asr"))
    assert (status, err["code"]) == (400, "audio_too_long"), err
    sparse = _encoded_at("mp3", "libmp3lame", [(1.0, 8_000), (4.0, 160_000)])
    assert sf.info(io.BytesIO(sparse)).duration > 10
    samples, _ = await _heard(asr_srv, sparse)
    assert abs(samples / 16_000 - 5.0) <= 0.2, samples
    limit_s(5.5)
    adts = _encoded_at("adts", "aac", [(1.0, 8_000), (4.0, 160_000)])  # FFmpeg estimates 6.0 s
    samples, _ = await _heard(asr_srv, adts)
    assert abs(samples / 16_000 - 5.0) <= 0.2, samples
