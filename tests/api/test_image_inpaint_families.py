"""Qwen-Image inpaint, Qwen-Image-Edit inpaint and FLUX.2 Klein inpaint served from their tiny folders.

POST /v1/images/edits with image + mask through the openai SDK. The default suite serves Qwen-Image
inpaint (takes a size) and Klein inpaint (paints at the input's size); -m slow adds Qwen-Image-Edit
inpaint, whose call paints at about a megapixel (tens of seconds a request on one CPU core).
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

FAMILIES = ["qwen_image_inpaint", "flux2_klein_inpaint", pytest.param("qwen_image_edit_inpaint", marks=pytest.mark.slow)]
GUIDANCE = {"qwen_image_inpaint": "true_cfg_scale", "qwen_image_edit_inpaint": "true_cfg_scale",
            "flux2_klein_inpaint": "guidance_scale"}  # fmt: skip
H, W = 48, 64
"""Input sides: multiples of 16, so Klein paints at exactly this size."""


@pytest.fixture(scope="module", params=FAMILIES)
async def srv(request, tmp_path_factory):
    async with serve_family(request.param, tmp_path_factory.mktemp("inpaint_family")) as s:
        s.family = request.param
        yield s


def _image() -> tuple[str, bytes]:
    rng = np.random.default_rng(0)
    return ("in.png", png(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)))


def _mask() -> tuple[str, bytes]:
    m = np.full((H, W, 4), 255, np.uint8)
    m[H // 4 : 3 * H // 4, W // 4 : 3 * W // 4, 3] = 0  # transparent middle: paint there
    return ("mask.png", png(m))


def _check_size(srv, out: np.ndarray, asked: tuple[int, int] | None) -> None:
    h, w = out.shape[:2]
    if srv.family == "qwen_image_edit_inpaint":  # about a megapixel at the input's aspect
        assert 0.8e6 < h * w < 1.2e6 and h % 16 == 0 and w % 16 == 0 and abs(w / h - W / H) < 0.05, out.shape
    else:
        assert (w, h) == (asked or (W, H)), out.shape


async def test_inpaint_with_a_mask_is_seeded_and_guided_through_the_family_parameter(srv) -> None:
    client = srv.client()
    steps = 2
    if srv.family == "qwen_image_edit_inpaint":  # a megapixel: tens of seconds a request
        client, steps = client.with_options(timeout=300), 1
    size = "32x32" if srv.family == "qwen_image_inpaint" else None
    kw = {"model": srv.family, "image": _image(), "mask": _mask(), "prompt": "a red cube",
          "extra_body": {"num_inference_steps": steps, "seed": 5, "negative_prompt": "blur", "guidance_scale": 1.0}}
    if srv.family == "flux2_klein_inpaint":
        del kw["extra_body"]["negative_prompt"]  # its call takes none (CFG against an empty prompt)
    if size:
        kw["size"] = size
    first = decode((await client.images.edit(**kw)).data[0].b64_json)
    _check_size(srv, first, (32, 32) if size else None)
    assert first.shape[2] == 3
    again = decode((await client.images.edit(**kw)).data[0].b64_json)
    assert np.array_equal(first, again)
    # Guidance reaches the call's CFG parameter: at 1 there is none; at 6 the image changes. Sent to
    # Qwen's `guidance_scale` (for guidance-distilled weights) it was ignored and the images matched.
    guided = decode((await client.images.edit(**{**kw, "extra_body": {**kw["extra_body"], "guidance_scale": 6.0}}))
                    .data[0].b64_json)  # fmt: skip
    assert guided.shape == first.shape and not np.array_equal(first, guided)
    await eventually(lambda: idle(srv.orch))


async def test_strength_reaches_the_call_and_repeats_with_its_seed(srv) -> None:
    client, steps = srv.client(), 2
    if srv.family == "qwen_image_edit_inpaint":
        client = client.with_options(timeout=300)
    kw = {"model": srv.family, "image": _image(), "mask": _mask(), "prompt": "a red cube",
          "extra_body": {"num_inference_steps": steps, "seed": 5}}
    half = {**kw, "extra_body": {**kw["extra_body"], "strength": 0.5}}
    first = decode((await client.images.edit(**half)).data[0].b64_json)
    again = decode((await client.images.edit(**half)).data[0].b64_json)
    default = decode((await client.images.edit(**kw)).data[0].b64_json)  # the family's own strength
    assert np.array_equal(first, again) and first.shape == default.shape
    assert not np.array_equal(first, default)
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.edit(**{**kw, "extra_body": {**kw["extra_body"], "strength": 1.5}})
    assert err.value.body["param"] == "strength", err.value.body
    await eventually(lambda: idle(srv.orch))


async def test_stream_sends_a_preview_then_the_completed_image(srv) -> None:
    """The inpaint classes' previews (Qwen's latents as its "auto" layout, Klein's "packed_bn")."""
    client = srv.client()
    if srv.family == "qwen_image_edit_inpaint":
        client = client.with_options(timeout=300)
    stream = await client.images.edit(model=srv.family, image=_image(), mask=_mask(), prompt="a red cube",
                                      stream=True, partial_images=1,
                                      extra_body={"num_inference_steps": 3, "seed": 2})
    events = [e async for e in stream]
    assert [e.type for e in events] == ["image_edit.partial_image", "image_edit.completed"]
    preview, final = decode(events[0].b64_json), decode(events[-1].b64_json)
    assert preview.shape == final.shape and final.shape[2] == 3 and preview.std() > 0
    await eventually(lambda: idle(srv.orch))


async def test_a_missing_mask_is_a_400_naming_mask(srv) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(model=srv.family, image=_image(), prompt="x",
                                       extra_body={"num_inference_steps": 1})
    assert err.value.body["param"] == "mask", err.value.body
    if srv.family != "qwen_image_inpaint":  # a pipeline that paints at its own size is not asked for one
        with pytest.raises(openai.BadRequestError) as err:
            await srv.client().images.edit(model=srv.family, image=_image(), mask=_mask(), prompt="x",
                                           size="1024x1024", extra_body={"num_inference_steps": 1})
        assert err.value.body["param"] == "size" and err.value.body["code"] == "unsupported_parameter"


async def test_models_say_inpaint_with_a_required_mask_and_no_text_to_image(srv) -> None:
    caps = (await srv.client().models.retrieve(srv.family)).model_extra["capabilities"]
    assert caps["tasks"] == ["image-edit", "inpaint"], caps
    assert caps["image_input"] == "required" and caps["mask_required"] is True
    assert caps["size_multiple"] == 16 and caps["guidance_param"] == GUIDANCE[srv.family]
    assert ("size" in caps["inputs"]) is (srv.family == "qwen_image_inpaint") and "strength" in caps["inputs"]
