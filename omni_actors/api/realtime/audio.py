"""Realtime audio formats: pcm16 / G.711 on the wire <-> float32 mono, and a streaming resampler.

    decode_wire(b64, fmt) -> (float32 samples, rate)   (raises AudioFormatError)
    encode_wire(samples, fmt) -> base64 str            (samples at wire_rate(fmt))
    Resampler(src_rate, dst_rate).push(x) / .flush()   (band-limited, chunk-seamless)

The wire carries pcm16 little-endian mono at 24 kHz, or G.711 u-law / A-law at
8 kHz. Models have their own rates; resampling happens here, once per direction.
"""

from __future__ import annotations

import base64
import binascii
import math

import numpy as np

WIRE_RATE = 24_000
"""Rate of pcm16 audio on the wire, both directions."""
G711_RATE = 8_000
FORMATS = ("pcm16", "g711_ulaw", "g711_alaw")
RESAMPLER_HALF_TAPS = 16
"""Half the length of the windowed-sinc kernel (32 taps: ~1 ms delay at 16 kHz)."""
RESAMPLE_BLOCK = 1 << 15
"""Outputs computed per vectorised block (bounds temporary memory for huge appends)."""


class AudioFormatError(ValueError):
    """Audio bytes that do not fit the session's input format."""


def wire_rate(fmt: str) -> int:
    return WIRE_RATE if fmt == "pcm16" else G711_RATE


# ---- G.711 -----------------------------------------------------------------


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    mag = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -mag, mag).astype(np.float32) / 32768.0


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 7, a & 0x0F
    mag = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, mag, -mag).astype(np.float32) / 32768.0


_G711 = {"g711_ulaw": _ulaw_table(), "g711_alaw": _alaw_table()}
_G711_SORTED = {k: (np.argsort(t, kind="stable"), np.sort(t)) for k, t in _G711.items()}


def _g711_encode(x: np.ndarray, fmt: str) -> bytes:
    order, levels = _G711_SORTED[fmt]
    i = np.clip(np.searchsorted(levels, x), 1, len(levels) - 1)
    nearer_left = (x - levels[i - 1]) < (levels[i] - x)
    return order[i - nearer_left.astype(np.int64)].astype(np.uint8).tobytes()


# ---- wire <-> float ----------------------------------------------------------


def pcm16_bytes(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def decode_bytes(raw: bytes, fmt: str) -> np.ndarray:
    if fmt == "pcm16":
        if len(raw) % 2:
            raise AudioFormatError("pcm16 audio must have an even number of bytes")
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    if fmt in _G711:
        return _G711[fmt][np.frombuffer(raw, dtype=np.uint8)]
    raise AudioFormatError(f"unsupported audio format {fmt!r}; expected one of {FORMATS}")


def decode_wire(b64: str, fmt: str) -> tuple[np.ndarray, int]:
    """Base64 audio of format `fmt` -> (float32 mono samples, their rate)."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise AudioFormatError("audio is not valid base64") from None
    return decode_bytes(raw, fmt), wire_rate(fmt)


def encode_wire(x: np.ndarray, fmt: str) -> str:
    """float32 samples at wire_rate(fmt) -> base64 of that format."""
    raw = pcm16_bytes(x) if fmt == "pcm16" else _g711_encode(np.asarray(x, np.float32), fmt)
    return base64.b64encode(raw).decode("ascii")


# ---- resampling ----------------------------------------------------------------


def _kernel(up: int, down: int, half: int) -> np.ndarray:
    """Polyphase windowed-sinc table [up phases, 2*half taps], each row summing to 1."""
    cutoff = min(1.0, up / down) * 0.94
    phases = np.arange(up)[:, None] / up
    x = np.arange(-half + 1, half + 1)[None, :] - phases
    window = 0.42 + 0.5 * np.cos(np.pi * x / half) + 0.08 * np.cos(2 * np.pi * x / half)
    h = np.sinc(cutoff * x) * np.where(np.abs(x) < half, window, 0.0)
    return (h / h.sum(axis=1, keepdims=True)).astype(np.float32)


class Resampler:
    """Streaming rational resampler: chunks pushed in give the same output as one whole push.

    Output sample k sits at input position k * src / dst; each is a 32-tap
    windowed-sinc interpolation, so the stream is delayed by RESAMPLER_HALF_TAPS
    input samples until `flush()` (end of stream) pads the tail with zeros.
    """

    def __init__(self, src_rate: int, dst_rate: int) -> None:
        g = math.gcd(src_rate, dst_rate)
        self.up, self.down = dst_rate // g, src_rate // g
        self.identity = self.up == self.down
        self.half = RESAMPLER_HALF_TAPS
        self.taps = _kernel(self.up, self.down, self.half) if not self.identity else None
        self._buf = np.zeros(self.half, np.float32)  # history; _buf[0] is input index _offset
        self._offset = -self.half
        self._next = 0  # next output index
        self._seen = 0  # input samples pushed

    def push(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if self.identity:
            return x
        self._seen += len(x)
        self._buf = np.concatenate([self._buf, x])
        return self._run(limit=None)

    def flush(self) -> np.ndarray:
        """Outputs still owed for everything pushed so far; the stream then ends."""
        if self.identity:
            return np.zeros(0, np.float32)
        self._buf = np.concatenate([self._buf, np.zeros(self.half, np.float32)])
        return self._run(limit=-(-self._seen * self.up // self.down))

    def _run(self, limit: int | None) -> np.ndarray:
        end = self._offset + len(self._buf)  # one past the last input index held
        # output k needs inputs up to floor(k*down/up) + half
        last = ((end - self.half) * self.up - 1) // self.down
        stop = last + 1 if limit is None else min(last + 1, limit)
        if stop <= self._next:
            return np.zeros(0, np.float32)
        outs = []
        taps = np.arange(2 * self.half)
        for k0 in range(self._next, stop, RESAMPLE_BLOCK):
            ks = np.arange(k0, min(stop, k0 + RESAMPLE_BLOCK), dtype=np.int64)
            pos = ks * self.down
            n, phase = pos // self.up, pos % self.up
            idx = (n - self.half + 1 - self._offset)[:, None] + taps[None, :]
            outs.append(np.einsum("ij,ij->i", self._buf[idx], self.taps[phase]))
        self._next = stop
        keep_from = (self._next * self.down) // self.up - self.half + 1
        drop = max(0, keep_from - self._offset)
        self._buf = self._buf[drop:]
        self._offset += drop
        return np.concatenate(outs).astype(np.float32)


def resample(x: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Whole-signal resampling (for a finished buffer)."""
    r = Resampler(src_rate, dst_rate)
    if r.identity:
        return np.asarray(x, np.float32)
    return np.concatenate([r.push(x), r.flush()])
