"""/v1/images/edits with uploads and form fields a real client sends that the route once mishandled, through
the openai SDK against a tiny Stable Diffusion inpainting pipeline: a decompression bomb (a 500 and a
traceback), a phone photo with an EXIF orientation (edited sideways, so a mask drawn over it "did not match"),
an input wider than the largest size made at its own size (a 400 naming no field), a strength that leaves
no denoising step (a 500 from inside the pipeline), a boolean field that is neither true nor false and a
partial_images out of range without streaming (both ignored).
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
