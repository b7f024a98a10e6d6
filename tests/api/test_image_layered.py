"""Qwen-Image-Layered served from its tiny folder: one RGBA image in, its layers out as separate images.

Its `processor` (a Qwen2VLProcessor) loads without torchvision (models/diffusion/processors.py).
The pipeline works at ~640x640 whatever the input's size (its `resolution`), keeping the aspect ratio.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

MODEL = "qwen_image_layered"


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family(MODEL, tmp_path_factory.mktemp("layered")) as s:
        yield s


async def test_layers_come_back_as_separate_rgba_images(srv) -> None:
    client = srv.client()
    caps = (await client.models.retrieve(MODEL)).model_extra["capabilities"]
    assert caps["tasks"] == ["image-to-layers"] and "layers" in caps["inputs"] and caps["image_input"] == "required"
    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 255, (48, 64, 4), dtype=np.uint8)
    out = await client.images.edit(model=MODEL, image=("in.png", png(rgba)), prompt="a cat on a sofa",
                                   extra_body={"layers": 2, "num_inference_steps": 2, "seed": 1})
    layers = [decode(d.b64_json) for d in out.data]
    assert len(layers) == 2 and all(im.ndim == 3 and im.shape[2] == 4 for im in layers)
    h, w = layers[0].shape[:2]
    assert abs(w / h - 64 / 48) < 0.05 and not np.array_equal(layers[0], layers[1])
    await eventually(lambda: idle(srv.orch))


async def test_an_rgb_input_and_several_images_each_with_its_layers(srv) -> None:
    """An RGB (or grayscale) file goes in as RGBA, as the pipeline's VAE reads; n images come back as
    n stacks of equal layers (diffusers 0.42.1 cuts them unevenly at n > 1: 5 + 3 for 2 x 4)."""
    rgb = np.random.default_rng(1).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    out = await srv.client().images.edit(model=MODEL, image=("in.png", png(rgb)), prompt="x", n=2,
                                         extra_body={"layers": 2, "num_inference_steps": 1, "seed": 1})
    layers = [decode(d.b64_json) for d in out.data]
    assert len(layers) == 4 and all(im.shape == layers[0].shape and im.shape[2] == 4 for im in layers)
    await eventually(lambda: idle(srv.orch))


async def test_jpeg_which_has_no_alpha_is_a_400_naming_output_format(srv) -> None:
    """Layers are RGBA: a JPEG of one dropped its alpha (each layer's hidden colours came out as a flat picture),
    and `background: "transparent"` with `output_format: "jpeg"` went through; OpenAI refuses that pair.
    Refused before anything runs, on edits and their stream alike; WebP keeps the alpha."""
    import openai

    rgba = np.random.default_rng(2).integers(0, 255, (48, 64, 4), dtype=np.uint8)
    client = srv.client()
    for extra in ({}, {"background": "transparent"}, {"stream": True}):
        with pytest.raises(openai.BadRequestError) as err:
            await client.images.edit(model=MODEL, image=("in.png", png(rgba)), prompt="x", output_format="jpeg",
                                     extra_body={"layers": 2, "num_inference_steps": 1, **extra})
        assert err.value.body["param"] == "output_format", extra
    out = await client.images.edit(model=MODEL, image=("in.png", png(rgba)), prompt="x", output_format="webp",
                                   background="transparent", extra_body={"layers": 2, "num_inference_steps": 1})
    assert out.output_format == "webp" and all(decode(d.b64_json).shape[2] == 4 for d in out.data)
    await eventually(lambda: idle(srv.orch))
