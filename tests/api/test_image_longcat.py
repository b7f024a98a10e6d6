"""LongCat-Image (text-to-image, prompt rewrite on) and LongCat-Image-Edit served from their tiny folders.

Their `text_processor` (a Qwen2VLProcessor) loads without torchvision (models/diffusion/processors.py).
LongCat-Image-Edit makes a ~1 MP image at the input's aspect ratio (its call takes no size).
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

STEPS = {"num_inference_steps": 2}


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family("longcat_image", tmp_path_factory.mktemp("longcat")) as s:
        yield s


async def test_generates_at_the_asked_size_and_same_seed_same_image(srv) -> None:
    client = srv.client()
    kw = {"model": "longcat_image", "prompt": "a red cube", "size": "48x32", "extra_body": {**STEPS, "seed": 2}}
    first = decode((await client.images.generate(**kw)).data[0].b64_json)
    assert first.shape == (32, 48, 3)
    again = decode((await client.images.generate(**kw)).data[0].b64_json)
    assert np.array_equal(first, again)
    caps = (await client.models.retrieve("longcat_image")).model_extra["capabilities"]
    assert caps["tasks"] == ["text-to-image"] and caps["size_multiple"] == 16
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.edit(model="longcat_image", image=("a.png", png(first)), prompt="x")
    assert "/v1/images/generations" in err.value.message
    await eventually(lambda: idle(srv.orch))


async def test_longcat_edit_keeps_the_input_aspect(tmp_path) -> None:
    async with serve_family("longcat_image_edit", tmp_path) as edit_srv:
        client = edit_srv.client()
        rng = np.random.default_rng(0)
        image = ("in.png", png(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)))
        caps = (await client.models.retrieve("longcat_image_edit")).model_extra["capabilities"]
        assert caps["tasks"] == ["image-edit"] and "size" not in caps["inputs"]
        out = decode((await client.images.edit(model="longcat_image_edit", image=image, prompt="make it blue",
                                               extra_body={**STEPS, "seed": 1})).data[0].b64_json)
        h, w = out.shape[:2]
        assert out.shape[2] == 3 and abs(w / h - 64 / 48) < 0.05 and w * h > 512 * 512
        await eventually(lambda: idle(edit_srv.orch))
