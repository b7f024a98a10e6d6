"""POST /v1/images/edits on a tiny inpainting pipeline (image + mask), through the openai SDK."""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle, post
from tests.api.image_family_support import decode, png, serve_family

MODEL = "sd_inpaint"


@pytest.fixture(scope="module")
async def srv(tmp_path_factory):
    async with serve_family(MODEL, tmp_path_factory.mktemp("edits")) as s:
        yield s


def _image(h: int = 32, w: int = 48) -> bytes:
    rng = np.random.default_rng(0)
    return png(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def _mask(h: int = 32, w: int = 48) -> bytes:
    m = np.zeros((h, w, 4), np.uint8)
    m[..., 3] = 255
    m[: h // 2, :, 3] = 0  # transparent top half: edit there
    return png(m)


async def test_edit_with_a_mask_at_the_input_size_and_seeded(srv) -> None:
    client = srv.client()
    kw = {"model": MODEL, "image": ("in.png", _image()), "mask": ("mask.png", _mask()), "prompt": "a cat",
          "n": 2, "extra_body": {"num_inference_steps": 2, "seed": 3}}
    out = await client.images.edit(**kw)
    first = [decode(d.b64_json) for d in out.data]
    assert [im.shape for im in first] == [(32, 48, 3)] * 2
    again = await client.images.edit(**kw)
    assert np.array_equal(first[1], decode(again.data[1].b64_json))
    await eventually(lambda: idle(srv.orch))


async def test_an_input_off_the_size_multiple_is_edited_at_its_aspect_and_an_asked_size_kept(srv) -> None:
    """A 50x30 input (SD inpaint makes multiples of 8) was painted at the pipeline's default square; now at the
    input's size rounded down to the multiple, which the answer's `size` says."""
    kw = {"model": MODEL, "image": ("in.png", _image(30, 50)), "mask": ("m.png", _mask(30, 50)), "prompt": "x",
          "extra_body": {"num_inference_steps": 1, "seed": 1}}
    out = await srv.client().images.edit(**kw)
    assert decode(out.data[0].b64_json).shape == (24, 48, 3) and out.size == "48x24"
    asked = await srv.client().images.edit(**kw, size="32x32")
    assert decode(asked.data[0].b64_json).shape == (32, 32, 3) and asked.size == "32x32"
    await eventually(lambda: idle(srv.orch))


async def test_edit_url_answer(srv) -> None:
    client = srv.client()
    out = await client.images.edit(model=MODEL, image=("in.png", _image()), mask=("m.png", _mask()), prompt="x",
                                   response_format="url", extra_body={"num_inference_steps": 1})
    resp = await client._client.get(out.data[0].url, headers=srv.headers)
    assert resp.status_code == 200 and resp.content[:8] == b"\x89PNG\r\n\x1a\n"


async def test_models_say_it_edits_with_a_mask(srv) -> None:
    caps = (await srv.client().models.retrieve(MODEL)).model_extra["capabilities"]
    assert "inpaint" in caps["tasks"] and "text-to-image" not in caps["tasks"]
    assert {"image", "mask"} <= set(caps["inputs"]) and caps["image_input"] == "required"


@pytest.mark.parametrize(("kw", "param"), [
    ({"image": ("in.png", b"not an image")}, "image"),
    ({"mask": ("m.png", _mask(16, 16))}, "mask"),
    ({"mask": ("m.png", b"\x89PNG broken")}, "mask"),
    ({"size": "33x33"}, "size"),
    ({"image": [("a.png", _image()), ("b.png", _image())]}, "image"),
    ({"mask": None}, "mask"),  # inpainting needs one (the pipeline failed without, a 500)
    ({"extra_body": {"strength": 0}}, "strength"),
    ({"extra_body": {"strength": "most"}}, "strength"),
])
async def test_bad_edit_inputs_are_400s_naming_the_field(srv, kw: dict, param: str) -> None:
    base = {"model": MODEL, "image": ("in.png", _image()), "mask": ("mask.png", _mask()), "prompt": "x",
            "extra_body": {"num_inference_steps": 1}}
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(**{k: v for k, v in {**base, **kw}.items() if v is not None})
    assert err.value.body["param"] == param or param in err.value.message, err.value.body
    assert " object at 0x" not in err.value.body["message"], err.value.body  # no Python repr of our buffers
    await eventually(lambda: idle(srv.orch))


@pytest.mark.parametrize(("kw", "param"), [({"image": ("in.png", b"not an image")}, "image"),
                                           ({"mask": ("m.png", b"\x89PNG broken")}, "mask")])
async def test_an_upload_that_is_no_image_is_a_clean_400(srv, kw: dict, param: str) -> None:
    """PIL's "cannot identify image file <_io.BytesIO object at 0x7fcc...>" reached the client as it was."""
    base = {"model": MODEL, "image": ("in.png", _image()), "mask": ("mask.png", _mask()), "prompt": "x"}
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(**{**base, **kw})
    body = err.value.body
    assert body["param"] == param and body["code"] == "invalid_image", body
    assert body["message"].startswith(param), body
    assert body["message"].endswith("does not decode as an image: not a format this server reads (PNG, JPEG, "
                                    "WebP, GIF, ...)"), body


async def test_generations_on_an_edit_model_is_a_400_saying_what_it_does(srv) -> None:
    status, out = await post(srv, "/v1/images/generations", {"model": MODEL, "prompt": "x"})
    assert status == 400 and "/v1/images/edits" in out["error"]["message"], out
