"""Frames (and an optional audio track) to an MP4 every browser plays: H.264 yuv420p + AAC, with PyAV.

    write_mp4(path, frames uint8 [F, H, W, 3], fps, audio float32 [C, S] | None, sample_rate)
    write_thumbnail(path, frame uint8 [H, W, 3])      a JPEG still
    probe(path) -> Probe(width, height, frames, fps, audio_channels)
    scan_mp4(path | bytes) -> Scan(width, height, frames, fps, last frame)     an upload, checked
    read_mp4(path | bytes, sample_rate) -> Clip(frames, fps, audio, sample_rate)  the whole clip

H.264 in yuv420p needs even sides: odd ones are padded by one edge pixel
(repeated), so the file keeps every generated pixel. Reading takes untrusted
uploads: only the MP4/QuickTime demuxer is used, and what one file may decode to
is bounded (MAX_DECODE_FRAMES, MAX_DECODE_SIDE_PX, MAX_DECODE_BYTES,
MAX_DECODE_AUDIO_S); past a bound, or on anything that does not decode, it raises
DecodeError.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

VIDEO_CODEC = "libx264"
AUDIO_CODEC = "aac"
PIXEL_FORMAT = "yuv420p"
CRF = "18"
"""x264 constant rate factor: visually lossless for generated clips."""
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
AUDIO_BIT_RATE = 128_000
THUMBNAIL_QUALITY = 90
DEMUXER = "mov"
"""FFmpeg's MP4/QuickTime demuxer: an upload is read as nothing else."""
MAX_DECODE_FRAMES = 2048
"""Most frames one file read may hold (a source to extend: far past the 257 a model makes at once)."""
MAX_DECODE_SIDE_PX = 4096
MAX_DECODE_BYTES = 2 << 30
"""Most bytes of decoded RGB frames one file read may keep."""
MAX_DECODE_AUDIO_S = 600.0
"""Longest audio track one file read decodes."""


class DecodeError(ValueError):
    """A file that is not a video this module reads, or one past a decode bound."""


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


SPRITE_FRAMES = 16
"""Most frames a spritesheet shows, sampled evenly from first to last."""
SPRITE_WIDTH_PX = 160
"""Widest a spritesheet's tile is (smaller videos keep their width)."""


def sprite_layout(frames: int, width: int, height: int) -> tuple[list[int], int, int, int]:
    """(the frame indices a spritesheet shows, its columns, a tile's width and height)."""
    count = min(frames, SPRITE_FRAMES)
    picks = sorted({round(i * (frames - 1) / max(count - 1, 1)) for i in range(count)})
    tile_w = min(width, SPRITE_WIDTH_PX)
    tile_h = max(1, round(height * tile_w / width))
    columns = int(np.ceil(np.sqrt(len(picks))))
    return picks, columns, tile_w, tile_h


