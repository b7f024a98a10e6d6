"""/v1/images as the current openai SDK calls it: the fields it documents today, on the synthetic image pipeline.

`safety_identifier` replaced the deprecated `user` (the SDK sends it whenever the caller names an end
user) and was a 400 `unknown form field` on /v1/images/edits; `quality` gained "xhigh" and "max", which
the route refused though every other quality is taken without effect; a `moderation` outside OpenAI's
"auto" / "low" went through unchecked.
"""

from __future__ import annotations

import aiohttp
import numpy as np
import openai
import pytest

from tests.api.conftest import Server, idle, post, serve
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


async def test_a_nan_guidance_scale_is_an_invalid_value_not_above_the_bound(srv: Server) -> None:
    """A form's "nan" was a 400 with code `decimal_above_max_value`; a NaN is above nothing. (JSON has no NaN:
    generations refuse it as a JSON error; the video routes already said `invalid_value`.)"""
    with pytest.raises(openai.BadRequestError) as err:
        await srv.client().images.edit(model=MODEL, prompt="paint it", image=_image(),
                                       extra_body={"guidance_scale": "nan"})
    body = err.value.body
    assert (body["param"], body["code"]) == ("guidance_scale", "invalid_value"), body
    assert idle(srv.orch)


async def test_a_url_answer_cannot_be_streamed(srv: Server) -> None:
    """OpenAI's stream events carry b64_json and nothing else: `stream` with `response_format: "url"` sent base64
    events silently; now a 400 naming response_format, on generations and edits."""
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.generate(model=MODEL, prompt="a cube", size="8x8", stream=True, response_format="url")
    assert (err.value.body["param"], err.value.body["code"]) == ("response_format", "unsupported_value"), err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        await client.images.edit(model=MODEL, prompt="paint it", image=_image(), stream=True, response_format="url")
    assert err.value.body["param"] == "response_format", err.value.body
    stream = await client.images.generate(model=MODEL, prompt="a cube", size="8x8", stream=True,
                                          response_format="b64_json")
    assert [e.type async for e in stream] == ["image_generation.completed"]
    assert idle(srv.orch)


def _form(**parts: str | tuple[str, bytes, str] | tuple[None, bytes, None]) -> aiohttp.FormData:
    """A multipart body: a str is a text field, a tuple (filename, bytes, content type) a part of its own."""
    form = aiohttp.FormData(default_to_multipart=True)
    for name, value in parts.items():
        if isinstance(value, str):
            form.add_field(name, value)
        else:
            filename, data, kind = value
            form.add_field(name, data, filename=filename, content_type=kind)
    return form


@pytest.mark.parametrize(("route", "parts", "param"), [
    ("/v1/images/edits", {"image": _image(), "prompt": ("prompt.txt", b"paint it", "text/plain")}, "prompt"),
    ("/v1/images/edits", {"image": _image(), "prompt": "paint it", "size": ("s.txt", b"8x8", "text/plain")}, "size"),
    ("/v1/images/edits", {"image": "not a file", "prompt": "paint it"}, "image"),
    ("/v1/videos", {"prompt": ("p.txt", b"a cat", "text/plain")}, "prompt"),
    ("/v1/videos", {"prompt": "a cat", "input_reference": "https://example.com/a.png"}, "input_reference"),
    ("/v1/videos", {"prompt": "a cat", "seed": ("seed.txt", b"7", "application/octet-stream")}, "seed"),
])  # fmt: skip
async def test_a_field_sent_as_the_other_kind_of_part_is_a_400_naming_it(srv: Server, route: str, parts: dict,
                                                                        param: str) -> None:
    """A prompt sent as a file part was taken as the prompt (its bytes, whatever the file held); a first frame
    sent as text was decoded as an image and refused as one. Either is the client's mistake, said as such."""
    status, answer = await post(srv, route, data=_form(**parts))
    assert (status, answer["error"]["param"], answer["error"]["code"]) == (400, param, "invalid_type"), answer
    assert ("file part" if isinstance(parts[param], tuple) else "text field") in answer["error"]["message"], answer
    assert idle(srv.orch)
