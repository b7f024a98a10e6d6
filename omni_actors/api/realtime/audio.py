"""Realtime audio formats: pcm16 / G.711 on the wire <-> float32 mono.

    decode_wire(b64, fmt) -> (float32 samples, rate)   (raises AudioFormatError)
    WireStream(fmt).decode(b64, keep) -> float32 samples (a session's appends: one byte stream; its last `keep`)
    encode_wire(samples, fmt) -> base64 str            (samples at wire_rate(fmt))
    Resampler, resample, pcm16_bytes                   (omni_actors.audio's, re-exported)

The wire carries pcm16 little-endian mono at 24 kHz, or G.711 u-law / A-law at
8 kHz. Models have their own rates; resampling happens here, once per direction.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from omni_actors.audio import (
    DEFAULT_SAMPLE_RATE,
    AudioLimitError,
    Resampler,
    check_input,
    from_pcm16,
    resample,
)
from omni_actors.audio import pcm16 as pcm16_bytes

__all__ = ["FORMATS", "WIRE_RATE", "AudioFormatError", "Resampler", "WireStream", "decode_wire", "encode_wire",
           "pcm16_bytes", "resample", "wire_rate"]

WIRE_RATE = DEFAULT_SAMPLE_RATE
"""Rate of pcm16 audio on the wire, both directions."""
G711_RATE = 8_000
FORMATS = ("pcm16", "g711_ulaw", "g711_alaw")
_WHITESPACE = str.maketrans("", "", " \t\r\n")
"""Dropped from base64 audio before it is checked: line-wrapped base64 (Python's base64.encodebytes,
MIME encoders) is valid base64."""
_SPACE = b" \t\r\n"
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


class AudioFormatError(ValueError):
    """Audio bytes that do not fit the session's input format, or over the input limits."""


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


def decode_bytes(raw: bytes, fmt: str) -> np.ndarray:
    if fmt == "pcm16":
        if len(raw) % 2:
            raise AudioFormatError("pcm16 audio must have an even number of bytes")
        return from_pcm16(raw)
    if fmt in _G711:
        return _G711[fmt][np.frombuffer(raw, dtype=np.uint8)]
    raise AudioFormatError(f"unsupported audio format {fmt!r}; expected one of {FORMATS}")


