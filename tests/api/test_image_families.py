"""Text-to-image families served from their tiny diffusers folders, through the openai SDK."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle, post
from tests.api.image_family_support import decode, serve_family

STEPS = 2


FAMILIES = [
    "qwen_image",
    "z_image",
    "hunyuan_image",
]
"""One server per family."""


@pytest.fixture(scope="module", params=FAMILIES)
async def srv(request, tmp_path_factory):
    async with serve_family(request.param, tmp_path_factory.mktemp("family")) as s:
        s.family = request.param
        yield s


async def test_generates_at_the_asked_size_and_same_seed_same_image(srv) -> None:
    client = srv.client()
    kw = {"model": srv.family, "prompt": "a red cube", "n": 2, "size": "64x32",
          "extra_body": {"num_inference_steps": STEPS, "seed": 5}}
    out = await client.images.generate(**kw)
    first = [decode(d.b64_json) for d in out.data]
    assert [im.shape for im in first] == [(32, 64, 3)] * 2 and out.size == "64x32"
    again = await client.images.generate(**kw)
    assert np.array_equal(first[0], decode(again.data[0].b64_json))
    other = await client.images.generate(**{**kw, "n": 1, "extra_body": {"num_inference_steps": STEPS, "seed": 6}})
    assert not np.array_equal(first[0], decode(other.data[0].b64_json))
    await eventually(lambda: idle(srv.orch))


async def test_models_say_what_the_pipeline_does(srv) -> None:
    model = await srv.client().models.retrieve(srv.family)
    caps = model.model_extra["capabilities"]
    assert caps["tasks"] == ["text-to-image"] and caps["output_kind"] == "image"
    assert "size" in caps["inputs"] and "image" not in caps["inputs"]


async def test_url_answer_is_served_here_and_jpeg_webp_encode(srv) -> None:
    client = srv.client()
    out = await client.images.generate(model=srv.family, prompt="x", size="32x32", response_format="url",
                                       extra_body={"num_inference_steps": 1, "seed": 1, "output_format": "webp"})
    url = out.data[0].url
    assert url.startswith(srv.url + "/v1/files/images/") and url.endswith(".webp")
    resp = await client._client.get(url, headers=srv.headers)
    assert resp.status_code == 200 and resp.headers["content-type"] == "image/webp" and resp.content[:4] == b"RIFF"
    jpeg = await client.images.generate(model=srv.family, prompt="x", size="32x32", output_format="jpeg",
                                        extra_body={"num_inference_steps": 1, "seed": 1})
    assert decode(jpeg.data[0].b64_json).shape == (32, 32, 3)


@pytest.mark.parametrize(("body", "param"), [
    ({"size": "40x40"}, "size"),  # not a multiple of the family's 16 px
    ({"size": "32x32", "negative_prompt": 3}, "negative_prompt"),
    ({"size": "32x32", "num_inference_steps": 0}, "num_inference_steps"),
])
async def test_bad_inputs_are_400s_naming_the_field(srv, body: dict, param: str) -> None:
    status, out = await post(srv, "/v1/images/generations", {"prompt": "x", **body})
    assert status == 400 and param in (out["error"]["param"] or out["error"]["message"]), out
    await eventually(lambda: idle(srv.orch))


async def test_edits_on_a_text_to_image_model_is_a_400_saying_what_it_does(srv) -> None:
    from tests.api.image_family_support import png

    client = srv.client()
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        await client.images.edit(model=srv.family, image=("a.png", png(np.zeros((32, 32, 3), np.uint8))),
                                 prompt="x")
    assert "text-to-image" in err.value.message and "/v1/images/generations" in err.value.message


async def test_stream_sends_partial_images_then_completed(srv) -> None:
    stream = await srv.client().images.generate(
        model=srv.family, prompt="x", size="32x32", stream=True, partial_images=1,
        extra_body={"num_inference_steps": 3, "seed": 2})
    events = [e async for e in stream]
    assert events[-1].type == "image_generation.completed"
    assert decode(events[-1].b64_json).shape == (32, 32, 3)
    partial = [e for e in events if e.type == "image_generation.partial_image"]
    assert [e.partial_image_index for e in partial] == [0]
    assert decode(partial[0].b64_json).shape == (32, 32, 3)
