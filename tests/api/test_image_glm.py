"""GLM-Image (an AR prior then a DiT) served from its tiny folder through the openai SDK.

Each request runs alone with one prompt and one generator (the AR prior is seeded
from it). Image-to-image runs through models/diffusion/fixes.py's work-around for
diffusers 0.42.1 (without it the prior's VQ encoder gets one channel of the image).
"""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

MODEL = "glm_image"


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family(MODEL, tmp_path_factory.mktemp("glm")) as s:
        yield s


async def test_generates_at_the_asked_size_and_same_seed_same_image(srv) -> None:
    client = srv.client()
    kw = {"model": MODEL, "prompt": "a sign that reads 'open'", "n": 2, "size": "64x32",
          "extra_body": {"num_inference_steps": 2, "seed": 3}}
    first, again, other = await asyncio.gather(  # concurrent requests each run alone
        client.images.generate(**kw), client.images.generate(**kw),
        client.images.generate(**{**kw, "extra_body": {"num_inference_steps": 2, "seed": 4}}),
    )
    images = [decode(d.b64_json) for d in first.data]
    assert [im.shape for im in images] == [(32, 64, 3)] * 2
    assert all(np.array_equal(a, decode(b.b64_json)) for a, b in zip(images, again.data, strict=True))
    assert not np.array_equal(images[0], decode(other.data[0].b64_json))
    await eventually(lambda: idle(srv.orch))


async def test_edits_one_image_at_its_size_and_the_image_conditions_it(srv) -> None:
    client = srv.client()
    rng = np.random.default_rng(0)
    image = png((rng.random((64, 96, 3)) * 255).astype(np.uint8))
    kw = {"model": MODEL, "image": ("a.png", image), "prompt": "make it blue",
          "extra_body": {"num_inference_steps": 2, "seed": 5}}
    first = decode((await client.images.edit(**kw)).data[0].b64_json)
    assert first.shape == (64, 96, 3)
    assert np.array_equal(first, decode((await client.images.edit(**kw)).data[0].b64_json))
    other = png((rng.random((64, 96, 3)) * 255).astype(np.uint8))
    assert not np.array_equal(first, decode((await client.images.edit(**{**kw, "image": ("b.png", other)})).data[0].b64_json))
    with pytest.raises(openai.BadRequestError) as err:  # one condition image
        await client.images.edit(**{**kw, "image": [("a.png", image), ("b.png", other)]})
    assert err.value.body["param"] == "image", err.value.body
    await eventually(lambda: idle(srv.orch))


async def test_edit_inputs_of_any_size_are_taken_at_multiples_of_32_and_bad_ones_are_400s(srv) -> None:
    client = srv.client()
    odd = ("odd.png", png(np.full((40, 50, 3), 90, np.uint8)))  # sides not multiples of 32
    kw = {"model": MODEL, "image": odd, "prompt": "x", "extra_body": {"num_inference_steps": 1}}
    out = await client.images.edit(**kw, n=2)
    assert [decode(d.b64_json).shape for d in out.data] == [(32, 64, 3)] * 2  # the input, rounded
    assert decode((await client.images.edit(**kw, size="64x64")).data[0].b64_json).shape == (64, 64, 3)
    caps = (await client.models.retrieve(MODEL)).model_extra["capabilities"]
    assert caps["image_multiple"] == 32 and caps["max_image_aspect"] == 4.0
    for image, param in (
        (("long.png", png(np.zeros((40, 150, 3), np.uint8))), "image"),  # 160x32 once rounded: over 4:1
        (odd, "mask"),
    ):
        extra = {"mask": ("m.png", png(np.zeros((40, 50, 4), np.uint8)))} if param == "mask" else {}
        with pytest.raises(openai.BadRequestError) as err:
            await client.images.edit(**{**kw, "image": image}, **extra)
        assert err.value.body["param"] == param, err.value.body
    await eventually(lambda: idle(srv.orch))


async def test_models_say_it_generates_and_edits(srv) -> None:
    client = srv.client()
    caps = (await client.models.retrieve(MODEL)).model_extra["capabilities"]
    assert caps["tasks"] == ["text-to-image", "image-edit"] and caps["image_input"] == "optional"
    assert caps["max_input_images"] == 1 and caps["size_multiple"] == 32
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.generate(model=MODEL, prompt="x", size="48x32")
    assert err.value.body["param"] == "size"
