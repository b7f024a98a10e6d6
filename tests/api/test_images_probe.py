"""/v1/images as the current openai SDK calls it: the fields it documents today, on the synthetic image pipeline.

`safety_identifier` replaced the deprecated `user` (the SDK sends it whenever the caller names an end
user) and was a 400 `unknown form field` on /v1/images/edits; `quality` gained "xhigh" and "max", which
the route refused though every other quality is taken without effect; a `moderation` outside OpenAI's
"auto" / "low" went through unchecked.
"""

from __future__ import annotations

import numpy as np
import openai
import pytest

from tests.api.conftest import Server, idle, serve
from tests.api.image_family_support import decode, png

MODEL = "synthetic_image"


@pytest.fixture(scope="module")
async def srv():
    async with serve(MODEL) as s:
        yield s


def _image() -> tuple[str, bytes, str]:
    return ("in.png", png(np.full((8, 8, 3), 90, np.uint8)), "image/png")


@pytest.mark.parametrize("fields", [
    {"safety_identifier": "hashed-user-1"},
    {"safety_identifier": "hashed-user-1", "user": "old-name"},
    {"quality": "xhigh"},
    {"quality": "max"},
    {"extra_body": {"moderation": "low"}},
])  # fmt: skip
async def test_an_edit_takes_the_fields_the_sdk_documents(srv: Server, fields: dict) -> None:
    out = await srv.client().images.edit(model=MODEL, prompt="paint it", image=_image(), size="16x16", **fields)
    assert len(out.data) == 1 and decode(out.data[0].b64_json).shape == (16, 16, 3)
    assert idle(srv.orch)


async def test_an_edit_with_a_moderation_openai_does_not_know_is_a_400_naming_it(srv: Server) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(model=MODEL, prompt="paint it", image=_image(),
                                       extra_body={"moderation": "none"})
    assert err.value.body["param"] == "moderation", err.value.body
    assert idle(srv.orch)


async def test_a_generation_takes_safety_identifier_and_checks_moderation(srv: Server) -> None:
    """`safety_identifier` was a 400 unknown field on /v1/images/generations; `moderation: "none"` went through."""
    client = srv.client()
    out = await client.images.generate(model=MODEL, prompt="a cube", size="8x8", safety_identifier="hashed-user-1",
                                       quality="max", moderation="low", extra_body={"num_inference_steps": 1})
    assert len(out.data) == 1 and decode(out.data[0].b64_json).shape == (8, 8, 3)
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.generate(model=MODEL, prompt="a cube", size="8x8", extra_body={"moderation": "none"})
    assert err.value.body["param"] == "moderation", err.value.body
    assert idle(srv.orch)


async def test_an_eps_upload_is_refused_before_any_decoder_runs_on_it(srv: Server) -> None:
    """PIL's EPS decoder runs Ghostscript on the bytes it is given: a client's upload must never reach it."""
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 8 8\n"
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(model=MODEL, prompt="x", image=("a.eps", eps, "application/postscript"))
    assert err.value.body["code"] == "invalid_image" and "Ghostscript" not in err.value.body["message"], err.value.body
    assert idle(srv.orch)
