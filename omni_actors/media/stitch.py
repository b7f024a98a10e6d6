"""Joining a generated continuation onto the clip it continues (an extension's finished video).

    extend(source Clip, new Clip) -> Clip

The new part was generated from the source's last frame, so its first frame repeats
that frame and is dropped: the result has source + new - 1 frames at the source's fps.
If either part has audio, the result carries one track over the whole video: the part
without audio is silence, each part is cut or padded to exactly its frames' length, and
the track takes the new part's sample rate (the source's when only it has audio) and
the larger channel count (mono is copied to both sides of a stereo track).
"""

from __future__ import annotations

import numpy as np

from omni_actors.media.mp4 import Clip


def extend(source: Clip, new: Clip) -> Clip:
    if source.frames.shape[1:] != new.frames.shape[1:]:
        raise ValueError(f"the continuation's frames are {new.frames.shape[1:]}, the source's "
                         f"{source.frames.shape[1:]}")
    frames = np.concatenate([source.frames, new.frames[1:]])
    if source.audio is None and new.audio is None:
        return Clip(frames, source.fps)
    rate = new.sample_rate if new.audio is not None else source.sample_rate
    assert rate is not None
    channels = max(a.shape[0] for a in (source.audio, new.audio) if a is not None)
    head = round(len(source.frames) * rate / source.fps)
    total = round(len(frames) * rate / source.fps)
    skip = total - head  # the repeated first frame's samples are dropped from the new part
    first = _fit(source.audio, channels, 0, head)
    second = _fit(new.audio, channels, round(rate / source.fps), skip)
    return Clip(frames, source.fps, np.concatenate([first, second], axis=1), rate)


def _fit(audio: np.ndarray | None, channels: int, start: int, length: int) -> np.ndarray:
    """`length` samples of `audio` from `start` as float32 [channels, length], silence where it has none."""
    out = np.zeros((channels, length), np.float32)
    if audio is None:
        return out
    part = np.asarray(audio, np.float32)[:, start : start + length]
    if part.shape[0] < channels:
        part = np.repeat(part, channels, axis=0)[:channels]
    out[:, : part.shape[1]] = part[:channels]
    return out
