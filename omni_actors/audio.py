"""Audio samples as the whole product handles them: the default rate, pcm16, soxr resampling, input limits.

Pipelines, the API and the realtime session all carry audio as float32 mono in
[-1, 1] plus a sample rate. This module is the one place that converts it:

    pcm16(x) -> bytes            from_pcm16(raw) -> float32
    resample(x, src, dst)        whole clip, band-limited (soxr, "HQ")
    Resampler(src, dst)          .push(x) / .flush(): a stream, chunk-seamless (same output as one push)
    check_input(frames, rate, param)
                                 client audio within the settings' limits, checked from the header or the
                                 byte count BEFORE anything is decoded or resampled (AudioLimitError)
    max_input_frames(rate)       the most samples at `rate` that check_input lets through

It imports no web framework, so stage engines resample with it too.
"""

from __future__ import annotations

import numpy as np
import soxr

from omni_actors.settings import settings

DEFAULT_SAMPLE_RATE = 24_000
"""Rate of audio whose producer names none, and of raw `pcm16` on the wire (OpenAI's convention,
REST and realtime alike)."""
PCM16_SCALE = 32768.0
RESAMPLE_QUALITY = "HQ"
"""soxr's quality preset: 20-bit precision, a steep low-pass near Nyquist."""


class AudioLimitError(ValueError):
    """Client audio over a limit in the settings (duration, sample rate) or not usable (no samples, NaN)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def pcm16(x: np.ndarray) -> bytes:
    """float32 [-1, 1] -> little-endian 16-bit PCM (clipped; NaN becomes silence, not noise)."""
    y = np.clip(np.asarray(x, np.float32), -1.0, 1.0)  # a new array (infinities clipped, NaN kept)
    nan = np.isnan(y)
    if nan.any():  # rare: one pass to find them instead of nan_to_num's three and its copy
        y[nan] = 0.0
    y *= 32767.0
    return y.astype("<i2").tobytes()


def from_pcm16(raw: bytes) -> np.ndarray:
    """Little-endian 16-bit PCM -> float32 [-1, 1] (the caller checks the length is even)."""
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / PCM16_SCALE


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """A whole clip at `src` Hz -> `dst` Hz, float32 (the same samples a Resampler stream gives)."""
    r = Resampler(src, dst)
    if r.identity:
        return np.asarray(x, np.float32).reshape(-1)
    return np.concatenate([r.push(x), r.flush()])


class Resampler:
    """A stream resampled as it comes: chunks pushed in give the same output as one whole push.

    soxr keeps its filter's history between pushes, so output lags input by its filter
    delay (a few ms, varying with the chunking); `flush()` ends the stream and returns the
    samples still owed, so the total is round(n * dst / src). The next push starts a new stream.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        self.src, self.dst = int(src_rate), int(dst_rate)
        self.identity = self.src == self.dst
        self._stream = None if self.identity else soxr.ResampleStream(
            self.src, self.dst, 1, dtype="float32", quality=RESAMPLE_QUALITY)

    def push(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1))
        if self._stream is None:
            return x
        return self._stream.resample_chunk(x)

    def flush(self) -> np.ndarray:
        if self._stream is None:
            return np.zeros(0, np.float32)
        tail = self._stream.resample_chunk(np.zeros(0, np.float32), last=True)
        self._stream.clear()
        return tail


def check_input(frames: int, rate: int, param: str, *, whole: bool = True) -> None:
    """Refuse client audio of `frames` samples at `rate` Hz over the settings' limits, naming the limit
    (its setting) and `param`; called before decoding (from a header, a byte count or packet timestamps).
    `whole` False: `frames` is as far as the audio was read, not its length (reading stopped at the limit),
    so the message says "more than" the limit instead of a length it does not know."""
    lo, hi = settings().input_audio_min_rate_hz, settings().input_audio_max_rate_hz
    if not lo <= rate <= hi:
        raise AudioLimitError(
            f"audio sample rate {rate} Hz is outside the allowed range {lo}-{hi} Hz "
            f"(input_audio_min_rate_hz / input_audio_max_rate_hz; field `{param}`)", "audio_rate_out_of_range")
    limit = settings().max_input_audio_s
    if frames > max_input_frames(rate):
        length = f"{frames / rate:.1f} s" if whole else f"more than {limit:g} s"
        raise AudioLimitError(
            f"audio of {length} is over the limit of {limit:g} s "
            f"(max_input_audio_s; field `{param}`)", "audio_too_long")


def max_input_frames(rate: int) -> float:
    """The most samples at `rate` Hz client audio may hold (max_input_audio_s of them)."""
    return settings().max_input_audio_s * rate


def check_samples(x: np.ndarray, param: str) -> None:
    """Refuse decoded client audio that holds no samples, or NaN / infinite ones (float WAVs can)."""
    if x.size == 0:
        raise AudioLimitError(f"the audio holds no samples (field `{param}`)", "empty_audio")
    if not np.isfinite(x).all():
        raise AudioLimitError(f"the audio holds NaN or infinite samples (field `{param}`)", "invalid_audio")
