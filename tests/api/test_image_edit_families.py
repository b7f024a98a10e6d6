"""Qwen-Image-Edit and Edit-Plus served from their tiny folders: POST /v1/images/edits through the openai SDK.

Their `processor` (a Qwen2VLProcessor) loads without torchvision (models/diffusion/processors.py).
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle, post
from tests.api.image_family_support import decode, png, serve_family

FAMILIES = ["qwen_image_edit_plus", "qwen_image_edit"]
"""One server per family: Edit-Plus (one and several images) and Edit."""
STEPS = {"num_inference_steps": 2}


@pytest.fixture(scope="module", params=FAMILIES)
async def srv(request, tmp_path_factory):
    async with serve_family(request.param, tmp_path_factory.mktemp("edit_family")) as s:
        s.family = request.param
        yield s


def _image(seed: int, h: int = 32, w: int = 48) -> tuple[str, bytes]:
    rng = np.random.default_rng(seed)
    return (f"in{seed}.png", png(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)))


async def test_edit_at_the_input_size_and_same_seed_same_image(srv) -> None:
    client = srv.client()
    kw = {"model": srv.family, "image": _image(0), "prompt": "make it blue", "extra_body": {**STEPS, "seed": 4}}
    first = decode((await client.images.edit(**kw)).data[0].b64_json)
    assert first.shape == (32, 48, 3)
    again = decode((await client.images.edit(**kw)).data[0].b64_json)
    assert np.array_equal(first, again)
    other = decode((await client.images.edit(**{**kw, "image": _image(1)})).data[0].b64_json)
    assert not np.array_equal(first, other)  # the input image conditions the output
    await eventually(lambda: idle(srv.orch))


async def test_rgba_and_grayscale_files_edit_as_rgb(srv) -> None:
    """The pipelines read RGB; an RGBA file went in as it was and failed inside (a 500)."""
    rng = np.random.default_rng(2)
    for shape in ((32, 48, 4), (32, 48)):
        image = ("in.png", png(rng.integers(0, 255, shape, dtype=np.uint8)))
        out = await srv.client().images.edit(model=srv.family, image=image, prompt="x", extra_body=STEPS)
        assert decode(out.data[0].b64_json).shape == (32, 48, 3)


async def test_models_say_it_edits_and_how_many_images(srv) -> None:
    caps = (await srv.client().models.retrieve(srv.family)).model_extra["capabilities"]
    assert caps["tasks"] == ["image-edit"] and caps["image_input"] == "required"
    assert caps["max_input_images"] == (3 if srv.family == "qwen_image_edit_plus" else 1)
    assert caps["size_multiple"] == 16


async def test_several_images_where_the_family_takes_them(srv) -> None:
    client = srv.client()
    images = [_image(0), _image(1, 48, 32)]
    kw = {"model": srv.family, "image": images, "prompt": "put them together", "size": "32x32",
          "extra_body": STEPS}
    if srv.family == "qwen_image_edit":
        with pytest.raises(openai.BadRequestError) as err:
            await client.images.edit(**kw)
        assert err.value.body["param"] == "image", err.value.body
    else:
        out = await client.images.edit(**kw)
        assert decode(out.data[0].b64_json).shape == (32, 32, 3)
    await eventually(lambda: idle(srv.orch))


async def test_bad_inputs_are_400s_naming_the_field(srv) -> None:
    client = srv.client()
    for kw, param in [({"image": ("x.png", b"not an image")}, "image"), ({"size": "40x40"}, "size"),
                      ({"mask": ("m.png", png(np.zeros((32, 48, 4), np.uint8)))}, "mask"),
                      ({"extra_body": {"strength": 0.5}}, "strength"),  # (these calls take none)
                      ({"image": _image(1, h=500, w=1)}, "image")]:  # past what Qwen2-VL's processor reads
        with pytest.raises(openai.BadRequestError) as err:
            await client.images.edit(**{"model": srv.family, "image": _image(0), "prompt": "x", **kw})
        assert err.value.body["param"] == param, err.value.body
    status, out = await post(srv, "/v1/images/generations", {"model": srv.family, "prompt": "x"})
    assert status == 400 and "/v1/images/edits" in out["error"]["message"], out
