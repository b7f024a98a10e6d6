"""Speech output encoding: OpenAI's response formats (mp3, opus, aac, flac, wav, pcm) and `speed`.

    enc = SpeechEncoder(fmt, sample_rate, speed)     speed 1.0: untouched
    await enc.feed(audio) -> bytes                    bytes of `fmt` ready to send
    await enc.finish() -> bytes                       the tail (flac: the whole file)
    enc.out_rate == wire_rate(fmt, sample_rate)       the rate of those bytes (X-Sample-Rate)

`pcm` is OpenAI's: 24 kHz (PCM_RATE) 16-bit mono little-endian, whatever the
model's own rate (the openai SDK's LocalAudioPlayer plays it at 24000); the
audio is resampled to it. The other formats carry the model's rate (mp3 / opus:
the nearest rate they can hold) and say it in their headers.

mp3, opus, flac, wav and pcm go through api/audio_codec.py's StreamEncoder
(libsndfile); aac is written here as an ADTS stream with PyAV's AAC encoder
(frames leave as they complete). `speed` for pipelines whose stages have no
speed knob is a streaming time stretch that keeps the pitch (time_stretch.py,
WSOLA): 2.0 halves the duration. Codec work runs off the event loop.
"""

from __future__ import annotations

import io

import numpy as np

from omni_actors.api.audio_codec import (
    CONTENT_TYPES,
    StreamEncoder,
    check_supported,
    off_loop,
    output_rate,
)
from omni_actors.api.time_stretch import TimeStretch
from omni_actors.audio import DEFAULT_SAMPLE_RATE, Resampler

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
TYPES = {**{f: CONTENT_TYPES[f] for f in FORMATS if f in CONTENT_TYPES}, "aac": "audio/aac"}
AAC_BITRATE = 64_000
AAC_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
"""The rates an AAC stream can carry (its sampling-frequency index); audio at another rate is resampled to the
nearest (before 2026-12-05 FFmpeg's encoder refused to open, and the response was a 500)."""
PCM_RATE = DEFAULT_SAMPLE_RATE
"""Rate of `pcm` speech: OpenAI's 24 kHz."""


def wire_rate(fmt: str, sample_rate: int) -> int:
    """The rate speech of `fmt` goes out at, for audio made at `sample_rate`."""
    if fmt == "pcm":
        return PCM_RATE
    if fmt == "aac":
        return sample_rate if sample_rate in AAC_RATES else min(
            AAC_RATES, key=lambda r: (r < sample_rate, abs(r - sample_rate)))  # (output_rate's rule)
    return output_rate(fmt, sample_rate)


class _AacEncoder:
    """ADTS AAC, mono, at the audio's own rate (or the nearest AAC_RATES one), frames out as they are encoded."""

    def __init__(self, sample_rate: int) -> None:
        import av

        self.rate = wire_rate("aac", sample_rate)
        self.resampler = Resampler(sample_rate, self.rate)
        self.buf = io.BytesIO()
        self.container = av.open(self.buf, "w", format="adts")
        self.stream = self.container.add_stream("aac", rate=self.rate)
        self.stream.layout = "mono"
        self.stream.bit_rate = AAC_BITRATE
        self.pts = 0
        self.sent = 0

    def _take(self) -> bytes:
        data = self.buf.getvalue()[self.sent :]
        self.sent += len(data)
        return data

    def feed(self, audio: np.ndarray) -> bytes:
        return self._encode(self.resampler.push(audio))

    def _encode(self, audio: np.ndarray) -> bytes:
        """Samples already at `self.rate`."""
        import av

        if not audio.size:
            return b""
        frame = av.AudioFrame.from_ndarray(audio.reshape(1, -1), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = self.rate, self.pts
        self.pts += audio.size
        for packet in self.stream.encode(frame):
            self.container.mux(packet)
        return self._take()

    def finish(self) -> bytes:
        head = self._encode(self.resampler.flush())
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()
        return head + self._take()


class SpeechEncoder:
    """One response's audio: speed change, then encoding to `fmt`. Await calls in turn."""

    def __init__(self, fmt: str, sample_rate: int, speed: float = 1.0) -> None:
        if fmt != "aac":
            check_supported(fmt)
        self.fmt, self.rate = fmt, sample_rate
        self.speed = TimeStretch(sample_rate, speed) if speed != 1.0 else None
        self.out_rate = wire_rate(fmt, sample_rate)
        self.inner: StreamEncoder | _AacEncoder = (
            _AacEncoder(sample_rate) if fmt == "aac" else StreamEncoder(fmt, sample_rate, self.out_rate)
        )
        self.samples = 0
        """Samples encoded so far (after the speed change)."""

    def _feed(self, audio: np.ndarray, last: bool) -> bytes:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if self.speed is not None:
            audio = self.speed.feed(audio, last)
        self.samples += audio.size
        out = self.inner.feed(audio) if audio.size or last else b""
        return out + (self.inner.finish() if last else b"")

    async def feed(self, audio: np.ndarray) -> bytes:
        if self.speed is None and isinstance(self.inner, StreamEncoder):
            audio = np.asarray(audio, dtype=np.float32).reshape(-1)
            self.samples += audio.size
            return await self.inner.feed_async(audio)
        return await off_loop(self._feed, audio, False)

    async def finish(self) -> bytes:
        return await off_loop(self._feed, np.zeros(0, np.float32), True)