def _check_size(b64: str, fmt: str) -> None:
    """Over `omni_actors.audio.check_input`'s limits is refused from the length, before decoding."""
    width = 2 if fmt == "pcm16" else 1
    try:
        check_input(len(b64) * 3 // 4 // width, wire_rate(fmt), "audio")
    except AudioLimitError as err:
        raise AudioFormatError(str(err)) from None


def _not_base64() -> AudioFormatError:
    return AudioFormatError("audio is not valid base64")


def _wire_bytes(b64: str, fmt: str) -> bytes:
    """The bytes of base64 audio of format `fmt` (whitespace in it dropped; strict base64 otherwise)."""
    _check_size(b64, fmt)
    try:
        return base64.b64decode(b64.translate(_WHITESPACE), validate=True)
    except (binascii.Error, ValueError):
        raise _not_base64() from None


def _wire_tail(b64: str, fmt: str, tail: int) -> tuple[bytes, int]:
    """(the last bytes of base64 audio, at least `tail` of them or all, how many bytes came before them).

    Base64 decodes in independent groups of 4 characters (3 bytes), so only the groups that hold the tail
    are decoded (a 15 MiB append kept to 2.5 s cost ~50 ms of the event loop decoding it whole). The
    rest is checked in one pass (`bytes.translate`, ~1 ns a character): an append `_wire_bytes` refuses is
    refused whole here too. What that pass leaves (padding, whitespace) says where the tail starts: the
    groups skipped are whole groups of alphabet characters, and the tail starts with one, so strict
    base64 of the tail accepts and refuses what strict base64 of the whole does."""
    _check_size(b64, fmt)
    if not b64.isascii():  # (O(1): a str knows)
        raise _not_base64()
    text = b64.encode("ascii")
    rest = text.translate(None, _ALPHABET)  # padding, whitespace, and what no base64 holds
    if rest.translate(None, _SPACE + b"="):
        raise _not_base64()
    pads = rest.count(b"=")
    spaces = len(rest) - pads
    chars = len(text) - len(rest)  # alphabet characters: 4 of them per 3 bytes
    groups = min(max(0, chars * 3 // 4 - tail) // 3, max(0, chars - 1) // 4)  # skipped, each 3 bytes
    if groups == 0:
        return _wire_bytes(b64, fmt), 0
    t = _last_chars(text, len(text) - spaces - 4 * groups, spaces)
    if t.count(b"=") != pads:  # padding in the skipped groups, audio after it
        raise _not_base64()
    try:
        return binascii.a2b_base64(t, strict_mode=True), 3 * groups
    except binascii.Error:
        raise _not_base64() from None


def _last_chars(text: bytes, n: int, spaces: int) -> bytes:
    """The last `n` (>= 1) characters of `text` that are not whitespace (it holds `spaces` whitespace)."""
    if not spaces:
        return text[-n:]
    size = n
    while True:  # (whitespace-dense text grows `size` to at most twice what it needs: O(tail))
        t = text[-size:].translate(None, _SPACE)
        if len(t) >= n or size >= len(text):
            return t[len(t) - n:]
        size = min(len(text), 2 * size)


def decode_wire(b64: str, fmt: str) -> tuple[np.ndarray, int]:
    """Base64 audio of format `fmt` -> (float32 mono samples, their rate): one whole clip (an item's
    audio), so pcm16 of an odd number of bytes is refused."""
    return decode_bytes(_wire_bytes(b64, fmt), fmt), wire_rate(fmt)


class WireStream:
    """A session's `input_audio_buffer.append`s of one input format, decoded as one byte stream.

    A client that cuts its pcm16 byte stream anywhere (a socket read, a file chunk) may end an append
    mid-sample: the odd byte is held and leads the next append, so no sample is lost or misaligned.
    `clear` drops it (input_audio_buffer.clear: nothing appended before it counts); a commit keeps it
    (the byte stream goes on: that sample starts the next turn), and so does a VAD turn's end. A new
    input format starts a new stream."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.held = b""
        self.skipped = 0
        """Samples the last decode skipped (its `keep`)."""

    def decode(self, b64: str, keep: int | None = None) -> np.ndarray:
        """One append's samples (float32 at wire_rate(fmt)); an append refused leaves the held byte as it was.
        `keep`: only the last `keep` samples are decoded (what a listener keeps of a long append; the rest are
        skipped before they cost a float each, and counted in `skipped`)."""
        width = 2 if self.fmt == "pcm16" else 1
        if keep is None:
            raw, skipped = _wire_bytes(b64, self.fmt), 0
        else:  # (its last `keep` whole samples, and an odd byte after them: all that is kept)
            raw, skipped = _wire_tail(b64, self.fmt, keep * width + width - 1)
        if skipped:
            at = len(self.held) + skipped  # where `raw` starts in the stream (the held byte, this append)
        else:
            at, raw = 0, self.held + raw
        end = at + len(raw)
        whole = end - end % width
        start = 0 if keep is None else max(0, whole - keep * width)  # (>= at: `raw` holds all that is kept)
        x = decode_bytes(raw[start - at:whole - at], self.fmt)
        self.held = raw[whole - at:]
        self.skipped = start // width
        return x

    def clear(self) -> None:
        self.held = b""


def encode_wire(x: np.ndarray, fmt: str) -> str:
    """float32 samples at wire_rate(fmt) -> base64 of that format."""
    raw = pcm16_bytes(x) if fmt == "pcm16" else _g711_encode(np.asarray(x, np.float32), fmt)
    return base64.b64encode(raw).decode("ascii")
