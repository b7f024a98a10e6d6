"""Streamed partial images on the families whose previews were missing or failed the request, through the
openai SDK: Qwen-Image-Layered (its preview raised inside the step callback and failed the batch), FLUX.2 and
LongCat-Image (no preview), GLM-Image (mis-scaled; its pixels are checked in tests/workers/test_diffusion_preview.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("diffusers")

from tests.api.conftest import eventually, idle
from tests.api.image_family_support import decode, png, serve_family

FAMILIES = ["qwen_image_layered", "flux2", "longcat_image", "glm_image"]
"""One server per family."""


@pytest.fixture(scope="module", params=FAMILIES)
async def srv(request, tmp_path_factory):
    async with serve_family(request.param, tmp_path_factory.mktemp("previews")) as s:
        s.family = request.param
        yield s


async def test_stream_sends_a_preview_then_the_completed_images(srv) -> None:
    client = srv.client()
    kw = {"model": srv.family, "prompt": "a red cube", "stream": True, "partial_images": 1,
          "extra_body": {"num_inference_steps": 3, "seed": 2}}
    if srv.family == "qwen_image_layered":
        rgba = np.random.default_rng(0).integers(0, 255, (48, 64, 4), dtype=np.uint8)
        kw["extra_body"] = {**kw["extra_body"], "layers": 2}
        stream = await client.images.edit(image=("in.png", png(rgba)), **kw)
        prefix, channels, completed = "image_edit", 4, 2  # the preview: the layers composited (RGBA)
    else:
        stream = await client.images.generate(size="64x32", **kw)
        prefix, channels, completed = "image_generation", 3, 1
    events = [e async for e in stream]
    assert [e.type for e in events] == [f"{prefix}.partial_image"] + [f"{prefix}.completed"] * completed
    final = decode(events[-1].b64_json)
    preview = decode(events[0].b64_json)
    assert preview.shape == final.shape and final.shape[2] == channels
    assert preview.std() > 0
    await eventually(lambda: idle(srv.orch))
