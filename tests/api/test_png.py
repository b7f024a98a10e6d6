"""The PNG writer for answered images: PIL reads back the exact pixels; noise is stored, smooth images shrink."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from omni_actors.api.png import encode_png


def _read(png: bytes) -> tuple[np.ndarray, str]:
    im = Image.open(io.BytesIO(png))
    return np.asarray(im), im.mode


@pytest.mark.parametrize(("shape", "mode"), [
    ((48, 64, 3), "RGB"), ((7, 5, 4), "RGBA"), ((9, 11, 1), "L"), ((9, 11), "L"), ((1, 1, 3), "RGB"),
])
def test_pixels_come_back_exactly(shape: tuple[int, ...], mode: str) -> None:
    img = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    back, got_mode = _read(encode_png(img))
    assert got_mode == mode
    assert np.array_equal(back, img[..., 0] if img.ndim == 3 and img.shape[2] == 1 else img)


def test_noise_is_stored_and_smooth_images_compress() -> None:
    rng = np.random.default_rng(2)
    noise = rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)
    y, x = np.mgrid[0:128, 0:128]
    smooth = np.stack([x * 2, y * 2, x + y], -1).astype(np.uint8)
    raw = 128 * (128 * 3 + 1)  # the filtered rows: a filter byte before each
    stored = encode_png(noise)
    assert raw < len(stored) < raw + 200  # zlib stored blocks: 5 bytes each, plus the chunks
    assert np.array_equal(_read(stored)[0], noise)
    small = encode_png(smooth)
    assert len(small) < raw // 4 and np.array_equal(_read(small)[0], smooth)


@pytest.mark.parametrize("bad", [
    np.zeros((4, 4, 3), np.float32), np.zeros((4, 4, 2), np.uint8), np.zeros((0, 4, 3), np.uint8),
    np.zeros((2, 4, 4, 3), np.uint8),
])
def test_what_it_cannot_write_is_a_value_error(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="uint8"):
        encode_png(bad)
