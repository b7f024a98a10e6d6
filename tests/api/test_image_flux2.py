"""FLUX.2 served from its tiny folder: text-to-image and reference-image edits through the openai SDK.

Its `tokenizer` (a PixtralProcessor) loads without torchvision (models/diffusion/processors.py).
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

MODEL = "flux2"
STEPS = {"num_inference_steps": 2}


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family(MODEL, tmp_path_factory.mktemp("flux2")) as s:
        yield s


def _image(seed: int, h: int = 64, w: int = 96) -> tuple[str, bytes]:
    rng = np.random.default_rng(seed)
    return (f"ref{seed}.png", png(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)))


async def test_generates_at_the_asked_size_and_same_seed_same_image(srv) -> None:
    client = srv.client()
    kw = {"model": MODEL, "prompt": "a red cube", "n": 2, "size": "64x32", "extra_body": {**STEPS, "seed": 5}}
    first = [decode(d.b64_json) for d in (await client.images.generate(**kw)).data]
    assert [im.shape for im in first] == [(32, 64, 3)] * 2
    again = await client.images.generate(**kw)
    assert np.array_equal(first[1], decode(again.data[1].b64_json))
    other = await client.images.generate(**{**kw, "prompt": "a dog at night"})
    assert not np.array_equal(first[0], decode(other.data[0].b64_json))  # the prompt reaches the model
    await eventually(lambda: idle(srv.orch))


async def test_edits_with_one_or_several_reference_images(srv) -> None:
    client = srv.client()
    kw = {"model": MODEL, "image": _image(0), "prompt": "the cube, blue", "extra_body": {**STEPS, "seed": 1}}
    one = decode((await client.images.edit(**kw)).data[0].b64_json)
    assert one.shape == (64, 96, 3)  # the input's size
    other = decode((await client.images.edit(**{**kw, "image": _image(1)})).data[0].b64_json)
    assert not np.array_equal(one, other)
    two = await client.images.edit(**{**kw, "image": [_image(0), _image(2, 64, 64)], "size": "32x32"})
    assert decode(two.data[0].b64_json).shape == (32, 32, 3)
    await eventually(lambda: idle(srv.orch))


async def test_models_say_it_generates_and_edits(srv) -> None:
    caps = (await srv.client().models.retrieve(MODEL)).model_extra["capabilities"]
    assert caps["tasks"] == ["text-to-image", "image-edit"] and caps["image_input"] == "optional"
    assert caps["max_input_images"] == 10 and caps["size_multiple"] == 16


async def test_bad_inputs_are_400s(srv) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.generate(model=MODEL, prompt="x", size="40x32")
    assert err.value.body["param"] == "size", err.value.body
    with pytest.raises(openai.BadRequestError) as err:  # FLUX.2 needs references of 64 px or more
        await client.images.edit(model=MODEL, image=_image(0, 32, 32), prompt="x", extra_body=STEPS)
    assert err.value.body["param"] == "image" and "64x64" in err.value.message, err.value.body
    with pytest.raises(openai.BadRequestError) as err:  # its call takes no negative prompt
        await client.images.generate(model=MODEL, prompt="x", size="32x32",
                                     extra_body={**STEPS, "negative_prompt": "blurry"})
    assert err.value.body["param"] == "negative_prompt", err.value.body
    await eventually(lambda: idle(srv.orch))
