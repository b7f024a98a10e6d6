"""/v1/images/edits with uploads and form fields a real client sends that the route once mishandled, through
the openai SDK against a tiny Stable Diffusion inpainting pipeline: a decompression bomb (a 500 and a
traceback), a phone photo with an EXIF orientation (edited sideways, so a mask drawn over it "did not match"),
an input wider than the largest size made at its own size (a 400 naming no field), a strength that leaves
no denoising step (a 500 from inside the pipeline), a boolean field that is neither true nor false and a
partial_images out of range without streaming (both ignored), EXIF Pillow cannot read or rewrite (a 500),
a 16-bit greyscale PNG (edited as white) and a mask whose transparency is a palette's colour key (read as
luminance: the transparent part was kept).
"""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
from PIL import Image

pytest.importorskip("diffusers")

from omni_actors.api.images import MAX_SIDE
from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

MODEL = "sd_inpaint"
FAST = {"num_inference_steps": 2}
EXIF_ORIENTATION = 0x0112
ROTATED_90_CW = 6
"""EXIF orientation 6: the stored pixels are shown turned 90 degrees clockwise (a phone held upright)."""
X_RESOLUTION, TIFF_BYTE = 0x011A, 1
UNREADABLE_EXIF = b"Exif\x00\x00XX*\x00\x00\x00\x00\x08"
"""An EXIF block whose TIFF header is neither II nor MM."""


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family(MODEL, tmp_path_factory.mktemp("edit-uploads")) as s:
        yield s


def _image(h: int = 32, w: int = 48) -> bytes:
    return png(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8))


