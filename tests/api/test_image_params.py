"""OpenAI image fields that were accepted and ignored: `output_compression` sets the JPEG / WebP quality,
`background: "transparent"` is a 400, `quality` / `style` / `input_fidelity` are checked no-ops (docs/media.md).
Generations on tiny Qwen-Image, edits on tiny SD inpainting, through the openai SDK."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle, post
from tests.api.image_family_support import decode, png, serve_family

STEPS = {"num_inference_steps": 1, "seed": 3}
LEAVE_TIMEOUT_S = 20.0
"""Longest wait for the server to see a client gone and abort its run (a denoising step at most)."""


@pytest.fixture(scope="module")
async def gen(tmp_path_factory):
    async with serve_family("qwen_image", tmp_path_factory.mktemp("params")) as s:
        yield s


@pytest.fixture(scope="module")
async def edit(tmp_path_factory):
    async with serve_family("sd_inpaint", tmp_path_factory.mktemp("params_edit")) as s:
        yield s


def _edit_inputs() -> dict:
    rng = np.random.default_rng(0)
    mask = np.zeros((32, 48, 4), np.uint8)
    mask[:16, :, 3] = 255
    return {"image": ("in.png", png(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8))),
            "mask": ("m.png", png(mask)), "prompt": "x", "extra_body": STEPS}


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
async def test_output_compression_sets_the_quality(gen, fmt: str) -> None:
    client = gen.client()
    kw = {"model": "qwen_image", "prompt": "a red cube", "size": "64x64", "output_format": fmt, "extra_body": STEPS}
    low, high = [base64.b64decode((await client.images.generate(**kw, output_compression=q)).data[0].b64_json)
                 for q in (5, 95)]
    assert len(low) < len(high) * 0.8, (len(low), len(high))
    assert decode(base64.b64encode(low).decode()).shape == (64, 64, 3)
    stream = await client.images.generate(**kw, output_compression=5, stream=True)
    [done] = [e async for e in stream]
    assert base64.b64decode(done.b64_json) == low  # the streamed image is encoded the same way
    await eventually(lambda: idle(gen.orch))


async def test_background_transparent_is_a_400_and_auto_opaque_are_taken(gen) -> None:
    client = gen.client()
    kw = {"model": "qwen_image", "prompt": "x", "size": "32x32", "extra_body": STEPS}
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.generate(**kw, background="transparent")
    assert err.value.body["param"] == "background" and "transparent" in err.value.message
    plain = decode((await client.images.generate(**kw)).data[0].b64_json)
    for background in ("auto", "opaque"):
        assert np.array_equal(plain, decode((await client.images.generate(**kw, background=background))
                                            .data[0].b64_json))


async def test_quality_and_style_are_checked_no_ops(gen) -> None:
    client = gen.client()
    kw = {"model": "qwen_image", "prompt": "x", "size": "32x32", "extra_body": STEPS}
    plain = decode((await client.images.generate(**kw)).data[0].b64_json)
    same = await client.images.generate(**kw, quality="high", style="natural")
    assert np.array_equal(plain, decode(same.data[0].b64_json))
    for field, value in (("quality", "ultra"), ("style", "cartoon"), ("background", "green"),
                         ("output_compression", 101)):
        status, out = await post(gen, "/v1/images/generations", {"prompt": "x", field: value})
        assert status == 400 and field in (out["error"]["param"] or out["error"]["message"]), out


async def test_edit_fields_are_checked_and_compression_applies(edit) -> None:
    client = edit.client()
    for field, value in (("background", "transparent"), ("quality", "ultra"), ("input_fidelity", "max"),
                         ("output_compression", 101), ("background", "green")):
        with pytest.raises(openai.BadRequestError) as err:
            await client.images.edit(model="sd_inpaint", **_edit_inputs(), **{field: value})
        assert err.value.body["param"] == field, err.value.body
    sizes = []
    for q in (5, 95):
        out = await client.images.edit(model="sd_inpaint", **_edit_inputs(), output_format="jpeg",
                                       output_compression=q, quality="low", input_fidelity="high",
                                       background="opaque")
        sizes.append(len(base64.b64decode(out.data[0].b64_json)))
    assert sizes[0] < sizes[1] * 0.8, sizes
    await eventually(lambda: idle(edit.orch))


@pytest.mark.parametrize(("size", "says"), [
    ("\u0663\u0662x32", "is not WIDTHxHEIGHT"),  # Arabic-Indic digits were read as 32x32
    ("100000x100000", "must be in 1.."),  # past the bound, not "not WIDTHxHEIGHT"
    ("9" * 200 + "x64", "must be in 1.."),  # (the schema caps the string at 256)
])
async def test_a_size_is_ascii_digits_and_a_long_side_is_out_of_range(gen, size: str, says: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await gen.client().images.generate(model="qwen_image", prompt="x", size=size, extra_body=STEPS)
    assert err.value.body["param"] == "size" and says in err.value.body["message"], err.value.body


async def test_guidance_scale_past_its_bound_is_a_400_naming_it(gen, edit) -> None:
    """1e300 was taken by generations and edits alike and handed to the pipeline."""
    for value, code in ((1e300, "decimal_above_max_value"), (100.5, "decimal_above_max_value"),
                        (-1.0, "decimal_below_min_value")):
        extra = {**STEPS, "guidance_scale": value}
        with pytest.raises(openai.BadRequestError) as err:
            await gen.client().images.generate(model="qwen_image", prompt="x", size="32x32", extra_body=extra)
        assert (err.value.body["param"], err.value.body["code"]) == ("guidance_scale", code), err.value.body
        with pytest.raises(openai.BadRequestError) as err:
            await edit.client().images.edit(model="sd_inpaint", **{**_edit_inputs(), "extra_body": extra})
        assert (err.value.body["param"], err.value.body["code"]) == ("guidance_scale", code), err.value.body


async def test_a_client_that_leaves_a_stream_aborts_its_generation(gen) -> None:
    """The SDK's stream closed after the first step event: the run is aborted, nothing is held."""
    aborted = gen.orch.statistics().requests_aborted
    stream = await gen.client().images.generate(model="qwen_image", prompt="x", size="32x32", stream=True,
                                                extra_body={"num_inference_steps": 1000, "stream_progress": True})
    async for event in stream:
        assert event.type == "image_generation.progress"
        break
    await stream.close()
    await eventually(lambda: idle(gen.orch), LEAVE_TIMEOUT_S)
    assert gen.orch.statistics().requests_aborted == aborted + 1
