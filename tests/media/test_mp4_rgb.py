"""media/mp4.py's own YUV -> RGB conversion of decoded frames agrees with FFmpeg's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from omni_actors.media.mp4 import read_mp4, rgb, write_mp4  # noqa: E402


def test_rgb_agrees_with_ffmpeg(tmp_path: Path):
    h, w = 32, 48
    ramp = np.linspace(0, 255, h * w * 3).reshape(h, w, 3)
    path = tmp_path / "ramp.mp4"
    write_mp4(path, np.stack([ramp, 255 - ramp]).astype(np.uint8), 24.0)
    with av.open(str(path)) as f:
        for frame in f.decode(video=0):
            assert frame.format.name == "yuv420p"  # the path converted here, not the swscale fallback
            ours, theirs = rgb(frame), frame.to_ndarray(format="rgb24")
            assert ours.shape == theirs.shape and ours.dtype == np.uint8
            diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
            assert diff.mean() < 1.5 and diff.max() <= 8  # rounding and chroma upsampling
    frames = read_mp4(path).frames
    assert frames.shape == (2, h, w, 3) and abs(float(frames[0].mean()) - float(ramp.mean())) < 2