def _mask(h: int = 32, w: int = 48) -> bytes:
    m = np.full((h, w, 4), 255, np.uint8)
    m[: h // 2, :, 3] = 0  # transparent top half: edit there
    return png(m)


def _bomb(side: int) -> bytes:
    """A side x side greyscale PNG: a fraction of a megabyte that decodes to side^2 bytes (and 3x that as RGB)."""
    buf = io.BytesIO()
    Image.new("L", (side, side)).save(buf, format="PNG")
    return buf.getvalue()


async def _bad(srv, param: str, **kw) -> openai.BadRequestError:
    base = {"model": MODEL, "image": ("in.png", _image()), "mask": ("m.png", _mask()), "prompt": "x",
            "extra_body": FAST}
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(**{**base, **kw})
    assert err.value.body["param"] == param, err.value.body
    await eventually(lambda: idle(srv.orch))
    return err.value


@pytest.mark.parametrize("field", ["image", "mask"])
@pytest.mark.parametrize("side", [10_000, 16_000])  # under and over twice PIL's own limit (89 MP)
async def test_a_decompression_bomb_is_a_400_before_it_is_decoded(srv, field: str, side: int) -> None:
    err = await _bad(srv, field, **{field: ("big.png", _bomb(side))})
    assert err.body["code"] in ("image_too_large", "invalid_image"), err.body
    if side == 10_000:  # PIL only warns: refused by the route's own limit, read from the header
        assert err.body["code"] == "image_too_large" and "10000x10000" in err.body["message"], err.body


async def test_an_exif_rotated_photo_is_edited_upright(srv) -> None:
    stored = Image.fromarray(np.random.default_rng(1).integers(0, 255, (32, 48, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = ROTATED_90_CW
    buf = io.BytesIO()
    stored.save(buf, format="JPEG", exif=exif.tobytes())  # 48 wide as stored, 32 wide as shown
    out = await srv.client().images.edit(model=MODEL, image=("photo.jpg", buf.getvalue()),
                                         mask=("m.png", _mask(48, 32)), prompt="x", extra_body=FAST)
    assert out.size == "32x48" and decode(out.data[0].b64_json).shape == (48, 32, 3)


async def test_an_input_wider_than_the_largest_size_is_not_made_at_its_own_size(srv) -> None:
    w = MAX_SIDE + 8  # a multiple of the family's 8, but past what `size` may ask for
    out = await srv.client().images.edit(model=MODEL, image=("wide.png", _image(8, w)), mask=("m.png", _mask(8, w)),
                                         prompt="x", extra_body=FAST)
    width, height = map(int, out.size.split("x"))
    assert width <= MAX_SIDE and height <= MAX_SIDE


async def test_a_strength_that_leaves_no_step_is_a_400_naming_it(srv) -> None:
    # Stable Diffusion runs int(steps x strength) steps: 2 x 0.1 is none (the pipeline raised: a 500)
    err = await _bad(srv, "strength", extra_body={**FAST, "strength": 0.1})
    assert "num_inference_steps" in err.body["message"]
    out = await srv.client().images.edit(model=MODEL, image=("in.png", _image()), mask=("m.png", _mask()),
                                         prompt="x", extra_body={**FAST, "strength": 0.5})  # one step: runs
    assert len(out.data) == 1


@pytest.mark.parametrize("field", ["stream", "stream_progress"])
async def test_a_boolean_field_that_is_not_true_or_false_is_a_400(srv, field: str) -> None:
    await _bad(srv, field, extra_body={**FAST, field: "banana"})


async def test_partial_images_is_checked_without_stream_too(srv) -> None:
    await _bad(srv, "partial_images", extra_body={**FAST, "partial_images": 9})  # (it was ignored unchecked)


def _encoded(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _mistyped_exif() -> bytes:
    """Orientation 6 and an XResolution stored as BYTE instead of RATIONAL, as some cameras write it: Pillow
    reads it, but ImageOps.exif_transpose raised TypeError writing it back (a 500)."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION], exif[X_RESOLUTION] = ROTATED_90_CW, 72.0
    raw = bytearray(exif.tobytes())
    entry = raw.index(X_RESOLUTION.to_bytes(2, "big"), 16)  # ("MM": big-endian IFD entries)
    raw[entry + 2 : entry + 4] = TIFF_BYTE.to_bytes(2, "big")
    return bytes(raw)


@pytest.mark.parametrize("field", ["image", "mask"])
@pytest.mark.parametrize(("exif", "shown"), [("mistyped", (48, 32)), ("unreadable", (32, 48))])
async def test_an_upload_whose_exif_pillow_cannot_handle_is_edited_not_a_500(srv, field: str, exif: str,
                                                                               shown: tuple[int, int]) -> None:
    # mistyped: still turned upright by its orientation; unreadable (Pillow's TIFF reader raised
    # SyntaxError from getexif): taken as stored, as a browser shows it
    raw = _mistyped_exif() if exif == "mistyped" else UNREADABLE_EXIF
    stored = Image.open(io.BytesIO(_image() if field == "image" else _mask()))  # 32 x 48 as stored
    files = {"image": ("in.png", _image(*shown)), "mask": ("m.png", _mask(*shown))}
    files[field] = (f"{field}.png", _encoded(stored, exif=raw))
    out = await srv.client().images.edit(model=MODEL, prompt="x", extra_body=FAST, **files)
    assert decode(out.data[0].b64_json).shape == (*shown, 3)

async def _edit(srv, image: bytes, mask: bytes) -> np.ndarray:
    out = await srv.client().images.edit(model=MODEL, image=("in.png", image), mask=("m.png", mask), prompt="x",
                                         extra_body={**FAST, "seed": 5})
    return decode(out.data[0].b64_json)


async def test_uploads_in_other_encodings_of_one_picture_make_the_same_edit(srv) -> None:
    level = np.full((32, 48), 100, np.uint8)
    top = np.zeros((32, 48), bool)
    top[:16] = True
    rgba = np.full((32, 48, 4), 255, np.uint8)
    rgba[top, 3] = 0  # OpenAI's mask: transparent = edit there
    reference = await _edit(srv, _encoded(Image.fromarray(level)), _encoded(Image.fromarray(rgba)))
    inverted = rgba.copy()
    inverted[..., 3] = 255 - rgba[..., 3]
    assert not np.array_equal(reference, await _edit(srv, _encoded(Image.fromarray(level)),
                                                     _encoded(Image.fromarray(inverted))))  # (the mask matters)
    # A 16-bit greyscale PNG of the same level (PIL's convert clipped it to white)
    deep = _encoded(Image.fromarray(level.astype(np.uint16) * 257))
    assert np.array_equal(reference, await _edit(srv, deep, _encoded(Image.fromarray(rgba))))
    # A palette mask whose transparency is a tRNS colour key, black (as PNG optimisers write masks): it was
    # read as luminance, so the transparent black top was kept and the white bottom painted
    palette = Image.fromarray(np.where(top, 0, 1).astype(np.uint8), "P")
    palette.putpalette([0, 0, 0, 255, 255, 255])
    keyed = _encoded(palette, transparency=0)
    assert np.array_equal(reference, await _edit(srv, _encoded(Image.fromarray(level)), keyed))
