"""Audio encoding and decoding for the API (wav, pcm, flac, mp3, ogg-opus), run off the event loop.

Pipelines hand the API float32 mono arrays in [-1, 1] with a sample rate; this
module turns them into the bytes a client asked for, and client audio into
float32 mono arrays. Every call that touches a codec goes through
`off_loop(...)` (the loop's default thread pool), so encoding never stalls the
event loop that also runs the orchestrator.

    StreamEncoder(fmt, sample_rate, rate=None)   .feed(audio) -> bytes, .finish() -> bytes
    encode_file(audio, sr, fmt, rate=None)       the whole clip at once (mono, or [C, S] kept as C channels)
    output_rate(fmt, sample_rate)                the rate a file of `fmt` carries: `sample_rate`, or
                                                 the nearest one mp3 / opus can hold
    decode_audio(data, fmt, param)    -> (float32 mono, sample_rate), bounded (see omni_actors.audio)

Samples (pcm16, resampling, the default rate, input limits) are omni_actors.audio's.

`rate` asks for another output rate (the speech API's pcm is 24 kHz); `pcm16`
(chat's name) is always 24 kHz, as OpenAI's chat audio is. Audio is resampled to it with omni_actors.audio's soxr resampler, as it is to a rate
mp3 or opus cannot carry.

Streaming: pcm and wav go out as they come (wav with an open-ended header,
sizes 0xFFFFFFFF, as streaming servers do; `wav_sized` fills them in for a whole
file); mp3 and opus go through libsndfile's encoders as their frames complete.
flac is NOT streamed: it is encoded whole at `finish()`. A FLAC stream of unknown length (STREAMINFO total
samples 0) is valid and ffmpeg decodes it, but libsndfile 1.2 (soundfile) reports
it as 2**63 frames and fails at its end ("psf_fseek() failed"), so a client reading
it with soundfile would get an error instead of the clip.
"""

from __future__ import annotations

import asyncio
import functools
import io
import struct
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import soundfile as sf

from omni_actors.api.errors import ApiError, bad_request
from omni_actors.audio import (
    DEFAULT_SAMPLE_RATE,
    AudioLimitError,
    Resampler,
    check_input,
    check_samples,
    from_pcm16,
    max_input_frames,
    pcm16,
    resample,
)

__all__ = ["DEFAULT_SAMPLE_RATE", "StreamEncoder", "decode_audio", "encode_file", "off_loop", "output_rate", "pcm16"]

CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "pcm16": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}

_SF_FORMATS = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
    "opus": ("OGG", "OPUS"),
}
_RATES = {
    "pcm16": (DEFAULT_SAMPLE_RATE,),  # chat's and realtime's raw audio: OpenAI's 24 kHz, always
    "opus": (8000, 12000, 16000, 24000, 48000),
    "mp3": (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000),
}

INLINE_RAW_MAX_SAMPLES = 24_000
"""Raw (pcm / wav) chunks up to this many samples are converted on the event loop (~20 us)."""
_RAW = frozenset({"pcm", "pcm16", "wav"})

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run a codec call in the loop's thread pool."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


def check_supported(fmt: str) -> None:
    """400 now, instead of a failure mid-stream, when libsndfile lacks the format."""
    if fmt in _SF_FORMATS:
        major, sub = _SF_FORMATS[fmt]
        if major not in sf.available_formats() or sub not in sf.available_subtypes(major):
            raise bad_request(f"audio format {fmt!r} is not supported by this server's libsndfile "
                              f"({sf.__libsndfile_version__})", "response_format", "unsupported_format")


def output_rate(fmt: str, sample_rate: int) -> int:
    """`sample_rate`, or the nearest rate `fmt` can carry (preferring a higher one)."""
    allowed = _RATES.get(fmt)
    if not allowed or sample_rate in allowed:
        return sample_rate
    return min(allowed, key=lambda r: (r < sample_rate, abs(r - sample_rate)))


