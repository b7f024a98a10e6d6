"""Frames (and an optional audio track) to an MP4 every browser plays: H.264 yuv420p + AAC, with PyAV.

    write_mp4(path, frames uint8 [F, H, W, 3], fps, audio float32 [C, S] | None, sample_rate)
    write_thumbnail(path, frame uint8 [H, W, 3])      a JPEG still
    probe(path) -> Probe(width, height, frames, fps, audio_channels)

H.264 in yuv420p needs even sides: odd ones are padded by one edge pixel
(repeated), so the file keeps every generated pixel.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

VIDEO_CODEC = "libx264"
AUDIO_CODEC = "aac"
PIXEL_FORMAT = "yuv420p"
CRF = "18"
"""x264 constant rate factor: visually lossless for generated clips."""
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
AUDIO_BIT_RATE = 128_000
THUMBNAIL_QUALITY = 90


def write_mp4(path: str | Path, frames: np.ndarray, fps: float, audio: np.ndarray | None = None,
              sample_rate: int | None = None) -> None:
    """Encode `frames` (and `audio`, float in [-1, 1], [C, S]) into an MP4 file at `path`."""
    import av

    frames = _even(np.ascontiguousarray(frames, dtype=np.uint8))
    _, height, width, _ = frames.shape
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(str(path), mode="w", format="mp4") as out:
        video = out.add_stream(VIDEO_CODEC, rate=rate)
        video.width, video.height, video.pix_fmt = width, height, PIXEL_FORMAT
        video.options = {"crf": CRF}
        sound = None
        if audio is not None and sample_rate:
            audio = np.asarray(audio, dtype=np.float32)
            audio = audio[None, :] if audio.ndim == 1 else audio[:2]
            if sample_rate not in AAC_RATES:
                raise ValueError(f"an AAC track cannot be {sample_rate} Hz; expected one of {AAC_RATES}")
            sound = out.add_stream(AUDIO_CODEC, rate=sample_rate)
            sound.layout = "stereo" if audio.shape[0] == 2 else "mono"
            sound.bit_rate = AUDIO_BIT_RATE
        for image in frames:
            out.mux(video.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        out.mux(video.encode())
        if sound is not None:
            _mux_audio(out, sound, np.clip(audio, -1.0, 1.0), sample_rate)


def _mux_audio(out, stream, audio: np.ndarray, sample_rate: int) -> None:
    import av

    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio), format="fltp",
                                       layout="stereo" if audio.shape[0] == 2 else "mono")
    frame.sample_rate = sample_rate
    frame.pts = 0
    for packet in stream.encode(frame):
        out.mux(packet)
    out.mux(stream.encode(None))


def _even(frames: np.ndarray) -> np.ndarray:
    _, h, w, _ = frames.shape
    if h % 2 or w % 2:
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return frames


def write_thumbnail(path: str | Path, frame: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8)).save(path, format="JPEG",
                                                                      quality=THUMBNAIL_QUALITY)


@dataclass(frozen=True)
class Probe:
    width: int
    height: int
    frames: int
    fps: float
    audio_channels: int


def probe(path: str | Path) -> Probe:
    """Decode the whole file and count what is in it (tests and tools)."""
    import av

    with av.open(str(path)) as f:
        vs = f.streams.video[0]
        decoded = list(f.decode(vs))
        channels = f.streams.audio[0].codec_context.channels if f.streams.audio else 0
        return Probe(decoded[0].width, decoded[0].height, len(decoded), float(vs.average_rate or 0),
                     channels)