def write_spritesheet(path: str | Path, frames: np.ndarray) -> None:
    """A JPEG grid of up to SPRITE_FRAMES of `frames` [F, H, W, 3], row by row, evenly sampled."""
    from PIL import Image

    picks, columns, tile_w, tile_h = sprite_layout(frames.shape[0], frames.shape[2], frames.shape[1])
    rows = -(-len(picks) // columns)
    sheet = Image.new("RGB", (columns * tile_w, rows * tile_h))
    for n, i in enumerate(picks):
        tile = Image.fromarray(np.ascontiguousarray(frames[i], dtype=np.uint8))
        if tile.size != (tile_w, tile_h):
            tile = tile.resize((tile_w, tile_h), Image.Resampling.BILINEAR)
        sheet.paste(tile, ((n % columns) * tile_w, (n // columns) * tile_h))
    sheet.save(path, format="JPEG", quality=THUMBNAIL_QUALITY)


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


@dataclass(frozen=True)
class Scan:
    """A video checked frame by frame without keeping its frames."""

    width: int
    height: int
    frames: int
    fps: float
    last: np.ndarray
    """The last frame, uint8 [H, W, 3]."""


@dataclass(frozen=True)
class Clip:
    frames: np.ndarray
    """uint8 [F, H, W, 3]"""
    fps: float
    audio: np.ndarray | None = None
    """float32 [C, S], in [-1, 1]"""
    sample_rate: int | None = None


def scan_mp4(source: str | Path | bytes) -> Scan:
    """Decode every frame of `source` (under the bounds), keeping only the last; DecodeError if it fails."""
    with _open(source) as f:
        vs, fps = _video_stream(f)
        count, last = 0, None
        for frame in _frames(f, vs):
            count, last = count + 1, frame
        if last is None:
            raise DecodeError("the video stream has no frames")
        return Scan(last.shape[1], last.shape[0], count, fps, last)


def read_mp4(source: str | Path | bytes, sample_rate: int | None = None) -> Clip:
    """All frames of `source`, and its first audio track as float32 planar at `sample_rate`
    (default: the track's own rate, or 48 kHz if AAC cannot carry it)."""
    with _open(source) as f:
        vs, fps = _video_stream(f)
        frames = list(_frames(f, vs))
        if not frames:
            raise DecodeError("the video stream has no frames")
    audio, rate = None, None
    with _open(source) as f:
        if f.streams.audio:
            audio, rate = _audio(f, sample_rate, len(frames) / fps)
    return Clip(np.stack(frames), fps, audio, rate)


def _open(source: str | Path | bytes) -> Any:
    import av

    try:
        return av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source), format=DEMUXER)
    except (av.FFmpegError, OSError) as err:
        raise DecodeError(f"not an MP4 file ({err})") from None


def _video_stream(f: Any) -> tuple[Any, float]:
    if not f.streams.video:
        raise DecodeError("the file has no video stream")
    vs = f.streams.video[0]
    ctx = vs.codec_context
    if not (0 < ctx.width <= MAX_DECODE_SIDE_PX and 0 < ctx.height <= MAX_DECODE_SIDE_PX):
        raise DecodeError(f"a video of {ctx.width}x{ctx.height}; this server reads sides up to "
                          f"{MAX_DECODE_SIDE_PX} px")
    rate = vs.average_rate or vs.guessed_rate
    if not rate or rate <= 0:
        raise DecodeError("the video stream has no frame rate")
    return vs, float(rate)


def _frames(f: Any, vs: Any) -> Iterator[np.ndarray]:
    import av

    width, height = vs.codec_context.width, vs.codec_context.height
    most = min(MAX_DECODE_FRAMES, MAX_DECODE_BYTES // (width * height * 3))
    count = 0
    try:
        for frame in f.decode(vs):
            count += 1
            if count > most:
                raise DecodeError(f"more than {most} frames of {width}x{height}; this server reads at most "
                                  f"{MAX_DECODE_FRAMES} frames and {MAX_DECODE_BYTES} bytes of them")
            if (frame.width, frame.height) != (width, height):
                raise DecodeError("the frames change size")
            yield rgb(frame)
    except av.FFmpegError as err:
        raise DecodeError(f"the video does not decode ({err})") from None


YUV_TO_RGB = {  # (Cr -> R, Cb -> G, Cr -> G, Cb -> B) per colour matrix
    "bt601": (1.402, -0.344136, -0.714136, 1.772),
    "bt709": (1.5748, -0.187324, -0.468124, 1.8556),
}
AVCOL_SPC_BT709 = 1
AVCOL_RANGE_JPEG = 2


def rgb(frame: Any) -> np.ndarray:
    """A decoded frame as uint8 RGB [H, W, 3]. 8-bit 4:2:0 frames (what H.264 files carry) are
    converted here, not by FFmpeg's swscale: after swscale had turned a decoded frame into RGB,
    later libx264 encodes in the same process were no longer repeatable (the same frames made
    different files). BT.709 when the frame says so, else BT.601; full range for JPEG-range
    frames, else limited; chroma repeated over its 2x2 pixels. Other formats go through swscale."""
    name = frame.format.name
    if name not in ("yuv420p", "yuvj420p") or frame.width % 2 or frame.height % 2:
        return frame.to_ndarray(format="rgb24")
    h, w = frame.height, frame.width
    planes = frame.to_ndarray()  # [H * 3 / 2, W]: Y, then U and V as [H / 2, W / 2] each
    y = planes[:h].astype(np.float32)
    u = planes[h : h + h // 4].reshape(h // 2, w // 2).astype(np.float32) - 128.0
    v = planes[h + h // 4 :].reshape(h // 2, w // 2).astype(np.float32) - 128.0
    if name == "yuvj420p" or frame.color_range == AVCOL_RANGE_JPEG:
        scale_y, scale_c = 1.0, 1.0
    else:
        y -= 16.0
        scale_y, scale_c = 255.0 / 219.0, 255.0 / 224.0
    y *= scale_y
    u = np.repeat(np.repeat(u * scale_c, 2, axis=0), 2, axis=1)
    v = np.repeat(np.repeat(v * scale_c, 2, axis=0), 2, axis=1)
    cr_r, cb_g, cr_g, cb_b = YUV_TO_RGB["bt709" if frame.colorspace == AVCOL_SPC_BT709 else "bt601"]
    out = np.stack([y + cr_r * v, y + cb_g * u + cr_g * v, y + cb_b * u], axis=-1)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _audio(f: Any, sample_rate: int | None, seconds: float) -> tuple[np.ndarray | None, int | None]:
    import av

    stream = f.streams.audio[0]
    own = stream.codec_context.sample_rate
    rate = sample_rate or (own if own in AAC_RATES else 48_000)
    layout = "stereo" if stream.codec_context.channels >= 2 else "mono"
    resampler = av.AudioResampler(format="fltp", layout=layout, rate=rate)
    most = int(min(seconds + 1.0, MAX_DECODE_AUDIO_S) * rate)
    parts, total = [], 0
    try:
        for frame in f.decode(stream):
            for out in resampler.resample(frame):
                parts.append(out.to_ndarray())
                total += parts[-1].shape[-1]
            if total >= most:
                break
        else:
            parts += [out.to_ndarray() for out in resampler.resample(None)]
    except av.FFmpegError as err:
        raise DecodeError(f"the audio does not decode ({err})") from None
    if not parts:
        return None, None
    return np.concatenate(parts, axis=-1)[:, :most].astype(np.float32, copy=False), rate
