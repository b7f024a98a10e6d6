"""media/mp4.py's spritesheet: which frames, how many to a row, how large a tile."""

from __future__ import annotations

import numpy as np
import pytest

from omni_actors.media.mp4 import SPRITE_FRAMES, sprite_layout, write_spritesheet


def test_a_long_video_shows_sixteen_frames_from_first_to_last_in_small_tiles():
    picks, columns, tile_w, tile_h = sprite_layout(121, 1280, 704)
    assert len(picks) == SPRITE_FRAMES and (picks[0], picks[-1]) == (0, 120)
    assert picks == sorted(set(picks))
    assert (columns, tile_w, tile_h) == (4, 160, 88)


def test_a_short_small_video_shows_every_frame_at_its_size():
    assert sprite_layout(5, 48, 32) == ([0, 1, 2, 3, 4], 3, 48, 32)
    assert sprite_layout(1, 48, 32) == ([0], 1, 48, 32)


def test_the_sheet_is_the_tiles_row_by_row(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    frames = np.stack([np.full((32, 48, 3), 20 * i, np.uint8) for i in range(5)])
    write_spritesheet(tmp_path / "s.jpg", frames)
    sheet = np.asarray(Image.open(tmp_path / "s.jpg"))
    assert sheet.shape == (64, 144, 3)  # 3 columns, 2 rows; the sixth tile is black
    for i in range(5):
        tile = sheet[(i // 3) * 32 : (i // 3 + 1) * 32, (i % 3) * 48 : (i % 3 + 1) * 48]
        assert abs(float(tile[4:-4, 4:-4].mean()) - 20 * i) < 3, i
