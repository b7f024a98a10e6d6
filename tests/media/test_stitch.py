"""media/stitch.py and media/mp4.py's reading: an extension's join, and what an upload may decode to."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("av")

from omni_actors.media import mp4
from omni_actors.media.mp4 import Clip, DecodeError, read_mp4, scan_mp4, write_mp4
from omni_actors.media.stitch import extend

FPS = 16.0
RATE = 16000


def frames(count: int, value: int) -> np.ndarray:
    return np.full((count, 16, 16, 3), value, np.uint8)


def test_the_join_drops_the_repeated_frame_and_pads_silence_where_a_part_has_no_audio():
    source = Clip(frames(5, 10), FPS, np.full((1, 4000), 0.5, np.float32), RATE)  # 5 frames, 5000 samples due
    new = Clip(frames(9, 20), FPS)
    joined = extend(source, new)
    assert joined.frames.shape[0] == 13 and (joined.frames[:5] == 10).all() and (joined.frames[5:] == 20).all()
    assert (joined.sample_rate, joined.audio.shape) == (RATE, (1, 13 * RATE // 16))
    assert (joined.audio[0, :4000] == 0.5).all() and not joined.audio[0, 4000:].any()


def test_the_new_parts_audio_starts_after_the_repeated_frame_and_mono_fills_both_sides():
    per_frame = RATE // 16
    tone = np.repeat(np.arange(9, dtype=np.float32), per_frame)[None] / 10  # one level per frame
    source = Clip(frames(5, 10), FPS, np.ones((2, 5 * per_frame), np.float32) * -0.1, RATE)
    joined = extend(source, Clip(frames(9, 20), FPS, tone, RATE))
    assert joined.audio.shape == (2, 13 * per_frame)
    assert (joined.audio[:, : 5 * per_frame] == -0.1).all()
    assert np.allclose(joined.audio[0, 5 * per_frame :], tone[0, per_frame:])  # frame 0 of the new part dropped
    assert np.array_equal(joined.audio[0], joined.audio[1])


def test_a_continuation_of_another_size_is_refused():
    with pytest.raises(ValueError, match="frames"):
        extend(Clip(frames(5, 0), FPS), Clip(np.zeros((5, 32, 16, 3), np.uint8), FPS))


def test_reading_back_what_was_written(tmp_path):
    made = np.random.default_rng(0).integers(0, 255, (5, 16, 32, 3), dtype=np.uint8)
    write_mp4(tmp_path / "a.mp4", made, FPS, np.zeros((2, 5 * 1000), np.float32), 16000)
    scan = scan_mp4((tmp_path / "a.mp4").read_bytes())
    assert (scan.width, scan.height, scan.frames, scan.fps, scan.last.shape) == (32, 16, 5, FPS, (16, 32, 3))
    clip = read_mp4(tmp_path / "a.mp4", 8000)
    assert (clip.frames.shape, clip.fps, clip.sample_rate, clip.audio.shape[0]) == ((5, 16, 32, 3), FPS, 8000, 2)
    assert clip.audio.shape[1] >= 5 * 500  # resampled to 8 kHz (AAC adds its padding)


def test_past_the_frame_bound_or_not_a_video_is_a_decode_error(tmp_path):
    write_mp4(tmp_path / "a.mp4", frames(mp4.MAX_DECODE_FRAMES + 1, 0), FPS)  # tiny frames: a small file
    with pytest.raises(DecodeError, match=f"more than {mp4.MAX_DECODE_FRAMES} frames"):
        scan_mp4((tmp_path / "a.mp4").read_bytes())
    for junk in (b"", b"\x00" * 64, b"\x89PNG\r\n\x1a\n"):
        with pytest.raises(DecodeError):
            scan_mp4(junk)
