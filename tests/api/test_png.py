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


def test_a_large_image_compressed_in_bands_is_one_valid_zlib_stream() -> None:
    """Bands joined pigz-style: zlib itself (which checks the Adler-32) inflates the whole stream."""
    import zlib

    from omni_actors.api import png

    y, x = np.mgrid[0:512, 0:384]
    img = np.stack([x % 256, y % 256, (x * y) % 251], -1).astype(np.uint8)
    out = encode_png(img)
    idat = _chunks(out)[b"IDAT"]
    assert idat[:2] == b"\x78\x01"
    rows = zlib.decompress(idat)
    assert len(rows) == 512 * (384 * 3 + 1) and len(idat) < len(rows) // 2
    assert np.array_equal(_read(out)[0], img)
    if png.BANDS > 1:  # several bands: a full flush (00 00 ff ff) ends every band but the last
        assert b"\x00\x00\xff\xff" in idat


def _chunks(png: bytes) -> dict[bytes, bytes]:
    found, pos = {}, 8
    while pos < len(png):
        length, kind = int.from_bytes(png[pos:pos + 4], "big"), png[pos + 4:pos + 8]
        found[kind] = png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return found