def wav_stream_header(sample_rate: int) -> bytes:
    """A PCM16 mono WAV header with open-ended sizes, for a body of unknown length."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", unknown))


WAV_HEADER_BYTES = len(wav_stream_header(DEFAULT_SAMPLE_RATE))


def wav_sized(body: bytes) -> bytes:
    """A whole streamed WAV (`wav_stream_header` + PCM) with its RIFF and data sizes filled in: a file
    whose length is known should say it (Python's `wave` reads 0xFFFFFFFF as 2**31 frames)."""
    riff, data = len(body) - 8, len(body) - WAV_HEADER_BYTES
    return b"RIFF" + struct.pack("<I", riff) + body[8:40] + struct.pack("<I", data) + body[WAV_HEADER_BYTES:]


class _Sink:
    """A seekable in-memory file for libsndfile; bytes before the write head can be taken once."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0
        self.sent = 0

    def write(self, data: bytes) -> int:
        data = bytes(data)
        end = self.pos + len(data)
        if end > len(self.buf):
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[self.pos:end] = data
        self.pos = end
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, len(self.buf))[whence]
        self.pos = base + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = len(self.buf) if n < 0 else self.pos + n
        data = bytes(self.buf[self.pos:end])
        self.pos += len(data)
        return data

    def take(self) -> bytes:
        # Header fix-ups libsndfile writes at close into bytes already sent are dropped:
        # the formats streamed this way (mp3, ogg) stay decodable without them.
        out = bytes(self.buf[self.sent:])
        self.sent = len(self.buf)
        return out


class StreamEncoder:
    """Encode a growing clip chunk by chunk. Not thread-safe: await each call in turn."""

    def __init__(self, fmt: str, sample_rate: int, rate: int | None = None) -> None:
        check_supported(fmt)
        self.fmt = fmt
        self.in_rate = sample_rate
        self.rate = output_rate(fmt, rate or sample_rate)
        """The rate of the bytes out."""
        self.samples = 0
        self._resampler = Resampler(sample_rate, self.rate)
        self._started = False
        self._pending: list[np.ndarray] = []
        self._file: sf.SoundFile | None = None
        self._sink: _Sink | None = None
        if fmt in ("mp3", "opus"):
            major, sub = _SF_FORMATS[fmt]
            self._sink = _Sink()
            self._file = sf.SoundFile(self._sink, "w", self.rate, 1, format=major, subtype=sub)

    def feed(self, audio: np.ndarray) -> bytes:
        return self._encode(self._resampler.push(audio))

    def _encode(self, audio: np.ndarray) -> bytes:
        self.samples += audio.size
        head = b""
        if not self._started:
            self._started = True
            head = wav_stream_header(self.rate) if self.fmt == "wav" else b""
        if self.fmt in ("pcm", "pcm16", "wav"):
            return head + pcm16(audio)
        if self._file is not None and self._sink is not None:
            self._file.write(audio)
            return self._sink.take()
        self._pending.append(audio)  # flac: whole at the end
        return b""

    async def feed_async(self, audio: np.ndarray) -> bytes:
        """`feed` in the thread pool; small raw (pcm / wav) chunks are converted in place, since
        the thread hop costs more than scaling a few thousand samples to int16."""
        if self.fmt in _RAW and audio.size <= INLINE_RAW_MAX_SAMPLES and self.in_rate == self.rate:
            return self.feed(audio)
        return await off_loop(self.feed, audio)

    def finish(self) -> bytes:
        tail = self._encode(self._resampler.flush()) if not self._resampler.identity else b""
        if self._file is not None and self._sink is not None:
            self._file.close()
            return tail + self._sink.take()
        if self.fmt == "flac":
            clip = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
            return encode_file(clip, self.rate, "flac")
        if not self._started:  # an empty clip still gets a valid header
            self._started = True
            return wav_stream_header(self.rate) if self.fmt == "wav" else b""
        return tail


def encode_file(audio: np.ndarray, sample_rate: int, fmt: str, rate: int | None = None) -> bytes:
    """The whole clip as one file at `output_rate(fmt, rate or sample_rate)`. `audio` is mono, or
    [C, S] kept as C channels (pcm: raw 16-bit little-endian, channels interleaved)."""
    check_supported(fmt)
    out_rate = output_rate(fmt, rate or sample_rate)
    x = np.asarray(audio, dtype=np.float32)
    channels = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)
    frames = np.stack([resample(c, sample_rate, out_rate) for c in channels], axis=1)  # [S, C]
    if fmt in ("pcm", "pcm16"):
        return pcm16(frames.reshape(-1))
    major, sub = _SF_FORMATS[fmt]
    buf = io.BytesIO()
    sf.write(buf, frames if frames.shape[1] > 1 else frames[:, 0], out_rate, format=major, subtype=sub)
    return buf.getvalue()


_CONTAINERS = {"wav": ("WAV", "WAVEX", "RF64"), "flac": ("FLAC",), "mp3": ("MP3",)}
"""libsndfile's major formats that each client `format` may hold."""
_WAV_MAGIC = (b"RIFF", b"RF64")
SF_UNKNOWN_FRAMES = 2**63 - 1
"""libsndfile's frame count (SF_COUNT_MAX) for a stream whose header states no length: a FLAC stream
of unknown length (STREAMINFO total samples 0)."""
_SF_ESTIMATED = frozenset({"MP3"})
"""libsndfile formats whose frame count is only an estimate where the file states none (an MP3 without a
Xing / LAME / VBRI header: its size over its first frame's bitrate); soundfile reads no further than it,
so a longer file was cut short, silently."""
_FF_STATED = frozenset({"mov", "matroska", "ogg"})
"""FFmpeg demuxers whose duration is the file's own (MP4's header, Matroska / WebM's Duration element,
Ogg's last granule position); the others' (MP3, ADTS AAC) is an estimate from the bitrate, which can say
an hour of a minute's file, or a minute of an hour's."""


def decode_audio(data: bytes, fmt: str | None, param: str) -> tuple[np.ndarray, int]:
    """Client audio -> (float32 mono in [-1, 1], sample rate); a 400 naming `param` if it is unreadable,
    another format than `fmt` says (a WAV file sent as pcm16 would be noise), over the limits of
    `omni_actors.audio.check_input` (checked before decoding: from the header, else from the packets'
    timestamps), empty, or not finite. `fmt` None takes any container libsndfile reads (an uploaded file)."""
    try:
        if fmt in ("pcm16", "pcm"):
            if data[:4] in _WAV_MAGIC and data[8:12] == b"WAVE":
                raise bad_request(f"audio is a WAV file, not raw {fmt}; send it with format 'wav'", param,
                                  "invalid_audio")
            if len(data) % 2:
                raise bad_request("pcm16 audio must hold an even number of bytes", param)
            check_input(len(data) // 2, DEFAULT_SAMPLE_RATE, param)
            audio, rate = from_pcm16(data), DEFAULT_SAMPLE_RATE
        else:
            audio, rate = _read_container(data, fmt, param)
        check_samples(audio, param)
    except AudioLimitError as err:
        raise bad_request(str(err), param, err.code) from None
    return audio, rate


def _read_container(data: bytes, fmt: str | None, param: str) -> tuple[np.ndarray, int]:
    what = f"{fmt} audio" if fmt else "the audio file"
    try:
        opened = sf.SoundFile(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError) as err:
        if fmt is None:  # a container libsndfile does not know (m4a, webm, ...): FFmpeg may
            return _read_with_av(data, what, param)
        raise _undecodable(what, err, param) from None
    try:
        with opened as f:
            if fmt is not None and f.format not in _CONTAINERS.get(fmt, (f.format,)):
                raise bad_request(f"audio is {f.format}, not {fmt} as `format` says", param, "invalid_audio")
            unstated = f.format in _SF_ESTIMATED or f.frames >= SF_UNKNOWN_FRAMES
            if not unstated:
                check_input(max(f.frames, 0), f.samplerate, param)
                audio, rate = f.read(dtype="float32", always_2d=True), int(f.samplerate)
    except (sf.LibsndfileError, RuntimeError, TypeError) as err:
        raise _undecodable(what, err, param) from None
    if unstated:  # its length is measured from its packets, and it is decoded to its end (FFmpeg reads it)
        return _read_with_av(data, what, param)
    return np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32), rate


def _undecodable(what: str, err: Exception, param: str) -> ApiError:
    reason = err.error_string if isinstance(err, sf.LibsndfileError) else str(err)
    return bad_request(f"cannot decode {what}: {reason}", param, "invalid_audio")


def _read_with_av(data: bytes, what: str, param: str) -> tuple[np.ndarray, int]:
    """Audio libsndfile does not read (m4a / mp4, webm, ADTS AAC, ...) or cannot measure (MP3, FLAC of unknown
    length) through FFmpeg (PyAV): its first audio stream, mixed to mono at its own rate. The length limit
    is checked before anything is decoded: from the header where the container states the length
    (_FF_STATED), and from the packets' timestamps (demuxed, not decoded: a second of CPU for an hour of
    Opus, where decoding took ten and 700 MB), stopping at the limit; while decoding, the samples made are
    counted against it too (timestamps can lie)."""
    import av

    try:
        with av.open(io.BytesIO(data)) as box:
            stream = next((s for s in box.streams if s.type == "audio"), None)
            if stream is None or not stream.rate:
                raise bad_request(f"cannot decode {what}: no audio in it", param, "invalid_audio")
            rate = int(stream.rate)
            if box.format.name.split(",")[0] in _FF_STATED:
                if stream.duration and stream.time_base:
                    check_input(int(stream.duration * stream.time_base * rate), rate, param)
                elif box.duration:  # (Matroska / WebM say the length on the container only)
                    check_input(int(box.duration * rate / av.time_base), rate, param)
            _check_packets(box, stream, rate, param)
        return _decode_av(data, rate, param)
    except av.error.FFmpegError as err:
        raise bad_request(f"cannot decode {what}: {err.strerror or type(err).__name__}", param,
                          "invalid_audio") from None


def _check_packets(box: Any, stream: Any, rate: int, param: str) -> None:
    """`check_input` on the span of the stream's packet timestamps, read without decoding; the demuxing
    stops once the span passes the limit. (Compared in the stream's time base: integer arithmetic per
    packet, where a Fraction per packet took five times the demuxing's own time.)"""
    tb = stream.time_base
    check_input(0, rate, param)  # the rate, before reading any further
    if tb is None:
        return
    limit = int(max_input_frames(rate) / rate / tb)
    start = end = None
    for packet in box.demux(stream):
        pts = packet.pts
        if pts is None:
            continue
        if start is None or pts < start:
            start = pts
        stop = pts + (packet.duration or 0)
        if end is None or stop > end:
            end = stop
            if end - start > limit:
                check_input(int((end - start) * tb * rate) + 1, rate, param, whole=False)


def _decode_av(data: bytes, rate: int, param: str) -> tuple[np.ndarray, int]:
    """The first audio stream decoded and mixed to mono at `rate`, the samples counted against the limit. A
    packet the decoder refuses is skipped, as FFmpeg's own tools and libsndfile's MP3 decoder skip it (an
    MP3 joined from files carries each one's ID3 tag among its frames); nothing decodable is a 400."""
    import av

    parts: list[np.ndarray] = []
    refused: av.error.FFmpegError | None = None
    with av.open(io.BytesIO(data)) as box:
        stream = next(s for s in box.streams if s.type == "audio")
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        done = 0

        def frames() -> Iterator[Any]:
            nonlocal refused
            for packet in box.demux(stream):  # (its last packet is empty: it flushes the decoder)
                try:
                    yield from packet.decode()
                except av.error.InvalidDataError as err:
                    refused = refused or err
            yield None  # the resampler's rest

        for frame in frames():
            for out in mono.resample(frame):
                parts.append(out.to_ndarray().reshape(-1))
                done += parts[-1].size
                check_input(done, rate, param, whole=False)
    if not parts and refused is not None:
        raise refused
    audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return np.ascontiguousarray(audio, dtype=np.float32), rate
